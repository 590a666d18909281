"""Cost = kernels Inductor (C++ on CPU) launches for a whole FX graph, with its fusion.

The per-node table in launch_cost.py drives extraction; this estimate looks at neighbours,
which a per-node cost cannot, and is what the bench reports as the cost model's predicted
launches. Observed in Inductor's generated code (torch 2.13, CPU; `bench/calibrate.py`):

- an extern GEMM (mm / addmm / bmm / baddbmm, a linear) or an ATen fallback launches once
  (on CPU every scan, cumsum and its kind, is one);
- elementwise ops, reductions and copies connected producer -> consumer (through views), or
  reading one value (an input, an extern call's result, one view of either), fuse into one
  kernel, up to a GEMM, unless a path between the two passes through an extern call (on
  CPU all code between two calls is one kernel anyway: below);
- a cat or stack of computed tensors is free: each producer writes into its slice (a view
  of one, or an input, is copied: the cat is then a kernel of its own); on CPU so is a 2-D
  GEMM's result (linear, mm), not a bmm's (`_gemm_into_slice`), nor one the graph returns
  or another cat took first (`_returned`), nor one stacked along a new last dim, whose slice
  is no run of rows (`_slices_have_rows`);
- a reshape, flatten or contiguous that the strides of a permuted operand allow no view of
  is a copy, computed like an elementwise op (`_layout_copy`); on CPU an index_select or
  gather is code too, not a call;
- a dropout that draws (F.dropout's `training` defaults to True) computes like an elementwise
  op, and any random op adds one fallback call that draws the graph's seeds; one that draws
  nothing (eval, p = 0) is a clone: dropped where it keeps its operand's strides, a copy
  where it packs a narrow of columns (`_clone_copies`);
- a linear of a non-contiguous 3-D or wider operand (a permute or a narrow before it) calls
  matmul, its bias added after, copying the operand first where no view flattens it to rows
  (`_gemm_of_strided`);
- given shapes, a GEMM that Inductor's CPU decompositions compute as elementwise code (a
  one-row linear with K, N <= 16, a dot product, a small outer product, a batched
  matrix-vector product: launch_cost.py) computes like an elementwise op;
- given shapes, on CPU, `mm(a, b) + t` (a 2-D matmul or bias-less linear whose one reader is
  the add) is one addmm(t, a, b) (Inductor's post-grad pattern; of `mm1 + mm2` the second):
  code where a has one row and b is at most 16 x 16, else a call that the add is part of;
  `m + m` of such an mm folds too, as addmm(m, a, b), the product again beside the mm;
- an in-place write is code; a read after it of anything that may alias what it wrote into
  waits on it (Inductor reads the written buffer), and a write nothing reads afterwards into
  a tensor the graph made (no input or parameter) is dead, as is what only it reads (`_live`).

On CPU (`launch_cost.CPU_TABLES`: "cpu", and "cpu_loops" for a compile with small GEMMs as
loops) the kernels are then counted as Inductor's C++ backend writes them with the backend's
kernel order (src/optimus_egg/kernel_order.py): everything scheduled between two calls goes
into one kernel, fused or not, and the order gives the fewest such runs of code, so the
kernels are the fewest runs of code between calls over the graph's computed nodes
(`_cpu_kernels`). For other targets (`table="cuda"`) each fused group is a kernel; copies of
inputs and parameters that feed only GEMMs are one.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection

import torch
import torch.fx as fx
from optimus_egg.extract.launch_cost import (CPU_TABLES, GEMM_TARGETS, REDUCTION_TARGETS, VIEW_TARGETS,
                                             elementwise_batched_linear, elementwise_linear, elementwise_matmul,
                                             gemm_macs, linear_macs, loop_work)
from optimus_egg.gemm_loops import MAX_MACS
from optimus_egg.from_fx import _side_writes, draws_random, is_mutation, written_aliases
from optimus_egg.kernel_order import CALL, CODE, FREE, latest_phases

EXTERN = GEMM_TARGETS | {"batched_linear", "embedding_bag", "_embedding_bag", "index_select", "gather",
                         "scatter_add", "sort", "topk", "nonzero",
                         "_embedding_bag_backward"}  # (an ATen fallback in a backward graph: dlrm's)
COPIES = {"cat", "concat", "stack"}
INDEXING = {"index_select", "gather"}  # loads through an index: code of Inductor's own on CPU
MAX_FUSION = 64  # Inductor's config.max_fusion_size: nodes per fused kernel
# (slice, _unsafe_view and alias: ATen's views, in a post-grad graph)
_FREE_TARGETS = VIEW_TARGETS | {"getattr", "size", "dim", "sym_size", "slice", "_unsafe_view", "alias"}


def _target_name(n: fx.Node, modules: dict) -> str:
    t = n.target
    if n.op == "call_module":
        return type(modules[t]).__name__.lower()
    if isinstance(t, str):
        return t
    name = getattr(t, "__name__", str(t))
    return name.split(".")[0].removeprefix("optimus_egg_ops_")


_MODULE_EXTERN = {"linear", "embeddingbag", "embedding", "conv1d", "conv2d"}
# Scans: Inductor generates them only where the backend has the SCAN feature (Triton); its C++
# backend calls ATen's (torch/_inductor/ir.py Scan.create returns None, lowering.py falls back).
SCANS = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"}


Shape = tuple[int, ...]


def meta_shape(n: fx.Node) -> Shape | None:
    """A node's shape from its `meta["val"]` (an ATen graph's fake tensor), for `fused_launches`'
    `shape_of`: None where it has none or a dim is symbolic (a GEMM is then priced as a call)."""
    v = n.meta.get("val")
    ok = isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape)
    return tuple(v.shape) if ok else None


def fused_launches(gm: fx.GraphModule | fx.Graph, shape_of: Callable[[fx.Node], Shape | None] | None = None,
                   table: str = "cpu", strided_of: Callable[[fx.Node], bool] | None = None,
                   leaves: Collection[fx.Node] = ()) -> int:
    """Predicted Inductor kernel launches of `gm` (extern calls + fused kernels). With
    `shape_of` (a node's tensor shape, None where unknown), GEMMs that the target (`table`,
    launch_cost.py) computes as elementwise code fuse like elementwise ops; `strided_of` (is a
    node's value read with non-contiguous rows: shapes.rows_strided; default never) tells the
    GEMMs whose loops would not vectorize, which stay calls. `leaves`: nodes computed outside
    the compiled graph (hoist.py's parameter copies), inputs to it. A bare fx.Graph (an ATen
    graph: a post-grad pass's) has no modules."""
    kind: dict[fx.Node, str] = {}   # leaf | view | extern | compute
    leafy: dict[fx.Node, bool] = {}  # computed from graph inputs / parameters only
    graph = gm if isinstance(gm, fx.Graph) else gm.graph
    modules = {} if isinstance(gm, fx.Graph) else dict(gm.named_modules(remove_duplicate=False))
    random = False  # a random op: Inductor draws the graph's seeds in one fallback call
    written = _writes(graph, modules)
    live = _live(graph, modules, written)
    for n in graph.nodes:
        if n not in live:
            continue  # dead code: Inductor removes it
        if n.op in ("placeholder", "get_attr") or n in leaves:
            kind[n], leafy[n] = "leaf", True
            continue
        if n.op == "output":
            continue
        ins = [a for a in n.all_input_nodes if a in kind]
        kind[n] = node_kind(n, modules, shape_of, table, strided_of)
        random = random or draws_random(n, modules)
        leafy[n] = all(leafy.get(a, False) for a in ins) and kind[n] != "extern"

    for n in _returned(graph, kind):  # a dropout that returns its input, returned: Inductor
        if kind.get(n) == "view" and _target_name(n, modules) == "dropout":  # returns a copy (its
            kind[n], leafy[n] = "compute", False  # decomposition's clone)
    cpu = table in CPU_TABLES
    if cpu and shape_of is not None:  # `mm(a, b) + t` is one call, addmm(t, a, b): the add is
        # the call, the mm a view of its operands (`_folded_add`)
        for n in [n for n, k in kind.items() if k == "extern"]:
            add = _folded_add(n, modules, shape_of)
            if add is not None and add in kind:
                kind[n], kind[add], leafy[add] = "view", "extern", False
            elif (add := _added_to_itself(n, modules, shape_of, table)) is not None and add in kind:
                kind[add], leafy[add] = "extern", False  # addmm(m, a, b): the product again
    parent: dict[fx.Node, fx.Node] = {}

    def find(x):
        while parent.get(x, x) is not x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra is not rb:
            parent[ra] = rb

    def sources(n: fx.Node) -> list[fx.Node]:
        """Compute nodes feeding n, looking through views."""
        out, todo, seen = [], list(n.all_input_nodes), set()
        while todo:
            a = todo.pop()
            if a in seen or a not in kind:
                continue
            seen.add(a)
            if kind[a] == "view" or a in free_cat:
                todo.extend(a.all_input_nodes)
            elif kind[a] == "compute":
                out.append(a)
        return out

    externs = sum(1 for k in kind.values() if k == "extern")
    if cpu:
        return externs + _cpu_kernels(graph, modules, live, kind, shape_of, written) + random
    compute = [n for n in graph.nodes if kind.get(n) == "compute"]
    free_cat = set()
    for n in compute:
        if _target_name(n, modules) in COPIES and not leafy[n] and all(
                kind.get(a) in ("compute", "extern") for a in n.all_input_nodes):
            free_cat.add(n)  # producers write straight into the output buffer
    through_extern = _extern_paths(graph, kind)
    readers: dict[fx.Node, list[fx.Node]] = {}  # a view, input or extern result -> compute nodes reading it
    for n in compute:
        if n in free_cat:
            continue
        for a in sources(n):
            if a not in free_cat and (not leafy[a] or not leafy[n]) and not through_extern(a, n):
                union(a, n)
        for a in n.all_input_nodes:
            if kind.get(a) in ("view", "leaf", "extern"):
                readers.setdefault(a, []).append(n)
    for ns in readers.values():  # siblings sharing a read
        for b in ns[1:]:
            if not through_extern(ns[0], b) and not through_extern(b, ns[0]):
                union(ns[0], b)
    computed = {find(n) for n in compute if n not in free_cat and not leafy[n]}  # groups with computed inputs
    sizes: dict[fx.Node, int] = {}   # fused group -> its nodes
    lonely_copies = 0                # copies of inputs / parameters feeding only GEMMs
    for n in compute:
        if n in free_cat:
            continue
        root = find(n)
        if root not in computed:
            lonely_copies += 1
        else:
            sizes[root] = sizes.get(root, 0) + 1
    kernels = sum(math.ceil(s / MAX_FUSION) for s in sizes.values())
    return externs + kernels + math.ceil(lonely_copies / MAX_FUSION) + random


def _writes(graph: fx.Graph, modules: dict) -> dict[fx.Node, set[fx.Node]]:
    """Each in-place write -> what may alias what it writes into (`from_fx.written_aliases`)."""
    return {n: written_aliases(graph, modules, [n]) for n in graph.nodes if is_mutation(n, modules)}


def _live(graph: fx.Graph, modules: dict, written: dict[fx.Node, set[fx.Node]] | None = None) -> set[fx.Node]:
    """Nodes whose values or writes reach the output (the rest is dead code). A write is dead
    where nothing reads what it writes into afterwards and that is no graph input or parameter
    (a clone written in place and then left: Inductor drops the write and what computed the
    clone); a random one, or one updating a module's state, is kept."""
    live: set[fx.Node] = set()
    written = _writes(graph, modules) if written is None else written

    def write_read(n: fx.Node) -> bool:
        if draws_random(n, modules) or _side_writes(n, modules) is not None:
            return True
        return any(a.op in ("placeholder", "get_attr") or any(u in live for u in a.users)  # (live: nodes after n)
                   for a in written[n])

    for n in reversed(graph.nodes):
        if n.op in ("output", "placeholder") or any(u in live for u in n.users) or (n in written and write_read(n)):
            live.add(n)
    return live


def _cpu_kernels(graph: fx.Graph, modules: dict, live: set[fx.Node], kind: dict,
                 shape_of: Callable[[fx.Node], Shape | None] | None, written: dict[fx.Node, set[fx.Node]]) -> int:
    """C++ kernels as the optimus_egg backend compiles a graph: Inductor's C++ backend writes
    everything it schedules between two calls (an extern kernel, an ATen fallback) into one
    kernel, fused or not, and the backend's kernel order (kernel_order.py) schedules the code
    in the fewest such runs. So the kernels are the fewest runs of code between calls that an
    order of the graph's computed nodes allows. A cat or stack is no code of its own: each
    operand gets into its slice apart, written there by its producer (a computed value, a 2-D
    GEMM's result: `_gemm_into_slice`, unless it is returned or already written into another
    cat: `_returned`) or copied by code that waits on that operand alone (a view, an input,
    another call's result). A random op waits on the seed draw, a call; a read, on the writes
    before it into anything it may alias (`written`: `_writes`). A run
    whose kernel would take more than MAX_KERNEL_ARGS buffers is cut (`_split_by_args`)."""
    kinds, deps = [CALL], [set()]  # item 0: the seed draw
    index: dict[fx.Node, int] = {}
    under: dict[fx.Node, set[int]] = {}  # a view -> the items it reads

    def feeds(a: fx.Node) -> set[int]:
        """The items a value stands for: itself, or what a view of it reads."""
        return {index[a]} if a in index else under.get(a, set())

    writes: list[tuple[int, set[fx.Node]]] = []  # the writes so far: (item, what may alias what it writes into)

    def reads(a: fx.Node) -> set[int]:
        """The items reading `a` here waits on: what it stands for, and the writes so far into
        anything it may alias (Inductor reads the written buffer: `written_aliases`)."""
        return feeds(a) | {i for i, aliases in writes if a in aliases}

    def item(k: str, d: set[int]) -> int:
        kinds.append(k)
        deps.append(d)
        return len(kinds) - 1

    fixed = _returned(graph, kind)  # GEMM results with a layout of their own: a cat copies them
    for n in graph.nodes:  # inputs first
        k = kind.get(n)
        if k == "view":
            under[n] = set().union(*map(feeds, n.all_input_nodes))
        if n not in live or k not in ("compute", "extern"):
            continue
        if k == "compute" and _target_name(n, modules) in COPIES:
            d = set()
            operands: list[fx.Node] = []  # with repeats: a GEMM's result is written into one slice of `stack([m, m])`
            fx.node.map_arg((n.args, n.kwargs), operands.append)
            rows = _slices_have_rows(n, modules)
            for a in operands:
                a = _passed_through(a, kind, modules)
                into = rows and kind.get(a) == "extern" and a not in fixed and _gemm_into_slice(a, modules, shape_of)
                if into:
                    fixed.add(a)  # written into this slice: the next cat of it copies it
                if kind.get(a) == "compute" or into:
                    d |= reads(a)
                else:
                    d.add(item(CODE, reads(a)))  # a copy into the slice
            k, d = FREE, d
        else:
            k, d = (CALL if k == "extern" else CODE), set().union(*map(reads, n.all_input_nodes))
            copied, add = _gemm_of_strided(n, modules, shape_of) if k == CALL and shape_of else (None, False)
            if copied is not None:
                d.add(item(CODE, reads(copied)))  # the copy of its operand, code waiting on that operand alone
            if add:  # the call, then the bias add: code reading its result, which n's readers wait on
                k, d = CODE, {item(CALL, d)}
        index[n] = item(k, d | ({0} if draws_random(n, modules) else set()))
        if n in written:
            writes.append((index[n], written[n]))
    phase = latest_phases(kinds, deps)
    runs: dict[int, list[fx.Node]] = {}  # code phase -> its computed nodes, in graph order
    for n, i in index.items():
        if kinds[i] == CODE:
            runs.setdefault(phase[i], []).append(n)
    copies = {phase[i] for i, k in enumerate(kinds) if k == CODE} - set(runs)  # runs of slice copies only
    return len(copies) + sum(_split_by_args(nodes, kind, modules) for nodes in runs.values())


# Inductor's C++ backend ends a kernel once its arguments (buffers read and written) pass this
# (`CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM`, a ctypes limit on arguments); the next node starts
# another kernel in the same run of code.
MAX_KERNEL_ARGS = 500
# Computed values Inductor keeps in a buffer of their own even when read only in the kernel:
# reductions, and GEMMs written as code (a sum over K). Counted against the compiled code of
# illustrative (2 kernels of 508 and 203 arguments) and illustrative_1k (5 kernels).
_NORMS = {"layer_norm", "layernorm", "native_layer_norm"}
_REALIZED = REDUCTION_TARGETS | GEMM_TARGETS | _NORMS


def _split_by_args(nodes: list[fx.Node], kind: dict, modules: dict) -> int:
    """Kernels of one run of code, `nodes` in order: a kernel's arguments are the buffers its
    nodes read from outside it (inputs, parameters, a module's too, calls' results, earlier
    kernels' values, through views) and the values it computes that are read outside the run
    or are kept in buffers anyway (`_REALIZED`)."""
    run = set(nodes)
    kernels, args, current = 1, set(), set()
    for n in nodes:
        todo, seen = list(n.all_input_nodes), set()
        while todo:
            a = todo.pop()
            if a in seen:
                continue
            seen.add(a)
            if kind.get(a) == "view":
                todo.extend(a.all_input_nodes)
            elif a not in current:
                args.add(a)
        if n.op == "call_module":  # its parameters and buffers
            args.update((n.target, k) for k, _ in modules[n.target].named_parameters())
            args.update((n.target, k) for k, _ in modules[n.target].named_buffers())
        current.add(n)
        name = _target_name(n, modules)
        if any(u not in run for u in n.users) or name in _REALIZED:
            args.add(n)
        if name in _NORMS:
            args.add((n, "stats"))  # a norm keeps two: its mean and its variance
        if len(args) > MAX_KERNEL_ARGS:
            kernels, args, current = kernels + 1, set(), set()
    return kernels


def _returned(graph: fx.Graph, kind: dict) -> set[fx.Node]:
    """The graph's outputs and what they view: Inductor fixes an output's layout as it lowers
    it (eager's strides), before any cat reading it, so a cat copies such a GEMM's result
    rather than have the GEMM write into its slice (observed, torch 2.13: a linear returned
    beside a stack of it, or returned through a view)."""
    out: set[fx.Node] = set()
    todo = [a for n in graph.nodes if n.op == "output" for a in n.all_input_nodes]
    while todo:
        a = todo.pop()
        if a not in out:
            out.add(a)
            if kind.get(a) == "view":
                todo.extend(a.all_input_nodes)
    return out


def _passed_through(a: fx.Node, kind: dict, modules: dict) -> fx.Node:
    """The value an eval (or p = 0) dropout `a` returns, its input (through a chain of them), or
    `a` itself: Inductor writes a GEMM read through one straight into a cat's slice too
    (bench/differential.py --seed 54: a linear's result through `F.dropout(p=0)`)."""
    while kind.get(a) == "view" and _target_name(a, modules) == "dropout" and a.args \
            and isinstance(a.args[0], fx.Node):
        a = a.args[0]
    return a


def _gemm_into_slice(a: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None] | None) -> bool:
    """Does Inductor's C++ backend write the extern GEMM `a` straight into its slice of a cat's
    buffer? Observed (torch 2.13): a 2-D GEMM's (linear, mm, addmm) 2-D result, yes; a bmm's,
    or a linear's of a 3-D input (a view of the GEMM's result), no: the cat copies it, a kernel
    (interformer's cat of two attention products before its mix projection)."""
    name = _target_name(a, modules)
    shape = shape_of(a) if shape_of is not None else None
    if shape is not None:  # a linear of a 3-D input is a view of a 2-D GEMM's result: copied
        return name in ("linear", "mm", "addmm", "matmul") and len(shape) == 2
    return name in ("linear", "mm", "addmm")


def _slices_have_rows(n: fx.Node, modules: dict) -> bool:
    """Are the slices of cat or stack `n`'s buffer that its 2-D operands fill made of rows (a
    unit stride along their last dim), so that a GEMM can write its result there? Not a stack
    along a new last dim (dim 2 or -1 of 2-D operands): Inductor copies each GEMM's result into
    it, code between the GEMM and any reader (observed, torch 2.13:
    `bench/differential.py --seed 60`, three matmuls stacked at dim 2 before linears of the
    pieces)."""
    if _target_name(n, modules) != "stack":
        return True
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    return not isinstance(dim, int) or dim % 3 != 2


def node_kind(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None] | None = None,
              table: str = "cpu", strided_of: Callable[[fx.Node], bool] | None = None) -> str:
    """How Inductor computes a node: "leaf" (a graph input or parameter), "view", "extern" (a
    call of its own) or "compute" (code it generates and fuses)."""
    if n.op in ("placeholder", "get_attr"):
        return "leaf"
    name = _target_name(n, modules)
    if draws_random(n, modules):
        return "compute"
    if name in _FREE_TARGETS or name in ("getitem", "dropout", "keep_grads"):  # (ops.keep_grads returns its input)
        copies = shape_of is not None and ((name in MAY_COPY and _layout_copy(n, modules, shape_of))
                                           or (name == "dropout" and _clone_copies(n, modules, shape_of)))
        return "compute" if copies else "view"
    if table in CPU_TABLES and name in INDEXING:
        return "compute"
    if (name in EXTERN or name in _MODULE_EXTERN or "batched_linear" in name
            or (table in CPU_TABLES and name in SCANS)) and not (
            shape_of is not None and _elementwise_gemm(n, name, modules, shape_of, table, strided_of)):
        return "extern"
    return "compute"


