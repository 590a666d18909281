"""Small GEMMs as loops (src/optimus_egg/gemm_loops.py): which GEMMs it rewrites, values before
and after on real tensors, and the launches it saves when Inductor compiles as the backend does."""
from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_egg import gemm_loops
from optimus_egg.baselines import backend_patches
from optimus_egg.measure import compile_inductor

aten = torch.ops.aten
GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _gemms(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.target in GEMMS]


def _program(x, w, b, xb, wb, bb, big, bf):
    small = [torch.mm(x, w), torch.addmm(b, x, w), torch.bmm(xb, wb), torch.baddbmm(bb, xb, wb)]
    kept = [torch.mm(big, big),                                  # 128 ** 3 multiply-adds: too many
            torch.addmm(b, x, w, alpha=2.0),                     # alpha != 1
            torch.mm(bf, bf)]                                    # bfloat16
    return small, kept


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)

    def r(*s, dt=dtype):
        return torch.randn(*s, generator=g, dtype=dt)

    return (r(8, 16), r(16, 4), r(4), r(3, 8, 16), r(3, 16, 4), r(3, 1, 4), r(128, 128),
            r(4, 4, dt=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rewrites_the_small_gemms_only_and_keeps_their_values(dtype):
    inputs = _inputs(dtype)
    gm = make_fx(_program, tracing_mode="fake")(*inputs)
    before = gm(*inputs)
    assert len(_gemms(gm)) == 7
    assert gemm_loops.rewrite(gm.graph) == 4
    gm.graph.lint()
    gm.recompile()
    assert sorted(_gemms(gm)) == ["aten.addmm.default", "aten.mm.default", "aten.mm.default"]
    torch.testing.assert_close(gm(*inputs), before)


def test_limit_is_in_multiply_adds():
    inputs = _inputs()
    gm = make_fx(_program, tracing_mode="fake")(*inputs)
    # 8 * 16 * 4 = 512 per mm / addmm, 3 * 8 * 16 * 4 = 1,536 per bmm / baddbmm
    assert gemm_loops.rewrite(gm.graph, max_macs=512) == 2
    assert gemm_loops.rewrite(gm.graph, max_macs=1536) == 2


class _Experts(nn.Module):
    """Four small linears on one input, relu, summed: GEMMs of 32 x 16 x 16."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(sum(torch.relu(e(x)) for e in self.experts))


@pytest.mark.parametrize("training", [False, True])
def test_backend_compile_launches_fewer_with_the_same_values(training):
    torch.manual_seed(0)
    model, x = _Experts().train(training), torch.randn(32, 16)
    gm = fx.symbolic_trace(model)
    with torch.set_grad_enabled(training):
        expected = model(x)
    if training:
        expected.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
    without = backend_patches()
    counters["inductor"][gemm_loops.COUNTER] = 0
    plain = compile_inductor(gm, [x], training=training, config_patches=without)
    assert counters["inductor"][gemm_loops.COUNTER] == 0
    model.zero_grad()
    loops = compile_inductor(gm, [x], training=training, config_patches=backend_patches(gemm_loops=True))
    assert counters["inductor"][gemm_loops.COUNTER] > 0
    assert loops.launches.extern < plain.launches.extern
    assert loops.launches.total < plain.launches.total
    model.zero_grad()
    got = loops.fn(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    if training:
        got.sum().backward()
        for p, want in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5)


def test_pass_has_a_stable_cache_key():
    assert gemm_loops.GemmLoops().uuid() == gemm_loops.GEMM_LOOPS.uuid()
    assert gemm_loops.GemmLoops(1024).uuid() != gemm_loops.GEMM_LOOPS.uuid()


def test_backend_takes_gemm_loops_as_an_option():
    """torch.compile(backend="optimus_egg", options={"gemm_loops": True}): the pass runs (off by
    default) and the values are eager's."""
    torch.manual_seed(0)
    model, x = _Experts().eval(), torch.randn(32, 16)
    with torch.no_grad():
        expected = model(x)
        fired = {}
        for on in (False, True):
            torch._dynamo.reset()
            counters["inductor"][gemm_loops.COUNTER] = 0
            got = torch.compile(model, backend="optimus_egg", options={"gemm_loops": on})(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
            fired[on] = counters["inductor"][gemm_loops.COUNTER]
    assert fired[False] == 0 and fired[True] > 0, fired
