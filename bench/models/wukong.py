"""Wukong (Zhang et al., 2024), small.

Each layer reads embeddings X ``[B, n, d]`` with two blocks in parallel:
  * FMB (factorization machine block): optimized FM  X (X^T Y)  with a learned projection
    Y ``[n, k]`` (as a bias-free Linear over the feature axis), flatten, LayerNorm, MLP,
    reshape to ``[B, n_fm, d]``;
  * LCB (linear compress block): a linear recombination of the n embeddings,
    ``[B, n_lc, d]``.
Their outputs are concatenated along the feature axis, a residual (projected when the
feature count changes) is added, and a LayerNorm over d is applied.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import MLP, generator, randn, seeded


class FMBlock(nn.Module):
    def __init__(self, n: int, d: int, k: int, n_out: int, hidden: int):
        super().__init__()
        self.n_out = n_out
        self.d = d
        self.proj = nn.Linear(n, k, bias=False)
        self.norm = nn.LayerNorm(n * k)
        self.mlp = MLP([n * k, hidden, n_out * d])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xt = torch.transpose(x, 1, 2)  # [B, d, n]
        t = self.proj(xt)  # [B, d, k] = X^T Y
        fm = torch.bmm(x, t)  # [B, n, k] = X X^T Y
        h = self.mlp(self.norm(torch.flatten(fm, 1)))
        return torch.reshape(h, (-1, self.n_out, self.d))


class LCBlock(nn.Module):
    def __init__(self, n: int, n_out: int):
        super().__init__()
        self.mix = nn.Linear(n, n_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.transpose(self.mix(torch.transpose(x, 1, 2)), 1, 2)


class WukongLayer(nn.Module):
    def __init__(self, n: int, d: int, n_fm: int, n_lc: int, k: int, hidden: int):
        super().__init__()
        self.fmb = FMBlock(n, d, k, n_fm, hidden)
        self.lcb = LCBlock(n, n_lc)
        self.residual = None if n_fm + n_lc == n else LCBlock(n, n_fm + n_lc)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([self.fmb(x), self.lcb(x)], dim=1)
        res = x if self.residual is None else self.residual(x)
        return self.norm(out + res)


class Wukong(nn.Module):
    def __init__(
        self,
        num_features: int = 8,
        dim: int = 16,
        num_layers: int = 3,
        n_fm: int = 4,
        n_lc: int = 4,
        k: int = 8,
        hidden: int = 64,
    ):
        super().__init__()
        layers = []
        n = num_features
        for _ in range(num_layers):
            layers.append(WukongLayer(n, dim, n_fm, n_lc, k, hidden))
            n = n_fm + n_lc
        self.layers = nn.ModuleList(layers)
        self.head = MLP([n * dim, hidden, 1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(torch.flatten(x, 1))


def make(
    batch: int = 64,
    num_features: int = 8,
    dim: int = 16,
    num_layers: int = 3,
    seed: int = 0,
):
    model = seeded(seed, lambda: Wukong(num_features, dim, num_layers))
    g = generator(seed)
    return model, (randn(g, batch, num_features, dim),)
