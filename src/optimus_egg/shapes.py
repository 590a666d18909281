"""Example values for lowering: the inputs checked against the graph, and each node's
static shape, dtype and device, from node meta or by running the graph.

On big graphs without in-place ops the graph runs in a forked child that streams the values
back while from_fx lowers the nodes already done (`shape_values`).
"""
from __future__ import annotations

import contextlib
import operator
import pickle
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from optimus_egg import worker


def _meta_value(node: fx.Node):
    for key in ("val", "example_value"):
        if key in node.meta:
            return node.meta[key]
    tm = node.meta.get("tensor_meta")
    return tm


def _static_int(v) -> bool:
    """None or a plain int (not a bool, nor a value computed in the graph)."""
    return v is None or type(v) is int


# Symbolic sizes. A graph Dynamo captured with dynamic shapes takes each free size symbol as
# a SymInt placeholder (s0) and has tensors of shape (s0, 256); torch.export and make_fx graphs
# have only the tensors. In the e-graph such a size is a sentinel int, one per symbol and one
# per expression of symbols (l*b, for [b, l, d] rows flattened to [b*l, d]): shapes with the
# same size compare equal (so those tensors group), and a rule that only passes a size through
# passes the sentinel, which to_fx turns back into the SymInt placeholder, a sym_size of the
# first input with that size, or FX arithmetic on those for an expression. Sentinels are at
# least SYMBOLIC_MIN, far above any static size, and _SYMBOLIC_STEP apart, so no sum of a
# sentinel and a static size is another sentinel; to_fx refuses any other int that large (a
# size computed from a symbolic one), and from_fx never cuts, splits or unbinds a symbolic dim.
SYMBOLIC_MIN = 2**31
_SYMBOLIC_STEP = 2**21


def _sentinel(k: int) -> int:
    """The sentinel of the k-th symbolic size (k from 0)."""
    return SYMBOLIC_MIN + (k + 1) * _SYMBOLIC_STEP


def size_symbols(gm: fx.GraphModule) -> dict[str, tuple[int, str | tuple[str, int]]]:
    """symbol name -> (sentinel, source) for each plain symbol among the sizes of `gm`'s
    placeholders. The source is a SymInt placeholder's name where there is one (Dynamo lifts
    each free symbol), else (name, dim) of the first tensor placeholder with the symbol as a
    size (torch.export and make_fx graphs), read back with sym_size."""
    lifted, dims = [], []  # (size, source): SymInt placeholders first, no extra node for those
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = _meta_value(n)
            if isinstance(v, torch.SymInt):
                lifted.append((v, n.name))
            else:
                dims += [(d, (n.name, i)) for i, d in enumerate(getattr(v, "shape", ())) if isinstance(d, torch.SymInt)]
    out: dict[str, tuple[int, str | tuple[str, int]]] = {}
    for v, source in lifted + dims:
        expr = getattr(v.node, "expr", None)
        if expr is not None and getattr(expr, "is_Symbol", False) and str(expr) not in out:
            out[str(expr)] = (_sentinel(len(out)), source)
    return out


def has_symbolic_sizes(gm: fx.GraphModule) -> bool:
    """Whether a placeholder's meta value is a SymInt or a tensor with a symbolic size."""
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = _meta_value(n)
            if isinstance(v, torch.SymInt) or any(not isinstance(d, int) for d in getattr(v, "shape", ())):
                return True
    return False


