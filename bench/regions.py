"""Layers that share one body: `torch.compiler.nested_compile_region` on a layer's forward makes
Dynamo run its calls through one `invoke_subgraph` body, which optimus_egg optimizes once for
every call (parts.py, SHARED_OPS).

    python bench/regions.py [--layers 6] [--width 8] [--train]

The model: `layers` layers in a row, each `width` parallel linears on the layer's input, tanh'd
and summed, plus a residual and a LayerNorm. For plain Inductor and for the optimus_egg backend
(strict), it prints Inductor's launches for everything compiled (every call of the shared body
counted), whether values (and, with --train, every parameter's gradient) equal eager's, and
optimize()'s report of the graph Dynamo gave the backend.
"""
from __future__ import annotations

import argparse
import copy

import torch
from torch import nn

import optimus_egg
from optimus_egg.measure import Launches, count_launches
from optimus_egg.parts import trains_a_shared_body


class Layer(nn.Module):
    def __init__(self, d: int, width: int):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(width))
        self.norm = nn.LayerNorm(d)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return self.norm(x + sum(torch.tanh(lin(x)) for lin in self.ls))


class Layers(nn.Module):
    def __init__(self, layers: int, width: int, d: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def run(layers: int, width: int, train: bool) -> None:
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model, x = Layers(layers, width), torch.randn(64, 32)
    expected_model = copy.deepcopy(model)
    with torch.set_grad_enabled(train):
        expected = expected_model(x)
        if train:
            expected.sum().backward()
    reports = []
    real = optimus_egg.backend(budget_s=2.0, strict=True)

    def egg(gm, example_inputs):  # (the report of optimize called as the backend calls it)
        reuse = not trains_a_shared_body(gm)
        reports.append(optimus_egg.optimize(gm, list(example_inputs), 2.0, strict=True,
                                            buffer_reuse=reuse).meta["optimus_egg"])
        return real(gm, example_inputs)

    for name, backend in (("inductor", "inductor"), ("optimus_egg", egg)):
        torch._dynamo.reset()
        m = copy.deepcopy(model)

        def step(m=m, backend=backend):
            with torch.set_grad_enabled(train):
                out = torch.compile(m, backend=backend)(x)
                if train:
                    out.sum().backward()
            return out

        out, codes = run_and_get_code(step)
        launches = sum((count_launches(c) for c in codes), Launches())
        same = torch.allclose(out, expected, rtol=1e-4, atol=1e-5) and (not train or all(
            torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            for p, q in zip(m.parameters(), expected_model.parameters())))
        print(f"{name:<12} {launches}  values{' and grads' if train else ''} {'match' if same else 'DIFFER'}")
    for r in reports:
        print(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--train", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    run(a.layers, a.width, a.train)


if __name__ == "__main__":
    main()
