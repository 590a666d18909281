"""The torch.compile backend: optimize the Dynamo graph, then hand it to Inductor."""
from __future__ import annotations

from collections.abc import Callable

import torch


def backend(budget_s: float = 1.0, **options) -> Callable:
    """A torch.compile backend with options, e.g. torch.compile(m, backend=backend(budget_s=0.5))."""
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        from optimus_egg.pipeline import optimize

        return compile_fx(optimize(gm, list(example_inputs), budget_s, **options), example_inputs)

    compile_fn.__name__ = "optimus_egg"
    return compile_fn


def optimus_egg_backend(gm: torch.fx.GraphModule, example_inputs):
    """Registered as torch.compile(backend="optimus_egg") through the torch_dynamo_backends entry point."""
    return backend()(gm, example_inputs)
