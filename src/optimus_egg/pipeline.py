"""optimize(): from_fx -> saturate -> extract -> to_fx, with a report and safe fallbacks.

Bad arguments raise TypeError / ValueError. Anything that goes wrong inside the optimizer
returns the unmodified graph with a warning (strict=True raises instead). The result is
never costlier than the input under the launch cost model: if extraction finds nothing
cheaper, the input graph is returned unchanged.
"""
from __future__ import annotations

import copy
import math
import numbers
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from optimus_egg.extract.graph import Graph, Node, serialize
from optimus_egg.extract.greedy import greedy
from optimus_egg.extract.launch_cost import launch_cost
from optimus_egg.from_fx import Lowered, _name, check_inputs, from_fx
from optimus_egg.rules import SCHEDULE_ORDER, RULESETS
from optimus_egg.saturate import Limits, saturate
from optimus_egg.to_fx import to_fx


@dataclass
class Report:
    """What optimize did; stored on the result as gm.meta["optimus_egg"]."""
    timings: dict[str, float] = field(default_factory=dict)
    egraph_nodes: int = 0
    egraph_classes: int = 0
    iterations: int = 0
    stop_reason: str = "not_run"
    matches: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    cost_before: float = math.nan
    cost_after: float = math.nan
    changed: bool = False
    fallback: str | None = None

    def __str__(self) -> str:
        t = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.timings.items())
        fired = ", ".join(f"{k}={v}" for k, v in sorted(self.matches.items()) if v) or "none"
        lines = [
            f"optimus_egg: launch cost {self.cost_before:.0f} -> {self.cost_after:.0f}"
            f" ({'changed' if self.changed else 'unchanged'})",
            f"  search: {self.iterations} iterations, stopped by {self.stop_reason}, "
            f"e-graph {self.egraph_nodes} nodes / {self.egraph_classes} classes",
            f"  rules fired: {fired}",
            f"  time: {t}",
        ]
        if self.fallback:
            lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)


def _check_args(gm, example_inputs, budget_s, disable) -> None:
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"optimize expects a torch.fx.GraphModule, got {type(gm).__name__}; "
                        "trace a module first with torch.fx.symbolic_trace(model)")
    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"example_inputs must be a list or tuple of tensors, got {type(example_inputs).__name__}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real):
        raise TypeError(f"budget_s must be a number of seconds, got {type(budget_s).__name__}")
    if not math.isfinite(budget_s) or budget_s < 0:
        raise ValueError(f"budget_s must be a finite number of seconds >= 0, got {budget_s}")
    if isinstance(disable, str):
        raise TypeError("disable must be a list of rule family names, not a string")
    unknown = set(disable) - set(RULESETS)
    if unknown:
        raise ValueError(f"disable names unknown rule families {sorted(unknown)}; known: {list(SCHEDULE_ORDER)}")


def node_cost(lowered: Lowered, g: Graph):
    """The launch cost of one serialized node (template calls look up their FX target)."""
    def cost(n: Node) -> float:
        if n.op in ("call", "call_multi", "unary"):
            return launch_cost(n.op, _name(lowered.templates[g.values[n.children[0]]].target))
        return launch_cost(n.op)
    return cost


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    return fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)


def optimize(gm: fx.GraphModule, example_inputs, budget_s: float = 1.0, *, strict: bool = False,
             disable: tuple[str, ...] | list[str] = (), limits: Limits | None = None,
             verify: bool = False) -> fx.GraphModule:
    """Rewrite `gm` to launch fewer kernels; returns a new GraphModule with the same values.

    budget_s bounds the saturation search (0: no search, an equivalent graph comes back);
    lowering and extraction add an overhead that grows linearly with graph size.
    disable: rule families to leave out (see optimus_egg.rules.SCHEDULE_ORDER).
    verify: run both graphs on example_inputs and keep the input graph if values differ.
    """
    _check_args(gm, example_inputs, budget_s, disable)
    inputs = check_inputs(gm, example_inputs)
    report = Report()
    start = time.perf_counter()
    try:
        result = _optimize(gm, inputs, budget_s, disable, limits or Limits(), report)
        if verify and result is not gm and not _same_values(gm, result, inputs):
            raise RuntimeError("verify: the optimized graph's values differ from the input graph's")
    except ValueError:
        raise
    except Exception as e:
        if strict:
            raise
        warnings.warn(f"optimus_egg: optimization failed ({type(e).__name__}: {e}); "
                      "returning the unmodified graph", RuntimeWarning, stacklevel=2)
        report.fallback = f"{type(e).__name__}: {e}"
        report.changed = False
        result = gm
    if result is gm:
        result = _copy(gm)
    report.timings["total"] = time.perf_counter() - start
    result.meta["optimus_egg"] = report
    return result


def _optimize(gm, inputs, budget_s, disable, limits, report) -> fx.GraphModule:
    t = time.perf_counter()
    lowered = from_fx(gm, inputs, seed_groups=budget_s > 0)
    report.groups = lowered.groups
    report.timings["from_fx"] = time.perf_counter() - t

    t = time.perf_counter()
    g0 = serialize(lowered.egraph)
    report.cost_before = greedy(g0, node_cost(lowered, g0)).cost
    report.cost_after = report.cost_before
    report.timings["extract"] = time.perf_counter() - t
    if budget_s == 0:
        report.stop_reason = "budget"
        return gm

    rulesets = {name: RULESETS[name] for name in SCHEDULE_ORDER if name not in set(disable)}
    # The budget bounds the search; lowering and extraction add an overhead linear in graph size.
    sat = saturate(lowered.egraph, rulesets, limits, time.perf_counter() + budget_s)
    report.timings["saturate"] = sat.seconds
    report.iterations, report.stop_reason = sat.iterations, sat.stop_reason
    report.matches = dict(sat.matches)
    if sat.iterations == 0:
        return gm  # nothing was added: the input is already the best extraction

    t = time.perf_counter()
    g1 = serialize(lowered.egraph)
    report.egraph_nodes = sum(len(v) for v in g1.classes.values())
    report.egraph_classes = len(g1.classes)
    ex = greedy(g1, node_cost(lowered, g1))
    report.timings["extract"] += time.perf_counter() - t
    if ex.cost >= report.cost_before - 1e-9:
        return gm  # never worse: nothing cheaper was found
    t = time.perf_counter()
    out = to_fx(lowered, g1, ex, inputs)
    report.timings["to_fx"] = time.perf_counter() - t
    report.cost_after, report.changed = ex.cost, True
    return out


def _same_values(a: fx.GraphModule, b: fx.GraphModule, inputs) -> bool:
    with torch.no_grad():
        ra, rb = a(*inputs), b(*inputs)
    try:
        torch.testing.assert_close(rb, ra, rtol=1e-4, atol=1e-5, equal_nan=True)
        return True
    except AssertionError:
        return False
