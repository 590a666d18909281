"""Calibrate the launch cost table: compile tiny graphs with Inductor and count launches.

    python bench/calibrate.py        # prints the measured per-op launches for this target

Each probe graph holds N copies of one op on independent inputs, so the figure is the
launches Inductor spends per op once fusion had its chance (e.g. independent stacks fuse
into one kernel; a pointwise op after a GEMM becomes its own kernel).
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from optimus_egg.measure import compile_inductor

N = 4


def _probe(fn, *inputs) -> float:
    gm = fx.symbolic_trace(fn)
    return compile_inductor(gm, list(inputs)).launches.total / N


def probes() -> dict[str, float]:
    xs = [torch.randn(32, 16) for _ in range(N)]
    w = torch.randn(16, 16)
    return {
        "linear": _probe(lambda a0, a1, a2, a3: [F.linear(x, w) for x in (a0, a1, a2, a3)], *xs),
        "pointwise_after_gemm": _probe(lambda a0, a1, a2, a3: [torch.tanh(F.linear(x, w)) for x in (a0, a1, a2, a3)], *xs) - 1,
        "pointwise_alone": _probe(lambda a0, a1, a2, a3: [torch.tanh(x) for x in (a0, a1, a2, a3)], *xs),
        "layer_norm": _probe(lambda a0, a1, a2, a3: [F.layer_norm(F.linear(x, w), [16]) for x in (a0, a1, a2, a3)], *xs) - 1,
        "stack_of_inputs": _probe(lambda a0, a1, a2, a3: [torch.stack([a0, a1, a2, a3]) for _ in range(N)], *xs),
        "cat_after_gemm": _probe(lambda a0, a1, a2, a3: [torch.cat([F.linear(x, w) for x in (a0, a1, a2, a3)], 1)] * N, *xs) - 1,
    }


if __name__ == "__main__":
    for k, v in probes().items():
        print(f"{k:<24}{v:6.2f}")
