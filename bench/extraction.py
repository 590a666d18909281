"""Extraction quality: greedy vs exact ILP on every bench model's saturated e-graph, and how
well the launch cost model ranks graphs by the launches Inductor really makes.

    python bench/extraction.py                  # every model but illustrative_10k
    python bench/extraction.py --models dlrm,hstu --ilp-limit 10
    python bench/extraction.py --random 67 --programs 40   # random programs instead

Part 1, per model: saturate at budget 1 s (the rules and limits optimize() uses), then
extract with extract.greedy and with extract.ilp (HiGHS, --ilp-limit seconds, default 10).
Printed: both objectives (launch cost + the tie-breakers both extractors minimize: 0.001
per chosen node and the work term, extract/work.py), the launch part alone, and greedy / ILP (1.000 = greedy is optimal;
above 1 = greedy loses; an ILP stopped by its time limit is only an upper bound, marked *;
it starts from greedy's choice, so it never ends above greedy).

Part 2, Spearman rank correlation between predicted and measured launches over every
(model, arm) of the float32 inference results in bench/results/<model>.csv (run
`optimus-egg bench --all` first). Predicted = what optimize() would report as cost_after,
re-derived here: the greedy DAG cost of the arm's extraction with the tie-breakers
removed (plain Inductor: the unsaturated graph; optimus_egg@b: saturation at budget b;
greedy_rules: the input-graph cost of rewrite_greedily's result), with optimize()'s never-worse rule: the per-node
extraction objective (extract/launch_cost.py). Budget-limited searches are re-run, so they
may stop at another iteration than the measured run did. A second figure uses the suite's
own pred_launches column: the whole-graph estimate with Inductor's fusion
(extract/fusion_cost.py) evaluated on each arm's output graph, Optimus's included; a third
("now") that estimate as it is now, against each arm's graph compiled here with the CPU
kernel order (src/optimus_egg/kernel_order.py), as the backend compiles, which is what the
estimate predicts ("ordered"), and against the bench's measured launches (the kernel order in
the optimus_egg arms only). The optimus_egg and greedy-rules arms are priced and compiled as
the bench's are, with the backend's GEMM loops (src/optimus_egg/gemm_loops.py) and their
parameter copies computed once (src/optimus_egg/hoist.py; `optimize(..., hoisted=True)`). Spearman is computed with numpy (scipy is not installed):
Pearson correlation of average ranks.

With `--random SEED`, instead: greedy vs ILP on the saturated e-graphs (budget 2 s, as
bench/differential.py optimizes) of `--programs` random programs of tests/test_fuzz.py's
strategy (hypothesis seed SEED, the programs differential.py draws for that seed); each
program where greedy's cost is more than 0.01 above ILP's is printed, then a summary.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.fx as fx

from optimus_egg import optimize
from optimus_egg.ablation import rewrite_greedily
from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
from optimus_egg.bench import (GREEDY_RULES, default_models, device_of, dtype_of, predicted_launches, read_results,
                               spearman)
from optimus_egg.extract.graph import serialize
from optimus_egg.extract.greedy import greedy
from optimus_egg.extract.ilp import ilp
from optimus_egg.from_fx import from_fx
from optimus_egg.kernel_order import KERNEL_ORDER
from optimus_egg.measure import compile_inductor
from optimus_egg.shapes import check_inputs
from optimus_egg.models import build
from optimus_egg.pipeline import fixed_leaves, node_cost
from optimus_egg.rules import RULESETS, SCHEDULE_ORDER
from optimus_egg.saturate import Limits, saturate

RESULTS = Path(__file__).resolve().parent / "results"


def launches(g, cost, ex, launch_cost) -> float:
    """An extraction's launch cost without the tie-breakers (EPS per node, work)."""
    return float(sum(launch_cost(g.nodes[k]) for k in ex.choice.values()))


def traced(name: str):
    model, inputs = build(name)
    model.eval()
    gm = fx.symbolic_trace(model)
    return gm, check_inputs(gm, list(inputs))


def saturated(gm, inputs, budget_s: float, limits: Limits | None = None, gemm_loops: bool = False,
              hoisted: bool = False):
    """The pipeline up to extraction: (before, after) as (graph, cost fn, greedy extraction,
    launch-only cost fn); priced for the GEMM loops where `gemm_loops` and with the parameter
    copies computed once where `hoisted`, as optimize() is."""
    lowered = from_fx(gm, inputs, seed_groups=budget_s > 0, gemm_loops=gemm_loops)
    if hoisted:
        lowered.fixed_leaves = fixed_leaves(lowered, inputs)
    g0 = serialize(lowered.egraph)
    c0 = node_cost(lowered, g0)
    before = (g0, c0, greedy(g0, c0), node_cost(lowered, g0, with_work=False))
    if budget_s == 0:
        return before, before, None
    rulesets = {n: RULESETS[n] for n in SCHEDULE_ORDER}
    sat = saturate(lowered.egraph, rulesets, limits or Limits(), time.perf_counter() + budget_s)
    g1 = serialize(lowered.egraph)
    c1 = node_cost(lowered, g1)
    return before, (g1, c1, greedy(g1, c1), node_cost(lowered, g1, with_work=False)), sat


