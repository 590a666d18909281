"""Raising: an extraction of the e-graph -> a new FX GraphModule.

Owns building FX nodes and their meta. Every e-class is emitted once (memoized), so shared
values stay shared; placeholders keep their order; parameters and submodules of the input
module are kept; meta (val / example_value / stack_trace) is copied from the FX node an
e-class came from, and filled by fake propagation for new nodes.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.graph_module import (
    _copy_attr,  # the attribute copy fx.GraphModule's constructor makes
)

from optimus_egg import ops
from optimus_egg.extract.fusion_cost import node_kind
from optimus_egg.extract.graph import Graph
from optimus_egg.extract.greedy import Extraction
from optimus_egg.from_fx import PART, Lowered, Slot, _submodules
from optimus_egg.shapes import SYMBOLIC_MIN, has_symbolic_sizes

_META_KEYS = ("val", "example_value", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", PART)


@dataclass
class _PartialStack:
    """A stack of optional tensors where only some are present."""
    members: list


class _Raiser:
    """Builds the new graph. What does not depend on the extraction is built on construction
    (placeholders, every parameter's get_attr and graph_module's analysis of them), while the
    search runs when there is a worker; get_attrs the extraction leaves unread are erased
    after raising, and the analysis is redone if the graph's attribute reads then differ."""

    def __init__(self, lowered: Lowered):
        self.lw = lowered
        self.g: Graph | None = None
        self.choice: dict[str, str] = {}
        self.graph = fx.Graph()
        self.env: dict[str, object] = {}
        self.sizes: dict[int, fx.Node] = {}  # sentinel size -> the node computing it (symbol())
        self.by_size = {size: source for size, source in lowered.symbols.values()}
        self.leaf_nodes: dict[str, fx.Node] = {}
        self.new_nodes: list[fx.Node] = []
        self.unbinds: dict[fx.Node, int] = {}  # emitted unbind -> its piece count, where known
        self.splits: list[fx.Node] = []  # emitted splits with constant sizes
        for n in lowered.gm.graph.nodes:  # placeholders first, in order, even if unused
            if n.op == "placeholder":
                p = self.graph.placeholder(n.name, type_expr=n.type,
                                           default_value=n.args[0] if n.args else inspect.Signature.empty)
                p.meta = dict(n.meta)
                self.leaf_nodes[n.name] = p
        self.prebuilt = [self.leaf(name) for name in lowered.leaves if name not in self.leaf_nodes]
        self.prebuilt_targets = _attr_targets(self.graph)
        self.shared = _shareable(lowered.gm, self.graph)

    def value(self, cls: str):
        if cls in self.env:
            return self.env[cls]
        if cls not in self.g.classes:  # a primitive or a Vec
            v = self.g.values[cls]
            if isinstance(v, list):
                return [self.value(e) for e in v]
            return self.symbol(v) if type(v) is int and v >= SYMBOLIC_MIN else v
        stack = [cls]
        while stack:  # iterative post-order: deep graphs exceed Python's recursion limit
            c = stack[-1]
            if c in self.env:
                stack.pop()
                continue
            pending = [k for k in self.deps(c) if k not in self.env]
            if pending:
                stack.extend(reversed(pending))
                continue
            stack.pop()
            self.env[c] = self.emit(c)
        return self.env[cls]

    def symbol(self, size: int) -> fx.Node:
        """The value a sentinel size stands for (shapes.py, "Symbolic sizes"): its SymInt
        placeholder, or the size of the input tensor that holds it, or an expression of those;
        each computed once."""
        if size in self.sizes:
            return self.sizes[size]
        source = self.by_size.get(size)
        if source is None:
            raise RuntimeError(f"to_fx: size {size} was computed from a symbolic size; "
                               "only a symbolic size passed through as it is can be raised")
        if isinstance(source, str):
            node = self.leaf(source)
        elif isinstance(source, tuple):
            node = self.graph.create_node("call_function", torch.ops.aten.sym_size.int, (self.leaf(source[0]), source[1]))
        else:
            node = self.size_expr(source)
        self.sizes[size] = node
        return node

    def size_expr(self, expr):
        """FX nodes computing a sympy expression of ints and symbols by +, * and //."""
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return self.symbol(self.lw.symbols[str(expr)][0])
        op = operator.add if expr.is_Add else operator.mul if expr.is_Mul else operator.floordiv
        out, *rest = (self.size_expr(a) for a in expr.args)
        for a in rest:
            out = self.graph.create_node("call_function", op, (out, a))
        return out

    def deps(self, cls: str) -> list[str]:
        out = []
        for c in self.g.nodes[self.choice[cls]].children:
            if c in self.g.classes:
                out.append(c)
            elif isinstance(self.g.values.get(c), list):
                out.extend(e for e in self.g.values[c] if e in self.g.classes)
        return out

    def call(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, tuple(args), kwargs)
        self.new_nodes.append(node)
        return node

    def emit(self, cls: str):
        n = self.g.nodes[self.choice[cls]]
        a = [self.value(c) for c in n.children]
        op = n.op
        if op == "input":
            return self.leaf(a[0])
        if op == "none":
            return None
        if op in ("call", "call_multi"):
            node = self.template(a[0], a[1])
        elif op == "unary":
            node = self.template(a[0], [a[1]])
        elif op == "binary":
            node = self.template(a[0], [a[1], a[2]])
        elif op == "item":
            node = self.call(operator.getitem, a[0], a[1])
        elif op == "linear":
            node = self.call(F.linear, a[0], a[1], a[2])
        elif op == "layer_norm":
            node = self.call(F.layer_norm, a[0], list(a[1]), a[2], a[3], a[4])
        elif op == "cat":
            if all(x is None for x in a[0]):
                return None  # the biases of a group without any
            node = self.call(torch.cat, list(a[0]), a[1])
        elif op == "stack":
            if all(x is None for x in a[0]):
                return None
            if any(x is None for x in a[0]):
                return _PartialStack(a[0])  # biases of a mixed group: completed by batched_linear
            node = self.call(torch.stack, list(a[0]), a[1])
        elif op == "split":
            node = self.call(torch.split, a[0], list(a[1]), a[2])
            if all(type(k) is int for k in a[1]):
                self.splits.append(node)
        elif op == "movedim":
            node = self.call(torch.movedim, a[0], a[1], a[2])
        elif op == "flatten":
            node = self.call(torch.flatten, a[0], a[1], a[2])
        elif op == "unflatten":
            node = self.call(torch.unflatten, a[0], a[1], list(a[2]))
        elif op == "unbind":
            node = self.call(torch.unbind, a[0], a[1])
            shp = self.g.shapes.get(n.children[0])
            if shp is not None and type(a[1]) is int and -len(shp) <= a[1] < len(shp) and shp[a[1]] < SYMBOLIC_MIN:
                self.unbinds[node] = shp[a[1]]
        elif op == "reshape":
            node = self.call(torch.reshape, a[0], list(a[1]))
        elif op == "narrow":
            node = self.call(torch.narrow, a[0], a[1], a[2], a[3])
        elif op == "squeeze":
            node = self.call(torch.squeeze, a[0], a[1])
        elif op == "batched_linear":
            bias = self.call(ops.stack_bias, a[2].members, a[1]) if isinstance(a[2], _PartialStack) else a[2]
            node = self.call(ops.batched_linear, a[0], a[1], bias)
        elif op == "batched_layer_norm":
            node = self.call(ops.batched_layer_norm, a[0], list(a[1]), a[2], a[3], a[4])
        elif op == "outputs":
            return a[0]
        else:
            raise RuntimeError(f"to_fx: no lowering for e-graph op {op!r}")
        origin = self.g.origins.get(cls)
        if origin is not None:
            src = self.lw.nodes[origin]
            node.meta.update({k: src.meta[k] for k in _META_KEYS if k in src.meta})
        return node

    def leaf(self, name: str) -> fx.Node:
        if name in self.leaf_nodes:
            return self.leaf_nodes[name]
        src = self.lw.leaves[name]
        target = src.target if isinstance(src, fx.Node) else src
        # (create_node, not Graph.get_attr: its existence check walks the module path of
        # every target; these all name attributes of the input module)
        node = self.graph.create_node("get_attr", target)
        if isinstance(src, fx.Node):
            node.meta = dict(src.meta)
        self.leaf_nodes[name] = node
        return node

    def template(self, tid: int, operands: list):
        t = self.lw.templates[tid]
        real = operands[: len(operands) - t.n_deps]

        def fill(x):
            return real[x.k] if isinstance(x, Slot) else x

        if t.contiguous and isinstance(real[0], fx.Node):
            real = [self.graph.call_method("contiguous", (real[0],)), *real[1:]]
            self.new_nodes.append(real[0])
        args = fx.node.map_aggregate(t.args, fill)
        kwargs = fx.node.map_aggregate(t.kwargs, fill)
        node = self.graph.create_node(t.op, t.target, tuple(args), dict(kwargs))
        self.new_nodes.append(node)
        return node