def symbolic_shape(v, symbols: dict[str, tuple[int, object]]) -> tuple[int, ...] | None:
    """v's shape with each size that is one of `symbols` as its sentinel; None if another size
    is symbolic (a symbol no placeholder's size holds, or an expression to_fx cannot compute).
    An expression of known symbols by +, * and // (b*l, 2*s0) gets a sentinel of its own,
    added to `symbols` with the expression as its source."""
    s = getattr(v, "shape", None)
    if s is None:
        return None
    out = []
    for d in s:
        if isinstance(d, int):
            out.append(int(d))
            continue
        expr = getattr(getattr(d, "node", None), "expr", None) if isinstance(d, torch.SymInt) else None
        if expr is None:
            return None
        if getattr(expr, "is_Integer", False):  # a SymInt that is a constant (make_fx)
            out.append(int(expr))
            continue
        # sizes the capture's guards hold equal share one value: an int, or one sentinel
        same = (expr,) if expr.is_Symbol else _guarded_classes(getattr(d.node, "shape_env", None)).get(expr, (expr,))
        k = next((int(e) for e in same if e.is_Integer), None)
        if k is not None:  # an expression the capture guards equal to an int
            out.append(k)
            continue
        sym = next((symbols[str(e)] for e in same if str(e) in symbols), None)
        if sym is None and not expr.is_Symbol:
            source = next((e for e in same if _computable(e, symbols)), None)
            if source is not None:
                sym = (_sentinel(len(symbols)), source)
        if sym is None:
            return None
        for e in same:
            symbols.setdefault(str(e), sym)
        out.append(sym[0])
    return tuple(out)


_GUARDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ShapeEnv -> (guards read, expr -> class)


def _guarded_classes(env) -> dict:
    """expression -> the expressions and ints the guards `Eq(a, b)` of a ShapeEnv hold equal to
    it (itself included, in guard order). The graph only runs where its guards hold, and Dynamo
    guards each equality it relies on: a stack of a chunk piece, ((s27 + 3)//4) wide, and a
    linear's output, 3 wide, adds Eq((s27 + 3)//4, 3); a stack of the first and the last chunk
    piece, Eq(s27 - 3*(((s27 + 3)//4)), ((s27 + 3)//4)). Read as two sizes, rules that derive
    the stack's width both ways would give one tensor two shapes."""
    if env is None:
        return {}
    guards = getattr(env, "guards", None) or []
    seen, classes = _GUARDED.get(env, (0, {}))
    if len(guards) > seen:
        for g in guards[seen:]:
            e = getattr(g, "expr", None)
            if getattr(e, "is_Equality", False) and not all(a.is_Integer for a in e.args):
                a, b = e.args
                joined = tuple(dict.fromkeys(classes.get(a, (a,)) + classes.get(b, (b,))))
                for x in joined:
                    classes[x] = joined
        _GUARDED[env] = (len(guards), classes)
    return classes


def _computable(expr, symbols) -> bool:
    """Whether `expr` is ints and placeholder symbols under +, * and // (what to_fx emits)."""
    from torch.utils._sympy.functions import FloorDiv

    if expr.is_Integer:
        return True
    if expr.is_Symbol:
        return str(expr) in symbols
    return (expr.is_Add or expr.is_Mul or expr.func is FloorDiv) and all(_computable(a, symbols) for a in expr.args)


