"""optimize(): round trip with no rules, the report, bad input, budget 0 and fallbacks."""
import copy
import math
import os
import warnings

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import optimus_egg
from optimus_egg import bench, ops
from optimus_egg.models import build
from optimus_egg.rules import SCHEDULE_ORDER
from optimus_egg.testing import calls


@pytest.fixture(scope="module")
def mlp():
    model, inputs = build("parallel_mlp")
    model.eval()
    return fx.symbolic_trace(model), list(inputs)


@pytest.fixture(scope="module")
def optimized(mlp):
    gm, inputs = mlp
    return optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)


def test_roundtrip_without_rules_is_equivalent(mlp):
    gm, inputs = mlp
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True, disable=list(SCHEDULE_ORDER))
    out.graph.lint()
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)
    assert out.meta["optimus_egg"].stop_reason == "saturated"


def test_optimize_batches_the_parallel_mlp(mlp, optimized):
    gm, inputs = mlp
    torch.testing.assert_close(optimized(*inputs), gm(*inputs))
    report = optimized.meta["optimus_egg"]
    assert report.changed and report.cost_after < report.cost_before
    assert calls(optimized, ops.batched_linear) == 1 and calls(optimized, nn.Linear) == 0
    assert calls(optimized, ops.batched_layer_norm) == 1


def test_report_fields_and_str(optimized):
    report = optimized.meta["optimus_egg"]
    assert report.matches["batch-linear"] >= 8
    assert report.stop_reason in {"saturated", "budget", "node_limit", "iter_limit"}
    assert report.iterations >= 1 and report.egraph_nodes > 0 and report.egraph_classes > 0
    assert {"from_fx", "saturate", "extract", "to_fx", "total"} <= set(report.timings)
    text = str(report)
    assert "batch-linear" in text and "stopped by" in text


def test_optimize_logs_its_report_at_info(mlp, caplog):
    """The report also goes to the "optimus_egg" logger: how a torch.compile user sees it."""
    import logging

    gm, inputs = mlp
    with caplog.at_level(logging.INFO, logger="optimus_egg"):
        out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    (record,) = [r for r in caplog.records if r.name.startswith("optimus_egg")]
    assert record.levelno == logging.INFO
    assert f"graph of {len(gm.graph.nodes)} FX nodes" in record.getMessage()
    assert str(out.meta["optimus_egg"]) in record.getMessage()


def test_the_fusion_estimate_keeps_the_input_when_it_predicts_more_launches(mlp, monkeypatch):
    """optimize()'s last check: an estimate (stubbed here) that predicts more launches for the
    result than for the input keeps the input, and the report says why."""
    from optimus_egg import pipeline

    gm, inputs = mlp
    monkeypatch.setattr(pipeline, "fused_launches", lambda g, *a, **k: 3 if g is gm else 4)
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.matches.get("batch-linear", 0) > 0 and not report.changed
    assert report.kept_input == "the fusion estimate predicts 4 launches for the result, 3 for the input"
    assert report.fallback is None and calls(out, ops.batched_linear) == 0
    assert "kept the input: the fusion estimate" in str(report)
    assert bench._report_fields(report)["stop_reason"].endswith("(kept the input)")
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_input_graph_is_not_modified(mlp):
    gm, inputs = mlp
    before = gm.code
    optimus_egg.optimize(gm, inputs, budget_s=1.0)
    assert gm.code == before


