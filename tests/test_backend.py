"""torch.compile(model, backend="optimus_egg"): inference and training through Inductor."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import optimus_egg


class Parallel(nn.Module):
    def __init__(self, n=6, d=16):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))
        self.n, self.d = n, d

    def forward(self, x):
        xs = torch.split(x, self.d, dim=1)
        return torch.cat([self.norms[i](torch.tanh(self.ls[i](xs[i]))) for i in range(self.n)], dim=1)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)


def test_backend_is_registered_by_entry_point():
    assert "optimus_egg" in torch._dynamo.list_backends()


def test_backend_inference_matches_eager():
    torch.manual_seed(0)
    m, x = Parallel().eval(), torch.randn(8, 96)
    seen = []
    opt = optimus_egg.backend(budget_s=5.0)

    def spy(gm, ex):
        out = optimus_egg.optimize(gm, list(ex), 5.0, strict=True)
        seen.append(out.meta["optimus_egg"])
        return opt(gm, ex)

    with torch.no_grad():
        got = torch.compile(m, backend=spy)(x)
        torch.testing.assert_close(got, m(x))
    assert seen and seen[0].changed and seen[0].matches.get("batch-linear", 0) >= 6


def test_backend_by_name_training_gradients_match_eager(reports):
    torch.manual_seed(0)
    m, x = Parallel(), torch.randn(8, 96)
    ref = Parallel()
    ref.load_state_dict(m.state_dict())
    compiled = torch.compile(m, backend="optimus_egg")
    compiled(x).square().sum().backward()
    assert reports and reports[0].changed, "the training graph was not rewritten"
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s: f"{name}: {s}")


def test_backend_by_name_takes_torch_compiles_mode_and_options(monkeypatch):
    """torch.compile(backend="optimus_egg", mode=..., options=...): backend keys configure the
    backend, other keys and the mode's options reach Inductor over optimus_egg's own."""
    import torch._inductor.compile_fx as cfx

    import optimus_egg.pipeline as pipeline

    budgets, patches = [], []
    real_optimize, real_compile_fx = pipeline.optimize, cfx.compile_fx

    def spy_optimize(gm, ex, budget_s, **k):
        budgets.append(budget_s)
        return real_optimize(gm, ex, budget_s, **k)

    def spy_compile_fx(*a, config_patches=None, **k):
        patches.append(dict(config_patches or {}))
        return real_compile_fx(*a, config_patches=config_patches, **k)

    monkeypatch.setattr(pipeline, "optimize", spy_optimize)
    monkeypatch.setattr(cfx, "compile_fx", spy_compile_fx)
    torch.manual_seed(0)
    m, x = Parallel().eval(), torch.randn(8, 96)
    compiled = torch.compile(m, backend="optimus_egg",
                             options={"budget_s": 0.5, "kernel_order": False, "epilogue_fusion": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x))
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(m, backend="optimus_egg", mode="reduce-overhead")(x), m(x))
    assert budgets == [0.5, 1.0]
    by_options, by_mode = [p for p in patches if p]  # compile_fx calls itself without patches
    assert by_options["epilogue_fusion"] is False  # the user's Inductor option
    assert "post_grad_fusion_options" in by_options and "_post_fusion_custom_pass" not in by_options
    assert by_mode["triton.cudagraphs"] is True and "_post_fusion_custom_pass" in by_mode  # the mode's, and ours


@pytest.mark.parametrize("kw, problem", [(dict(options={"bogus": 1}), "'bogus'"),
                                         (dict(options=[("budget_s", 1)]), "must be a dict"),
                                         (dict(mode="fastest"), "mode=fastest")])
def test_backend_by_name_names_a_bad_option_or_mode(kw, problem):
    m, x = Parallel().eval(), torch.randn(8, 96)
    with pytest.raises(Exception, match=problem) as info:
        torch.compile(m, backend="optimus_egg", **kw)(x)
    cause = getattr(info.value, "inner_exception", info.value)  # Dynamo's BackendCompilerFailed wraps it
    assert isinstance(cause, (TypeError, ValueError)), repr(info.value)


def test_backend_rejects_an_unknown_option_when_built():
    with pytest.raises(TypeError, match="'budget'.*budget_s"):
        optimus_egg.backend(budget=1.0)
    with pytest.raises(ValueError, match="'no_such_option'"):
        optimus_egg.backend(inductor={"no_such_option": 1})
    with pytest.raises(ValueError, match="budget_s must be a finite number"):
        optimus_egg.backend(budget_s=-1.0)
    with pytest.raises(ValueError, match="unknown rule families or rules \\['bogus'\\]"):
        optimus_egg.backend(disable=["bogus"])


@pytest.mark.parametrize("error", ["RuntimeError", "InductorError"])
@pytest.mark.parametrize("strict", [False, True], ids=["fallback", "strict"])
def test_backend_compiles_the_unmodified_graph_when_inductor_fails_on_the_optimized_one(monkeypatch, strict, error):
    """An Inductor failure on the rewritten graph is an optimizer failure: a warning and the
    graph Dynamo captured, compiled as usual (strict: the error). Inductor wraps what fails
    inside it (a post-grad pass raising IndexError) in an InductorError, which is one of
    Dynamo's own exceptions (BackendCompilerFailed), not one of its signals."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor.exc import InductorError

    real, compiled = inductor.compile_fx, []

    def fails_on_rewritten(gm, example_inputs, **kw):
        report = gm.meta.get("optimus_egg")
        if report is not None and report.changed:
            failure = RuntimeError("Inductor failure")
            raise failure if error == "RuntimeError" else InductorError(failure, None)
        compiled.append(gm)
        return real(gm, example_inputs, **kw)

    monkeypatch.setattr(inductor, "compile_fx", fails_on_rewritten)
    torch.manual_seed(0)
    m, x = Parallel().eval(), torch.randn(8, 96)
    fn = torch.compile(m, backend=optimus_egg.backend(budget_s=5.0, strict=strict))
    with torch.no_grad():
        if strict:
            with pytest.raises(Exception, match="Inductor failure"):
                fn(x)
            return
        with pytest.warns(RuntimeWarning, match="Inductor failed on the optimized graph"):
            got = fn(x)
        torch.testing.assert_close(got, m(x))
    # (compile_fx calls itself once more to apply its config patches)
    assert compiled and all(g is compiled[0] for g in compiled)
    assert "optimus_egg" not in compiled[0].meta  # Dynamo's own graph
    assert sum(n.target is torch._C._nn.linear for n in compiled[0].graph.nodes) == 6


