"""batch_matmul: independent matmuls of alike operands become one matmul of the stacked operands
and an unbind.

Per-feature target attention (DIN / multi-interest style): each of four behaviour features
attends with its own interest queries over its own sequence: four score products and four
weighted sums of alike shapes, none reading another. The operands are slices `x[:, i]` of the
inputs: stacked on dim 1 they are the inputs themselves, so the batched products copy nothing.
"""
import sys

import torch
from _family import main
from torch import nn


class PerFeatureAttention(nn.Module):
    def __init__(self, features: int = 4, dim: int = 32):
        super().__init__()
        self.features = features
        self.scale = dim ** -0.5

    def forward(self, queries: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(self.features):
            q, s = queries[:, i], seqs[:, i]                      # [B, 4, d], [B, L, d]
            a = torch.softmax(torch.matmul(q, s.transpose(1, 2)) * self.scale, dim=-1)
            out.append(torch.matmul(a, s))
        return torch.cat(out, dim=2)


FAMILY = "batch_matmul"
MODEL = "per_feature_attention"


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return PerFeatureAttention(), (torch.randn(64, 4, 4, 32), torch.randn(64, 4, 20, 32))


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
