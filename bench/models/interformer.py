"""InterFormer-like model (after Zeng et al., 2024: interleaved interaction between
non-sequence and sequence features), small.

Inputs: non-sequence features ``x`` ``[B, F*Din]`` and a behaviour sequence
``seq`` ``[B, L, Ds]``.
  * per-feature linear projections: ``torch.split`` x into F chunks, one Linear each,
    ``torch.stack`` to tokens ``[B, F, d]``; one Linear projects the sequence to d.
Each layer:
  * sequence arch: single-head self-attention over the sequence (bmm, softmax, bmm),
    conditioned on a linear summary of the feature tokens, residual + LayerNorm;
  * summarization: H heads, ``torch.chunk`` of the sequence along d; per head a Linear
    scores positions (softmax over L, attention pooling via bmm) and a Linear transforms
    the pooled vector; heads concatenated into one summary token ``[B, 1, d]``;
  * interaction arch: feature tokens attend over [features; summary] (bmm-softmax-bmm)
    and cross-attend over the sequence (bmm-softmax-bmm); both are concatenated, mixed
    by a Linear, residual + LayerNorm.
Head: MLP over the flattened feature tokens and the last summary token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._common import MLP, generator, randn, seeded


def _attend(q: torch.Tensor, kv: torch.Tensor, scale: float) -> torch.Tensor:
    a = torch.softmax(torch.bmm(q, torch.transpose(kv, 1, 2)) * scale, dim=-1)
    return torch.bmm(a, kv)


class Summarize(nn.Module):
    """Multi-head attention pooling of a sequence, one pair of Linears per head."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError("dim must be divisible by heads")
        self.heads = heads
        hd = dim // heads
        self.score = nn.ModuleList(nn.Linear(hd, 1) for _ in range(heads))
        self.value = nn.ModuleList(nn.Linear(hd, hd) for _ in range(heads))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(s, self.heads, dim=2)
        pooled = []
        for h in range(self.heads):
            w = torch.softmax(self.score[h](parts[h]), dim=1)  # [B, L, 1]
            p = torch.bmm(torch.transpose(w, 1, 2), parts[h])  # [B, 1, hd]
            pooled.append(self.value[h](p))
        return torch.cat(pooled, dim=2)  # [B, 1, d]


class InterFormerLayer(nn.Module):
    def __init__(self, num_features: int, dim: int, heads: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.feat_ctx = nn.Linear(num_features * dim, dim)
        self.seq_norm = nn.LayerNorm(dim)
        self.summarize = Summarize(dim, heads)
        self.mix = nn.Linear(2 * dim, dim)
        self.feat_norm = nn.LayerNorm(dim)

    def forward(self, feats: torch.Tensor, s: torch.Tensor):
        # sequence arch, conditioned on the non-sequence features
        q, k, v = self.q(s), self.k(s), self.v(s)
        a = torch.softmax(torch.bmm(q, torch.transpose(k, 1, 2)) * self.scale, dim=-1)
        ctx = torch.unsqueeze(self.feat_ctx(torch.flatten(feats, 1)), 1)
        s = self.seq_norm(s + self.o(torch.bmm(a, v)) + ctx)
        # summarization
        summary = self.summarize(s)  # [B, 1, d]
        # interaction arch
        tokens = torch.cat([feats, summary], dim=1)  # [B, F+1, d]
        inter = _attend(feats, tokens, self.scale)
        cross = _attend(feats, s, self.scale)
        feats = self.feat_norm(feats + F.relu(self.mix(torch.cat([inter, cross], dim=2))))
        return feats, s, summary


class InterFormerLike(nn.Module):
    def __init__(
        self,
        num_features: int = 8,
        feat_dim: int = 16,
        seq_dim: int = 16,
        dim: int = 32,
        heads: int = 4,
        num_layers: int = 2,
        hidden: int = 64,
    ):
        super().__init__()
        self.num_features = num_features
        self.feat_dim = feat_dim
        self.feat_proj = nn.ModuleList(nn.Linear(feat_dim, dim) for _ in range(num_features))
        self.seq_proj = nn.Linear(seq_dim, dim)
        self.layers = nn.ModuleList(
            InterFormerLayer(num_features, dim, heads) for _ in range(num_layers)
        )
        self.head = MLP([(num_features + 1) * dim, hidden, 1])

    def forward(self, x: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(x, self.feat_dim, dim=1)
        feats = torch.stack(
            [self.feat_proj[i](chunks[i]) for i in range(self.num_features)], dim=1
        )
        s = self.seq_proj(seq)
        summary = None
        for layer in self.layers:
            feats, s, summary = layer(feats, s)
        return self.head(torch.cat([torch.flatten(feats, 1), torch.flatten(summary, 1)], dim=1))


def make(
    batch: int = 32,
    num_features: int = 8,
    feat_dim: int = 16,
    seq_len: int = 16,
    seq_dim: int = 16,
    dim: int = 32,
    heads: int = 4,
    num_layers: int = 2,
    seed: int = 0,
):
    model = seeded(
        seed, lambda: InterFormerLike(num_features, feat_dim, seq_dim, dim, heads, num_layers)
    )
    g = generator(seed)
    x = randn(g, batch, num_features * feat_dim)
    seq = randn(g, batch, seq_len, seq_dim)
    return model, (x, seq)
