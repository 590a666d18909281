"""What every bench/<family>.py script shares: run one module under Inductor + PyTorch's Optimus
and under optimus_egg (plain Inductor alongside, for reference), check every arm against eager,
time them, and record one row per arm.

    python bench/batch_linear.py [--rounds 50] [--results bench/results/families.csv]
    python bench/families.py                     # all ten, then the table

A family script defines ``FAMILY`` (a name in ``optimus_egg.rules.SCHEDULE_ORDER``), ``MODEL``
(a short name for its module) and ``make()`` (a fresh module and its example inputs), and
calls ``main``. ``run`` traces the module (symbolic_trace, eval mode) and builds three arms:

* ``inductor``     the traced graph as it is, ``measure.compile_inductor`` (the reference)
* ``optimus``      ``baselines.inductor_with_optimus(gm, inputs)`` (pre-grad passes, and the
                   post-grad ATen ones at compile), then ``measure.compile_inductor``
* ``optimus_egg``  ``optimize(gm, inputs, budget_s=1.0)``, then ``measure.compile_inductor``

with one torch thread throughout and one uncounted warm-up compile per process
(``bench.warm_up_inductor``). Latency is the median of interleaved rounds
(``measure.interleaved_medians``). The rows go to ``bench/results/families.csv``, replacing
that family's earlier rows. ``main`` fails (non-zero exit, message on stderr) unless every arm
matches eager and the optimus_egg arm's rule counters show a rule of the family fired: a family
script whose family does not fire measures nothing.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import torch
from optimus_egg.rules import SCHEDULE_ORDER, rule_names
from torch import fx, nn

from optimus_egg import measure
from optimus_egg.baselines import OPTIMUS_POST_GRAD, inductor_with_optimus
from optimus_egg.bench import VALUE_TOL, one_thread, warm_up_inductor
from optimus_egg.pipeline import optimize

RESULTS = Path(__file__).resolve().parent / "results" / "families.csv"
BUDGET_S = 1.0
ARMS = ("inductor", "optimus", "optimus_egg")
# No "mode" column: optimus_egg.bench.read_results (the README table) skips this file.
COLUMNS = ["family", "model", "arm", "fx_nodes", "ms", "launches", "extern", "kernels",
           "optimize_s", "compile_s", "values_match", "family_fired", "rule_counters",
           "threads", "rounds"]

Make = Callable[[], "tuple[nn.Module, tuple[torch.Tensor, ...]]"]


def _counters(counts: dict[str, int]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(counts.items()) if v)


def run(family: str, model_name: str, make: Make, *, rounds: int = 50,
        out: TextIO | None = None) -> list[dict]:
    """One row per arm (``COLUMNS``) for the module ``make()`` builds; nothing written."""
    from torch._dynamo.utils import counters as dynamo_counters

    if family not in SCHEDULE_ORDER:
        raise ValueError(f"unknown family {family!r}; families: {list(SCHEDULE_ORDER)}")
    out = out or sys.stdout
    with one_thread():
        torch.manual_seed(0)
        model, inputs = make()
        model.eval()
        inputs = list(inputs)
        gm = fx.symbolic_trace(model)
        with torch.no_grad():
            expected = model(*inputs)
        warm_up_inductor(False)

        graphs, seconds = {"inductor": gm}, {"inductor": 0.0}
        t = time.perf_counter()
        graphs["optimus"] = inductor_with_optimus(gm, inputs)
        seconds["optimus"] = time.perf_counter() - t
        t = time.perf_counter()
        graphs["optimus_egg"] = optimize(gm, inputs, budget_s=BUDGET_S)
        seconds["optimus_egg"] = time.perf_counter() - t
        report = graphs["optimus_egg"].meta["optimus_egg"]
        family_rules = set(rule_names(family))

        rows, fns = [], {}
        for arm in ARMS:
            dynamo_counters["inductor"].clear()
            c = measure.compile_inductor(graphs[arm], inputs)
            counts, fired = {}, ""
            if arm == "optimus":
                counts = dict(graphs[arm].meta.get("optimus_counters", {}))
                counts.update({k: v for k, v in dynamo_counters["inductor"].items() if k in OPTIMUS_POST_GRAD and v})
            elif arm == "optimus_egg":
                counts = dict(report.matches)
                fired = any(counts.get(r, 0) > 0 for r in family_rules)
            fns[arm] = c.fn
            rows.append({
                "family": family, "model": model_name, "arm": arm, "fx_nodes": len(gm.graph.nodes), "ms": None,
                "launches": c.launches.total, "extern": c.launches.extern,
                "kernels": c.launches.cpp + c.launches.triton + c.launches.fallback,
                "optimize_s": round(seconds[arm], 3), "compile_s": round(c.compile_s, 2),
                "values_match": measure.values_match(c.fn(*inputs), expected, **VALUE_TOL),
                "family_fired": fired, "rule_counters": _counters(counts), "threads": 1, "rounds": rounds,
            })
            print(f"  {family} / {arm}: {c.launches}, compile {c.compile_s:.1f} s", file=out, flush=True)
        medians = measure.interleaved_medians(fns, inputs, rounds=rounds)
    for row in rows:
        row["ms"] = round(medians[row["arm"]], 4)
    return rows


def problems(rows: Sequence[dict]) -> list[str]:
    """Why these rows do not count: values that differ from eager, a family that did not fire."""
    bad = [f"{r['family']}: {r['arm']} values differ from eager" for r in rows if r["values_match"] is not True]
    bad += [f"{r['family']}: no rule of the family fired in optimus_egg (counters: {r['rule_counters'] or 'none'})"
            for r in rows if r["family_fired"] is False]
    return bad


def read(path: Path = RESULTS) -> list[dict]:
    """The rows of the CSV at ``path`` (strings, as csv reads them); none if it does not exist."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write(rows: Sequence[dict], path: Path = RESULTS) -> Path:
    """Replace the rows of the families in ``rows`` in the CSV at ``path``, keeping the others;
    rows are kept in SCHEDULE_ORDER, then arm order."""
    families = {r["family"] for r in rows}
    kept = [r for r in read(path) if r["family"] not in families]
    order = {f: i for i, f in enumerate(SCHEDULE_ORDER)}
    merged = sorted([*kept, *rows], key=lambda r: (order.get(r["family"], len(order)), ARMS.index(r["arm"])))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(merged)
    return path


