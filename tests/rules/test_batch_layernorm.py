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


class _NormsAfterViews(nn.Module):
    """One norm reads x through an eval-mode Dropout and a view (two FX nodes that compute
    nothing), the other reads y directly: independent, though at different FX depths."""

    def __init__(self):
        super().__init__()
        self.drop, self.a, self.b = nn.Dropout(0.3), nn.LayerNorm(8), nn.LayerNorm(8)
        for ln in (self.a, self.b):
            nn.init.normal_(ln.weight)

    def forward(self, x, y):
        return self.a(self.drop(x).view(4, 8)), self.b(y)


def test_batch_layernorm_groups_norms_whose_paths_differ_by_views():
    after, report = optimize_with(torch.fx.symbolic_trace(_NormsAfterViews().eval()), batch_layernorm,
                                  torch.randn(32), torch.randn(4, 8))
    assert fired(report, "batch-layernorm") and calls(after, ops.batched_layer_norm) == 1


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


def _aten_norms(use_stats=False):
    """Three F.layer_norm calls as make_fx writes them: native_layer_norm(...)[0]."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, *params):
        outs = []
        for i in range(3):
            y, mean, _rstd = torch.ops.aten.native_layer_norm.default(x[i], [16], params[2 * i], params[2 * i + 1], 1e-5)
            outs.append(y + mean if use_stats else y)
        return outs

    inputs = [torch.randn(3, 4, 16)] + [torch.randn(16) for _ in range(6)]
    return make_fx(f)(*inputs), inputs


def test_batch_layernorm_aten_native_layer_norm():
    gm, inputs = _aten_norms()
    after, report = optimize_with(gm, batch_layernorm, *inputs)
    assert fired(report, "batch-layernorm")
    assert calls(after, torch.ops.aten.native_layer_norm.default) == 0 and calls(after, ops.batched_layer_norm) == 1


def test_batch_layernorm_aten_needs_unused_statistics():
    gm, inputs = _aten_norms(use_stats=True)
    _, report = optimize_with(gm, batch_layernorm, *inputs)
    assert not fired(report, "batch-layernorm")
