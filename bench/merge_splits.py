"""merge_splits: a split of a split piece, on the same dim, slices the input directly.

A dense input is split into a head and the rest, and the rest split again; each piece gets
its own activation before the pieces are concatenated.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "merge_splits"
MODEL = "split_of_split"


class SplitOfSplit(nn.Module):
    def __init__(self, width: int = 128, out: int = 32):
        super().__init__()
        self.out = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head, rest = torch.split(x, [32, 96], dim=1)
        mid, tail = torch.split(rest, [32, 64], dim=1)
        return self.out(torch.cat([torch.tanh(head), torch.sigmoid(mid), torch.relu(tail)], dim=1))


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return SplitOfSplit(), (torch.randn(64, 128),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
