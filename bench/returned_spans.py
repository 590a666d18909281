"""Returned column spans of one width as rows of one bmm (pipeline.stack_returned_spans).

    python bench/returned_spans.py [--rounds 200]

Three linears of one 2-D input, returned as they are (inference, one torch thread), at a few
shapes (batch x in -> 3 x out). Arms, each compiled by Inductor and checked against eager:
plain Inductor, PyTorch's Optimus (its spans of one wide GEMM, strided), optimus_egg@1s (rows
of one bmm) and optimus_egg@1s compiled as the backend compiles it (GEMM loops, parameter
copies hoisted: baselines.as_backend_compiles), each also with the spans copied to stay
contiguous instead (" copies": the pass off). Prints launches, the median of interleaved
rounds and its ratio to plain Inductor's, and whether the outputs are contiguous as eager's.
"""
from __future__ import annotations

import argparse
import contextlib
from unittest import mock

import torch
from torch import fx, nn

from optimus_egg import measure, pipeline
from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
from optimus_egg.bench import VALUE_TOL, one_thread, warm_up_inductor

SHAPES = ((32, 16, 8), (64, 256, 256), (512, 64, 64))


class ThreeHeads(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, out) for _ in range(3))

    def forward(self, x):
        return tuple(h(x) for h in self.heads)


def arms(gm: fx.GraphModule, x: torch.Tensor) -> dict[str, fx.GraphModule]:
    egg = {}
    for copies in (False, True):
        with mock.patch.object(pipeline, "stack_returned_spans", lambda *a, **k: set()) if copies \
                else contextlib.nullcontext():
            for backend in (False, True):
                name = "optimus_egg" + (" backend" if backend else "") + (" copies" if copies else "")
                out = pipeline.optimize(gm, [x], budget_s=1.0, gemm_loops=backend)
                egg[name] = as_backend_compiles(out) if backend else out
    return {"inductor": gm, "optimus": inductor_with_optimus(gm, [x], post_grad=False), **egg}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args(argv)
    ok = True
    with one_thread(), torch.no_grad():
        warm_up_inductor(train=False)
        for batch, dim, out in SHAPES:
            torch.manual_seed(0)
            model, x = ThreeHeads(dim, out).eval(), torch.randn(batch, dim)
            gm, expected = fx.symbolic_trace(model), model(x)
            fns, notes = {}, {}
            for name, graph in arms(gm, x).items():
                c = measure.compile_inductor(graph, [x])
                got = c.fn(x)
                match = measure.values_match(got, expected, **VALUE_TOL)
                ok &= match
                fns[name] = c.fn
                notes[name] = (f"{c.launches.total} launches, contiguous "
                               f"{all(t.is_contiguous() for t in got)}, values {'match' if match else 'DIFFER'}")
            ms = measure.interleaved_medians(fns, [x], rounds=args.rounds)
            print(f"{batch} x {dim} -> 3 x {out}")
            for name in fns:
                print(f"  {name:26s} {ms[name]:8.4f} ms  {ms[name] / ms['inductor']:5.3f}x  {notes[name]}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