def test_budget_zero_returns_equivalent_graph(mlp):
    gm, inputs = mlp
    out = optimus_egg.optimize(gm, inputs, budget_s=0)
    assert out is not gm and out.meta["optimus_egg"].iterations == 0
    assert not out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_budget_spent_before_the_search_forks_no_worker(mlp, monkeypatch):
    """A budget smaller than the time to prepare the search: the input's equivalent comes
    back priced, without forking a worker that could only be killed."""
    from optimus_egg import pipeline, worker

    def no_fork(*a, **k):
        raise AssertionError("a worker was forked")

    monkeypatch.setattr(worker, "Worker", no_fork)
    monkeypatch.setattr(pipeline, "FIRST_ITERATION_S_PER_NODE", 0.0)  # lower it, whatever the budget
    gm, inputs = mlp
    out = optimus_egg.optimize(gm, inputs, budget_s=1e-9, strict=True)
    report = out.meta["optimus_egg"]
    assert report.iterations == 0 and report.stop_reason == "budget" and not report.changed
    assert report.cost_before > 0
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_budget_below_one_iteration_is_not_lowered(mlp, monkeypatch):
    """A budget below FIRST_ITERATION_S_PER_NODE per FX node cannot pay for one search
    iteration: the input's equivalent comes back without lowering (so unpriced)."""
    from optimus_egg import pipeline

    def no_lowering(*a, **k):
        raise AssertionError("lowered")

    monkeypatch.setattr(pipeline, "from_fx", no_lowering)
    gm, inputs = mlp
    budget = 0.5 * pipeline.FIRST_ITERATION_S_PER_NODE * len(gm.graph.nodes)
    out = optimus_egg.optimize(gm, inputs, budget_s=budget, strict=True)
    report = out.meta["optimus_egg"]
    assert out is not gm and report.stop_reason == "budget" and not report.changed
    assert math.isnan(report.cost_before) and "from_fx" not in report.timings
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_not_a_graph_module_is_a_type_error():
    with pytest.raises(TypeError, match="GraphModule.*Linear"):
        optimus_egg.optimize(nn.Linear(2, 2), [torch.randn(1, 2)])


def test_an_exported_program_is_a_type_error_naming_its_module():
    ep = torch.export.export(nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(TypeError, match=r"ExportedProgram; pass its graph module, ep.module\(\)"):
        optimus_egg.optimize(ep, [torch.randn(1, 2)])


def test_example_inputs_must_be_a_sequence(mlp):
    gm, inputs = mlp
    with pytest.raises(TypeError, match="example_inputs"):
        optimus_egg.optimize(gm, inputs[0])


@pytest.mark.parametrize("budget", [-1.0, math.nan, math.inf])
def test_bad_budget_is_a_value_error(mlp, budget):
    gm, inputs = mlp
    with pytest.raises(ValueError, match="budget_s"):
        optimus_egg.optimize(gm, inputs, budget_s=budget)


def test_budget_of_wrong_type_is_a_type_error(mlp):
    gm, inputs = mlp
    with pytest.raises(TypeError, match="budget_s"):
        optimus_egg.optimize(gm, inputs, budget_s="1")


@pytest.mark.parametrize("option", ["gemm_loops", "training", "buffer_reuse"])
def test_a_switch_that_is_no_bool_is_a_type_error(mlp, option):
    gm, inputs = mlp
    with pytest.raises(TypeError, match=f"{option} must be a bool"):
        optimus_egg.optimize(gm, inputs, **{option: "yes"})


def test_wrong_input_count_is_a_value_error(mlp):
    gm, inputs = mlp
    with pytest.raises(ValueError, match="placeholders"):
        optimus_egg.optimize(gm, inputs + [torch.randn(1)])


class _Scaled(nn.Module):
    """Two linears over split pieces, scaled by an argument with a default."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x, scale: float = 2.0):
        a, b = torch.split(x, 8, 1)
        return torch.cat([self.ls[0](a), self.ls[1](b)], 1) * scale


def test_an_input_left_out_for_a_placeholder_with_a_default_takes_the_default():
    gm = fx.symbolic_trace(_Scaled())
    x = torch.randn(4, 16)
    out = optimus_egg.optimize(gm, [x], 1.0, strict=True)
    assert out.meta["optimus_egg"].matches.get("batch-linear", 0) > 0
    torch.testing.assert_close(out(x), gm(x))
    torch.testing.assert_close(out(x, 3.0), gm(x, 3.0))
    with pytest.raises(ValueError, match="placeholders"):
        optimus_egg.optimize(gm, [])  # x has no default


def test_wrong_input_shape_is_a_value_error(mlp):
    gm, inputs = mlp
    with pytest.raises(ValueError, match="do not fit"):
        optimus_egg.optimize(gm, [torch.randn(3, 7)])


@pytest.mark.parametrize("kind", ["fake", "meta"])
def test_fake_inputs_to_a_graph_without_meta_values_are_a_value_error(mlp, kind):
    """A symbolic_trace graph carries no shapes: optimize runs it for them, which fake or meta
    inputs cannot do with the model's real weights; the error names the placeholder."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm, inputs = mlp
    x = FakeTensorMode().from_tensor(inputs[0]) if kind == "fake" else inputs[0].to("meta")
    with pytest.raises(ValueError, match=r"must be real tensors .* placeholder\(s\) x got fake or meta"):
        optimus_egg.optimize(gm, [x])


def test_unknown_rule_family_is_a_value_error(mlp):
    gm, inputs = mlp
    with pytest.raises(ValueError, match="batch_linearz"):
        optimus_egg.optimize(gm, inputs, disable=["batch_linearz"])


def test_internal_failure_falls_back_with_warning(mlp, monkeypatch):
    gm, inputs = mlp
    import optimus_egg.pipeline as pipeline

    def boom(*a, **k):
        raise RuntimeError("egglog exploded")

    monkeypatch.setattr(pipeline, "saturate", boom)
    with pytest.warns(RuntimeWarning, match="egglog exploded"):
        out = optimus_egg.optimize(gm, inputs)
    assert out.meta["optimus_egg"].fallback and not out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="egglog exploded"):
        optimus_egg.optimize(gm, inputs, strict=True)


