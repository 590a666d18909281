"""Lowering: FX GraphModule -> egglog e-graph.

Owns normalizing every spelling of an op (module / function / method / ATen, positional /
keyword, negative dims, int / list split sizes) into one constructor, and writing the facts
rules guard on: static shapes, which templates are elementwise, and the candidate groups of
the horizontal (batch_*) rules. Example values come from `shapes`; the facts, written as
egglog text, go into the e-graph through `seed.register_text`.

Independence of a group is guaranteed here: members share a longest-path depth from the
graph inputs, and a path between two nodes would make their depths differ.

Mutation safety: every node that touches a mutated tensor or any of its views (the alias
set), and every call kept for its side effect (asserts, guards, RNG draws), becomes an opaque,
un-deduplicated call that also depends on the effects it must follow (a write on the
previous write and the reads since, a read on the previous write), so no rule matches it and
to_fx keeps that order. Writes into fresh values nothing else can see are made out-of-place
first (functional.py), so they need none of this. Graphs that switch global state (grad
mode, autocast) between nodes are Unsupported.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from egglog import EGraph

from optimus_egg import shapes
from optimus_egg.extract.launch_cost import (LOOP_LIMITS, VIEW_TARGETS, elementwise_linear, elementwise_matmul,
                                             graph_table, loop_break_even)
from optimus_egg.gemm_loops import MAX_MACS
from optimus_egg.seed import quote, register_text
from optimus_egg.shapes import (
    SYMBOLIC_MIN,
    _meta_value,
    _static_int,
    check_inputs,
    size_symbols,
    symbolic_shape,
)

aten = torch.ops.aten


class Unsupported(Exception):
    """A construct from_fx cannot lower (the pipeline falls back to the input graph)."""


def _app(fn: str, *args) -> str:
    return f"({fn} {' '.join(str(a) for a in args)})" if args else f"({fn})"


def _vec(items) -> str:
    items = list(items)
    return _app("vec-of", *items) if items else "(vec-empty)"


def _f64(x: float) -> str:
    if not math.isfinite(x):
        raise Unsupported(f"non-finite constant {x}")
    return repr(float(x))


NONE = "(none)"


@dataclass(frozen=True)
class Slot:
    """Position of the k-th tensor operand inside a template's args."""
    k: int


@dataclass
class Template:
    """An FX call with its value operands abstracted as Slots."""
    op: str            # call_function | call_method | call_module
    target: Any
    args: tuple
    kwargs: dict
    n_deps: int = 0    # trailing ordering-only operands (mutation chains)
    # Slot 0 made contiguous before the call (_Lowerer.keeps_layout): the op's result takes its
    # operand's strides, and a random draw fills memory in that order.
    contiguous: bool = False


@dataclass
class Lowered:
    egraph: EGraph
    gm: fx.GraphModule
    nodes: list[fx.Node]                  # origin index -> FX node
    templates: list[Template]
    leaves: dict[str, fx.Node]            # Tensor.input name -> placeholder / get_attr node
    root: str                             # the Outputs term (egglog text)
    output_args: Any                      # output structure with Slots into root's Vec
    n_outputs: int                        # root entries that are real outputs (the rest keep effects)
    groups: dict[str, int] = field(default_factory=dict)
    shapes: dict[fx.Node, tuple[int, ...]] = field(default_factory=dict)
    cost_table: str = "cpu"               # extract/launch_cost.py TABLES entry that prices it
    symbols: dict[str, tuple[int, object]] = field(default_factory=dict)  # symbol or expression -> (sentinel, source) (shapes.py)
    leaf_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # Tensor.input name -> shape
    grad_reach: set[fx.Node] | None = None  # the nodes a gradient of the outputs reaches (_grad_reach), once seeded
    strided: set[fx.Node] = field(default_factory=set)  # values whose rows are not contiguous (shapes.rows_strided)
    out_of_place: int = 0                 # writes into fresh values made out-of-place (functional.py); gm is then a copy
    training: bool = False                # priced for a compile with a backward (optimize's `training`)
    fixed_leaves: frozenset[str] = frozenset()  # parameters whose copies are computed once (optimize's `hoisted`)
    loop_break_even: float = MAX_MACS     # multiply-adds where a GEMM call matches its loops (launch_cost.loop_break_even)
    contiguous_outputs: tuple = ()        # per output leaf: was its example value contiguous? (static sizes only)


# ---- the vocabulary ------------------------------------------------------------------

_UNARY = {  # canonical elementwise ops taking one tensor
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "exp": torch.exp,
    "neg": torch.neg, "gelu": F.gelu, "silu": F.silu, "clamp": torch.clamp,
    "nan_to_num": torch.nan_to_num, "detach": torch.detach, "abs": torch.abs,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "log": torch.log, "square": torch.square,
    "clamp_min": torch.clamp_min, "clamp_max": torch.clamp_max,
}
_FN_ALIASES = {
    F.relu: "relu", F.sigmoid: "sigmoid", F.tanh: "tanh", F.gelu: "gelu", F.silu: "silu",
    torch.clip: "clamp",
    torch.Tensor.relu: "relu",
    aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid", aten.relu.default: "relu",
    aten.exp.default: "exp", aten.neg.default: "neg", aten.gelu.default: "gelu",
    aten.silu.default: "silu", aten.clamp.default: "clamp", aten.nan_to_num.default: "nan_to_num",
    aten.detach.default: "detach", aten.abs.default: "abs", aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt", aten.log.default: "log",
}
_MODULE_UNARY = {torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh", torch.nn.Sigmoid: "sigmoid",
                 torch.nn.GELU: "gelu", torch.nn.SiLU: "silu"}
_BINARY = {operator.add: torch.add, operator.sub: torch.sub, operator.mul: torch.mul,
           operator.truediv: torch.div, torch.add: torch.add, torch.sub: torch.sub,
           torch.mul: torch.mul, torch.div: torch.div, "add": torch.add, "sub": torch.sub,
           "mul": torch.mul, "div": torch.div,
           aten.add.Tensor: torch.add, aten.sub.Tensor: torch.sub, aten.mul.Tensor: torch.mul,
           aten.div.Tensor: torch.div}
_LINEAR = {F.linear, torch._C._nn.linear, aten.linear.default}
_LAYER_NORM = {F.layer_norm, torch.layer_norm, aten.layer_norm.default}
_ATEN_GEMM = {aten.mm.default, aten.addmm.default}  # F.linear as make_fx / AOT write it: mm(x, t(w)), addmm(b, x, t(w))
_CAT = {torch.cat, torch.concat, torch.concatenate, aten.cat.default}
_STACK = {torch.stack, aten.stack.default}
_SPLIT = {torch.split, torch.functional.split, torch.Tensor.split, aten.split.Tensor, aten.split_with_sizes.default,
          "split", "split_with_sizes"}
_CHUNK = {torch.chunk, "chunk", aten.chunk.default}
_UNBIND = {torch.unbind, "unbind", aten.unbind.int}
_SELECT = {torch.select, "select", aten.select.int}
_SQUEEZE = {torch.squeeze, torch.Tensor.squeeze, "squeeze", aten.squeeze.dim}  # with one int dim only
_NARROW = {torch.narrow, torch.Tensor.narrow, "narrow", aten.narrow.default}
_ATEN_SLICE = {aten.slice.Tensor}  # x[a:b] as make_fx / export write it; not slice_scatter & co.
_RESHAPE = {torch.reshape, "reshape", "view", aten.view.default, aten.reshape.default,
            aten._unsafe_view.default}  # to static int sizes only
_DROPOUT = {F.dropout, torch.dropout, aten.dropout.default}
_VIEW_METHODS = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "t",
                 "movedim", "squeeze", "unsqueeze", "expand", "narrow", "select", "split",
                 "chunk", "unbind", "as_strided", "view_as", "reshape_as", "contiguous",
                 "__getitem__", "detach", "T", "split_with_sizes", "diagonal", "unfold"}
# Composite ops whose results may be views of each tensor operand, not the first only.
_VIEWS_OF_EACH = {"atleast_1d", "atleast_2d", "atleast_3d", "broadcast_tensors", "meshgrid"}
# Not view ops, but their result may be their input itself or a view of it (a conversion with
# nothing to convert, an einsum that only permutes, a composite op whose schema does not say:
# others are found by _aten_view), so a write through it is a write to the input.
_MAY_ALIAS = {"to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "bool",
              "cpu", "cuda", "expand_as", "swapaxes", "swapdims", "view_as_real", "view_as_complex",
              "byte", "char", "short", "cfloat", "cdouble", "chalf", "to_dense", "conj_physical", "einsum",
              "sum_to_size", "unsafe_split", "unsafe_chunk", "unsafe_split_with_sizes", "_unsafe_view",
              *_VIEWS_OF_EACH}
_VIEW_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}  # x.T traces as getattr(x, "T")
# Calls that set global state for the nodes after them (Dynamo's `with torch.no_grad()`,
# `torch.autocast`, `torch.inference_mode`, ...): the e-graph keeps no order that could hold
# the nodes inside such a region, so optimize() cuts the graph at them (parts.py).
GLOBAL_STATE = {"_set_grad_enabled", "_enter_autocast", "_exit_autocast", "_enter_inference_mode",
                "_exit_inference_mode", "_set_fwd_grad_enabled", "_saved_tensors_hooks_disable",
                "_saved_tensors_hooks_enable", "_sdpa_kernel"}
# Node meta key: the part a node belongs to in a graph of parts side by side (parts.py). Groups
# and shared templates never span two parts.
PART = "optimus_egg_part"
GRAD_REACH = "optimus_egg_grad_reach"  # meta: whether a gradient of the outputs reaches the node (_grad_reach)
# Node meta key: the node may alias a tensor another part writes into (parts.py); it is ordered
# as the nodes touching a write are (_ordered_effects), so no rewrite changes what it aliases.
WRITTEN = "optimus_egg_written"
# Calls that open or close a functorch transform (vmap, grad, jvp) traced inline: nodes
# between them see batched or dual tensors; such a graph is not lowered at all.
_TRANSFORMS = {"_vmap_increment_nesting", "_vmap_decrement_nesting", "_grad_increment_nesting",
               "_grad_decrement_nesting", "_jvp_increment_nesting", "_jvp_decrement_nesting",
               "_enter_dual_level", "_exit_dual_level", "push_dynamic_layer_stack",
               "pop_dynamic_layer_stack", "set_inplace_requires_grad_allowed"}
# Known side-effect-free calls: a template for one of these may be shared (CSE).
_PURE_NAMES = {
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "layer_norm", "add", "sub", "mul",
    "div", "truediv", "tanh", "sigmoid", "relu", "gelu", "silu", "exp", "neg", "clamp",
    "nan_to_num", "detach", "split", "chunk", "unbind", "getitem", "cat", "concat", "stack",
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "movedim",
    "squeeze", "unsqueeze", "sum", "mean", "softmax", "embedding_bag", "size", "contiguous",
    "abs", "sqrt", "rsqrt", "log", "square", "pow", "expand", "triu", "tril", "masked_fill",
    "clone", "to", "float", "type_as", "sum", "amax", "max", "min", "where", "einsum",
    "log_softmax", "select", "narrow", "flatten", "view_as", "reshape_as", "repeat", "floordiv",
    "mod", "eq", "ne", "lt", "gt", "le", "ge", "cumsum", "native_layer_norm", "split_with_sizes",
    "_to_copy", "sym_size", "floor_divide", "triu_indices", "diagonal", "addcmul", "fill",
}
_LAYOUT_DRAWS = {"empty_like", "rand_like", "randn_like", "randint_like", "bernoulli"}
# Dropouts whose random draws depend on their input's shape and dtype alone (from_fx
# `unread_dropout`); a subclass or a function of another name may do anything.
_DROPOUTS = {torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
             torch.nn.FeatureAlphaDropout, torch.nn.functional.dropout, torch.nn.functional.dropout1d,
             torch.nn.functional.dropout2d, torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout,
             torch.nn.functional.feature_alpha_dropout, torch.dropout, torch.feature_dropout, torch.alpha_dropout,
             torch.feature_alpha_dropout, torch.ops.aten.dropout.default, torch.ops.aten.native_dropout.default}
