"""Small GEMMs as loops (src/optimus_egg/gemm_loops.py): which GEMMs it rewrites, values before
and after on real tensors, and the launches it saves when Inductor compiles as the backend does."""
from __future__ import annotations

import math

import pytest
import torch
from torch import fx, nn
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

import optimus_egg
from optimus_egg import gemm_loops
from optimus_egg.baselines import backend_patches
from optimus_egg.measure import compile_inductor, rounds_no_worse

aten = torch.ops.aten
GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _gemms(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.target in GEMMS]


def _program(x, w, b, xb, wb, bb, big, ints):
    small = [torch.mm(x, w), torch.addmm(b, x, w), torch.bmm(xb, wb), torch.baddbmm(bb, xb, wb)]
    kept = [torch.mm(big, big),                                  # 128 ** 3 multiply-adds: too many
            torch.addmm(b, x, w, alpha=2.0),                     # alpha != 1
            torch.mm(ints, ints)]                                # integers
    return small, kept


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)

    def r(*s, dt=dtype):
        return torch.randn(*s, generator=g, dtype=dt)

    return (r(8, 16), r(16, 4), r(4), r(3, 8, 16), r(3, 16, 4), r(3, 1, 4), r(128, 128),
            torch.randint(-3, 3, (4, 4), generator=g))


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gemms_are_multiplied_and_summed_in_float32(dtype):
    """A bfloat16 / float16 GEMM's loops widen its operands to float32 and round the result
    once, as the GEMM library accumulates: the values are float32's rounded, and no further from
    float64's than the GEMM call's."""
    inputs = _inputs(dtype)
    gm = make_fx(_program, tracing_mode="fake")(*inputs)
    before = gm(*inputs)
    assert gemm_loops.rewrite(gm.graph) == 4
    gm.graph.lint()
    gm.recompile()
    widened = [n for n in gm.graph.nodes if n.target is torch.ops.prims.convert_element_type.default]
    assert len(widened) == 4 * 3  # two operands in, the result out
    (got, _), (want, _) = gm(*inputs), before
    exact, _ = _program(*(t.double() if t.is_floating_point() else t for t in inputs))
    as_float32, _ = _program(*(t.float() if t.is_floating_point() else t for t in inputs))
    for g, w, e, f in zip(got, want, exact, as_float32):
        assert g.dtype == dtype
        torch.testing.assert_close(g, f.to(dtype), rtol=2 ** -7, atol=1e-3)
        assert (g.double() - e).abs().max() <= (w.double() - e).abs().max() + 1e-3


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


def _eager(model: nn.Module, x: torch.Tensor, training: bool):
    """model(x), and in training the parameters' gradients of its sum (left in .grad too)."""
    with torch.set_grad_enabled(training):
        expected = model(x)
    if training:
        expected.sum().backward()
    return expected, [p.grad.clone() for p in model.parameters()] if training else []


def _assert_eager_s(got: torch.Tensor, model: nn.Module, expected, grads, training: bool, grad_atol: float = 1e-5):
    """`got` is eager's `expected`, and in training its sum's gradients are eager's `grads`."""
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    if training:
        model.zero_grad()
        got.sum().backward()
        for p, want in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=grad_atol)


@pytest.mark.parametrize("training", [False, True])
def test_backend_compile_launches_fewer_with_the_same_values(training):
    torch.manual_seed(0)
    model, x = _Experts().train(training), torch.randn(32, 16)
    gm = fx.symbolic_trace(model)
    expected, grads = _eager(model, x, training)
    without = backend_patches(gemm_loops=False)
    counters["inductor"][gemm_loops.COUNTER] = 0
    plain = compile_inductor(gm, [x], training=training, config_patches=without)
    assert counters["inductor"][gemm_loops.COUNTER] == 0
    model.zero_grad()
    loops = compile_inductor(gm, [x], training=training, config_patches=backend_patches(gemm_loops=True))
    assert counters["inductor"][gemm_loops.COUNTER] > 0
    assert loops.launches.extern < plain.launches.extern
    assert loops.launches.total < plain.launches.total
    with torch.set_grad_enabled(training):
        _assert_eager_s(loops.fn(x), model, expected, grads, training)