def test_verify_falls_back_when_values_differ(mlp, monkeypatch):
    gm, inputs = mlp
    import optimus_egg.pipeline as pipeline

    real = pipeline.to_fx

    def corrupt(*a, **k):
        out = real(*a, **k)
        for n in out.graph.nodes:
            if n.op == "output":
                with out.graph.inserting_before(n):
                    bad = out.graph.call_function(torch.add, (n.args[0], 1.0))
                n.args = (bad,)
        out.recompile()
        return out

    monkeypatch.setattr(pipeline, "to_fx", corrupt)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = optimus_egg.optimize(gm, inputs, verify=True)
    assert any("differ" in str(x.message) for x in w)
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_disable_one_rule_keeps_the_rest_of_its_family(mlp):
    gm, inputs = mlp
    full = optimus_egg.optimize(gm, inputs).meta["optimus_egg"]
    assert full.matches["pointwise-of-unbind-piece"] > 0 and full.matches["batch-pointwise"] > 0
    rep = optimus_egg.optimize(gm, inputs, disable=["pointwise-of-unbind-piece"]).meta["optimus_egg"]
    assert rep.matches.get("pointwise-of-unbind-piece", 0) == 0
    assert rep.matches["batch-pointwise"] == full.matches["batch-pointwise"]  # same family, still on


def test_unknown_rule_name_is_a_value_error(mlp):
    gm, inputs = mlp
    with pytest.raises(ValueError, match="batch-linearz"):
        optimus_egg.optimize(gm, inputs, disable=["batch-linearz"])


class _DeadBranch(nn.Module):
    """Four linears on one input; the third one's output is never used."""

    def __init__(self):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        ys = [fc(x) for fc in self.fcs]
        return ys[0] + ys[1] * ys[3]


