"""Writes into fresh values, made out-of-place before lowering.

An in-place op (`h.relu_()`, `F.relu(h, inplace=True)`, `nn.ReLU(inplace=True)`, Dynamo's
`operator.iadd` for `h += y`) makes every node that touches `h` an ordered, opaque effect
(from_fx, "Mutation safety"): no rule matches them, so an MLP per feature with in-place
ReLUs was left unbatched. Where `h` is a fresh value (its op allocates its result: a linear,
an out-of-place elementwise op, a cat, ...) and every node that reads it before the write
makes a fresh value of its own (no view, nothing that could return `h` itself), the write
can only be seen through `h`: it becomes the out-of-place op, and every later use of `h`
reads that op's result. Writes into graph inputs, parameters, views or values whose aliases
are read later stay as they are, and so do writes whose out-of-place op would give another
dtype (a tensor operand of another dtype) or into values that are not floating. `h.copy_(y)`
becomes `aten.copy(h, y)`, not `y.clone()`: `h` stays its operand, so the gradient still
reaches what computed `h` (eagerly it gets zeros, and the output still requires grad), and
only where `y` has `h`'s shape, dtype and device: from_fx lowers that copy to `y` itself
(another, kept as aten.copy, could not be trained: autograd has no derivative for it); `h`'s
producers then drop out, and the pipeline gives their parameters their zero gradients back
(ops.keep_grads).

A write that stays (into an input, a view, ...) and returns the tensor it wrote (`t.copy_(y)`,
`t.add_(y)`, `torch.relu_(t)`, `t += y` on a tensor) is that tensor: every node after it that
reads `t` reads the write's result instead, the same tensor object, so the read depends on the
write as data. from_fx can then leave the reads after the graph's last write unordered
(`_ordered_effects`): two linears of a chunk written in place may batch.
"""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from optimus_egg.from_fx import (_BINARY, _INPLACE_DUNDERS, _INPLACE_OPERATORS, _PURE_NAMES, _bound_args, _is_view, _name,
                                  _returns_input, _signature, is_mutation)

# In-place method -> its out-of-place method.
_METHODS = {
    "relu_": "relu", "sigmoid_": "sigmoid", "tanh_": "tanh", "exp_": "exp", "neg_": "neg", "abs_": "abs",
    "sqrt_": "sqrt", "rsqrt_": "rsqrt", "log_": "log", "square_": "square", "add_": "add", "sub_": "sub",
    "mul_": "mul", "div_": "div", "clamp_": "clamp", "clamp_min_": "clamp_min", "clamp_max_": "clamp_max",
    "masked_fill_": "masked_fill", "__iadd__": "add", "__isub__": "sub", "__imul__": "mul", "__itruediv__": "div",
}
# In-place function -> its out-of-place function.
_FUNCTIONS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
              operator.itruediv: operator.truediv}
_FUNCTIONS.update({getattr(torch, m): getattr(torch, f) for m, f in _METHODS.items()
                   if not m.startswith("__") and hasattr(torch, m) and hasattr(torch, f)})
# Functions with an `inplace` flag, written out-of-place by clearing it.
_FLAGGED = {F.relu, F.relu6, F.silu, F.hardtanh, F.leaky_relu, F.elu, F.celu, F.selu, F.hardswish,
            F.hardsigmoid, F.mish, F.threshold}
# Modules with an `inplace` flag -> (function, the module's arguments to it).
_MODULES = {
    nn.ReLU: lambda m: (F.relu, ()), nn.ReLU6: lambda m: (F.relu6, ()), nn.SiLU: lambda m: (F.silu, ()),
    nn.Hardtanh: lambda m: (F.hardtanh, (m.min_val, m.max_val)),
    nn.LeakyReLU: lambda m: (F.leaky_relu, (m.negative_slope,)), nn.ELU: lambda m: (F.elu, (m.alpha,)),
    nn.CELU: lambda m: (F.celu, (m.alpha,)), nn.SELU: lambda m: (F.selu, ()),
    nn.Hardswish: lambda m: (F.hardswish, ()), nn.Hardsigmoid: lambda m: (F.hardsigmoid, ()),
    nn.Mish: lambda m: (F.mish, ()), nn.Threshold: lambda m: (F.threshold, (m.threshold, m.value)),
}
# Ops in _PURE_NAMES whose result may be (a view of) an operand rather than a fresh tensor.
_MAY_ALIAS = {"detach", "split", "chunk", "unbind", "getitem", "view", "reshape", "flatten", "unflatten",
              "permute", "transpose", "t", "movedim", "squeeze", "unsqueeze", "size", "contiguous", "expand",
              "to", "float", "type_as", "select", "narrow", "view_as", "reshape_as", "split_with_sizes",
              "sym_size", "diagonal", "einsum", "_to_copy"}