@pytest.mark.parametrize("training", [False, True])
def test_bfloat16_backend_compile_launches_fewer_and_rounds_no_worse(training):
    """In bfloat16 the loops save the same launches, and their values (and gradients) are no
    further from float64's than the GEMM calls' (plain Inductor's compile of the same graph)."""
    torch.manual_seed(0)
    exact_model, x64 = _Experts().double().train(training), torch.randn(32, 16, dtype=torch.float64)
    model, x = _Experts().to(torch.bfloat16).train(training), x64.to(torch.bfloat16)
    model.load_state_dict(exact_model.state_dict())
    with torch.set_grad_enabled(training):
        exact = exact_model(x64)
    if training:
        exact.sum().backward()
    gm = fx.symbolic_trace(model)
    results = {}
    for on in (False, True):
        counters["inductor"][gemm_loops.COUNTER] = 0
        c = compile_inductor(gm, [x], training=training, config_patches=backend_patches(gemm_loops=on))
        assert (counters["inductor"][gemm_loops.COUNTER] > 0) == on
        model.zero_grad()
        with torch.set_grad_enabled(training):
            out = c.fn(x)
        if training:
            out.float().sum().backward()
        assert out.dtype == torch.bfloat16
        results[on] = (c.launches, [out, *(p.grad.clone() for p in model.parameters() if training)])
    (calls, call_values), (loops, loop_values) = results[False], results[True]
    assert loops.extern < calls.extern and loops.total < calls.total
    exact_values = [exact, *(p.grad for p in exact_model.parameters() if training)]
    assert rounds_no_worse(loop_values, exact_values, call_values, factor=1.5)


def test_pass_has_a_stable_cache_key():
    assert gemm_loops.GemmLoops().uuid() == gemm_loops.GEMM_LOOPS.uuid()
    assert gemm_loops.GemmLoops(1024).uuid() != gemm_loops.GEMM_LOOPS.uuid()