def check_inputs(gm: fx.GraphModule, example_inputs) -> list:
    """Validate example inputs against the placeholders (count, and shapes where known). Inputs
    left out at the end for placeholders with a default (`forward(self, x, scale=2.0)` traced)
    get the default, as calling the graph gives it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(example_inputs)
    if len(inputs) < len(placeholders) and all(p.args for p in placeholders[len(inputs):]):
        inputs += [p.args[0] for p in placeholders[len(inputs):]]
    if len(inputs) != len(placeholders):
        raise ValueError(
            f"example_inputs has {len(inputs)} values but the graph has {len(placeholders)} "
            f"placeholders ({', '.join(p.name for p in placeholders)}); pass one value per placeholder")
    for p, x in zip(placeholders, inputs):
        want = symbolic_shape(_meta_value(p), {})  # None where a size is symbolic
        if want is not None and isinstance(x, torch.Tensor) and tuple(x.shape) != want:
            raise ValueError(f"example input for placeholder '{p.name}' has shape {tuple(x.shape)}, "
                             f"but the graph was captured with {want}")
    return inputs


_CHECK = "optimus_egg optimized this graph for input"


def is_shape_check(n: fx.Node) -> bool:
    """Is n a check guard_example_shapes inserted? Lowering leaves such checks out (the
    result gets its own), so optimizing an optimized graph does not pile them up."""
    return (n.op == "call_function" and n.target is torch._assert and len(n.args) == 2
            and isinstance(n.args[1], str) and n.args[1].startswith(_CHECK))


def guard_example_shapes(gm: fx.GraphModule, out: fx.GraphModule, inputs: list) -> int:
    """Make `out` (optimized from `gm` for `inputs`) check on entry each input whose shape came
    from the example inputs (a placeholder without a tracer's meta value: symbolic_trace)
    against the example's shape, and each such int or bool input against its value, looking into
    lists, tuples and dicts: the rewrites are made for those sizes (a split's piece sizes, a
    batch's group layout), and at other sizes some would raise deep inside the graph and some
    would compute other values (a narrow of the example's piece length). Each check is a
    `torch._assert` on `x.shape == (...)`, dead code to Inductor, folded by Dynamo and export
    where the size is static. Dynamo and export graphs (meta values on their placeholders) are
    guarded by their tracers. Returns the number of checks inserted."""
    present = {n.args[1] for n in out.graph.nodes if is_shape_check(n)}  # (kept where a part was not lowered)
    ours = [n for n in out.graph.nodes if n.op == "placeholder"]
    theirs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(ours) != len(theirs) or not ours:
        raise RuntimeError("the optimized graph's placeholders differ from the input's")
    g, checks = out.graph, 0
    with g.inserting_before(ours[-1].next):
        for p, q, x in zip(ours, theirs, inputs):
            if "val" in q.meta or "example_value" in q.meta:
                continue
            for path, v in _sized_leaves(x, ()):
                name = str(q.target) + "".join(f"[{k!r}]" for k in path)
                want = tuple(v.shape) if isinstance(v, torch.Tensor) else v
                what = f"shape {want}" if isinstance(v, torch.Tensor) else f"value {want}"
                message = (f"{_CHECK} '{name}' of {what}: optimize it again for other shapes, or capture "
                           "the model with dynamic shapes (torch.compile(..., dynamic=True), torch.export with a Dim)")
                if message in present:
                    continue
                value = p
                for k in path:
                    value = g.call_function(operator.getitem, (value, k))
                if isinstance(v, torch.Tensor):
                    value = g.call_function(getattr, (value, "shape"))
                g.call_function(torch._assert, (g.call_function(operator.eq, (value, want)), message))
                checks += 1
    out.recompile()
    return checks


def _sized_leaves(x, path: tuple):
    """(path, value) of each tensor, int and bool in an input (a bool may set a shape:
    `keepdim`), looking into lists, tuples and dicts."""
    if isinstance(x, torch.Tensor) or type(x) in (int, bool):
        yield path, x
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _sized_leaves(v, (*path, i))
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _sized_leaves(v, (*path, k))


@dataclass(frozen=True)
class Meta:
    """What lowering needs of a value: its static shape, dtype, device and strides."""
    shape: tuple
    dtype: torch.dtype
    device: torch.device
    strides: tuple = ()

    def stride(self) -> tuple:
        return self.strides


def contiguous(v) -> bool:
    """Is tensor value `v` (a tensor, or a Meta with its strides) laid out row-major without
    gaps (dims of size 1 aside), as `Tensor.is_contiguous()` says?"""
    if isinstance(v, torch.Tensor):
        return v.layout == torch.strided and v.is_contiguous()
    if not isinstance(v, Meta) or len(v.strides) != len(v.shape):
        return False
    expected = 1
    for size, stride in zip(reversed(v.shape), reversed(v.strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def rows_strided(v) -> bool:
    """Is tensor value `v` (a tensor, Meta or TensorMetadata) read along its last dim with a
    stride other than 1 (a transposed view, say)? Small GEMMs on such operands loop scalar
    (gemm_loops.py)."""
    shape = getattr(v, "shape", None)
    stride = v.stride() if callable(getattr(v, "stride", None)) else getattr(v, "stride", None)
    if not shape or not stride or len(stride) != len(shape):
        return False
    return type(shape[-1]) is int and shape[-1] > 1 and stride[-1] != 1


def share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do two tensors of one storage (the caller checks that) share an element? Their offsets
    compared exactly; their spans, where their element sizes differ or the storage is over
    2**24 elements (an over-count only where strided pieces interleave). Sizes, strides and
    offsets only: fake tensors too. Where one is symbolic (a dynamic-shape capture's example
    values) no exact answer exists: True, the side the callers keep safe on (optimize keeps a
    graph that writes into shared memory as it is)."""
    if not all(type(v) is int for t in (a, b) for v in (*t.shape, *t.stride(), t.storage_offset())):
        return True
    if a.element_size() != b.element_size() or a.untyped_storage().nbytes() // a.element_size() > 2 ** 24:
        spans = [(t.storage_offset() * t.element_size(),
                  (t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size())
                 for t in (a, b)]
        return spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
    size = a.untyped_storage().nbytes() // a.element_size()
    offsets = [torch.arange(size).as_strided(t.shape, t.stride(), t.storage_offset()).flatten() for t in (a, b)]
    return bool(torch.isin(offsets[0], offsets[1]).any())


def propagate_shapes(gm: fx.GraphModule, inputs: list, mutates: bool) -> dict[fx.Node, Any]:
    """node -> example value (or its Meta) for every node, from meta or by propagation.

    Graphs without mutation run for real under no_grad (fast, and no first-use cost of fake
    tensors); graphs with in-place ops propagate fake tensors so example inputs are untouched.
    `mutates`: whether the graph has in-place ops (from_fx finds them).
    """
    vals = {n: _meta_value(n) for n in gm.graph.nodes}
    if all(v is not None for n, v in vals.items() if n.op != "output"):
        return vals
    env: dict[fx.Node, Any] = {}

    def keep(n, r):
        env[n] = _summary(r)
        return r

    try:
        if mutates:
            from torch._subclasses.fake_tensor import FakeTensorMode

            mode = FakeTensorMode(allow_non_fake_inputs=True)
            fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
            # no_grad as in the real run: with parameters requiring grad, autograd rejects an
            # in-place write into a split piece, which inference (under no_grad) does run.
            # (`_run`, not FakeTensorProp, which writes each value into the node's meta `val`,
            # a body's nodes included: AOT autograd reads those back, and refused to train a
            # shared body's calls, "outs_to_grad length (3) != tangents length (0)".)
            with mode, torch.no_grad():
                _run(gm, fakes, keep)
        else:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # tiny ops: a contended thread pool made this 100x slower
            try:
                with torch.no_grad():
                    _run(gm, inputs, keep)
            finally:
                torch.set_num_threads(threads)
    except Exception as e:  # a shape mismatch surfaces here for untyped graphs
        unreal = [p.name for p, x in zip(gm.graph.find_nodes(op="placeholder"), inputs) if _unreal(x)]
        if unreal:
            raise ValueError(f"example inputs must be real tensors where the graph's nodes have no meta values to "
                             f"read shapes from: placeholder(s) {', '.join(unreal)} got fake or meta tensors "
                             f"({type(e).__name__}: {e})") from e
        raise ValueError(_MISFIT + f"{type(e).__name__}: {e}") from e
    return {n: (vals[n] if vals[n] is not None else env.get(n)) for n in gm.graph.nodes}


_MISFIT = "example inputs do not fit the graph: "


def _unreal(x) -> bool:
    """A FakeTensor or a tensor on the meta device: no values to run a graph on."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor) or (isinstance(x, torch.Tensor) and x.device.type == "meta")


def _summary(r):
    """What lowering keeps of a value: a tensor's Meta, a tuple of the items' summaries
    (lowering reads a tuple's length), or the value itself."""
    if isinstance(r, torch.Tensor):
        return Meta(tuple(r.shape), r.dtype, r.device, tuple(r.stride()))
    if isinstance(r, (tuple, list)) and not isinstance(r, torch.Size):
        return tuple(_summary(x) for x in r)
    return r


# Fewest FX nodes for which shapes are propagated in a forked child while the parent lowers
# the nodes already propagated (`shape_values`) and runs from_fx's `meanwhile` (optimize's rule
# warm-up, ~0.05 s). The fork costs 10-30 ms with torch loaded. On the 10,000-node bench graph
# running the graph takes 0.4-0.7 s and lowering about as long: overlapped, from_fx took 1.75 s
# instead of 2.15 s (means of 5 interleaved runs); on the 1,000-node one, optimize at b = 0.1
# took 0.475 s instead of 0.525 s (medians of 8 interleaved runs).
STREAM_MIN_NODES = 500
_STREAM_BATCH = 256  # values per message from the child


def shape_values(gm: fx.GraphModule, inputs: list, mutates: bool):
    """propagate_shapes(gm, inputs), or on big graphs without in-place ops or meta values,
    the same values streamed from a forked child (`_Streamed`) as it runs the graph."""
    if (mutates or len(gm.graph.nodes) < STREAM_MIN_NODES or not worker.available()
            or any(_meta_value(n) is not None for n in gm.graph.nodes)):
        return _Local(propagate_shapes(gm, inputs, mutates=mutates))
    return _Streamed(gm, inputs)


class _Local(dict):
    """propagate_shapes' values, with _Streamed's `finish` and `stop`: nothing to wait for."""

    def finish(self) -> None:
        pass

    def stop(self) -> None:
        pass


class _Streamed:
    """node -> value summary, as propagate_shapes gives it, filled while a forked child runs
    the graph (one torch thread, no_grad) and sends the summaries of each batch of nodes.
    `get` waits for the node's batch; `finish` waits for the end of the run and raises the
    ValueError propagate_shapes would on inputs that do not fit. If the child dies, the values
    are propagated here instead."""

    def __init__(self, gm: fx.GraphModule, inputs: list):
        self.gm, self.inputs = gm, inputs
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.got: list = []
        self.done = False
        self.local: dict | None = None
        self.child = worker.Worker(self._run_in_child)

    def _run_in_child(self, send) -> None:
        torch.set_num_threads(1)
        batch: list = []

        def keep(n, r):
            batch.append(_summary(r))
            if len(batch) >= _STREAM_BATCH:
                _send_values(send, batch)
                batch.clear()
            return r

        try:
            with torch.no_grad():
                _run(self.gm, self.inputs, keep)
        except Exception as e:  # noqa: BLE001 - the parent raises it as a misfit
            _send_values(send, batch)
            send(("misfit", f"{type(e).__name__}: {e}"))
            return
        _send_values(send, batch)
        send(("done", None))

    def _next(self) -> None:
        try:
            kind, payload = self.child.recv(until=time.perf_counter() + 1e6)
        except worker.WorkerDied:
            self.child.stop()
            self.local = propagate_shapes(self.gm, self.inputs, mutates=False)
            self.done = True
            return
        if kind == "values":
            self.got.extend(payload)
            return
        self.done = True
        self.child.stop()
        if kind == "misfit":
            raise ValueError(_MISFIT + payload)
        if kind == "error":
            raise payload

    def get(self, n: fx.Node, default=None):
        if self.local is not None:
            return self.local.get(n, default)
        i = self.order.get(n)
        if i is None:
            return default
        while i >= len(self.got) and not self.done:
            self._next()
            if self.local is not None:
                return self.local.get(n, default)
        return self.got[i] if i < len(self.got) else default

    def finish(self) -> None:
        while not self.done:
            self._next()

    def stop(self) -> None:
        if not self.done:
            self.done = True
            self.child.stop()


def _send_values(send, batch: list) -> None:
    """send(("values", batch)), with a value pickle cannot take replaced by None."""
    try:
        send(("values", batch))
    except Exception:  # noqa: BLE001
        send(("values", [v if _pickles(v) else None for v in batch]))


def _pickles(v) -> bool:
    try:
        pickle.dumps(v)
        return True
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def state_kept(gm: torch.nn.Module, inputs):
    """`buffers_kept(gm)`, and the random number generators (the CPU's, and each GPU's that
    holds a tensor of `inputs`) given their state back on exit: running a graph with a random
    op (a dropout in training) for its values would move the caller's random stream."""
    cuda = sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda), buffers_kept(gm):
        yield


@contextlib.contextmanager
def buffers_kept(gm: torch.nn.Module):
    """Give every buffer of `gm` (its submodules' too) its value back on exit. Running a graph
    for its values may write the model's state: a call_module BatchNorm in training updates
    its running statistics, and a write into a 0-dim buffer (an exported graph's
    `num_batches_tracked.add_(1)`) runs on the real tensor even under a fake mode, whose
    operands are then all real. Parameters are not copied (a graph writing into one in place
    is changed by running it)."""
    saved = [(mod, name, b, b.detach().clone()) for mod in gm.modules() for name, b in mod._buffers.items()
             if isinstance(b, torch.Tensor)]
    try:
        yield
    finally:
        with torch.no_grad():
            for mod, name, b, value in saved:
                mod._buffers[name] = b
                if b.shape == value.shape and b.dtype == value.dtype:
                    b.copy_(value)
                else:
                    b.set_(value)


def _run(gm: fx.GraphModule, inputs: list, keep) -> None:
    """Run `gm` on `inputs` node by node, calling keep(node, value) for each: fx.Interpreter's
    semantics for plain placeholders, without its per-node bookkeeping (half the time on
    big graphs). A value is dropped after its last use. It runs outside any tracing context:
    inside Dynamo's, an invoke_subgraph call run with a value needing a gradient keeps its
    body there by its identifier, and AOT autograd then compiles that body for every call of
    the identifier, whatever graph it compiles (a candidate optimize() did not return)."""
    with torch._guards.tracing(None):
        _run_here(gm, inputs, keep)


def _run_here(gm: fx.GraphModule, inputs: list, keep) -> None:
    if any(n.op == "placeholder" and n.target.startswith("*") for n in gm.graph.nodes):
        class _Keep(fx.Interpreter):  # varargs placeholders: the Interpreter's rules
            def run_node(self, n):
                return keep(n, super().run_node(n))

        _Keep(gm).run(*inputs)
        return
    last: dict[fx.Node, list[fx.Node]] = defaultdict(list)  # node -> values last used there
    seen: set[fx.Node] = set()
    for n in reversed(gm.graph.nodes):
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                last[n].append(a)
    env: dict[fx.Node, Any] = {}
    load = env.__getitem__
    attrs: dict[str, Any] = {}
    feed = iter(inputs)
    for n in gm.graph.nodes:
        op = n.op
        if op == "placeholder":
            try:
                v = next(feed)
            except StopIteration:
                if not n.args:
                    raise RuntimeError(f"no input for placeholder {n.name}") from None
                v = n.args[0]
        elif op == "output":
            return
        elif op == "get_attr":
            v = attrs.get(n.target)
            if v is None:
                v = attrs[n.target] = _fetch(gm, n.target)
        else:
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), load)
            if op == "call_function":
                v = n.target(*args, **kwargs)
            elif op == "call_method":
                v = getattr(args[0], n.target)(*args[1:], **kwargs)
            else:
                mod = attrs.get(n.target)
                if mod is None:
                    mod = attrs[n.target] = _fetch(gm, n.target)
                v = mod(*args, **kwargs)
        env[n] = v
        keep(n, v)
        for a in last.get(n, ()):
            env.pop(a, None)


def _fetch(gm: fx.GraphModule, target: str):
    obj = gm
    for atom in target.split("."):
        if not hasattr(obj, atom):
            raise RuntimeError(f"node target {target!r} does not exist")
        obj = getattr(obj, atom)
    return obj
