"""Graphs optimized in parts (parts.py).

Grad mode, inference mode and autocast blocks: Dynamo records `with torch.no_grad():` as
`_set_grad_enabled` nodes. optimize() cuts such a graph into stretches of fixed state and
optimizes each alone; no rewrite may cross a change (a linear under no_grad batched with one
outside would get a gradient).

Checkpointed bodies: `torch.utils.checkpoint.checkpoint(fn, x)` is one call of a higher-order op
on fn's graph; that graph is optimized as one of its own.
"""
import contextlib
import operator
import warnings

import pytest
import torch
from torch import fx, nn
from torch.utils.checkpoint import checkpoint

import optimus_egg
from optimus_egg import parts
from optimus_egg.from_fx import Unsupported
from optimus_egg.parts import bodies, stretches

BLOCKS = {
    "no_grad": torch.no_grad,
    "set_grad_enabled": lambda: torch.set_grad_enabled(False),
    "inference_mode": torch.inference_mode,
}


class TwoBlocks(nn.Module):
    """Three linears inside a block and three outside, all reading x: one depth, one signature."""

    def __init__(self, block, d=8):
        super().__init__()
        self.block = block
        self.inside = nn.ModuleList(nn.Linear(d, d) for _ in range(3))
        self.outside = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        with self.block():
            a = [torch.tanh(lin(x)) for lin in self.inside]
        b = [torch.sigmoid(lin(x)) for lin in self.outside]
        return torch.cat([t.clone() for t in a] + b, 1)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)


def through_backend(model, *xs, **options):
    """Run `model` through torch.compile with optimize() as the backend (Inductor left out:
    the optimized FX graph runs as it is); returns the output and optimize's reports."""
    reports = []

    def backend(gm, example_inputs):
        out = optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True, **options)
        reports.append(out.meta["optimus_egg"])
        return out

    return torch.compile(model, backend=backend)(*xs), reports


def dynamo_graph(model, *xs) -> fx.GraphModule:
    """The graph Dynamo hands a backend for `model(*xs)` (a copy is compiled by Inductor, so
    that higher-order ops in it can run)."""
    from torch._inductor.compile_fx import compile_fx

    from optimus_egg.measure import copy_graph_module

    captured = []

    def grab(gm, example_inputs):
        captured.append(gm)
        return compile_fx(copy_graph_module(gm), example_inputs)

    torch.compile(model, backend=grab)(*xs)
    torch._dynamo.reset()
    return captured[0]


def twin(make):
    torch.manual_seed(0)
    m = make()
    ref = make()
    ref.load_state_dict(m.state_dict())
    return m, ref


def assert_same_grads(m, ref, none=(), **tol):
    """Every parameter's gradient is eager's (`ref`'s): None where eager's is None, as it must
    be for the names starting with `none`, else close."""
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        assert q.grad is None or not name.startswith(none), f"{name}: eager gives it a gradient"
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, msg=lambda s, n=name: f"{n}: {s}", **tol)


@pytest.mark.parametrize("block", list(BLOCKS))
def test_a_block_is_batched_apart_from_the_rest(block):
    m, ref = twin(lambda: TwoBlocks(BLOCKS[block]))
    x = torch.randn(4, 8)
    out, (report,) = through_backend(m, x)
    assert report.parts == 2 and report.changed
    assert report.matches["batch-linear-lhs"] == 6, report.matches  # both groups of three
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert_same_grads(m, ref, none="inside")  # computed without grad: batched with `outside`, they would get one


class SameCallTwice(TwoBlocks):
    """The same input-free call in both stretches (`triu_indices`, shared by every use within one
    graph): each stretch keeps its own, so no value crosses the change of state."""

    def forward(self, x):
        with self.block():
            a = [torch.tanh(lin(x)) for lin in self.inside]
            i = torch.triu_indices(8, 8)
            a = [t[:, i[1, :4]] for t in a]
        j = torch.triu_indices(8, 8)
        b = [torch.sigmoid(lin(x))[:, j[1, :4]] for lin in self.outside]
        return torch.cat(a + b, 1)


def test_an_input_free_call_in_two_stretches_is_not_shared():
    m, ref = twin(lambda: SameCallTwice(torch.no_grad))
    x = torch.randn(4, 8)
    out, (report,) = through_backend(m, x)
    assert report.parts == 2 and report.changed and report.matches["batch-linear-lhs"] == 6, report
    torch.testing.assert_close(out, ref(x))


class FeedsABlock(nn.Module):
    """Four linears on x: two only feed a no_grad block after them, two feed the output."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        ys = [lin(x) for lin in self.ls]
        with torch.no_grad():
            z = torch.tanh(ys[0] + ys[1])
        return z * ys[2] * ys[3]


def test_linears_that_only_feed_a_no_grad_block_batch_apart():
    """The first stretch's four linears are its outputs, but a gradient reaches only two of
    them (the others feed the no_grad block): two groups, and the first two keep no gradient."""
    report = trains_like_eager(FeedsABlock, torch.randn(4, 8), none=("ls.0.", "ls.1."))
    assert report.parts == 3 and report.groups.get("linear") == 2, report.groups  # 2 + 2, not 4


def trains_like_eager(make, x, none=()):
    """`make()` through the backend: outputs and gradients equal eager's, None for the names
    starting with `none`; returns optimize's report."""
    m, ref = twin(make)
    out, (report,) = through_backend(m, x)
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(m, ref, none=none)
    return report


