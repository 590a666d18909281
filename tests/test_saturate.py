"""Bounded saturation: node-limit rollback, the deadline under an exploding rule, stop reasons."""
import time

import torch.fx as fx
from egglog import eq, i64, rule, ruleset, union

import optimus_egg
from optimus_egg.from_fx import from_fx
from optimus_egg.models import build
from optimus_egg.rules import RULESETS
from optimus_egg.saturate import Limits, egraph_nodes, saturate
from optimus_egg.sorts import Tensor

boom = ruleset(name="boom")


@boom.register
def _(op: i64, x: Tensor):
    # Unguarded growth: every elementwise node spawns two new ones each iteration.
    yield rule(eq(Tensor.unary(op, x)).to(Tensor.unary(op, x)), name="boom").then(
        union(Tensor.unary(op, x)).with_(Tensor.unary(op * 2 + 1, Tensor.unary(op * 2 + 2, x))))


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
    rep = saturate(lw.egraph, {"boom": boom}, Limits(iterations=100, node_limit=start + 200, growth_limit=1.0),
                   time.perf_counter() + 60)
    assert rep.stop_reason == "node_limit" and rep.rolled_back
    assert egraph_nodes(lw.egraph) <= start + 200  # the iteration that crossed it was undone
    assert rep.nodes == egraph_nodes(lw.egraph)


def test_iteration_limit():
    rep = saturate(lowered().egraph, {"boom": boom}, Limits(iterations=2, node_limit=10**8),
                   time.perf_counter() + 60)
    assert rep.stop_reason == "iter_limit" and rep.iterations == 2


def test_deadline_holds_under_an_exploding_rule():
    lw = lowered()
    budget = 0.5
    t = time.perf_counter()
    rep = saturate(lw.egraph, {"boom": boom}, Limits(iterations=10**6, node_limit=10**9), t + budget)
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
    costs = [optimus_egg.optimize(gm, list(inputs), budget_s=b).meta["optimus_egg"].cost_after
             for b in (0.0, 0.001, 0.05, 2.0)]
    assert all(a >= b for a, b in zip(costs, costs[1:])), costs
    assert costs[-1] < costs[0]


def test_node_limit_scales_with_the_seeded_graph():
    lw = lowered()
    start = egraph_nodes(lw.egraph)
    rep = saturate(lw.egraph, RULESETS, Limits(node_limit=10, growth_limit=4.0), time.perf_counter() + 30)
    assert rep.stop_reason == "saturated" and egraph_nodes(lw.egraph) <= 4 * start
