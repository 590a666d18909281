import pytest
import torch
import torch.nn.functional as F

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