class UnusedCheckpointResult(nn.Module):
    """A checkpointed body returns two results and only the first is read. Two linears feed the
    body's second result alone (eager: no gradient); two others feed its first."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        a, b, c, e = (lin(x[:, i]) for i, lin in enumerate(self.ls))
        used, _ = torch.utils.checkpoint.checkpoint(
            lambda p, q: (torch.relu(p), torch.relu(q)), a + c, b + e, use_reentrant=False)
        return used * 2


def test_linears_that_feed_only_an_unread_body_result_batch_apart():
    """The gradient walk goes through a body call result by result: the linears feeding the
    unread result form their own group and keep no gradient."""
    report = trains_like_eager(UnusedCheckpointResult, torch.randn(4, 4, 8), none=("ls.1.", "ls.3."))
    assert report.groups.get("linear") == 2, report.groups  # 2 + 2, not 4


class CatSplitUnderNoGrad(nn.Module):
    """Inside a no_grad block two linears' outputs are cat and split back. The pair cancels,
    so the block's results are its inputs: they must come out detached, as the block's own
    results would (ls.1 then gets no gradient, as in eager)."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(2))
        self.out = nn.Linear(d, d)

    def forward(self, x):
        a, b = (lin(x) for lin in self.ls)
        with torch.no_grad():
            p, q = torch.split(torch.cat([a, b], 1), 8, 1)
        return self.out(p + q) + a


@pytest.mark.parametrize("capture", ["dynamo", "export"])
def test_a_cat_and_split_that_cancel_in_a_no_grad_block_come_out_detached(capture):
    m, ref = twin(CatSplitUnderNoGrad)
    x = torch.randn(4, 8)
    if capture == "dynamo":
        out, (report,) = through_backend(m, x)
    else:  # the block is a body, run by wrap_with_set_grad_enabled(False, ...)
        gm = torch.export.export(m, (x,)).module()
        optimized = optimus_egg.optimize(gm, [x], 2.0, strict=True)
        report = optimized.meta["optimus_egg"]
        out = optimized(x)
    assert report.matches["cat-of-split-pieces"] + report.matches.get("split-piece-narrow", 0) > 0, report.matches
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(m, ref, none="ls.1.")


class SplitUnderNoGrad(nn.Module):
    """A split under no_grad and the cat of its pieces after it: they do not cancel (the cat of
    pieces computed without grad has none; x itself has one)."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(2))

    def forward(self, x):
        with torch.no_grad():
            pieces = torch.split(x, 8, 1)
        y = torch.cat(pieces, 1)
        return torch.cat([lin(y[:, 8 * i: 8 * i + 8]) for i, lin in enumerate(self.ls)], 1)


def test_optimizing_twice_sees_no_trace_of_the_parts():
    """The result carries none of the parts' meta, so optimizing it again starts afresh."""
    from optimus_egg.from_fx import GRAD_REACH, PART

    captured = []
    torch.compile(TwoBlocks(torch.no_grad), backend=lambda gm, ex: captured.append((gm, list(ex))) or gm)(
        torch.randn(4, 8))
    (gm, inputs), = captured
    once = optimus_egg.optimize(gm, inputs, 2.0, strict=True)
    assert once.meta["optimus_egg"].changed
    assert not any(PART in n.meta or GRAD_REACH in n.meta for n in once.graph.nodes)
    twice = optimus_egg.optimize(once, inputs, 2.0, strict=True)
    torch.testing.assert_close(twice(*inputs), gm(*inputs))


def test_a_split_and_cat_across_a_block_do_not_cancel():
    m, ref = twin(SplitUnderNoGrad)
    x = torch.randn(4, 16, requires_grad=True)
    out, (report,) = through_backend(m, x)
    assert report.parts == 2
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert x.grad is None  # as in eager: no gradient flows through the no_grad split
    expected.sum().backward()
    assert_same_grads(m, ref)


