"""The built-in demo model: the shape PyTorch's Optimus is designed for.

Input ``[B, F*D]`` is split into F chunks with ``torch.split``; each chunk goes through
its own ``Linear(D, H) -> tanh -> LayerNorm(H)``; the results are concatenated and fed to
one final ``Linear(F*H, out)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import generator, randn, seeded


class ParallelMLP(nn.Module):
    def __init__(self, features: int = 8, dim: int = 32, hidden: int = 64, out_dim: int = 16):
        super().__init__()
        self.features = features
        self.dim = dim
        self.linears = nn.ModuleList(nn.Linear(dim, hidden) for _ in range(features))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(features))
        self.out = nn.Linear(features * hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x, self.dim, dim=1)
        outs = [
            self.norms[i](torch.tanh(self.linears[i](chunks[i]))) for i in range(self.features)
        ]
        return self.out(torch.cat(outs, dim=1))


def make(
    batch: int = 64,
    features: int = 8,
    dim: int = 32,
    hidden: int = 64,
    out_dim: int = 16,
    seed: int = 0,
):
    model = seeded(seed, lambda: ParallelMLP(features, dim, hidden, out_dim))
    g = generator(seed)
    return model, (randn(g, batch, features * dim),)