def test_dead_node_joins_no_batch():
    """symbolic_trace keeps the unused linear; optimize batches the three live ones only (one
    GEMM over their concatenated weights), so training gives the dead one no gradient, as
    eager does."""
    torch.manual_seed(0)
    model = _DeadBranch()
    gm = fx.symbolic_trace(model)
    x = torch.randn(4, 8)
    out = optimus_egg.optimize(gm, [x], budget_s=5.0, strict=True)
    assert out.meta["optimus_egg"].matches["batch-linear-lhs"] > 0
    assert calls(out, torch._C._nn.linear) == 1 and calls(out, nn.Linear) == 0  # one GEMM for the three
    assert not any(n.op in ("get_attr", "call_module") and n.target.startswith("fcs.2") for n in out.graph.nodes)
    torch.testing.assert_close(out(x), gm(x))
    out(x).sum().backward()
    got = {k: p.grad for k, p in out.named_parameters()}
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    for k, p in model.named_parameters():
        if k.startswith("fcs.2."):
            assert p.grad is None and got.get(k) is None
        else:
            torch.testing.assert_close(got[k], p.grad)


class _HardGate(nn.Module):
    """Three gate linears whose scores only pick an expert (argmax: no gradient reaches them)
    and three experts, all six on one input at one depth."""

    def __init__(self):
        super().__init__()
        self.gates = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        picks = [gate(x).argmax(-1, keepdim=True) for gate in self.gates]
        hs = [torch.tanh(e(x)) for e in self.experts]
        return sum(torch.gather(h, 1, p) for h, p in zip(hs, picks))


def test_members_no_gradient_reaches_batch_apart():
    """Eagerly the gates get no gradient (None). The six linears are batched as two groups,
    gates and experts, so the gates still get none (one group of six would give them zeros,
    which AdamW's weight decay would apply)."""
    torch.manual_seed(0)
    model = _HardGate()
    gm = fx.symbolic_trace(model)
    x = torch.randn(4, 8)
    out = optimus_egg.optimize(gm, [x], budget_s=5.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.groups["linear_lhs"] == 2 and report.matches["batch-linear-lhs"] == 6, report
    assert calls(out, torch._C._nn.linear) == 2
    torch.testing.assert_close(out(x), gm(x))
    out(x).sum().backward()
    got = {k: p.grad for k, p in out.named_parameters()}
    model(x).sum().backward()
    for k, p in model.named_parameters():
        if k.startswith("gates."):
            assert p.grad is None and got.get(k) is None, k
        else:
            torch.testing.assert_close(got[k], p.grad)


# ---- shapes streamed from a forked child (shapes.shape_values) ---------------------------

@pytest.fixture(scope="module")
def split_model():
    model, inputs = build("illustrative")  # splits and cats: tuple-valued nodes
    model.eval()
    return fx.symbolic_trace(model), list(inputs)


def _lower_both(gm, inputs, monkeypatch):
    from optimus_egg.extract.graph import serialize

    import optimus_egg.from_fx as lowering
    from optimus_egg import shapes

    kinds, shape_values = [], shapes.shape_values

    def recorded(*a):
        values = shape_values(*a)
        kinds.append(type(values).__name__)
        return values

    monkeypatch.setattr(shapes, "shape_values", recorded)
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 10**9)
    local = lowering.from_fx(gm, inputs)
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 0)
    remote = lowering.from_fx(gm, inputs)
    assert kinds == ["_Local", "_Streamed"]
    a, b = serialize(local.egraph), serialize(remote.egraph)
    return local, remote, a, b


def test_streamed_shapes_lower_like_in_process(split_model, monkeypatch):
    gm, inputs = split_model
    local, remote, a, b = _lower_both(gm, inputs, monkeypatch)
    assert remote.shapes == local.shapes and remote.groups == local.groups
    assert sorted(n.op for n in b.nodes.values()) == sorted(n.op for n in a.nodes.values())
    assert len(b.classes) == len(a.classes) and b.values == a.values
    assert any(n.op == "split" for n in a.nodes.values())  # tuple values went through the stream


def test_streamed_shapes_optimize_to_the_same_values(split_model, monkeypatch):
    from optimus_egg import shapes

    gm, inputs = split_model
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 0)
    out = optimus_egg.optimize(gm, inputs, budget_s=2.0, strict=True)
    assert out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), gm(*inputs))


