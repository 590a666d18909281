"""Cost = kernels Inductor (C++ on CPU) launches for a whole FX graph, with its fusion.

The per-node table in launch_cost.py drives extraction; this estimate looks at neighbours,
which a per-node cost cannot, and is what the bench reports as the cost model's predicted
launches. Observed in Inductor's generated code (torch 2.13, CPU; `bench/calibrate.py`):

- an extern GEMM (mm / addmm / bmm / baddbmm, a linear) or an ATen fallback launches once
  (on CPU every scan, cumsum and its kind, is one);
- elementwise ops, reductions and copies connected producer -> consumer (through views), or
  reading one value (an input, an extern call's result, one view of either), fuse into one
  kernel, up to a GEMM, unless a path between the two passes through an extern call;
- a cat or stack of computed tensors is free: each producer writes into its slice (a view
  of one, or an input, is copied: the cat is then a kernel of its own), and the elementwise
  producers fuse with the cat's consumers (a bias add per row, the cat and a LayerNorm that
  reads it are one kernel);
- copies of graph inputs and parameters (the stacked weights of a batched GEMM) fuse with a
  computed consumer, and otherwise into one kernel with every other such copy;
- a dropout that draws (F.dropout's `training` defaults to True) computes like an elementwise
  op, and any random op adds one fallback call that draws the graph's seeds;
- given shapes, a GEMM that Inductor's CPU decompositions compute as elementwise code (a
  one-row linear with K, N <= 16, a dot product, a small outer product, a batched
  matrix-vector product: launch_cost.py) computes like an elementwise op.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch.fx as fx
from optimus_egg.extract.launch_cost import (GEMM_TARGETS, VIEW_TARGETS, elementwise_batched_linear, elementwise_linear,
                                             elementwise_matmul)
from optimus_egg.from_fx import draws_random

EXTERN = GEMM_TARGETS | {"batched_linear", "embedding_bag", "_embedding_bag", "index_select", "gather",
                         "scatter_add", "sort", "topk", "nonzero"}
COPIES = {"cat", "concat", "stack"}
MAX_FUSION = 64  # Inductor's config.max_fusion_size: nodes per fused kernel
_FREE_TARGETS = VIEW_TARGETS | {"getattr", "size", "dim", "sym_size"}


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


def fused_launches(gm: fx.GraphModule, shape_of: Callable[[fx.Node], Shape | None] | None = None,
                   table: str = "cpu") -> int:
    """Predicted Inductor kernel launches of `gm` (extern calls + fused kernels). With
    `shape_of` (a node's tensor shape, None where unknown), GEMMs that the target (`table`,
    launch_cost.py) computes as elementwise code fuse like elementwise ops."""
    kind: dict[fx.Node, str] = {}   # leaf | view | extern | compute
    leafy: dict[fx.Node, bool] = {}  # computed from graph inputs / parameters only
    modules = dict(gm.named_modules(remove_duplicate=False))
    random = False  # a random op: Inductor draws the graph's seeds in one fallback call
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            kind[n], leafy[n] = "leaf", True
            continue
        if n.op == "output":
            continue
        ins = [a for a in n.all_input_nodes if a in kind]
        kind[n] = node_kind(n, modules, shape_of, table)
        random = random or draws_random(n, modules)
        leafy[n] = all(leafy.get(a, False) for a in ins) and kind[n] != "extern"

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

    compute = [n for n in gm.graph.nodes if kind.get(n) == "compute"]
    free_cat = set()
    for n in compute:
        name = _target_name(n, modules)
        if name in COPIES and not leafy[n] and all(kind.get(a) in ("compute", "extern") for a in n.all_input_nodes):
            free_cat.add(n)  # producers write straight into the output buffer
    through_extern = _extern_paths(gm, kind)
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
    externs = sum(1 for k in kind.values() if k == "extern")
    kernels = sum(math.ceil(s / MAX_FUSION) for s in sizes.values())
    return externs + kernels + math.ceil(lonely_copies / MAX_FUSION) + random


def node_kind(n: fx.Node, modules: dict, shape_of: Callable[[fx.Node], Shape | None] | None = None,
              table: str = "cpu") -> str:
    """How Inductor computes a node: "leaf" (a graph input or parameter), "view", "extern" (a
    call of its own) or "compute" (code it generates and fuses)."""
    if n.op in ("placeholder", "get_attr"):
        return "leaf"
    name = _target_name(n, modules)
    if draws_random(n, modules):
        return "compute"
    if name in _FREE_TARGETS or name == "getitem" or name == "dropout":
        return "view"
    if (name in EXTERN or name in _MODULE_EXTERN or "batched_linear" in name
            or (table == "cpu" and name in SCANS)) and not (
            shape_of is not None and _elementwise_gemm(n, name, modules, shape_of, table)):
        return "extern"
    return "compute"


def _extern_paths(gm: fx.GraphModule, kind: dict[fx.Node, str]) -> Callable[[fx.Node, fx.Node], bool]:
    """`through_extern(a, n)`: does a path from a to n pass through an extern call? Inductor
    cannot fuse a into n then (the fused kernel would wait on the call that waits on it).
    Bit sets over the extern calls: those upstream of each node and those downstream."""
    bit = {n: 1 << i for i, n in enumerate(n for n, k in kind.items() if k == "extern")}
    nodes = [n for n in gm.graph.nodes if n in kind]

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


def _elementwise_gemm(n: fx.Node, name: str, modules: dict, shape_of: Callable[[fx.Node], Shape | None],
                      table: str) -> bool:
    """Is this matmul or linear one the target computes as elementwise code?"""
    def shape(a):
        return shape_of(a) if isinstance(a, fx.Node) else None

    if name in ("mm", "bmm", "matmul") and len(n.args) >= 2:
        return elementwise_matmul(shape(n.args[0]), shape(n.args[1]), table)
    if name == "linear" and n.op == "call_module":
        mod = modules[n.target]
        return elementwise_linear(shape(n.args[0]), tuple(mod.weight.shape), mod.bias is not None, table)
    if name == "batched_linear" and len(n.args) >= 2:
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("b")
        return elementwise_batched_linear(shape(n.args[0]), shape(n.args[1]), bias is not None, table)
    if name == "linear" and len(n.args) >= 2:
        bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
        return elementwise_linear(shape(n.args[0]), shape(n.args[1]), bias is not None, table)
    return False
