import torch
import torch.nn as nn
import torch.nn.functional as F

from optimus_egg import ops
from optimus_egg.rules.batch_linear_lhs import batch_linear_lhs
from optimus_egg.testing import calls, fired, optimize_with


class SharedInput(nn.Module):
    def __init__(self, outs=(8, 16, 4, 8, 1), bias=True):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(16, o, bias=bias) for o in outs)

    def forward(self, x):
        return [torch.tanh(l(x)) for l in self.ls]


def test_batch_linear_lhs():
    after, report = optimize_with(torch.fx.symbolic_trace(SharedInput()), batch_linear_lhs, torch.randn(4, 16))
    assert fired(report, "batch-linear-lhs")
    assert calls(after, nn.Linear) == 0 and calls(after, F.linear) == 1 and calls(after, torch.split) == 1


def test_batch_linear_lhs_without_bias():
    m = SharedInput(bias=False)
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_linear_lhs, torch.randn(2, 3, 16))
    assert fired(report, "batch-linear-lhs")
    assert calls(after, F.linear) == 1


def test_batch_linear_lhs_needs_same_input():
    """Three linears read x and one reads y: the wide GEMM takes the three, y's stays apart
    (returned as they are, the three equal-width spans become rows of one bmm:
    pipeline.stack_returned_spans)."""
    w1, w2, w3, w4 = (torch.randn(8, 16) for _ in range(4))

    def before(x, y):
        return F.linear(x, w1), F.linear(x, w2), F.linear(x, w3), F.linear(y, w4)

    after, report = optimize_with(before, batch_linear_lhs, torch.randn(4, 16), torch.randn(4, 16))
    assert report.matches["batch-linear-lhs"] == 3 and report.stacked_spans == 1
    assert calls(after, F.linear) == 1 and calls(after, ops.batched_linear) == 1


def test_batch_linear_lhs_needs_same_bias_presence():
    """Three biased linears and one without bias on x: the unbiased one stays apart (the three
    returned spans become rows of one bmm, as above)."""
    ws, bs = [torch.randn(8, 16) for _ in range(4)], [torch.randn(8) for _ in range(3)]

    def before(x):
        return F.linear(x, ws[0], bs[0]), F.linear(x, ws[1], bs[1]), F.linear(x, ws[2], bs[2]), F.linear(x, ws[3])

    after, report = optimize_with(before, batch_linear_lhs, torch.randn(4, 16))
    assert report.matches["batch-linear-lhs"] == 3 and report.stacked_spans == 1
    assert calls(after, F.linear) == 1 and calls(after, ops.batched_linear) == 1


def test_batch_linear_lhs_pair_forms_only_without_twins():
    """Two linears on one input become one GEMM unless one of them has a twin: a linear of the
    same shapes that neither reads it nor feeds it (from_fx.LHS_MIN_MEMBERS, _Twins). (Their
    results are read by a tanh: returned as they are, the GEMM's column spans would be copied
    to stay contiguous, a kernel that makes the pair no cheaper than the input.)"""
    w8, w16, t8, t16 = torch.randn(8, 16), torch.randn(16, 16), torch.randn(8, 16), torch.randn(16, 16)
    x, y = torch.randn(4, 16), torch.randn(4, 16)

    def pair(x):
        return torch.tanh(F.linear(x, w8)), torch.tanh(F.linear(x, w16))

    after, report = optimize_with(pair, batch_linear_lhs, x)
    assert report.matches["batch-linear-lhs"] == 2 and calls(after, F.linear) == 1

    def pair_and_twin(x, y):  # t8 on y could be batched with w8 on x
        return F.linear(x, w8), F.linear(x, w16), F.linear(y, t8)

    after, report = optimize_with(pair_and_twin, batch_linear_lhs, x, y)
    assert not fired(report, "batch-linear-lhs") and calls(after, F.linear) == 3

    def pair_and_dependent_look_alike(x):  # t16 reads w16's output: no twin
        a, b = F.linear(x, w8), F.linear(x, w16)
        return a, F.linear(torch.tanh(b), t16)

    after, report = optimize_with(pair_and_dependent_look_alike, batch_linear_lhs, x)
    assert report.matches["batch-linear-lhs"] == 2 and calls(after, F.linear) == 2

    for outs in ((8, 8), (8, 16, 8)):  # look-alikes inside the group are not twins
        after, report = optimize_with(torch.fx.symbolic_trace(SharedInput(outs)), batch_linear_lhs, x)
        assert report.matches["batch-linear-lhs"] == len(outs) and calls(after, F.linear) == 1