def test_backend_takes_gemm_loops_as_an_option():
    """torch.compile(backend="optimus_egg", options={"gemm_loops": False}) turns the pass off (on
    by default); the values are eager's either way."""
    torch.manual_seed(0)
    model, x = _Experts().eval(), torch.randn(32, 16)
    with torch.no_grad():
        expected = model(x)
        fired = {}
        for on in (False, True, None):
            torch._dynamo.reset()
            counters["inductor"][gemm_loops.COUNTER] = 0
            options = {} if on is None else {"gemm_loops": on}
            got = torch.compile(model, backend="optimus_egg", options=options)(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
            fired[on] = counters["inductor"][gemm_loops.COUNTER]
    assert fired[False] == 0 and fired[True] > 0 and fired[None] == fired[True], fired


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lone_gemm_at_the_limit_is_loops_in_every_mode(dtype):
    """A [256, 16] @ [16, 16] linear (MAX_MACS multiply-adds) through the backend, alone: loops
    in inference (its forward GEMM) and trained (its forward GEMM and its weight gradient's);
    values and gradients eager's (bfloat16: as close to float64 as plain Inductor's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).to(dtype)
    x = torch.randn(256, 16, dtype=dtype)
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    fired = {}
    for train in (False, True):
        torch._dynamo.reset()
        counters["inductor"][gemm_loops.COUNTER] = 0
        compiled = torch.compile(model, backend="optimus_egg")
        with torch.set_grad_enabled(train):
            got, want = compiled(x), model(x)
        torch.testing.assert_close(got, want, **tol)
        if train:
            grads = torch.autograd.grad(got.sum(), list(model.parameters()))
            expected = torch.autograd.grad(want.sum(), list(model.parameters()))
            for g, e in zip(grads, expected):
                torch.testing.assert_close(g, e, **tol)
        fired[train] = counters["inductor"][gemm_loops.COUNTER]
    assert fired == {False: 1, True: 2}, fired


def test_the_search_prices_gemms_as_the_pass_writes_them():
    """A lone [256, 16] @ [16, 16] linear (MAX_MACS multiply-adds, the pass's limit): the search's
    whole-graph estimate and the bench's prediction of the finished graph both price it as the
    loops the pass writes, and match Inductor's count; values the input graph's."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.bench import fx_layouts, predicted_launches
    from optimus_egg.extract import launch_cost
    from optimus_egg.extract.fusion_cost import fused_launches

    torch.manual_seed(0)
    gm, x = fx.symbolic_trace(nn.Sequential(nn.Linear(16, 16), nn.ReLU())), torch.randn(256, 16)
    with torch.no_grad():
        out = optimize(gm, [x], budget_s=1.0, strict=True, gemm_loops=True, training=False)
        compiled = compile_inductor(as_backend_compiles(out), [x])
        torch.testing.assert_close(compiled.fn(x), gm(x))
    assert compiled.launches.extern == 0, compiled.launches
    assert predicted_launches(out, [x], gemm_loops=True) == compiled.launches.total, compiled.launches
    shape_of, strided_of = fx_layouts(out, [x])
    report = out.meta["optimus_egg"]
    assert report.cost_table == launch_cost.LOOPS
    assert fused_launches(out, shape_of, launch_cost.LOOPS, strided_of) == compiled.launches.total


@pytest.mark.parametrize("train", [False, True])
def test_gemms_at_the_limit_batch_in_every_mode(train):
    """Four [256, 16] @ [16, 16] linears on one input (each MAX_MACS multiply-adds): as loops
    each does a call's work (launch_cost.loop_work), so the search batches them into one, which
    the backend compiles as one extern GEMM (past MAX_MACS: no loops), and in training its two
    gradients' GEMMs too. Values (and gradients) the input graph's."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.extract import launch_cost
    from optimus_egg.testing import fired

    torch.manual_seed(0)
    gm, x = fx.symbolic_trace(_Wide(16)), torch.randn(256, 16, requires_grad=True)
    with torch.set_grad_enabled(train):
        expected = gm(x)
        out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, training=train)
    report = out.meta["optimus_egg"]
    assert report.cost_table == launch_cost.LOOPS
    assert fired(report, "batch-linear-lhs"), report
    counters["inductor"][gemm_loops.COUNTER] = 0
    compiled = compile_inductor(as_backend_compiles(out), [x], training=train)
    with torch.set_grad_enabled(train):
        got = compiled.fn(x)
    torch.testing.assert_close(got, expected)
    if train:
        params = dict(gm.named_parameters())
        assert dict(out.named_parameters()).keys() == params.keys()  # the graph concatenates the weights
        grads = torch.autograd.grad(got.sum(), [x, *params.values()])
        want = torch.autograd.grad(expected.sum(), [x, *params.values()])
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w)
    assert compiled.launches.extern == (3 if train else 1), compiled.launches
    assert counters["inductor"][gemm_loops.COUNTER] == 0


def test_loops_table_prices_gemms_up_to_the_limit_as_code():
    """launch_cost.LOOPS (the search's prices): a GEMM of at most MAX_MACS multiply-adds, which the
    pass writes as loops, is elementwise code there; on the CPU table it launches (unless
    Inductor's own decompositions apply). A GEMM whose loops would run scalar is a call, priced
    so up to MAX_MACS (scalar_loops)."""
    from optimus_egg.extract import launch_cost as lc

    assert lc.table_for("cpu", gemm_loops=True) == lc.LOOPS
    assert lc.table_for("cuda", gemm_loops=True) == "cpu"  # CPU-only pass; no GPU table
    f32, bf16, fp16 = torch.zeros(1), torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.float16)
    f64, i64 = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.int64)
    assert lc.table_of([f32], gemm_loops=True) == lc.LOOPS
    assert lc.table_of([f32]) == lc.table_of([bf16]) == "cpu"
    assert lc.table_of([bf16, fp16, i64], gemm_loops=True) == lc.LOOPS
    assert lc.table_of([f32, bf16], gemm_loops=True) == lc.LOOPS
    assert lc.table_of([i64], gemm_loops=True) == lc.LOOPS
    assert lc.table_of([torch.zeros(1, dtype=torch.float8_e4m3fn)], gemm_loops=True) == "cpu"  # not rewritten
    assert lc.table_of([f64, i64], gemm_loops=True) == lc.LOOPS
    wide = fx.symbolic_trace(_Wide(4))  # a graph's parameters count: float8 weights keep the CPU table
    assert lc.graph_table(wide, [torch.zeros(2, 4)], gemm_loops=True) == lc.LOOPS
    assert lc.graph_table(wide.to(torch.bfloat16), [bf16.expand(2, 4)], gemm_loops=True) == lc.LOOPS
    assert lc.graph_table(fx.symbolic_trace(_Wide(4).to(torch.float8_e4m3fn)), [torch.zeros(2, 4)], gemm_loops=True) == "cpu"
    assert lc.LOOP_LIMITS == {lc.LOOPS: gemm_loops.MAX_MACS}
    for table, limit in lc.LOOP_LIMITS.items():
        at_limit = (limit // (16 * 16), 16)  # x [M, 16] @ w.T [16, 16]: the limit exactly
        over = (at_limit[0] + 1, 16)
        for bias in (False, True):
            assert lc.elementwise_linear(at_limit, (16, 16), bias, table)
            assert not lc.elementwise_linear(over, (16, 16), bias, table)
            assert not lc.elementwise_linear(at_limit, (16, 16), bias, table, strided=True)
            assert not lc.elementwise_linear(at_limit, (16, 16), bias, "cpu")
            assert lc.elementwise_batched_linear((4, 8, 16), (4, 16, 16), bias, table)
            assert not lc.elementwise_batched_linear((4, 8, 16), (4, 16, 16), bias, "cpu")
        bmm = (4, limit // (4 * 16 * 16), 16)  # a bmm of the limit exactly
        assert lc.elementwise_matmul(bmm, (4, 16, 16), table)
        assert not lc.elementwise_matmul(bmm, (4, 16, 17), table)
        assert lc.elementwise_matmul((2, 32, 16), (16, 16), table)           # folded to one mm
        assert not lc.elementwise_matmul((2, 32, 16), (3, 16, 16), table)    # batch dims differ
        assert not lc.elementwise_matmul(bmm, (4, 16, 16), "cpu")
        assert lc.scalar_loops(gemm_loops.MAX_MACS, table) and not lc.scalar_loops(gemm_loops.MAX_MACS + 1, table)
    assert lc.gemm_macs((4, 8, 16), (4, 16, 2)) == lc.gemm_macs((32, 16), (16, 2)) == 1024
    assert lc.gemm_macs((4, 8, 16), (3, 16, 2)) is None and lc.gemm_macs((16,), (16, 2)) is None
    assert not lc.scalar_loops(1024, "cpu") and not lc.scalar_loops(None, lc.LOOPS)


def test_the_pass_writes_every_dtype_up_to_max_macs():
    """gemm_loops.small_gemm: a GEMM of MAX_MACS multiply-adds is loops in every dtype, one more
    row past it is not; below a lower limit neither is."""
    rows = gemm_loops.MAX_MACS // (16 * 16)  # x [rows, 16] @ w [16, 16]: MAX_MACS exactly
    for dtype in gemm_loops.DTYPES:
        for m, loops in ((rows, True), (rows + 1, False)):
            gm = make_fx(lambda x, w: x @ w)(torch.zeros(m, 16, dtype=dtype), torch.zeros(16, 16, dtype=dtype))
            mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
            assert gemm_loops.small_gemm(mm) is loops, (dtype, m)
            assert gemm_loops.small_gemm(mm, gemm_loops.MAX_MACS // 2) is False


class _Wide(nn.Module):
    """Four linears reading one input (one wide GEMM for the search), summed."""

    def __init__(self, d: int):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        return sum(torch.relu(e(x)) for e in self.experts)


@pytest.mark.parametrize("rows,d,calls", [(32, 16, 0), (64, 128, 1)])
def test_search_priced_for_the_loops_batches_gemms_into_loops_or_a_call(rows, d, calls):
    """Four linears on one input batch into one wide linear with either table. Priced for the
    loops (gemm_loops=True), four 32 x 16 x 16 GEMMs make one of 32,768 multiply-adds (within
    SEARCH_MACS) that the loops write as code: no call; four 64 x 128 x 128 make one call.
    Values equal the input graph's every time."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.testing import fired

    torch.manual_seed(0)
    gm, x = fx.symbolic_trace(_Wide(d).eval()), torch.randn(rows, d)
    with torch.no_grad():
        expected = gm(x)
        for loops in (False, True):
            out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=loops)
            report = out.meta["optimus_egg"]
            assert report.cost_table == ("cpu_loops" if loops else "cpu")
            assert fired(report, "batch-linear-lhs"), (loops, report)
            assert sum(n.target is torch._C._nn.linear or n.op == "call_module" for n in out.graph.nodes) == 1
            torch.testing.assert_close(out(x), expected)
        c = compile_inductor(as_backend_compiles(out), [x])
        assert c.launches.extern == calls, c.launches
        torch.testing.assert_close(c.fn(x), expected)


def test_optimize_rejects_a_gemm_loops_that_is_not_a_bool():
    from optimus_egg import optimize

    gm = fx.symbolic_trace(_Wide(4))
    with pytest.raises(TypeError, match="gemm_loops"):
        optimize(gm, [torch.randn(2, 4)], gemm_loops="yes")


@pytest.mark.parametrize("rows,training", [(32, True), (256, True), (256, False)])
def test_post_grad_batching_leaves_the_loops_gemms_alone(rows, training):
    """The four expert linears' GEMMs (forward [rows, 16] @ [16, 16], in training the backward's
    too) are batched by the backend's post-grad passes, but not where the loops write each of
    them as code, up to MAX_MACS in every mode (rows 256: MAX_MACS each, past SEARCH_MACS):
    there the batch would be one call in place of code fused with its neighbours. Values and
    gradients equal eager's either way."""
    torch.manual_seed(0)
    model, x = _Experts().train(training), torch.randn(rows, 16)
    gm = fx.symbolic_trace(model)
    expected, grads = _eager(model, x, training)
    batched, launches = {}, {}
    for loops in (False, True):
        counters["inductor"].clear()
        c = compile_inductor(gm, [x], training=training, config_patches=backend_patches(gemm_loops=loops))
        with torch.set_grad_enabled(training):
            _assert_eager_s(c.fn(x), model, expected, grads, training, grad_atol=1e-4)
        batched[loops] = counters["inductor"]["batch_linear_post_grad"]  # the fusion's counter
        launches[loops] = c.launches.total
    assert batched[False] > 0 and batched[True] == 0, batched
    assert launches[True] < launches[False], launches


class _PerFeature(nn.Module):
    """`n` features, each its own Linear(16, 16) on its own [32, 16] input, then relu."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))

    def forward(self, x):
        return torch.cat([torch.relu(lin(x[:, 16 * i:16 * (i + 1)])) for i, lin in enumerate(self.layers)], 1)


@pytest.mark.parametrize("n", [4, 16])
def test_loop_gemm_groups_batch_as_loops_or_as_one_call(n):
    """`n` parallel [32, 16] @ [16, 16] linears, each code the loops write. Groups of them are
    seeded whatever their size, and the price decides what the batch is: four (32,768
    multiply-adds in all, within SEARCH_MACS) batch into one linear the loops write too, no call;
    sixteen (131,072, past one call's work: launch_cost.batch_of_loops) into one extern call.
    Values equal the input graph's either way."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.testing import fired

    torch.manual_seed(0)
    gm, x = fx.symbolic_trace(_PerFeature(n).eval()), torch.randn(32, 16 * n)
    with torch.no_grad():
        out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, training=False)
        report = out.meta["optimus_egg"]
        assert "linear" in report.groups and fired(report, "batch-linear"), report
        assert "batched_linear" in {getattr(node.target, "__name__", node.target) for node in out.graph.nodes}
        c = compile_inductor(as_backend_compiles(out), [x])
        assert c.launches.extern == (1 if n == 16 else 0), c.launches
        torch.testing.assert_close(c.fn(x), gm(x))



class _PerFeatureNorm(nn.Module):
    """`n` features, each Linear(16, 16) on its own [32, 16] input, LayerNorm, relu (illustrative's layers)."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU()) for _ in range(n))

    def forward(self, x):
        return torch.cat([f(x[:, 16 * i:16 * (i + 1)]) for i, f in enumerate(self.layers)], 1)


@pytest.mark.parametrize("rows,dtype,linears", [(32, torch.float32, "call"), (12, torch.float32, "loops"),
                                                (32, torch.float16, "apart")])
def test_loop_gemms_batch_into_a_call_once_their_work_passes_one(monkeypatch, rows, dtype, linears):
    """16 parallel [rows, 16] @ [16, 16] linears between layer norms. Apart, each is code the
    loops fuse with its neighbours, priced elementwise plus its work over MAX_MACS
    (launch_cost.loop_work); batched, one call past MAX_MACS plus its members' code
    (launch_cost.batch_of_loops), or within it loops again. At 32 rows the group's work
    (131,072 multiply-adds) passes one call's: the linears batch into one extern call, and
    optimize keeps the result though it launches more than the input, whose loops' work it
    counts. At 12 rows (49,152) the linears batch into one GEMM the loops write, no call. In
    float16 the loops always win (launch_cost.loop_break_even): 32 rows stay loops apart, and
    priced at the call alone the search batches them too and the fusion estimate keeps the
    input. The layer norms batch every time; the compile launches what the estimate predicts,
    with the input's values."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.extract import launch_cost as lc
    from optimus_egg.testing import fired

    assert lc.batch_of_loops((16, 32, 16), (16, 16, 16), lc.LOOPS)
    assert not lc.batch_of_loops((16, 32, 16), (16, 16, 16), "cpu")
    assert not lc.batch_of_loops((16, 12, 16), (16, 16, 16), lc.LOOPS)     # the batch is code too
    assert not lc.batch_of_loops((16, 64, 64), (16, 64, 64), lc.LOOPS)    # each member a call
    assert lc.loop_work(rows * 256, lc.LOOPS) == rows * 256 / gemm_loops.MAX_MACS
    assert lc.loop_work(rows * 256, "cpu") == lc.loop_work(rows * 256, lc.LOOPS, scalar=True) == 0
    torch.manual_seed(0)
    model, x = _PerFeatureNorm(16).eval().to(dtype), torch.randn(rows, 256, dtype=dtype)
    assert lc.loop_break_even([x, *model.parameters()]) == (gemm_loops.MAX_MACS if dtype == torch.float32 else math.inf)
    gm = fx.symbolic_trace(model)
    with torch.no_grad():
        out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, hoisted=True)
        report = out.meta["optimus_egg"]
        assert fired(report, "batch-linear") and fired(report, "batch-layernorm"), report
        targets = {getattr(n.target, "__name__", n.target) for n in out.graph.nodes}
        assert "batched_layer_norm" in targets and ("batched_linear" in targets) is (linears != "apart"), targets
        assert report.changed and (report.launches_after > report.launches_before) is (linears == "call"), report
        c = compile_inductor(as_backend_compiles(out), [x])
        assert c.launches.total == report.launches_after, (c.launches, report)
        assert c.launches.extern == (1 if linears == "call" else 0), c.launches
        torch.testing.assert_close(c.fn(x), model(x), **({} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}))
        if linears == "apart":
            monkeypatch.setattr("optimus_egg.pipeline.batch_of_loops", lambda *a: False)
            alone = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, hoisted=True).meta["optimus_egg"]
            assert not alone.changed and "fusion estimate" in alone.kept_input, alone


