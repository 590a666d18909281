"""Graphs optimized in parts: where no rewrite may reach across, the graph is cut into parts.

Stretches. `torch.no_grad()`, `torch.autocast()` and `torch.inference_mode()` blocks inside a
forward are nodes of a Dynamo graph (`_set_grad_enabled`, `_enter_autocast`, ...;
from_fx.GLOBAL_STATE) that change how every node after them runs. Between two such nodes the
state is fixed: each stretch is a part. No rewrite may cross a change of state (a no_grad linear
batched with a grad one would give the no_grad output a gradient; a split under no_grad and a
cat after it do not cancel).

Bodies. `torch.utils.checkpoint.checkpoint(fn, ...)` reaches Dynamo's graph as one call of a
higher-order op on a body graph (`tag_activation_checkpoint(wrap_body_0, x, *params)`), opaque
to the rules; torch.export puts no_grad and autocast blocks in such bodies too
(`wrap_with_set_grad_enabled`, `wrap_with_autocast`). Each body called once is a part, and so
is each branch of a `torch.cond` whose results need no gradient (UNALIASED_OPS), and a body
repeated layers share (`nested_compile_region`'s invoke_subgraph, SHARED_OPS).

All parts are copied side by side into one graph with no edge between them: each part reads
its own placeholders (one per value it reads from outside, parameters included, so no e-node is
shared between parts), and every node carries its part in `meta[from_fx.PART]`, which from_fx
puts in every group key and shared template. That graph is optimized once, on the whole budget;
its result is split back by part: each stretch's nodes go where the stretch was, each body's
into a new body module.

Writes. A part sees no write another part makes, so each value of a part that may alias a
tensor a write outside the part reaches is marked (`from_fx.WRITTEN`) and ordered in its part
as the nodes touching a write are; a checkpointed body's results are marked too where a write
after its call may reach them.
"""
from __future__ import annotations

import copy
import operator
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from optimus_egg.extract.launch_cost import VIEW_TARGETS
from optimus_egg.from_fx import (GLOBAL_STATE, GRAD_REACH, PART, WRITTEN, _grad_reach, _name, _returns_input,
                                 _written_operands, is_mutation, written_aliases)
from optimus_egg.from_fx import _is_view as _aliases_its_input
from optimus_egg.shapes import _fetch, _meta_value, _run

MIN_NODES = 2  # a stretch with fewer call nodes has nothing to batch or cancel

# Higher-order ops that run body graphs -> (the bodies' operand indices, where the bodies'
# inputs are): Dynamo's checkpoint and wrap, torch.export's no_grad and autocast blocks take
# them as their operands after the body; torch.cond runs one of two bodies on a tuple operand.
BODY_OPS = {"tag_activation_checkpoint": ((0,), 1), "wrap": ((0,), 1), "wrap_with_set_grad_enabled": ((1,), 2),
            "wrap_with_autocast": ((4,), 5), "cond": ((1, 2), (3,)), "invoke_subgraph": ((0,), 2)}
# Higher-order ops whose body may be run by several calls: `torch.compiler.nested_compile_region`
# reuses one body (invoke_subgraph) only for calls on inputs of the same metadata, which are the
# body's example values. Any other body run twice might run on other shapes than those.
SHARED_OPS = {"invoke_subgraph"}
# Higher-order ops whose bodies may return no view of an input or of another output
# (torch.cond checks it when it is traced again; Dynamo refuses such an invoke_subgraph body):
# a rewritten body may (a split piece of a batched result, or an input a cat of its pieces
# became), so such an output is copied (`_unaliased`).
UNALIASED_OPS = {"cond"}
FRESH_OUTPUT_OPS = UNALIASED_OPS | SHARED_OPS
# What a later stretch may read of an earlier one's result: sizes (to_fx reads a symbolic size
# from the first input that has it), never a tensor.
_SIZE_OPS = {torch.ops.aten.sym_size.int, operator.add, operator.mul, operator.floordiv}


def _unaliased(graph: fx.Graph, returned, repeated: Sequence[bool] = ()):
    """`returned` (a body's output structure, the body's graph not yet given its output) with
    each view, input, or repeated node copied, the copies appended to the graph (after every
    write a returned value may still get). A result the input body returned at an earlier
    position too (`repeated`, per item of a tuple `returned`) is that earlier result again, not
    a copy: the outputs alias as they did, so a write into one still shows in the other.

    An input or a repeated node is cloned. A view of a value the body computes (a piece of a
    batched result), or a clone of one, is multiplied by one instead: torch 2.13's Inductor
    drops a clone as a no-op (post_grad.remove_noop_ops) and then compiles a cond branch or an
    invoke_subgraph body that returns a piece of one of its buffers to wrong values (the
    pieces' offsets are lost; plain torch.compile of `unbind(stack([a, b]) * 2)` pieces cloned
    in a cond branch does the same), or refuses a cond whose branches return such a piece and
    a fresh tensor ("expected same storage_offset"), while a multiplication by a Python scalar
    is computed into a buffer of its own (bool: and with True)."""
    seen: set[fx.Node] = set()
    made: dict[fx.Node, fx.Node] = {}  # a result -> what was returned for it first

    def fresh(a: fx.Node) -> fx.Node:
        if not _may_be_tensor(a):
            return a
        original = a
        if _is_view(_uncloned(a)):
            a = _computed_copy(graph, a)
        elif a.op in ("placeholder", "get_attr") or a in seen:
            a = graph.call_function(torch.clone, (a,))
        seen.add(a)
        made.setdefault(original, a)
        return a

    if isinstance(returned, (tuple, list)) and len(repeated) == len(returned):
        return type(returned)(made[r] if again and isinstance(r, fx.Node) and r in made else fx.node.map_arg(r, fresh)
                              for r, again in zip(returned, repeated))
    return fx.node.map_arg(returned, fresh)