_RANDOM = {"dropout", "rand", "randn", "randint", "bernoulli", "multinomial", "normal",
           "rand_like", "randn_like", "randint_like", "native_dropout", "uniform", "alpha_dropout"}


def _name(target) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


_signature = functools.lru_cache(maxsize=None)(inspect.signature)


def _bound_args(node: fx.Node) -> dict:
    """A call to a Python function (F.relu, F.dropout) with every argument named; {} otherwise."""
    if not inspect.isfunction(node.target):
        return {}
    try:
        return dict(_signature(node.target).bind(*node.args, **node.kwargs).arguments)
    except (TypeError, ValueError):
        return {}


def _submodules(gm: fx.GraphModule | None) -> dict[str, torch.nn.Module]:
    """Every submodule by dotted name, found once (a `get_submodule` per node walks the path)."""
    return dict(gm.named_modules(remove_duplicate=False)) if gm is not None else {}


def _submodule(node: fx.Node, modules: dict | None):
    """The module a call_module node calls (None without an owning module)."""
    gm = node.graph.owning_module
    if gm is None:
        return None
    mod = modules.get(node.target) if modules is not None and isinstance(node.target, str) else None
    return mod if mod is not None else gm.get_submodule(node.target)


# `h += y` on a tensor writes into h: Dynamo records operator.iadd (FX's symbolic trace, an add).
_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
                      operator.ilshift, operator.irshift, operator.imatmul}
_INPLACE_DUNDERS = {f"__{op.__name__}__" for op in _INPLACE_OPERATORS}


def is_mutation(node: fx.Node, modules: dict | None = None) -> bool:
    """Does the node write into a tensor (an in-place method, op or operator, `out=`,
    `inplace=True`, setitem, a _SIDE_WRITES call: a norm updating its running statistics)?
    FX's dead-code elimination does not know these: a `y.mul_(z)` whose result is unused looks
    dead to it."""
    if _side_writes(node, modules) is not None:
        return True
    if node.op == "call_module":  # nn.ReLU(inplace=True) writes into its input
        mod = _submodule(node, modules)
        return mod is not None and getattr(mod, "inplace", False) is True
    if node.op not in ("call_function", "call_method"):
        return False
    if node.target is operator.setitem or node.target in _INPLACE_OPERATORS:
        return True
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target._schema.is_mutable
    name = _name(node.target)
    return ((name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDERS or "out" in node.kwargs
            or node.kwargs.get("inplace") is True or _bound_args(node).get("inplace") is True)


def _training(flag) -> bool:
    return flag is not False


def _max_norm(v) -> bool:
    return v is not None


# Calls that write into some of their operands and return a value of their own: a norm in
# training updates the running statistics it is given, an embedding lookup with max_norm
# renormalizes the rows it reads in its weight. Per spelling: the written arguments (position,
# name) and the argument that decides (position, name, default, whether its value writes; a
# value computed in the graph does).
_SIDE_WRITES = {
    F.batch_norm: (((1, "running_mean"), (2, "running_var")), (5, "training", False, _training)),
    F.instance_norm: (((1, "running_mean"), (2, "running_var")), (5, "use_input_stats", True, _training)),
    **dict.fromkeys([torch.batch_norm, aten.batch_norm.default],
                    (((3, "running_mean"), (4, "running_var")), (5, "training", True, _training))),
    **dict.fromkeys([torch.instance_norm, aten.instance_norm.default],
                    (((3, "running_mean"), (4, "running_var")), (5, "use_input_stats", True, _training))),
    F.embedding: (((1, "weight"),), (3, "max_norm", None, _max_norm)),
    F.embedding_bag: (((1, "weight"),), (3, "max_norm", None, _max_norm)),
}


def _side_writes(node: fx.Node, modules: dict | None) -> list[fx.Node] | None:
    """What a call writing besides computing a value of its own (_SIDE_WRITES) writes into:
    the operands it is given, or for a module (a BatchNorm or InstanceNorm in training, an
    Embedding or EmbeddingBag with max_norm) the graph's get_attr reads of its buffers or
    weight (perhaps none). None where the node is no such write."""
    if node.op == "call_module":
        mod = _submodule(node, modules)
        if (isinstance(mod, torch.nn.modules.batchnorm._NormBase) and mod.training
                and getattr(mod, "running_mean", None) is not None):
            names = ("running_mean", "running_var", "num_batches_tracked")
        elif isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and mod.max_norm is not None:
            names = ("weight",)
        else:
            return None
        return [g for g in node.graph.find_nodes(op="get_attr") if isinstance(g.target, str)
                and g.target.rpartition(".")[0] == node.target and g.target.rpartition(".")[2] in names]
    spec = _SIDE_WRITES.get(node.target) if node.op == "call_function" else None
    if spec is None:
        return None

    def arg(i, name, default=None):
        return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)

    written, (i, name, default, writes) = spec
    tensors = [t for t in (arg(*w) for w in written) if isinstance(t, fx.Node)]
    return tensors if tensors and writes(arg(i, name, default)) else None


def _result_written(node: fx.Node) -> bool:
    """Is a write's result the tensor it writes into (an in-place op's, an `out=` write's),
    not a value of its own (a _SIDE_WRITES call's, an ATen op's returning a new tensor or
    nothing)?"""
    if _side_writes(node, None) is not None:
        return False
    if isinstance(node.target, torch._ops.OpOverload):
        returns = node.target._schema.returns
        return bool(returns) and returns[0].alias_info is not None
    return True


def _is_view(node: fx.Node) -> bool:
    """May the node's result be an operand or a view of one (a write through it writes there)?"""
    if node.op == "call_module":
        return isinstance(_submodule(node, None), (torch.nn.Flatten, torch.nn.Unflatten))
    if node.op == "call_method":
        return node.target in _VIEW_METHODS or node.target in _MAY_ALIAS or _aten_view(node.target)
    if node.op == "call_function":
        if node.target is operator.getitem:
            return True
        if node.target is getattr:
            return node.args[1] in _VIEW_ATTRS
        name = _name(node.target)
        if isinstance(node.target, torch._ops.OpOverload):  # (aten._unsafe_view's schema says no alias)
            return bool(node.target._schema.returns and node.target._schema.returns[0].alias_info) or name in _MAY_ALIAS
        return name in _VIEW_METHODS or name in _MAY_ALIAS or _aten_view(name)
    return False


@functools.lru_cache(maxsize=None)
def _aten_schemas(name: str) -> tuple:
    """The schemas of the ATen op of this name (torch.moveaxis, Tensor.ravel, aten.alias,
    torch._foreach_add_), one per overload; none where ATen has no such op."""
    if not name.isidentifier() or name.startswith("__"):
        return ()
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return ()
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return ()
    return tuple(getattr(packet, o)._schema for o in packet.overloads())


@functools.lru_cache(maxsize=None)
def _aten_view(name: str) -> bool:
    """Does the ATen op of this name return an alias of an operand: a return with alias info
    in an overload that writes nothing?"""
    return any(not s.is_mutable and any(r.alias_info is not None for r in s.returns) for s in _aten_schemas(name))


def rebinds_memory(node: fx.Node) -> bool:
    """`x.set_(y)`: from here on x lies in y's memory, which no place (_place) can say."""
    return node.op in ("call_function", "call_method") and _name(node.target) == "set_"


def _returns_input(node: fx.Node, modules: dict | None = None) -> bool:
    """A call whose result is its input itself: a dropout that draws nothing (eval mode, or
    p = 0) or an Identity module. A write through it is a write to the input."""
    if node.op == "call_module":
        mod = _submodule(node, modules)
        return isinstance(mod, (torch.nn.Identity, torch.nn.modules.dropout._DropoutNd)) and not draws_random(node, modules)
    if node.op not in ("call_function", "call_method"):
        return False
    return "dropout" in _name(node.target) and not draws_random(node, modules)


def draws_random(node: fx.Node, modules: dict | None = None) -> bool:
    """Does the node draw random numbers? Node.is_impure knows torch.rand_like & co., but not
    F.dropout (a Python function), torch.dropout, nor a Dropout module in training mode; left
    unordered, two such draws could be emitted in the other order and get each other's masks.
    (The fusion estimate counts the seed call Inductor makes for them: extract/fusion_cost.py.)"""
    if node.op == "call_module":
        mod = _submodule(node, modules)
        if isinstance(mod, torch.nn.RReLU):
            return mod.training
        return isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.training and mod.p != 0
    if node.op not in ("call_function", "call_method"):
        return False
    name = _name(node.target).lstrip("_")
    if "dropout" not in name and name != "rrelu":
        return name in _RANDOM
    if inspect.isfunction(node.target):  # F.dropout, F.alpha_dropout: defaults differ per function
        try:
            bound = _signature(node.target).bind(*node.args, **node.kwargs)
        except (TypeError, ValueError):
            return True
        bound.apply_defaults()
        training, p = bound.arguments.get("training", True), bound.arguments.get("p", 0.5)
    else:  # torch.dropout(input, p, train) and its ATen overloads
        training = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    return training is not False and p != 0  # an FX-computed flag counts as a draw


def _is_impure(node: fx.Node, modules: dict | None) -> bool:
    """Node.is_impure, with a call_module's module found in `modules`."""
    if node.op == "call_module" and modules is not None and node.graph.owning_module is not None:
        mod = _submodule(node, modules)
        if mod is not None:
            return getattr(mod, "_is_impure", False)  # what Node.is_impure reads
    return node.is_impure()


def _ordered_effects(graph: fx.Graph, modules: dict | None = None, mutated: list | None = None) -> list[fx.Node]:
    """Nodes whose order must be kept, in graph order: those touching a mutated tensor or one
    of its views (or a value marked WRITTEN: written in another part), and calls kept for what
    they do (asserts, export's guards, RNG draws). `mutated`: the mutating nodes, if known."""
    impure = {n for n in graph.nodes
              if n.op in ("call_function", "call_module", "call_method")
              and (_is_impure(n, modules) or draws_random(n, modules)) and not shapes.is_shape_check(n)}
    if mutated is None:
        mutated = [n for n in graph.nodes if is_mutation(n, modules)]
    marked = [n for n in graph.nodes if n.meta.get(WRITTEN)]
    if not mutated and not marked:
        return [n for n in graph.nodes if n in impure]
    aliased = written_aliases(graph, modules, mutated, marked)
    touched = aliased | set(mutated)  # (a _SIDE_WRITES call is a write, its result fresh)
    for n in aliased:
        touched.update(u for u in n.users if u.op != "output")
    # A read after the graph's last write whose only aliased operand is that write's result
    # (functional.py rewires reads of a written tensor to the write) depends on the write as
    # data and sees no write after it: it need not be ordered, and its ops can batch.
    # So does a read after it of a view that no write touches (an unbind's other item, provably
    # apart from every written place: _apart), whose elements are the same before and after.
    free: set[fx.Node] = set()
    if mutated:
        order = {n: i for i, n in enumerate(graph.nodes)}
        last = max(mutated, key=order.__getitem__)
        # (not where another part writes too)
        writes = None if marked else [_place(w, modules) for m in mutated for w in _written_operands(m)]

        def unwritten(a: fx.Node) -> bool:
            place = _place(a, modules)
            return writes is not None and not any(_may_share(place, w) for w in writes)

        free = {u for a in aliased for u in a.users if u not in aliased and u not in impure and order[u] > order[last]
                and all(b is last or b not in aliased or unwritten(b) for b in u.all_input_nodes)}
    return [n for n in graph.nodes if (n in touched and n not in free and n.op not in ("placeholder", "get_attr"))
            or n in impure]


