"""What computing parameter copies once buys in inference (src/optimus_egg/hoist.py).

    python bench/hoist.py                              # the bench models, 100 rounds
    python bench/hoist.py --models masknet,mmoe --rounds 300

Per model, launches and median latency relative to plain Inductor (interleaved rounds, one
torch thread) of: plain Inductor; Inductor + Optimus (its pre-grad passes), as PyTorch ships it
and with its parameter copies computed once too ("+hoist"); optimus_egg at 1 s as the backend
compiles it, without the copies computed once (priced so: `optimize(..., hoisted=False)`) and
with them (`hoisted=True`, the backend's default); and optimus_egg priced for plain GEMM calls
(`optimize(..., gemm_loops=False, hoisted=True)`: small GEMMs batched instead of left to become
loops) compiled as the backend compiles, copies computed once ("priced for calls"): the
latency alternative. Values are checked against eager.
"""
from __future__ import annotations

import argparse
import copy


def default_models() -> list[str]:
    from optimus_egg.bench import default_models as bench_models, family_of

    return list(dict.fromkeys(family_of(m) for m in bench_models()))


ARMS = ["inductor", "optimus", "optimus+hoist", "egg", "egg+hoist", "egg priced for calls"]


def run(name: str, rounds: int) -> tuple[dict[str, int], dict[str, float], bool]:
    import torch

    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
    from optimus_egg.bench import matches_eager, one_thread, traced_with_reference
    from optimus_egg.measure import compile_inductor, interleaved_medians

    with one_thread():
        model, inputs, gm, params, expected, grads = traced_with_reference(name, False)
        opt = inductor_with_optimus(gm, list(inputs))
        opt_hoisted = copy.copy(opt)
        opt_hoisted.meta = {**opt.meta, "hoist_parameters": True}
        # (priced for inference, as the bench's arm: the parameters require grad here, so
        # optimize's default would price for a compile with a backward)
        egg = optimize(gm, list(inputs), budget_s=1.0, gemm_loops=True, training=False)
        egg_hoisted = optimize(gm, list(inputs), budget_s=1.0, gemm_loops=True, training=False, hoisted=True)
        calls = optimize(gm, list(inputs), budget_s=1.0, gemm_loops=False, training=False, hoisted=True)
        graphs = {"inductor": gm, "optimus": opt, "optimus+hoist": opt_hoisted,
                  "egg": as_backend_compiles(egg, hoist=False), "egg+hoist": as_backend_compiles(egg_hoisted),
                  "egg priced for calls": as_backend_compiles(calls)}
        compiled = {arm: compile_inductor(g, inputs) for arm, g in graphs.items()}
        ok = all(matches_eager(c.fn, inputs, params, expected, grads, False) for c in compiled.values())
        with torch.no_grad():
            ms = interleaved_medians({arm: c.fn for arm, c in compiled.items()}, inputs, rounds=rounds)
        return {arm: c.launches.total for arm, c in compiled.items()}, {a: ms[a] / ms["inductor"] for a in ARMS}, ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(default_models()))
    p.add_argument("--rounds", type=int, default=100)
    args = p.parse_args(argv)
    from optimus_egg.bench import warm_up_inductor

    warm_up_inductor(False)
    print(f"{'model':<13} " + "  ".join(f"{a:>22}" for a in ARMS) + "  values")
    totals = dict.fromkeys(ARMS, 0)
    ok_all = True
    for name in args.models.split(","):
        launches, ratio, ok = run(name, args.rounds)
        ok_all &= ok
        for a in ARMS:
            totals[a] += launches[a]
        print(f"{name:<13} " + "  ".join(f"{launches[a]:>4} launches {ratio[a]:5.3f} x" for a in ARMS)
              + ("  match" if ok else "  DIFFER"), flush=True)
    print(f"{'total':<13} " + "  ".join(f"{totals[a]:>4} launches        " for a in ARMS))
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
