"""Work = elements a node moves plus its multiply-adds: the tie-breaker among equal launch counts.

Launches (launch_cost.py) decide; where two choices launch the same kernels, the one that
moves less data and does less arithmetic wins. That is what keeps a batch of two elementwise
ops (two stack copies and one op: 0.25 + 0.25 + 0.5 launches) from replacing the two ops
(0.5 + 0.5) it ties with, and a pointwise op on a whole concatenation from replacing the same
op on the one piece that is read.

- A node that launches (launch_cost > 0) moves the elements it reads and writes: the sum of
  its tensor operands' sizes and its result's. Views, leaves and tuple plumbing move nothing.
- A GEMM adds its multiply-adds over `MACS_PER_ELEMENT`, a CPU's balance of arithmetic to
  memory traffic (tens of FLOPs per float moved), so a batched GEMM that did padding work
  would not be free. No rule pads today: a batched GEMM does its members' multiply-adds.
- Sizes are elements, not bytes: the e-graph keeps shapes, not dtypes (a batch's members share
  a dtype by construction). A size with a symbolic dimension counts that dimension as
  `SYMBOLIC_DIM`.

Each class's shape comes from the e-graph's `shape` facts, from the FX value it was lowered
from, and otherwise from its nodes' operands (`class_shapes`). A class whose shape cannot be
derived (an opaque template call nothing traced) counts as size 0.
"""
from __future__ import annotations

import math

from optimus_egg.extract.graph import Graph, Node
from optimus_egg.shapes import SYMBOLIC_MIN  # sentinels for symbolic sizes start here

MACS_PER_ELEMENT = 16   # 32 FLOPs per element moved: a few cores' FMA throughput over DRAM bandwidth
SYMBOLIC_DIM = 64

# op -> the position of the operand whose last dimension a GEMM template call contracts over
_CONTRACT = {"mm": 0, "bmm": 0, "matmul": 0, "linear": 0, "addmm": 1, "baddbmm": 1}


def class_shapes(g: Graph, known: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Tensor class -> static shape, from `known` (facts, FX values) and derived through the
    nodes whose operands' shapes are known, to a fixpoint. Tuple classes get a list of their
    items' shapes."""
    shapes: dict[str, object] = dict(known)
    todo = [k for k, n in g.nodes.items() if n.eclass not in shapes]
    while todo:
        left = []
        for k in todo:
            n = g.nodes[k]
            if n.eclass in shapes:
                continue
            s = _shape(g, n, shapes)
            if s is None:
                left.append(k)
            else:
                shapes[n.eclass] = s
        if len(left) == len(todo):
            break
        todo = left
    return shapes


def _shape(g: Graph, n: Node, shapes: dict):
    """The shape of n's result from its operands' shapes, or None if not (yet) derivable."""
    op, ch = n.op, n.children
    if not ch or op in ("input", "call", "call_multi", "outputs"):
        return None  # known from an FX value or not at all
    if op in ("unary", "layer_norm", "batched_layer_norm"):
        return shapes.get(ch[1] if op == "unary" else ch[0])
    if op == "binary":
        a, b = shapes.get(ch[1]), shapes.get(ch[2])
        return None if a is None or b is None else _broadcast(a, b)
    if op in ("cat", "stack"):
        xs = [shapes.get(c) for c in g.values[ch[0]]]
        if not xs or any(x is None for x in xs):
            return None
        d = g.values[ch[1]]
        if op == "stack":
            d %= len(xs[0]) + 1
            return (*xs[0][:d], len(xs), *xs[0][d:])
        if not xs[0]:
            return None
        d %= len(xs[0])
        return (*xs[0][:d], sum(x[d] for x in xs), *xs[0][d + 1:])
    x = shapes.get(ch[0])
    if x is None or (op != "item" and not (isinstance(x, tuple) and x)):
        return None  # unknown, or a 0-d tensor where a dimension is named
    if op == "item":
        items = x
        i = g.values[ch[1]]
        return items[i] if isinstance(items, list) and 0 <= i < len(items) else None
    if op in ("linear", "batched_linear"):
        w = shapes.get(ch[1])
        return None if w is None else (*x[:-1], w[-2])
    if op == "split":
        sizes, d = g.values[ch[1]], g.values[ch[2]] % len(x)
        return [(*x[:d], g.values[s], *x[d + 1:]) for s in sizes]
    if op == "unbind":
        d = g.values[ch[1]] % len(x)
        return [(*x[:d], *x[d + 1:])] * x[d]
    if op == "movedim":
        src, dst = g.values[ch[1]] % len(x), g.values[ch[2]] % len(x)
        rest = [s for i, s in enumerate(x) if i != src]
        return (*rest[:dst], x[src], *rest[dst:])
    if op == "flatten":
        a, b = g.values[ch[1]] % len(x), g.values[ch[2]] % len(x)
        return (*x[:a], math.prod(x[a:b + 1]), *x[b + 1:])
    if op == "unflatten":
        d = g.values[ch[1]] % len(x)
        split = [g.values[s] for s in g.values[ch[2]]]
        if -1 in split:  # the one inferred size
            split[split.index(-1)] = x[d] // max(-math.prod(split), 1)
        return (*x[:d], *split, *x[d + 1:])
    if op == "reshape":
        return tuple(g.values[s] for s in g.values[ch[1]])  # static sizes, no -1 (sorts.reshape)
    if op == "narrow":
        d = g.values[ch[1]] % len(x)
        return (*x[:d], g.values[ch[3]], *x[d + 1:])
    if op == "squeeze":
        d = g.values[ch[1]] % len(x)
        return (*x[:d], *x[d + 1:])
    raise ValueError(f"class_shapes: unknown op {op!r}")


def _broadcast(a: tuple, b: tuple) -> tuple:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def numel(shape) -> int:
    """Elements of a tensor shape (a tuple's: its items'), symbolic dims as SYMBOLIC_DIM."""
    if isinstance(shape, list):
        return sum(map(numel, shape))
    return math.prod(SYMBOLIC_DIM if s >= SYMBOLIC_MIN else s for s in shape)


def sizes(shapes: dict) -> dict[str, int]:
    """Class -> numel, for `work`."""
    return {c: numel(s) for c, s in shapes.items()}


def work(g: Graph, n: Node, shapes: dict, size: dict[str, int], gemm_target: str | None = None) -> float:
    """Elements n reads and writes plus a GEMM's multiply-adds / MACS_PER_ELEMENT, for a node
    that launches (the caller asks only for those); `size` is `sizes(shapes)`. `gemm_target`
    names a template GEMM call's FX target ("mm", "addmm", ...), or "linear" for the linear
    constructors."""
    get = size.get
    moved = get(n.eclass, 0)
    ins = []
    for c in n.children:
        if c in g.classes:
            ins.append(c)
            moved += get(c, 0)
        elif isinstance(v := g.values.get(c), list):
            for e in v:
                if e in g.classes:
                    ins.append(e)
                    moved += get(e, 0)
    if gemm_target is not None and n.eclass in size:
        pos = 0 if n.op in ("linear", "batched_linear") else _CONTRACT.get(gemm_target)
        a = shapes.get(ins[pos]) if pos is not None and pos < len(ins) else None
        if a and not isinstance(a, list):
            moved += size[n.eclass] * numel(a[-1:]) / MACS_PER_ELEMENT
    return moved