MAY_COPY = {"reshape", "flatten", "contiguous", "reshape_as"}  # a view where the strides allow, else a copy
_REORDERS = {"permute", "transpose", "t", "movedim", "swapaxes", "swapdims", "expand", "expand_as"}
_CHAIN = _FREE_TARGETS | {"getitem", "dropout"}  # what a view chain passes through (an eval dropout returns its input)


def _layout_copy(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None]) -> bool:
    """Does this reshape (flatten, contiguous) copy? It does where its operand's strides, from
    a permute or transpose before it (for `contiguous`, any view: a narrow too), allow no
    view: eagerly (so in the graph Inductor compiles) it is a clone, which Inductor computes
    as elementwise code (interformer's heads, `movedim` then `flatten`, before their output
    projection)."""
    chain = _view_chain(n, modules)
    if chain is None or (_target_name(n, modules) != "contiguous"
                         and not any(_target_name(c, modules) in _REORDERS for c in chain[1:-1])):
        return False
    values = _replayed(chain, modules, shape_of)
    out = values.get(n)  # (chain[1], n's operand, exists: it holds the reorder)
    return isinstance(out, torch.Tensor) and out is not values[chain[1]] and not out._is_view()


def _clone_copies(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None]) -> bool:
    """Does this dropout that returns its input (eval, or p = 0) copy? Inductor computes it as
    a clone of its operand, which it drops where the clone keeps the operand's strides (a
    contiguous or merely permuted one) and otherwise computes as a copy, elementwise code: a
    narrow of a wider tensor's columns, which a clone packs (observed, torch 2.13:
    `bench/differential.py --seed 62`, eval dropouts of `chunk(x, 5, dim=1)`'s pieces before
    their linears, each piece copied by a kernel of its own)."""
    chain = _view_chain(n, modules)
    if chain is None or len(chain) < 3:  # the operand is a computed value, taken as contiguous
        return False
    values = _replayed(chain, modules, shape_of)
    v, out = values.get(chain[1]), values.get(n)
    return isinstance(v, torch.Tensor) and isinstance(out, torch.Tensor) and out.stride() != v.stride()


