"""What the GEMM loops' layout check buys (src/optimus_egg/gemm_loops.py `vectorizes`).

    python bench/gemm_loops.py [--models wukong] [--rounds 150] [--dtype bfloat16]

Per model and mode (inference, training: forward + backward), 1 torch thread, interleaved
rounds, each arm's graph compiled as the backend does; launches, median step time as a ratio
to plain Inductor's, values (and gradients) checked against eager (in bfloat16 / float16:
against float64, as far as eager's and plain Inductor's rounding allow: optimus_egg.bench.check_values):

- plain Inductor;
- optimus_egg: the loops only where they vectorize, and priced so (shapes.rows_strided);
- every small GEMM as loops: the layout check off in the pass and in the pricing, as before
  it existed (scalar loops where an operand's rows are strided);
- no loops: optimize(gemm_loops=False), compiled without the pass.

Inductor's FX graph cache is off: the pass's cache key does not see the check switched off.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch
from torch import fx

from optimus_egg import gemm_loops, measure, shapes
from optimus_egg.baselines import as_backend_compiles
from optimus_egg.bench import (DTYPES, _run_and_grads, _train_step, exact_reference, matches_eager, one_thread, traced_with_reference,
                               warm_up_inductor)
from optimus_egg.pipeline import optimize


@contextmanager
def every_small_gemm_as_loops():
    """The pass and the pricing as if every small GEMM's loops vectorized."""
    vectorizes, rows_strided = gemm_loops.vectorizes, shapes.rows_strided
    gemm_loops.vectorizes, shapes.rows_strided = (lambda node: True), (lambda v: False)
    try:
        yield
    finally:
        gemm_loops.vectorizes, shapes.rows_strided = vectorizes, rows_strided


def run(name: str, train: bool, rounds: int, dtype: str = "float32") -> tuple[bool, dict[str, int]]:
    """Every arm's values checked, and its launches."""
    with one_thread(), torch._inductor.config.patch(fx_graph_cache=False):
        torch.manual_seed(0)
        model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, train, dtype)
        inputs = list(inputs)
        exact = exact_reference(model, inputs, train) if dtype != "float32" else None
        warm_up_inductor(train)
        compiled = {"plain": measure.compile_inductor(gm, inputs, training=train)}
        egg = optimize(gm, inputs, budget_s=1.0, gemm_loops=True, training=train)
        compiled["optimus_egg"] = measure.compile_inductor(as_backend_compiles(egg), inputs, training=train)
        with every_small_gemm_as_loops():
            every = optimize(gm, inputs, budget_s=1.0, gemm_loops=True, training=train)
            compiled["every small GEMM as loops"] = measure.compile_inductor(as_backend_compiles(every), inputs,
                                                                             training=train)
        apart = optimize(gm, inputs, budget_s=1.0, gemm_loops=False, training=train)
        compiled["no loops"] = measure.compile_inductor(as_backend_compiles(apart, gemm_loops=False), inputs,
                                                        training=train)
        plain = _run_and_grads(compiled["plain"].fn, inputs, params, train) if exact is not None else None
        ok = {arm: matches_eager(c.fn, inputs, params, expected, expected_grads, train, exact, plain)
              for arm, c in compiled.items()}
        fns = {arm: _train_step(c.fn, list(params.values())) if train else c.fn for arm, c in compiled.items()}
        with torch.set_grad_enabled(train):
            ms = measure.interleaved_medians(fns, inputs, rounds=rounds)
    print(f"{name:<12} {'train' if train else 'infer'} {dtype}  " + "   ".join(
        f"{arm}: {c.launches.total} launches {ms[arm] / ms['plain']:.3f} x{'' if ok[arm] else ' (VALUES DIFFER)'}"
        for arm, c in compiled.items()), flush=True)
    return all(ok.values()), {arm: c.launches.total for arm, c in compiled.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="wukong")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    args = ap.parse_args(argv)
    ok = True
    for name in args.models.split(","):
        for train in (False, True):
            ok &= run(name, train, args.rounds, args.dtype)[0]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
