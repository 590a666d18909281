"""Bounded saturation: node-limit rollback, the deadline under an exploding rule, stop reasons."""
import math
import time

import pytest
import torch
import torch.fx as fx
from egglog import eq, i64, rule, ruleset, union
from optimus_egg.models import build
from optimus_egg.rules import RULESETS, VERTICAL, rule_names

import optimus_egg
from optimus_egg.from_fx import from_fx
from optimus_egg.saturate import Limits, egraph_nodes, saturate
from optimus_egg.sorts import Tensor

boom = ruleset(name="boom")


@boom.register
def _(op: i64, x: Tensor):
    # Unguarded growth: every elementwise node spawns two new ones each iteration.
    yield rule(eq(Tensor.unary(op, x)).to(Tensor.unary(op, x)), name="boom").then(
        union(Tensor.unary(op, x)).with_(Tensor.unary(op * 2 + 1, Tensor.unary(op * 2 + 2, x))))


UNBOUNDED_BATCH = {"horizontal_rounds": 10**6, "horizontal_growth": 1e9}  # `boom` is not a vertical family


def lowered(model="parallel_mlp"):
    m, inputs = build(model)
    m.eval()
    return from_fx(fx.symbolic_trace(m), list(inputs))


def test_saturates_and_says_so():
    rep = saturate(lowered().egraph, RULESETS, Limits(), time.perf_counter() + 30)
    assert rep.stop_reason == "saturated" and rep.iterations >= 1
    assert rep.matches["batch-linear"] == 8


def test_node_limit_rolls_back_the_iteration():
    lw = lowered()
    start = egraph_nodes(lw.egraph)
    rep = saturate(lw.egraph, {"boom": boom}, Limits(iterations=100, node_limit=start + 200, growth_limit=1.0, **UNBOUNDED_BATCH),
                   time.perf_counter() + 60)
    assert rep.stop_reason == "node_limit" and rep.rolled_back
    assert egraph_nodes(lw.egraph) <= start + 200  # the iteration that crossed it was undone
    assert rep.nodes == egraph_nodes(lw.egraph)


def test_iteration_limit():
    rep = saturate(lowered().egraph, {"boom": boom}, Limits(iterations=2, node_limit=10**8, **UNBOUNDED_BATCH),
                   time.perf_counter() + 60)
    assert rep.stop_reason == "iter_limit" and rep.iterations == 2


def test_deadline_holds_under_an_exploding_rule():
    lw = lowered()
    budget = 0.5
    t = time.perf_counter()
    rep = saturate(lw.egraph, {"boom": boom}, Limits(iterations=10**6, node_limit=10**9, **UNBOUNDED_BATCH), t + budget)
    elapsed = time.perf_counter() - t
    assert rep.stop_reason == "budget"
    # An iteration cannot be interrupted; one predicted to overrun is not started.
    assert elapsed < 1.1 * budget + 0.3, elapsed


def test_budget_zero_runs_no_iteration():
    m, inputs = build("parallel_mlp")
    gm = fx.symbolic_trace(m.eval())
    out = optimus_egg.optimize(gm, list(inputs), budget_s=0)
    assert out.meta["optimus_egg"].iterations == 0


def test_larger_budgets_are_never_worse():
    m, inputs = build("dcn_v2")
    gm = fx.symbolic_trace(m.eval())
    reports = [optimus_egg.optimize(gm, list(inputs), budget_s=b).meta["optimus_egg"]
               for b in (0.0, 0.001, 0.05, 2.0)]
    # 0.001 s is below one iteration on this graph: the input comes back unpriced (NaN cost)
    assert not reports[1].changed and math.isnan(reports[1].cost_after)
    costs = [reports[0].cost_before if not r.changed else r.cost_after for r in reports]
    assert all(a >= b for a, b in zip(costs, costs[1:])), costs
    assert costs[-1] < costs[0]


def test_node_limit_scales_with_the_seeded_graph():
    lw = lowered()
    start = egraph_nodes(lw.egraph)
    rep = saturate(lw.egraph, RULESETS, Limits(node_limit=10, growth_limit=4.0), time.perf_counter() + 30)
    assert rep.stop_reason == "saturated" and egraph_nodes(lw.egraph) <= 4 * start


# ---- the hard deadline: saturation in a forked worker, killed at deadline + allowance ----

creep = ruleset(name="creep")


@creep.register
def _(op: i64, x: Tensor):
    # Never saturates: every elementwise node gains a new equivalent each run. Run to its
    # fixpoint as a vertical family, one iteration never ends.
    yield rule(eq(Tensor.unary(op, x)).to(Tensor.unary(op, x)), name="creep").then(
        union(Tensor.unary(op, x)).with_(Tensor.unary(op + 1000, x)))


def mlp():
    m, inputs = build("parallel_mlp")
    return fx.symbolic_trace(m.eval()), list(inputs)


def test_hard_deadline_stops_an_iteration_that_never_ends(monkeypatch):
    import optimus_egg.pipeline as pipeline

    monkeypatch.setattr(pipeline, "RULESETS", {"split_cat": creep})  # split_cat runs to fixpoint
    monkeypatch.setattr(pipeline, "SCHEDULE_ORDER", ("split_cat",))
    gm, inputs = mlp()
    budget = 0.5
    t = time.perf_counter()
    out = optimus_egg.optimize(gm, inputs, budget_s=budget, strict=True)
    elapsed = time.perf_counter() - t
    rep = out.meta["optimus_egg"]
    assert rep.hard_stop and rep.stop_reason == "budget" and rep.iterations == 0 and not rep.changed
    search = elapsed - rep.timings["from_fx"] - rep.timings["extract"]
    assert search < budget + 0.05 + 2 * rep.timings["extract"] + 0.5, (search, rep.timings)
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)