def test_streamed_shapes_report_a_misfit_as_a_value_error(mlp, monkeypatch):
    import optimus_egg.from_fx as lowering
    from optimus_egg import shapes

    gm, _ = mlp
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 0)
    with pytest.raises(ValueError, match="do not fit"):
        lowering.from_fx(gm, [torch.randn(3, 7)])
    # the parent fails before it reads the value that failed in the child: the misfit is reported
    monkeypatch.setattr(lowering._Lowerer, "lower", lambda self, n, deps: 1 / 0)
    with pytest.raises(ValueError, match="do not fit"):
        lowering.from_fx(gm, [torch.randn(3, 7)])


def test_streamed_shapes_fall_back_when_the_child_dies(split_model, monkeypatch):
    import os

    import optimus_egg.from_fx as lowering
    from optimus_egg import shapes

    gm, inputs = split_model
    parent, run = os.getpid(), shapes._run

    def dies_in_the_child(*a):
        if os.getpid() != parent:
            os._exit(5)
        return run(*a)

    monkeypatch.setattr(shapes, "_run", dies_in_the_child)
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 10**9)
    local = lowering.from_fx(gm, inputs)
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 0)
    remote = lowering.from_fx(gm, inputs)
    assert remote.shapes == local.shapes and remote.groups == local.groups


def test_meanwhile_runs_once_beside_the_streaming_child(split_model, monkeypatch):
    import optimus_egg.from_fx as lowering
    from optimus_egg import pipeline, shapes

    gm, inputs = split_model
    seen, lower = [], lowering._lower

    def lowered_after(*a):
        seen.append("lower")
        return lower(*a)

    def children() -> set[str]:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return set(f.read().split())

    before = children()  # earlier tests' workers may not be reaped yet

    def meanwhile():  # the streaming child is running: this process has a new child
        seen.append(("meanwhile", bool(children() - before)))

    monkeypatch.setattr(lowering, "_lower", lowered_after)
    monkeypatch.setattr(shapes, "STREAM_MIN_NODES", 0)
    lowering.from_fx(gm, inputs, meanwhile=meanwhile)
    assert seen == [("meanwhile", True), "lower"]
    # optimize warms its rules there: the search finds them translated
    warmed, warm = [], pipeline.warm
    monkeypatch.setattr(pipeline, "warm", lambda rs: (warmed.append(len(seen)), warm(rs)))
    out = optimus_egg.optimize(gm, inputs, budget_s=1.0, strict=True)
    assert warmed[0] == 2 and out.meta["optimus_egg"].changed  # before this from_fx's lowering
    torch.testing.assert_close(out(*inputs), gm(*inputs))


def _same_egraph(a, b) -> None:
    """The same terms, up to the numbering of classes (which follows the seeding order)."""
    assert sorted(n.op for n in b.nodes.values()) == sorted(n.op for n in a.nodes.values())
    assert len(b.classes) == len(a.classes) and len(b.values) == len(a.values)
    prims = [sorted(repr(v) for v in g.values.values() if not isinstance(v, list)) for g in (a, b)]
    assert prims[0] == prims[1]


def test_seeding_without_a_temporary_folder(split_model, monkeypatch):
    from optimus_egg.extract.graph import serialize

    import optimus_egg.from_fx as lowering
    from optimus_egg import seed

    gm, inputs = split_model
    with_files = lowering.from_fx(gm, inputs)
    monkeypatch.setattr(seed, "_write_seed_program", lambda *a: None)
    _same_egraph(serialize(with_files.egraph), serialize(lowering.from_fx(gm, inputs).egraph))
    out = optimus_egg.optimize(gm, inputs, budget_s=1.0, strict=True)
    assert out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), gm(*inputs))


