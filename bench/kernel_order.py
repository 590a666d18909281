"""What the CPU kernel order (src/optimus_egg/kernel_order.py) adds: launches with and without it.

    python bench/kernel_order.py                               # the bench models, inference and training
    python bench/kernel_order.py --models dhen,hstu --train    # training only

The optimus_egg backend (and the bench's optimus_egg arms) compile with Inductor's post-grad
passes (baselines.EGG_POST_GRAD) and the kernel order, an Inductor scheduler pass that packs a
CPU graph's code into the fewest C++ kernels. The pass is not a graph rewrite: it would help
any graph. So this prints, per model, the launches of each arm with and without it: plain
Inductor, Inductor + Optimus (its post-grad passes in training, as the bench's Optimus arm),
and optimus_egg at 1 s (one optimized graph, compiled both ways), and whether each compiled
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


def run(name: str, train: bool) -> tuple[dict[str, tuple[int, int]], bool]:
    """{arm: (launches without the kernel order, with it)}, and whether all values matched."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
    from optimus_egg.bench import matches_eager, one_thread, traced_with_reference
    from optimus_egg.kernel_order import KERNEL_ORDER
    from optimus_egg.measure import compile_inductor

    with one_thread():
        model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, train)
        egg = optimize(gm, list(inputs), budget_s=1.0)
        graphs = {"inductor": gm, "optimus": inductor_with_optimus(gm, list(inputs), post_grad=train), "optimus_egg": egg}
        counts, ok = {}, True
        for arm, g in graphs.items():
            pair = []
            for on in (False, True):
                if arm == "optimus_egg":  # the backend's config, the order toggled
                    as_backend_compiles(g, kernel_order=on)
                # (the forward's config applies to the backward, compiled inside compile_inductor)
                c = compile_inductor(g, inputs, training=train,
                                     config_patches=KERNEL_ORDER if on and arm != "optimus_egg" else None)
                ok &= matches_eager(c.fn, inputs, params, expected, expected_grads, train)
                pair.append(c.launches.total)
            counts[arm] = (pair[0], pair[1])
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
    print(f"{'model':<13} {'mode':<5}  " + "  ".join(f"{a + ' without -> with':>26}" for a in ARMS) + "  values")
    for train in modes:
        for name in args.models.split(","):
            counts, match = run(name, train)
            ok &= match
            cells = []
            for arm in ARMS:
                t = totals.setdefault((train, arm), [0, 0])
                t[0], t[1] = t[0] + counts[arm][0], t[1] + counts[arm][1]
                cells.append(f"{counts[arm][0]:>19} -> {counts[arm][1]:>3}")
            print(f"{name:<13} {'train' if train else 'infer':<5}  " + "  ".join(cells)
                  + f"  {'match' if match else 'VALUES DIFFER'}", flush=True)
    for train in modes:
        t = {a: totals[(train, a)] for a in ARMS}
        print(f"total {'train' if train else 'infer'}: " + ", ".join(f"{a} {t[a][0]} -> {t[a][1]}" for a in ARMS)
              + f"; optimus_egg with the order / Optimus without it {t['optimus_egg'][1] / t['optimus'][0]:.2f}"
              + f", / Optimus with it {t['optimus_egg'][1] / t['optimus'][1]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
