"""Saturation: runs the rulesets under limits and records why the search stopped.

The only module that sets limits. Each iteration runs every enabled ruleset once, in
SCHEDULE_ORDER (vertical families to their fixpoint), inside push/pop: an iteration that takes the e-graph past `node_limit` is
rolled back. egglog 13.2 cannot interrupt a running iteration, so the clock is checked
between iterations, and an iteration is not started when the last one's time, scaled by the
e-graph's growth, would overrun the deadline.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from egglog import EGraph, Ruleset, run, seq

from optimus_egg.rules import VERTICAL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    iterations: int = 30
    node_limit: int = 200_000   # e-nodes across all tables; 10k-node FX graphs seed ~35k
    growth_limit: float = 4.0   # ... or this many times the seeded size, whichever is larger


@dataclass
class SaturationReport:
    iterations: int = 0
    stop_reason: str = "not_run"       # saturated | budget | node_limit | iter_limit
    nodes: int = 0
    matches: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    rolled_back: bool = False


def egraph_nodes(egraph: EGraph) -> int:
    return sum(n for _, n in egraph.all_function_sizes())


def saturate(egraph: EGraph, rulesets: dict[str, Ruleset], limits: Limits, deadline: float) -> SaturationReport:
    rep = SaturationReport(nodes=egraph_nodes(egraph))
    start_nodes = rep.nodes
    start = time.perf_counter()
    if not rulesets:
        rep.stop_reason = "saturated"
        return rep
    # Vertical families are cheap and confluent: each runs to its fixpoint inside an iteration
    # (the pieces walk advances one operand per run). Horizontal ones run once per iteration.
    schedule = seq(*(run(rs).saturate() if name in VERTICAL else run(rs) for name, rs in rulesets.items()))
    last_s, growth, stale = 0.0, 1.0, 0
    while True:
        now = time.perf_counter()
        if rep.iterations >= limits.iterations:
            rep.stop_reason = "iter_limit"
            break
        if now >= deadline or now + last_s * growth > deadline:
            rep.stop_reason = "budget"
            break
        before = rep.nodes
        egraph.push()
        t0 = time.perf_counter()
        report = egraph.run(schedule)
        last_s = time.perf_counter() - t0
        size = egraph_nodes(egraph)
        if size > max(limits.node_limit, limits.growth_limit * start_nodes):
            egraph.pop()
            rep.stop_reason, rep.rolled_back = "node_limit", True
            break
        rep.iterations += 1
        rep.nodes = size
        growth = max(1.0, size / max(before, 1))
        for rule, count in report.num_matches_per_rule.items():
            rep.matches[rule.name] += count
        log.debug("iteration %d: %d nodes, %.3fs", rep.iterations, size, last_s)
        # egglog reports `updated` when a rule merely re-asserts a fact, so a search that
        # adds nothing twice in a row has saturated too.
        stale = stale + 1 if size == before else 0
        if not report.updated or stale >= 2:
            rep.stop_reason = "saturated"
            break
    rep.seconds = time.perf_counter() - start
    log.debug("saturation stopped: %s after %d iterations", rep.stop_reason, rep.iterations)
    return rep
