"""DHEN (Zhang et al., 2022): a deep hierarchical ensemble of heterogeneous interaction
modules, small.

Each layer runs four interaction modules on the same input X ``[B, n, d]``:
  * dot: pairwise dot products ``bmm(X, X^T)``, flattened, linear;
  * self-attention: single-head scaled dot-product attention over the n tokens, linear;
  * DCN: one cross layer on flatten(X):  x * W x + b + x, linear;
  * linear: a linear on flatten(X).
Each module emits ``n/4`` tokens (``[B, n/4 * d]``); the four are concatenated back to
``[B, n*d]``, the residual flatten(X) is added and a LayerNorm applied.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._common import generator, randn, seeded


class DotModule(nn.Module):
    def __init__(self, n: int, out: int):
        super().__init__()
        self.proj = nn.Linear(n * n, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.bmm(x, torch.transpose(x, 1, 2))
        return self.proj(torch.flatten(z, 1))


class SelfAttentionModule(nn.Module):
    def __init__(self, n: int, d: int, out: int):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.scale = 1.0 / math.sqrt(d)
        self.proj = nn.Linear(n * d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        a = torch.softmax(torch.bmm(q, torch.transpose(k, 1, 2)) * self.scale, dim=-1)
        return self.proj(torch.flatten(torch.bmm(a, v), 1))


class DCNModule(nn.Module):
    def __init__(self, n: int, d: int, out: int):
        super().__init__()
        self.cross = nn.Linear(n * d, n * d)
        self.proj = nn.Linear(n * d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = torch.flatten(x, 1)
        return self.proj(x0 * self.cross(x0) + x0)


class LinearModule(nn.Module):
    def __init__(self, n: int, d: int, out: int):
        super().__init__()
        self.proj = nn.Linear(n * d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.flatten(x, 1))


class DHENLayer(nn.Module):
    def __init__(self, n: int, d: int):
        super().__init__()
        if n % 4:
            raise ValueError("DHEN needs the token count divisible by 4")
        out = (n // 4) * d
        self.n = n
        self.d = d
        self.dot = DotModule(n, out)
        self.attn = SelfAttentionModule(n, d, out)
        self.dcn = DCNModule(n, d, out)
        self.linear = LinearModule(n, d, out)
        self.norm = nn.LayerNorm(n * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ens = torch.cat([self.dot(x), self.attn(x), self.dcn(x), self.linear(x)], dim=1)
        y = self.norm(ens + torch.flatten(x, 1))
        return torch.reshape(y, (-1, self.n, self.d))


class DHEN(nn.Module):
    def __init__(self, num_features: int = 8, dim: int = 16, num_layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(DHENLayer(num_features, dim) for _ in range(num_layers))
        self.head = nn.Linear(num_features * dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(torch.flatten(x, 1))


def make(batch: int = 64, num_features: int = 8, dim: int = 16, num_layers: int = 2, seed: int = 0):
    model = seeded(seed, lambda: DHEN(num_features, dim, num_layers))
    g = generator(seed)
    return model, (randn(g, batch, num_features, dim),)
