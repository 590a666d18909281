"""The torch.compile backend: optimize the Dynamo graph, then hand it to Inductor."""
from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def backend(budget_s: float = 1.0, post_grad: bool = True, **options) -> Callable:
    """A torch.compile backend with options, e.g. torch.compile(m, backend=backend(budget_s=0.5)).

    optimus_egg rewrites the graph Dynamo captures, the forward; with `post_grad` (default)
    Inductor then also runs PyTorch's post-grad Optimus passes in `baselines.EGG_POST_GRAD`
    (batching of ATen mm and mul ops, split-cat cleanups) on what it compiles, which in
    training includes the backward graph that optimus_egg never sees. Either way Inductor
    compiles the backward without in-place buffer reuse (`baselines.EGG_BACKWARD`: a torch 2.13
    bug). Other options go to `optimize`.

    If Inductor fails on the optimized graph, the backend warns and compiles the graph Dynamo
    gave it instead (with `strict=True` it raises). The backward is compiled lazily, on the
    first backward call, outside this fallback.
    """
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        from optimus_egg.baselines import (
            EGG_BACKWARD,
            EGG_POST_GRAD,
            backward_patched,
            post_grad_patches,
        )
        from optimus_egg.pipeline import optimize

        def inductor(g: torch.fx.GraphModule):
            # compile_fx re-applies its config_patches when it compiles the backward later
            return compile_fx(g, example_inputs, inner_compile=backward_patched(EGG_BACKWARD),
                              config_patches=post_grad_patches(EGG_POST_GRAD) if post_grad else None)

        out = optimize(gm, list(example_inputs), budget_s, **options)
        try:
            return inductor(out)
        except Exception as e:
            # Dynamo's own signals (a restart of the capture, RestartAnalysis) pass through; an
            # Inductor error is one of Dynamo's exceptions too (InductorError is a
            # BackendCompilerFailed) and is a failure like any other
            exc = torch._dynamo.exc
            signal = isinstance(e, exc.TorchDynamoException) and not isinstance(e, exc.BackendCompilerFailed)
            if not out.meta["optimus_egg"].changed or options.get("strict") or signal:
                raise
            warnings.warn(f"optimus_egg: Inductor failed on the optimized graph ({type(e).__name__}: {e}); "
                          "compiling the unmodified graph", RuntimeWarning, stacklevel=2)
            return inductor(gm)

    compile_fn.__name__ = "optimus_egg"
    return compile_fn


def optimus_egg_backend(gm: torch.fx.GraphModule, example_inputs):
    """Registered as torch.compile(backend="optimus_egg") through the torch_dynamo_backends entry point."""
    return backend()(gm, example_inputs)
