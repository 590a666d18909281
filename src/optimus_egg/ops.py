"""Batched kernels that to_fx emits as single FX calls; plain torch code that Dynamo, AOTAutograd
and Inductor trace through (each is one GEMM or one fused norm after lowering)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import handle_torch_function, has_torch_function
from torch.utils._pytree import tree_leaves


_OPS: list = []  # the functions below, as FX graphs call them


def _one_call_in_symbolic_trace(fn):
    """fn, which symbolic_trace records as one call (as it does torch's own functions) instead
    of tracing into it: torch.save and pickle rebuild a GraphModule by tracing its code again,
    and its Proxies cannot stand in for the sizes fn reads. Through __torch_function__, as
    torch.functional.split does; Dynamo and AOTAutograd still trace through fn."""

    @functools.wraps(fn)
    def op(*args, **kwargs):
        operands = tuple(tree_leaves((args, kwargs)))
        if has_torch_function(operands):
            return handle_torch_function(op, operands, *args, **kwargs)
        return fn(*args, **kwargs)

    _OPS.append(op)
    return op


def cacheable() -> dict[str, str]:
    """Each op's qualified name -> this file's source hash, for Inductor's
    `unsafe_marked_cacheable_functions`: AOT autograd's cache bypasses a graph calling a
    function it does not know (a training graph recompiled from scratch in every process); so
    marked, the cache key names the ops' source, and an edit here misses the cache."""
    from torch._inductor.custom_graph_pass import get_hash_for_files

    source = get_hash_for_files((__file__,)).hex()
    return {f"{fn.__module__}.{fn.__name__}": f"optimus_egg.ops:{source}" for fn in _OPS}


@_one_call_in_symbolic_trace
def stack_bias(biases: list[torch.Tensor | None], w: torch.Tensor) -> torch.Tensor:
    """Stack per-member biases for stacked weights w [N, O, K]; a member without one gets zeros."""
    return torch.stack([b if b is not None else w.new_zeros(w.shape[1]) for b in biases])


@_one_call_in_symbolic_trace
def batched_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x [N, *, K], w [N, O, K], b [N, O] or None -> [N, *, O] with one bmm/baddbmm."""
    n, k = x.shape[0], x.shape[-1]
    flat = x.reshape(n, -1, k)
    wt = w.transpose(1, 2)
    out = torch.bmm(flat, wt) if b is None else torch.baddbmm(b.unsqueeze(1), flat, wt)
    return out.reshape(*x.shape[:-1], w.shape[1])


@_one_call_in_symbolic_trace
def batched_layer_norm(x: torch.Tensor, shape: list[int], w: torch.Tensor | None,
                       b: torch.Tensor | None, eps: float) -> torch.Tensor:
    """layer_norm over x's trailing `shape` dims, then per-member affine w/b [N, *shape]."""
    # Eager layer_norm applies the affine in float32 and rounds once; doing the norm, * w and
    # + b each in bf16 / fp16 rounds three times (~1.5x the error of the norms it replaces).
    acc = torch.promote_types(x.dtype, torch.float32)  # float32 and float64 stay as they are
    y = F.layer_norm(x.to(acc), shape, None, None, eps)
    lead = (1,) * (x.dim() - 1 - len(shape))
    if w is not None:
        y = y * w.to(acc).reshape(w.shape[0], *lead, *shape)
    if b is not None:
        y = y + b.to(acc).reshape(b.shape[0], *lead, *shape)
    return y.to(x.dtype)


class _KeepGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, *leaves: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*leaves)
        # detach: y's storage and version counter, not a view of y (an output that is a view
        # made in a custom Function may not be modified in place; y itself may)
        return y.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (grad, *(torch.zeros_like(t) for t in ctx.saved_tensors))


@_one_call_in_symbolic_trace
def keep_grads(y: torch.Tensor, *leaves: torch.Tensor) -> torch.Tensor:
    """y, with a zero gradient for each of `leaves` whenever a gradient reaches y: what an
    output gives the parameters that eagerly fed it only through values nothing reads (a
    stack unbound, one row used), once the rewrites have dropped those values. Inductor
    launches nothing for it in the forward; the zero fills in the backward are pointwise code."""
    return _KeepGrads.apply(y, *leaves)


def to_folder(gm: torch.fx.GraphModule, folder, module_name: str = "FxModule") -> None:
    """`gm.to_folder(folder, module_name)`, with an import in module.py for each function of a
    module that `gm`'s code calls by a global name (the ops above, an fx.wrap-ped function):
    FX writes imports for its table of builtins only, so module.py would raise NameError on
    them. (Registering the ops in that table would make every pickled GraphModule of the
    process import optimus_egg.)"""
    import importlib
    import pathlib

    from torch.fx.graph import _custom_builtins

    imports = []
    for name, obj in gm.graph.python_code(root_module="self").globals.items():
        if name in _custom_builtins:
            continue
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
        found = None
        if isinstance(module, str) and qualname.isidentifier():
            try:
                found = getattr(importlib.import_module(module), qualname, None)
            except ImportError:
                pass
        if found is not obj:
            raise ValueError(f"to_folder: the graph calls {name} ({module}.{qualname}), which module.py "
                             "cannot import by name (a local function?)")
        imports.append(f"from {module} import {qualname} as {name}\n")
    gm.to_folder(folder, module_name)
    path = pathlib.Path(folder) / "module.py"
    source = path.read_text()
    path.write_text(source.replace("\nimport torch\n", "\nimport torch\n" + "".join(imports), 1))