def test_optimize_leaves_its_work_to_reference_counting(split_model):
    """The serialized e-graphs and raising's tables are freed when optimize is done with them,
    not left in reference cycles for the collector (paused during optimize, it would then
    scan them all at once: 0.19 s on the 10,000-node bench graph)."""
    import gc

    gm, inputs = split_model
    while gc.collect():  # one pass can leave cycles that its finalizers released (Dynamo's, from earlier tests)
        pass
    gc.disable()
    try:
        out = optimus_egg.optimize(gm, inputs, budget_s=2.0, strict=True)
        garbage = gc.collect()
    finally:
        gc.enable()
    assert out.meta["optimus_egg"].changed
    assert garbage < 1000, garbage  # a few hundred egglog declarations; a leaked e-graph is thousands


def test_a_lone_select_comes_back_a_select_from_the_search():
    """The search's result (a worker's chosen graph, with its classes' shape facts) turns an
    unbind of which one piece is read back into a select; a stack of every piece is a view."""
    def f(x):
        return torch.stack([x[:, i] for i in range(4)], 0).tanh(), x[0] * 2

    x = torch.randn(3, 4, 5)
    gm = fx.symbolic_trace(f)
    out = optimus_egg.optimize(gm, [x], budget_s=2.0, strict=True)
    assert out.meta["optimus_egg"].changed and calls(out, torch.stack) == 0
    assert calls(out, torch.select) == 1 and calls(out, torch.unbind) == 0
    for a, b in zip(out(x), gm(x)):
        torch.testing.assert_close(a, b)


_IN_A_THREAD = """
import threading, torch, torch.fx as fx
import optimus_egg
from optimus_egg.models import build
model, inputs = build("parallel_mlp")
gm = fx.symbolic_trace(model.eval())
got = {}
t = threading.Thread(target=lambda: got.update(out=optimus_egg.optimize(gm, list(inputs), 1.0, strict=True)))
t.start(); t.join()
import gc; gc.collect()
with torch.no_grad():
    torch.testing.assert_close(got["out"](*inputs), gm(*inputs))
print("changed", got["out"].meta["optimus_egg"].changed)
"""


def test_optimize_in_a_thread_drops_its_egraphs_there():
    """optimize called first from a thread other than the main one (a fresh interpreter, so
    egglog's first use happens there): its e-graphs are dropped in that thread, as PyO3
    requires of egglog's; dropped by the main thread's collector they printed "EGraph is
    unsendable, but is being dropped on another thread"."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _IN_A_THREAD], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "changed True" in run.stdout
    assert "unsendable" not in run.stderr, run.stderr[-2000:]


class _FirstHalf(nn.Module):
    """Reads one chunk of the rows: optimized, the chunk is a narrow of the example's half."""

    def forward(self, x, rows: int):
        return torch.relu(torch.chunk(x.reshape(rows, -1), 2, dim=0)[0])


def _without_shape_checks(gm: fx.GraphModule) -> fx.GraphModule:
    g = copy.deepcopy(gm.graph)
    for n in [n for n in g.nodes if n.target is torch._assert]:
        g.erase_node(n)
    g.eliminate_dead_code()
    return fx.GraphModule(gm, g)