# The root of a place (_place) that may lie in any operand: a view of several, a tuple written
# through `out=`. It may share elements with every place.
ANYWHERE = object()


def _place(n: fx.Node, modules: dict | None, is_view: Callable[[fx.Node], bool] = _is_view,
           through: Callable[[fx.Node], bool] = lambda n: False) -> tuple:
    """Where n's value lies: (root, views), looking back through views (`is_view`: by default
    as written_aliases sees them), writes (into `out=`, item i of a tuple `out=` into its
    i-th tensor, else their first operand), calls that return their input and nodes `through`
    says do, to a graph input, a parameter, a computed value or ANYWHERE (the root), with each
    view taken on the way (its op and its arguments after the viewed tensor), outermost first."""
    views: list = []
    while isinstance(n, fx.Node) and n.op not in ("placeholder", "get_attr") and n.all_input_nodes:
        out = n.kwargs.get("out")
        if isinstance(out, (tuple, list)):  # a write into several tensors: its item i lies in out[i]
            i = views[-1][1][0] if views and views[-1][0] == "getitem" and len(views[-1][1]) == 1 else None
            if not (_int(i) and -len(out) <= i < len(out) and isinstance(out[i], fx.Node)):
                return ANYWHERE, ()
            views.pop()
            n = out[i]
            continue
        view, same = is_view(n), _returns_input(n, modules)
        write = is_mutation(n, modules) and _result_written(n)  # (else its result is a value of its own)
        if not (view or same or write or through(n)):
            break
        if view and not same and not write:
            views.append((_name(n.target), n.args[1:], tuple(sorted(n.kwargs.items()))))
        operands = _written_operands(n) if view or write else n.all_input_nodes[:1]
        if len(operands) != 1:
            return ANYWHERE, ()
        n = operands[0]
    return n, tuple(reversed(views))


def _may_share(a: tuple, b: tuple) -> bool:
    """May two places ((root, views): _place, pipeline._storage) share an element? Not where
    their roots differ (and neither is ANYWHERE), or where, at the first view where they part,
    they take pieces provably apart (_apart)."""
    if a[0] is ANYWHERE or b[0] is ANYWHERE:
        return True
    if a[0] is not b[0]:
        return False
    for va, vb in zip(a[1], b[1]):
        if va != vb:
            return not _apart(va, vb)
    return True


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _apart(va: tuple, vb: tuple) -> bool:
    """Are two views of one value pieces without an element in common? Two items of a tuple of
    pieces or two rows (getitem), two indices of one dim (select), two spans of one dim that do
    not meet (narrow); counted from the same end, as the sizes are not known here. Anything
    else may overlap."""
    (name, args, kwargs), (name_b, args_b, kwargs_b) = va, vb
    if name != name_b or kwargs or kwargs_b or len(args) != len(args_b):
        return False
    if name == "getitem" and len(args) == 1:
        i, j = args[0], args_b[0]
        return _int(i) and _int(j) and i != j and (i < 0) == (j < 0)
    if name == "select" and len(args) == 2:
        (d, i), (e, j) = args, args_b
        return _int(i) and _int(j) and d == e and i != j and (i < 0) == (j < 0)
    if name == "narrow" and len(args) == 3:
        (d, s, n), (e, t, m) = args, args_b
        return (d == e and all(_int(v) and v >= 0 for v in (s, n, t, m))
                and (s + n <= t or t + m <= s))
    return False


def written_aliases(graph: fx.Graph, modules: dict | None, mutated: list, marked: Sequence[fx.Node] = ()) -> set[fx.Node]:
    """The tensors the writes `mutated` write into, the writes whose result is that tensor
    (_result_written), and every node that may alias one of those (views both ways, such
    writes, calls returning their input), `marked` nodes' aliases included."""
    def alias_of_operand(u: fx.Node) -> bool:
        return _is_view(u) or _returns_input(u, modules) or (is_mutation(u, modules) and _result_written(u))

    aliased: set[fx.Node] = set()
    todo = [a for n in mutated for a in _written_operands(n)] + [n for n in mutated if _result_written(n)]
    todo += list(marked)
    while todo:
        n = todo.pop()
        if n in aliased:
            continue
        aliased.add(n)
        if alias_of_operand(n):
            todo.extend(_written_operands(n))
        todo.extend(u for u in n.users if alias_of_operand(u))
    return aliased


def _written_operands(n: fx.Node) -> list[fx.Node]:
    """For a write, the tensors it writes into: a _SIDE_WRITES call's, its `out=`
    tensors, an ATen op's arguments its schema marks written, else its first operand. For a
    view or a call returning its input, those its result may share memory with: its first
    operand, or each one (_VIEWS_OF_EACH)."""
    side = _side_writes(n, None)
    if side is not None:
        return side
    out = n.kwargs.get("out")
    written = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, fx.Node)]
    if not written and n.op in ("call_function", "call_method"):  # what ATen's schemas mark written
        schemas = [n.target._schema] if isinstance(n.target, torch._ops.OpOverload) else _aten_schemas(_name(n.target))
        given = [(a, v) for s in schemas if s.is_mutable
                 for a, v in [*zip(s.arguments, n.args), *((a, n.kwargs[a.name]) for a in s.arguments if a.name in n.kwargs)]]
        written = list(dict.fromkeys(o for a, v in given if a.alias_info is not None and a.alias_info.is_write
                                     for o in (v if isinstance(v, (tuple, list)) else [v]) if isinstance(o, fx.Node)))
    if not written and n.op in ("call_function", "call_method") and _name(n.target) in _VIEWS_OF_EACH:
        return n.all_input_nodes
    return written or n.all_input_nodes[:1]


def _depths(graph: fx.Graph, free: Callable[[fx.Node], bool] = lambda n: False,
            same_as: Mapping[fx.Node, fx.Node] | None = None) -> dict[fx.Node, int]:
    """Each node's depth: the most nodes on a path from a graph input, counting only nodes
    that are not `free`. Two nodes at one depth are independent as long as neither is free
    (a path into a node that is not free ends deeper). A node in `same_as` takes the depth of
    the node it equals (a split piece of a cat that is exactly one operand: the rules cancel
    the two), so its path runs through that operand alone; two nodes at one depth may then
    depend on each other through the uncancelled pair, a cycle extraction never closes."""
    depth: dict[fx.Node, int] = {}
    same_as = same_as or {}
    for n in graph.nodes:
        if n in same_as:
            depth[n] = depth[same_as[n]]
            continue
        depth[n] = (0 if free(n) else 1) + max((depth[a] for a in n.all_input_nodes), default=-1)
    return depth


# ---- lowering ------------------------------------------------------------------------

# Fewest linears on one input that make a batch_linear_lhs group. Two save one GEMM, but either
# may have a twin elsewhere (a linear of the same input shape, weight shape and dtype that does
# not depend on it, nor it on the twin) that our batch_linear rule or the post-grad passes
# would batch it with: pulled into the pair, it loses that batch, which the per-node cost
# cannot see. So a pair forms only when neither member has a twin (`_Twins`). Measured at
# 1 s (bench models, inference / training launches): dhen, whose DCN and linear modules read
# one input and each have twins in the same layer, 22 / 59 with or without twin-free pairs, but
# 25 / 61 with every pair (Optimus 27 / 60); wukong, whose FM projection and compress linear
# read one input and have no twins, 28 / 66 without pairs, 25 / 57 with them (Optimus 28 / 66).
LHS_MIN_MEMBERS = 3
# Most linears of one signature whose independent sets are seeded beside their depth groups.
INDEPENDENT_MAX = 64


