"""The rule library: one ruleset per rewrite family, and the order saturation runs them in."""
from optimus_egg.rules.batch_layernorm import batch_layernorm
from optimus_egg.rules.batch_linear import batch_linear
from optimus_egg.rules.batch_pointwise import batch_pointwise
from optimus_egg.rules.pieces import pieces
from optimus_egg.rules.split_cat import split_cat
from optimus_egg.rules.unbind_stack import unbind_stack

# Vertical (single-pattern, confluent) families first, then horizontal (group) ones.
VERTICAL = {"pieces": pieces, "split_cat": split_cat, "unbind_stack": unbind_stack}
HORIZONTAL = {"batch_linear": batch_linear, "batch_layernorm": batch_layernorm,
              "batch_pointwise": batch_pointwise}
RULESETS = {**VERTICAL, **HORIZONTAL}
SCHEDULE_ORDER = tuple(RULESETS)

__all__ = ["HORIZONTAL", "RULESETS", "SCHEDULE_ORDER", "VERTICAL"]
