"""Every rule has a test named after it, and rules/README.md lists every rule."""
import pathlib
import re

import pytest

from optimus_egg.rules import SCHEDULE_ORDER, rule_names, rules_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("family", SCHEDULE_ORDER)
def test_every_rule_has_a_test(family):
    tests = (ROOT / "tests" / "rules" / f"test_{family}.py").read_text()
    defined = set(re.findall(r"^def (test_\w+)\(", tests, flags=re.M))
    missing = [n for n in rule_names(family) if f"test_{n.replace('-', '_').replace('/', '_')}" not in defined]
    assert not missing, f"rules without a test in tests/rules/test_{family}.py: {missing}"


def test_rule_names_unique():
    names = [n for f in SCHEDULE_ORDER for n in rule_names(f)]
    assert len(names) == len(set(names))


def test_every_rule_says_what_it_mirrors():
    assert "| ? |" not in rules_table()


def test_rules_readme_is_current():
    readme = (ROOT / "rules" / "README.md").read_text()
    assert rules_table() in readme, "rules/README.md is stale: regenerate with `python -m optimus_egg.rules`"
