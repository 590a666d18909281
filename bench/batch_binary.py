"""batch_binary: the same binary op on independent same-shape pairs runs once, on stacks.

Four dense features, each multiplied by its own gate input, returned separately.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "batch_binary"
MODEL = "gated_features_4"


class GatedFeatures(nn.Module):
    def forward(self, a: torch.Tensor, ga: torch.Tensor, b: torch.Tensor, gb: torch.Tensor,
                c: torch.Tensor, gc: torch.Tensor, d: torch.Tensor, gd: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a * ga, b * gb, c * gc, d * gd


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return GatedFeatures(), tuple(torch.randn(64, 32) for _ in range(8))


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
