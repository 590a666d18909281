"""Find the rule family that changes a model's values (like Optimus's bisection controls)."""
from __future__ import annotations

import torch.fx as fx

from optimus_egg.pipeline import _same_values, optimize
from optimus_egg.rules import SCHEDULE_ORDER


def bisect(gm: fx.GraphModule, example_inputs, budget_s: float = 1.0) -> str | None:
    """The first rule family that, enabled alone, changes gm's values on example_inputs.

    Returns None when every family alone and all of them together preserve the values,
    and "interaction" when only the full library does not.
    """
    inputs = list(example_inputs)
    for family in SCHEDULE_ORDER:
        if family == "pieces":
            continue  # facts only: never changes a graph on its own
        others = [f for f in SCHEDULE_ORDER if f not in (family, "pieces")]
        out = optimize(gm, inputs, budget_s, strict=True, disable=others)
        if not _same_values(gm, out, inputs):
            return family
    out = optimize(gm, inputs, budget_s, strict=True)
    return None if _same_values(gm, out, inputs) else "interaction"