def _gemm_of_strided(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None]
                     ) -> tuple[fx.Node | None, bool]:
    """(the operand copied before the call, a bias add after it) for a linear (or a matmul by
    a matrix) of a 3-D or wider operand that is not contiguous (a permute, a transpose or a
    narrow in the views before it; computed values and graph inputs are taken as contiguous). ATen's
    linear flattens only a contiguous operand into one addmm; otherwise it calls matmul and
    adds the bias after, code reading the call's result. matmul flattens the operand to rows
    where the weight requires a gradient, copying it where no view can (a clone, code waiting
    on the operand: wukong's first projection of its transposed input), and otherwise calls
    one bmm of it (`should_fold` in ATen's LinearAlgebra.cpp). A parameter's requires_grad is
    read through views; a graph input's or a computed weight's is taken for False."""
    name = _target_name(n, modules)
    x = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    if name not in ("linear", "matmul") or x is None or x.op not in ("call_function", "call_method") \
            or _target_name(x, modules) not in _CHAIN:
        return None, False
    shape = shape_of(x)
    if n.op == "call_module":
        mod = modules[n.target]
        w, bias = getattr(mod, "weight", None), getattr(mod, "bias", None) is not None
    else:
        w = n.args[1] if len(n.args) > 1 else n.kwargs.get("weight" if name == "linear" else "other")
        bias = name == "linear" and (n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")) is not None
        if not isinstance(w, fx.Node) or (name == "matmul" and len(shape_of(w) or ()) != 2):
            return None, False
        while w.op in ("call_function", "call_method") and _target_name(w, modules) in _CHAIN and w.args \
                and isinstance(w.args[0], fx.Node):
            w = w.args[0]
        w = _attribute(modules, w.target) if w.op == "get_attr" else None
    if not shape or len(shape) < 3:
        return None, False
    chain = _view_chain(x, modules)
    if chain is None:
        return None, False
    v = _replayed(chain, modules, shape_of).get(x)
    if not isinstance(v, torch.Tensor) or v.is_contiguous():
        return None, False
    copied = None
    if isinstance(w, torch.Tensor) and w.requires_grad:
        try:
            v.view(-1, shape[-1])
        except RuntimeError:
            copied = x
    return copied, bias


def _attribute(modules: dict, target: str):
    """A get_attr's value (a parameter, a buffer), from the graph's modules; None if unknown."""
    owner, _, attr = target.rpartition(".")
    return getattr(modules.get(owner), attr, None)


def _view_chain(n: fx.Node, modules: dict) -> list[fx.Node] | None:
    """n and the views before it, back to the nearest computed value (the last item)."""
    chain, a = [], n
    while True:
        src = a.args[0] if a.args and isinstance(a.args[0], fx.Node) else None
        if src is None:
            return None
        chain.append(a)
        if src.op not in ("call_function", "call_method", "call_module") or _target_name(src, modules) not in _CHAIN:
            return chain + [src]
        a = src


def _replayed(chain: list[fx.Node], modules: dict, shape_of: Callable[[fx.Node], Shape | None]) -> dict:
    """The views of `chain` (_view_chain) replayed on meta tensors from its computed value,
    taken as contiguous: node -> meta value; {} where an op does not run on meta tensors or
    a shape is unknown."""
    src = chain[-1]
    shape = shape_of(src)
    if shape is None:
        return {}
    values: dict = {}

    def value(x):
        if x in values:
            return values[x]
        s = shape_of(x)
        if s is None:
            raise LookupError(x)
        return torch.empty(s, device="meta")

    try:  # (symbolic sizes' sentinels may overflow a meta tensor's storage size: a view, then)
        values[src] = torch.empty(shape, device="meta")
        for c in reversed(chain[:-1]):
            args, kwargs = fx.map_arg((c.args, c.kwargs), value)
            if _target_name(c, modules) == "dropout":  # a clone, as Inductor computes it (`_clone_copies`)
                values[c] = args[0].clone()
            elif c.op == "call_method":
                values[c] = getattr(args[0], c.target)(*args[1:], **kwargs)
            elif c.op == "call_module":
                values[c] = modules[c.target](*args, **kwargs)
            else:
                values[c] = c.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 (an op meta tensors do not run, an unknown shape: take it as a view)
        return {}
    return values


def _extern_paths(graph: fx.Graph, kind: dict[fx.Node, str]) -> Callable[[fx.Node, fx.Node], bool]:
    """`through_extern(a, n)`: does a path from a to n pass through an extern call? Inductor
    cannot fuse a into n then (the fused kernel would wait on the call that waits on it).
    Bit sets over the extern calls: those upstream of each node and those downstream."""
    bit = {n: 1 << i for i, n in enumerate(n for n, k in kind.items() if k == "extern")}
    nodes = [n for n in graph.nodes if n in kind]

    def closure(order, neighbours) -> dict[fx.Node, int]:
        seen: dict[fx.Node, int] = {}
        for n in order:
            m = 0
            for a in neighbours(n):
                if a in seen:
                    m |= seen[a] | bit.get(a, 0)
            seen[n] = m
        return seen

    up = closure(nodes, lambda n: n.all_input_nodes)
    down = closure(reversed(nodes), lambda n: n.users)
    return lambda a, n: bool(down[a] & up[n])


def _gemm_operands(n: fx.Node, name: str, modules: dict, shape_of: Callable[[fx.Node], Shape | None],
                   strided_of: Callable[[fx.Node], bool] | None = None):
    """A matmul's, batched_linear's or linear's operand shapes: (name, a, b, bias, strided),
    `strided` where the loops would not vectorize it; None for any other node."""
    def shape(a):
        return shape_of(a) if isinstance(a, fx.Node) else None

    def strided(a):
        return strided_of is not None and isinstance(a, fx.Node) and strided_of(a)

    if name in ("mm", "bmm", "matmul") and len(n.args) >= 2:
        a, b = shape(n.args[0]), shape(n.args[1])
        bias = bool(a and b and len(a) == len(b) == 2 and _bias_by_add(n, (a[0], b[1]), modules, shape))
        return name, a, b, bias, strided(n.args[0]) and strided(n.args[1])
    if name == "batched_linear" and len(n.args) >= 2:
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("b")
        return name, shape(n.args[0]), shape(n.args[1]), bias is not None, False
    if name != "linear" or (n.op != "call_module" and len(n.args) < 2):
        return None
    if n.op == "call_module":
        mod = modules[n.target]
        x, w, bias = shape(n.args[0]), tuple(mod.weight.shape), mod.bias is not None
    else:
        x, w = shape(n.args[0]), shape(n.args[1])
        bias = (n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")) is not None
    two_d = bool(x and w and len(x) == len(w) == 2)
    return name, x, w, bias or (two_d and _bias_by_add(n, (x[0], w[0]), modules, shape)), strided(n.args[0])


def _elementwise_gemm(n: fx.Node, name: str, modules: dict, shape_of: Callable[[fx.Node], Shape | None],
                      table: str, strided_of: Callable[[fx.Node], bool] | None = None) -> bool:
    """Is this matmul or linear one the target computes as elementwise code?"""
    ops = _gemm_operands(n, name, modules, shape_of, strided_of)
    if ops is None:
        return False
    kind, a, b, bias, strided = ops
    if kind == "linear":
        return elementwise_linear(a, b, bias, table, strided)
    if kind == "batched_linear":
        return elementwise_batched_linear(a, b, bias, table)
    return elementwise_matmul(a, b, table, strided, bias)


def loops_work(gm: fx.GraphModule, shape_of: Callable[[fx.Node], Shape | None], table: str,
               strided_of: Callable[[fx.Node], bool] | None = None, break_even: float = MAX_MACS) -> float:
    """The loop work of `gm`'s GEMMs the target writes as loops, in launch-equivalents
    (launch_cost.loop_work, `break_even` its loop_break_even): what the launch count
    `fused_launches` does not see. optimize compares input and result by the sum of the two."""
    modules = dict(gm.named_modules(remove_duplicate=False))
    total = 0.0
    for n in _live(gm.graph, modules):
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        ops = _gemm_operands(n, _target_name(n, modules), modules, shape_of, strided_of)
        if ops is None:
            continue
        kind, a, b, _, strided = ops
        macs = linear_macs(a, b) if kind in ("linear", "batched_linear") else gemm_macs(a, b)
        total += loop_work(macs, table, strided, break_even)
    return total


def _bias_by_add(n: fx.Node, out: Shape, modules: dict, shape: Callable[[object], Shape | None]) -> bool:
    """Does Inductor fold an add into this bias-less 2-D GEMM (`out`: its result's shape) as its
    bias? Its post-grad pattern turns `t + mm(a, b)` (tried first) or `mm(a, b) + t` into
    `addmm(t, a, b)` where the mm has no other reader and `t` is a tensor that expands to the
    product's shape (dtypes are equal in these graphs); the addmm's decomposition may then
    make it elementwise code. Of `mm1 + mm2` it folds mm2 where mm1 expands to its shape."""
    if len(n.users) != 1:
        return False
    (add,) = n.users
    if add.op not in ("call_function", "call_method") or _target_name(add, modules) != "add" \
            or add.kwargs or len(add.args) != 2 or add.args[0] is add.args[1]:
        return False
    other = add.args[1] if add.args[0] is n else add.args[0]
    if not (isinstance(other, fx.Node) and _expands(shape(other), out)):
        return False
    if other is add.args[1]:  # `n + other`: `other + ...` is tried first where other is such a GEMM too
        other_out = _plain_mm_out(other, modules, shape)
        return other_out is None or not _expands(out, other_out)
    return True


def _folded_add(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None]) -> fx.Node | None:
    """The add Inductor folds into the GEMM `n` as its bias (`_bias_by_add`), or None."""
    def shape(a):
        return shape_of(a) if isinstance(a, fx.Node) else None

    out = _plain_mm_out(n, modules, shape, one_reader=False)
    return next(iter(n.users)) if out is not None and _bias_by_add(n, out, modules, shape) else None


def _added_to_itself(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None],
                     table: str) -> fx.Node | None:
    """The add of `m + m`, `n` a 2-D GEMM Inductor sees as an mm (`_plain_mm_out`), where the
    add is its one reader: the post-grad pattern folds it too, as addmm(m, a, b), the product
    computed again beside the mm, a call of its own unless the addmm's decomposition makes it
    code (one row, K, N <= 16). None otherwise."""
    if _plain_mm_out(n, modules, lambda a: shape_of(a) if isinstance(a, fx.Node) else None) is None:
        return None
    (add,) = n.users
    if add.op not in ("call_function", "call_method") or _target_name(add, modules) != "add" \
            or add.kwargs or len(add.args) != 2 or not (add.args[0] is n is add.args[1]):
        return None
    kind, a, b, _, strided = _gemm_operands(n, _target_name(n, modules), modules, shape_of)
    code = (elementwise_linear(a, b, True, table, strided) if kind == "linear"
            else elementwise_matmul(a, b, table, strided, True))
    return None if code else add


