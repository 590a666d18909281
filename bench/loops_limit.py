"""The GEMM loops' limit (src/optimus_egg/gemm_loops.py MAX_MACS): what each limit gives as the
backend compiles.

    python bench/loops_limit.py [--models dcn_v2,wukong] [--limits 65536,32768,32768/65536]
                                [--rounds 60] [--dtype float32] [--train]

Per model, launches and median latency (training: step time) relative to plain Inductor, one
torch thread, interleaved rounds, of plain Inductor, Inductor + Optimus (the bench's arm) and
optimus_egg at 1 s with each limit in turn, for every dtype and mode: N in the search's
pricing (launch_cost.LOOP_LIMITS), in the pass and in the post-grad batchings; N/P the
pricing at N, the pass and the batchings at P. Values (and gradients) checked against eager,
in bfloat16 / float16 against float64 as the bench does. A GEMM past the pricing's limit is a
call the search may batch with others, so a lower pricing limit trades launches for the GEMM
library's speed; past the pass's it stays a call even where nothing batches it.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch


@contextmanager
def one_limit(search_macs: int, pass_macs: int | None = None):
    """Every GEMM of at most `search_macs` multiply-adds priced as loops, and written as loops
    by the pass (and left alone by the post-grad batchings) up to `pass_macs` (`search_macs`
    where None): a GEMM between the two is priced a call, batched where the search finds
    siblings, and written as loops where it stays alone."""
    from optimus_egg.extract import launch_cost
    from optimus_egg.gemm_loops import GEMM_LOOPS

    saved = dict(launch_cost.LOOP_LIMITS), GEMM_LOOPS.max_macs
    pass_macs = pass_macs or search_macs
    launch_cost.LOOP_LIMITS[launch_cost.LOOPS] = search_macs
    GEMM_LOOPS.max_macs = pass_macs
    try:
        yield
    finally:
        launch_cost.LOOP_LIMITS.update(saved[0])
        GEMM_LOOPS.max_macs = saved[1]


def run(name: str, limits: list[str], rounds: int, dtype: str, train: bool) -> tuple[bool, dict[str, int]]:
    """Whether every arm's values matched, and each arm's launches."""
    from optimus_egg import optimize
    from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
    from optimus_egg.bench import (_run_and_grads, _train_step, exact_reference, matches_eager, one_thread,
                                   traced_with_reference)
    from optimus_egg.measure import compile_inductor, interleaved_medians

    with one_thread(), torch._inductor.config.patch(fx_graph_cache=False):
        torch.manual_seed(0)
        model, inputs, gm, params, expected, grads = traced_with_reference(name, train, dtype)
        inputs = list(inputs)
        exact = exact_reference(model, inputs, train) if dtype != "float32" else None
        compiled = {"inductor": compile_inductor(gm, inputs, training=train),
                    "optimus": compile_inductor(inductor_with_optimus(gm, inputs, post_grad=train), inputs,
                                                training=train)}
        for limit in limits:
            with one_limit(*(int(v) for v in limit.split("/"))):
                egg = optimize(gm, inputs, budget_s=1.0, gemm_loops=True, training=train, hoisted=not train)
                compiled[f"egg@{limit}"] = compile_inductor(as_backend_compiles(egg), inputs, training=train)
        plain = _run_and_grads(compiled["inductor"].fn, inputs, params, train) if exact is not None else None
        ok = {a: matches_eager(c.fn, inputs, params, expected, grads, train, exact, plain) for a, c in compiled.items()}
        fns = {a: _train_step(c.fn, list(params.values())) if train else c.fn for a, c in compiled.items()}
        with torch.set_grad_enabled(train):
            ms = interleaved_medians(fns, inputs, rounds=rounds)
    print(f"{name:<16} {'train' if train else 'infer'} {dtype}  " + "   ".join(
        f"{a} {c.launches.total} launches {ms[a] / ms['inductor']:.3f} x{'' if ok[a] else ' (VALUES DIFFER)'}"
        for a, c in compiled.items()), flush=True)
    return all(ok.values()), {a: c.launches.total for a, c in compiled.items()}


def main(argv: list[str] | None = None) -> int:
    from optimus_egg.bench import DTYPES, default_models, warm_up_inductor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(default_models()))
    ap.add_argument("--limits", default="65536,32768,32768/65536")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args(argv)
    warm_up_inductor(args.train)
    limits = args.limits.split(",")
    ok = True
    for name in args.models.split(","):
        ok &= run(name, limits, args.rounds, args.dtype, args.train)[0]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
