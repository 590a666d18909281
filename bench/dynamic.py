"""Symbolic batch sizes: the graph torch.compile hands its backend when a model is called with a
second batch size (automatic dynamic shapes; here the batch dim of the later inputs is marked
dynamic, as that recompile would make it), optimized and checked at three batch sizes; with
--export, the graph torch.export gives for a dynamic batch Dim instead.

    python bench/dynamic.py [--models parallel_mlp,dhen] [--export]

Per model: how many graphs the backend compiled (1 with --export), whether the graph has a
symbolic batch, whether the optimized model's values match eager at the batch sizes b, b/2 and
b/4 + 1, the cost before -> after for that graph, and Inductor's launches for it:
plain, with Optimus's pre-grad passes, and optimized by optimus_egg (compiled as the backend
compiles it, `baselines.backend_patches()`: the post-grad passes
`baselines.EGG_POST_GRAD` and the CPU kernel order). dlrm is left out: its inputs are indices and
offsets into embedding bags, not rows to cut.
"""
from __future__ import annotations

import argparse

import torch
from optimus_egg.models import build

import optimus_egg
from optimus_egg import baselines, measure
from optimus_egg import pipeline as pipeline_module
from optimus_egg.shapes import size_symbols

MODELS = ["parallel_mlp", "dcn_v2", "wukong", "dhen", "masknet", "interformer", "hstu", "mmoe", "illustrative"]


def rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """The first n rows of a float input, with its batch dim marked dynamic: the recompile then
    has a symbolic batch whatever Dynamo's profile of earlier runs says."""
    if not x.is_floating_point():
        return x
    x = x[:n].clone()
    torch._dynamo.maybe_mark_dynamic(x, 0)
    return x


def batches(ex) -> list[tuple]:
    """The example inputs at the batch sizes b, b/2 and b/4 + 1."""
    b = ex[0].shape[0]
    return [tuple(ex), *(tuple(rows(x, n) for x in ex) for n in (b // 2, b // 4 + 1))]


def through_backend(name: str):
    """(graphs the backend compiled, the last one, optimized, its inputs, values match at b, b/2, b/4 + 1)."""
    model, ex = build(name)
    model.eval()
    sizes = batches(ex)
    seen = []
    real = pipeline_module.optimize

    def spy(gm, inputs, *a, **k):
        out = real(gm, inputs, *a, **k)
        seen.append((gm, out, list(inputs)))
        return out

    pipeline_module.optimize = spy
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=optimus_egg.backend(budget_s=1.0))
        with torch.no_grad():
            match = [measure.values_match(compiled(*s), model(*s)) for s in sizes]
    finally:
        pipeline_module.optimize = real
        torch._dynamo.reset()
    return len(seen), *seen[-1], match


def exported(name: str):
    """The same for torch.export with one dynamic Dim for the batch of every float input."""
    from torch.export import Dim, export

    model, ex = build(name)
    model.eval()
    batch = Dim("batch", min=2)
    gm = export(model, tuple(ex), dynamic_shapes=tuple({0: batch} if x.is_floating_point() else None for x in ex)).module()
    out = optimus_egg.optimize(gm, list(ex), budget_s=1.0, gemm_loops=True)  # as the backend
    with torch.no_grad():
        match = [measure.values_match(out(*s), model(*s)) for s in batches(ex)]
    return 1, gm, out, list(ex), match


def run(name: str, export: bool = False) -> str:
    n_graphs, gm, out, inputs, match = (exported if export else through_backend)(name)
    report = out.meta["optimus_egg"]
    plain = measure.compile_inductor(gm, inputs).launches.total
    optimus = measure.compile_inductor(
        gm, inputs, config_patches={"pre_grad_fusion_options": baselines.OPTIMUS_PRE_GRAD}).launches.total
    egg = measure.compile_inductor(out, inputs, config_patches=baselines.backend_patches()).launches.total
    return (f"{name:13s} graphs {n_graphs}  symbolic batch {bool(size_symbols(gm))!s:5s}  "
            f"values {'match' if all(match) else 'DIFFER ' + str(match)}  "
            f"cost {report.cost_before:.1f} -> {report.cost_after:.1f}  "
            f"launches inductor {plain} optimus {optimus} optimus_egg {egg}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--export", action="store_true", help="capture with torch.export (a dynamic batch Dim), not torch.compile")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        print(run(name, args.export), flush=True)


if __name__ == "__main__":
    main()
