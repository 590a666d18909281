"""What storing saved masks as bytes buys on this CPU (src/optimus_egg/mask_stores.py).

    python bench/mask_stores.py [--models mmoe,interformer,dlrm,dhen,masknet] [--rounds 60]

Part 1, the kernel: `x <= 0` on 8,192 floats compiled three ways, the time of the C++ kernel
alone (torch.profiler with Inductor's kernel profiling, 1,000 calls): Inductor's vectorized
bool store, the same compare as scalar code (`cpp.simdlen = 1`), and the bytes chain the pass
writes (`view(convert(convert(m, int32), uint8), bool)`); each output checked against eager.

Part 2, the training step (forward + backward, 1 torch thread, interleaved rounds) of each
model's plain Inductor graph and optimus_egg@1s graph, each compiled as the backend does
without and with the pass (plain: no optimus_egg option but the pass), with the bool elements
each forward saves, and gradients checked against eager.
"""
from __future__ import annotations

import argparse
import math
import re

import torch
from torch import fx

from optimus_egg import measure
from optimus_egg.baselines import as_backend_compiles
from optimus_egg.bench import _train_step, matches_eager, one_thread, traced_with_reference, warm_up_inductor
from optimus_egg.mask_stores import MASK_STORES

MODELS = ("mmoe", "interformer", "dlrm", "dhen", "masknet")
_BOOL_BUFFER = re.compile(r"empty_strided_cpu\(\(([\d, ]+)\), \([\d, ]+\), torch\.bool\)")


def saved_bool_elements(forward_code: str) -> int:
    """Bool elements the compiled forward allocates (masks it writes, mostly for the backward)."""
    return sum(math.prod(int(d) for d in m.group(1).replace(" ", "").strip(",").split(","))
               for m in _BOOL_BUFFER.finditer(forward_code))


def _kernel_us(fn, x, calls: int = 1000) -> float:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(50):
        fn(x)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn(x)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if "cpp_fused" in e.key) / calls


def kernel_part() -> None:
    from torch._inductor import config

    x = torch.randn(4, 64, 32)
    ways = {"vectorized bool store": (lambda t: t <= 0, {}),
            "scalar code": (lambda t: t <= 0, {"cpp.simdlen": 1}),
            "bytes (the pass)": (lambda t: (t <= 0).to(torch.int32).to(torch.uint8).view(torch.bool), {})}
    print(f"kernel: x <= 0 on {x.numel()} floats, C++ kernel time per call")
    with config.patch({"cpp.enable_kernel_profile": True}), torch.no_grad():
        for name, (f, patch) in ways.items():
            c = measure.compile_inductor(fx.symbolic_trace(f), [x], config_patches=patch)
            ok = torch.equal(c.fn(x), x <= 0)
            print(f"  {name:22s} {_kernel_us(c.fn, x):7.2f} us   values {'match' if ok else 'DIFFER'}", flush=True)


def model_part(name: str, rounds: int) -> None:
    from optimus_egg.pipeline import optimize

    model, inputs, gm, params, expected, expected_grads = traced_with_reference(name, train=True)
    egg = optimize(gm, inputs, budget_s=1.0, gemm_loops=True, training=True)
    arms = {"inductor": (gm, {}), "inductor+masks": (gm, {"post_grad_custom_post_pass": MASK_STORES}),
            "optimus_egg no masks": (as_backend_compiles(measure.copy_graph_module(egg), mask_stores=False), {}),
            "optimus_egg": (as_backend_compiles(egg), {})}
    fns, notes = {}, {}
    for arm, (graph, patch) in arms.items():
        c = measure.compile_inductor(graph, inputs, training=True, config_patches=patch)
        ok = matches_eager(c.fn, inputs, params, expected, expected_grads, train=True)
        fns[arm] = _train_step(c.fn, list(params.values()))
        notes[arm] = f"{c.launches.total:3d} launches, {saved_bool_elements(c.codes[0]):6d} bool elements saved, " \
                     f"values and grads {'match' if ok else 'DIFFER'}"
    with torch.enable_grad():
        med = measure.interleaved_medians(fns, inputs, rounds=rounds)
    print(f"{name} (training step, {rounds} rounds)")
    for arm in arms:
        print(f"  {arm:22s} {med[arm]:.4f} ms  {med[arm] / med['inductor']:.3f} x plain   {notes[arm]}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args(argv)
    with one_thread():
        kernel_part()
        warm_up_inductor(True)
        for name in args.models.split(","):
            model_part(name, args.rounds)


if __name__ == "__main__":
    main()
