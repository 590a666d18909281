"""Find the rule that changes a model's values (like Optimus's bisection controls)."""
from __future__ import annotations

import torch.fx as fx

from optimus_egg.pipeline import _same_values, optimize
from optimus_egg.rules import SCHEDULE_ORDER, rule_names


def bisect(gm: fx.GraphModule, example_inputs, budget_s: float = 1.0) -> str | None:
    """The rule whose removal gives back gm's values on example_inputs.

    With the whole library on, leaves out one family at a time, then one rule at a time
    inside the first family whose removal restores the values (rules pay off together, so
    removing one is a better probe than enabling one alone). Returns the rule's name (see
    rules/README.md); the family's name when no single rule of it is enough; "interaction"
    when no single family is; None when the values are right.
    """
    inputs = list(example_inputs)

    def breaks(disable) -> bool:
        return not _same_values(gm, optimize(gm, inputs, budget_s, strict=True, disable=disable), inputs)

    if not breaks([]):
        return None
    for family in SCHEDULE_ORDER:
        if family == "pieces" or breaks([family]):  # pieces: facts only, never a rewrite
            continue
        for rule in rule_names(family):
            if not breaks([rule]):
                return rule
        return family
    return "interaction"