def test_hard_deadline_keeps_the_last_snapshot(monkeypatch):
    import optimus_egg.pipeline as pipeline

    def one_iteration_then_hang(egraph, rulesets, limits, deadline, on_iteration=None):
        rep = saturate(egraph, rulesets, Limits(iterations=1), deadline)
        time.sleep(0.05)             # longer than a snapshot of this small graph takes
        on_iteration(rep)            # the worker snapshots here ...
        time.sleep(60)               # ... and then hangs, as an exploding iteration would

    monkeypatch.setattr(pipeline, "saturate", one_iteration_then_hang)
    gm, inputs = mlp()
    # A budget the one iteration and its snapshot fit in even on a loaded machine; the hang
    # then runs past the hard deadline.
    out = optimus_egg.optimize(gm, inputs, budget_s=2.0, strict=True)
    rep = out.meta["optimus_egg"]
    assert rep.hard_stop and rep.iterations == 1 and rep.changed and rep.cost_after < rep.cost_before
    assert rep.timings["total"] < 10
    torch.testing.assert_close(out(*inputs), gm(*inputs))


def test_worker_and_in_process_search_agree():
    gm, inputs = mlp()
    a = optimus_egg.optimize(gm, inputs, budget_s=5, strict=True)
    b = optimus_egg.optimize(gm, inputs, budget_s=5, strict=True, limits=Limits(worker=False))
    ra, rb = a.meta["optimus_egg"], b.meta["optimus_egg"]
    assert not ra.hard_stop and ra.stop_reason == rb.stop_reason == "saturated"
    assert ra.cost_after == rb.cost_after < ra.cost_before
    assert ra.egraph_nodes == rb.egraph_nodes and ra.matches == rb.matches
    assert a.code == b.code


def test_a_worker_failure_is_reported_and_falls_back(monkeypatch):
    import os

    import optimus_egg.pipeline as pipeline

    monkeypatch.setattr(pipeline, "saturate", lambda *a, **k: os._exit(3))  # the worker dies
    gm, inputs = mlp()
    with pytest.warns(RuntimeWarning, match="exited without a result"):
        out = optimus_egg.optimize(gm, inputs, budget_s=1)
    assert out.meta["optimus_egg"].fallback and not out.meta["optimus_egg"].changed


def test_the_collector_is_paused_during_optimize_and_restored(monkeypatch):
    import gc

    from optimus_egg import pipeline

    seen = []

    def watching(egraph, rulesets, limits, deadline, on_iteration=None):
        seen.append(("saturate", gc.isenabled()))
        return saturate(egraph, rulesets, limits, deadline, on_iteration=on_iteration)

    def send_back(lowered, rulesets, limits, budget_s, before, while_waiting=lambda: None):
        seen.append(("search", gc.isenabled()))
        return search(lowered, rulesets, limits, budget_s, before, while_waiting)

    search = pipeline._search
    monkeypatch.setattr(pipeline, "saturate", watching)
    monkeypatch.setattr(pipeline, "_search", send_back)
    gm, inputs = mlp()
    assert gc.isenabled()
    out = optimus_egg.optimize(gm, inputs, budget_s=2, strict=True, limits=Limits(worker=False))
    assert seen == [("search", False), ("saturate", False)]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert out.meta["optimus_egg"].changed
    torch.testing.assert_close(out(*inputs), gm(*inputs))


def test_horizontal_rounds_bound_the_batch_rules():
    lw = lowered()
    rep = saturate(lw.egraph, RULESETS, Limits(horizontal_rounds=0), time.perf_counter() + 30)
    assert rep.stop_reason == "saturated"
    assert not any(rep.matches[r] for r in ("batch-linear", "batch-layernorm", "batch-pointwise"))
    vertical = {r for family in VERTICAL for r in rule_names(family)}
    assert sum(n for r, n in rep.matches.items() if r in vertical) > 0  # vertical families still run
    rep = saturate(lowered().egraph, RULESETS, Limits(horizontal_rounds=1), time.perf_counter() + 30)
    assert rep.matches["batch-linear"] == 8


def test_horizontal_growth_cap_stops_the_batch_rules():
    lw = lowered()
    rep = saturate(lw.egraph, RULESETS, Limits(horizontal_growth=0.5), time.perf_counter() + 30)
    assert rep.matches["batch-linear"] == 0 and rep.stop_reason == "saturated"


GROWTH_BOUND = 2.5  # saturated / seeded e-graph size, whole library; measured at most 1.7 (masknet)


@pytest.mark.parametrize("model", ["parallel_mlp", "dlrm", "dcn_v2", "wukong", "dhen", "masknet",
                                   "interformer", "hstu", "illustrative", "illustrative_1k"])
def test_growth_bound_on_every_bench_model(model):
    """The whole rule library saturates each bench model well inside the node limits."""
    lw = lowered(model)
    start = egraph_nodes(lw.egraph)
    rep = saturate(lw.egraph, RULESETS, Limits(horizontal_rounds=10**6, horizontal_growth=1e9),
                   time.perf_counter() + 60)
    assert rep.stop_reason == "saturated", rep.stop_reason
    assert rep.nodes <= GROWTH_BOUND * start, (model, start, rep.nodes)
