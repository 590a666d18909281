"""Batched kernels that to_fx emits as single FX calls; plain torch code that Dynamo, AOTAutograd
and Inductor trace through (each is one GEMM or one fused norm after lowering)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def stack_bias(biases: list[torch.Tensor | None], weights: list[torch.Tensor]) -> torch.Tensor | None:
    """Stack per-member biases; a member without a bias contributes zeros; None if none has one."""
    if all(b is None for b in biases):
        return None
    return torch.stack([b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])


def stack_optional(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Stack affine parameters that are either all present or all absent."""
    return None if tensors[0] is None else torch.stack(tensors)


def batched_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x [N, *, K], w [N, O, K], b [N, O] or None -> [N, *, O] with one bmm/baddbmm."""
    n, k = x.shape[0], x.shape[-1]
    flat = x.reshape(n, -1, k)
    wt = w.transpose(1, 2)
    out = torch.bmm(flat, wt) if b is None else torch.baddbmm(b.unsqueeze(1), flat, wt)
    return out.reshape(*x.shape[:-1], w.shape[1])


def batched_layer_norm(x: torch.Tensor, shape: list[int], w: torch.Tensor | None,
                       b: torch.Tensor | None, eps: float) -> torch.Tensor:
    """layer_norm over x's trailing `shape` dims, then per-member affine w/b [N, *shape]."""
    y = F.layer_norm(x, shape, None, None, eps)
    lead = (1,) * (x.dim() - 1 - len(shape))
    if w is not None:
        y = y * w.reshape(w.shape[0], *lead, *shape)
    if b is not None:
        y = y + b.reshape(b.shape[0], *lead, *shape)
    return y
