"""Find the rule that changes a model's values (like Optimus's bisection controls)."""
from __future__ import annotations

import torch.fx as fx

from optimus_egg.pipeline import _same_values, optimize
from optimus_egg.rules import SCHEDULE_ORDER, rule_names


def bisect(gm: fx.GraphModule, example_inputs, budget_s: float = 1.0) -> str | None:
    """The rule that, enabled alone (with its family's facts), changes gm's values.

    Searches family by family, then rule by rule inside the first guilty family. Returns the
    rule's name (see rules/README.md); the family's name when only several of its rules
    together change the values; "interaction" when only the full library does; None when
    nothing changes them.
    """
    inputs = list(example_inputs)

    def breaks(disable) -> bool:
        return not _same_values(gm, optimize(gm, inputs, budget_s, strict=True, disable=disable), inputs)

    for family in SCHEDULE_ORDER:
        if family == "pieces":
            continue  # facts only: never changes a graph on its own
        others = [f for f in SCHEDULE_ORDER if f not in (family, "pieces")]
        if not breaks(others):
            continue
        rules = rule_names(family)
        for rule in rules:
            if breaks(others + [r for r in rules if r != rule]):
                return rule
        return family
    return "interaction" if breaks([]) else None