# Copies Inductor may drop as no-ops where the result has its input's layout.
_NOOP_COPIES = {"clone", "contiguous", "detach", "alias"}


def _returned_nodes(body: fx.GraphModule) -> list:
    """What a body returns, one entry per result (a node, or a constant)."""
    returned = next(n for n in body.graph.nodes if n.op == "output").args[0]
    return list(returned) if isinstance(returned, (tuple, list)) else [returned]


def _results_needing_grad(body: fx.GraphModule) -> list[bool] | None:
    """Which results of a shared body require grad, the body run on its placeholders' example
    values (Dynamo's fake tensors, requiring grad as at the first call); None if they are not
    known. A result needing one where the original body's (its example value) needed none
    breaks AOT autograd's count of a call's tangents (Plan.rebuild detaches it)."""
    values = [n.meta.get("example_value") for n in body.graph.nodes if n.op == "placeholder"]
    modes = {id(m): m for m in (getattr(v, "fake_mode", None) for v in values if isinstance(v, torch.Tensor))}
    mode = next(iter(modes.values())) if len(modes) == 1 else None
    if mode is None or not all(isinstance(v, (torch.Tensor, int, float, bool, torch.SymInt)) for v in values):
        return None
    try:
        with mode, torch.enable_grad(), torch._guards.tracing(None):  # (see shapes._run)
            out = fx.Interpreter(body).run(*values)
    except RuntimeError:  # torch 2.13's baddbmm meta cannot expand a bias to symbolic sizes here
        return None
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    return [isinstance(o, torch.Tensor) and o.requires_grad for o in out]


def _uncloned(a: fx.Node) -> fx.Node:
    """`a` with any chain of clone-like ops (_NOOP_COPIES) on it stripped."""
    while (a.op in ("call_function", "call_method") and _name(a.target) in _NOOP_COPIES
           and a.args and isinstance(a.args[0], fx.Node)):
        a = a.args[0]
    return a


def _may_be_tensor(a: fx.Node) -> bool:
    """False where `a`'s meta says it is no tensor (a size passed along), else True."""
    v = _meta_value(a)
    return v is None or isinstance(v, torch.Tensor) or type(v).__name__ == "TensorMetadata"


def _is_view(a: fx.Node) -> bool:
    """Is `a` a view op's result? A getitem is where it picks a piece of a view op's (split,
    unbind), not a result of an op with several (a body call, a layer norm's statistics)."""
    if a.op not in ("call_function", "call_method") or _name(a.target) not in VIEW_TARGETS:
        return False
    return _name(a.target) != "getitem" or (isinstance(a.args[0], fx.Node) and _is_view(a.args[0]))


_VALUE_KEYS = ("val", "example_value", "tensor_meta")


def _computed_copy(graph: fx.Graph, a: fx.Node) -> fx.Node:
    """A copy of `a` Inductor computes into a buffer of its own (see _unaliased), inserted at
    the graph's insertion point."""
    is_bool = getattr(_meta_value(a), "dtype", None) == torch.bool
    copied = graph.call_function(torch.bitwise_and if is_bool else torch.mul, (a, True if is_bool else 1))
    copied.meta = {k: v for k, v in a.meta.items() if k in _VALUE_KEYS}
    return copied


def _copy_like(graph: fx.Graph, a: fx.Node, like: fx.Node, before: fx.Node) -> fx.Node:
    """`a` copied into a new row-major tensor of `like`'s sizes, inserted before `before`: its
    strides depend on the sizes alone (a product by one would keep a permuted input's order and
    a size-1 dimension's stride), and its sizes are `like`'s expressions where `a`'s are other
    expressions equal under the graph's guards (a reshape to them is traced as a no-op). What
    is copied is `a` multiplied by one (bool: and with True), a buffer Inductor computes: where
    the copy has `a`'s layout Inductor drops it as a no-op, and a piece of a buffer Inductor
    laid out otherwise than its fake value says would reach the body (whose code asserts the
    strides it was traced with)."""
    with graph.inserting_before(before):
        computed = _computed_copy(graph, a)
        empty = graph.call_function(torch.empty_like, (like,), {"memory_format": torch.contiguous_format})
        copied = graph.call_method("copy_", (empty, computed))
    for n in (empty, copied):
        n.meta = {k: v for k, v in like.meta.items() if k in _VALUE_KEYS}
    return copied


def _base(a: fx.Node) -> fx.Node:
    while _is_view(a) and a.args and isinstance(a.args[0], fx.Node):
        a = a.args[0]
    return a


