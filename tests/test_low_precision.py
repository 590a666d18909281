"""bfloat16 / float16 graphs: optimus_egg's rewrites and the backend's post-grad batching round
no more often than the input graph (one rounding per linear, as addmm does). In float32 a
second rounding is invisible; in bfloat16 it is the size of the first."""
from __future__ import annotations

import pytest
import torch
from torch import fx

from test_ablation import RowsRead

from optimus_egg import ops, optimize
from optimus_egg.measure import rounds_no_worse


def _dynamo_graph(model, x) -> tuple[fx.GraphModule, list]:
    """Dynamo's graph of `model` and the inputs it is called with (its parameters are
    placeholders there, not get_attr nodes)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(x)
    return graphs[0]


@pytest.mark.parametrize("capture", ["symbolic_trace", "dynamo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_batched_linear_keeps_its_biases_stacked_in_low_precision(dtype, capture):
    """In float32 each row of the batch adds its own bias (its reader fuses the add: no copy of
    the biases into a stack); in bfloat16 / float16 the bmm's result would be rounded before
    the add, so the biases stay in the baddbmm, which rounds once, as each addmm did."""
    torch.manual_seed(0)
    model = RowsRead(64, 32).to(dtype)  # three linears with biases on an input's rows
    x = torch.randn(3, 256, 64, dtype=dtype)
    gm, inputs = _dynamo_graph(model, x) if capture == "dynamo" else (fx.symbolic_trace(model), [x])
    out = optimize(gm, inputs, strict=True)
    [bl] = [n for n in out.graph.nodes if n.target is ops.batched_linear]
    adds = sum(n.target is torch.add for n in out.graph.nodes)
    if dtype == torch.float32:
        assert bl.args[2] is None and adds == 3
    else:
        assert bl.args[2] is not None and adds == 0
    exact_model = RowsRead(64, 32).double()
    exact_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        exact, before, after = exact_model(x.double()), gm(*inputs), out(*inputs)
    assert rounds_no_worse(list(after), list(exact), list(before), factor=1.05)


def test_post_grad_linear_batching_rounds_low_precision_addmm_once():
    """The backend's post-grad batching of mm / addmm: PyTorch's batch of addmm nodes is a bmm
    and an add per member, two roundings, so a bfloat16 / float16 batch is one baddbmm over the
    stacked biases instead (1-D biases, and [rows, cols] ones), one rounding as addmm's: equal
    to the input graph bit for bit. mm nodes (no bias: the backward's) and float32 addmm nodes
    batch as PyTorch's pass does."""
    from torch._inductor.fx_passes.group_batch_fusion import apply_group_batch_fusion
    from torch._inductor.pattern_matcher import stable_topological_sort
    from torch.fx.experimental.proxy_tensor import make_fx

    from test_backend import _post_grad_rule

    from optimus_egg.baselines import SAME_DTYPE_BATCH_LINEAR

    aten = torch.ops.aten

    def f(b1, x1, w1, b2, x2, w2, b5, x5, w5, b6, x6, w6, x3, w3, x4, w4):
        return (torch.addmm(b1, x1, w1), torch.addmm(b2, torch.relu(x2), w2),
                torch.addmm(b5, x5, w5), torch.addmm(b6, torch.relu(x6), w6),
                torch.mm(x3, w3), torch.mm(torch.relu(x4), w4))

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        args = []
        for bias, k in (((16,), 64), ((16,), 64), ((32, 16), 48), ((32, 16), 48), (None, 64), (None, 64)):
            args += ([torch.randn(bias, dtype=dtype)] if bias else []) + [torch.randn(32, k, dtype=dtype),
                                                                         torch.randn(k, 16, dtype=dtype) / 8]
        gm = make_fx(f, tracing_mode="fake")(*args)
        apply_group_batch_fusion(gm.graph, _post_grad_rule(SAME_DTYPE_BATCH_LINEAR, gated=False))
        stable_topological_sort(gm.graph)
        gm.recompile()
        targets = [n.target for n in gm.graph.nodes]
        low = dtype != torch.float32
        assert targets.count(aten.addmm.default) == 0 and targets.count(aten.mm.default) == 0, (dtype, gm.code)
        assert targets.count(aten.baddbmm.default) == (2 if low else 0), (dtype, gm.code)
        assert targets.count(aten.bmm) == (1 if low else 3), (dtype, gm.code)
        got, before = gm(*args), f(*args)
        if low:
            assert all(torch.equal(g, b) for g, b in zip(got, before)), dtype
        exact = f(*(a.double() for a in args))
        assert rounds_no_worse(got, exact, before, factor=1.05), dtype


class ThreeLinears(torch.nn.Module):
    """Three independent linears of one shape, each on its own input."""

    def __init__(self, d=64):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, xs):
        return [layer(torch.relu(x)) for layer, x in zip(self.layers, xs)]


def test_backend_batches_bfloat16_linears_after_grad_with_one_rounding():
    """Through the backend at budget 0 (optimize returns its input, so the linears reach the
    post-grad passes apart): the bfloat16 addmm nodes are batched into one baddbmm, and values
    and gradients are no further from float64's than eager's."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    import optimus_egg

    torch.manual_seed(0)
    model = ThreeLinears().bfloat16()
    exact_model = ThreeLinears().double()
    exact_model.load_state_dict(model.state_dict())
    xs = [torch.randn(32, 64, dtype=torch.bfloat16) for _ in range(3)]
    counters.clear()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=optimus_egg.backend(budget_s=0, gemm_loops=False, strict=True))
    got, (forward, *_) = run_and_get_code(compiled, xs)
    assert counters["inductor"]["batch_linear_post_grad"] > 0, dict(counters["inductor"])
    assert forward.count("extern_kernels.baddbmm(") == 1 and "extern_kernels.addmm(" not in forward, forward
    sum(o.float().sum() for o in got).backward()
    grads = [p.grad for p in model.parameters()]
    model.zero_grad()
    eager = model(xs)
    sum(o.float().sum() for o in eager).backward()
    eager_grads = [p.grad for p in model.parameters()]
    exact = exact_model([x.double() for x in xs])
    sum(o.sum() for o in exact).backward()
    exact_grads = [p.grad for p in exact_model.parameters()]
    assert rounds_no_worse([o.detach() for o in got], [o.detach() for o in exact], [o.detach() for o in eager],
                           factor=1.05)
    assert rounds_no_worse(grads, exact_grads, eager_grads, factor=1.05)
