"""split_cat: split -> the same op on every piece -> cat, twice in a row.

Once the op is moved onto the whole tensor (an op on a split piece is the piece of the op
on the whole), each cat of the split's pieces is the op's output, and both split/cat pairs go.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "split_cat"
MODEL = "split_op_cat_chain"


class SplitOpCatChain(nn.Module):
    def __init__(self, width: int = 128, out: int = 32):
        super().__init__()
        self.width = width
        self.out = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.split(x, 16, dim=1)
        h = torch.cat([torch.tanh(p[i]) for i in range(self.width // 16)], dim=1)
        q = torch.split(h, 32, dim=1)
        h = torch.cat([torch.sigmoid(q[i]) for i in range(self.width // 32)], dim=1)
        return self.out(h)


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return SplitOpCatChain(), (torch.randn(64, 128),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
