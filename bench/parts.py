"""Graphs cut into parts (src/optimus_egg/parts.py): a stack of layers, each ending in an
autocast block (a LayerNorm with autocast off), captured by Dynamo; optimize() at a few budgets.

    python bench/parts.py [--layers 4,16] [--budgets 0.1,1] [--repeat 3]

Per layer count and budget: FX nodes, parts, optimize's wall time (median of --repeat runs, each
on the same captured graph), stop reason, cost before -> after, and whether the optimized
graph's values equal the captured graph's.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import optimus_egg


class Layers(nn.Module):
    """Per layer: four linears on four slices of the input, relu, cat; then a LayerNorm under
    autocast(enabled=False) plus a residual. Each layer adds two state changes."""

    def __init__(self, layers: int, d: int = 16):
        super().__init__()
        self.d = d
        self.linears = nn.ModuleList(nn.ModuleList(nn.Linear(d, d) for _ in range(4)) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(4 * d) for _ in range(layers))

    def forward(self, x):
        for linears, norm in zip(self.linears, self.norms):
            y = torch.cat([torch.relu(lin(t)) for lin, t in zip(linears, x.split(self.d, 1))], 1)
            with torch.autocast("cpu", enabled=False):
                x = norm(y) + x
        return x


def capture(layers: int):
    torch.manual_seed(0)
    model, x = Layers(layers), torch.randn(8, 64)
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm

    torch.compile(model, backend=grab)(x)
    (gm, inputs), = graphs
    return gm, inputs


def run(layers: int, budget: float, repeat: int = 3) -> str:
    gm, inputs = capture(layers)
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = optimus_egg.optimize(gm, inputs, budget)
        times.append(time.perf_counter() - start)
    r = out.meta["optimus_egg"]
    same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(out(*inputs), gm(*inputs)))
    return (f"layers {layers} nodes {len(gm.graph.nodes)} parts {r.parts} budget {budget} "
            f"optimize {statistics.median(times):.3f} s (runs {', '.join(f'{t:.3f}' for t in times)}) "
            f"stop {r.stop_reason} cost {r.cost_before:.1f} -> {r.cost_after:.1f} "
            f"values {'match' if same else 'DIFFER'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="4,16")
    ap.add_argument("--budgets", default="0.1,1")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    for layers in (int(v) for v in args.layers.split(",")):
        for budget in (float(v) for v in args.budgets.split(",")):
            print(run(layers, budget, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
