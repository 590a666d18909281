"""batch_linear_lhs: Linears that read the same input become one wide GEMM and a split.

Five heads of different widths on one shared hidden vector, each through tanh, concatenated.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "batch_linear_lhs"
MODEL = "heads_on_shared_input"


class HeadsOnSharedInput(nn.Module):
    def __init__(self, dim: int = 64, widths: tuple[int, ...] = (16, 32, 8, 16, 4)):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, w) for w in widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tanh(h(x)) for h in self.heads], dim=1)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return HeadsOnSharedInput(), (torch.randn(64, 64),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