def test_backend_compiles_dynamos_graph_without_the_post_grad_passes_when_they_fail_on_it_too(monkeypatch):
    """A post-grad pass that raises inside Inductor on the optimized graph and on Dynamo's:
    the backend ends where plain torch.compile would be, Dynamo's graph without the passes,
    with a warning for each step."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor.exc import InductorError

    real, compiled = inductor.compile_fx, []

    def fails_with_the_passes(gm, example_inputs, **kw):
        if kw.get("config_patches"):
            raise InductorError(IndexError("tuple index out of range"), None)
        compiled.append(gm)
        return real(gm, example_inputs, **kw)

    monkeypatch.setattr(inductor, "compile_fx", fails_with_the_passes)
    torch.manual_seed(0)
    m, x = Parallel().eval(), torch.randn(8, 96)
    fn = torch.compile(m, backend=optimus_egg.backend(budget_s=5.0))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fn(x)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("failed on the optimized graph" in w for w in said), said
    assert any("failed with optimus_egg's Inductor options" in w and "without them" in w for w in said), said
    torch.testing.assert_close(got, m(x))
    assert compiled and "optimus_egg" not in compiled[0].meta  # Dynamo's own graph


def _drop_a_gradient(gm: torch.fx.GraphModule) -> None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.args = (tuple(out.args[0])[:-1],)
    gm.recompile()


@pytest.mark.parametrize("strict", [False, True], ids=["fallback", "strict"])
def test_backend_compiles_the_backward_without_the_post_grad_passes_when_inductor_fails_on_it(monkeypatch, strict):
    """The backward is compiled on the first backward call, when the forward (the optimized
    graph) has run: a post-grad pass raising inside Inductor there (torch 2.13's
    select_cat_aten_pass did) gives a warning and the backward compiled without the post-grad
    passes, from the graph as it was before the failed attempt; gradients equal eager's."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config
    from torch._inductor.exc import InductorError

    real, backward_with_passes = inductor.compile_fx_inner, []

    def fails_on_the_backward_with_passes(gm, example_inputs, **kw):
        if kw.get("is_backward"):
            backward_with_passes.append(bool(config.post_grad_fusion_options))
            if config.post_grad_fusion_options:
                _drop_a_gradient(gm)  # a graph a pass that raised midway left behind
                raise InductorError(IndexError("tuple index out of range"), None)
        return real(gm, example_inputs, **kw)

    monkeypatch.setattr(inductor, "compile_fx_inner", fails_on_the_backward_with_passes)
    torch.manual_seed(0)
    m, x = Parallel(), torch.randn(8, 96)
    ref = Parallel()
    ref.load_state_dict(m.state_dict())
    with config.patch(force_disable_caches=True):  # (a cached backward is loaded, not compiled)
        loss = torch.compile(m, backend=optimus_egg.backend(budget_s=5.0, strict=strict))(x).square().sum()
        if strict:
            with pytest.raises(Exception, match="tuple index out of range"):
                loss.backward()
            return
        with pytest.warns(RuntimeWarning, match="failed on the backward with optimus_egg's Inductor options"):
            loss.backward()
    assert backward_with_passes == [True, False]
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s, n=name: f"{n}: {s}")


