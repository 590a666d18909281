"""DCN-v2 (Wang et al., 2021): low-rank mixture-of-experts cross network, stacked with
a deep MLP.

Cross layer l, experts i = 1..K, all reading the same x_l:
    E_i(x_l) = x_0 * (U_i tanh(C_i tanh(V_i x_l)) + b_i)
    g_i(x_l) = G_i x_l                            (scalar gate per expert)
    x_{l+1}  = sum_i softmax(g)_i E_i(x_l) + x_l
Expert outputs are combined with ``torch.stack`` and one ``bmm`` against the gates.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import MLP, generator, randn, seeded


class LowRankMoECross(nn.Module):
    def __init__(self, dim: int, num_experts: int, rank: int):
        super().__init__()
        self.num_experts = num_experts
        self.V = nn.ModuleList(nn.Linear(dim, rank, bias=False) for _ in range(num_experts))
        self.C = nn.ModuleList(nn.Linear(rank, rank, bias=False) for _ in range(num_experts))
        self.U = nn.ModuleList(nn.Linear(rank, dim) for _ in range(num_experts))
        self.gates = nn.ModuleList(nn.Linear(dim, 1, bias=False) for _ in range(num_experts))

    def forward(self, x0: torch.Tensor, xl: torch.Tensor) -> torch.Tensor:
        experts = []
        gates = []
        for i in range(self.num_experts):
            h = torch.tanh(self.V[i](xl))
            h = torch.tanh(self.C[i](h))
            experts.append(x0 * self.U[i](h))
            gates.append(self.gates[i](xl))
        e = torch.stack(experts, dim=2)  # [B, d, K]
        w = torch.softmax(torch.cat(gates, dim=1), dim=1)  # [B, K]
        mixed = torch.bmm(e, torch.unsqueeze(w, 2))  # [B, d, 1]
        return torch.squeeze(mixed, 2) + xl


class DCNv2(nn.Module):
    def __init__(
        self,
        in_dim: int = 64,
        num_layers: int = 3,
        num_experts: int = 4,
        rank: int = 16,
        deep: tuple[int, ...] = (64, 32),
    ):
        super().__init__()
        self.cross = nn.ModuleList(
            LowRankMoECross(in_dim, num_experts, rank) for _ in range(num_layers)
        )
        self.deep = MLP([in_dim, *deep], final_act=True)
        self.head = nn.Linear(deep[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xl = x
        for layer in self.cross:
            xl = layer(x, xl)
        return self.head(self.deep(xl))


def make(
    batch: int = 64,
    in_dim: int = 64,
    num_layers: int = 3,
    num_experts: int = 4,
    rank: int = 16,
    seed: int = 0,
):
    model = seeded(seed, lambda: DCNv2(in_dim, num_layers, num_experts, rank))
    g = generator(seed)
    return model, (randn(g, batch, in_dim),)
