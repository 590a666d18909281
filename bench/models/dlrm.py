"""DLRM (Naumov et al., 2019), small.

Dense features -> bottom MLP (relu after every layer) -> one d-dim vector. Each sparse
feature has its own ``nn.EmbeddingBag(mode="sum")`` fed ``(indices, offsets)``. The
bottom output and the T pooled embeddings are stacked to ``[B, T+1, d]``; pairwise dot
products come from one ``torch.bmm``; the strictly upper triangle is selected (flattened
``index_select`` with a precomputed buffer); it is concatenated with the bottom output and
fed to the top MLP, then a sigmoid.

Inputs: ``dense`` float32 ``[B, num_dense]``; ``indices`` int64 ``[T, B*bag_size]`` (one row
per table, unbound with ``torch.unbind``); ``offsets`` int64 ``[B]`` (fixed bag size, shared
by all tables). The index tensors are necessarily integers.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ._common import MLP, generator, randn, seeded


class DLRM(nn.Module):
    def __init__(
        self,
        num_dense: int = 13,
        num_tables: int = 4,
        rows: int = 100,
        emb_dim: int = 16,
        bottom: Sequence[int] = (32,),
        top: Sequence[int] = (64, 32),
    ):
        super().__init__()
        self.num_tables = num_tables
        self.bottom = MLP([num_dense, *bottom, emb_dim], final_act=True)
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(rows, emb_dim, mode="sum") for _ in range(num_tables)
        )
        n = num_tables + 1
        iu, ju = torch.triu_indices(n, n, offset=1)
        self.register_buffer("tri_index", iu * n + ju)
        num_pairs = n * (n - 1) // 2
        self.top = MLP([emb_dim + num_pairs, *top, 1])

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        per_table = torch.unbind(indices, dim=0)
        embs = [self.tables[t](per_table[t], offsets) for t in range(self.num_tables)]
        feats = torch.stack([x] + embs, dim=1)  # [B, T+1, d]
        z = torch.bmm(feats, torch.transpose(feats, 1, 2))  # [B, T+1, T+1]
        inter = torch.index_select(torch.flatten(z, 1), 1, self.tri_index)
        return torch.sigmoid(self.top(torch.cat([x, inter], dim=1)))


def make(
    batch: int = 64,
    num_dense: int = 13,
    num_tables: int = 4,
    rows: int = 100,
    emb_dim: int = 16,
    bag_size: int = 3,
    seed: int = 0,
):
    model = seeded(seed, lambda: DLRM(num_dense, num_tables, rows, emb_dim))
    g = generator(seed)
    dense = randn(g, batch, num_dense)
    indices = torch.randint(0, rows, (num_tables, batch * bag_size), generator=g, dtype=torch.int64)
    offsets = torch.arange(0, batch * bag_size, bag_size, dtype=torch.int64)
    return model, (dense, indices, offsets)
