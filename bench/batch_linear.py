"""batch_linear: independent same-shape Linears become one batched GEMM.

Eight 32-wide fields of a dense input, each through its own Linear(32, 64), concatenated.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "batch_linear"
MODEL = "per_field_linears_8"


class PerFieldLinears(nn.Module):
    def __init__(self, fields: int = 8, dim: int = 32, hidden: int = 64):
        super().__init__()
        self.dim = dim
        self.linears = nn.ModuleList(nn.Linear(dim, hidden) for _ in range(fields))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x, self.dim, dim=1)
        return torch.cat([lin(chunks[i]) for i, lin in enumerate(self.linears)], dim=1)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return PerFieldLinears(), (torch.randn(64, 256),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
