import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_egg.rules.batch_pointwise import batch_pointwise
from optimus_egg.testing import calls, fired, optimize_with


@pytest.mark.parametrize("op", [torch.tanh, torch.sigmoid, torch.relu, F.relu, F.gelu, F.silu,
                                lambda t: torch.clamp(t, -0.5, 0.5), torch.nan_to_num, torch.detach])
def test_batch_pointwise(op):
    def before(a, b, c, d):
        return op(a * 2), op(b * 2), op(c * 2), op(d * 2)

    inputs = [torch.randn(4, 8) for _ in range(4)]
    after, report = optimize_with(before, batch_pointwise, *inputs)
    assert fired(report, "batch-pointwise")
    assert calls(after, torch.stack) >= 1  # members were stacked once, not launched four times


@pytest.mark.parametrize("op", [lambda t: t + 2, lambda t: t - 2, lambda t: t * 2, lambda t: t / 2,
                                lambda t: 2 - t, lambda t: 2.5 / t, lambda t: torch.add(t, 0.5)],
                         ids=["add", "sub", "mul", "div", "rsub", "rdiv", "torch.add"])
def test_batch_pointwise_tensor_scalar(op):
    def before(a, b, c, d):
        return op(a.tanh()), op(b.tanh()), op(c.tanh()), op(d.tanh())

    inputs = [torch.randn(4, 8) for _ in range(4)]
    after, report = optimize_with(before, batch_pointwise, *inputs)
    assert fired(report, "batch-pointwise")
    assert calls(after, torch.stack) == 1


@pytest.mark.parametrize("op", [torch.ops.aten.tanh.default, torch.ops.aten.sigmoid.default, torch.ops.aten.relu.default,
                                torch.ops.aten.gelu.default, torch.ops.aten.silu.default,
                                lambda t: torch.ops.aten.clamp.default(t, -0.5, 0.5),
                                torch.ops.aten.nan_to_num.default, lambda t: torch.ops.aten.mul.Tensor(t, 3)])
def test_batch_pointwise_aten(op):
    def f(a, b, c, d):
        return op(a), op(b), op(c), op(d)

    inputs = [torch.randn(4, 8) for _ in range(4)]
    after, report = optimize_with(make_fx(f)(*inputs), batch_pointwise, *inputs)
    assert fired(report, "batch-pointwise")
    assert calls(after, torch.stack) == 1


@pytest.mark.parametrize("drop", [lambda t: F.dropout(t, 0.3, training=False), nn.Dropout(0.3).eval()],
                         ids=["F.dropout", "nn.Dropout"])
def test_batch_pointwise_eval_dropout_is_identity(drop):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = drop

        def forward(self, a, b, c, d):
            return [torch.relu(self.drop(t)) for t in (a, b, c, d)]

    after, report = optimize_with(torch.fx.symbolic_trace(M().eval()), batch_pointwise,
                                  *[torch.randn(4, 8) for _ in range(4)])
    assert fired(report, "batch-pointwise")
    assert calls(after, F.dropout) == calls(after, nn.Dropout) == 0 and calls(after, torch.relu) == 1


def test_batch_pointwise_never_batches_training_dropout():
    def before(a, b, c, d):
        return [torch.relu(F.dropout(t, 0.3, training=True)) for t in (a, b, c, d)]

    after, _ = optimize_with(before, batch_pointwise, *[torch.zeros(4, 8) for _ in range(4)])
    assert calls(after, F.dropout) == 4  # one mask per member, drawn in the original order


def test_batch_pointwise_needs_same_op_arguments():
    def before(a, b):
        return torch.clamp(a, 0, 1), torch.clamp(b, 0, 2)

    _, report = optimize_with(before, batch_pointwise, torch.randn(4, 8), torch.randn(4, 8))
    assert not fired(report, "batch-pointwise")


def test_batch_pointwise_needs_same_shape():
    def before(a, b):
        return torch.tanh(a), torch.tanh(b)

    _, report = optimize_with(before, batch_pointwise, torch.randn(4, 8), torch.randn(4, 9))
    assert not fired(report, "batch-pointwise")


def test_pointwise_of_split_piece():
    def before(x):
        a, b, c = torch.split(x, [2, 3, 3], dim=1)
        return torch.sigmoid(a), torch.sigmoid(b), torch.sigmoid(c)

    after, report = optimize_with(before, batch_pointwise, torch.randn(4, 8))
    assert fired(report, "pointwise-of-split-piece")
    assert calls(after, torch.sigmoid) == 1


def test_pointwise_of_split_piece_needs_elementwise_op():
    def before(x):
        a, b = torch.split(x, [4, 4], dim=1)
        return torch.softmax(a, dim=1), torch.softmax(b, dim=1)

    _, report = optimize_with(before, batch_pointwise, torch.randn(4, 8))
    assert not fired(report, "pointwise-of-split-piece")


def test_pointwise_of_unbind_piece():
    def before(x):
        a, b, c = torch.unbind(x, dim=0)
        return torch.tanh(a), torch.tanh(b), torch.tanh(c)

    after, report = optimize_with(before, batch_pointwise, torch.randn(3, 4, 8))
    assert fired(report, "pointwise-of-unbind-piece")
    assert calls(after, torch.tanh) == 1


def test_pointwise_of_unbind_piece_needs_one_operand():
    def before(x, y):
        a, b = torch.unbind(x, dim=0)
        return a + y, b + y

    _, report = optimize_with(before, batch_pointwise, torch.randn(2, 8), torch.randn(8))
    assert not fired(report, "pointwise-of-unbind-piece")
