"""Command line: `optimus-egg compare` (also `python -m optimus_egg compare`).

Runs one model side by side under plain Inductor, Inductor + PyTorch's Optimus, and
optimus_egg at one or more budgets, and prints kernel launches, optimize / compile time,
median latency (interleaved runs) and whether values match eager.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.fx as fx


@dataclass
class Arm:
    name: str
    launches: object
    optimize_s: float
    compile_s: float
    ms: float = float("nan")
    match: bool = False
    fn: object = None


def _parse_budgets(text: str) -> list[float]:
    try:
        budgets = [float(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budgets takes comma-separated seconds, got {text!r}") from None
    if not budgets or any(b < 0 for b in budgets):
        raise argparse.ArgumentTypeError("--budgets needs at least one budget, each >= 0")
    return budgets


def compare(model_name: str, budgets: list[float], train: bool, rounds: int, out=sys.stdout) -> list[Arm]:
    from optimus_egg import measure
    from optimus_egg.baselines import inductor_with_optimus
    from optimus_egg.models import build
    from optimus_egg.pipeline import optimize

    model, inputs = build(model_name)
    model.train(train)
    inputs = list(inputs)
    gm = fx.symbolic_trace(model)
    with torch.set_grad_enabled(train):
        expected = model(*inputs)
    print(f"model {model_name}: {len(gm.graph.nodes)} FX nodes, {'training' if train else 'inference'}", file=out)

    def arm(name: str, graph: fx.GraphModule, optimize_s: float) -> Arm:
        print(f"  compiling {name} ...", file=out, flush=True)
        c = measure.compile_inductor(graph, inputs, training=train)
        with torch.set_grad_enabled(train):
            match = measure.values_match(c(*inputs), expected, rtol=1e-4, atol=1e-4)
        return Arm(name, c.launches, optimize_s, c.compile_s, match=match, fn=c)

    arms = [arm("inductor", gm, 0.0)]
    t = time.perf_counter()
    opt = inductor_with_optimus(gm, inputs, post_grad=train)
    arms.append(arm("optimus", opt, time.perf_counter() - t))
    for b in budgets:
        t = time.perf_counter()
        egg = optimize(gm, inputs, budget_s=b)
        arms.append(arm(f"optimus_egg@{b:g}s", egg, time.perf_counter() - t))
        print(f"    {str(egg.meta['optimus_egg']).splitlines()[0]}", file=out)
    with torch.set_grad_enabled(train):
        medians = measure.interleaved_medians({a.name: a.fn for a in arms}, inputs, rounds=rounds)
    for a in arms:
        a.ms = medians[a.name]
    _print_table(arms, out)
    return arms


def _print_table(arms: list[Arm], out) -> None:
    base = arms[0].ms
    head = f"{'arm':<20}{'launches':>9}{'gemm':>6}{'kernels':>8}{'optimize s':>11}{'compile s':>10}{'median ms':>10}{'vs ind.':>8}  values"
    print(head, file=out)
    print("-" * len(head), file=out)
    for a in arms:
        L = a.launches
        print(f"{a.name:<20}{L.total:>9}{L.extern:>6}{L.cpp + L.triton + L.fallback:>8}"
              f"{a.optimize_s:>11.2f}{a.compile_s:>10.2f}{a.ms:>10.3f}{a.ms / base:>8.2f}  "
              f"{'match' if a.match else 'DIFFER'}", file=out)


def main(argv: list[str] | None = None) -> int:
    from optimus_egg.models import MODELS

    p = argparse.ArgumentParser(prog="optimus-egg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="plain Inductor vs Inductor + Optimus vs optimus_egg on one model")
    c.add_argument("--model", default="parallel_mlp", choices=sorted(MODELS))
    c.add_argument("--budgets", type=_parse_budgets, default=[1.0], help="comma-separated seconds (default 1)")
    c.add_argument("--train", action="store_true", help="compile and time forward + backward")
    c.add_argument("--rounds", type=int, default=50, help="interleaved timing rounds")
    args = p.parse_args(argv)
    arms = compare(args.model, args.budgets, args.train, args.rounds)
    return 0 if all(a.match for a in arms) else 1
