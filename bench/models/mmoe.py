"""MMoE (Ma et al., 2018, "Modeling Task Relationships in Multi-task Learning with
Multi-gate Mixture-of-Experts"), small.

One dense input ``x`` ``[B, d]`` feeds E expert MLPs (``Linear -> ReLU -> Linear -> ReLU``,
each to ``[B, h]``) and, per task, a gate ``softmax(Linear(x))`` over the experts
``[B, E]``. Task t reads the experts mixed by its gate, ``sum_e g_t[:, e] * expert_e``
(a multiply over the stacked experts ``[B, E, h]`` and a sum), through its own tower MLP
(``Linear -> ReLU -> Linear``) to one logit; the T logits are concatenated and squashed,
``sigmoid -> [B, T]``. The experts, the gates and the towers are each independent
computations of one shape: the batching rules' intended prey.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import MLP, generator, randn, seeded


class MMoE(nn.Module):
    def __init__(self, dim: int = 64, num_experts: int = 4, expert_dim: int = 32, num_tasks: int = 2,
                 tower_dim: int = 16):
        super().__init__()
        self.experts = nn.ModuleList(MLP([dim, expert_dim, expert_dim], final_act=True) for _ in range(num_experts))
        self.gates = nn.ModuleList(nn.Linear(dim, num_experts) for _ in range(num_tasks))
        self.towers = nn.ModuleList(MLP([expert_dim, tower_dim, 1]) for _ in range(num_tasks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = torch.stack([e(x) for e in self.experts], dim=1)  # [B, E, h]
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            g = torch.softmax(gate(x), dim=-1)  # [B, E]
            mixed = torch.sum(torch.unsqueeze(g, 2) * experts, dim=1)  # [B, h]
            logits.append(tower(mixed))
        return torch.sigmoid(torch.cat(logits, dim=1))  # [B, T]


def make(batch: int = 64, dim: int = 64, num_experts: int = 4, expert_dim: int = 32, num_tasks: int = 2,
         seed: int = 0):
    model = seeded(seed, lambda: MMoE(dim, num_experts, expert_dim, num_tasks))
    g = generator(seed)
    return model, (randn(g, batch, dim),)