class _TwoInputs(nn.Module):
    """Two chains apart, each a large GEMM (a call) then a small one (code with the loops): two
    fused groups, one C++ run of code after both calls."""

    def __init__(self):
        super().__init__()
        self.big = nn.ModuleList(nn.Linear(256, 256) for _ in range(2))
        self.small = nn.ModuleList(nn.Linear(256, 16) for _ in range(2))

    def forward(self, x, y):
        return tuple(torch.tanh(s(torch.relu(b(t)))) for b, s, t in zip(self.big, self.small, (x, y)))


def test_fusion_estimate_counts_loop_code_as_cpu_kernels():
    """Under the loops table the whole-graph estimate counts C++ kernels as on CPU, the code
    runs between calls (not one kernel per fused group), as Inductor compiles it."""
    from optimus_egg.bench import fx_shapes
    from optimus_egg.extract import launch_cost as lc
    from optimus_egg.extract.fusion_cost import fused_launches

    torch.manual_seed(0)
    model, inputs = _TwoInputs().eval(), [torch.randn(8, 256), torch.randn(8, 256)]
    gm = fx.symbolic_trace(model)
    shapes = fx_shapes(gm, inputs)
    with torch.no_grad():
        loops = compile_inductor(gm, inputs, config_patches=backend_patches(gemm_loops=True)).launches.total
        calls = compile_inductor(gm, inputs, config_patches=backend_patches(gemm_loops=False)).launches.total
    assert fused_launches(gm, shapes, lc.LOOPS) == loops == 3  # the two large GEMMs, then one run of code
    assert calls > loops  # without the loops the small GEMMs are calls too


