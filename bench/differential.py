"""optimus_egg against its own rules applied greedily (the ablation), on random programs: where
the ablation's graph is cheaper under the cost model, compile all three graphs (input,
optimus_egg, ablation) with Inductor and the backend's CPU kernel order
(src/optimus_egg/kernel_order.py) and count launches; the summary also says how often the
fusion estimate (extract/fusion_cost.py, optimize()'s last check, which counts that order)
predicted those counts.

    python bench/differential.py [--seed 1] [--programs 150] [--all] [--optimus] [--train]

Programs are the fuzz suite's (tests/test_fuzz.py `programs()`), drawn with a fixed hypothesis
seed, traced with symbolic_trace, optimized at 2 s. A program where the ablation is cheaper
points at an equality the e-graph lacks (how masknet's missing `even_split` fact was found) or
at a blind spot of the cost model; the launch columns say which. `--all` compiles every
program, not only those. `--optimus` compiles a fourth graph per program, PyTorch's Optimus
(its pre-grad passes, as the bench's inference arm: `baselines.inductor_with_optimus(...,
post_grad=False)`, without the kernel order), and counts the programs where it launches fewer
than optimus_egg, where its passes raise, or where its graph computes other values than the
program (torch 2.13's `unbind_stack_to_slices_pass` stacks unbound items in their unbind order, whatever order the
stack has them in; compared where the program draws nothing random); the last two are left
out of the comparison. `--train` compiles every graph for training (forward and backward, one
backward of the outputs' sum): optimus_egg's and the ablation's as the backend compiles them
(`baselines.as_backend_compiles`: the post-grad passes too; not the GEMM loops, which this
search prices without, `optimize`'s default), Optimus's with its post-grad
passes too, as the bench's training arm; the fusion estimate, a forward-only figure, is then left out. Prints one row per
compiled program (flagged ones, the estimate's misses and the ablation's cheaper graphs among them, with the program) and a
summary.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from torch import fx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def trains_eagerly(model: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether one eager step on a copy of `model` (the fuzz suite's `_trained`: forward, then
    the backward of the outputs' sum, as compile_inductor trains) runs: autograd rejects some
    in-place steps."""
    from test_fuzz import _trained

    try:
        _trained(model, x, None)
    except RuntimeError:
        return False
    return True