class _Lowerer:
    def __init__(self, gm: fx.GraphModule, values: dict, modules: dict | None = None, mutated: list | None = None):
        self.gm = gm
        self.modules = _submodules(gm) if modules is None else modules
        self._params: dict[str, torch.nn.Parameter] | None = None
        self.values = values
        self.cost_table = "cpu"  # the target's table (launch_cost.py): set before groups are seeded
        self.egraph = EGraph()
        self.nodes: list[fx.Node] = []
        self.templates: list[Template] = []
        self._template_ids: dict[str, int] = {}
        self.leaves: dict[str, fx.Node] = {}
        self.leaf_shapes: dict[str, tuple[int, ...]] = {}
        self.grad_reach: set[fx.Node] | None = None
        self.identities: set[fx.Node] = set()  # nodes lowered to one of their operands
        self.expr: dict[fx.Node, Any] = {}
        self.pieces: dict[fx.Node, Any] = {}    # tuple-valued node -> the variable naming its Pieces
        self.facts: list = []
        self.lets: dict[str, str] = {}          # variable -> Pieces term (see register_text)
        self.uses: dict[int, tuple[str, ...]] = {}  # fact index -> the variables it reads
        self.selects: dict[tuple[fx.Node, int], str] = {}  # (x, d) -> the variable naming unbind(x, d)
        self.reading: list[str] = []            # variables read by the node being lowered
        self.shapes: dict[fx.Node, tuple[int, ...]] = {}  # symbolic sizes as sentinels (shapes.py)
        self.strided: set[fx.Node] = set()  # values whose rows are not contiguous (shapes.rows_strided)
        self.cats: dict[fx.Node, tuple[int, list[fx.Node]]] = {}  # cat -> (dim, operands)
        self.stacks: dict[fx.Node, tuple[int, list[fx.Node]]] = {}  # stack -> (dim, operands)
        self.splits: dict[fx.Node, tuple[fx.Node, int, list[int] | None]] = {}  # split / unbind -> (x, dim, sizes)
        self.symbols = size_symbols(gm)
        self.shape_seeded: set[fx.Node | str] = set()  # values whose shape fact is seeded (see sliced)
        self.effects = _ordered_effects(gm.graph, self.modules, mutated)
        self.effect_set = set(self.effects)
        self.kind: dict[fx.Node, tuple] = {}   # node -> (family, key, payload) for grouping
        self.first_name: dict[str, str] = {}  # term -> the (node k) that first named it
        self.lhs_kind: dict[fx.Node, tuple] = {}  # linear -> (input, dtype, no bias, out features)
        self.mm_kind: dict[fx.Node, tuple] = {}   # matmul call(tid, [x, y]) -> (x, y, tid)
        self.part = None  # the PART of the node being lowered (in its shared templates' keys)

    # templates ---------------------------------------------------------------
    def template(self, op: str, target, args: tuple, kwargs: dict, shared: bool, n_deps: int = 0,
                 contiguous: bool = False) -> int:
        t = Template(op, target, args, kwargs, n_deps, contiguous)
        key = repr((op, target, args, sorted(kwargs.items()), self.part, contiguous))
        if shared and key in self._template_ids:
            return self._template_ids[key]
        self.templates.append(t)
        if shared:
            self._template_ids[key] = len(self.templates) - 1
        return len(self.templates) - 1

    def abstract(self, node: fx.Node):
        """Replace node operands by Slots; returns (args, kwargs, operands). An operand is a
        node, or (src, i) for item i of a tuple-valued `src` given whole (`torch.cat(torch.split(
        x, 3), out=c)`): that argument becomes a list of one Slot per item."""
        operands: list = []

        def sub(a):
            if isinstance(a, fx.Node) and a in self.pieces:
                count = self.piece_count(a)
                if count is None:
                    raise Unsupported(f"{node.name} takes {a.name} whole, and its length is unknown")
                operands.extend((a, i) for i in range(count))
                return [Slot(len(operands) - count + i) for i in range(count)]
            if isinstance(a, fx.Node):
                operands.append(a)
                return Slot(len(operands) - 1)
            return a

        args = fx.node.map_aggregate(node.args, sub)
        kwargs = fx.node.map_aggregate(dict(node.kwargs), sub)
        return tuple(args), dict(kwargs), operands

    # per node ----------------------------------------------------------------
    def lower(self, n: fx.Node, deps: list):
        idx = len(self.nodes)
        self.nodes.append(n)
        self.part = n.meta.get(PART)
        self.reading = []
        v = self.values.get(n)
        # With symbolic sizes only meta is shape-generic: a value propagated from the example
        # inputs has their concrete sizes.
        shp = symbolic_shape(v, self.symbols) if not self.symbols or _meta_value(n) is not None else None
        if shp is not None:
            self.shapes[n] = shp
        if shapes.rows_strided(v):
            self.strided.add(n)
        if n.op in ("placeholder", "get_attr"):
            self.leaves[n.name] = n
            if shp is not None:
                self.leaf_shapes[n.name] = shp
            e = _app("input", quote(n.name))
        elif n in self.effect_set:
            e = self.opaque(n, deps)
        else:
            e = self.normalized(n)
            if e is None:
                e = self.opaque(n, [], shared=self.is_pure(n))
        if e is None:
            return
        if isinstance(e, tuple):  # ("pieces", P): named once, each item refers to the name
            var = f"pieces_{idx}"
            self.lets[var] = e[1]
            self.pieces[n] = var
            return
        if any(self.expr.get(a) == e for a in n.all_input_nodes):
            self.identities.add(n)  # lowered to an operand (a dropout in eval mode)
        # Every value is named by (node idx): later terms refer to it instead of nesting it,
        # so the seed program is linear in graph size, and the name marks the FX origin.
        ref = _app("node", idx)
        self.facts.append(_app("union", ref, e))
        if self.reading:
            self.uses[len(self.facts) - 1] = tuple(dict.fromkeys(self.reading))
        # Equal terms are one e-class; later terms name it by its first node, so that two FX
        # copies of one value (flatten(x) traced twice) group as one input (batch_linear_lhs).
        self.expr[n] = self.first_name.setdefault(e, ref)

    def same_value_kind(self, n: fx.Node, a) -> bool:
        """Do n and its operand `a` have one static shape, dtype and device?"""
        v, w = self.values.get(n), self.values.get(a) if isinstance(a, fx.Node) else None
        if not (isinstance(v, (torch.Tensor, shapes.Meta)) and isinstance(w, (torch.Tensor, shapes.Meta))):
            return False
        return (v.dtype, v.device) == (w.dtype, w.device) and n in self.shapes and self.shapes.get(a) == self.shapes[n]

    def is_pure(self, n: fx.Node) -> bool:
        if n.op == "call_module":
            return False
        name = _name(n.target).lstrip("_") if n.target is not operator.getitem else "getitem"
        if name in _RANDOM or is_mutation(n, self.modules):
            return False
        return name in _PURE_NAMES or _name(n.target) in _PURE_NAMES or n.target in _BINARY

    def opaque(self, n: fx.Node, deps: list, shared: bool = False):
        args, kwargs, operands = self.abstract(n)
        values = [self.item(*a) if isinstance(a, tuple) else self.operand(a) for a in operands]
        if self.unread_dropout(n, operands):
            values[0] = self.zeros_like(operands[0])
        tid = self.template(n.op, n.target, args, kwargs, shared and not deps, n_deps=len(deps),
                            contiguous=self.keeps_layout(n, operands))
        if shared and not deps and not kwargs and args == (Slot(0), Slot(1)) and _is_matmul(n):
            self.mm_kind[n] = (operands[0], operands[1], tid)
        # An effect's tuple stays one opaque value: its getitems are effects too and must stay
        # in the chain, which an item of Pieces would not.
        if self.tuple_valued(n) and n not in self.effect_set:
            return ("pieces", _app("call_multi", tid, _vec([*values, *deps])))
        return _app("call", tid, _vec([*values, *deps]))

    def unread_dropout(self, n: fx.Node, operands: list) -> bool:
        """Is `n` a dropout drawing its mask whose result nothing reads? The values it reads are
        then dead: Inductor drops them with it, and eager draws as many random numbers for a
        tensor of zeros of their shape and dtype (a dropout's draws depend on its input's size
        alone), so it reads zeros and what computed them leaves the graph (a batch no longer
        pays for rows only such a dropout reads: `bench/differential.py --seed 56`)."""
        if n.users or self.symbols or not operands or n.args[:1] != (operands[0],) or isinstance(operands[0], tuple):
            return False
        if (type(_submodule(n, self.modules)) if n.op == "call_module" else n.target) not in _DROPOUTS:
            return False
        v = self.values.get(operands[0])
        return isinstance(v, (torch.Tensor, shapes.Meta)) and draws_random(n, self.modules) and not is_mutation(n, self.modules)

    def zeros_like(self, a: fx.Node) -> str:
        v = self.values[a]
        tid = self.template("call_function", torch.zeros, (tuple(v.shape),), {"dtype": v.dtype, "device": v.device},
                            shared=True)
        return _app("call", tid, _vec([]))

    def keeps_layout(self, n: fx.Node, operands: list[fx.Node]) -> bool:
        """Does a layout-following random op (a dropout, or _LAYOUT_DRAWS: rand_like & co., the
        empty_like a decomposed dropout draws into) need its operand contiguous, as it was in
        the input? Its result takes the operand's strides when the operand is dense, and a
        draw fills memory in order, so another layout of the same values draws another mask
        from the same seed (the rewrites may turn a piece into a dense transposed view)."""
        if not operands or not (draws_random(n, self.modules) or _name(n.target).lstrip("_") in _LAYOUT_DRAWS):
            return False
        v = self.values.get(operands[0])
        if not isinstance(v, torch.Tensor) or n.args[:1] != (operands[0],):
            return False
        return v.is_contiguous() or not torch._prims_common.is_non_overlapping_and_dense_or_false(v)

    def tuple_valued(self, n: fx.Node) -> bool:
        """All users take pieces: int getitems, or a cat/stack given the whole tuple. A node
        whose value is known to be a tensor never is: `bmm(q, k)[0]` selects a row."""
        if isinstance(self.values.get(n), (torch.Tensor, shapes.Meta)):
            return False
        return bool(n.users) and all(
            (u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int))
            or (u.op == "call_function" and (u.target in _CAT or u.target in _STACK)
                and self.arg(u, 0, "tensors") is n)
            for u in n.users)

    def piece_count(self, n: fx.Node) -> int | None:
        if self.kind.get(n, ("",))[0] == "n":
            return self.kind[n][1]
        v = self.values.get(n)
        return len(v) if isinstance(v, (tuple, list)) else None

    def item(self, src: fx.Node, i: int) -> str:
        """Item i of tuple-valued `src`: its Pieces by name (bound by the seeding rule)."""
        self.reading.append(self.pieces[src])
        return _app("item", self.pieces[src], i)

    def operand(self, a: fx.Node):
        if a in self.pieces:
            raise Unsupported(f"tuple value {a.name} used whole")
        return self.expr[a]

    def sliced(self, a: fx.Node):
        """operand(a), for a split, unbind or narrow of `a`: the rules that see through those
        guard on its whole shape, so its shape fact is seeded (once). Other values' shapes stay
        out of the e-graph (a third of the seed program, read by no rule); the rules set the
        shapes of the stacked and batched values they build."""
        e = self.operand(a)
        if a not in self.shape_seeded:
            self.shape_seeded.add(a)
            self.facts.append(_app("set", _app("shape", e), _vec(self.shapes[a])))
            if a in self.cats:  # where each operand lies (merge_splits' narrow-of-cat-operand)
                d, xs = self.cats[a]
                start = 0
                for y in xs:
                    shp = self.shapes.get(y, ())
                    if len(shp) <= d or shp[d] >= SYMBOLIC_MIN:
                        break  # the operands after one of unknown length have no known place
                    self.facts.append(_app("cat_operand", e, d, start, shp[d], self.operand(y)))
                    start += shp[d]
        return e

    def arg(self, n: fx.Node, i: int, name: str, default=None):
        if len(n.args) > i:
            return n.args[i]
        return n.kwargs.get(name, default)

    def dim(self, n: fx.Node, d: int, rank_of: fx.Node | None = None, extra: int = 0) -> int | None:
        if d >= 0:
            return d
        shp = self.shapes.get(rank_of if rank_of is not None else n)
        return None if shp is None else d + len(shp) + extra

    def normalized(self, n: fx.Node):
        """The op's constructor, or None to lower it as a template call."""
        if n.op == "call_module":
            return self.module(n)
        if n.op not in ("call_function", "call_method"):
            return None
        t = n.target
        if n.op == "call_function" and t is operator.getitem:
            src = n.args[0]
            if self.is_layer_norm_output(n):
                x, ns, w, b, eps = src.args
                return self.make_layer_norm(n, x, list(ns), w, b, float(eps))
            if isinstance(src, fx.Node) and src in self.pieces and isinstance(n.args[1], int):
                i = n.args[1]
                return self.item(src, i if i >= 0 else i + self.n_pieces(src))
            return self.make_slice(n)
        name = t if n.op == "call_method" else None
        key = name if name is not None else t
        if key in _ATEN_GEMM and n.op == "call_function":
            return self.aten_linear(n)
        if key in _LINEAR and n.op == "call_function":
            x, w = self.arg(n, 0, "input"), self.arg(n, 1, "weight")
            b = self.arg(n, 2, "bias")
            return self.make_linear(n, x, w, b)
        if key in _LAYER_NORM and n.op == "call_function":
            x, ns = self.arg(n, 0, "input"), self.arg(n, 1, "normalized_shape")
            w, b = self.arg(n, 2, "weight"), self.arg(n, 3, "bias")
            eps = self.arg(n, 4, "eps", 1e-5)
            if not isinstance(ns, (list, tuple)):
                return None  # a shape computed in the graph
            if isinstance(eps, bool) or not isinstance(eps, (int, float)):
                return None  # Dynamo with dynamic=True lifts eps to a graph input (.item())
            return self.make_layer_norm(n, x, list(ns), w, b, float(eps))
        if key in _CAT or key in _STACK:
            xs, d = self.arg(n, 0, "tensors"), self.arg(n, 1, "dim", 0)
            if isinstance(xs, fx.Node) and xs in self.pieces:  # torch.cat(torch.split(x, ...))
                count = self.piece_count(xs)
                if count is None:
                    raise Unsupported(f"{n.name} takes {xs.name} whole, and its length is unknown")
                d = self.dim(n, d)  # the output's rank fixes a negative dim for cat and stack alike
                if d is None or not count:
                    raise Unsupported(f"{n.name}: cannot lower {key} of a whole tuple here")
                items = [self.item(xs, i) for i in range(count)]
                return _app("stack" if key in _STACK else "cat", _vec(items), d)
            if not isinstance(xs, (list, tuple)) or not all(isinstance(a, fx.Node) for a in xs):
                return None
            extra = 1 if key in _STACK else 0
            d = self.dim(n, d, xs[0], extra) if xs else d
            if d is None:
                return None
            (self.cats if key in _CAT else self.stacks)[n] = (d, list(xs))
            return _app("stack" if key in _STACK else "cat", _vec(self.operand(a) for a in xs), d)
        if key in _SPLIT or key in _CHUNK:
            return self.make_split(n, key in _CHUNK)
        if key in _UNBIND:
            x, d = self.arg(n, 0, "input" if n.op == "call_function" else "self"), self.arg(n, 1, "dim", 0)
            d = self.dim(n, d, x)
            if d is None or not self.tuple_valued(n) or x not in self.shapes or self.shapes[x][d] >= SYMBOLIC_MIN:
                return None
            self.kind[n] = ("n", self.shapes[x][d])
            self.splits[n] = (x, d, None)
            return ("pieces", _app("unbind", self.sliced(x), d))
        if key in _SELECT:
            x, d, i = self.arg(n, 0, "input" if n.op == "call_function" else "self"), self.arg(n, 1, "dim"), self.arg(n, 2, "index")
            if type(d) is not int or type(i) is not int or not isinstance(x, fx.Node) or x not in self.shapes:
                return None
            d = self.dim(n, d, x)
            return self.select(x, d, i) if 0 <= d < len(self.shapes[x]) else None
        if key in _SQUEEZE or key in _NARROW:
            return self.make_view(n, key in _NARROW)
        if key in _ATEN_SLICE and n.op == "call_function":
            return self.make_aten_slice(n)
        if key in _RESHAPE:
            return self.make_reshape(n)
        if key is aten.copy.default and n.op == "call_function" and self.same_value_kind(n, n.args[1]):
            return self.operand(n.args[1])  # a write-made-out-of-place copy (functional.py): its value is its source's
        if key in _DROPOUT:
            training = self.arg(n, 2, "training", True) if key is F.dropout else self.arg(n, 2, "train", True)
            p = self.arg(n, 1, "p", 0.5)
            if not training or p == 0:
                return self.operand(self.arg(n, 0, "input"))
            return None
        unary = _FN_ALIASES.get(t) if n.op == "call_function" else None
        if unary is None and n.op == "call_function" and t in _UNARY.values():
            unary = next(k for k, v in _UNARY.items() if v is t)
        if unary is None and n.op == "call_method" and t in _UNARY:
            unary = t
        if unary is not None:
            if inspect.isfunction(t):  # F.relu(x, False): the canonical torch.relu has no `inplace`
                kwargs, rest = _bound_args(n), ()
            else:
                kwargs, rest = dict(n.kwargs), n.args[1:]
                if n.args:
                    kwargs["input"] = n.args[0]
            return self.make_unary(n, _UNARY[unary], kwargs.pop("input", None), rest, kwargs)
        if key in _BINARY:
            return self.make_binary(n, _BINARY[key])
        return None

    def n_pieces(self, n: fx.Node) -> int:
        return self.kind[n][1]

    def module(self, n: fx.Node):
        mod = self.modules.get(n.target) if isinstance(n.target, str) else None
        if mod is None:
            mod = self.gm.get_submodule(n.target)
        x = n.args[0] if n.args else None
        if isinstance(mod, torch.nn.Linear):
            return self.make_linear(n, x, self.attr(n.target, "weight", mod.weight),
                                    self.attr(n.target, "bias", mod.bias) if mod.bias is not None else None)
        if isinstance(mod, torch.nn.LayerNorm):
            w = self.attr(n.target, "weight", mod.weight) if mod.weight is not None else None
            b = self.attr(n.target, "bias", mod.bias) if mod.bias is not None else None
            return self.make_layer_norm(n, x, list(mod.normalized_shape), w, b, float(mod.eps))
        if type(mod) in _MODULE_UNARY:
            kwargs = {"approximate": mod.approximate} if isinstance(mod, torch.nn.GELU) else {}
            return self.make_unary(n, _UNARY[_MODULE_UNARY[type(mod)]], x, (), kwargs)
        if isinstance(mod, torch.nn.Identity) or (isinstance(mod, torch.nn.Dropout) and (not mod.training or mod.p == 0)):
            return self.operand(x)
        return None

    def attr(self, module: str, field: str, value: torch.Tensor):
        """A module parameter as a leaf (it gets its own get_attr node in to_fx)."""
        target = f"{module}.{field}"
        name = "attr:" + target
        if name not in self.leaves:
            self.leaves[name] = target  # type: ignore[assignment]
            self.leaf_shapes[name] = tuple(value.shape)
        return name

    def leaf_or_operand(self, a):
        if a is None:
            return NONE
        if isinstance(a, str):
            return _app("input", quote(a))
        return self.operand(a)

    def make_linear(self, n, x, w, b):
        if not isinstance(x, fx.Node):
            return None
        e = _app("linear", self.operand(x), self.leaf_or_operand(w), self.leaf_or_operand(b))
        xs, ws = self.shapes.get(x), self.shape_of(w)
        if ws is not None and len(ws) == 2 and w not in self.shape_seeded:
            # linear-of-unbind-piece / linear-of-split-piece read the weight's shape (a 1-D
            # weight, whose linear drops the last dim, gets none: those rules leave it alone)
            self.shape_seeded.add(w)
            self.facts.append(_app("set", _app("shape", self.leaf_or_operand(w)), _vec(ws)))
        if xs is not None and ws is not None and len(ws) == 2:  # a 1-D weight joins no batch
            self.kind[n] = ("linear", (xs, ws, self.dtype(x)), (x, w, b))
            self.lhs_kind[n] = (x, self.dtype(x), b is None, ws[0])
        return e

    def make_layer_norm(self, n, x, ns, w, b, eps):
        if not isinstance(x, fx.Node) or not all(isinstance(d, int) for d in ns):
            return None
        e = _app("layer_norm", self.operand(x), _vec(ns), self.leaf_or_operand(w),
                 self.leaf_or_operand(b), _f64(eps))
        if x in self.shapes:
            self.kind[n] = ("layer_norm", (self.shapes[x], tuple(ns), eps, w is None, b is None,
                                           self.dtype(x)), (x, ns, w, b, eps))
        return e

    def make_unary(self, n, fn, x, rest, kwargs):
        if kwargs.pop("inplace", False):
            return None
        if not isinstance(x, fx.Node) or any(isinstance(a, fx.Node) for a in (*rest, *kwargs.values())):
            return None
        tid = self.template("call_function", fn, (Slot(0), *rest), kwargs, shared=True)
        if x in self.shapes:
            self.kind[n] = ("pointwise", (tid, self.shapes[x], self.dtype(x)), x)
        return _app("unary", tid, self.operand(x))

    def is_layer_norm_output(self, n: fx.Node) -> bool:
        """getitem(aten.native_layer_norm(...), 0) whose mean and rstd outputs are unused: F.layer_norm."""
        src = n.args[0]
        if not (isinstance(src, fx.Node) and src.op == "call_function" and src.target is aten.native_layer_norm.default
                and n.args[1] == 0 and len(src.args) == 5 and not src.kwargs and src not in self.effect_set):
            return False
        _, ns, _, _, eps = src.args
        return (isinstance(ns, (list, tuple)) and isinstance(eps, float)
                and all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in src.users))

    def aten_linear(self, n: fx.Node):
        """aten.mm(x, t(w)) is F.linear(x, w), aten.addmm(b, x, t(w)) is F.linear(x, w, b): exactly
        (F.linear runs these very calls) when x and w are 2-D, b is [out], and beta = alpha = 1."""
        if any(v != 1 for v in n.kwargs.values()) or set(n.kwargs) - {"beta", "alpha"}:
            return None
        if n.target is aten.addmm.default:
            if len(n.args) != 3:
                return None
            b, x, wt = n.args
        else:
            if len(n.args) != 2:
                return None
            b, (x, wt) = None, n.args
        w = self.transposed(wt)
        if w is None or not isinstance(x, fx.Node) or len(self.shapes.get(x, ())) != 2:
            return None
        if b is not None and (not isinstance(b, fx.Node) or self.shapes.get(b) != self.shapes[w][:1]):
            return None  # a [M, out] or broadcast bias is not a linear's
        return self.make_linear(n, x, w, b)

    def transposed(self, wt) -> fx.Node | None:
        """w, when `wt` is aten.t(w) / permute(w, [1, 0]) / transpose(w, 0, 1) of a 2-D w."""
        if not isinstance(wt, fx.Node) or wt.op != "call_function" or wt.kwargs or wt in self.effect_set:
            return None
        w = wt.args[0] if wt.args else None
        if not isinstance(w, fx.Node) or len(self.shapes.get(w, ())) != 2:
            return None
        if wt.target is aten.t.default and len(wt.args) == 1:
            return w
        if wt.target is aten.permute.default and list(wt.args[1:]) in ([[1, 0]], [[-1, -2]], [[1, -2]], [[-1, 0]]):
            return w
        if wt.target is aten.transpose.int and len(wt.args) == 3 and {d % 2 for d in wt.args[1:]} == {0, 1}:
            return w
        return None

    def make_binary(self, n, fn):
        if not n.args or set(n.kwargs) - {"other"}:
            return None
        a, b = n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs.get("other")
        tensor_args = [v for v in (a, b) if isinstance(v, fx.Node)]
        if len(tensor_args) == 2:
            out = self.shapes.get(n)
            if out is None or self.shapes.get(a) != out or self.shapes.get(b) != out:
                return None  # broadcasting: not one element of each operand per output element
            tid = self.template("call_function", fn, (Slot(0), Slot(1)), {}, shared=True)
            self.kind[n] = ("binary", (tid, out, self.dtype(a), self.dtype(b)), (a, b))
            return _app("binary", tid, self.operand(a), self.operand(b))
        if len(tensor_args) == 1 and isinstance(a if b is tensor_args[0] else b, (int, float)):
            x = tensor_args[0]
            out = self.shapes.get(n)
            if out is None or out != self.shapes.get(x):
                return None  # a 0-d or broadcasting operand is not elementwise in x
            if a is x:
                return self.make_templated_pointwise(n, fn, (Slot(0), b), x)
            # `2.5 / x` runs Tensor.__rtruediv__ (reciprocal, then multiply), which rounds
            # differently from torch.div(2.5, x): keep the reflected operator itself.
            return self.make_templated_pointwise(n, n.target, (a, Slot(0)), x)
        return None

    def make_templated_pointwise(self, n, fn, args, x):
        tid = self.template("call_function", fn, args, {}, shared=True)
        if x in self.shapes:
            self.kind[n] = ("pointwise", (tid, self.shapes[x], self.dtype(x)), x)
        return _app("unary", tid, self.operand(x))

    def make_split(self, n, chunk: bool):
        x = self.arg(n, 0, "input" if n.op == "call_function" else "self")
        if n.op == "call_function" and n.target in (torch.split, torch.functional.split, torch.Tensor.split):
            sizes, d = self.arg(n, 1, "split_size_or_sections"), self.arg(n, 2, "dim", 0)
        elif chunk:
            sizes, d = self.arg(n, 1, "chunks"), self.arg(n, 2, "dim", 0)
        else:
            sizes, d = self.arg(n, 1, "split_size"), self.arg(n, 2, "dim", 0)
            if sizes is None:
                sizes = self.arg(n, 1, "split_sizes")
        if not isinstance(x, fx.Node) or x not in self.shapes or not self.tuple_valued(n):
            return None
        d = self.dim(n, d, x)
        length = self.shapes[x][d]
        if length >= SYMBOLIC_MIN:
            return None  # piece sizes computed from a symbolic size
        if chunk:
            if not isinstance(sizes, int):
                return None
            step = math.ceil(length / sizes) if length else 0
            sizes = [min(step, length - s) for s in range(0, length, step)] if step else [0]
        elif isinstance(sizes, int):
            sizes = [min(sizes, length - s) for s in range(0, length, sizes)] if sizes else [length]
        if not isinstance(sizes, (list, tuple)) or not all(isinstance(s, int) for s in sizes):
            return None
        self.kind[n] = ("n", len(sizes))
        self.splits[n] = (x, d, list(sizes))
        self.split_sizes(sizes)
        return ("pieces", _app("split", self.sliced(x), _vec(sizes), d))

    def split_sizes(self, sizes: list[int]) -> None:
        """The facts the split_cat and merge_splits rules read about a split's sizes: whether
        they are all equal, and where each piece starts (a walk in the rules would take one
        iteration per piece). Seeded for every split, the batch rules' own included."""
        if len(set(sizes)) == 1:
            self.facts.append(_app("even_split", _vec(sizes), sizes[0]))
        self.facts.append(_app("set", _app("split_starts", _vec(sizes)), _vec(itertools.accumulate(sizes[:-1], initial=0))))

    def make_reshape(self, n):
        """reshape(x, sizes) / x.view(sizes) to ints: reshape to the output's static shape (-1
        resolved). A view to a dtype, or sizes computed in the graph, stay templates."""
        if not n.args or set(n.kwargs) - {"shape", "size"}:
            return None
        x, sizes = n.args[0], [*n.args[1:], *n.kwargs.values()]
        if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):  # x.view((2, 3)), torch.reshape(x, (2, 3))
            sizes = list(sizes[0])
        if not isinstance(x, fx.Node) or n not in self.shapes or len(sizes) != len(self.shapes[n]):
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
            return None
        return _app("reshape", self.operand(x), _vec(self.shapes[n]))

    def make_view(self, n, is_narrow: bool):
        """squeeze(x, d) of a size-1 dim, narrow(x, d, start, length) in bounds; static ints only."""
        x = self.arg(n, 0, "input" if n.op == "call_function" else "self")
        d = self.arg(n, 1, "dim")
        ints = [d, *(self.arg(n, 2, "start"), self.arg(n, 3, "length"))[:2 if is_narrow else 0]]
        if not isinstance(x, fx.Node) or x not in self.shapes or len(n.args) + len(n.kwargs) != len(ints) + 1:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            return None  # squeeze() of every size-1 dim, a tuple of dims, or a computed start
        shp = self.shapes[x]
        if not -len(shp) <= d < len(shp):
            return None
        d = d % len(shp)
        if shp[d] >= SYMBOLIC_MIN:
            return None
        if not is_narrow:
            return _app("squeeze", self.operand(x), d) if shp[d] == 1 else None
        start, length = ints[1] + (shp[d] if ints[1] < 0 else 0), ints[2]
        if not (0 <= start and 0 <= length and start + length <= shp[d]):
            return None
        return _app("narrow", self.sliced(x), d, start, length)

    def make_slice(self, n):
        """x[index] to narrow(x, d, start, length) when x is a tensor of static shape and the index
        is a slice, or a tuple of slices and at most one Ellipsis, whose slices all have int / None
        bounds and step 1 / None, and exactly one of them (on dim d) leaves out part of its dim.
        Bounds are normalized as Python and torch slicing do (a negative one wraps, then both
        clamp to [0, size]); the slice may be empty. An index of one int and whole dims is a
        select (select_of_index). Any other index (ints with slices that cut, None, tensors,
        other steps, two cut dims, a computed bound, no cut dim at all) stays a template."""
        x, index = n.args
        if not isinstance(index, (slice, tuple, int)) or isinstance(index, bool):
            return None
        index = index if isinstance(index, tuple) else (index,)
        if any(type(s) is int for s in index):
            return self.select_of_index(x, index)
        return self.narrow_of_index(x, index)

    def select_of_index(self, x, index: tuple):
        """x[index] for an index of one int (on dim d), full slices and at most one Ellipsis:
        item i of unbind(x, d), so the rules that see through unbind pieces see through it
        (a stack of every x[:, i] is a view of x). Any other index stays a template."""
        full = _per_dim(index, self.shapes[x]) if isinstance(x, fx.Node) and x in self.shapes else None
        if full is None:
            return None
        ints = [d for d, s in enumerate(full) if type(s) is int]
        if len(ints) != 1 or not all(s == slice(None) for d, s in enumerate(full) if d != ints[0]):
            return None
        return self.select(x, ints[0], full[ints[0]])

    def select(self, x: fx.Node, d: int, i: int):
        """Item i of unbind(x, d), x of static size on d (i may be negative), or None."""
        size = self.shapes[x][d]
        if size >= SYMBOLIC_MIN or not -size <= i < size:
            return None
        var = self.selects.get((x, d))
        if var is None:
            var = self.selects[(x, d)] = f"select_{len(self.selects)}"
            self.lets[var] = _app("unbind", self.sliced(x), d)
        self.reading.append(var)
        return _app("item", var, i % size)

    def make_aten_slice(self, n):
        """aten.slice.Tensor(x, dim=0, start=None, end=None, step=1) is x[..., start:end:step] cut on
        dim `dim` (end is often sys.maxsize, "to the end"): the narrow make_slice makes of that
        index. A slice of the whole dim, another step or a computed bound stays a template."""
        x, d = self.arg(n, 0, "self"), self.arg(n, 1, "dim", 0)
        shp = self.shapes.get(x) if isinstance(x, fx.Node) else None
        if shp is None or type(d) is not int or not -len(shp) <= d < len(shp):
            return None
        cut = slice(self.arg(n, 2, "start"), self.arg(n, 3, "end"), self.arg(n, 4, "step", 1))
        return self.narrow_of_index(x, (*[slice(None)] * (d % len(shp)), cut))

    def narrow_of_index(self, x, index: tuple):
        """narrow(x, d, start, length) for x[index], or None (see make_slice)."""
        if not isinstance(x, fx.Node) or x not in self.shapes:
            return None  # not a tensor (a tuple of split pieces, a torch.Size), or a dynamic shape
        shp = self.shapes[x]
        slices = _per_dim(index, shp)
        if slices is None or not all(isinstance(s, slice) and all(_static_int(v) for v in (s.start, s.stop, s.step))
                   and s.step in (None, 1) for s in slices):
            return None
        bounds = [s.indices(size)[:2] for s, size in zip(slices, shp)]
        cut = [(d, start, stop) for d, (start, stop) in enumerate(bounds) if (start, stop) != (0, shp[d])]
        if len(cut) != 1:
            return None
        (d, start, stop), = cut
        if shp[d] >= SYMBOLIC_MIN:
            return None  # bounds normalized against a symbolic size
        return _app("narrow", self.sliced(x), d, start, max(stop - start, 0))

    def value_of(self, a):
        """The value of operand `a`: a node's example value, a module parameter's ("attr:" leaf)."""
        if isinstance(a, str):
            return self.parameter(a[5:]) if a.startswith("attr:") else None
        return self.values.get(a)

    def shape_of(self, a):
        if isinstance(a, str):
            v = self.value_of(a)
            return None if v is None else tuple(v.shape)
        return self.shapes.get(a)

    def one_operand(self, members: list[fx.Node], k: int) -> bool:
        """Do `members` (of one kind) read one and the same operand k?"""
        return len({self.expr.get(a, a) for a in (self.kind[m][2][k] for m in members)}) == 1

    def parameter(self, target: str) -> torch.nn.Parameter:
        """gm.get_parameter(target), from a table of all parameters built once."""
        if self._params is None:
            self._params = dict(self.gm.named_parameters(remove_duplicate=False))
        p = self._params.get(target)
        return p if p is not None else self.gm.get_parameter(target)

    def dtype(self, a) -> str:
        v = self.values.get(a)
        return str(getattr(v, "dtype", None)) + str(getattr(v, "device", None))

    # groups ------------------------------------------------------------------
    def distinct(self, members: list[fx.Node]) -> list[fx.Node]:
        """`members` less the repeats of a value: two FX copies of one term (the same op on
        the same operands, traced twice) are one e-class and join a group once."""
        first: dict[str, fx.Node] = {}
        for m in members:
            first.setdefault(self.expr[m], m)
        return list(first.values())

    def free(self, n: fx.Node) -> bool:
        """A node that computes nothing: a view, or one lowered to one of its operands (a
        dropout in eval mode); for depth also an in-place write, whose result (the tensor it
        wrote) the reads after it read (functional.py), so they keep the depth of a read of
        the tensor itself. Group members (`kind`) are never free."""
        if n in self.kind:
            return False
        return n in self.identities or n.op in ("call_function", "call_method") and (
            _name(n.target) in VIEW_TARGETS or is_mutation(n, self.modules))

    def same_as(self) -> dict[fx.Node, fx.Node]:
        """Pieces that are exactly one operand of what they were cut from: item i of a split of
        a cat whose piece spans one operand on the cat's dim, item i of an unbind of a stack on
        its dim (the rules cancel both: narrow-of-cat-operand, unbind-of-stack)."""
        out: dict[fx.Node, fx.Node] = {}
        for src, (x, d, sizes) in self.splits.items():
            whole = self.stacks if sizes is None else self.cats
            if x not in whole or whole[x][0] != d:
                continue
            xs = whole[x][1]
            if sizes is None:
                at = dict(enumerate(xs))
            else:
                at, start = {}, 0
                for y in xs:
                    shp = self.shapes.get(y, ())
                    if len(shp) <= d or shp[d] >= SYMBOLIC_MIN:
                        break
                    at[(start, shp[d])] = y
                    start += shp[d]
                starts = [0, *itertools.accumulate(sizes)][:-1]
                at = {i: at[(s, z)] for i, (s, z) in enumerate(zip(starts, sizes)) if (s, z) in at}
            for u in src.users:
                if u.target is operator.getitem and isinstance(u.args[1], int) and u.args[1] in at:
                    out[u] = at[u.args[1]]
        return out

    def seed_groups(self) -> dict[str, int]:
        depth = _depths(self.gm.graph, self.free, self.same_as())
        reach = self.grad_reach = _grad_reach(self.gm.graph, self.values)
        buckets: dict[tuple, list[fx.Node]] = defaultdict(list)
        for n, k in self.kind.items():
            if k[0] == "linear" and self.code_gemm(elementwise_linear, k[1][0], k[1][1], k[2][2] is not None):
                continue  # fused with its neighbours; a batch of them would be a baddbmm, which launches
            if k[0] in ("linear", "layer_norm", "pointwise", "binary") and n in self.expr and n in self.shapes:
                buckets[(k[0], k[1], depth[n], n in reach, n.meta.get(PART))].append(n)
        ancestors = _Ancestors(self.gm.graph)
        self.independent_groups(buckets, ancestors)
        counts: dict[str, int] = defaultdict(int)
        for (family, *_), found in buckets.items():
            found = self.distinct(found)
            if len(found) < 2:
                continue
            counts[family] += 1
            # in the order one stack or cat reads them too: the batch's unbind then cancels
            # with it (bench/differential.py --train --seed 48)
            for members in (found, *filter(None, [self.cat_order(found, ("stack", "cat", "concat"))])):
                self.seed_group(family, members, counts)
        self.seed_lhs_groups(depth, reach, counts, ancestors)
        counts.pop("_groups", None)
        return dict(counts)

    def seed_group(self, family: str, members: list[fx.Node], counts) -> None:
        """One batch group of `family` (linear, layer_norm, pointwise, binary): its members in this order."""
        # Each group's Vecs are written once into group_vec; slots refer to them (writing
        # them out per member made seeding quadratic in group size).
        g = counts["_groups"] = counts.get("_groups", 0) + 1
        if family == "linear":
            vecs = [_vec(self.operand(self.kind[m][2][0]) for m in members),
                    _vec(self.leaf_or_operand(self.kind[m][2][1]) for m in members),
                    _vec(self.leaf_or_operand(self.kind[m][2][2]) for m in members)]
        elif family == "layer_norm":
            vecs = [_vec(self.operand(self.kind[m][2][0]) for m in members),
                    _vec(self.leaf_or_operand(self.kind[m][2][2]) for m in members),
                    _vec(self.leaf_or_operand(self.kind[m][2][3]) for m in members)]
        elif family == "binary":
            vecs = [_vec(self.operand(self.kind[m][2][0]) for m in members),
                    _vec(self.operand(self.kind[m][2][1]) for m in members)]
        else:
            vecs = [_vec(self.operand(self.kind[m][2]) for m in members)]
        self.facts += [_app("set", _app("group_vec", g, k), v) for k, v in enumerate(vecs)]
        out = _vec([len(members), *self.shapes[members[0]]])
        if family == "linear":
            slots = [_app("linear_slot", g, out, i) for i in range(len(members))]
            if self.shared_weight(members):
                slots.append(_app("shared_weight", g))
        elif family == "layer_norm":
            _, ns, w, b, eps = self.kind[members[0]][2]
            slots = [_app("layer_norm_slot", g, _vec(ns), _f64(eps), out, i) for i in range(len(members))]
        elif family == "binary":
            tid = self.kind[members[0]][1][0]
            slots = [_app("binary_slot", tid, g, out, i) for i in range(len(members))]
        else:
            tid = self.kind[members[0]][1][0]
            slots = [_app("pointwise_slot", tid, g, out, i) for i in range(len(members))]
        self.facts += slots

    def shared_weight(self, members: list[fx.Node]) -> bool:
        """Do linears `members` read one weight and one bias, or none (`batch-linear-shared-weight`:
        one linear of their stacked inputs)? Not with a bias of bfloat16 / float16 or of a dtype not
        known: a linear of a stack that is not contiguous (a view of the input, where its pieces'
        stack is one) computes a matmul rounded before its bias add rounds again, where each
        member's addmm rounds once (tests/test_fuzz.py
        `test_random_graph_rounds_no_worse_in_low_precision`)."""
        if not (self.one_operand(members, 1) and self.one_operand(members, 2)):
            return False
        b = self.kind[members[0]][2][2]
        return b is None or getattr(self.value_of(b), "dtype", None) in (torch.float32, torch.float64)

    def code_gemm(self, elementwise: Callable[..., bool], *shapes) -> bool:
        """Is a GEMM of these shapes elementwise code by Inductor's own decompositions (True: it
        joins no group)? One the GEMM loops write as code does join: the price (loop work,
        launch_cost.batch_of_loops) decides whether its group batches."""
        return elementwise(*shapes, "cpu" if self.cost_table in LOOP_LIMITS else self.cost_table)

    def independent_groups(self, buckets: dict[tuple, list[fx.Node]], ancestors: _Ancestors) -> None:
        """Linears (or layer norms) of one signature at different depths with no path between
        two of them (parallel branches of unequal length, which depth groups keep apart): the
        independent sets that no depth group already is join `buckets` as groups of their own,
        beside the depth groups; extraction picks. Layer norms: signatures of 3 to
        INDEPENDENT_MAX (those of a batch of linears at two depths: `bench/differential.py
        --train --seed 54`, four linears of one weight whose layer norms, two pairs by depth,
        needed a second GEMM). Linears: signatures of 3 to INDEPENDENT_MAX
        (independent_sets compares members pairwise; pairs gave the same bench launches, but
        with them and a fusion-estimate change four tests failed, not separated), and pairs
        reading one weight (one GEMM of both inputs: `bench/differential.py --seed 54`, one
        launch fewer). Sets whose members all read one weight too (tests/test_fuzz.py
        `_OPTIMUS_FEWER`); that needed greedy's single switches (extract/greedy.py `_swap`) in
        `linear_per_piece_of_a_batch`."""
        by_sig: dict[tuple, list[fx.Node]] = defaultdict(list)
        depth_groups = set()
        for (family, sig, _, *rest), members in buckets.items():
            if family in ("linear", "layer_norm"):
                by_sig[(family, sig, *rest)] += members
                depth_groups.add(frozenset(self.distinct(members)))
        for (family, sig, *rest), candidates in by_sig.items():
            candidates = self.distinct(candidates)
            if not (2 < len(candidates) or (family == "linear" and self.one_operand(candidates, 1))) \
                    or len(candidates) > INDEPENDENT_MAX:
                continue
            for j, found in enumerate(ancestors.independent_sets(candidates)):
                if len(found) > 1 and frozenset(found) not in depth_groups:
                    buckets[(family, sig, ("independent", j), *rest)] = found

    def seed_lhs_groups(self, depth, reach, counts, ancestors: _Ancestors) -> None:
        """Linears reading the same input (same depth, same bias presence): one wide GEMM. Fewer
        than LHS_MIN_MEMBERS of them only when none has a twin (see LHS_MIN_MEMBERS). Linears
        and matmuls the target computes as elementwise code (launch_cost.py) join no group. A
        group that one cat reads in another order is seeded in that order too (cat_order)."""
        buckets: dict[tuple, list[fx.Node]] = defaultdict(list)
        for n, (x, dt, nobias, out) in self.lhs_kind.items():
            xs = self.shapes.get(x)
            if xs and self.code_gemm(elementwise_linear, xs, (out, xs[-1]), not nobias):
                continue  # no GEMM to share: a wide one would launch where the members fuse
            if n in self.expr and n in self.shapes:  # equal inputs: one key
                buckets[(self.expr.get(x, x), dt, nobias, depth[n], n in reach, n.meta.get(PART))].append(n)
        twins = _Twins(self.kind, ancestors)
        for found in map(self.distinct, buckets.values()):
            if len(found) < 2 or (len(found) < LHS_MIN_MEMBERS and any(twins.has_twin(m, found) for m in found)):
                continue
            for members in (found, *filter(None, [self.cat_order(found)])):
                self.seed_lhs_group(members, counts)
        self.seed_matmul_groups(reach, counts, ancestors)
        self.seed_batch_matmul_groups(reach, counts, ancestors)
        counts.pop("_lhs", None)

    def cat_order(self, members: list[fx.Node], readers: tuple[str, ...] = ("cat", "concat")) -> list[fx.Node] | None:
        """`members` in the order one cat (or another of `readers`) reads them (each read by it
        alone, directly or through nodes lowered to their operand), where that is not their
        own: the wide GEMM's or matmul's split, or a batch's unbind, then lines up with the
        reader and both cancel. None otherwise."""
        where = {}
        for m in members:
            n = m
            while len(n.users) == 1 and next(iter(n.users)) in self.identities:
                n = next(iter(n.users))
            reader = next(iter(n.users)) if len(n.users) == 1 else None
            if reader is None or _name(reader.target) not in readers or not reader.args \
                    or not isinstance(reader.args[0], (list, tuple)) or n not in reader.args[0]:
                return None
            where[m] = (reader, reader.args[0].index(n))
        if len({r for r, _ in where.values()}) != 1:
            return None
        order = sorted(members, key=lambda m: where[m][1])
        return order if order != members else None

    def seed_lhs_group(self, members: list[fx.Node], counts) -> None:
        """One wide-GEMM group: the members' weights and biases, concatenated in this order."""
        x = self.lhs_kind[members[0]][0]
        counts["linear_lhs"] += 1
        g = counts["_lhs"] = counts.get("_lhs", 0) + 1
        g = -g  # lhs groups count down so their ids never meet the batch groups'
        sizes = [self.lhs_kind[m][3] for m in members]
        self.split_sizes(sizes)
        shp = self.shapes[members[0]]
        out = _vec([*shp[:-1], sum(sizes)])
        self.facts += [
            _app("set", _app("group_vec", g, 1), _vec(self.leaf_or_operand(self.kind[m][2][1]) for m in members)),
            _app("set", _app("group_vec", g, 2), _vec(self.leaf_or_operand(self.kind[m][2][2]) for m in members)),
        ]
        self.facts += [_app("linear_lhs_slot", self.operand(x), g, _vec(sizes), len(shp) - 1, out, i)
                       for i in range(len(members))]

    def seed_matmul_groups(self, reach, counts, ancestors: _Ancestors) -> None:
        """Matmuls of one first operand whose second operands are alike but for their last
        (static) dim, with no path between two of them: one matmul of the concatenated second
        operands. Not cut by depth (two score products of one query rarely share a depth):
        independent members cannot make a group its own ancestor, and extraction never
        closes a cycle across groups. A group one cat reads in another order is seeded in that
        order too (cat_order)."""
        buckets: dict[tuple, list[fx.Node]] = defaultdict(list)
        for n, (x, y, tid) in self.mm_kind.items():
            xs, ys, out = self.shapes.get(x), self.shapes.get(y), self.shapes.get(n)
            if n not in self.expr or xs is None or ys is None or out is None or len(xs) < 2 or len(ys) < 2:
                continue  # a 1-D operand is a vector product: no last dim to concatenate on
            if ys[-1] >= SYMBOLIC_MIN or out[-1] != ys[-1]:
                continue
            if self.code_gemm(elementwise_matmul, xs, ys):
                continue  # no GEMM to share: a wide one would launch where the members fuse
            buckets[(self.expr.get(x, x), tid, self.dtype(y), ys[:-1], n in reach, n.meta.get(PART))].append(n)
        for candidates in map(self.distinct, buckets.values()):
            for found in ancestors.independent_sets(candidates) if len(candidates) > 1 else ():
                if len(found) > 1:
                    for members in (found, *filter(None, [self.cat_order(found)])):
                        self.seed_matmul_lhs_group(members, counts)

    def seed_matmul_lhs_group(self, members: list[fx.Node], counts) -> None:
        """One matmul of the members' concatenated second operands, in this order."""
        x, _, tid = self.mm_kind[members[0]]
        counts["matmul_lhs"] += 1
        counts["_lhs"] = counts.get("_lhs", 0) + 1
        g = -counts["_lhs"]  # counts down with the linear lhs groups
        ys = [self.mm_kind[m][1] for m in members]
        sizes = [self.shapes[y][-1] for y in ys]
        self.split_sizes(sizes)
        shp = self.shapes[members[0]]
        out = _vec([*shp[:-1], sum(sizes)])
        self.facts.append(_app("set", _app("group_vec", g, 1), _vec(self.operand(y) for y in ys)))
        self.facts += [_app("matmul_lhs_slot", self.operand(x), tid, g, _vec(sizes), len(self.shapes[ys[0]]) - 1,
                            len(shp) - 1, out, i) for i in range(len(members))]

    def seed_batch_matmul_groups(self, reach, counts, ancestors: _Ancestors) -> None:
        """Matmuls (torch.matmul, @: they broadcast over a new batch dim, bmm does not) whose
        first operands share one shape and dtype, and second operands another, with no path
        between two of them: one matmul of the operands stacked on a batch dim d, unbound. Every
        batch dim d of the members is seeded (extraction picks: stacking `x[:, i]` on dim 1 is x
        itself, a copy on dim 0), and second operands that are all transposes of their last two
        dims are stacked untransposed, the stack then transposed (a view). Operands of one rank
        only (a broadcast across ranks would pair the new dim with a batch dim). Products the
        target computes as elementwise code join no group: fused with their neighbours, they
        launch nothing that a batch would save. Nor do sets of one first operand, whose stack
        would copy it once per member: a matmul_lhs group reads it once."""
        buckets: dict[tuple, list[fx.Node]] = defaultdict(list)
        for n, (x, y, tid) in self.mm_kind.items():
            xs, ys = self.shapes.get(x), self.shapes.get(y)
            if n not in self.expr or n not in self.shapes or xs is None or ys is None:
                continue
            if len(xs) < 2 or len(xs) != len(ys) or self.templates[tid].target not in _BROADCAST_MATMUL:
                continue
            if self.code_gemm(elementwise_matmul, xs, ys):
                continue
            z = _untransposed(y, self.shapes)
            key = (tid, xs, ys, self.dtype(x), self.dtype(y), z is not None and z in self.expr, n in reach, n.meta.get(PART))
            buckets[key].append(n)
        for (tid, _, _, _, _, transposed, *_), candidates in buckets.items():
            for members in ancestors.independent_sets(self.distinct(candidates)) if len(candidates) > 1 else ():
                if len(members) < 2 or len({self.expr.get(x, x) for x in (self.mm_kind[m][0] for m in members)}) == 1:
                    continue  # one first operand: a matmul_lhs group (seed_matmul_groups) reads it once
                counts["matmul"] += 1
                g = counts["_groups"] = counts.get("_groups", 0) + 1
                ys = [self.mm_kind[m][1] for m in members]
                vecs = [[self.mm_kind[m][0] for m in members], ys]
                if transposed:
                    vecs.append([_untransposed(y, self.shapes) for y in ys])
                for k, vec in enumerate(vecs):
                    self.facts.append(_app("set", _app("group_vec", g, k), _vec(self.operand(a) for a in vec)))
                shp = self.shapes[members[0]]
                for d in range(len(shp) - 1):
                    out = _vec([*shp[:d], len(members), *shp[d:]])
                    self.facts += [_app("matmul_t_slot", tid, g, d, len(shp), out, i) if transposed else
                                   _app("matmul_slot", tid, g, d, out, i) for i in range(len(members))]