def test_eight_parallel_linears_launch_one_gemm():
    from optimus_egg.measure import compile_inductor
    from optimus_egg.testing import calls

    class Eight(nn.Module):
        def __init__(self):
            super().__init__()
            self.ls = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))

        def forward(self, x):
            xs = torch.unbind(x, dim=0)
            return [self.ls[i](xs[i]) for i in range(8)]

    torch.manual_seed(0)
    m, x = Eight().eval(), torch.randn(8, 4, 16)
    gm = torch.fx.symbolic_trace(m)
    fast = optimus_egg.optimize(gm, [x], budget_s=5.0, strict=True)
    plain, egg = compile_inductor(gm, [x]), compile_inductor(fast, [x])
    assert plain.launches.extern == 8 and egg.launches.extern == 1
    with torch.no_grad():
        torch.testing.assert_close(egg(x), m(x))
    assert calls(fast, nn.Linear) == 0


class Uneven(nn.Module):
    """Linears at different depths, compiled with optimus_egg's linear batching off: it
    batches none of them, their backward GEMMs are independent (what the post-grad Optimus
    passes batch)."""

    def __init__(self, d=16):
        super().__init__()
        self.a, self.b, self.c, self.e = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        return self.a(x) * self.c(torch.relu(self.b(x))) + self.e(torch.tanh(x))


@pytest.mark.parametrize("post_grad", [True, False])
def test_backend_runs_the_post_grad_passes_in_training(post_grad):
    from torch._dynamo.utils import counters

    from optimus_egg.baselines import OPTIMUS_POST_GRAD

    counters.clear()
    torch.manual_seed(0)
    m, x = Uneven(), torch.randn(8, 16)
    ref = Uneven()
    ref.load_state_dict(m.state_dict())
    compiled = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0, post_grad=post_grad, gemm_loops=False,
                                                            disable=["batch_linear", "batch_linear_lhs"]))
    out = compiled(x)
    out.square().sum().backward()
    ran = {k: v for k, v in counters["inductor"].items() if k in OPTIMUS_POST_GRAD and v}
    if post_grad:
        assert ran.get("batch_linear_post_grad", 0) > 0, ran
    else:
        assert not ran, ran
    expected = ref(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s: f"{name}: {s}")