def _operands(n: fx.Node) -> tuple[list, Callable[[list], None]]:
    """A cond / invoke_subgraph call's operands, and a function that sets them."""
    start = BODY_OPS[_name(n.target)][1]
    if isinstance(start, tuple):  # the operands as one tuple
        k = start[0]

        def put(operands: list) -> None:
            n.args = (*n.args[:k], type(n.args[k])(operands), *n.args[k + 1:])
        return list(n.args[k]), put

    def put_flat(operands: list) -> None:
        n.args = (*n.args[:start], *operands)
    return list(n.args[start:]), put_flat


def _aliasing(operands: list) -> list[bool]:
    """Per operand: is it a tensor that shares its base with an earlier operand?"""
    bases: set[fx.Node] = set()
    flags = []
    for a in operands:
        tensor = isinstance(a, fx.Node) and _may_be_tensor(a)
        flags.append(tensor and _base(a) in bases)
        if tensor:
            bases.add(_base(a))
    return flags


def _unaliased_operands(graph: fx.Graph) -> None:
    """Each cond call in `graph` given operands that are no view and alias no other operand:
    the branches' inputs may not alias each other (torch.cond checks it when traced again), and
    a rewrite may make them views of one value (pieces of a batched result), strided unlike the
    inputs the branches were traced with, which Inductor's code for a branch asserts at run
    time ("expected ... stride 8==24"). Each such operand is passed as a row-major copy
    (`_copy_like`). (Shared bodies: _consistent_shared_operands.)"""
    for n in list(graph.nodes):
        if n.op != "call_function" or _name(n.target) not in UNALIASED_OPS:
            continue
        operands, put = _operands(n)
        put([_copy_like(graph, a, a, before=n) if alias or (isinstance(a, fx.Node) and _may_be_tensor(a)
                                                            and _is_view(_uncloned(a))) else a
             for a, alias in zip(operands, _aliasing(operands))])


def _consistent_shared_operands(gm: fx.GraphModule, example_inputs: list) -> None:
    """Each shared body's calls (SHARED_OPS) given operands of one layout, aliasing no other.

    Inductor compiles one body for all its calls and asserts their inputs agree in sizes and
    strides, symbolically ("subgraph args must have consistent values"), while a rewrite may
    make one call's input a piece of a batched result, or a value computed otherwise, strided
    unlike another call's (even on a size-1 dimension), or sized by another expression equal
    under the graph's guards (the last of a chunk's pieces for the first). So at each operand
    position where some call passes a view (or a clone of one, which Inductor may drop), a
    tensor sharing its base with an earlier operand, or a value whose sizes or strides differ
    from another call's (by fake values propagated through `gm`; every position if that
    fails), every call passes a row-major copy sized as the first call's operand (`_copy_like`)."""
    calls: dict[str, list[fx.Node]] = defaultdict(list)
    for n in gm.graph.nodes:
        if n.op == "call_function" and _name(n.target) in SHARED_OPS and isinstance(n.args[0], fx.Node):
            calls[n.args[0].target].append(n)
    if not calls:
        return
    values = _graph_fake_values(gm, example_inputs)

    def tensor(a) -> bool:
        if not isinstance(a, fx.Node):
            return False
        return _may_be_tensor(a) if values is None else isinstance(values.get(a), torch.Tensor)

    def layout(a: fx.Node):
        v = values[a]
        return tuple(map(str, v.shape)), tuple(map(str, v.stride()))

    for group in calls.values():
        operands = [_operands(c) for c in group]
        flags = [_aliasing(ops) for ops, _ in operands]
        for k in range(len(operands[0][0])):
            column = [ops[k] for ops, _ in operands]
            if not all(tensor(a) for a in column):
                continue
            layouts = None if values is None else {layout(a) for a in column}
            if (any(_is_view(_uncloned(a)) for a in column) or any(f[k] for f in flags)
                    or (len(group) > 1 and (layouts is None or len(layouts) > 1))):
                for c, (ops, _) in zip(group, operands):
                    ops[k] = _copy_like(gm.graph, ops[k], column[0], before=c)
        for ops, put in operands:
            put(ops)
    gm.recompile()


def _operands_needing_grad_as_traced(gm: fx.GraphModule, example_inputs: list) -> None:
    """Each trained shared body's calls given no operand needing a gradient where the body's
    placeholder (its example value) needed none: AOT autograd counts a call's tangents by the
    body's results' example values and traces its backward with the operands it is given, and
    a batch may have mixed such an operand with one that needs a gradient ("outs_to_grad length
    (2) != tangents length (1)"). Such an operand is detached, which changes no value or
    gradient. (One that needs none where the body's needed one is fine: the backward is traced
    with it and its tangents counted alike.)"""
    traced = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and _name(n.target) in SHARED_OPS and isinstance(n.args[0], fx.Node):
            body = getattr(gm, n.args[0].target)
            wants = [getattr(p.meta.get("example_value"), "requires_grad", None)
                     for p in body.graph.find_nodes(op="placeholder")]
            if any(getattr(r.meta.get("example_value"), "requires_grad", False)
                   for r in _returned_nodes(body) if isinstance(r, fx.Node)) and False in wants:
                traced[n] = wants
    if not traced:
        return
    with torch.enable_grad():
        values = _graph_fake_values(gm, example_inputs)
    for call, wants in traced.items():
        operands, put = _operands(call)
        for k, (a, want) in enumerate(zip(operands, wants)):
            if want is False and isinstance(a, fx.Node) and getattr((values or {}).get(a), "requires_grad", True):
                with gm.graph.inserting_before(call):
                    operands[k] = gm.graph.call_method("detach", (a,))
        put(operands)


