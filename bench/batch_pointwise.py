"""batch_pointwise: the same elementwise op on independent same-shape tensors runs once, stacked.

Six separate dense features, each through tanh, returned separately.
"""
import sys

import torch
from _family import main
from torch import nn

FAMILY = "batch_pointwise"
MODEL = "tanh_on_6_inputs"


class TanhOnInputs(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor,
                e: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.tanh(t) for t in (a, b, c, d, e, f))


def make() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return TanhOnInputs(), tuple(torch.randn(64, 32) for _ in range(6))


if __name__ == "__main__":
    sys.exit(main(FAMILY, MODEL, make))