def prepare(lowered: Lowered) -> _Raiser:
    """The extraction-independent part of raising `lowered`, for `to_fx(..., prepared=)`."""
    return _Raiser(lowered)


def to_fx(lowered: Lowered, g: Graph, ex: Extraction, example_inputs=None,
          prepared: _Raiser | None = None, classes: dict[fx.Node, str] | None = None) -> fx.GraphModule:
    """The GraphModule of extraction `ex`; `prepared` is `prepare(lowered)` if already built
    (the same module either way: every parameter read first, in the lowered graph's order).
    `classes`, if given, is filled with the e-class each emitted node computes."""
    r = prepared if prepared is not None else prepare(lowered)
    r.g, r.choice = g, ex.choice
    # The effect chain (kept alive at the root's end) first: Inductor draws the seeds of every
    # random op with one call at the first, and launches what is emitted before that call in
    # kernels of its own.
    root = g.nodes[ex.choice[g.root]]
    for c in g.values[root.children[0]][lowered.n_outputs:]:
        r.value(c)
    outs = r.value(g.root)
    output_args = fx.node.map_aggregate(lowered.output_args, lambda x: outs[x.k] if isinstance(x, Slot) else x)
    r.graph.output(output_args)
    modules = _submodules(lowered.gm)
    if not _biases_stacked.get():
        _bias_after_unbind(r.graph, modules, lowered.gm)
    selects = _select_sparse_pieces(r.graph, r.unbinds) | _narrow_splits(r.graph, r.splits, modules)
    if classes is not None:
        classes.update((selects.get(v, v), c) for c, v in r.env.items() if isinstance(v, fx.Node) and selects.get(v, v))
    for node in r.prebuilt:
        if not node.users:
            r.graph.erase_node(node)
    # Same placeholders and output structure, so the input's calling convention still holds
    # (torch.export modules flatten and unflatten pytrees around the graph).
    r.graph._codegen = copy.copy(lowered.gm.graph._codegen)
    _check_order(r.graph)
    shared = r.shared if _attr_targets(r.graph) == r.prebuilt_targets else None
    gm = graph_module(lowered.gm, r.graph, class_name=type(lowered.gm).__name__, shared=shared)
    dynamo_meta = any("example_value" in n.meta for n in lowered.gm.graph.nodes)
    # Traced graphs carry no meta to keep up. With symbolic sizes, propagating the example
    # inputs would give new nodes concrete sizes, and specialize the capture's own symbols
    # (measured: s0 became 32 in Dynamo's ShapeEnv); their new nodes are left without meta.
    if example_inputs is not None and dynamo_meta and not has_symbolic_sizes(lowered.gm):
        fill_meta(gm, example_inputs, uses_example_value=True)
    return gm


