"""The rule library: one ruleset per rewrite family, and the order saturation runs them in."""
from optimus_egg.rules.batch_binary import batch_binary
from optimus_egg.rules.batch_layernorm import batch_layernorm
from optimus_egg.rules.batch_linear import batch_linear
from optimus_egg.rules.batch_linear_lhs import batch_linear_lhs
from optimus_egg.rules.batch_matmul import batch_matmul
from optimus_egg.rules.batch_matmul_lhs import batch_matmul_lhs
from optimus_egg.rules.batch_pointwise import batch_pointwise
from optimus_egg.rules.merge_splits import merge_splits
from optimus_egg.rules.mutate_cat import mutate_cat
from optimus_egg.rules.pieces import pieces
from optimus_egg.rules.split_cat import split_cat
from optimus_egg.rules.unbind_stack import unbind_stack

# Vertical (single-pattern, confluent) families first, then horizontal (group) ones.
VERTICAL = {"pieces": pieces, "split_cat": split_cat, "unbind_stack": unbind_stack, "merge_splits": merge_splits,
            "mutate_cat": mutate_cat}
HORIZONTAL = {"batch_linear_lhs": batch_linear_lhs, "batch_matmul_lhs": batch_matmul_lhs,
              "batch_matmul": batch_matmul,
              "batch_linear": batch_linear, "batch_layernorm": batch_layernorm,
              "batch_pointwise": batch_pointwise, "batch_binary": batch_binary}
RULESETS = {**VERTICAL, **HORIZONTAL}
SCHEDULE_ORDER = tuple(RULESETS)

__all__ = ["HORIZONTAL", "RULESETS", "SCHEDULE_ORDER", "VERTICAL"]


def rule_names(family: str) -> list[str]:
    """Names of the rules in one family, in definition order."""
    rs = RULESETS[family]
    decls = rs.__egg_decls__  # runs the family's registered generators
    return [r.name for r in decls._rulesets[rs.ident].rules]


_WITHOUT: dict[tuple[str, frozenset[str]], object] = {}


def without(family: str, names: frozenset[str]):
    """Family `family` minus the rules `names` (per-rule switches), built once per variant."""
    from egglog import ruleset

    key = (family, frozenset(names))
    if key not in _WITHOUT:
        rs = RULESETS[family]
        decls = rs.__egg_decls__
        variant = ruleset(name=f"{family}-without-{'-'.join(sorted(names))}")
        variant._current_egg_decls.update(decls)
        variant.__egg_ruleset__.rules.extend(r for r in decls._rulesets[rs.ident].rules if r.name not in names)
        _WITHOUT[key] = variant
    return _WITHOUT[key]


def rules_table() -> str:
    """The Markdown table in rules/README.md: every rule, what it mirrors, and its test."""
    import pathlib
    import re

    here = pathlib.Path(__file__).parent
    rows = ["| family | rule | mirrors | test |", "| --- | --- | --- | --- |"]
    for family in SCHEDULE_ORDER:
        src = (here / f"{family}.py").read_text()
        mirrors = {}
        for m in re.finditer(r"# mirrors: (.+)", src):
            name = re.compile(r'(?:rw\(|name=)"([a-z0-9-]+)"').search(src, m.end())
            if name:
                mirrors.setdefault(name.group(1), m.group(1).strip())
        for name in rule_names(family):
            test = f"tests/rules/test_{family}.py::test_{name.replace('-', '_').replace('/', '_')}"
            rows.append(f"| {family} | `{name}` | {mirrors.get(name, '?')} | `{test}` |")
    return "\n".join(rows) + "\n"