def predicted(gm, inputs, budget_s: float, limits: Limits | None = None, gemm_loops: bool = False,
              hoisted: bool = False) -> float:
    before, after, _ = saturated(gm, inputs, budget_s, limits, gemm_loops, hoisted)
    if after[2].cost >= before[2].cost - 1e-9:  # optimize() keeps the input graph
        return launches(*before)
    return launches(*after)


def part1(models: list[str], ilp_limit: float) -> None:
    print(f"Part 1: greedy vs ILP on the e-graph saturated at budget 1 s (ILP limit {ilp_limit:g} s)")
    head = (f"{'model':<17}{'e-nodes':>8}{'classes':>8}  {'stop':<10}{'greedy':>9}{'ILP':>10}{'greedy/ILP':>11}"
            f"{'greedy L':>9}{'ILP L':>7}{'greedy s':>9}{'ILP s':>7}")
    print(head + "\n" + "-" * len(head), flush=True)
    ratios = []
    for name in models:
        gm, inputs = traced(name)
        _, (g, cost, gr, lc), sat = saturated(gm, inputs, 1.0)
        t = time.perf_counter()
        greedy(g, cost)
        greedy_s = time.perf_counter() - t
        res = ilp(g, cost, ilp_limit, start=gr)  # greedy's choice as HiGHS's first solution
        n_nodes = sum(len(v) for v in g.classes.values())
        if res.extraction is None:
            print(f"{name:<17}{n_nodes:>8}{len(g.classes):>8}  {sat.stop_reason:<10}{gr.cost:>9.3f}"
                  f"{'none':>10}{'-':>11}{launches(g, cost, gr, lc):>9.2f}{'-':>7}{greedy_s:>9.2f}{res.seconds:>7.1f}",
                  flush=True)
            continue
        ratio = gr.cost / res.extraction.cost
        ratios.append(ratio)
        mark = "" if res.optimal else "*"
        print(f"{name:<17}{n_nodes:>8}{len(g.classes):>8}  {sat.stop_reason:<10}{gr.cost:>9.3f}"
              f"{res.extraction.cost:>9.3f}{mark:1}{ratio:>11.3f}{launches(g, cost, gr, lc):>9.2f}"
              f"{launches(g, cost, res.extraction, lc):>7.2f}{greedy_s:>9.2f}{res.seconds:>7.1f}", flush=True)
    if ratios:
        print(f"greedy/ILP: geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}, "
              f"worst {max(ratios):.4f}  (* = ILP hit its time limit: not proven optimal)\n")