class TwoGates(nn.Module):
    """Backward holds two independent same-shape adds (each gate's product rule), which
    PyTorch's batch_aten_add pass batches."""

    def __init__(self, d=16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        p, q = self.a(x), self.b(torch.relu(x))
        return (p * torch.tanh(p)).sum() + (q * torch.sigmoid(q)).sum()


def test_backend_leaves_out_the_pointwise_post_grad_batching():
    """backend() compiles with EGG_POST_GRAD: batch_aten_add and batch_aten_mul, which all of
    PyTorch's post-grad passes run on this backward, do not run; the GEMM batching does."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    from optimus_egg.baselines import (
        BATCH_BMM,
        EGG_POST_GRAD,
        OPTIMUS_POST_GRAD,
        SAME_DTYPE_BATCH_LINEAR,
        post_grad_patches,
    )

    assert not any(k.startswith("batch_aten_") for k in EGG_POST_GRAD)
    assert set(EGG_POST_GRAD) - {SAME_DTYPE_BATCH_LINEAR, BATCH_BMM} < set(OPTIMUS_POST_GRAD)

    def ran_with(backend):
        counters.clear()
        torch._dynamo.reset()
        torch.manual_seed(0)
        m, x = TwoGates(), torch.randn(8, 16)
        ref = TwoGates()
        ref.load_state_dict(m.state_dict())
        out = torch.compile(m, backend=backend)(x)
        out.backward()
        expected = ref(x)
        expected.backward()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s, n=name: f"{n}: {s}")
        return {k for k, v in counters["inductor"].items() if k in OPTIMUS_POST_GRAD and v}

    def every_pass(gm, example_inputs):
        return compile_fx(optimus_egg.optimize(gm, list(example_inputs), 2.0), example_inputs,
                          config_patches=post_grad_patches())

    assert {"batch_aten_add", "batch_aten_mul"} <= ran_with(every_pass)
    ran = ran_with(optimus_egg.backend(budget_s=2.0, gemm_loops=False))  # tiny GEMMs: loops would keep them apart
    # the refined pass counts its groups under the name of the pass it refines
    assert ran <= set(EGG_POST_GRAD) | {"batch_linear_post_grad"}, ran
    assert "batch_linear_post_grad" in ran, ran


class TwoDtypes(nn.Module):
    """An fp64 and two fp32 linears of one size, at different depths (optimus_egg batches none
    of them) and independent: PyTorch's post-grad pass batches their GEMMs."""

    def __init__(self, d=8):
        super().__init__()
        self.wide = nn.Linear(d, d).double()
        self.narrow = nn.ModuleList(nn.Linear(d, d) for _ in range(2))

    def forward(self, x):
        return self.wide(x.double()).float() + self.narrow[0](x) * self.narrow[1](torch.relu(x))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_backend_batches_post_grad_gemms_of_one_dtype_only(training):
    """torch 2.13's batch_linear_post_grad stacks an fp64 and an fp32 GEMM of one size into one
    fp64 bmm (the result comes back fp64); the backend's copy keys its groups by dtype too."""
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    m, x = TwoDtypes(), torch.randn(4, 8)
    ref = TwoDtypes()
    ref.load_state_dict(m.state_dict())
    with torch.set_grad_enabled(training):
        out = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0, gemm_loops=False))(x)
        expected = ref(x)
    assert counters["inductor"]["batch_linear_post_grad"] > 0, dict(counters["inductor"])
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    if training:
        out.sum().backward()
        expected.sum().backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            assert p.grad.dtype == q.grad.dtype, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s, n=name: f"{n}: {s}")


