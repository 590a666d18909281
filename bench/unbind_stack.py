"""unbind_stack: unbind -> the same op on every piece -> stack, then a cat of the unbound pieces.

Per-field ReLU over a [batch, fields, dim] tensor, restacked, then flattened by concatenating
the fields: the stack is the op on the whole, and the cat is a reshape.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "unbind_stack"
MODEL = "unbind_relu_stack"


class UnbindReluStack(nn.Module):
    def __init__(self, fields: int = 8, dim: int = 32, out: int = 32):
        super().__init__()
        self.fields = fields
        self.out = nn.Linear(fields * dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.unbind(x, dim=1)
        h = torch.stack([torch.relu(f[i]) for i in range(self.fields)], dim=1)
        return self.out(torch.cat(torch.unbind(h, dim=1), dim=1))


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return UnbindReluStack(), (torch.randn(64, 8, 32),)


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
