"""The torch.compile backend: optimize the Dynamo graph, then hand it to Inductor."""
from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


# Keywords of `optimize` that `backend` passes on (budget_s is backend's own).
OPTIMIZE_OPTIONS = ("strict", "disable", "limits", "verify")
BACKEND_OPTIONS = ("budget_s", "post_grad", "kernel_order", "gemm_loops", "mask_stores", "hoist", "inductor",
                   *OPTIMIZE_OPTIONS)


def backend(budget_s: float = 1.0, post_grad: bool = True, kernel_order: bool = True,
            gemm_loops: bool = True, mask_stores: bool = True, hoist: bool = True, inductor: dict | None = None,
            **options) -> Callable:
    """A torch.compile backend with options, e.g. torch.compile(m, backend=backend(budget_s=0.5)).

    optimus_egg rewrites the graph Dynamo captures, the forward; with `post_grad` (default)
    Inductor then also runs the post-grad passes in `baselines.EGG_POST_GRAD` (PyTorch's
    batching of ATen mm ops and split-cat cleanups, optimus_egg's batching of bmm ops; on CPU a
    GEMM batch only where it copies few elements per launch saved) on what it compiles, which
    in training includes the backward graph that optimus_egg never sees. With `kernel_order`
    (default) Inductor's scheduler packs a CPU graph's code into fewest C++ kernels
    (`kernel_order.py`; forward and backward). With `gemm_loops` (default) Inductor writes
    small CPU GEMMs as loops it fuses with their neighbours (`gemm_loops.py`; forward and
    backward), and optimize prices them so (`optimize(..., gemm_loops=True)`): it leaves them
    unbatched, as do the post-grad GEMM batchings. With `mask_stores` (default) Inductor stores
    the bool masks a CPU training graph saves for the backward as bytes (`mask_stores.py`), about
    8x faster than its vectorized bool store. With `hoist` (default) an inference graph's copies
    of parameters (the stacked weights of its batches) are computed once, and again only after
    one of those parameters changes, not on every call (`hoist.py`; not where CUDA graphs replay
    the graph), and optimize prices them so (`optimize(..., hoisted=True)`). Either way Inductor
    compiles the backward without in-place buffer reuse (`baselines.EGG_BACKWARD`: a torch 2.13
    bug), and a training graph calling a `nested_compile_region` body whose results need a
    gradient without any buffer reuse (`baselines.SHARED_BODY_TRAINING`, and without the mask stores, which do not
    compile so), which lets optimize rewrite such a graph, the body included (its
    `buffer_reuse=False`). `inductor`:
    Inductor config options (``{"max_autotune": True}``), applied over optimus_egg's. Other
    options (OPTIMIZE_OPTIONS: strict, disable, limits, verify) go to `optimize`; any other
    name is a TypeError.

    If Inductor fails on the optimized graph, the backend warns and compiles the graph Dynamo
    gave it instead, and if that fails with these Inductor options, that graph without them, as
    plain torch.compile would (with `strict=True` it raises). The backward is compiled lazily,
    on the first backward call, when the forward can no longer be swapped: if Inductor fails
    on it with the options, the backend warns and compiles it again without them (a copy of
    the graph as it was: a pass that raised may have left it half rewritten).
    """
    unknown = sorted(set(options) - set(OPTIMIZE_OPTIONS))
    if unknown:
        raise TypeError(f"optimus_egg.backend: unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"the options are {', '.join(BACKEND_OPTIONS)}")
    for name, value in (("post_grad", post_grad), ("kernel_order", kernel_order), ("gemm_loops", gemm_loops),
                        ("mask_stores", mask_stores), ("hoist", hoist)):
        if not isinstance(value, bool):
            raise TypeError(f"optimus_egg.backend: {name} must be a bool, got {type(value).__name__}")
    from optimus_egg.pipeline import check_budget_and_disable

    check_budget_and_disable(budget_s, options.get("disable", ()))
    user = _checked_inductor_options(inductor)

    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        from torch._inductor import config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        from optimus_egg import hoist as hoisting
        from optimus_egg.baselines import EGG_BACKWARD, SHARED_BODY_TRAINING, backend_patches, backward_patched
        from optimus_egg.parts import trains_a_shared_body
        from optimus_egg.pipeline import optimize

        shared = trains_a_shared_body(gm)  # (then compiled without buffer reuse, optimized or not)
        # (CUDA graphs would copy each hoisted input into a static buffer on every replay)
        cudagraphs = user.get("triton.cudagraphs", inductor_config.triton.cudagraphs) and any(
            isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)

        compile_inner = backward_patched(EGG_BACKWARD)
        extras = post_grad or kernel_order or gemm_loops or mask_stores  # Inductor options beyond plain torch.compile's

        def inner(g: torch.fx.GraphModule, inputs, **kw):
            if not (kw.get("is_backward") and extras) or options.get("strict"):
                return compile_inner(g, inputs, **kw)
            from torch._inductor import config

            from optimus_egg.measure import copy_graph_module

            original = copy_graph_module(g)
            try:
                return compile_inner(g, inputs, **kw)
            except Exception as e:
                if _dynamo_signal(e):
                    raise
                warnings.warn(f"optimus_egg: Inductor failed on the backward with optimus_egg's Inductor options "
                              f"({type(e).__name__}: {e}); compiling it without them", RuntimeWarning, stacklevel=2)
            plain = {"post_grad_fusion_options": {}, "post_grad_custom_pre_pass": None, "post_grad_custom_post_pass": None,
                     "_post_fusion_custom_pass": None, "reorder_for_peak_memory": True}
            with config.patch({**plain, **user}):
                return compile_inner(original, inputs, **kw)

        def inductor(g: torch.fx.GraphModule, with_extras: bool = extras, inputs=example_inputs):
            # compile_fx re-applies its config_patches when it compiles the backward later
            # (the mask stores with the reuse off: C++ that does not compile, "Vectorized<bool> has no cast")
            patches = {**(backend_patches(post_grad, kernel_order, gemm_loops, mask_stores and not shared)
                          if with_extras else {}),
                       **(SHARED_BODY_TRAINING if shared else {}), **user}
            return compile_fx(g, inputs, inner_compile=inner if with_extras else compile_inner,
                              config_patches=patches or None)

        out = optimize(gm, list(example_inputs), budget_s, gemm_loops=gemm_loops, buffer_reuse=not shared,
                       hoisted=hoist and not cudagraphs, **options)
        try:  # (with every switch off, still body_outputs.BODY_OUTPUTS: backend_patches)
            if hoist and not cudagraphs and not hoisting.grads_needed(out, example_inputs):
                compiled = hoisting.compile_hoisted(out, example_inputs, lambda g, xs: inductor(g, True, xs))
                if compiled is not None:
                    out.meta["optimus_egg"].hoisted = len(compiled.plan.outputs)
                    return compiled
            return inductor(out, with_extras=True)
        except Exception as e:
            if options.get("strict") or _dynamo_signal(e):
                raise
            failure = e
        if out.meta["optimus_egg"].changed:
            warnings.warn(f"optimus_egg: Inductor failed on the optimized graph ({type(failure).__name__}: "
                          f"{failure}); compiling the unmodified graph", RuntimeWarning, stacklevel=2)
            try:
                return inductor(gm)
            except Exception as e:
                if _dynamo_signal(e):
                    raise
                failure = e
        if not extras:
            raise failure
        warnings.warn(f"optimus_egg: Inductor failed with optimus_egg's Inductor options ({type(failure).__name__}: "
                      f"{failure}); compiling the unmodified graph without them", RuntimeWarning, stacklevel=2)
        return inductor(gm, with_extras=False)

    compile_fn.__name__ = "optimus_egg"
    return compile_fn


def _dynamo_signal(e: Exception) -> bool:
    """Is `e` one of Dynamo's own signals (a restart of the capture, RestartAnalysis), which pass
    through? An Inductor error is one of Dynamo's exceptions too (InductorError is a
    BackendCompilerFailed) and is a failure like any other."""
    exc = torch._dynamo.exc
    return isinstance(e, exc.TorchDynamoException) and not isinstance(e, exc.BackendCompilerFailed)


def _checked_inductor_options(options: dict | None) -> dict:
    """A copy of `options`, each key an Inductor config option (ValueError naming any other)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"optimus_egg: Inductor options must be a dict, not {type(options).__name__}")
    from torch._inductor import config

    known = config.get_config_copy()
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise ValueError(f"optimus_egg: {', '.join(map(repr, unknown))}: neither an optimus_egg backend option "
                         f"({', '.join(BACKEND_OPTIONS)}) nor an Inductor config option")
    return dict(options)


def optimus_egg_backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None,
                        options: dict | None = None):
    """Registered as torch.compile(backend="optimus_egg") through the torch_dynamo_backends entry point.

    torch.compile passes its `mode` and `options` here. Keys of `options` that `backend` takes
    (BACKEND_OPTIONS: ``{"budget_s": 0.5, "post_grad": False}``) go to it; every other key is
    an Inductor config option, as with ``backend="inductor"`` (ValueError if it is not one).
    `mode` ("max-autotune", "reduce-overhead", ...) adds Inductor's options for that mode.
    """
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"optimus_egg: torch.compile options must be a dict, not {type(options).__name__}")
    ours = {k: v for k, v in (options or {}).items() if k in BACKEND_OPTIONS}
    inductor = {k: v for k, v in (options or {}).items() if k not in BACKEND_OPTIONS}
    if mode is not None:
        from torch._inductor import list_mode_options

        try:
            inductor = {**list_mode_options(mode), **inductor}
        except RuntimeError as e:
            raise ValueError(f"optimus_egg: {e}") from None
    inductor.update(_checked_inductor_options(ours.pop("inductor", None)))
    return backend(**ours, inductor=inductor or None)(gm, example_inputs)