_FRESH_NAMES = (_PURE_NAMES - _MAY_ALIAS) | {"relu6", "hardtanh", "leaky_relu", "elu", "celu", "selu",
                                              "hardswish", "hardsigmoid", "mish", "threshold", "softplus"}
_FRESH_MODULES = (nn.Linear, nn.LayerNorm, *_MODULES)
_SIZES = {"size", "sym_size", "dim", "numel"}  # reads of a tensor's sizes, which no write changes


def functionalize(gm: fx.GraphModule, values: dict, modules: dict) -> tuple[fx.Graph, dict, int] | None:
    """A copy of gm's graph with every write into a fresh value made out-of-place (module
    docstring), `values` (node -> example value or Meta) keyed by the copy's nodes, and how
    many writes changed; None where none can."""
    if not any(_out_of_place(n, modules) is not None or _returns_written(n, values) for n in gm.graph.nodes):
        return None
    graph = copy.deepcopy(gm.graph)
    graph.owning_module = gm  # (its module calls are found there until the copy gets a module of its own)
    old = dict(zip(graph.nodes, gm.graph.nodes))
    values = {n: values.get(o) for n, o in old.items()}
    order = {n: i for i, n in enumerate(graph.nodes)}
    fresh: set[fx.Node] = set()
    changed = 0
    for m in list(graph.nodes):
        new = _out_of_place(m, modules)
        if new is None or not m.args or not isinstance(m.args[0], fx.Node):
            continue
        t = m.args[0]
        if not (t in fresh or _fresh(t, modules)) or not _keeps_dtype(m, t, values):
            continue
        if _is_copy(m) and not _copies_its_like(m, t, values):
            continue  # (aten.copy has no derivative: only a copy from_fx lowers to its source goes)
        if any(order[u] < order[m] and not (u in fresh or _fresh(u, modules) or _name(u.target) in _SIZES)
               for u in t.users if u is not m):
            continue  # a view (or what may be one) of t read after the write would see it
        for u in [u for u in t.users if order[u] > order[m]]:
            u.replace_input_with(t, m)
        m.op, m.target, m.args, m.kwargs = new(m)
        fresh.add(m)
        changed += 1
    rewired = 0
    for m in list(graph.nodes):
        if m not in fresh and _returns_written(m, values):
            t = m.args[0]
            for u in [u for u in t.users if order[u] > order[m]]:
                u.replace_input_with(t, m)
                rewired += 1
    if not (changed or rewired):
        return None
    graph.lint()
    return graph, values, changed


def _returns_written(m: fx.Node, values: dict) -> bool:
    """Is m a write that returns the tensor it writes into, its first operand, which another
    node reads (functionalize rewires the reads after m)? In-place methods and torch functions (`*_`) and Python's in-place operators,
    on tensors only (`i += 1` on an int makes a new int)."""
    if m.op not in ("call_method", "call_function") or not m.args or not isinstance(m.args[0], fx.Node):
        return False
    name = _name(m.target)
    if m.op == "call_method":
        in_place = name.endswith("_") and not name.endswith("__") or name in _INPLACE_DUNDERS
    else:
        in_place = m.target in _INPLACE_OPERATORS or (
            getattr(torch, name, None) is m.target and name.endswith("_") and not name.endswith("__"))
    if not in_place or "out" in m.kwargs:
        return False
    t = m.args[0]
    return (_tensor_like(values.get(t)) and _tensor_like(values.get(m))
            and any(u is not m for u in t.users))