def _transposed_mm(x, w):
    """A linear over a transposed input as Inductor sees it: clone, view, mm with w.T."""
    rows = torch.transpose(x, 1, 2).clone().reshape(-1, x.shape[1])
    return torch.mm(rows, w.t())


def _contiguous_mm(x, w):
    return torch.mm(x.reshape(-1, x.shape[2]), w.t())


@pytest.mark.parametrize("program,rewritten", [(_transposed_mm, 0), (_contiguous_mm, 1)])
def test_loops_only_where_they_vectorize(program, rewritten):
    """A small GEMM whose rows Inductor would read with a stride (x [8, 8, 16] transposed: each
    row of the [128, 8] operand steps 16 through x) stays a call: its loops would run scalar.
    The same GEMM on contiguous rows is rewritten. Values equal before and after."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 8, 16, generator=g), torch.randn(8, 8 if program is _transposed_mm else 16, generator=g)
    gm = make_fx(program, tracing_mode="fake")(x, w)
    before = gm(x, w)
    (mm,) = [n for n in gm.graph.nodes if n.target in GEMMS]
    assert gemm_loops.small_gemm(mm)
    assert gemm_loops.vectorizes(mm) is bool(rewritten)
    assert gemm_loops.rewrite(gm.graph) == rewritten
    gm.recompile()
    torch.testing.assert_close(gm(x, w), before)


def test_a_layout_that_cannot_be_replayed_leaves_the_gemm_a_call():
    """Where the buffer behind an operand's views is unknown (no fake value to replay on), the
    GEMM stays a call rather than the pass failing Inductor's compile."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 8, 16, generator=g), torch.randn(8, 16, generator=g)
    gm = make_fx(_contiguous_mm, tracing_mode="fake")(x, w)
    (mm,) = [n for n in gm.graph.nodes if n.target in GEMMS]
    assert gemm_loops.written_as_loops(mm)
    next(n for n in gm.graph.nodes if n.op == "placeholder").meta.pop("val")
    assert gemm_loops.small_gemm(mm) and not gemm_loops.vectorizes(mm)
    assert gemm_loops.rewrite(gm.graph) == 0