def _graph_fake_values(gm: fx.GraphModule, example_inputs: list) -> dict[fx.Node, object] | None:
    """Every node's fake value, propagated from the placeholders' own (their symbolic sizes,
    Dynamo's fake mode) where every placeholder has one of one mode, else from
    `example_inputs`; None if neither propagates."""
    # (Dynamo's own values are its placeholders' example_value; a `val` may be a later pass's)
    metas = [p.meta.get("example_value", _meta_value(p)) for p in gm.graph.find_nodes(op="placeholder")]
    modes = {id(m): m for m in (getattr(v, "fake_mode", None) for v in metas if isinstance(v, torch.Tensor))}
    if len(modes) == 1 and None not in modes.values() and all(v is not None for v in metas):
        try:
            return _fake_values(gm, metas, *modes.values())
        except Exception:  # (a graph its own mode cannot run: try the example inputs)
            pass
    try:
        return _fake_values(gm, example_inputs)
    except Exception:  # (no values: the caller copies as if every layout differed)
        return None


def _may_need_grad(n: fx.Node) -> bool:
    """Whether a result of `n` requires grad, by its meta value (True if it has none)."""
    v = _meta_value(n)
    if v is None:
        return True
    flat = v if isinstance(v, (tuple, list)) else [v]
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


def trains_a_shared_body(gm: fx.GraphModule) -> bool:
    """Does `gm` call a shared body (SHARED_OPS) whose results may need a gradient? Such a graph,
    the body included (Plan's `trained_shared_bodies`), is rewritten only where Inductor
    compiles it without buffer reuse (optimize's buffer_reuse=False, which the backend passes,
    compiling with baselines.SHARED_BODY_TRAINING): with the reuse, torch 2.13 trained random
    programs so rewritten to wrong gradients (bench/HISTORY.md). Else optimize() leaves it."""
    return any(n.op == "call_function" and _name(n.target) in SHARED_OPS and _may_need_grad(n)
               for n in gm.graph.nodes)


def writes_a_body_input(gm: fx.GraphModule) -> bool:
    """Does `gm` call a body (BODY_OPS) that writes into one of its inputs: an in-place op on a
    placeholder, on a view of one, or through a body it calls in turn? Dynamo traces such a
    `nested_compile_region` body, whose write reaches the caller's tensor; the rewrites see a
    body call as reading its operands only, and a copy passed for an operand (a piece of a
    batched result, or a layout the calls must share) would take the write. optimize() leaves
    such a graph as it is."""
    return any(_body_writes_input(body) for body in _called_bodies(gm))


def _called_bodies(gm: fx.GraphModule) -> list[fx.GraphModule]:
    found = {id(b): b for n in gm.graph.nodes for b in _bodies_called_by(gm, n)}
    return list(found.values())


def _bodies_called_by(gm: fx.GraphModule, n: fx.Node) -> list[fx.GraphModule]:
    if n.op != "call_function" or _name(n.target) not in BODY_OPS:
        return []
    attrs = [n.args[k] for k in BODY_OPS[_name(n.target)][0] if k < len(n.args)]
    found = [_fetch(gm, a.target) for a in attrs if isinstance(a, fx.Node) and a.op == "get_attr"]
    return [b for b in found if isinstance(b, fx.GraphModule)]


def _body_writes_input(body: fx.GraphModule) -> bool:
    modules = dict(body.named_modules())
    aliased = set(body.graph.find_nodes(op="placeholder"))  # its inputs and their views
    for n in body.graph.nodes:  # (in graph order: a view comes after what it views)
        called = _bodies_called_by(body, n)
        if called:
            if (any(a in aliased for a in body_inputs(n) if isinstance(a, fx.Node))
                    and any(_body_writes_input(b) for b in called)):
                return True
            continue
        if is_mutation(n, modules) and any(w in aliased for w in _written_operands(n)):
            return True
        first = n.all_input_nodes[:1]
        if first and first[0] in aliased and (_aliases_its_input(n) or _returns_input(n, modules)):
            aliased.add(n)
    return False


def body_inputs(call: fx.Node) -> list:
    """What a BODY_OPS call passes its bodies, one per body placeholder."""
    start = BODY_OPS[_name(call.target)][1]
    if isinstance(start, tuple):  # the inputs as one tuple operand
        packed = call.args[start[0]] if len(call.args) > start[0] else ()
        return list(packed) if isinstance(packed, (tuple, list)) else []
    return list(call.args[start:])


def changes_state(n: fx.Node) -> bool:
    return n.op == "call_function" and _name(n.target) in GLOBAL_STATE