def _out_of_place(n: fx.Node, modules: dict):
    """How to write n out-of-place (node -> (op, target, args, kwargs)), or None."""
    if not is_mutation(n, modules) or "out" in n.kwargs:
        return None
    if _is_copy(n):  # h.copy_(y) -> aten.copy(h, y): h stays an operand, so its producers keep their zero gradient
        return lambda m: ("call_function", torch.ops.aten.copy.default, (m.args[0], _copy_source(m)), {})
    if n.op == "call_method" and n.target in _METHODS:
        return lambda m: ("call_method", _METHODS[m.target], m.args, m.kwargs)
    if n.op == "call_function" and n.target in _FUNCTIONS:
        return lambda m: ("call_function", _FUNCTIONS[m.target], m.args, m.kwargs)
    if n.op == "call_function" and _aten_out_of_place(n.target) is not None:
        return lambda m: ("call_function", _aten_out_of_place(m.target), m.args, m.kwargs)
    if n.op == "call_function" and n.target in _FLAGGED and _bound_args(n):
        def flagged(m):
            bound = _signature(m.target).bind(*m.args, **m.kwargs)
            bound.arguments["inplace"] = False
            return "call_function", m.target, tuple(bound.args), dict(bound.kwargs)
        return flagged
    if n.op == "call_module" and type(modules.get(n.target)) in _MODULES and len(n.args) == 1 and not n.kwargs:
        def module(m):
            fn, extra = _MODULES[type(modules[m.target])](modules[m.target])
            return "call_function", fn, (m.args[0], *extra), {}
        return module
    return None


def _is_copy(n: fx.Node) -> bool:
    """`h.copy_(y)` (a method call) or `aten.copy_(h, y)`, with its source given."""
    if n.op == "call_method" and n.target == "copy_" or n.op == "call_function" and n.target is torch.ops.aten.copy_.default:
        return len(n.args) + len(n.kwargs) >= 2 and set(n.kwargs) <= {"src", "non_blocking"}
    return False


def _copy_source(n: fx.Node):
    return n.args[1] if len(n.args) > 1 else n.kwargs["src"]


def _copies_its_like(m: fx.Node, t: fx.Node, values: dict) -> bool:
    """Is `t.copy_(src)`'s source a tensor of t's shape and device (dtype: _keeps_dtype), so that
    from_fx lowers aten.copy(t, src) to src? Another copy (a broadcast, a conversion) kept as
    aten.copy could not be trained: autograd has no derivative for it."""
    src, vt = _copy_source(m), values.get(t)
    vs = values.get(src) if isinstance(src, fx.Node) else None
    if not (_tensor_like(vs) and _tensor_like(vt)):
        return False
    try:
        return tuple(vs.shape) == tuple(vt.shape) and vs.device == vt.device
    except Exception:  # noqa: BLE001 (symbolic sizes that cannot be compared: leave the write)
        return False


def _aten_out_of_place(target):
    """aten.mul_.Tensor -> aten.mul.Tensor, for the ops of _METHODS; None otherwise."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name.split("::")[-1]
    if name not in _METHODS or name.startswith("__"):
        return None
    packet = getattr(torch.ops.aten, _METHODS[name], None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def _fresh(n: fx.Node, modules: dict) -> bool:
    """Does n's op allocate its result (never return an operand or a view of one)?"""
    if _is_view(n) or _returns_input(n, modules) or is_mutation(n, modules):
        return False
    if n.op == "call_module":
        mod = modules.get(n.target)
        return isinstance(mod, _FRESH_MODULES) and getattr(mod, "inplace", False) is not True
    if n.op not in ("call_function", "call_method"):
        return False
    if n.target in _BINARY:
        return True
    return _name(n.target).lstrip("_") in _FRESH_NAMES


def _keeps_dtype(m: fx.Node, t: fx.Node, values: dict) -> bool:
    """Is the written value floating, and every tensor operand of the write of its dtype (so
    the out-of-place op gives the same dtype and shape)?"""
    vt, vm = values.get(t), values.get(m)
    if not (_tensor_like(vt) and _tensor_like(vm)) or not vt.dtype.is_floating_point or vm.dtype != vt.dtype:
        return False
    try:
        if tuple(vm.shape) != tuple(vt.shape):
            return False
    except Exception:  # noqa: BLE001 (symbolic sizes that cannot be compared: leave the write)
        return False
    return all(a is t or not _tensor_like(values.get(a)) or values[a].dtype == vt.dtype for a in m.all_input_nodes)


def _tensor_like(v) -> bool:
    """A tensor, or what lowering keeps of one (Meta, FX's TensorMetadata)."""
    return isinstance(getattr(v, "dtype", None), torch.dtype) and hasattr(v, "shape")