def test_source_offsets_replay_the_views_before_a_gemm():
    """Each element of an operand maps to its offset in the buffer Inductor reads: through a
    transpose, a copy and a view back to x's own layout."""
    x, w = torch.randn(2, 3, 4), torch.randn(5, 3)
    gm = make_fx(_transposed_mm, tracing_mode="fake")(x, w)
    (mm,) = [n for n in gm.graph.nodes if n.target in GEMMS]
    offsets = gemm_loops.source_offsets(mm.args[0])
    # rows of the [8, 3] operand are (batch, column of x) pairs; each steps 4 through x
    expected = torch.arange(24).reshape(2, 3, 4).transpose(1, 2).reshape(8, 3)
    assert torch.equal(offsets, expected)
    assert torch.equal(gemm_loops.source_offsets(mm.args[1]), torch.arange(15).reshape(5, 3).t())


def test_rows_strided_reads_tensors_metas_and_tensor_metadata():
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    from optimus_egg.shapes import Meta, rows_strided

    t = torch.randn(4, 6)
    assert not rows_strided(t) and rows_strided(t.t())
    assert not rows_strided(torch.randn(4, 1).t().t())  # a last dim of 1 has no stride to speak of
    assert rows_strided(Meta((6, 4), t.dtype, t.device, (1, 6)))
    assert not rows_strided(Meta((6, 4), t.dtype, t.device))  # strides unknown
    assert rows_strided(_extract_tensor_metadata(t.t())) and not rows_strided(_extract_tensor_metadata(t))
    assert not rows_strided(None) and not rows_strided(3)