def part2(models: list[str]) -> None:
    rows = [r for r in read_results(RESULTS)
            if r["mode"] == "infer" and device_of(r) == "cpu" and dtype_of(r) == "float32" and r["model"] in models
            and r["launches"]]
    if not rows:
        print(f"Part 2: no inference results in {RESULTS}; run `optimus-egg bench --all` first")
        return
    print(f"Part 2: predicted vs Inductor-measured launches ({len(rows)} inference rows from {RESULTS})")
    pairs, pairs_col, pairs_now, pairs_plain = [], [], [], []
    per_model: dict[str, list[tuple[float, float]]] = {}
    head = f"{'model':<17}{'arm':<20}{'predicted':>10}{'pred_launches':>14}{'now':>6}{'ordered':>9}{'measured':>9}"
    print(head + "\n" + "-" * len(head), flush=True)
    cache: dict[str, tuple] = {}
    for r in rows:
        name, arm = r["model"], r["arm"]
        if name not in cache:
            cache[name] = traced(name)
        gm, inputs = cache[name]
        if arm == "inductor":
            pred, graph = predicted(gm, inputs, 0.0), gm
        elif arm.startswith("optimus_egg@"):
            b = float(arm[len("optimus_egg@"):-1])
            pred = predicted(gm, inputs, b, gemm_loops=True, hoisted=True)  # the bench's arms: as the backend
            graph = as_backend_compiles(optimize(gm, inputs, budget_s=b, gemm_loops=True, training=False,
                                                 hoisted=True))
        elif arm == GREEDY_RULES:
            graph = as_backend_compiles(rewrite_greedily(gm, inputs, gemm_loops=True, training=False, hoisted=True))
            pred = predicted(graph, inputs, 0.0, gemm_loops=True, hoisted=True)
        else:
            pred = math.nan  # Optimus's graph has no optimize() report
            graph = inductor_with_optimus(gm, inputs, post_grad=False)
        measured = float(r["launches"])
        # the estimate predicts launches as the backend compiles: with the kernel order
        ordered = float(compile_inductor(graph, inputs, config_patches=KERNEL_ORDER).launches.total)
        col = float(r["pred_launches"]) if r.get("pred_launches") not in (None, "", "nan") else math.nan
        loops = arm != "inductor" and arm != "optimus"
        now = predicted_launches(graph, inputs, loops, loops)  # the fusion estimate as it is now, on the arm's graph
        if not math.isnan(pred):
            pairs.append((pred, measured))
            per_model.setdefault(name, []).append((pred, measured))
        if not math.isnan(col):
            pairs_col.append((col, measured))
        if not math.isnan(now):
            pairs_now.append((now, ordered))
            pairs_plain.append((now, measured))
        print(f"{name:<17}{arm:<20}{pred:>10.2f}{col:>14.2f}{now:>6.0f}{ordered:>9.0f}{measured:>9.0f}", flush=True)
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
    rho_col = spearman([p for p, _ in pairs_col], [m for _, m in pairs_col])
    rho_now = spearman([p for p, _ in pairs_now], [m for _, m in pairs_now])
    rho_plain = spearman([p for p, _ in pairs_plain], [m for _, m in pairs_plain])
    within = {m: spearman([p for p, _ in v], [x for _, x in v]) for m, v in per_model.items()}
    defined = [v for v in within.values() if not math.isnan(v)]
    print(f"\nSpearman(predicted cost_after, measured launches), Inductor + optimus_egg arms, "
          f"n={len(pairs)}: {rho:.3f}")
    print(f"Spearman(pred_launches column = fusion-aware estimate, measured launches), every arm incl. Optimus, "
          f"n={len(pairs_col)}: "
          f"{rho_col:.3f}")
    print(f"Spearman(now = the fusion-aware estimate recomputed on each arm's graph, ordered = its launches "
          f"compiled with the kernel order, as the backend compiles), every arm incl. Optimus, n={len(pairs_now)}: "
          f"{rho_now:.3f} (exact on {sum(p == m for p, m in pairs_now)})")
    print(f"Spearman(now, measured = the bench's launches, the kernel order in the optimus_egg arms only), "
          f"n={len(pairs_plain)}: {rho_plain:.3f} (exact on {sum(p == m for p, m in pairs_plain)})")
    print("within each model (arms only; nan = all arms tie): "
          + ", ".join(f"{m} {v:.2f}" for m, v in within.items())
          + (f"; mean of defined {sum(defined) / len(defined):.3f}" if defined else ""))


def random_gaps(seed: int, programs: int, ilp_limit: float) -> list[float]:
    """Greedy's cost minus ILP's on each random program's saturated e-graph (--random)."""
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests")]
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from test_fuzz import Program, make_input
    from test_fuzz import programs as program_strategy

    gaps: list[float] = []

    @settings(max_examples=programs, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(prog=program_strategy())
    def one(prog):
        model, x = Program(prog).to(prog["dtype"]).eval(), make_input(prog)
        _, (g, cost, gr, _), _ = saturated(fx.symbolic_trace(model), [x], 2.0)
        res = ilp(g, cost, ilp_limit, start=gr)
        gaps.append(gr.cost - res.extraction.cost)
        if gaps[-1] > 0.01:
            mark = "" if res.optimal else " (ILP not proven optimal)"
            print(f"greedy {gr.cost:.3f} ILP {res.extraction.cost:.3f}{mark}\n    program: {prog}", flush=True)

    one()
    print(f"{len(gaps)} programs; greedy above ILP by more than 0.01 on {sum(g > 0.01 for g in gaps)}, "
          f"most {max(gaps, default=0.0):.3f}")
    return gaps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(default_models()))
    ap.add_argument("--ilp-limit", type=float, default=10.0, help="ILP time limit per model, seconds")
    ap.add_argument("--skip-ilp", action="store_true")
    ap.add_argument("--skip-spearman", action="store_true")
    ap.add_argument("--random", type=int, metavar="SEED", help="random programs of this hypothesis seed instead")
    ap.add_argument("--programs", type=int, default=40, help="with --random: how many programs")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.random is not None:
        random_gaps(args.random, args.programs, args.ilp_limit)
        return 0
    models = [m for m in args.models.split(",") if m]
    if not args.skip_ilp:
        part1(models, args.ilp_limit)
    if not args.skip_spearman:
        part2(models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
