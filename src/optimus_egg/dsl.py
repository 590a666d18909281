"""Rule-writing helpers: every rewrite carries a name into RunReport.num_matches_per_rule."""
from __future__ import annotations

from egglog import rule, union


def rw(name: str, lhs, rhs, *guards):
    """`lhs -> rhs` when every guard holds, as a named rule."""
    return rule(lhs, *guards, name=name).then(union(lhs).with_(rhs))

