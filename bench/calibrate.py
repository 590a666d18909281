"""Calibrate the launch cost table: compile tiny graphs with Inductor and count launches.

    python bench/calibrate.py                  # per-op launches for Inductor's C++ on this CPU
    python bench/calibrate.py --device cuda    # the same probes compiled to Triton on the GPU

Each probe graph holds N copies of one op on independent inputs, so the figure is the
launches Inductor spends per op once fusion had its chance (e.g. independent stacks fuse
into one kernel; a pointwise op after a GEMM becomes its own kernel). Probes that need a
GEMM to feed their op subtract the ``linear`` probe's figure. On cuda a second column gives
the CUDA kernels torch.profiler saw in one call (``measure.profiled_kernel_launches``),
treated the same way.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import fx

from optimus_egg.bench import DEVICES, check_device
from optimus_egg.measure import compile_inductor, profiled_kernel_launches

N = 4
# Probes whose graph also holds one GEMM per op: the linear probe's figure is taken off.
AFTER_GEMM = ("pointwise_after_gemm", "layer_norm", "cat_after_gemm")


def _probe(fn: Callable[..., object], inputs: list[torch.Tensor], device: str) -> tuple[float, float | None]:
    """(launches in the wrapper code, CUDA kernels profiled or None on CPU) per op."""
    compiled = compile_inductor(fx.symbolic_trace(fn), inputs)
    profiled = profiled_kernel_launches(compiled.fn, inputs) / N if device == "cuda" else None
    return compiled.launches.total / N, profiled


def probes(device: str = "cpu") -> dict[str, tuple[float, float | None]]:
    """Per op: (launches counted in Inductor's wrapper, CUDA kernels profiled; None on CPU)."""
    check_device(device)
    xs = [torch.randn(32, 16, device=device) for _ in range(N)]
    w = torch.randn(16, 16, device=device)
    raw = {
        "linear": _probe(lambda a0, a1, a2, a3: [F.linear(x, w) for x in (a0, a1, a2, a3)], xs, device),
        "pointwise_after_gemm": _probe(lambda a0, a1, a2, a3: [torch.tanh(F.linear(x, w)) for x in (a0, a1, a2, a3)], xs, device),
        "pointwise_alone": _probe(lambda a0, a1, a2, a3: [torch.tanh(x) for x in (a0, a1, a2, a3)], xs, device),
        "layer_norm": _probe(lambda a0, a1, a2, a3: [F.layer_norm(F.linear(x, w), [16]) for x in (a0, a1, a2, a3)], xs, device),
        "stack_of_inputs": _probe(lambda a0, a1, a2, a3: [torch.stack([a0, a1, a2, a3]) for _ in range(N)], xs, device),
        "cat_after_gemm": _probe(lambda a0, a1, a2, a3: [torch.cat([F.linear(x, w) for x in (a0, a1, a2, a3)], 1)] * N, xs, device),
    }
    gemm, gemm_profiled = raw["linear"]
    return {
        op: (n - gemm, None if p is None else p - gemm_profiled) if op in AFTER_GEMM else (n, p)
        for op, (n, p) in raw.items()
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=DEVICES, default="cpu")
    device = p.parse_args(argv).device
    try:
        check_device(device)
    except ValueError as e:
        p.error(str(e))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Inductor C++)"
    print(f"launches per op, {N} independent copies per graph, torch {torch.__version__}, on {name}")
    print(f"{'op':<24}{'wrapper':>8}" + (f"{'profiled':>10}" if device == "cuda" else ""))
    for op, (n, profiled) in probes(device).items():
        print(f"{op:<24}{n:8.2f}" + ("" if profiled is None else f"{profiled:10.2f}"))


if __name__ == "__main__":
    main()
