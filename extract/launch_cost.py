"""Cost = kernels Inductor would launch for one node; views, leaves and tuple plumbing are free.

GEMMs (linear, batched_linear) are one extern kernel each; norms and copies (cat, stack) one
kernel; elementwise template calls one kernel (Inductor often fuses them into a neighbour, so
this over-counts evenly on every alternative); view-like template calls nothing.
"""
from __future__ import annotations

FREE = {"input", "none", "item", "split", "unbind", "outputs"}
GEMM = {"linear", "batched_linear"}
KERNEL = {"layer_norm", "batched_layer_norm", "cat", "stack"}
VIEW_TARGETS = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "movedim",
                "squeeze", "unsqueeze", "expand", "narrow", "select", "getitem", "split", "chunk",
                "unbind", "view_as", "reshape_as", "contiguous", "detach", "size", "dim",
                "split_with_sizes", "diagonal", "as_strided", "sym_size"}


def launch_cost(op: str, target_name: str | None = None) -> float:
    """Launches for node `op`; template calls pass their FX target's name."""
    if op in FREE:
        return 0.0
    if op in GEMM or op in KERNEL:
        return 1.0
    if op in ("call", "call_multi"):
        return 0.0 if target_name in VIEW_TARGETS else 1.0
    raise ValueError(f"launch_cost: unknown op {op!r}")