def _per_dim(index: tuple, shp: tuple[int, ...]) -> list | None:
    """An index tuple with at most one Ellipsis as one entry per dim of a tensor of shape
    `shp` (the Ellipsis and the missing trailing dims whole), or None if it names more dims."""
    dots = [k for k, s in enumerate(index) if s is Ellipsis]
    if len(dots) > 1 or len(index) - len(dots) > len(shp):
        return None
    at = dots[0] if dots else len(index)
    return [*index[:at], *[slice(None)] * (len(shp) - len(index) + len(dots)), *index[at + 1:]]


def _untransposed(y: fx.Node, shapes: dict) -> fx.Node | None:
    """z where y is z with its last two dims swapped (`z.t()`, `z.transpose(-2, -1)` and their
    spellings), else None."""
    if y.op not in ("call_method", "call_function") or not y.args or not isinstance(y.args[0], fx.Node):
        return None
    z, shp = y.args[0], shapes.get(y.args[0])
    if shp is None or len(shp) < 2:
        return None
    if y.target in ("t", torch.t, torch.ops.aten.t.default):
        return z if len(shp) == 2 and len(y.args) == 1 and not y.kwargs else None
    if y.target in ("transpose", torch.transpose, torch.ops.aten.transpose.int) and len(y.args) == 3 and not y.kwargs:
        a, b = y.args[1:]
        if type(a) is int and type(b) is int and {a % len(shp), b % len(shp)} == {len(shp) - 2, len(shp) - 1}:
            return z
    return None


