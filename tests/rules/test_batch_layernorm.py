import torch
import torch.nn as nn
import torch.nn.functional as F

from optimus_egg import ops
from optimus_egg.rules.batch_layernorm import batch_layernorm
from optimus_egg.testing import calls, fired, optimize_with


class ParallelNorms(nn.Module):
    def __init__(self, n=6, d=16, affine=True):
        super().__init__()
        self.ns = nn.ModuleList(nn.LayerNorm(d, elementwise_affine=affine) for _ in range(n))
        for ln in self.ns:
            if affine:
                nn.init.normal_(ln.weight)
                nn.init.normal_(ln.bias)

    def forward(self, x):
        xs = torch.unbind(x, dim=0)
        return [ln(xs[i]) for i, ln in enumerate(self.ns)]


def test_batch_layernorm():
    after, report = optimize_with(torch.fx.symbolic_trace(ParallelNorms()), batch_layernorm, torch.randn(6, 4, 16))
    assert fired(report, "batch-layernorm")
    assert calls(after, nn.LayerNorm) == 0 and calls(after, ops.batched_layer_norm) == 1


def test_batch_layernorm_without_affine():
    m = ParallelNorms(affine=False)
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_layernorm, torch.randn(6, 4, 16))
    assert fired(report, "batch-layernorm")
    assert calls(after, ops.batched_layer_norm) == 1


def test_batch_layernorm_needs_same_eps():
    def before(x, y):
        return F.layer_norm(x, [8], eps=1e-5), F.layer_norm(y, [8], eps=1e-3)

    _, report = optimize_with(before, batch_layernorm, torch.randn(3, 8), torch.randn(3, 8))
    assert not fired(report, "batch-layernorm")


def test_batch_layernorm_needs_same_shape():
    def before(x, y):
        return F.layer_norm(x, [8]), F.layer_norm(y, [8])

    _, report = optimize_with(before, batch_layernorm, torch.randn(3, 8), torch.randn(5, 8))
    assert not fired(report, "batch-layernorm")
