"""Saturation: runs the rulesets under limits and records why the search stopped.

The only module that sets limits. Each iteration runs every enabled ruleset once, in
SCHEDULE_ORDER (vertical families to their fixpoint, before and again after the horizontal
ones; horizontal ones only in the first `horizontal_rounds` iterations and under their own
growth cap), inside push/pop: an iteration
that takes the e-graph past `node_limit` is rolled back. egglog 13.2 cannot interrupt a
running iteration, so the clock is checked between iterations, and an iteration is not
started when the last one's time, scaled by the e-graph's growth, would overrun the
deadline; the hard stop is the worker process in pipeline._search.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from egglog import EGraph, Ruleset, run, seq

from optimus_egg.rules import VERTICAL
from optimus_egg.sorts import CHECK_FACTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    iterations: int = 30
    node_limit: int = 200_000   # e-nodes across all tables; 10k-node FX graphs seed ~35k
    growth_limit: float = 4.0   # ... or this many times the seeded size, whichever is larger
    # Horizontal (batch_*) families, TENSAT's k_multi: they run in the first `horizontal_rounds`
    # iterations and while the e-graph is under `horizontal_growth` x its seeded size; after
    # that only the vertical families run. Measured: every bench model reaches the same final
    # cost with 1 round as with 30 (batch rules match their seeded slots at once); 3 keeps a margin.
    horizontal_rounds: int = 3
    horizontal_growth: float = 3.0
    # Search in a forked worker killed at the hard deadline (see pipeline._search); False, or a
    # platform without fork, searches in-process and only predicts iteration times.
    worker: bool = True


@dataclass
class SaturationReport:
    iterations: int = 0
    stop_reason: str = "not_run"       # saturated | budget | node_limit | iter_limit
    nodes: int = 0
    matches: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    rolled_back: bool = False


def egraph_nodes(egraph: EGraph) -> int:
    """E-nodes across all tables but sorts.CHECK_FACTS: the pieces check's own facts grow with
    the terms and never on their own, and the limits were measured and tuned without them."""
    return sum(n for f, n in egraph.all_function_sizes() if str(f) not in CHECK_FACTS)


def _schedule(rulesets: dict[str, Ruleset]):
    # Vertical families are cheap and confluent: each runs to its fixpoint inside an iteration
    # (the pieces walk advances one operand per run). Horizontal ones run once per iteration,
    # and the vertical ones run again after them, so the stacks and unbinds a batch rule just
    # built cancel in the same iteration rather than the next one.
    vertical = [run(rs).saturate() for name, rs in rulesets.items() if name in VERTICAL]
    horizontal = [run(rs) for name, rs in rulesets.items() if name not in VERTICAL]
    return seq(*vertical, *horizontal, *(vertical if horizontal else []))


_WARM: set[tuple[int, ...]] = set()


def warm(rulesets: dict[str, Ruleset]) -> None:
    """Run the schedule once on an empty e-graph: egglog-python translates rules on first use
    (~0.1 s), which a forked worker would otherwise redo, and lose, on every call."""
    key = tuple(id(rs) for rs in rulesets.values())
    if rulesets and key not in _WARM:
        EGraph().run(_schedule(rulesets))
        _WARM.add(key)


def saturate(egraph: EGraph, rulesets: dict[str, Ruleset], limits: Limits, deadline: float,
             on_iteration: Callable[[SaturationReport], None] | None = None) -> SaturationReport:
    """Run `rulesets` until saturated or a limit stops it; `on_iteration` sees each kept iteration."""
    rep = SaturationReport(nodes=egraph_nodes(egraph))
    start_nodes = rep.nodes
    start = time.perf_counter()
    if not rulesets:
        rep.stop_reason = "saturated"
        return rep
    schedule = _schedule(rulesets)
    vertical = {name: rs for name, rs in rulesets.items() if name in VERTICAL}
    vertical_only = _schedule(vertical) if vertical else None
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
        multi = rep.iterations < limits.horizontal_rounds and before <= limits.horizontal_growth * start_nodes
        if not multi and vertical_only is None:
            rep.stop_reason = "saturated"  # nothing left that may run
            break
        egraph.push()
        t0 = time.perf_counter()
        report = egraph.run(schedule if multi else vertical_only)
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
        if on_iteration is not None:  # only for iterations the search goes on from
            on_iteration(rep)
    rep.seconds = time.perf_counter() - start
    log.debug("saturation stopped: %s after %d iterations", rep.stop_reason, rep.iterations)
    return rep