_MATMUL = {torch.bmm, torch.matmul, operator.matmul, torch.ops.aten.bmm.default, torch.ops.aten.matmul.default}
_BROADCAST_MATMUL = {torch.matmul, operator.matmul, torch.ops.aten.matmul.default, "matmul", "__matmul__"}


def _is_matmul(n: fx.Node) -> bool:
    if n.op == "call_method":
        return n.target in ("bmm", "matmul", "__matmul__")
    return n.op == "call_function" and n.target in _MATMUL


class _Ancestors:
    """Ancestor sets as bitmasks over the topological order, built only for the nodes asked
    about (and their ancestors)."""

    def __init__(self, graph: fx.Graph):
        self.bits: dict[fx.Node, int] = {}
        self.index = {m: i for i, m in enumerate(graph.nodes)}

    def __call__(self, n: fx.Node) -> int:
        stack = [n]
        while stack:  # iterative post-order: deep graphs must not hit the recursion limit
            m = stack[-1]
            todo = [a for a in m.all_input_nodes if a not in self.bits]
            if todo:
                stack += todo
                continue
            stack.pop()
            bits = 0
            for a in m.all_input_nodes:
                bits |= self.bits[a] | (1 << self.index[a])
            self.bits[m] = bits
        return self.bits[n]

    def related(self, a: fx.Node, b: fx.Node) -> bool:
        """Is there a path between a and b (either way)?"""
        return bool((self(a) >> self.index[b]) & 1 or (self(b) >> self.index[a]) & 1)

    def independent_sets(self, nodes: list[fx.Node]) -> list[list[fx.Node]]:
        """`nodes` cut greedily into sets with no path between two members: once in graph
        order, once in reverse, adding the sets of the second cut that the first lacks. The
        cuts differ where paths chain: with `a -> b -> d` and `a -> c`, graph order gives
        {a}, {b, c}, {d} and reverse order {d, c}, {b}, {a}; extraction picks among them."""
        order = sorted(nodes, key=self.index.__getitem__)
        sets = self._first_fit(order)
        seen = {frozenset(s) for s in sets}
        for group in self._first_fit(order[::-1]):
            if frozenset(group) not in seen:
                seen.add(frozenset(group))
                sets.append(group[::-1])
        return sets

    def _first_fit(self, nodes: list[fx.Node]) -> list[list[fx.Node]]:
        sets: list[list[fx.Node]] = []
        for n in nodes:
            for group in sets:
                if not any(self.related(n, m) for m in group):
                    group.append(n)
                    break
            else:
                sets.append([n])
        return sets


