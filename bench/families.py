"""Run every bench/<family>.py (the families in optimus_egg.rules.SCHEDULE_ORDER) in one process,
update bench/results/families.csv and print the table.

    python bench/families.py [--rounds 50] [--results bench/results/families.csv]

Fails (non-zero exit, reasons on stderr) if any family's values differ from eager or its rules
did not fire in optimus_egg; every family still runs and is written first.
"""
import importlib
import sys

from _family import parse_args, problems, run, table, write
from optimus_egg.rules import SCHEDULE_ORDER


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    rows: list[dict] = []
    for family in SCHEDULE_ORDER:
        script = importlib.import_module(family)
        print(f"{family}: {script.MODEL}", flush=True)
        family_rows = run(family, script.MODEL, script.make, rounds=args.rounds)
        write(family_rows, args.results)
        rows += family_rows
    print(f"\nwrote {args.results}\n\n{table(rows)}")
    if bad := problems(rows):
        raise SystemExit("\n".join(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
