"""batch_matmul_lhs: matmuls of one first operand become one matmul of the concatenated second
operands and a split.

Feature tokens attend over two key sets, the tokens themselves with a summary and a sequence
(InterFormer's interaction arch): two score products of one query.
"""
import sys

import torch
from _family import main
from torch import nn


class AttendTwice(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.scale = dim ** -0.5
        self.norm = nn.LayerNorm(dim)

    def forward(self, feats: torch.Tensor, summary: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        seq = self.norm(seq)
        tokens = torch.cat([feats, summary], dim=1)
        a = torch.softmax(torch.bmm(feats, tokens.transpose(1, 2)) * self.scale, dim=-1)
        b = torch.softmax(torch.bmm(feats, seq.transpose(1, 2)) * self.scale, dim=-1)
        return torch.cat([torch.bmm(a, tokens), torch.bmm(b, seq)], dim=2)


FAMILY = "batch_matmul_lhs"
MODEL = "attend_twice"


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return AttendTwice(), (torch.randn(32, 8, 32), torch.randn(32, 1, 32), torch.randn(32, 16, 32))


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