class _Twins:
    """Which linears have a twin: another linear of the same input shape, weight shape and
    dtype (`kind` key) with no path between the two (other than those in `besides`)."""

    def __init__(self, kind: dict, ancestors: _Ancestors):
        self.key = {n: k[1] for n, k in kind.items() if k[0] == "linear"}
        self.by_key: dict[tuple, list[fx.Node]] = defaultdict(list)
        for n, k in self.key.items():
            self.by_key[k].append(n)
        self.ancestors = ancestors

    def has_twin(self, n: fx.Node, besides: Sequence[fx.Node] = ()) -> bool:
        return any(t is not n and t not in besides and not self.ancestors.related(n, t)
                   for t in self.by_key.get(self.key.get(n), ()))


# ops whose result no gradient flows back from (the *_like and new_* ones read only a shape)
_NO_GRAD = {"detach", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
            "randint_like", "new_zeros", "new_ones", "new_empty", "new_full"}


def _grad_reach(graph: fx.Graph, values, no_grad: set[fx.Node] | frozenset = frozenset(),
                starts: list[fx.Node] | None = None, barrier: set[fx.Node] | frozenset = frozenset()) -> set[fx.Node]:
    """The nodes a gradient of the outputs can reach: back from the outputs through every node
    with a floating (or unknown) value, except the ops in _NO_GRAD (detach; constructors that
    read only a shape) and the nodes in `no_grad` (run with grad disabled). Eagerly, a parameter whose uses all lie outside gets no gradient (grad None);
    batched with one inside, it would get zeros, which an optimizer with momentum or weight
    decay does not skip. So groups never mix the two. A graph of parts (parts.py) carries the
    reach of the whole graph in meta[GRAD_REACH]: a part's output may only feed a no_grad block.
    `starts` (default: what the output reads) are where the walk begins; nodes in `barrier` are
    reached but not walked through (parts.py walks a body call's inputs itself)."""
    if starts is None and any(GRAD_REACH in n.meta for n in graph.nodes):
        return {n for n in graph.nodes if n.meta.get(GRAD_REACH)}
    reach: set[fx.Node] = set()
    todo = [a for n in graph.nodes if n.op == "output" for a in n.all_input_nodes] if starts is None else list(starts)
    while todo:
        n = todo.pop()
        if n in reach or n in no_grad or (n.op in ("call_function", "call_method") and _name(n.target) in _NO_GRAD) or (
                n.target is getattr and n.args[1] == "data"):
            continue
        v = values.get(n)
        if isinstance(v, (int, float, bool, torch.SymInt)) or (
                isinstance(v, (torch.Tensor, shapes.Meta)) and not (v.dtype.is_floating_point or v.dtype.is_complex)):
            continue  # no gradient flows through an integer or boolean value
        reach.add(n)
        if n not in barrier:
            todo.extend(n.all_input_nodes)
    return reach