class TwoLevels(nn.Module):
    """MaskNet's mask MLPs: three linears on x, a relu each, then one linear per branch."""

    def __init__(self):
        super().__init__()
        self.first = nn.ModuleList(nn.Linear(16, 8) for _ in range(3))
        self.second = nn.ModuleList(nn.Linear(8, 4) for _ in range(3))

    def forward(self, x):
        return [g(torch.relu(f(x))) for f, g in zip(self.first, self.second)]


def test_batch_linear_lhs_pieces_of_equal_size_stack_as_a_view():
    """The wide GEMM's split has equal pieces, so the next batch reads the relu'd wide output
    through unflatten + movedim (stack-of-split-pieces) instead of copying the pieces into a stack."""
    from optimus_egg.rules.batch_linear import batch_linear
    from optimus_egg.rules.batch_pointwise import batch_pointwise
    from optimus_egg.rules.split_cat import split_cat

    families = (batch_linear_lhs, batch_pointwise, batch_linear, split_cat)
    after, report = optimize_with(torch.fx.symbolic_trace(TwoLevels()), families, torch.randn(4, 16))
    assert fired(report, "batch-linear-lhs") and fired(report, "stack-of-split-pieces")
    assert calls(after, F.linear) == 1 and calls(after, torch.split) == 0
    assert calls(after, torch.stack) == 2  # the second level's weights and biases only


class RepeatedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 8), nn.Linear(16, 4), nn.Linear(16, 2)

    def forward(self, x):
        return self.a(x), self.b(x), torch.tanh(self.a(x)), self.c(x)


def test_batch_linear_lhs_joins_a_repeated_linear_once():
    """self.a(x) called twice is one value: the wide GEMM concatenates a's weight once."""
    after, report = optimize_with(torch.fx.symbolic_trace(RepeatedLinear()), batch_linear_lhs, torch.randn(4, 16))
    assert report.groups["linear_lhs"] == 1 and calls(after, F.linear) == 1
    cat = next(n for n in after.graph.nodes if n.target is torch.cat)
    assert len(cat.args[0]) == 3


def test_wide_gemm_in_the_order_a_cat_reads_it():
    """Four linears of x that one cat reads in reverse order: the group is also seeded in the
    cat's order, so the wide GEMM's split and the cat cancel and its output is the result
    (found by bench/differential.py --seed 22: 5 launches, the ablation's 4; now 4). In their
    own order only one group is seeded."""
    from optimus_egg.rules.split_cat import split_cat

    ws, bs = [torch.randn(8, 16) for _ in range(4)], [torch.randn(8) for _ in range(4)]

    def reversed_cat(x):
        ys = [F.linear(x, w, b) for w, b in zip(ws, bs)]
        return torch.cat(ys[::-1], 1)

    def in_order(x):
        return torch.cat([F.linear(x, w, b) for w, b in zip(ws, bs)], 1)

    x = torch.randn(4, 16)
    after, report = optimize_with(reversed_cat, (batch_linear_lhs, split_cat), x)
    assert report.groups["linear_lhs"] == 2 and fired(report, "batch-linear-lhs")
    assert calls(after, F.linear) == 1 and calls(after, torch.split) == 0
    out = next(n for n in after.graph.nodes if n.op == "output").args[0]
    assert out.target is F.linear  # the wide GEMM itself, no split or cat of its pieces
    after, report = optimize_with(in_order, (batch_linear_lhs, split_cat), x)
    assert report.groups["linear_lhs"] == 1 and calls(after, F.linear) == 1 and calls(after, torch.split) == 0
