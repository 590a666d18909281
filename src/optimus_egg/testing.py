"""Helpers for rule tests: run one ruleset on a traced function and check what happened."""
from __future__ import annotations

import torch
import torch.fx as fx

from optimus_egg.pipeline import optimize
from optimus_egg.rules import RULESETS


def optimize_with(fn, family, *inputs, budget_s: float = 5.0):
    """Trace `fn`, optimize with only `family`'s rules (plus the pieces facts) and check the values.
    `family` may be a tuple of rulesets, for a rule whose result another family finishes.

    Returns (optimized GraphModule, report). The optimized graph's outputs are compared with
    the traced graph's on `inputs` (assert_close), so every caller checks value preservation.
    """
    gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
    families = family if isinstance(family, tuple) else (family,)
    names = {n for n, rs in RULESETS.items() if any(rs is f for f in families)}
    if len(names) != len(families):
        raise ValueError("optimize_with takes rulesets from optimus_egg.rules")
    keep = names | {"pieces"}
    after = optimize(gm, list(inputs), budget_s, strict=True,
                     disable=[n for n in RULESETS if n not in keep])
    with torch.no_grad():
        torch.testing.assert_close(after(*inputs), gm(*inputs), equal_nan=True)
    return after, after.meta["optimus_egg"]


def fired(report, rule_name: str) -> bool:
    return report.matches.get(rule_name, 0) > 0


def calls(gm: fx.GraphModule, target) -> int:
    """Number of call nodes with this target (a function, a method name, or a module type)."""
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is target:
            n += 1
        elif node.op == "call_method" and node.target == target:
            n += 1
        elif node.op == "call_module" and isinstance(target, type) and isinstance(gm.get_submodule(node.target), target):
            n += 1
    return n
