"""MaskNet (Wang et al., 2021), parallel variant, small.

Input: F field embeddings flattened, ``[B, F*D]``.
  * LN-EMB: ``torch.chunk`` into F fields, a LayerNorm per field, concatenate.
  * K parallel MaskBlocks, each reading the same embeddings:
      mask   = W2 relu(W1 V_emb)          (instance-guided mask, reduction MLP)
      masked = mask * LN_EMB(V_emb)
      out    = relu(LayerNorm(W masked))
  * concatenate the K outputs, output MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import MLP, generator, randn, seeded


class MaskBlock(nn.Module):
    def __init__(self, in_dim: int, agg_dim: int, hidden: int):
        super().__init__()
        self.mask1 = nn.Linear(in_dim, agg_dim)
        self.mask2 = nn.Linear(agg_dim, in_dim)
        self.hidden = nn.Linear(in_dim, hidden, bias=False)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, emb: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        mask = self.mask2(F.relu(self.mask1(emb)))
        return F.relu(self.norm(self.hidden(mask * normed)))


class MaskNet(nn.Module):
    def __init__(
        self,
        num_fields: int = 8,
        dim: int = 16,
        num_blocks: int = 3,
        agg_dim: int = 64,
        hidden: int = 32,
        mlp: tuple[int, ...] = (64,),
    ):
        super().__init__()
        self.num_fields = num_fields
        self.field_norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_fields))
        self.blocks = nn.ModuleList(
            MaskBlock(num_fields * dim, agg_dim, hidden) for _ in range(num_blocks)
        )
        self.out = MLP([num_blocks * hidden, *mlp, 1])

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        fields = torch.chunk(emb, self.num_fields, dim=1)
        normed = torch.cat(
            [self.field_norms[i](fields[i]) for i in range(self.num_fields)], dim=1
        )
        outs = [block(emb, normed) for block in self.blocks]
        return self.out(torch.cat(outs, dim=1))


def make(
    batch: int = 64,
    num_fields: int = 8,
    dim: int = 16,
    num_blocks: int = 3,
    seed: int = 0,
):
    model = seeded(seed, lambda: MaskNet(num_fields, dim, num_blocks))
    g = generator(seed)
    return model, (randn(g, batch, num_fields * dim),)
