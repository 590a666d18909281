"""What the post-grad Optimus passes add to optimus_egg: launches with and without them.

    python bench/post_grad.py                              # the bench models but illustrative, training and inference
    python bench/post_grad.py --models dhen,hstu --train   # training only
    python bench/post_grad.py --pass-by-pass [--rounds 60] # training: launches and step time per pass set

optimus_egg rewrites the forward graph; the torch.compile backend (and the bench's optimus_egg
arm) then compiles with Inductor's post-grad Optimus passes (baselines.EGG_POST_GRAD),
which also see the backward. For each model this optimizes once at 1 s, compiles the result
with and without those passes (the backward, both times, as the backend compiles it:
baselines.EGG_BACKWARD), and prints Inductor's launches and whether values (and, in
training, every parameter's gradient) equal eager's. In inference it also prints the Optimus
arm with and without them (the bench's Optimus arm runs them in training only), and plain
Inductor with and without them (what the post-grad passes do alone). One torch
thread; launches are deterministic, so one run suffices.

--pass-by-pass (training): the optimus_egg arm (optimized without the GEMM loops) compiled
with the CPU kernel order and the backward's EGG_BACKWARD with EGG_POST_GRAD; EGG_POST_GRAD without its limit
on the elements a GEMM batch stacks per launch saved (MAX_STACKED_PER_LAUNCH); EGG_POST_GRAD plus
PyTorch's batch_aten_mul; EGG_POST_GRAD without the GEMM batching; without optimus_egg's bmm
batching (BATCH_BMM); no post-grad pass; and as the backend compiles, optimized priced for
small GEMMs as loops and compiled with them (gemm_loops.py, "loops"), next to plain Inductor and Optimus: launches and
the median training step over plain Inductor's, all arms timed in one interleaved run ("!"
marks values or gradients that differ from eager's).
"""
from __future__ import annotations

import argparse
import sys

import torch

from optimus_egg import optimize
from optimus_egg.baselines import (
    BATCH_BMM,
    EGG_BACKWARD,
    EGG_POST_GRAD,
    OPTIMUS_POST_GRAD,
    SAME_DTYPE_BATCH_LINEAR,
    as_backend_compiles,
    backend_patches,
    inductor_with_optimus,
    post_grad_patches,
)
from optimus_egg.bench import _train_step, default_models, family_of, matches_eager, one_thread, traced_with_reference
from optimus_egg.kernel_order import KERNEL_ORDER
from optimus_egg.measure import compile_inductor, interleaved_medians

# The bench's models but the illustrative family (its graphs take the longest to compile).
MODELS = [m for m in default_models() if family_of(m) != "illustrative"]


def run(name: str, train: bool) -> bool:
    with one_thread():
        torch.manual_seed(0)
        model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, train)
        egg = as_backend_compiles(optimize(gm, list(inputs), budget_s=1.0, training=train), post_grad=False, gemm_loops=False)
        cells, ok = [], True
        for label, patches in (("without", {}), ("with", post_grad_patches(EGG_POST_GRAD))):
            c = compile_inductor(egg, inputs, training=train, config_patches=patches)
            match = matches_eager(c.fn, inputs, params, expected, expected_grads, train)
            ok &= match
            cells.append(f"{label} {c.launches.total}{'' if match else ' (VALUES DIFFER)'}")
        line = f"{name:<13} {'train' if train else 'infer'}  optimus_egg@1s: {', '.join(cells)}"
        if not train:
            opt = [compile_inductor(inductor_with_optimus(gm, list(inputs), post_grad=pg), inputs).launches.total
                   for pg in (False, True)]
            plain = [compile_inductor(gm, inputs, config_patches=p).launches.total
                     for p in ({}, post_grad_patches(EGG_POST_GRAD))]
            line += f"   Optimus: without {opt[0]}, with {opt[1]}   plain Inductor: without {plain[0]}, with {plain[1]}"
        print(line, flush=True)
        return ok


def pass_by_pass(name: str, rounds: int) -> bool:
    with one_thread():
        torch.manual_seed(0)
        model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, True)
        egg = optimize(gm, list(inputs), budget_s=1.0)
        arms = {"plain": compile_inductor(gm, inputs, training=True),
                "optimus": compile_inductor(inductor_with_optimus(gm, list(inputs), post_grad=True), inputs, training=True)}
        pass_sets = {"egg": EGG_POST_GRAD,
                     "egg-ungated": {k: {o: x for o, x in v.items() if o != "max_stacked_per_launch"}
                                     for k, v in EGG_POST_GRAD.items()},
                     "egg+mul": {**EGG_POST_GRAD, "batch_aten_mul": OPTIMUS_POST_GRAD["batch_aten_mul"]},
                     "egg-gemm": {k: v for k, v in EGG_POST_GRAD.items() if k != SAME_DTYPE_BATCH_LINEAR},
                     "egg-bmm": {k: v for k, v in EGG_POST_GRAD.items() if k != BATCH_BMM},
                     "egg-none": {}}
        for label, passes in pass_sets.items():
            arms[label] = compile_inductor(egg, inputs, training=True, backward_config_patches=EGG_BACKWARD,
                                           config_patches={**(post_grad_patches(passes) if passes else {}), **KERNEL_ORDER})
        # as the backend compiles: priced for small GEMMs as loops (gemm_loops.py), "egg" with them
        loops = optimize(gm, list(inputs), budget_s=1.0, gemm_loops=True)
        arms["loops"] = compile_inductor(loops, inputs, training=True, backward_config_patches=EGG_BACKWARD,
                                         config_patches=backend_patches(gemm_loops=True))
        ok = {label: matches_eager(c.fn, inputs, params, expected, expected_grads, True) for label, c in arms.items()}
        steps = {label: _train_step(c.fn, list(params.values())) for label, c in arms.items()}
        ms = interleaved_medians(steps, inputs, rounds=rounds)
        print(f"{name:<13} " + "  ".join(f"{label} {c.launches.total} {ms[label] / ms['plain']:.3f}x{'' if ok[label] else ' !'}"
                                         for label, c in arms.items()), flush=True)
        return all(ok.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--train", action="store_true", help="training only")
    ap.add_argument("--infer", action="store_true", help="inference only")
    ap.add_argument("--pass-by-pass", action="store_true", help="training: launches and step time per post-grad pass set")
    ap.add_argument("--rounds", type=int, default=60, help="interleaved timing rounds (--pass-by-pass)")
    args = ap.parse_args(argv)
    if args.pass_by_pass:
        return 0 if all([pass_by_pass(m, args.rounds) for m in args.models.split(",") if m]) else 1
    modes = [True] if args.train else [False] if args.infer else [True, False]
    ok = True
    for train in modes:
        for name in (m for m in args.models.split(",") if m):
            ok &= run(name, train)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
