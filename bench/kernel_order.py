"""What the backend's CPU code generation choices add: the kernel order (src/optimus_egg/kernel_order.py)
and small GEMMs as loops (src/optimus_egg/gemm_loops.py); launches with and without them.

    python bench/kernel_order.py                               # the bench models, inference and training
    python bench/kernel_order.py --models dhen,hstu --train    # training only

The optimus_egg backend (and the bench's optimus_egg arms) compile with Inductor's post-grad
passes (baselines.EGG_POST_GRAD) and the kernel order, an Inductor scheduler pass that packs a
CPU graph's code into the fewest C++ kernels; `backend(gemm_loops=True)` adds small GEMMs as
loops. Neither the order nor the loops are a search over rewrites: they would help any graph.
So this prints, per model, the launches of each arm compiled three ways: with neither, with
the kernel order, with the order and the GEMM loops (optimus_egg's parameter copies left per
call, as the other arms': bench/hoist.py gives them all that): plain Inductor, Inductor +
Optimus (its post-grad passes in training, as the bench's Optimus arm), and optimus_egg at 1 s (one
optimized graph, with EGG_POST_GRAD's batching all three ways), and whether each compiled
graph's values (and, in training, every parameter's gradient) equal eager's. Totals at the
end. One torch thread; launches are deterministic, so one run suffices.
"""
from __future__ import annotations

import argparse
import sys


def default_models() -> list[str]:
    """The bench's models, illustrative standing for illustrative_1k (one of a family)."""
    from optimus_egg.bench import default_models as bench_models, family_of

    return list(dict.fromkeys(family_of(m) for m in bench_models()))


ARMS = ["inductor", "optimus", "optimus_egg"]
WAYS = ["neither", "order", "order+loops"]


def run(name: str, train: bool) -> tuple[dict[str, list[int]], bool]:
    """{arm: launches compiled each of WAYS}, and whether all values matched."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
    from optimus_egg.bench import matches_eager, one_thread, traced_with_reference
    from optimus_egg.gemm_loops import GEMM_LOOPS
    from optimus_egg.kernel_order import KERNEL_ORDER
    from optimus_egg.measure import compile_inductor

    with one_thread():
        model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, train)
        egg = optimize(gm, list(inputs), budget_s=1.0, training=train)
        egg_loops = optimize(gm, list(inputs), budget_s=1.0, gemm_loops=True, training=train)  # priced for the loops
        graphs = {"inductor": gm, "optimus": inductor_with_optimus(gm, list(inputs), post_grad=train), "optimus_egg": egg}
        counts, ok = {}, True
        for arm, g in graphs.items():
            counts[arm] = []
            for way in WAYS:
                order = way != "neither"
                loops = {"post_grad_custom_post_pass": GEMM_LOOPS if way == "order+loops" else None}
                if arm == "optimus_egg":  # the backend's config, the order toggled, the loops added
                    g = egg_loops if way == "order+loops" else egg
                    as_backend_compiles(g, kernel_order=order, gemm_loops=way == "order+loops", hoist=False)
                    patches = None
                else:
                    patches = {**KERNEL_ORDER, **loops} if order else None
                # (the forward's config applies to the backward, compiled inside compile_inductor)
                c = compile_inductor(g, inputs, training=train, config_patches=patches)
                ok &= matches_eager(c.fn, inputs, params, expected, expected_grads, train)
                counts[arm].append(c.launches.total)
        return counts, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(default_models()))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", action="store_true", help="training only")
    mode.add_argument("--infer", action="store_true", help="inference only")
    args = p.parse_args(argv)
    modes = [True] if args.train else [False] if args.infer else [False, True]
    totals: dict[tuple[bool, str], list[int]] = {}
    ok = True
    print(f"{'model':<13} {'mode':<5}  " + "  ".join(f"{a + ': ' + ' / '.join(WAYS):>36}" for a in ARMS) + "  values")
    for train in modes:
        for name in args.models.split(","):
            counts, match = run(name, train)
            ok &= match
            cells = []
            for arm in ARMS:
                t = totals.setdefault((train, arm), [0] * len(WAYS))
                t[:] = [a + b for a, b in zip(t, counts[arm])]
                cells.append(f"{' / '.join(f'{c:>3}' for c in counts[arm]):>36}")
            print(f"{name:<13} {'train' if train else 'infer':<5}  " + "  ".join(cells)
                  + f"  {'match' if match else 'VALUES DIFFER'}", flush=True)
    for train in modes:
        t = {a: totals[(train, a)] for a in ARMS}
        egg, opt = t["optimus_egg"][-1], t["optimus"]
        print(f"total {'train' if train else 'infer'} ({' / '.join(WAYS)}): "
              + ", ".join(f"{a} {' / '.join(map(str, t[a]))}" for a in ARMS)
              + f"; optimus_egg as the backend compiles / Optimus with neither {egg / opt[0]:.2f}"
              + f", / Optimus with the order {egg / opt[1]:.2f}, / Optimus with both {egg / opt[2]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
