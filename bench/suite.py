"""Run bench models side by side: plain Inductor, Inductor + Optimus, optimus_egg per budget,
and the greedy ablation ("greedy_rules"); write bench/results/<model>[_train].csv + .json.

    python bench/suite.py parallel_mlp dlrm --budgets 0.01,0.1,1,10 [--train] [--rounds 30]
    python bench/suite.py --all                 # every model but illustrative_10k

One process per model run, one torch thread throughout (see optimus_egg.bench, which holds
the suite so that `optimus-egg compare` / `optimus-egg bench` run the very same code).
The "greedy_rules" arm is optimus_egg.ablation.rewrite_greedily: one rule family at a time,
each step's extraction committed before the next (Optimus-style rewriting, no joint search).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optimus_egg import bench
from optimus_egg.cli import _parse_budgets, _positive_int
from optimus_egg.models import MODELS

RESULTS = Path(__file__).resolve().parent / "results"


def run_model(name: str, budgets=(1.0,), train: bool = False, rounds: int = 30, **kw) -> list[dict]:
    """bench.run_model plus writing bench/results/<model>[_train][_cuda][_bf16].csv and .json."""
    rows = bench.run_model(name, budgets, train=train, rounds=rounds, **kw)
    bench.write_results(rows, RESULTS, bench.result_stem(name, train, kw.get("device", "cpu"), kw.get("dtype", "float32")))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", metavar="MODEL", help=f"any of: {', '.join(MODELS)}")
    p.add_argument("--all", action="store_true", help="every model except illustrative_10k")
    p.add_argument("--budgets", type=_parse_budgets, default=[1.0])
    p.add_argument("--train", action="store_true")
    p.add_argument("--rounds", type=_positive_int, default=30)
    args = p.parse_args(argv)
    models = bench.default_models() if args.all else args.models
    if not models:
        p.error("name at least one model, or --all")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; valid: {', '.join(MODELS)}")
    ok = True
    for name in models:
        rows = run_model(name, args.budgets, args.train, args.rounds)
        bench.print_table(rows)
        print(f"wrote {RESULTS / bench.result_stem(name, args.train)}.csv and .json")
        ok &= all(r["values_match"] is True and r["grads_match"] in ("", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