def table(rows: Sequence[dict]) -> str:
    """A Markdown table: one line per family, the arms side by side, and the matches of the
    family's own rules in the optimus_egg arm (the CSV keeps every counter)."""
    by = {(r["family"], r["arm"]): r for r in rows}
    names = {"inductor": "Inductor", "optimus": "Optimus", "optimus_egg": "egg"}
    lines = ["| family | model | FX nodes | " + " | ".join(f"launches {names[a]}" for a in ARMS) + " | "
             + " | ".join(f"ms {names[a]}" for a in ARMS) + " | values | family's rules fired (egg) |",
             "| --- " * (5 + 2 * len(ARMS)) + "|"]
    for family in dict.fromkeys(r["family"] for r in rows):
        arms = [by.get((family, a)) for a in ARMS]
        if None in arms:
            continue
        own = set(rule_names(family))
        fired = [c for c in arms[-1]["rule_counters"].split(";") if c.split("=")[0] in own]
        values = "match" if all(str(r["values_match"]) == "True" for r in arms) else "DIFFER"
        lines.append(f"| {family} | {arms[0]['model']} | {arms[0]['fx_nodes']} | "
                     + " | ".join(str(r["launches"]) for r in arms) + " | "
                     + " | ".join(f"{float(r['ms']):.3f}" for r in arms)
                     + f" | {values} | {', '.join(fired) or 'none'} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rounds", type=int, default=50, help="interleaved timing rounds (default 50)")
    p.add_argument("--results", type=Path, default=RESULTS, help=f"CSV to update (default {RESULTS})")
    return p.parse_args(argv)


def main(family: str, model_name: str, make: Make, argv: Sequence[str] | None = None) -> int:
    """Run one family script: rows to the CSV, the table on stdout; SystemExit on a problem."""
    args = parse_args(argv, f"bench the {family} family: Inductor + Optimus vs optimus_egg")
    rows = run(family, model_name, make, rounds=args.rounds)
    print(f"wrote {write(rows, args.results)}\n\n{table(rows)}")
    if bad := problems(rows):
        raise SystemExit("\n".join(bad))
    return 0