def test_a_graph_without_shapes_checks_the_example_shapes_on_entry():
    """A symbolic_trace graph has no shapes of its own: the result is made for the example's,
    and checks each input against them. Without the checks this one computes other values at
    another batch size (the narrow keeps the example's 4 rows)."""
    gm = fx.symbolic_trace(_FirstHalf())
    x = torch.randn(8, 4)
    out = optimus_egg.optimize(gm, [x, 8], 1.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.changed and calls(out, torch.narrow) == 1 and report.shape_checks == 2
    assert "checked against the example's shape on entry: 2" in str(report)
    torch.testing.assert_close(out(x, 8), gm(x, 8), rtol=0, atol=0)
    unchecked = _without_shape_checks(out)
    for other in [(torch.randn(16, 4), 16), (x, 4)]:
        assert unchecked(*other).shape != gm(*other).shape  # what the checks stop
    with pytest.raises(AssertionError, match=r"optimized this graph for input 'x' of shape \(8, 4\)"):
        out(torch.randn(16, 4), 16)
    with pytest.raises(AssertionError, match="input 'rows' of value 8"):
        out(x, 4)


class _Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        a, b = torch.chunk(x, 2, dim=1)
        return torch.cat([lin(nn.functional.layer_norm(p, (8,))) for lin, p in zip(self.ls, (a, b))], 1)


def test_optimizing_an_optimized_graph_keeps_one_check_per_input():
    """Lowering leaves the shape checks out; the rewritten result gets its own."""
    gm, x = fx.symbolic_trace(_Heads()), torch.randn(4, 16)
    first = optimus_egg.optimize(gm, [x], 1.0, strict=True, disable=["batch_linear"])
    again = optimus_egg.optimize(first, [x], 1.0, strict=True)
    assert calls(first, ops.batched_layer_norm) == 1 and calls(first, ops.batched_linear) == 0
    assert calls(again, ops.batched_linear) == 1 and again.meta["optimus_egg"].shape_checks == 1
    assert calls(first, torch._assert) == calls(again, torch._assert) == 1
    torch.testing.assert_close(again(x), gm(x))


class _ListOfRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, xs):
        return torch.cat([torch.chunk(self.ls[0](xs[0]), 2, 0)[0], self.ls[1](xs[1])], 0)


def test_the_shape_checks_look_into_a_list_input():
    gm, xs = fx.symbolic_trace(_ListOfRows()), [torch.randn(4, 8), torch.randn(4, 8)]
    out = optimus_egg.optimize(gm, [xs], 1.0, strict=True)
    assert calls(out, ops.batched_linear) == 1 and out.meta["optimus_egg"].shape_checks == 2
    torch.testing.assert_close(out(xs), gm(xs))
    other = [torch.randn(6, 8), torch.randn(6, 8)]
    assert _without_shape_checks(out)(other).shape != gm(other).shape  # what the checks stop
    with pytest.raises(AssertionError, match=r"input 'xs\[0\]' of shape \(4, 8\)"):
        out(other)


class _Normed(nn.Module):
    def forward(self, x):
        a, b = torch.chunk(x, 2, dim=1)
        return torch.cat([nn.functional.layer_norm(a, (8,)), nn.functional.layer_norm(b, (8,))], 1)


class _Summed(nn.Module):
    def forward(self, x, keep: bool, scale: float):
        return x.sum(1, keepdim=keep) * scale


def test_the_shape_checks_take_ints_and_bools_by_value_and_leave_floats():
    """A bool may set a shape (`keepdim`); a float only scales values."""
    from optimus_egg.shapes import guard_example_shapes

    gm, x = fx.symbolic_trace(_Summed()), torch.randn(4, 8)
    out = copy.deepcopy(gm)
    assert guard_example_shapes(gm, out, [x, True, 2.0]) == 2
    torch.testing.assert_close(out(x, True, 3.0), gm(x, True, 3.0))
    with pytest.raises(AssertionError, match="input 'keep' of value True"):
        out(x, False, 2.0)


def test_a_graph_with_shapes_of_its_own_gets_no_shape_checks():
    """Dynamo and export graphs carry their shapes (symbolic where captured so), and their
    tracers guard them: no checks, and the result runs at every size the capture allows."""
    model, x = _Normed(), torch.randn(8, 16)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b", min=2)},))
    out = optimus_egg.optimize(ep.module(), [x], 1.0, strict=True)
    assert calls(out, ops.batched_layer_norm) == 1 and out.meta["optimus_egg"].shape_checks == 0
    other = torch.randn(5, 16)
    torch.testing.assert_close(out(other), model(other))


def test_an_unchanged_graph_gets_no_shape_checks(mlp):
    gm, inputs = mlp
    out = optimus_egg.optimize(gm, inputs, 0.0, strict=True)
    assert not out.meta["optimus_egg"].changed and out.meta["optimus_egg"].shape_checks == 0
    assert calls(out, torch._assert) == 0