def has_state_changes(gm: fx.GraphModule) -> bool:
    return any(changes_state(n) for n in gm.graph.nodes)


def stretches(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The runs of call nodes between state changes, in graph order (empty runs left out).
    Placeholders, get_attr nodes (free to read anywhere) and the output belong to none. A
    getitem of a tuple goes with the tuple (it computes nothing), so no stretch reads a tuple
    whole."""
    runs: list[list[fx.Node]] = [[]]
    home: dict[fx.Node, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if changes_state(n):
            runs.append([])
        elif n.op.startswith("call"):
            src = n.args[0] if n.target is operator.getitem else None
            item = isinstance(src, fx.Node) and isinstance(_meta_value(src), (tuple, list))
            run = home.get(src, runs[-1]) if item else runs[-1]
            run.append(n)
            home[n] = run
    return [r for r in runs if r]


def bodies(gm: fx.GraphModule) -> dict[str, list[fx.Node]]:
    """Attribute of `gm` -> the calls running it, for each body read only by BODY_OPS calls:
    by exactly one, or by calls of SHARED_OPS."""
    reads: dict[str, int] = {}
    calls: dict[str, list[fx.Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            reads[n.target] = reads.get(n.target, 0) + len(n.users)
        elif n.op == "call_function" and _name(n.target) in BODY_OPS:
            for k in BODY_OPS[_name(n.target)][0]:
                body = n.args[k] if len(n.args) > k else None
                if isinstance(body, fx.Node) and body.op == "get_attr":
                    calls.setdefault(body.target, []).append(n)
    return {t: ns for t, ns in calls.items() if reads.get(t) == len(ns) and "." not in t
            and (len(ns) == 1 or all(_name(n.target) in SHARED_OPS for n in ns))
            and isinstance(getattr(gm, t, None), fx.GraphModule) and _optimizable_body(getattr(gm, t))}


def _reached_outputs(call: fx.Node, reach: set[fx.Node]) -> set[int] | None:
    """Which results of a body call `reach` holds: the k of each reached `call[k]`, or None (all)
    if a reached user takes the result whole."""
    outs: set[int] = set()
    for u in call.users:
        if u in reach:
            if u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int):
                outs.add(u.args[1])
            else:
                return None
    return outs


def _optimizable_body(body: fx.GraphModule) -> bool:
    """Example values for every placeholder (meta), and no call_module (its target is the body's)."""
    return all(_meta_value(n) is not None for n in body.graph.nodes if n.op == "placeholder") and not any(
        n.op == "call_module" for n in body.graph.nodes)


@dataclass
class Part:
    nodes: list[fx.Node]     # its call nodes, in order: gm's (a stretch) or a body's
    leaves: list[fx.Node]    # what it reads from outside: gm's nodes before it, or the body's placeholders and get_attrs
    outputs: list[fx.Node]   # its nodes read after it (a stretch), or those the body returns
    body: str | None = None  # the attribute holding the body
    calls: list[fx.Node] | None = None  # a body's: the calls of gm that run it
    grad_off: bool = False   # it runs with grad disabled (a no_grad block, or export's no_grad body)


def _stretch(run: list[fx.Node]) -> Part:
    members = set(run)
    leaves = list(dict.fromkeys(a for n in run for a in n.all_input_nodes if a not in members))
    return Part(run, leaves, [n for n in run if any(u not in members for u in n.users)])


def _body(gm: fx.GraphModule, name: str, calls: list[fx.Node]) -> Part:
    graph = getattr(gm, name).graph
    leaves = [n for n in graph.nodes if n.op == "placeholder"] + [n for n in graph.nodes if n.op == "get_attr"]
    outputs = list(dict.fromkeys(a for n in graph.nodes if n.op == "output" for a in n.all_input_nodes
                                 if a.op not in ("placeholder", "get_attr")))
    return Part([n for n in graph.nodes if n.op.startswith("call")], leaves, outputs, body=name, calls=calls)


class Plan:
    """The parts of `gm` side by side in one graph (`combined`, with `values` its example inputs);
    `rebuild` puts an optimized `combined` back."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list, trained_shared_bodies: bool = False):
        self.gm, self.example_inputs = gm, example_inputs
        self.parts = ([_stretch(r) for r in stretches(gm) if len(r) >= MIN_NODES]  # (one run if no state changes)
                      + [_body(gm, name, calls) for name, calls in bodies(gm).items()])
        off = _grad_disabled(gm)
        for p in self.parts:
            p.grad_off = all(n in off for n in p.calls or p.nodes[:1])
        # a shared body run both with grad and without is left as it is: whether a value it only
        # passes through comes out detached (grad_off) has one answer per body
        self.parts = [p for p in self.parts if p.grad_off or not any(n in off for n in p.calls or ())]
        reach = self._grad_reach(off)
        # torch.cond's backward needs each branch's gradients to be fresh tensors: the gradient
        # of a batched branch (pieces of one concatenated weight's) is views of one tensor, which
        # it rejects (so does plain torch.compile on such a branch). A branch whose results need
        # a gradient (or may: no meta value) stays as it is. So does a shared body whose calls'
        # results need a gradient (trains_a_shared_body; this also covers a graph optimized with
        # training=False that is trained anyway), unless `trained_shared_bodies` (the graph is
        # compiled without Inductor's buffer reuse: optimize's buffer_reuse=False).
        kept = UNALIASED_OPS if trained_shared_bodies else FRESH_OUTPUT_OPS
        self.parts = [p for p in self.parts if not (p.body and _name(p.calls[0].target) in kept
                                                    and any(c in reach for c in p.calls) and not p.grad_off
                                                    and any(_may_need_grad(c) for c in p.calls))]
        writers = self._writers()

        def written(n: fx.Node, i: int) -> bool:  # (by a write outside part i)
            return bool(writers.get(n, set()) - {i})

        g = fx.Graph()
        env: dict[tuple[int, fx.Node], fx.Node] = {}
        self.leaf_of: list[tuple[int, fx.Node]] = []  # per placeholder of `combined`
        for i, p in enumerate(self.parts):
            for leaf in p.leaves:
                ph = env[i, leaf] = g.placeholder(f"part{i}_{leaf.name}")
                ph.meta = {**leaf.meta, PART: i, GRAD_REACH: leaf in reach, WRITTEN: written(leaf, i)}
                self.leaf_of.append((i, leaf))
        outs = []
        for i, p in enumerate(self.parts):
            # a body's results, where a write may reach them through a call (into a result, or
            # into an operand a rewrite could make a result a view of); cond and shared bodies
            # return fresh copies anyway (_unaliased)
            results_written = p.body is not None and _name(p.calls[0].target) not in FRESH_OUTPUT_OPS and any(
                c in writers or any(a in writers for a in c.all_input_nodes) for c in p.calls)
            for n in p.nodes:
                env[i, n] = g.node_copy(n, lambda a, i=i: env[i, a])
                env[i, n].meta.update({PART: i, GRAD_REACH: n in reach,
                                       WRITTEN: written(n, i) or (results_written and n in p.outputs)})
            outs += [env[i, n] for n in p.outputs]
        g.output(tuple(outs))
        self.combined = fx.GraphModule(gm, g, class_name=type(gm).__name__)
        self.values = self._example_values(example_inputs)
        for ph, v in zip((n for n in g.nodes if n.op == "placeholder"), self.values):
            if _meta_value(ph) is None and not isinstance(v, torch.Tensor):
                ph.meta["val"] = v  # (a body module read by get_attr): every node has its value in meta

    def _writers(self) -> dict[fx.Node, set]:
        """For each node of gm that may alias a written tensor (from_fx.written_aliases), the
        stretches its writes lie in (None: outside every stretch). A part
        sees no write another part makes, so a value that a write in another part may reach is
        marked there and ordered as if written there (a split and a stack around a piece written
        later must not cancel into a view of the input); a write's own stretch handles its
        aliases itself (functional.py, from_fx)."""
        modules = dict(self.gm.named_modules())
        stretch_of = {n: i for i, p in enumerate(self.parts) if p.body is None for n in p.nodes}
        writers: dict[fx.Node, set] = defaultdict(set)
        for m in (n for n in self.gm.graph.nodes if is_mutation(n, modules)):
            for n in written_aliases(self.gm.graph, modules, [m]):
                writers[n].add(stretch_of.get(m))
        return writers

    def _grad_reach(self, off: set[fx.Node]) -> set[fx.Node]:
        """The nodes of gm and of its bodies a gradient of gm's outputs reaches (from_fx's
        _grad_reach): none that run with grad disabled (`off`, gm's). A body call is walked
        through its body: from the body outputs whose results are reached, to the placeholders
        they read, to the call's arguments for those (a body output nothing reads passes no
        gradient back to what it was computed from)."""
        def meta(graph: fx.Graph) -> dict:
            return {n: _meta_value(n) for n in graph.nodes}

        values = meta(self.gm.graph)
        calls = {c: p for p in self.parts if p.body is not None for c in p.calls}
        reach = _grad_reach(self.gm.graph, values, off, barrier=set(calls))
        walked: dict[fx.Node, set[int] | None] = {}
        changed = True
        while changed:
            changed = False
            for call, p in calls.items():
                if call not in reach or p.grad_off:
                    continue
                outs = _reached_outputs(call, reach)
                if call in walked and walked[call] == outs:
                    continue
                walked[call] = outs
                body = getattr(self.gm, p.body)
                starts = [a for k, a in enumerate(_returned_nodes(body)) if isinstance(a, fx.Node) and (outs is None or k in outs)]
                inner = _grad_reach(body.graph, meta(body.graph), _grad_disabled(body), starts=starts)
                reach |= inner
                args = [a for ph, a in zip((n for n in body.graph.nodes if n.op == "placeholder"), body_inputs(call))
                        if ph in inner and isinstance(a, fx.Node)]
                more = _grad_reach(self.gm.graph, values, off, starts=args, barrier=set(calls))
                if not more <= reach:
                    reach |= more
                    changed = True
        return reach

    def _example_values(self, example_inputs: list) -> list:
        """The value of each leaf: the example input of a placeholder of gm, the attribute a
        get_attr reads, else the leaf's meta value; if a leaf of a stretch has none, fake
        values propagated through the whole of gm."""
        given = dict(zip((n for n in self.gm.graph.nodes if n.op == "placeholder"), example_inputs))
        values = []
        for i, leaf in self.leaf_of:
            body = self.parts[i].body
            if leaf.op == "get_attr":
                values.append(_fetch(getattr(self.gm, body) if body else self.gm, leaf.target))
            else:  # (a body's placeholders all have meta: `bodies`)
                values.append(given[leaf] if leaf in given and body is None else _meta_value(leaf))
        if any(v is None for v in values):
            fakes = _fake_values(self.gm, example_inputs)
            values = [fakes[leaf] if v is None else v for v, (_, leaf) in zip(values, self.leaf_of)]
        return values

    def rebuild(self, out: fx.GraphModule) -> fx.GraphModule:
        """gm with each part replaced by its nodes in `out` (an optimized `combined`)."""
        placeholders = [n for n in out.graph.nodes if n.op == "placeholder"]
        leaf_of = dict(zip(placeholders, self.leaf_of))
        part_of = self._parts_of(out, leaf_of)
        by_part: dict[int, list[fx.Node]] = defaultdict(list)
        for n, i in part_of.items():
            by_part[i].append(n)
        results = iter(next(n for n in out.graph.nodes if n.op == "output").args[0])
        produced = {(i, o): next(results) for i, p in enumerate(self.parts) for o in p.outputs}

        def emit(graph: fx.Graph, i: int, lookup: dict) -> None:
            for n in by_part[i]:
                lookup[n] = graph.node_copy(n, lookup.__getitem__)
                for key in (PART, GRAD_REACH, WRITTEN):  # (only the parts' graph speaks of parts)
                    lookup[n].meta.pop(key, None)

        def result(graph: fx.Graph, i: int, o: fx.Node, lookup: dict):
            """What part i's output o became. Out of a part run with grad disabled, a value it
            only passes through (a split and cat there cancelled) is detached, as the part's own
            result would be."""
            v = produced[i, o]
            if not isinstance(v, fx.Node):
                return v
            if self.parts[i].grad_off and v.op in ("placeholder", "get_attr"):
                return graph.call_method("detach", (lookup[v],))
            return lookup[v]

        # Each body: a new module with the body's placeholders, get_attrs and output structure.
        new_bodies = {}
        for i, p in enumerate(self.parts):
            if p.body is None:
                continue
            old = getattr(self.gm, p.body)
            bg = fx.Graph()
            lookup: dict = {}
            for ph, (j, leaf) in leaf_of.items():
                if j == i:
                    lookup[ph] = (bg.placeholder(leaf.name, type_expr=leaf.type) if leaf.op == "placeholder"
                                  else bg.get_attr(leaf.target))
                    lookup[ph].meta = dict(leaf.meta)
            emit(bg, i, lookup)
            own = {leaf: lookup[ph] for ph, (j, leaf) in leaf_of.items() if j == i}
            returned = next(n for n in old.graph.nodes if n.op == "output").args[0]
            returned = fx.node.map_arg(returned, lambda a, i=i, own=own, lookup=lookup, bg=bg:
                                       own[a] if a in own else result(bg, i, a, lookup))
            # A trained shared body's results that needed no gradient (their example values) still
            # need none: AOT autograd counts a call's tangents by those values and traces its
            # backward with the results that do; a batch may have mixed such a result with one
            # that does, and it is then detached (which changes no value or gradient).
            need = [isinstance(c, fx.Node) and getattr(c.meta.get("example_value"), "requires_grad", False)
                    for c in _returned_nodes(old)]
            if (_name(p.calls[0].target) in SHARED_OPS and not p.grad_off and any(need)
                    and isinstance(returned, (tuple, list))):
                got = _results_needing_grad(self._body_module(old, bg, returned)) or [True] * len(need)
                returned = type(returned)(bg.call_method("detach", (r,)) if g and not w and isinstance(r, fx.Node) else r
                                          for r, g, w in zip(returned, got, need))
            if _name(p.calls[0].target) in FRESH_OUTPUT_OPS:
                before = _returned_nodes(old)
                repeated = [isinstance(r, fx.Node) and r in before[:k] for k, r in enumerate(before)]  # (aliases)
                returned = _unaliased(bg, returned, repeated)
            new_bodies[p.body] = self._body_module(old, bg, returned)

        # The outer graph: each stretch's nodes where its first node was.
        from optimus_egg.to_fx import graph_module

        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        first = {p.nodes[0]: i for i, p in enumerate(self.parts) if p.body is None}
        inside = {n for p in self.parts if p.body is None for n in p.nodes}
        for n in self.gm.graph.nodes:  # parameters read first: a part may read one defined inside its span
            if n.op in ("placeholder", "get_attr"):
                env[n] = g.node_copy(n, lambda a: env[a])
        attrs = {n: g.node_copy(n) for n in out.graph.nodes if n.op == "get_attr"}  # (of gm: no body has any)
        for n in self.gm.graph.nodes:
            if n in first:
                i = first[n]
                lookup = {ph: env[leaf] for ph, (j, leaf) in leaf_of.items() if j <= i}  # (stretches come first)
                lookup.update(attrs)
                emit(g, i, lookup)
                env.update({o: result(g, i, o, lookup) for o in self.parts[i].outputs})
            elif n.op not in ("placeholder", "get_attr") and n not in inside:
                env[n] = g.node_copy(n, lambda a: env[a])
        _unaliased_operands(g)
        g._codegen = copy.copy(self.gm.graph._codegen)
        rebuilt = graph_module(self.gm, g, class_name=type(self.gm).__name__)
        for name, body in new_bodies.items():
            setattr(rebuilt, name, body)
        _operands_needing_grad_as_traced(rebuilt, self.example_inputs)
        _consistent_shared_operands(rebuilt, self.example_inputs)
        return rebuilt

    @staticmethod
    def _body_module(old: fx.GraphModule, graph: fx.Graph, returned) -> fx.GraphModule:
        """A body module like `old` running `graph` (a copy given the output `returned`)."""
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for n in graph.nodes:
            env[n] = g.node_copy(n, env.__getitem__)
        g.output(fx.node.map_arg(returned, env.__getitem__))
        g._codegen = copy.copy(old.graph._codegen)
        return fx.GraphModule(old, g, class_name=type(old).__name__)

    def _parts_of(self, out: fx.GraphModule, leaf_of: dict) -> dict[fx.Node, int]:
        """The part of each computing node of `out`: its tag (from the node it came from), else
        its inputs' part, else (reading nothing) its first user's. Checks that a part reads only
        its own values, or an earlier stretch's leaves and sizes (which come before it)."""
        part_of: dict[fx.Node, int] = {}
        nodes = [n for n in out.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
        for n in nodes:
            tag = n.meta.get(PART)
            if tag is None:
                tag = max((leaf_of[a][0] if a in leaf_of else part_of[a] for a in n.all_input_nodes
                           if part_of.get(a) is not None or a in leaf_of), default=None)
            part_of[n] = tag
        for n in reversed(nodes):
            if part_of[n] is None:
                users = [part_of[u] for u in n.users if u.op != "output"]
                if not users:
                    raise RuntimeError(f"parts: {n.name} reads nothing and nothing reads it")
                part_of[n] = min(users)
        for n in nodes:
            i = part_of[n]
            for a in n.all_input_nodes:
                if a.op == "get_attr":  # a parameter of gm (a module's, lowered): read anywhere
                    continue
                j = leaf_of[a][0] if a in leaf_of else part_of[a]
                stretches_in_order = j < i and self.parts[i].body is None and self.parts[j].body is None
                if j != i and not (stretches_in_order and (a in leaf_of or a.target in _SIZE_OPS)):
                    raise RuntimeError(f"parts: {n.name} (part {i}) reads {a.name} (part {j})")
        return part_of


def _grad_disabled(gm: fx.GraphModule) -> set[fx.Node]:
    """The call nodes of gm that run with grad disabled by gm's own state changes (no_grad,
    set_grad_enabled, inference_mode), and torch.export's no_grad bodies' calls; gm itself is
    taken to start with grad enabled."""
    grad, saved, off = True, [], set()
    for n in gm.graph.nodes:
        name = _name(n.target) if n.op == "call_function" else ""
        if name == "_set_grad_enabled":
            grad = bool(n.args[0])
        elif name == "_enter_inference_mode":
            saved.append(grad)
            grad = grad and not n.args[0]
        elif name == "_exit_inference_mode" and saved:
            grad = saved.pop()
        elif n.op.startswith("call") and (not grad or (name == "wrap_with_set_grad_enabled" and not n.args[0])):
            off.add(n)
    return off


def _fake_values(gm: fx.GraphModule, example_inputs: list, mode=None) -> dict[fx.Node, object]:
    """Every node's value, propagated with fake tensors through the whole graph (in `mode`,
    whose fakes `example_inputs` then are; else a new mode)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses.fake_tensor import FakeTensorMode

    values: dict[fx.Node, object] = {}

    def record(n: fx.Node, v):
        values[n] = v
        return v

    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        example_inputs = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    grad = torch.is_grad_enabled()
    try:  # the graph's own state changes run for real: leave the state as it was
        with mode, enable_python_dispatcher():  # (as AOT autograd traces: symbolic sizes need it)
            _run(gm, example_inputs, record)  # (FakeTensorProp would write meta: shapes.propagate_shapes)
    finally:
        torch.set_grad_enabled(grad)
    return values


def optimize_parts(gm: fx.GraphModule, example_inputs: list,
                   optimize_one: Callable[[fx.GraphModule, list], fx.GraphModule],
                   trained_shared_bodies: bool = False) -> tuple[fx.GraphModule, int]:
    """`gm` with its parts optimized together by `optimize_one(combined graph, example values)`,
    and the number of parts. `trained_shared_bodies`: Plan's."""
    plan = Plan(gm, example_inputs, trained_shared_bodies)
    if not plan.parts:
        return gm, 0
    out = optimize_one(plan.combined, plan.values)
    return (gm if out is plan.combined else plan.rebuild(out)), len(plan.parts)