class WrittenAfterABlock(nn.Module):
    """x's pieces stacked and unbound again in a no_grad block, one of them written in place
    after it: eagerly the write goes into the stack, never into x."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        with torch.no_grad():
            a, b = torch.stack(x.unbind(1), 1).unbind(1)
            hs = [torch.tanh(lin(x[:, 1])) for lin in self.ls]
        a.copy_(b * 2)
        return a + x[:, 0], torch.cat(hs, 1)


def test_a_stack_whose_piece_a_later_part_writes_into_does_not_cancel():
    """The block's stack and unbind would cancel into views of x, and the write after the
    block would go into the input (and into the `x[:, 0]` read after it)."""
    torch.manual_seed(0)
    m = WrittenAfterABlock()
    x = torch.randn(4, 2, 8)
    expected = m(x.clone())
    given = x.clone()
    out, (report,) = through_backend(m, given)
    assert report.parts == 2 and report.matches["batch-linear-lhs"] == 3, report.matches  # the block's linears
    torch.testing.assert_close(given, x)
    torch.testing.assert_close(out, expected)


class Autocast(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(4))

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hs = [torch.tanh(lin(x)) for lin in self.ls]
        return torch.cat([norm(h.float()) for norm, h in zip(self.norms, hs)], 1)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_an_autocast_block_is_batched_in_bf16(training):
    m, ref = twin(Autocast)
    m.train(training)
    ref.train(training)
    x = torch.randn(8, 16)
    with torch.set_grad_enabled(training):
        out, (report,) = through_backend(m, x)
        expected = ref(x)
    assert report.parts == 2 and report.matches["batch-linear-lhs"] == 4, report.matches
    assert report.matches["batch-layernorm"] == 4, report.matches  # after the block, in fp32
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)  # bf16 GEMMs: one bmm vs four mm
    if training:
        out.sum().backward()
        expected.sum().backward()
        assert_same_grads(m, ref, rtol=5e-2, atol=5e-2)


def test_stretches_are_the_runs_between_state_changes():
    captured = []

    def grab(gm, example_inputs):
        captured.append(gm)
        return gm

    torch.compile(TwoBlocks(torch.no_grad), backend=grab)(torch.randn(4, 8))
    (gm,) = captured
    runs = stretches(gm)
    assert [len(r) for r in runs] == [6, 10]  # 3 x (linear, tanh); 3 x (linear, sigmoid), 3 clones, cat
    names = [n.name for n in gm.graph.nodes]
    for r in runs:  # contiguous in graph order
        assert [n.name for n in r] == names[names.index(r[0].name): names.index(r[-1].name) + 1]


def test_a_graph_without_meta_gets_its_stretch_inputs_by_fake_propagation():
    """A hand-made graph with a grad-mode change and no meta: the stretch after it reads a value
    from before it, whose example value is propagated (fake) through the whole graph."""
    torch.manual_seed(0)
    m = TwoBlocks(contextlib.nullcontext)
    gm = fx.symbolic_trace(m)
    first_inside = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "inside.0")
    first_outside = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "outside.0")
    with gm.graph.inserting_before(first_inside):
        gm.graph.call_function(torch._C._set_grad_enabled, (False,))
    with gm.graph.inserting_before(first_outside):
        gm.graph.call_function(torch._C._set_grad_enabled, (True,))
    gm.recompile()
    x = torch.randn(4, 8)
    grad_mode = torch.is_grad_enabled()
    out = optimus_egg.optimize(gm, [x], 2.0, strict=True)
    assert torch.is_grad_enabled() == grad_mode  # the fake run of the graph's own changes is undone
    report = out.meta["optimus_egg"]
    assert report.parts == 2 and report.matches["batch-linear-lhs"] == 6, report
    expected = gm(x)
    got = out(x)
    torch.testing.assert_close(got, expected)
    assert "_set_grad_enabled" in out.code


class Vmapped(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        per_row = torch.func.vmap(lambda r: torch.cat([lin(r) for lin in self.ls]))(x)
        return per_row + torch.cat([lin(x) for lin in self.ls], 1)


def test_a_vmap_traced_inline_is_left_alone_with_a_warning():
    captured = []

    def grab(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    torch.manual_seed(0)
    m = Vmapped()
    x = torch.randn(2, 4)
    torch.compile(m, backend=grab)(x)
    (gm, inputs), = captured
    with pytest.raises(Unsupported, match="functorch transform"):
        optimus_egg.optimize(gm, inputs, strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = optimus_egg.optimize(gm, inputs)
    assert any("functorch transform" in str(w.message) for w in caught)
    assert not out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), m(x) if isinstance(m(x), tuple) else (m(x),))


class Checkpointed(nn.Module):
    """Four parallel linears inside a checkpointed function, three more outside it."""

    def __init__(self, d=8):
        super().__init__()
        self.inside = nn.ModuleList(nn.Linear(d, d) for _ in range(4))
        self.outside = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def body(self, x):
        return torch.cat([torch.tanh(lin(x)) for lin in self.inside], 1)

    def forward(self, x):
        y = checkpoint(self.body, x, use_reentrant=False)
        return y.sum(1, keepdim=True) * torch.cat([lin(torch.relu(x)) for lin in self.outside], 1)


def test_a_checkpointed_body_is_optimized_as_a_graph_of_its_own():
    m, ref = twin(Checkpointed)
    x = torch.randn(4, 8)
    assert list(bodies(dynamo_graph(Checkpointed(), x))) == ["wrap_body_0"]
    out, (report,) = through_backend(m, x)
    assert report.parts == 2 and report.changed
    assert report.matches["batch-linear-lhs"] == 4 + 3, report.matches  # the body's four, the outer three
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(m, ref)


def test_a_checkpointed_model_trains_through_the_backend():
    m, ref = twin(Checkpointed)
    x = torch.randn(4, 8)
    out = torch.compile(m, backend=optimus_egg.backend(budget_s=2.0))(x)
    expected = ref(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert_same_grads(m, ref, rtol=1e-4, atol=1e-5)


class WritesAfterACheckpoint(nn.Module):
    """A checkpointed body returning a cat of x's pieces (and three linears' results), and a
    write after it into that result or into x: eagerly the cat is a copy that x and the
    result do not share."""

    def __init__(self, into: str, d=8):
        super().__init__()
        self.into = into
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def body(self, x):
        return torch.cat(torch.split(x, 4, 1), 1), torch.cat([torch.tanh(lin(x)) for lin in self.ls], 1)

    def forward(self, x):
        y, h = checkpoint(self.body, x, use_reentrant=False)
        (y if self.into == "result" else x).mul_(2)
        return y + x, h


@pytest.mark.parametrize("into", ["result", "operand"])
def test_a_checkpointed_result_a_write_may_reach_stays_a_copy(into):
    """The body's cat and split would cancel into x itself, which the write would then change."""
    torch.manual_seed(0)
    m = WritesAfterACheckpoint(into).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = m(x.clone())
        given = x.clone()
        out, (report,) = through_backend(m, given)
    assert report.parts == 2 and report.matches["batch-linear-lhs"] == 3, report.matches
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(given, x * 2 if into == "operand" else x)


@pytest.mark.parametrize("make", [lambda: TwoBlocks(torch.no_grad), Checkpointed], ids=["no_grad", "checkpoint"])
def test_parts_with_a_symbolic_batch(make):
    """dynamic=True: the parts' example values have a symbolic batch; the result holds at every size."""
    m, ref = twin(make)
    reports = []

    def backend(gm, example_inputs):
        out = optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True)
        reports.append(out.meta["optimus_egg"])
        return out

    compiled = torch.compile(m, backend=backend, dynamic=True)
    for b in (4, 7, 2):
        x = torch.randn(b, 8)
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        assert_same_grads(m, ref)
    (report,) = reports  # one capture serves every batch size
    assert report.parts == 2 and report.changed and report.matches["batch-linear-lhs"] >= 6, report