class _Mixes(nn.Module):
    """Wukong's compress pattern: two bias-free linears over one input transposed, [B, d, n] @
    [n, o], each small enough for the loops but read with stride d."""

    def __init__(self, n: int = 8, transposed: bool = True):
        super().__init__()
        self.transposed = transposed
        self.a, self.b = nn.Linear(n, 8, bias=False), nn.Linear(n, 4, bias=False)

    def forward(self, x):
        t = torch.transpose(x, 1, 2) if self.transposed else x
        return torch.cat([torch.relu(self.a(t)), torch.tanh(self.b(t))], 2)


@pytest.mark.parametrize("transposed", [True, False])
def test_search_batches_small_gemms_the_loops_would_run_scalar(transposed):
    """Priced for the loops, linears over a transposed input stay calls (shapes.rows_strided),
    so the search merges them into one (batch-linear-lhs), one call fewer than the input
    compiles to; on a contiguous input of the same sizes they are loops, and merged too (49,152
    multiply-adds, within MAX_MACS) still loops: no call either way. The whole-graph estimate
    of the result matches Inductor's count both ways, and values equal the input graph's."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.bench import predicted_launches
    from optimus_egg.testing import fired

    torch.manual_seed(0)
    gm = fx.symbolic_trace(_Mixes(transposed=transposed).eval())
    x = torch.randn(32, 8, 16) if transposed else torch.randn(32, 16, 8)  # linears of 32,768 and 16,384 multiply-adds
    out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, training=False)
    report = out.meta["optimus_egg"]
    assert fired(report, "batch-linear-lhs"), report
    linears = sum(n.target is torch._C._nn.linear or n.op == "call_module" for n in out.graph.nodes)
    assert linears == 1, out.code
    with torch.no_grad():
        torch.testing.assert_close(out(x), gm(x))
        # (the weights' concatenation per call, as the estimate prices it: hoist.py would compute it once)
        compiled = compile_inductor(as_backend_compiles(out, hoist=False), [x])
        torch.testing.assert_close(compiled.fn(x), gm(x))
        before = compile_inductor(as_backend_compiles(fx.GraphModule(gm, gm.graph), hoist=False), [x])
    assert compiled.launches.extern == (1 if transposed else 0), compiled.launches
    assert predicted_launches(out, [x], gemm_loops=True) == compiled.launches.total, compiled.launches
    assert before.launches.extern == (2 if transposed else 0), before.launches
    assert compiled.launches.total == before.launches.total - (1 if transposed else 0)


def test_training_keeps_apart_small_gemms_whose_backward_the_loops_write():
    """In training the two transposed linears stay apart (launch_cost.TRAINING_SCALAR_GEMM):
    each is a call forward, but their backward GEMMs are loops, while the merged GEMM (98,304
    multiply-adds, past MAX_MACS) is a call in the backward too. Compiled with a backward, the
    graph priced for training launches fewer kernels than the one priced for inference, and
    both give eager's values and gradients."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.testing import fired

    torch.manual_seed(0)
    model = _Mixes().train()
    gm, x = fx.symbolic_trace(model), torch.randn(64, 8, 16, requires_grad=True)
    expected = model(x)
    expected.sum().backward()
    want = [p.grad.clone() for p in (x, *model.parameters())]
    launches = {}
    for training in (False, True):
        out = optimize(gm, [x], budget_s=5.0, strict=True, gemm_loops=True, training=training)
        report = out.meta["optimus_egg"]
        assert report.training is training
        assert fired(report, "batch-linear-lhs"), report  # the merge is in the e-graph both times
        linears = sum(n.op == "call_module" or n.target is torch._C._nn.linear for n in out.graph.nodes)
        assert linears == (2 if training else 1), out.graph
        compiled = compile_inductor(as_backend_compiles(out), [x], training=True)
        x.grad = None
        model.zero_grad()
        got = compiled.fn(x)
        got.sum().backward()
        torch.testing.assert_close(got, expected)
        for p, w in zip((x, *model.parameters()), want):
            torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-5)
        launches[training] = compiled.launches
    assert launches[True].extern < launches[False].extern, launches
    assert launches[True].total < launches[False].total, launches


