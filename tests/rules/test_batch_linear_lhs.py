import torch
import torch.nn as nn
import torch.nn.functional as F

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
    w1, w2 = torch.randn(8, 16), torch.randn(8, 16)

    def before(x, y):
        return F.linear(x, w1), F.linear(y, w2)

    _, report = optimize_with(before, batch_linear_lhs, torch.randn(4, 16), torch.randn(4, 16))
    assert not fired(report, "batch-linear-lhs")


def test_batch_linear_lhs_needs_same_bias_presence():
    w1, w2, b1 = torch.randn(8, 16), torch.randn(8, 16), torch.randn(8)

    def before(x):
        return F.linear(x, w1, b1), F.linear(x, w2)

    _, report = optimize_with(before, batch_linear_lhs, torch.randn(4, 16))
    assert not fired(report, "batch-linear-lhs")