@pytest.mark.parametrize("make", [lambda: TwoBlocks(torch.no_grad), Autocast], ids=["no_grad", "autocast"])
def test_export_puts_a_block_in_a_body_which_is_optimized_alone(make):
    """torch.export turns the block into `wrap_with_set_grad_enabled` / `wrap_with_autocast`
    on a body graph; the body and the rest are each batched."""
    m, ref = twin(make)
    x = torch.randn(4, 16 if make is Autocast else 8)
    gm = torch.export.export(m, (x,)).module()
    (name,) = bodies(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # copying export's module for the new body warns of nothing
        out = optimus_egg.optimize(gm, [x], 2.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.parts == 2 and report.changed, report
    assert report.matches["batch-linear-lhs"] == (4 if make is Autocast else 6), report.matches
    assert getattr(out, name) is not getattr(gm, name)
    torch.testing.assert_close(out(x), ref(x), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gm(x), ref(x), rtol=2e-2, atol=2e-2)  # the input module is untouched


class SharedAcrossABlock(nn.Module):
    """The same three linears on x (under no_grad, by hand below) and on y."""

    def __init__(self, d=8):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x, y):
        return torch.cat([lin(x) for lin in self.ls] + [lin(y) for lin in self.ls], 1)


def test_a_weight_two_parts_would_share_is_refused_with_a_warning():
    """A hand-built graph reading the linears' weights by get_attr on both sides of a grad-mode
    change: each part batches them, and the weights' cat would be one value computed under
    no_grad and read with grad. The split-back check refuses it; the input comes back."""
    gm = fx.symbolic_trace(SharedAcrossABlock())
    linears = [n for n in gm.graph.nodes if n.op == "call_module"]
    with gm.graph.inserting_before(linears[0]):
        gm.graph.call_function(torch._C._set_grad_enabled, (False,))
    with gm.graph.inserting_before(linears[3]):
        gm.graph.call_function(torch._C._set_grad_enabled, (True,))
    gm.recompile()
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="reads cat"):
        out = optimus_egg.optimize(gm, [x, y], 2.0)
    assert not out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(x, y), gm(x, y))


class Branches(nn.Module):
    """torch.cond on the sign of x's sum: each branch runs three linears on x (a lhs group in
    each branch), returning their results apart (`outs` = 3) or summed (1)."""

    def __init__(self, outs=3, d=8):
        super().__init__()
        self.outs = outs
        self.ls = nn.ModuleList(nn.Linear(d, 4 * (i + 1)) for i in range(3))
        self.ms = nn.ModuleList(nn.Linear(d, 4 * (i + 1)) for i in range(3))

    def forward(self, x):
        def results(r):
            return tuple(r) if self.outs > 1 else (sum(o.sum(1) for o in r),)

        def pos(x):
            return results(lin(x) for lin in self.ls)

        def neg(x):
            return results(torch.tanh(m(x)) for m in self.ms)

        out = torch.cond(x.sum() > 0, pos, neg, (x,))
        return sum(o.sum(-1) if o.dim() > 1 else o for o in out)


@pytest.mark.parametrize("outs", [1, 3])
def test_cond_branches_are_optimized_as_bodies_in_inference(outs):
    """Each branch is a part; a branch result the rewrite made a view (a split piece of the wide
    GEMM's output) is cloned, as torch.cond admits no result aliasing another. Inductor
    compiles the rebuilt branches (the backend, strict) and both branches give eager's values."""
    m, ref = twin(lambda: Branches(outs))
    captured, compiled = [], optimus_egg.backend(budget_s=2.0, strict=True)

    def backend(gm, example_inputs):
        out = optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True)
        captured.append(out)
        return compiled(gm, example_inputs)

    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        for sign in (1, -1):
            x = torch.randn(4, 8).abs() * sign
            torch.testing.assert_close(fn(x), ref(x), rtol=1e-4, atol=1e-5)
    (out,) = captured
    report = out.meta["optimus_egg"]
    assert report.parts == 3 and report.changed, report  # the outer graph and two branches
    assert report.matches["batch-linear-lhs"] == 6, report.matches  # a group of three per branch
    for name in ("cond_true_0", "cond_false_0"):
        returned = next(n for n in getattr(out, name).graph.nodes if n.op == "output").args[0]
        assert len(returned) == outs
        assert all(r.target is torch.mul for r in returned) == (outs == 3), name  # a computed copy
        assert sum(n.target is torch._C._nn.linear for n in getattr(out, name).graph.nodes) == 1


def test_cond_branches_a_gradient_needs_stay_as_they_are():
    """In training the branches' gradients would be views of one concatenated weight's, which
    torch.cond's backward rejects: the branches are left alone and train as eagerly."""
    report = trains_like_eager(lambda: Branches(1), torch.randn(4, 8))
    assert not report.changed, report  # (the outer graph alone is a part, with nothing to batch)


