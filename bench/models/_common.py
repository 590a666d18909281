"""Shared helpers for the benchmark model zoo.

Every factory builds its parameters under a forked, seeded RNG (the global RNG state
is left untouched) and draws its example inputs from a private ``torch.Generator``,
so ``build(name)`` is deterministic run to run.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

M = TypeVar("M", bound=nn.Module)


def seeded(seed: int, ctor: Callable[[], M]) -> M:
    """Construct a module with parameters drawn from ``torch.manual_seed(seed)``
    without disturbing the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ctor()


def generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32)


class MLP(nn.Module):
    """Linear layers with F.relu between them (functional relu, which Optimus matches).

    ``final_act`` applies relu after the last layer too (DLRM's bottom MLP does)."""

    def __init__(self, dims: Sequence[int], final_act: bool = False):
        super().__init__()
        if len(dims) < 2:
            raise ValueError("MLP needs at least an input and an output width")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.final_act = final_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last or self.final_act:
                x = F.relu(x)
        return x
