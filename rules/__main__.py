"""python -m optimus_egg.rules: print the rule table for rules/README.md."""
from optimus_egg.rules import rules_table

print(rules_table(), end="")