def test_export_cond_branches_are_optimized():
    m, ref = twin(lambda: Branches(3))
    x = torch.randn(4, 8)
    gm = torch.export.export(m, (x,)).module()
    out = optimus_egg.optimize(gm, [x], 2.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.changed and report.matches["batch-linear-lhs"] == 6, report
    for sign in (1, -1):
        torch.testing.assert_close(out(x.abs() * sign), ref(x.abs() * sign), rtol=1e-4, atol=1e-5)


@torch.compiler.nested_compile_region
def _tanh_both(a, b):
    return torch.tanh(a) * 3.0, torch.tanh(b) * 3.0


@torch.compiler.nested_compile_region
def _mul_add(a, b):
    return a * b + a


class PiecesOut(nn.Module):
    """Two tanh'd (or sigmoid'd) inputs returned apart, by each branch of a torch.cond or by a
    body that two calls share (`nested_compile_region`): batch-pointwise makes them pieces of
    one stacked result, views at offsets into one buffer of the body."""

    def __init__(self, shared: bool):
        super().__init__()
        self.shared = shared

    def forward(self, a, b):
        if self.shared:
            y, z = _tanh_both(a, b)
            y2, z2 = _tanh_both(b, a)
            return y + 2 * z + 5 * y2 + 7 * z2
        y, z = torch.cond(a.sum() > 0, lambda a, b: (torch.tanh(a) * 3.0, torch.tanh(b) * 3.0),
                          lambda a, b: (torch.sigmoid(a) * 2.0, torch.sigmoid(b) * 2.0), (a, b))
        return y + 2 * z


def _optimized_through_the_backend(m: nn.Module, calls: list[tuple], dynamic: bool = False) -> fx.GraphModule:
    """Call `m` on each argument tuple through the backend (strict, 2 s) in inference, checking
    eager's values; returns the one graph optimize() made of Dynamo's."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True))
        return optimus_egg.backend(budget_s=2.0, strict=True)(gm, example_inputs)

    fn = torch.compile(m, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for args in calls:
            torch.testing.assert_close(fn(*args), m(*args))
    (out,) = graphs
    return out


def _both_signs_through_the_backend(m: nn.Module) -> fx.GraphModule:
    """Run `m(a, b)` through the backend (strict) in inference with a's sum of either sign (both
    cond branches), checking eager's values; returns optimize()'s graph, batch-pointwise fired."""
    out = _optimized_through_the_backend(m, [(torch.randn(2, 4).abs() * sign, torch.randn(2, 4)) for sign in (1, -1)])
    report = out.meta["optimus_egg"]
    assert report.changed and report.matches["batch-pointwise"] > 0, report
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["cond", "invoke_subgraph"])
def test_a_body_returning_pieces_of_one_buffer_compiles_to_eager_values(shared):
    """torch 2.13's Inductor drops a clone as a no-op and then compiles a cond branch or an
    invoke_subgraph body that returns pieces of one of its buffers (at offsets) to wrong values;
    the rebuilt body returns each such piece multiplied by one, a buffer of its own. Through the
    backend (strict, every default) both branches / both calls give eager's values."""
    out = _both_signs_through_the_backend(PiecesOut(shared))
    for name in [n for n, _ in out.named_children()]:
        returned = next(n for n in getattr(out, name).graph.nodes if n.op == "output").args[0]
        assert all(r.target is torch.mul and r.args[1] == 1 for r in returned), (name, returned)


def _scaled_branch(sign: float):
    def branch(a, b, c):
        x, y, z = a * sign, b * sign, c * sign
        q = y.clone()
        q[:, :2].mul_(-2.0)
        return x + y.mean(0, keepdim=True), q, z + x.mean(0, keepdim=True)
    return branch


class ClonedPiece(nn.Module):
    """A cond whose branches scale three inputs (batch-pointwise makes them pieces of one
    stacked result) and return a clone of one, written into after: the rebuilt branch returns
    a clone of a piece, which Inductor drops as a no-op."""

    def forward(self, a, b, c):
        return torch.cond(a.sum() > 0, _scaled_branch(1.0), _scaled_branch(-1.0), (a, b, c))


def test_a_branch_returning_a_clone_of_a_piece_compiles_to_eager_values():
    """The dropped clone left the branch returning a piece at an offset, which Inductor refused
    to merge with the other branch's result ("expected same storage_offset"; before: strict
    raised). A clone of a view counts as a view: the branch returns it multiplied by one,
    computed after the write into it; both branches give eager's values."""
    out = _optimized_through_the_backend(
        ClonedPiece(), [(torch.randn(4, 3).abs() * sign, torch.randn(4, 3), torch.randn(4, 3)) for sign in (1, -1)])
    assert out.meta["optimus_egg"].matches["batch-pointwise"] > 0, out.meta["optimus_egg"]
    for name in ("cond_true_0", "cond_false_0"):
        body = getattr(out, name).graph
        returned = body.output_node().args[0][1]
        assert returned.target is torch.mul and returned.args[0].target == "clone", body
        assert list(body.nodes).index(returned) > max(list(body.nodes).index(n) for n in body.nodes if n.target == "mul_")


class PiecesIn(nn.Module):
    """Two tanh'd inputs, batched by batch-pointwise into pieces of one stacked result, passed to
    each branch of a torch.cond or to a body two calls share."""

    def __init__(self, shared: bool):
        super().__init__()
        self.shared = shared

    def forward(self, a, b):
        ta, tb = torch.tanh(a), torch.tanh(b)
        if self.shared:
            return _mul_add(ta, tb) + 2 * _mul_add(tb, ta)
        return torch.cond(a.sum() > 0, lambda a, b: a * b + a, lambda a, b: a - b, (ta, tb))


@pytest.mark.parametrize("shared", [False, True], ids=["cond", "invoke_subgraph"])
def test_a_body_given_pieces_of_one_buffer_compiles_to_eager_values(shared):
    """A body's inputs may not alias each other (torch.cond raises when traced again), and a
    piece of the batched tanh is strided unlike the input the body was traced with: every view
    is passed as a row-major copy. Through the backend (strict) both branches / both calls give
    eager's values."""
    out = _both_signs_through_the_backend(PiecesIn(shared))
    calls = [n for n in out.graph.nodes if n.target in (torch.ops.higher_order.cond, torch.ops.higher_order.invoke_subgraph)]
    assert calls
    for call in calls:  # (every view passed to a body is copied: the layouts it was traced with)
        operands = call.args[3] if call.target is torch.ops.higher_order.cond else call.args[2:]
        assert all(_copied_like(a) for a in operands), call.args


