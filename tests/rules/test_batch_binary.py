import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_egg.rules.batch_binary import batch_binary
from optimus_egg.testing import calls, fired, optimize_with

aten = torch.ops.aten
OPS = [(operator.add, torch.add), (operator.sub, torch.sub), (operator.mul, torch.mul),
       (operator.truediv, torch.div)]


@pytest.mark.parametrize(("op", "torch_op"), OPS)
def test_batch_binary(op, torch_op):
    def before(a, b, c, d, e, f):
        return op(a, b), op(c, d), op(e, f)

    inputs = [torch.randn(4, 8) + 3 for _ in range(6)]
    after, report = optimize_with(before, batch_binary, *inputs)
    assert fired(report, "batch-binary")
    assert calls(after, op) == 0 and calls(after, torch_op) == 1 and calls(after, torch.stack) == 2


@pytest.mark.parametrize("target", [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor])
def test_batch_binary_aten(target):
    def f(a, b, c, d, e, g):
        return target(a, b), target(c, d), target(e, g)

    inputs = [torch.randn(4, 8) + 3 for _ in range(6)]
    after, report = optimize_with(make_fx(f)(*inputs), batch_binary, *inputs)
    assert fired(report, "batch-binary")
    assert calls(after, target) == 0 and calls(after, torch.stack) == 2


def test_batch_binary_methods_and_mixed_spellings():
    def before(a, b, c, d, e, f):
        return a.mul(b), c * d, torch.mul(e, f)

    inputs = [torch.randn(4, 8) for _ in range(6)]
    after, report = optimize_with(before, batch_binary, *inputs)
    assert fired(report, "batch-binary")
    assert calls(after, torch.mul) == 1


def test_batch_binary_needs_same_shape_operands():
    def before(a, b, c, d):
        return a + b, c + d  # b and d broadcast along dim 0

    _, report = optimize_with(before, batch_binary, torch.randn(4, 8), torch.randn(8), torch.randn(4, 8), torch.randn(8))
    assert not fired(report, "batch-binary")


def test_batch_binary_needs_same_member_shape():
    def before(a, b, c, d):
        return a + b, c + d

    _, report = optimize_with(before, batch_binary, torch.randn(4, 8), torch.randn(4, 8),
                              torch.randn(4, 9), torch.randn(4, 9))
    assert not fired(report, "batch-binary")


def test_batch_binary_needs_same_dtype():
    def before(a, b, c, d):
        return a + b, c + d

    _, report = optimize_with(before, batch_binary, torch.randn(4, 8), torch.randn(4, 8),
                              torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64))
    assert not fired(report, "batch-binary")


def test_batch_binary_needs_same_op():
    def before(a, b, c, d):
        return a + b, c * d

    _, report = optimize_with(before, batch_binary, *[torch.randn(4, 8) for _ in range(4)])
    assert not fired(report, "batch-binary")


def test_batch_binary_needs_independence():
    def before(a, b, c):
        return (a + b) + c  # same op and shapes, but the second reads the first

    _, report = optimize_with(before, batch_binary, *[torch.randn(4, 8) for _ in range(3)])
    assert not fired(report, "batch-binary")


def test_binary_of_unbind_pieces():
    def before(a, b):
        xs, ys = torch.unbind(a, dim=1), torch.unbind(b, dim=1)
        return xs[0] * ys[0], xs[1] * ys[1], xs[2] * ys[2]

    after, report = optimize_with(before, batch_binary, torch.randn(4, 3, 8), torch.randn(4, 3, 8))
    assert fired(report, "binary-of-unbind-pieces")
    assert calls(after, torch.mul) == 1 and calls(after, torch.stack) == 0


def test_binary_of_unbind_pieces_chain_stays_stacked():
    def before(a, b, c):
        xs, ys, zs = torch.unbind(a), torch.unbind(b), torch.unbind(c)
        return [(xs[i] + ys[i]) * zs[i] for i in range(4)]

    after, report = optimize_with(before, batch_binary, *[torch.randn(4, 8) for _ in range(3)])
    assert fired(report, "binary-of-unbind-pieces")
    assert calls(after, torch.add) == calls(after, torch.mul) == 1


def test_binary_of_unbind_pieces_needs_same_whole_shape():
    def before(a, b):
        xs, ys = torch.unbind(a), torch.unbind(b)
        return xs[0] * ys[0], xs[1] * ys[1]

    _, report = optimize_with(before, batch_binary, torch.randn(2, 8), torch.randn(3, 8))
    assert not fired(report, "binary-of-unbind-pieces")


def test_binary_of_unbind_pieces_needs_same_dim():
    def before(a, b):
        xs, ys = torch.unbind(a, dim=0), torch.unbind(b, dim=1)
        return xs[0] * ys[0], xs[1] * ys[1]

    _, report = optimize_with(before, batch_binary, torch.randn(2, 2), torch.randn(2, 2))
    assert not fired(report, "binary-of-unbind-pieces")


def test_binary_of_unbind_pieces_needs_same_index():
    def before(a, b):
        xs, ys = torch.unbind(a), torch.unbind(b)
        return xs[0] * ys[1], xs[1] * ys[0]

    _, report = optimize_with(before, batch_binary, torch.randn(2, 8), torch.randn(2, 8))
    assert not fired(report, "binary-of-unbind-pieces")