class TanhScores(nn.Module):
    """Per-field linears, then one field's output scores every field with tanh and weighs it:
    batch-matmul-lhs makes one product of the concatenated keys, so the forward saves the wide
    tanh output and a view of it (a split piece that a product reads). The eval-mode dropout
    (an identity) changes which tensors AOTAutograd saves: without it the bug stays hidden."""

    def __init__(self, n=4, d=4):
        super().__init__()
        self.n, self.d = n, d
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(n))

    def forward(self, x):
        ps = list(torch.split(x, self.d, 1))
        ps[0] = F.dropout(ps[0], 0.5, training=False)
        q = [lin(p) for lin, p in zip(self.ls, ps)]
        return sum(torch.tanh(q[1] @ k.t() / self.d) @ k for k in q)


class CatWeightTanh(nn.Module):
    """The same shape written by hand: plain torch.compile gets w0's gradient wrong."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        _, p1 = torch.split(x, 4, 1)
        w = torch.cat([self.ls[0].weight, self.ls[1].weight], 0)
        u, v = torch.split(torch.tanh(p1 @ w.t()), [4, 4], 1)
        return u * 2 + v @ self.ls[0].weight


@pytest.mark.parametrize("make,width", [(TanhScores, 16), (CatWeightTanh, 8)], ids=["rewritten", "by_hand"])
def test_backend_trains_where_inductor_in_place_reuse_breaks_a_saved_view(make, width):
    """torch 2.13's Inductor, with in-place buffer reuse, computes tanh's backward into the saved
    tanh output while a saved split piece of it is still to be read: wrong gradients
    (baselines.EGG_BACKWARD). The backend compiles the backward without that reuse."""
    from torch._inductor import config

    torch.manual_seed(0)
    m, x = make(), torch.randn(3, width)
    ref = make()
    ref.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    out = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0, strict=True, gemm_loops=False))(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda s, n=name: f"{n}: {s}")
    assert config.inplace_buffers  # patched for the backend's compiles only


class TanhTwice(nn.Module):
    """One tanh as a `nested_compile_region` body, called on a linear's output and again on
    (`chained`) half the first call's result, or (else) on half the linear's output."""

    def __init__(self, chained: bool):
        super().__init__()
        self.lin, self.chained = nn.Linear(8, 8), chained

    @torch.compiler.nested_compile_region
    def region(self, a):
        return torch.tanh(a)

    def forward(self, x):
        if self.chained:
            return self.region(self.region(self.lin(x)) * 0.5)
        return self.region(self.lin(x)) + self.region(self.lin(x) * 0.5)


@pytest.mark.parametrize("chained", [True, False], ids=["chained", "side_by_side"])
def test_a_shared_body_called_twice_trains_as_eagerly(chained):
    """Plain torch.compile (torch 2.13, CPU) trains both models to other weight gradients than
    eager's, and so did the backend (the side-by-side one to a third gradient) until a graph
    calling a trained shared body was compiled without Inductor's in-place buffers too
    (baselines.SHARED_BODY_TRAINING)."""
    torch.manual_seed(0)
    m, x = TanhTwice(chained), torch.randn(4, 8)
    ref = TanhTwice(chained)
    ref.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    out = torch.compile(m, backend=optimus_egg.backend(budget_s=1.0, strict=True))(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(m.lin.weight.grad, ref.lin.weight.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.lin.bias.grad, ref.lin.bias.grad, rtol=1e-5, atol=1e-6)


def test_backward_patched_patches_the_backward_only():
    from torch._inductor import config

    from optimus_egg.baselines import EGG_BACKWARD, backward_patched

    seen = []
    inner = backward_patched(EGG_BACKWARD, inner=lambda gm, ex, **kw: seen.append((kw["is_backward"], config.inplace_buffers)))
    inner(None, [], is_backward=False)
    inner(None, [], is_backward=True)
    assert seen == [(False, True), (True, False)] and config.inplace_buffers


def _post_grad_rule(name=None, gated=True, checked=False):
    """The backend's post-grad fusion `name` (default BATCH_BMM) with EGG_POST_GRAD's options,
    without the stacked-elements limit unless `gated`, and without the check that a batch
    saves a launch (FEWER_LAUNCHES) unless `checked`: these tests batch small graphs to see
    what a batch computes."""
    from torch._inductor.fx_passes import group_batch_fusion as gbf

    from optimus_egg.baselines import BATCH_BMM, EGG_POST_GRAD, FEWER_LAUNCHES, verify_options

    verify_options({}, EGG_POST_GRAD)  # registers the backend's own fusions
    name = name or BATCH_BMM
    options = {**gbf.graph_search_options, **EGG_POST_GRAD[name], FEWER_LAUNCHES: checked}
    if not gated:
        del options["max_stacked_per_launch"]
    return gbf.POST_GRAD_FUSIONS[name](graph_search_options=options)


def test_batch_bmm_fuses_independent_bmms_of_one_shape_only():
    """Two independent [3, 4, 5] @ [3, 5, 6] bmms, interleaved (the first one's reader comes
    before the second one's operand), become one bmm; two of another shape where one reads the
    other, a batched matrix-vector product (elementwise code on CPU) and an fp64 bmm stay."""
    from torch._dynamo.utils import counters
    from torch._inductor.fx_passes.group_batch_fusion import apply_group_batch_fusion
    from torch.fx.experimental.proxy_tensor import make_fx

    from optimus_egg.baselines import BATCH_BMM

    def f(a1, b1, a2, sq, v, e, g):
        p = torch.bmm(a1, b1)
        u = p * 2
        r = torch.bmm(a2 - 1, b1)
        chain = torch.bmm(torch.bmm(sq, sq), sq)
        return u, r, chain, torch.bmm(v, b1), torch.bmm(e, g)

    torch.manual_seed(0)
    args = [torch.randn(3, 4, 5), torch.randn(3, 5, 6), torch.randn(3, 4, 5), torch.randn(3, 4, 4),
            torch.randn(3, 1, 5), torch.randn(3, 4, 5, dtype=torch.float64),
            torch.randn(3, 5, 6, dtype=torch.float64)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    bmms = lambda: [n for n in gm.graph.nodes if n.target == torch.ops.aten.bmm.default]  # noqa: E731
    assert len(bmms()) == 6
    counters.clear()
    apply_group_batch_fusion(gm.graph, _post_grad_rule())
    gm.graph.lint()
    gm.recompile()
    assert counters["inductor"][BATCH_BMM] == 1
    assert len(bmms()) == 5
    fused = [n for n in bmms() if n.args[0].target == torch.ops.aten.cat.default]
    assert len(fused) == 1 and tuple(fused[0].meta["val"].shape) == (6, 4, 6)
    for got, want in zip(gm(*args), f(*args)):
        torch.testing.assert_close(got, want)


class ExpertStack(nn.Module):
    """Two layers of per-expert weights applied with bmm: the backward's weight gradients are
    two independent bmms of one shape."""

    def __init__(self, experts=4, d=16):
        super().__init__()
        self.w = nn.ParameterList(nn.Parameter(torch.randn(experts, d, d) / d**0.5) for _ in range(2))

    def forward(self, h):
        for w in self.w:
            h = torch.tanh(torch.bmm(h, w))
        return h


def test_backend_batches_the_weight_gradient_bmms_of_a_training_step():
    """With BATCH_BMM the backward launches one GEMM fewer; values and gradients equal eager's."""
    from torch._dynamo.utils import counters

    from optimus_egg.baselines import BATCH_BMM, EGG_BACKWARD, EGG_POST_GRAD, post_grad_patches
    from optimus_egg.measure import compile_inductor

    torch.manual_seed(0)
    m, x = ExpertStack(), torch.randn(4, 8, 16, requires_grad=True)
    ref = ExpertStack()
    ref.load_state_dict(m.state_dict())
    counters.clear()
    out = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0, strict=True, gemm_loops=False))(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert counters["inductor"][BATCH_BMM] >= 1

    gm = torch.fx.symbolic_trace(ref)
    without = {k: v for k, v in EGG_POST_GRAD.items() if k != BATCH_BMM}
    launches = [compile_inductor(gm, [x.detach()], training=True, config_patches=post_grad_patches(p),
                                 backward_config_patches=EGG_BACKWARD).launches.extern
                for p in (without, EGG_POST_GRAD)]
    assert launches[1] == launches[0] - 1, launches


class SplitLinear(nn.Module):
    """One linear over the two halves of its input: two [64, 64] @ [64, 64] GEMMs forward and
    two weight-gradient GEMMs backward, each pair of one shape (bench/differential.py --seed 40
    --train)."""

    def __init__(self, d=64):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)

    def forward(self, x):
        a, b = x.split(x.shape[0] // 2)
        return self.lin(a), self.lin(b)


def test_post_grad_gemm_batching_only_where_it_saves_a_launch():
    """Batched, SplitLinear's GEMM pairs need their operands stacked by code in phases that had
    none, and the weight gradient's sum after the bmm: 5 launches for a training step whose
    GEMMs apart launch 4. The backend's batchings try each batch on a copy of the graph and
    make it only where the fusion estimate falls (FEWER_LAUNCHES): 4, no batch, values and
    gradients as eager's; where a batch does save one (ExpertStack's weight gradients,
    test_backend_batches_the_weight_gradient_bmms_of_a_training_step) it is still made."""
    from torch._dynamo.utils import counters

    from optimus_egg.baselines import (EGG_BACKWARD, EGG_POST_GRAD, FEWER_LAUNCHES, SAME_DTYPE_BATCH_LINEAR,
                                       backend_patches, post_grad_patches)
    from optimus_egg.measure import compile_inductor

    torch.manual_seed(0)
    m, x = SplitLinear(), torch.randn(128, 64)
    gm = torch.fx.symbolic_trace(m)
    unchecked = {k: {**v, FEWER_LAUNCHES: False} for k, v in EGG_POST_GRAD.items()}
    apart = {k: v for k, v in EGG_POST_GRAD.items() if k != SAME_DTYPE_BATCH_LINEAR}
    launches, batches = {}, {}
    for name, passes in (("checked", EGG_POST_GRAD), ("unchecked", unchecked), ("apart", apart)):
        counters.clear()
        patches = {**backend_patches(gemm_loops=False), **post_grad_patches(passes)}
        launches[name] = compile_inductor(gm, [x], training=True, config_patches=patches,
                                          backward_config_patches=EGG_BACKWARD).launches.total
        batches[name] = counters["inductor"]["batch_linear_post_grad"]
    assert launches == {"checked": 4, "unchecked": 5, "apart": 4}, launches
    assert batches["unchecked"] == 2 and batches["checked"] == 0, batches

    ref = SplitLinear()
    ref.load_state_dict(m.state_dict())
    m.zero_grad()  # (compile_inductor's backward left gradients)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    out = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0, strict=True))(xs[0])
    expected = ref(xs[1])
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    sum(o.sum() for o in out).backward()
    sum(e.sum() for e in expected).backward()
    torch.testing.assert_close(m.lin.weight.grad, ref.lin.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["bmm", "mm"])
def test_post_grad_gemm_batching_stops_at_the_stacked_elements_limit(op):
    """Two independent GEMMs whose operands hold more than MAX_STACKED_PER_LAUNCH elements per
    launch a batch would save stay apart under the backend's options and are batched without
    the limit; two small ones are batched either way. Values are unchanged throughout."""
    from torch._inductor.fx_passes.group_batch_fusion import apply_group_batch_fusion
    from torch._inductor.pattern_matcher import stable_topological_sort
    from torch.fx.experimental.proxy_tensor import make_fx

    from optimus_egg.baselines import BATCH_BMM, MAX_STACKED_PER_LAUNCH, SAME_DTYPE_BATCH_LINEAR

    gemm = torch.bmm if op == "bmm" else torch.mm
    name = BATCH_BMM if op == "bmm" else SAME_DTYPE_BATCH_LINEAR

    def f(a, b, c, d):
        return gemm(a, b) + 1, gemm(torch.relu(c), d)

    def shape(side):  # each GEMM's two operands: 2 * side**2 (* 2 batches) elements
        return (2, side, side) if op == "bmm" else (side, side)

    big = int((MAX_STACKED_PER_LAUNCH / 2) ** 0.5) + 8  # over the limit, per GEMM already
    for side, gated, batched in [(big, True, False), (big, False, True), (8, True, True)]:
        torch.manual_seed(0)
        args = [torch.randn(shape(side)) for _ in range(4)]
        gm = make_fx(f, tracing_mode="fake")(*args)
        apply_group_batch_fusion(gm.graph, _post_grad_rule(name, gated))
        stable_topological_sort(gm.graph)  # as Inductor does after its post-grad passes
        gm.recompile()
        aten = torch.ops.aten  # torch's mm batching calls the overload packet aten.bmm
        gemms = [n for n in gm.graph.nodes if n.target in (aten.bmm, aten.bmm.default, aten.mm.default)]
        assert len(gemms) == (1 if batched else 2), (side, gated, gm.code)
        for got, want in zip(gm(*args), f(*args)):
            torch.testing.assert_close(got, want)


def test_a_second_compile_loads_from_inductors_and_aot_autograds_caches(tmp_path, monkeypatch, caplog):
    """As plain torch.compile: compiling a model again (another process, a reset Dynamo) loads
    its forward and backward from Inductor's FX graph cache and AOT autograd's cache instead
    of compiling them (each pass the backend adds has a uuid; optimus_egg's ops are marked
    cacheable by their source), with the values and gradients of the first compile."""
    import logging

    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m, x = Parallel(), torch.randn(8, 96)
    runs = []
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        m.zero_grad()
        with caplog.at_level(logging.INFO, logger="optimus_egg"):
            out = torch.compile(m, backend="optimus_egg")(x)
        out.sum().backward()
        runs.append((out.detach(), [p.grad.clone() for p in m.parameters()],
                     dict(counters["inductor"]), dict(counters["aot_autograd"])))
    assert "(changed" in caplog.text  # the graph was rewritten (batched linears and norms)
    (out1, grads1, inductor1, aot1), (out2, grads2, inductor2, aot2) = runs
    assert inductor1.get("fxgraph_cache_miss") == 2 and aot1.get("autograd_cache_saved") == 1
    assert inductor2.get("fxgraph_cache_hit") == 2 and aot2.get("autograd_cache_hit") == 1
    assert "fxgraph_cache_bypass" not in inductor1 and "autograd_cache_bypass" not in aot1
    torch.testing.assert_close(out2, out1)
    for g2, g1 in zip(grads2, grads1):
        torch.testing.assert_close(g2, g1)


def test_aot_autograd_finds_the_static_inputs_as_for_dynamos_graph(monkeypatch):
    """The optimized graph keeps what Dynamo recorded on its graph (optimize's
    keep_capture_metadata): AOT autograd tells the parameters apart as static inputs, which
    CUDA graphs keep in place, as it does for Dynamo's own graph; without it, none."""
    import torch._functorch.aot_autograd as aot
    from test_pipeline import _Heads  # (tests/ is on sys.path under pytest)

    found = []
    real = aot._try_get_metadata_from_dynamo

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        found.append(out[1])
        return out

    monkeypatch.setattr(aot, "_try_get_metadata_from_dynamo", recorded)
    x = torch.randn(4, 16)
    for backend in ("inductor", "optimus_egg"):
        torch._dynamo.reset()
        model = _Heads()
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
    plain, ours = found
    assert plain == ours == [1, 2, 3, 4]  # x is input 0; the four parameters are static