def run(seed: int, programs: int, every: bool, with_optimus: bool = False, train: bool = False) -> None:
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import seed as hypothesis_seed
    from test_fuzz import Program, make_input
    from test_fuzz import programs as program_strategy

    from optimus_egg import optimize
    from optimus_egg.ablation import rewrite_greedily
    from optimus_egg.baselines import as_backend_compiles
    from optimus_egg.bench import fx_shapes
    from optimus_egg.extract.fusion_cost import fused_launches
    from optimus_egg.kernel_order import KERNEL_ORDER
    from optimus_egg.measure import compile_inductor

    def price(gm, x) -> float:
        return optimize(gm, [x], budget_s=0.0).meta["optimus_egg"].cost_before

    rows: list[tuple] = []
    estimates: list[int] = []  # fused_launches - Inductor's launches, per compiled graph
    optimus: list[tuple[int, int | None]] = []  # (optimus_egg's launches, Optimus's or None where it raised or was wrong)
    wrongs: list[bool] = []  # per program: Optimus's graph computes other values than the program
    aliasing: list[bool] = []  # per program: Optimus's outputs alias the input where the program's do not
    layout: list[bool] = []  # per program: Optimus's outputs strided where the program's are contiguous

    def launches_of(g, x) -> int:  # with the backend's CPU kernel order, which the estimate counts
        return compile_inductor(g, [x], training=train, config_patches=KERNEL_ORDER).launches.total

    @settings(max_examples=programs, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(prog=program_strategy())
    def one(prog):
        model = Program(prog).to(prog["dtype"]).eval()
        x = make_input(prog)
        if train and not trains_eagerly(model, x):
            assume(False)  # (autograd rejects an in-place step here: nothing to compare)
        gm = fx.symbolic_trace(model)
        egg, greedy = optimize(gm, [x], budget_s=2.0), rewrite_greedily(gm, [x])
        cost_egg, cost_greedy = price(egg, x), price(greedy, x)
        if not every and cost_greedy >= cost_egg - 1e-6:
            rows.append((cost_egg, cost_greedy, None))
            return
        if train:
            egg, greedy = as_backend_compiles(egg, gemm_loops=False), as_backend_compiles(greedy, gemm_loops=False)
        launches = [launches_of(g, x) for g in (gm, egg, greedy)]
        rows.append((cost_egg, cost_greedy, launches))
        off = [] if train else [fused_launches(g, fx_shapes(g, [x])) - n for g, n in zip((gm, egg, greedy), launches)]
        estimates.extend(off)
        flag = ("  optimus_egg above its input" if launches[1] > launches[0] else
                "  ablation fewer" if launches[2] < launches[1] else "")
        if cost_greedy < cost_egg - 1e-6:
            flag += "  ablation cheaper"
        if any(off):  # the estimate minus the launches, per graph
            flag += "  estimate off (input / egg / ablation: " + " / ".join(f"{d:+d}" for d in off) + ")"
        extra = ""
        if with_optimus:
            n, wrong, aliases, strided = optimus_row(gm, x, train)
            optimus.append((launches[1], None if wrong else n))
            wrongs.append(wrong)
            aliasing.append(aliases and not wrong)
            layout.append(strided and not wrong and not aliases)
            extra = f" Optimus {n if n is not None else '-':>3}"
            if wrong:
                flag += "  Optimus computes other values"
            elif n is None or n < launches[1]:
                flag += "  Optimus raised" if n is None else "  Optimus fewer"
            if aliases:
                flag += "  Optimus's outputs alias the input"
            if strided:
                flag += "  Optimus's outputs strided"
        print(f"cost egg {cost_egg:8.3f} ablation {cost_greedy:8.3f}   launches input {launches[0]:3d} "
              f"egg {launches[1]:3d} ablation {launches[2]:3d}{extra}{flag}", flush=True)
        if flag:
            print(f"    program: {prog}", flush=True)

    one()
    compiled = [r[2] for r in rows if r[2] is not None]
    cheaper = sum(1 for r in rows if r[1] < r[0] - 1e-6)
    print(f"\n{len(rows)} programs; the ablation cheaper under the cost model on {cheaper}; compiled {len(compiled)}: "
          f"optimus_egg fewer launches than the ablation on {sum(e < g for _, e, g in compiled)}, "
          f"equal on {sum(e == g for _, e, g in compiled)}, more on {sum(e > g for _, e, g in compiled)}; "
          f"above its input on {sum(e > i for i, e, _ in compiled)}")
    if not train:
        print(f"fusion estimate (extract/fusion_cost.py) on the {len(estimates)} compiled graphs: exact on "
              f"{estimates.count(0)}, over on {sum(d > 0 for d in estimates)}, under on {sum(d < 0 for d in estimates)}")
    if with_optimus:
        ran = [(e, o) for e, o in optimus if o is not None]
        more_aliasing = sum(e > o for (e, o), a in zip(optimus, aliasing) if o is not None and a)
        more_strided = sum(e > o for (e, o), a in zip(optimus, layout) if o is not None and a)
        print(f"PyTorch's Optimus on the {len(optimus)} compiled programs: raised on {len(optimus) - len(ran) - sum(wrongs)}, "
              f"other values than the program on {sum(wrongs)} (both left out); "
              f"optimus_egg fewer launches on {sum(e < o for e, o in ran)}, equal on {sum(e == o for e, o in ran)}, "
              f"more on {sum(e > o for e, o in ran)} ({more_aliasing} of them where Optimus's outputs alias the input, "
              f"which optimus_egg copies; {more_strided} where they are strided and the program's contiguous, which "
              f"optimus_egg keeps contiguous); launches in all {sum(e for e, _ in ran)} vs {sum(o for _, o in ran)}")


def optimus_row(gm: fx.GraphModule, x: torch.Tensor, train: bool = False) -> tuple[int | None, bool, bool, bool]:
    """PyTorch's Optimus on program `gm`: its launches (None where its passes raised), whether
    its graph computes other values than the program (checked where the program draws nothing
    random), whether its outputs alias the input where the program's do not
    (measure.aliased_outputs: optimus_egg copies such outputs, a launch each), and whether an
    output is strided where the program's is contiguous (optimus_egg makes such outputs
    contiguous: pipeline.keep_contiguous_outputs)."""
    from optimus_egg.baselines import inductor_with_optimus
    from optimus_egg.from_fx import draws_random
    from torch.utils._pytree import tree_leaves

    from optimus_egg.measure import aliased_outputs, compile_inductor, values_match

    try:
        c = compile_inductor(inductor_with_optimus(gm, [x], post_grad=train), [x], training=train)
    except Exception as e:  # noqa: BLE001 (Optimus's passes are not optimus_egg's to fix: count, go on)
        print(f"    Optimus raised {type(e).__name__}: {str(e)[:120]}", flush=True)
        return None, False, False, False
    with torch.no_grad():
        xo, xe = x.clone(), x.clone()
        theirs, eager = c.fn(xo), gm(xe)
    aliases = aliased_outputs(theirs, [xo]) > aliased_outputs(eager, [xe])
    strided = any(isinstance(t, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_contiguous()
                  and not t.is_contiguous() for t, e in zip(tree_leaves(theirs), tree_leaves(eager)))
    modules = dict(gm.named_modules())
    if any(draws_random(n, modules) for n in gm.graph.nodes):
        return c.launches.total, False, aliases, strided
    return c.launches.total, not values_match(theirs, eager, equal_nan=True), aliases, strided


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--programs", type=int, default=150)
    ap.add_argument("--all", action="store_true", help="compile every program, not only where the ablation is cheaper")
    ap.add_argument("--optimus", action="store_true", help="also compile PyTorch's Optimus (pre-grad passes) per program")
    ap.add_argument("--train", action="store_true", help="compile for training: forward and backward")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    run(a.seed, a.programs, a.all, a.optimus, a.train)


if __name__ == "__main__":
    main()
