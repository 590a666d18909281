"""batch_layernorm: independent same-shape LayerNorms become one batched normalization.

Eight 32-wide fields of a dense input, each through its own LayerNorm(32), concatenated.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "batch_layernorm"
MODEL = "per_field_layernorms_8"


class PerFieldLayerNorms(nn.Module):
    def __init__(self, fields: int = 8, dim: int = 32):
        super().__init__()
        self.dim = dim
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(fields))
        for norm in self.norms:  # non-trivial affine parameters, so batching them is checked
            nn.init.normal_(norm.weight)
            nn.init.normal_(norm.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x, self.dim, dim=1)
        return torch.cat([norm(chunks[i]) for i, norm in enumerate(self.norms)], dim=1)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return PerFieldLayerNorms(), (torch.randn(64, 256),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
