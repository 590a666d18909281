"""The ablation arm: optimus_egg's rules applied greedily, one family at a time, no search.

``rewrite_greedily(gm, inputs)`` walks the rule families in ``rules.SCHEDULE_ORDER`` and gives
each one step: ``optimize`` with only that family enabled (plus the ``pieces`` facts that the
split/cat, unbind/stack guards read), one saturation round, and the usual extraction. The step's
result is committed at once: the next family starts from that FX graph, so every alternative
the step did not extract is forgotten. Passes over all families repeat until one changes nothing
(or ``max_passes``). This is destructive, sequential rewriting in the manner of PyTorch's own
Optimus passes; the e-graph is still the rewriting engine inside a step, but no step can see
what another family would have made of its alternatives, which is what saturation adds.

Each step is also a hill-climbing step: optimize keeps its input unless the extraction is
cheaper. So a rewrite that pays off only once another family cleans up after it (batching
LayerNorms over unbound pieces, which needs stack-of-unbind-pieces to drop the stack) is
turned down, where PyTorch's Optimus would apply it and clean up in a later pass.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from torch import fx

from optimus_egg.pipeline import Report, optimize
from optimus_egg.rules import SCHEDULE_ORDER
from optimus_egg.saturate import Limits
from optimus_egg.to_fx import add_biases_per_row, biases_stacked

__all__ = ["STEP_BUDGET_S", "STEP_LIMITS", "GreedyReport", "GreedyStep", "rewrite_greedily"]

# Families whose rules only derive facts (they rewrite nothing); enabled in every step.
FACTS = ("pieces",)
STEP_BUDGET_S = 30.0  # generous: one round always finishes well within it
STEP_LIMITS = Limits(iterations=1, horizontal_rounds=1)


@dataclass
class GreedyStep:
    """One family's single round, committed: its family, pass (1-based) and optimize report."""
    family: str
    pass_no: int
    report: Report

    @property
    def changed(self) -> bool:
        return self.report.changed


@dataclass
class GreedyReport:
    """What rewrite_greedily did; stored on the result as gm.meta["optimus_egg_greedy"].

    ``cost_before`` / ``cost_after`` are the cost (pipeline.Report) of the input and of the result (the
    first and last steps' reports); ``matches`` sums every step's matches per rule;
    ``egraph_nodes`` is the largest e-graph a step built and ``iterations`` the saturation
    rounds run over all steps; ``stop_reason`` is "fixpoint" (a whole pass changed nothing) or
    "max_passes"; ``fallback`` the first step that fell back to its input, if any, and
    ``kept_input`` the first that kept its input although it found a cheaper graph.
    """
    steps: list[GreedyStep] = field(default_factory=list)
    passes: int = 0
    seconds: float = 0.0
    stop_reason: str = "not_run"
    matches: dict[str, int] = field(default_factory=dict)

    @property
    def cost_before(self) -> float:
        return self.steps[0].report.cost_before

    @property
    def cost_after(self) -> float:
        return self.steps[-1].report.cost_after

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    @property
    def egraph_nodes(self) -> int:
        return max(s.report.egraph_nodes for s in self.steps)

    @property
    def iterations(self) -> int:
        return sum(s.report.iterations for s in self.steps)

    @property
    def fallback(self) -> str | None:
        return next((f"{s.family}: {s.report.fallback}" for s in self.steps if s.report.fallback), None)

    @property
    def kept_input(self) -> str | None:
        return next((f"{s.family}: {s.report.kept_input}" for s in self.steps if s.report.kept_input), None)

    def __str__(self) -> str:
        fired = ", ".join(f"{k}={v}" for k, v in sorted(self.matches.items()) if v) or "none"
        taken = ", ".join(f"{s.family}@{s.pass_no} {s.report.cost_before:.0f}->{s.report.cost_after:.0f}"
                          for s in self.steps if s.changed) or "none"
        return (f"optimus_egg greedy: cost {self.cost_before:.2f} -> {self.cost_after:.2f}, "
                f"{self.passes} passes ({self.stop_reason}), {self.seconds:.2f} s\n"
                f"  steps that changed the graph: {taken}\n  rules fired: {fired}")


def rewrite_greedily(gm: fx.GraphModule, example_inputs, *, max_passes: int = 4,
                     strict: bool = False, gemm_loops: bool = False, training: bool | None = None,
                     hoisted: bool = False) -> fx.GraphModule:
    """Rewrite ``gm`` one rule family at a time, committing each family's result; same values.

    Each step is ``optimize(current, example_inputs, budget_s=STEP_BUDGET_S, disable=[every
    other family], limits=STEP_LIMITS)``: one saturation round of one family (vertical families
    run to their own fixpoint inside the round) and its extraction, taken only if cheaper, as
    optimize always does. Passes over ``SCHEDULE_ORDER`` repeat until a pass changes nothing or
    ``max_passes`` passes ran. Between steps a batch's biases stay stacked (to_fx
    ``biases_stacked``), so a later step reads the batch whole; the result adds them per row
    where optimize's own result would. Bad arguments raise TypeError / ValueError (the first step's
    optimize checks ``gm`` and ``example_inputs``); ``strict``, ``gemm_loops``, ``training`` and
    ``hoisted`` are passed to every step. The
    result carries a ``GreedyReport`` in ``meta["optimus_egg_greedy"]``.
    """
    if isinstance(max_passes, bool) or not isinstance(max_passes, int):
        raise TypeError(f"max_passes must be an int, got {type(max_passes).__name__}")
    if max_passes < 1:
        raise ValueError(f"max_passes must be >= 1, got {max_passes}")
    families = [f for f in SCHEDULE_ORDER if f not in FACTS]
    report = GreedyReport()
    matches: Counter[str] = Counter()
    start = time.perf_counter()
    current = gm
    with biases_stacked():  # a later step lowers an earlier step's batches again
        while report.passes < max_passes:
            report.passes += 1
            changed = False
            for family in families:
                keep = {family, *FACTS}
                current = optimize(current, example_inputs, STEP_BUDGET_S, strict=strict,
                                   disable=[f for f in SCHEDULE_ORDER if f not in keep], limits=STEP_LIMITS,
                                   gemm_loops=gemm_loops, training=training, hoisted=hoisted)
                step = GreedyStep(family, report.passes, current.meta.pop("optimus_egg"))
                report.steps.append(step)
                matches.update(step.report.matches)
                changed |= step.changed
            if not changed:
                report.stop_reason = "fixpoint"
                break
        else:
            report.stop_reason = "max_passes"
    current = add_biases_per_row(current)  # as optimize's to_fx does, once
    report.matches = dict(matches)
    report.seconds = time.perf_counter() - start
    current.meta["optimus_egg_greedy"] = report
    return current