def _expands(t: Shape | None, out: Shape) -> bool:
    return t is not None and len(t) <= len(out) and all(a in (1, b) for a, b in zip(reversed(t), reversed(out)))


def _plain_mm_out(m: fx.Node, modules: dict, shape: Callable[[object], Shape | None],
                  one_reader: bool = True) -> Shape | None:
    """The result shape of `m` where Inductor sees an ATen mm (a 2-D matmul, a bias-less
    linear of a 2-D input), with one reader unless not `one_reader`; None for any other node."""
    if (one_reader and len(m.users) != 1) or m.op not in ("call_function", "call_method", "call_module"):
        return None
    name = _target_name(m, modules)
    if name in ("mm", "matmul") and len(m.args) == 2:
        a, b = shape(m.args[0]), shape(m.args[1])
        return (a[0], b[1]) if a and b and len(a) == len(b) == 2 else None
    if name != "linear":
        return None
    if m.op == "call_module":
        x, w, bias = shape(m.args[0]), tuple(modules[m.target].weight.shape), modules[m.target].bias is not None
    else:
        x, w = shape(m.args[0]), shape(m.args[1]) if len(m.args) > 1 else None
        bias = (m.args[2] if len(m.args) > 2 else m.kwargs.get("bias")) is not None
    return (x[0], w[0]) if x and w and len(x) == len(w) == 2 and not bias else None
