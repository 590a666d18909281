"""Production-shaped synthetic model: F features x per-feature MLP depth D x L layers.

Input ``[B, F*W]``. Each layer ``torch.split``s its input into F chunks of width W; each
chunk goes through its own depth-D MLP, one step being

    Linear(W, W) -> activation -> LayerNorm(W)

with the activation cycling F.relu, torch.tanh, torch.sigmoid by step; the chunk's input
is added back (per-feature residual); the F results are ``torch.cat``-ed. The next layer
re-splits that. A final ``Linear(F*W, 1)`` reads the last layer.

FX size under ``torch.fx.symbolic_trace``, exactly:
    nodes = L * (F * (3*D + 2) + 2) + 3
(per layer: split + F getitems + 3*D per step per feature + F residual adds + cat;
plus placeholder, final linear, output).

    features=16,  depth=3, layers=2  ->    359 nodes   ("illustrative", the default)
    features=32,  depth=5, layers=2  ->  1,095 nodes   ("illustrative_1k")
    features=256, depth=4, layers=3  -> 10,761 nodes   ("illustrative_10k")
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ._common import generator, randn, seeded

_ACTS = (F.relu, torch.tanh, torch.sigmoid)


def expected_node_count(features: int, depth: int, layers: int) -> int:
    """Closed form for ``fx_node_count(illustrative(...)[0])``."""
    return layers * (features * (3 * depth + 2) + 2) + 3


def fx_node_count(module: nn.Module) -> int:
    """Number of nodes in ``torch.fx.symbolic_trace(module).graph``."""
    return len(torch.fx.symbolic_trace(module).graph.nodes)


class FeatureMLP(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(len(self.linears)):
            h = self.norms[i](_ACTS[i % len(_ACTS)](self.linears[i](h)))
        return h + x


class PerFeatureLayer(nn.Module):
    def __init__(self, features: int, width: int, depth: int):
        super().__init__()
        self.features = features
        self.width = width
        self.mlps = nn.ModuleList(FeatureMLP(width, depth) for _ in range(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x, self.width, dim=1)
        return torch.cat([self.mlps[i](chunks[i]) for i in range(self.features)], dim=1)


class Illustrative(nn.Module):
    def __init__(self, features: int = 16, depth: int = 3, layers: int = 2, width: int = 16):
        super().__init__()
        self.layers = nn.ModuleList(
            PerFeatureLayer(features, width, depth) for _ in range(layers)
        )
        self.head = nn.Linear(features * width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def illustrative(
    features: int = 16,
    depth: int = 3,
    layers: int = 2,
    width: int = 16,
    batch: int = 32,
    seed: int = 0,
):
    """Build the model and one example input ``[batch, features*width]``."""
    model = seeded(seed, lambda: Illustrative(features, depth, layers, width))
    g = generator(seed)
    return model, (randn(g, batch, features * width),)


def illustrative_1k(**kw):
    cfg = dict(features=32, depth=5, layers=2)
    cfg.update(kw)
    return illustrative(**cfg)


def illustrative_10k(**kw):
    cfg = dict(features=256, depth=4, layers=3)
    cfg.update(kw)
    return illustrative(**cfg)
