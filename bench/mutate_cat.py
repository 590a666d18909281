"""mutate_cat: a cat of adjacent slices of one tensor is one slice (a view, no copy).

Eight 16-wide fields of a dense input are split apart; two towers read contiguous runs of
fields (0-2 and 3-7), each concatenated back before its Linear.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "mutate_cat"
MODEL = "towers_on_field_runs"


class TowersOnFieldRuns(nn.Module):
    def __init__(self, dim: int = 16, out: int = 32):
        super().__init__()
        self.dim = dim
        self.a = nn.Linear(3 * dim, out)
        self.b = nn.Linear(5 * dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fields = torch.split(x, self.dim, dim=1)
        low = torch.cat([fields[0], fields[1], fields[2]], dim=1)
        high = torch.cat([fields[3], fields[4], fields[5], fields[6], fields[7]], dim=1)
        return self.a(low) + self.b(high)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return TowersOnFieldRuns(), (torch.randn(64, 128),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