class StridedIn(nn.Module):
    """Two calls of one shared body on tanh'd halves of a (1, 6) input: the first passes clones
    (row-major), the second halves scaled. Batch-pointwise makes the tanh one op on the whole
    input, so the first call's clones become clones of its pieces, strided (6, 1), and the
    second call's operands pieces of one scaled buffer."""

    def forward(self, x):
        a, b = torch.split(x, 3, dim=1)
        p, q = torch.tanh(a), torch.tanh(b)
        return _mul_add(p.clone(), q.clone()) + _mul_add(p * 0.5, q * 0.5)


def test_a_shared_body_given_operands_strided_apart_compiles_to_eager_values():
    """Inductor compiles one body for all calls and asserts their inputs' strides agree
    ("subgraph args must have consistent values"; before: strict raised on StridedIn). Where the
    rewritten calls' operands differ in strides, or one is a view, every call passes a row-major
    copy: the layouts agree and the values are eager's."""
    out = _optimized_through_the_backend(StridedIn(), [(torch.randn(1, 6),)])
    assert out.meta["optimus_egg"].matches["batch-pointwise"] > 0, out.meta["optimus_egg"]
    calls = [n for n in out.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 2
    for call in calls:
        assert all(_copied_like(a) for a in call.args[2:]), call.args


class ChunkStack(nn.Module):
    """Two calls of one shared body on the first and last of four chunks, stacked and unbound:
    unbind-of-stack makes the last piece the last chunk itself, whose symbolic size
    (s - 3 * ((s + 3) // 4)) is another expression than the first chunk's ((s + 3) // 4),
    equal only under Dynamo's guard."""

    def forward(self, x):
        u = torch.unbind(torch.stack(torch.chunk(x, 4, 1), 1), 1)
        return _mul_add(u[0].clone(), u[3].clone()) + _mul_add(u[0] * 0.5, u[3] * 0.5)


def test_a_shared_body_given_operands_sized_by_other_expressions_compiles_to_eager_values():
    """With every size symbolic, Inductor's check compares the calls' sizes as expressions
    (before: strict raised on ChunkStack). The operands are compared by fake values propagated
    in Dynamo's own fake mode, and each call passes a copy sized as the first call's operand
    (a reshape to those sizes is traced as a no-op); values at two batch sizes are eager's."""
    out = _optimized_through_the_backend(ChunkStack(), [(torch.randn(b, 16),) for b in (3, 5)], dynamic=True)
    assert out.meta["optimus_egg"].matches["unbind-of-stack"] > 0, out.meta["optimus_egg"]
    calls = [n for n in out.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == 2
    firsts = {a.args[0].args[0] for c in calls for a in c.args[2:] if isinstance(a, fx.Node) and _copied_like(a)}
    assert len(firsts) == 2, calls  # (each position's copies are all sized like the first call's operand)


@torch.compiler.nested_compile_region
def _doubled_in_place(a, b):
    a.mul_(2)
    return a * b + a


class WritesItsInput(nn.Module):
    """StridedIn with a body that doubles its first input in place, a write the caller reads
    after the calls."""

    def forward(self, x):
        a, b = torch.split(x, 3, dim=1)
        p, q = torch.tanh(a), torch.tanh(b)
        p1, q1, p2, q2 = p.clone(), q.clone(), p * 0.5, q * 0.5
        return _doubled_in_place(p1, q1) + _doubled_in_place(p2, q2) + p1 + p2


def test_a_graph_calling_a_body_that_writes_into_its_inputs_stays_as_it_is():
    """Dynamo traces a shared body that writes into its input; the rewrites see a body call as
    a reader, and the copy a call's operand would get (before: a batched piece, and a layout
    the calls must share) would take the write, so the caller read the undoubled value. Such a
    graph stays as it is (parts.writes_a_body_input), and the backend computes eager's values."""
    x = torch.randn(1, 6)
    out = _optimized_through_the_backend(WritesItsInput(), [(x,)])
    assert "writes into its inputs" in out.meta["optimus_egg"].kept_input, out.meta["optimus_egg"]
    assert parts.writes_a_body_input(out) and not parts.writes_a_body_input(_traced_with_body(StridedIn(), x))


def _traced_with_body(m: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    """Dynamo's graph of `m` on `x`."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(m, backend=keep)(x)
    return graphs[0]


def _copied_like(a: fx.Node) -> bool:
    """Is `a` a copy into a new row-major tensor (`empty_like(...).copy_(x * 1)`)?"""
    return (a.target == "copy_" and a.args[0].target is torch.empty_like
            and a.args[0].kwargs == {"memory_format": torch.contiguous_format})


class Region(nn.Module):
    """Four linears on x, tanh'd, summed, plus x, normed: one body (`nested_compile_region`)
    that repeated layers share."""

    def __init__(self, d=8, two=False):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))
        self.norm = nn.LayerNorm(d)
        self.two = two

    @torch.compiler.nested_compile_region
    def forward(self, x):
        ys = [torch.tanh(lin(x)) for lin in self.ls]
        return (ys[0] + ys[1], ys[2] * ys[3]) if self.two else self.norm(x + sum(ys))


class Layers(nn.Module):
    """Three Region layers in a row. With `two`, each layer's second result feeds only a side
    sum, which the last layer does not add to (so its call's second result is unread)."""

    def __init__(self, two=False):
        super().__init__()
        self.two = two
        self.layers = nn.ModuleList(Region(two=two) for _ in range(3))

    def forward(self, x):
        side = 0
        for i, layer in enumerate(self.layers):
            if not self.two:
                x = layer(x)
                continue
            x, s = layer(x)
            side = side + s if i < 2 else side
        return x + side if self.two else x


def through_inductor(model, x, buffer_reuse=True):
    """Run `model` through torch.compile with the optimus_egg backend (strict): a Dynamo graph
    with invoke_subgraph runs only compiled. Returns the output and optimize()'s results (on
    the same graph, with `buffer_reuse`)."""
    results, real = [], optimus_egg.backend(budget_s=2.0, strict=True)

    def backend(gm, example_inputs):
        results.append(optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True, buffer_reuse=buffer_reuse))
        return real(gm, example_inputs)

    return torch.compile(model, backend=backend)(x), results


def linears(gm: fx.GraphModule) -> int:
    return sum(n.target is torch._C._nn.linear for n in gm.graph.nodes)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_a_body_layers_share_is_optimized_once(training):
    """Dynamo traces the first layer inline here and runs the other two through one shared
    body (invoke_subgraph): in inference that body is a part, batched once for both calls; in
    training, where its results need a gradient, too, where the graph is compiled without
    Inductor's buffer reuse (as the backend compiles it), else the graph is left as it is;
    either way it trains as eagerly."""
    m, ref = twin(Layers)
    x = torch.randn(4, 8)
    captured = dynamo_graph(Layers(), x)
    ((name, calls),) = bodies(captured).items()
    assert len(calls) == 2 and all(c.target is torch.ops.higher_order.invoke_subgraph for c in calls)
    with torch.set_grad_enabled(training):
        out, (result,) = through_inductor(m, x, buffer_reuse=not training)
        expected = ref(x)
    report = result.meta["optimus_egg"]
    assert (report.parts, report.changed, report.kept_input) == (2, True, None), report
    assert linears(result) == (1 if training else 0)  # (in training the first layer is inline: its four, one)
    (shared,) = bodies(result)  # (its name may differ from the first capture's)
    assert linears(getattr(captured, name)) == 4 and linears(getattr(result, shared)) == 1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    if training:
        kept = optimus_egg.optimize(captured, [x, *Layers().parameters()], 2.0, strict=True, training=True)
        assert not kept.meta["optimus_egg"].changed and "buffer_reuse" in kept.meta["optimus_egg"].kept_input
        out.sum().backward()
        expected.sum().backward()
        assert_same_grads(m, ref, rtol=1e-4, atol=1e-5)


def test_a_shared_body_whose_calls_read_different_results_trains_as_plain_torch_compile():
    """The last layer's second result is unread. Eagerly the linears feeding only it get no
    gradient; through invoke_subgraph plain torch.compile gives them zeros (its backward runs
    the whole body), and so does the backend, which optimizes the graph, the body included."""
    m, ref = twin(lambda: Layers(two=True))
    plain = Layers(two=True)
    plain.load_state_dict(m.state_dict())
    x = torch.randn(4, 8)
    out, (result,) = through_inductor(m, x, buffer_reuse=False)
    assert result.meta["optimus_egg"].changed and linears(result) == 1, result.meta["optimus_egg"]
    expected = torch.compile(plain)(x)
    torch.testing.assert_close(out, ref(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    expected.sum().backward()
    assert plain.layers[2].ls[3].weight.grad is not None  # (eagerly: None)
    assert_same_grads(m, plain, rtol=1e-4, atol=1e-5)


# A random program (the fuzz tests' Program, seed 574): five linears of one input piece, an
# attention, products of stacked pieces, and a shared body called on clones of them and on halves.
AROUND_A_SHARED_BODY = {
    "n": 5, "d": 4, "b": 1, "steps": (("fanout", 4, True, [0, 1, 2, 3, 4]), ("binary_batch", "add", 0, [2, 4], 0),
                                      ("attend", 2, "at", "chain", [1, 3]), ("stack_binary", "mul", 0, "reversed", [0, 4]),
                                      ("binary_batch", "mul", 0, [0, 1, 2, 3, 4], 4)),
    "split": "split", "out": "tuple", "tap": None, "block": (4, 3, "shared"), "special": False,
    "dtype": torch.float32, "seed": 574}


def test_a_graph_calling_a_trained_shared_body_trains_without_buffer_reuse():
    """Rewritten around and inside its two calls of a shared body, this graph trains to eager's
    gradients where Inductor compiles it without buffer reuse (baselines.SHARED_BODY_TRAINING),
    as the backend does. (Rewritten only around the calls, it trained with torch 2.13's buffer
    reuse to wrong gradients for three linears: bench/HISTORY.md.)"""
    from test_fuzz import Program, _assert_same_training, _trained, make_input
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    from optimus_egg.baselines import SHARED_BODY_TRAINING

    prog = AROUND_A_SHARED_BODY
    model = Program(prog).to(prog["dtype"]).eval()
    x = make_input(prog)
    expected = _trained(model, x, None)
    results = []

    def optimized_then_inductor(gm, example_inputs):
        results.append(optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True, buffer_reuse=False))
        return compile_fx(results[-1], example_inputs, config_patches=SHARED_BODY_TRAINING)

    with config.patch(force_disable_caches=True, fx_graph_cache=False):
        _assert_same_training(_trained(model, x, optimized_then_inductor), expected)
        _assert_same_training(_trained(model, x, optimus_egg.backend(budget_s=2.0, strict=True)), expected)
    (result,) = results
    report = result.meta["optimus_egg"]
    assert report.changed and report.parts == 2, report  # the graph around the calls, and the body
    (shared,) = bodies(result)
    products = [n for n in getattr(result, shared).graph.nodes if n.target in (torch.mul, operator.mul)
                and all(isinstance(a, fx.Node) for a in n.args)]
    assert len(products) == 1, getattr(result, shared).code  # the body's five products of two inputs, batched


class GradAndNot(nn.Module):
    """A shared body given one value that needs a gradient (a linear's) and one that does not
    (of the input alone)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def region(self, a, b):
        return torch.tanh(a), torch.tanh(b)

    def forward(self, x):
        a, b = self.region(self.lin(x), x * 2)
        c, d = self.region(a * 0.5, b * 0.5)
        return c + d


class CutOff(GradAndNot):
    """The shared body given a piece of a stack of a value needing a gradient and one needing
    none, which a cancellation makes the second value itself."""

    def forward(self, x):
        p = torch.stack([self.lin(x), x * 2]).unbind(0)
        a, b = self.region(p[0].clone(), p[1].clone())
        q = torch.stack([a * 0.5, b.sin()]).unbind(0)
        c, d = self.region(q[0].clone(), q[1].clone())
        return c + d


def _trained_through_the_backend(make, x):
    """optimize()'s result on Dynamo's graph for one training step of `make()` through the
    backend, whose output and gradients are checked against eager's."""
    m, ref = twin(make)
    out, (result,) = through_inductor(m, x, buffer_reuse=False)
    expected = ref(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    assert_same_grads(m, ref, rtol=1e-5, atol=1e-6)
    return result


def _detaches(gm: fx.GraphModule) -> int:
    return sum(n.target == "detach" for n in gm.graph.nodes)


def test_values_needing_no_gradient_stay_so_for_a_trained_shared_body():
    """The body's two tanhs are batched into one, whose second piece would then need a
    gradient, and so are the products the second call is given: AOT autograd refused to
    train the calls ("outs_to_grad length (2) != tangents length (1)", at the backward here;
    fuzz example seed 18750) until that result and that operand were detached. (Plain
    torch.compile trains this model to other weight gradients than eager's: torch 2.13.)"""
    result = _trained_through_the_backend(GradAndNot, torch.randn(4, 8))
    (shared,) = bodies(result)
    body = getattr(result, shared)
    assert sum(n.target is torch.tanh for n in body.graph.nodes) == 1 and _detaches(body) == 1, body.code
    assert _detaches(result) == 1, result.code


def test_a_trained_shared_body_given_an_operand_cut_off_its_gradient_trains():
    """A cancellation gives the body's first call, for its second operand, a value needing no
    gradient where the body was traced with one needing it: AOT autograd traces the backward
    with that operand and counts its tangents alike, so nothing is detached."""
    result = _trained_through_the_backend(CutOff, torch.randn(4, 8))
    assert not any(n.target is torch.stack for n in result.graph.nodes) and _detaches(result) == 0, result.code


def test_optimizing_a_graph_calling_a_trained_shared_body_leaves_no_trace_in_dynamo():
    """optimize() runs the graph on fake values; run inside Dynamo's tracing context, an
    invoke_subgraph call kept its (candidate) body there by its identifier, and AOT autograd
    then compiled that body for the graph Dynamo gave the backend: here, the rewritten body's
    batched linears where the input graph has Region's four (28 launches instead of 50;
    bench/regions.py --train counted 37 so instead of 12). The input graph compiles alike with
    or without an optimize call before."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code

    from optimus_egg.measure import Launches, count_launches

    def launches(first_optimize: bool) -> Launches:
        torch.manual_seed(0)
        model, x = Layers(), torch.randn(4, 8)
        optimized = []

        def backend(gm, example_inputs):
            if first_optimize:
                optimized.append(optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True, buffer_reuse=False))
            return compile_fx(gm, example_inputs)

        def step():
            torch._dynamo.reset()
            torch.compile(model, backend=backend)(x).sum().backward()

        _, codes = run_and_get_code(step)
        assert not first_optimize or optimized[0].meta["optimus_egg"].changed
        return sum((count_launches(c) for c in codes), Launches())

    from torch._inductor import config

    with config.patch(force_disable_caches=True, fx_graph_cache=False):  # (no compile reused)
        alone = launches(False)
        assert launches(True) == alone


def test_only_tensor_operands_that_are_views_are_copied():
    """parts._unaliased_operands on a hand-built cond call: two pieces of one unbind (views) and
    the tensor they view (an alias of them) are each passed as a row-major copy
    (`empty_like(p).copy_(p * 1)`, inserted before the call), a size read twice from one tensor (no
    tensor: nothing to alias) passes as it is; the rebuilt graph computes the same values."""
    from optimus_egg.parts import _unaliased_operands

    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.randn(2, 3)
    pieces = g.call_function(torch.unbind, (x, 0))
    p0, p1 = (g.call_function(operator.getitem, (pieces, i)) for i in range(2))
    sizes = [g.call_function(torch.ops.aten.sym_size.int, (x, 1)) for _ in range(2)]
    for i, p in enumerate((p0, p1)):
        p.meta["val"] = x.meta["val"][i]
    for s in sizes:
        s.meta["val"] = 3
    call = g.call_function(torch.ops.higher_order.cond, (True, None, None, (p0, p1, *sizes, x)))
    g.output(call)
    _unaliased_operands(g)
    operands = call.args[3]
    assert operands[2:4] == tuple(sizes)
    for a, p in zip(operands[:2] + operands[4:], (p0, p1, x)):
        assert _copied_like(a) and a.args[1].args == (p, 1) and a.args[0].args == (p,), a
        assert list(g.nodes).index(a) < list(g.nodes).index(call)
    g2, env = fx.Graph(), {}
    for n in g.nodes:  # the operands alone, computed
        if n.op == "output":
            g2.output(tuple(env[a] for a in operands))
        elif n is not call:
            env[n] = g2.node_copy(n, lambda a: env[a])
    t = torch.randn(2, 3)
    out = fx.GraphModule({}, g2)(t)
    torch.testing.assert_close(out[:2] + out[4:], (t[0], t[1], t))
    assert out[2:4] == (3, 3)