def _live(graph: fx.Graph, effects: set[fx.Node]) -> set[fx.Node]:
    """The nodes the output or an effect (kept for its side effect) depends on. The others are
    not lowered: extraction starts from the output and the effect chain, so it never kept
    them, and batched with live nodes they would be computed (and, in training, give their
    parameters a zero gradient where eager gives none)."""
    live: set[fx.Node] = set()
    todo = [n for n in graph.nodes if n.op == "output" or n in effects]
    while todo:
        n = todo.pop()
        if n not in live:
            live.add(n)
            todo.extend(n.all_input_nodes)
    return live


def from_fx(gm: fx.GraphModule, example_inputs, *, seed_groups: bool = True,
            meanwhile: Callable[[], None] | None = None, gemm_loops: bool = False) -> Lowered:
    """Lower `gm` into a fresh e-graph; raises ValueError on inputs that do not fit the graph.
    `meanwhile` runs once the shapes are being propagated: beside the child that streams them
    on big graphs (`shape_values`), so it costs no wall time while that runs. `gemm_loops`:
    priced for a compile with small GEMMs as loops (launch_cost.LOOPS)."""
    inputs = check_inputs(gm, example_inputs)
    modules = _submodules(gm)
    mutated = [n for n in gm.graph.nodes if is_mutation(n, modules)]
    values = shapes.shape_values(gm, inputs, bool(mutated))
    try:
        if meanwhile is not None:
            meanwhile()
        out_of_place = 0
        if mutated:
            from optimus_egg.functional import functionalize  # (it imports this module)
            from optimus_egg.to_fx import graph_module

            done = functionalize(gm, values, modules)
            if done is not None:
                graph, new_values, out_of_place = done
                gm = graph_module(gm, graph, class_name=type(gm).__name__)
                values.finish()
                values = shapes._Local(new_values)
                modules = _submodules(gm)
                mutated = [n for n in gm.graph.nodes if is_mutation(n, modules)]
        lowered = _lower(gm, inputs, values, modules, mutated, seed_groups, gemm_loops)
        lowered.out_of_place = out_of_place
    except ValueError:
        raise
    except Exception:
        values.finish()  # a misfit of the inputs is the error to report
        raise
    finally:
        values.stop()
    return lowered


def _lower(gm, inputs, values, modules, mutated, seed_groups: bool, gemm_loops: bool = False) -> Lowered:
    lw = _Lowerer(gm, values, modules, mutated)
    live = _live(gm.graph, lw.effect_set)
    # Effects are ordered as memory accesses: a write (a mutation, a draw, any call not known
    # pure) follows the previous write and every read since; a read follows the previous write
    # only, so reads between two writes stay independent (their ops can still batch).
    last_write, reads = None, []
    out_node = None
    for n in gm.graph.nodes:
        if n.op == "output":
            out_node = n
            continue
        if n.op == "call_function" and _name(n.target) in GLOBAL_STATE:  # even a dead one
            raise Unsupported(f"{n.name} ({_name(n.target)}) changes global state for the nodes after it")
        if n.op == "call_function" and _name(n.target) in _TRANSFORMS:
            raise Unsupported(f"{n.name} ({_name(n.target)}) opens or closes a functorch transform")
        if n not in live and n.op != "placeholder":
            continue  # dead: to_fx would drop it anyway, and in a batch it would get a gradient
        if n not in lw.effect_set:
            lw.lower(n, [])
            continue
        writes = is_mutation(n, lw.modules) or not (lw.is_pure(n) or _is_view(n) or _returns_input(n, lw.modules))
        deps = [e for e in ([last_write, *reads] if writes else [last_write]) if e is not None]
        lw.lower(n, deps)
        if n in lw.expr:
            if writes:
                last_write, reads = lw.expr[n], []
            else:
                reads.append(lw.expr[n])
    if out_node is None:
        raise Unsupported("graph has no output node")
    outs: list = []

    def sub(a):
        if isinstance(a, fx.Node):
            outs.append(lw.operand(a))
            return Slot(len(outs) - 1)
        return a

    output_args = fx.node.map_aggregate(out_node.args[0], sub)
    n_outputs = len(outs)
    # the last write (which keeps every write and every read before it) and the reads after it
    outs.extend(e for e in dict.fromkeys([last_write, *reads]) if e is not None)
    root = _app("outputs", _vec(outs))
    values.finish()  # every node ran: the inputs fit the graph
    lw.cost_table = graph_table(gm, inputs, gemm_loops)
    groups = lw.seed_groups() if seed_groups else {}
    register_text(lw.egraph, [*lw.facts, root], lw.lets, lw.uses)
    leaves: list = []
    fx.node.map_aggregate(out_node.args[0], leaves.append)
    contiguous = () if lw.symbols else tuple(isinstance(a, fx.Node) and shapes.contiguous(values.get(a))
                                             for a in leaves)
    return Lowered(lw.egraph, gm, lw.nodes, lw.templates, lw.leaves, root, output_args, n_outputs,
                   groups, lw.shapes, lw.cost_table, lw.symbols, lw.leaf_shapes, lw.grad_reach, lw.strided,
                   loop_break_even=loop_break_even([*inputs, *gm.parameters(), *gm.buffers()]),
                   contiguous_outputs=contiguous)