_biases_stacked = contextvars.ContextVar("optimus_egg_biases_stacked", default=False)


@contextlib.contextmanager
def biases_stacked():
    """Inside it, to_fx leaves every batch's biases stacked. The greedy ablation's steps run
    inside it: a later step lowers an earlier one's batch again, and a batch whose rows add
    their own biases no longer reads as one (illustrative's 96 row LayerNorms were left
    unbatched: 104 launches predicted instead of 14). The ablation adds them per row once, at
    its end (`add_biases_per_row`)."""
    token = _biases_stacked.set(True)
    try:
        yield
    finally:
        _biases_stacked.reset(token)


def add_biases_per_row(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` (a module to_fx made, changed in place) with its batches' biases added per row
    where to_fx would have (`_bias_after_unbind`)."""
    _bias_after_unbind(gm.graph, _submodules(gm), gm)
    gm.recompile()
    return gm


def _bias_after_unbind(graph: fx.Graph, modules: dict, root: torch.nn.Module) -> None:
    """A batched linear with a stack of biases whose output is only unbound on its member dim,
    every row read only by code Inductor generates, becomes a bmm whose rows each add their
    own bias. The rows' readers absorb the adds, where a baddbmm needs the biases stacked:
    Inductor's C++ backend never lowers a cat or stack as pointwise code, so that stack is a
    copy in a kernel of its own (the post-grad batch-linear pass adds biases per row too).
    Measured (1 s, inference / training launches, `as_backend_compiles`): interformer 47 -> 43
    / 111 -> 107; dhen's independent-set batch of its output projections 24 -> 22 in
    inference (from_fx.independent_groups); no other bench model has such a linear.
    Not where a bias is bfloat16 / float16 (or of a dtype not known): the bmm's result is
    rounded before the add rounds again, where the baddbmm rounds once (masknet's training
    step in bfloat16: gradients 1.4 x further from float64's than eager's; `root` holds the
    get_attr biases)."""
    for n in list(graph.nodes):
        if n.target is not ops.batched_linear or not isinstance(n.args[2], fx.Node):
            continue
        stack = n.args[2]
        if stack.target not in (torch.stack, ops.stack_bias) or not n.users:
            continue
        if any(u.target is not torch.unbind or u.args[1:] != (0,) or u.kwargs for u in n.users):
            continue
        rows = [v for u in n.users for v in u.users]
        if any(v.target is not operator.getitem or type(v.args[1]) is not int
               or any(w.op == "output" or node_kind(w, modules) != "compute" for w in v.users) for v in rows):
            continue
        biases = stack.args[0]
        if any(b is not None and _dtype(b, root) not in (torch.float32, torch.float64) for b in biases):
            continue
        n.args = (*n.args[:2], None)
        for v in rows:
            if biases[v.args[1]] is None:
                continue  # a member without a bias (ops.stack_bias fills in zeros)
            with graph.inserting_after(v):
                row = graph.call_function(torch.add, (v, biases[v.args[1]]))
            v.replace_all_uses_with(row, delete_user_cb=lambda w, row=row: w is not row)
        if not stack.users:
            graph.erase_node(stack)


def _dtype(node: fx.Node, root: torch.nn.Module) -> torch.dtype | None:
    """The dtype of `node`'s value: a get_attr's attribute of `root`, else its meta value's."""
    if node.op == "get_attr":
        try:
            value = operator.attrgetter(node.target)(root)
        except AttributeError:
            return None
    else:
        value = node.meta.get("val", node.meta.get("example_value"))
    return getattr(value, "dtype", None)


def _select_sparse_pieces(graph: fx.Graph, unbinds: dict[fx.Node, int]) -> dict[fx.Node, fx.Node | None]:
    """An unbind of which only some pieces are read becomes a select per piece read: from_fx
    lowers `x[0]` as item 0 of unbind(x, 0), and an unbind of a long dim would make a view
    per row on every call (and a select per row for Inductor to lower). Returns the getitems
    replaced, each mapped to its select, and the unbinds erased, mapped to None."""
    replaced: dict[fx.Node, fx.Node | None] = {}
    for u, size in unbinds.items():
        read = _pieces_read(u, size)
        if read is not None and len(read) < size:
            x, d = u.args
            _replace_pieces(graph, u, size, torch.select, lambda i, x=x, d=d: (x, d, i), replaced)
    return replaced


def _narrow_splits(graph: fx.Graph, splits: list[fx.Node], modules: dict) -> dict[fx.Node, fx.Node | None]:
    """A split of a tensor that Inductor computes in generated code (not a graph input, a
    parameter or an extern call's result, looking through views) becomes a narrow per piece
    read, and so does a split of which only some pieces are read (as unbinds become selects,
    above). Inductor decides whether to compute a tensor once into a buffer or again inside
    each reader by counting the readers of its FX node, and a split is one reader however many
    pieces are read: measured on programs of `bench/differential.py --all`, a dropout reading a
    split piece (seeds 15 and 16: 3 -> 2 launches) and a tanh whose pieces feed extern mm calls
    (seed 15: 10 -> 9), and interformer's training graph (113 -> 111). Returns the getitems
    replaced, each mapped to its narrow, and the splits erased (None)."""
    replaced: dict[fx.Node, fx.Node | None] = {}
    for s in splits:
        x, sizes, d = s.args
        read = _pieces_read(s, len(sizes))
        if read is not None and (len(read) < len(sizes) or _computed(x, modules)):
            _replace_pieces(graph, s, len(sizes), torch.narrow,
                            lambda i, x=x, d=d, k=sizes: (x, d, sum(k[:i]), k[i]), replaced)
    return replaced


def _pieces_read(t: fx.Node, count: int) -> set[int] | None:
    """The pieces of tuple-valued `t` that are read, if its every user takes one by an int."""
    users = list(t.users)
    if not all(v.target is operator.getitem and type(v.args[1]) is int for v in users):
        return None
    return {v.args[1] % count for v in users}


def _replace_pieces(graph: fx.Graph, t: fx.Node, count: int, target, args_of, replaced: dict) -> None:
    """Each getitem of `t` becomes `target(*args_of(i))` for its piece i; `t` is erased."""
    for v in list(t.users):
        with graph.inserting_before(v):
            piece = graph.call_function(target, args_of(v.args[1] % count))
        piece.meta = v.meta
        v.replace_all_uses_with(piece)
        graph.erase_node(v)
        replaced[v] = piece
    graph.erase_node(t)
    replaced[t] = None


def _computed(x: fx.Node, modules: dict) -> bool:
    """Is x, looking through views, computed by code Inductor generates?"""
    while (kind := node_kind(x, modules)) == "view" and x.all_input_nodes:
        x = x.all_input_nodes[0]
    return kind == "compute"


def _attr_targets(graph: fx.Graph) -> list[str]:
    """What graph_module's analysis reads of a graph: its get_attr and call_module targets, in order."""
    return [n.target for n in graph.nodes if n.op in ("get_attr", "call_module")]


def _check_order(graph: fx.Graph) -> None:
    """What of Graph.lint can go wrong here: a value used before it is defined. (Node ownership
    and names hold by construction; targets are checked when the GraphModule copies them.)"""
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        for a in node.all_input_nodes:
            if a not in seen:
                raise RuntimeError(f"to_fx: {node.name} uses {a.name} before it is defined")
        seen.add(node)


try:
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModule
except ImportError:  # a torch without lazy graph modules
    _GraphModule = fx.GraphModule

# Methods through which a module's parameters, buffers and state dict are read or written:
# a subtree whose modules override none of them can be shared as it is (see graph_module).
_STATE_METHODS = ("_save_to_state_dict", "_load_from_state_dict", "state_dict", "load_state_dict",
                  "get_extra_state", "set_extra_state", "named_parameters", "parameters", "named_buffers",
                  "buffers", "named_modules", "modules", "named_children", "children", "_named_members")
_LEAF = object()  # a target the standard copy installs whole (a called module) or as a plain attribute


def graph_module(root: torch.nn.Module, graph: fx.Graph, class_name: str,
                 shared: set[str] | None = None) -> fx.GraphModule:
    """fx.GraphModule(root, graph, class_name), minus the cost of rebuilding root's hierarchy.

    The constructor copies each get_attr / call_module target of `graph` from `root` into a
    fresh tree of empty Modules (for a 10,000-node graph, ~8,000 Modules made and ~12,000
    attributes set, one at a time). Here, a subtree of `root` all of whose parameters and
    buffers the graph reads is installed as it is, when that gives the same parameters(),
    buffers() and state_dict() (names, order and tensors) as the copy would: every parameter
    and buffer in the subtree is read, in the order the copy would register them; its buffers
    are persistent; and no module in it has state dict hooks or overrides how its state is
    listed or saved. The difference left: the subtree's modules keep their types, training
    flags and any parameter-less submodules (which hold no parameters, buffers or state).
    Everything else is copied as the constructor does.

    The module is lazy (torch's _LazyGraphModule, as Dynamo's): its Python code is generated
    on first call or first read of `.code`, not here (~0.5 s on a 10,000-node graph, which
    Inductor never needs). `shared`: `_shareable(root, graph)`, if already known.
    """
    targets = _attr_targets(graph)
    if shared is None:
        shared = _shareable(root, graph)
    if not shared:
        return _GraphModule(root, graph, class_name=class_name)
    gm = _GraphModule(root, fx.Graph(), class_name=class_name)  # attributes installed below
    installed: set[str] = set()
    for t in targets:
        atoms = t.split(".")
        prefix = next((".".join(atoms[:i]) for i in range(1, len(atoms)) if ".".join(atoms[:i]) in shared), None)
        if prefix is None:
            _copy_attr(root, gm, t)
        elif prefix not in installed:
            installed.add(prefix)
            _copy_attr(root, gm, prefix)
    gm.graph = graph  # (re)compiles forward, as the constructor does
    return gm


def _shareable(root: torch.nn.Module, graph: fx.Graph) -> set[str]:
    """The outermost module paths graph_module may install from `root` unchanged."""
    # The tree the constructor would build: per module path, its parameters, buffers and
    # children in the order they would be registered (first use in the graph).
    tree: dict[str, dict] = {"": {"params": {}, "buffers": {}, "children": {}, "leaf": False, "mod": root}}

    def entry(path: str) -> dict:
        e = tree.get(path)
        if e is None:
            parent_path, _, atom = path.rpartition(".")
            parent = entry(parent_path)
            mod = parent["mod"]._modules.get(atom) if parent["mod"] is not None else None
            # not a registered submodule: leave the path to the constructor
            e = tree[path] = {"params": {}, "buffers": {}, "children": {}, "leaf": mod is None, "mod": mod}
            parent["children"][atom] = None
        return e

    for node in graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        path, _, field = node.target.rpartition(".")
        e = entry(path)
        mod = e["mod"]
        if mod is None:
            continue
        if node.op == "get_attr" and mod._parameters.get(field) is not None:
            e["params"].setdefault(field, None)
        elif node.op == "get_attr" and mod._buffers.get(field) is not None:
            e["buffers"].setdefault(field, None)
        else:  # a called module, a plain attribute: copied as the constructor does
            e["leaf"] = True
    shared: set[str] = set()
    stateful: dict[int, bool] = {}

    def visit(path: str, mod: torch.nn.Module) -> None:
        entry = tree[path]
        for atom in entry["children"]:
            child = f"{path}.{atom}" if path else atom
            sub = mod._modules.get(atom)
            if sub is None:
                continue
            if _same_state(child, sub, tree, stateful):
                shared.add(child)
            else:
                visit(child, sub)

    visit("", root)
    entry = visit = None  # recursive closures are reference cycles that would keep `tree` alive
    return shared


def _same_state(path: str, mod: torch.nn.Module, tree: dict, stateful: dict[int, bool]) -> bool:
    """Whether installing `mod` at `path` lists the state the constructor's copy would.
    `stateful`: a memo of _has_state by module id."""
    seen: set[int] = set()
    todo = [(path, mod)]
    while todo:
        p, m = todo.pop()
        if id(m) in seen:
            return False  # a module at two paths: leave the bookkeeping to the copy
        seen.add(id(m))
        if (m._state_dict_hooks or m._state_dict_pre_hooks or m._load_state_dict_pre_hooks
                or m._load_state_dict_post_hooks or m._non_persistent_buffers_set):
            return False
        if not _plain_state(type(m)):
            return False
        entry = tree.get(p)
        params = [k for k, v in m._parameters.items() if v is not None]
        buffers = [k for k, v in m._buffers.items() if v is not None]
        children = [k for k, c in m._modules.items() if c is not None and _has_state(c, stateful)]
        if entry is None:
            if params or buffers or children:
                return False  # state the graph does not read
        elif (entry["leaf"] or list(entry["params"]) != params or list(entry["buffers"]) != buffers
              or list(entry["children"]) != children):
            return False
        todo.extend((f"{p}.{k}", c) for k, c in m._modules.items() if c is not None)
    return True


@functools.cache
def _plain_state(cls: type) -> bool:
    """`cls` lists and saves its state as nn.Module does."""
    return all(getattr(cls, k) is getattr(torch.nn.Module, k) for k in _STATE_METHODS)


def _has_state(m: torch.nn.Module, memo: dict[int, bool]) -> bool:
    """Whether `m` or a module under it holds a parameter or buffer."""
    got = memo.get(id(m))
    if got is None:
        got = memo[id(m)] = (any(v is not None for v in m._parameters.values())
                             or any(v is not None for v in m._buffers.values())
                             or any(c is not None and _has_state(c, memo) for c in m._modules.values()))
    return got


def fill_meta(gm: fx.GraphModule, example_inputs, uses_example_value: bool) -> None:
    """Give every new node a fake `val` (and `example_value` for Dynamo graphs)."""
    missing = [n for n in gm.graph.nodes if n.op not in ("output",) and "val" not in n.meta]
    if not missing:
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:  # (example inputs may be another mode's fakes: a part of the graph, parts.py)
        fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        with mode, torch._guards.tracing(None):  # (see shapes._run)
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    except Exception:  # meta is a courtesy for later passes; values never depend on it
        return
    for n in gm.graph.nodes:
        if uses_example_value and "val" in n.meta and "example_value" not in n.meta:
            n.meta["example_value"] = n.meta["val"]
