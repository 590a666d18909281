"""HSTU-like model (after Zhai et al., 2024, "Actions Speak Louder than Words") on a
padded dense sequence, small.

Inputs: ``x`` ``[B, N, d]`` item/action embeddings, zero past each sequence's length, and
``valid`` ``[B, N]`` float32 (1.0 for real positions, 0.0 for padding).
Each layer (pre-norm, residual):
    U, V, Q, K = split(silu(f1(LayerNorm(x))))               pointwise projection
    A          = silu(Q K^T) / N  *  causal_mask * valid_mask  per head (matmul)
    Y          = f2(U * LayerNorm(A V))                        gating
    x          = x + Y
Output: a per-position score ``[B, N]`` (zero at padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import generator, randn, seeded


class HSTULayer(nn.Module):
    def __init__(self, dim: int, seq_len: int, heads: int, head_dim: int, attn_dim: int):
        super().__init__()
        self.seq_len = seq_len
        self.heads = heads
        self.head_dim = head_dim
        self.attn_dim = attn_dim
        self.in_norm = nn.LayerNorm(dim)
        self.f1 = nn.Linear(dim, heads * (2 * head_dim + 2 * attn_dim))
        self.av_norm = nn.LayerNorm(heads * head_dim)
        self.f2 = nn.Linear(heads * head_dim, dim)

    def _heads(self, t: torch.Tensor, hd: int) -> torch.Tensor:
        # [B, N, H*hd] -> [B, H, N, hd]
        return torch.transpose(torch.reshape(t, (-1, self.seq_len, self.heads, hd)), 1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        H, dv, da = self.heads, self.head_dim, self.attn_dim
        h = F.silu(self.f1(self.in_norm(x)))
        u, v, q, k = torch.split(h, [H * dv, H * dv, H * da, H * da], dim=-1)
        q = self._heads(q, da)
        k = self._heads(k, da)
        v = self._heads(v, dv)
        scores = torch.matmul(q, torch.transpose(k, -1, -2))  # [B, H, N, N]
        a = F.silu(scores) / self.seq_len * mask
        av = torch.matmul(a, v)  # [B, H, N, dv]
        av = torch.reshape(torch.transpose(av, 1, 2), (-1, self.seq_len, H * dv))
        return x + self.f2(u * self.av_norm(av))


class HSTULike(nn.Module):
    def __init__(
        self,
        dim: int = 32,
        seq_len: int = 16,
        num_layers: int = 2,
        heads: int = 2,
        head_dim: int = 16,
        attn_dim: int = 16,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            HSTULayer(dim, seq_len, heads, head_dim, attn_dim) for _ in range(num_layers)
        )
        self.register_buffer("causal", torch.tril(torch.ones(seq_len, seq_len)))
        self.out_norm = nn.LayerNorm(dim)
        self.score = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        pair = torch.unsqueeze(valid, 2) * torch.unsqueeze(valid, 1)  # [B, N, N]
        mask = torch.unsqueeze(pair * self.causal, 1)  # [B, 1, N, N]
        for layer in self.layers:
            x = layer(x, mask)
        s = self.score(self.out_norm(x))  # [B, N, 1]
        return torch.squeeze(s, 2) * valid


def make(
    batch: int = 32,
    dim: int = 32,
    seq_len: int = 16,
    num_layers: int = 2,
    heads: int = 2,
    seed: int = 0,
):
    model = seeded(seed, lambda: HSTULike(dim, seq_len, num_layers, heads))
    g = generator(seed)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch,), generator=g)
    valid = (torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    x = randn(g, batch, seq_len, dim) * valid.unsqueeze(2)
    return model, (x, valid)
