"""pieces: a split whose pieces are concatenated back, in order (the facts split/cat rules guard on).

Sixteen 8-wide fields of a dense input are split apart and concatenated again before a
LayerNorm: the cat is the input itself once the `pieces` facts walk every operand.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "pieces"
MODEL = "split_then_cat_16"


class SplitThenCat(nn.Module):
    def __init__(self, fields: int = 16, dim: int = 8):
        super().__init__()
        self.dim = dim
        self.norm = nn.LayerNorm(fields * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.cat(torch.split(x, self.dim, dim=1), dim=1))


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return SplitThenCat(), (torch.randn(64, 128),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