def test_training_defaults_to_what_aot_autograd_decides():
    """optimize's `training` (None) is on where grad mode is on and an input or parameter
    requires grad; a non-bool is a TypeError."""
    from optimus_egg import optimize

    gm, x = fx.symbolic_trace(_Mixes()), torch.randn(4, 8, 16)
    assert optimize(gm, [x], budget_s=0.0).meta["optimus_egg"].training is True  # parameters require grad
    with torch.no_grad():
        assert optimize(gm, [x], budget_s=0.0).meta["optimus_egg"].training is False
    frozen = fx.symbolic_trace(_Mixes().requires_grad_(False))
    assert optimize(frozen, [x], budget_s=0.0).meta["optimus_egg"].training is False
    assert optimize(frozen, [x.requires_grad_()], budget_s=0.0).meta["optimus_egg"].training is True
    with pytest.raises(TypeError, match="training"):
        optimize(gm, [x], training="yes")


class _TwoBiasesOneGradient(nn.Module):
    """Two small linears summed: their biases' gradients are two equal sums over the rows."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_repeated_low_precision_reductions_compile(dtype):
    """With the loops the two equal bias-gradient sums land in one C++ kernel, which torch 2.13
    writes with the rounded sum declared twice (a compile error); the second is made a copy of
    the first (`copy_repeated_reductions`): the step compiles, each bias keeps a gradient of its
    own, and the gradients are no further from float64's than eager's."""
    torch.manual_seed(0)
    model = _TwoBiasesOneGradient().to(dtype)
    exact_model = _TwoBiasesOneGradient().double()
    exact_model.load_state_dict(model.state_dict())
    x = torch.randn(64, 3, dtype=dtype)
    counters.clear()
    torch._dynamo.reset()
    torch.compile(model, backend=optimus_egg.backend(strict=True))(x).float().sum().backward()
    assert counters["inductor"][gemm_loops.REPEATS_COUNTER] > 0
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["a.bias"].data_ptr() != grads["b.bias"].data_ptr()
    model.zero_grad()
    model(x).float().sum().backward()
    exact_model(x.double()).sum().backward()
    assert rounds_no_worse(grads, {n: p.grad for n, p in exact_model.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()})
