"""Compile with Inductor, count kernel launches honestly, and time things.

This module owns the measuring stick every comparison uses: ``compile_inductor`` (Inductor
with all caches off, so every arm pays for and runs its own passes), ``count_launches``
(kernel launches read from the generated wrapper code, because
``torch._inductor.metrics.generated_kernel_count`` is inflated on CPU), wall-clock helpers
(``median_ms``, ``interleaved_medians``), ``peak_rss_mb`` and ``values_match``. On a CUDA
device, ``profiled_kernel_launches`` counts the kernels a call really launched, with
``torch.profiler``: a second count next to the static one below (a cuBLAS GEMM may launch
more than one kernel; the static count sees one call site).

A launch is a call site, inside the wrapper's runtime functions, of

* ``extern_kernels.*`` (mm, addmm, bmm, baddbmm, convolution ...)         -> ``extern``
* a C++ kernel the wrapper compiled (``cpp_fused_* = async_compile.cpp_pybinding(...)``)
                                                                           -> ``cpp``
* a Triton kernel (``triton_poi_fused_0 = async_compile.triton(...)``, called with
  ``.run(``; other GPU code generators are counted here too)               -> ``triton``
* an ATen / custom op the wrapper calls directly (``aten.*``, ``torch.ops.*``) or an
  eager in-place fill/copy on a buffer (``buf.copy_(...)``)                 -> ``fallback``

Views (``reinterpret_tensor``, ``as_strided``, ``aten.view``), allocations, asserts,
``del`` and ``resize_`` are not launches. The runtime functions are ``call`` and every other
function in the wrapper (graph partitions, control-flow subgraphs) except the benchmark
helpers ``get_args`` and ``benchmark_compiled_module``. Counts are static: a call site in a
loop counts once.
"""

from __future__ import annotations

import ast
import copy
import operator
import random
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from optimus_egg.shapes import is_shape_check, share_elements

__all__ = [
    "Launches",
    "count_launches",
    "Compiled",
    "compile_inductor",
    "copy_graph_module",
    "kernel_launches",
    "profiled_kernel_launches",
    "median_ms",
    "interleaved_medians",
    "peak_rss_mb",
    "values_match",
    "aliased_outputs",
]


@dataclass(frozen=True)
class Launches:
    """Kernel launches per call of a compiled graph, by kind."""

    extern: int = 0
    cpp: int = 0
    triton: int = 0
    fallback: int = 0

    @property
    def total(self) -> int:
        return self.extern + self.cpp + self.triton + self.fallback

    def __add__(self, other: "Launches") -> "Launches":
        return Launches(
            self.extern + other.extern,
            self.cpp + other.cpp,
            self.triton + other.triton,
            self.fallback + other.fallback,
        )

    def __str__(self) -> str:
        return (
            f"{self.total} launches (extern {self.extern}, cpp {self.cpp}, "
            f"triton {self.triton}, fallback {self.fallback})"
        )


_HELPER_FUNCTIONS = frozenset({"get_args", "benchmark_compiled_module"})

# ATen ops that only make views or allocate; the wrapper may call these without launching.
_NON_LAUNCH_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "as_strided",
        "_reinterpret_tensor",
        "alias",
        "expand",
        "permute",
        "t",
        "transpose",
        "squeeze",
        "unsqueeze",
        "select",
        "slice",
        "narrow",
        "detach",
        "unbind",
        "split",
        "split_with_sizes",
        "empty",
        "empty_strided",
        "resize_",
        "set_",
        "_alloc_from_pool",
    }
)

# Eager in-place methods the wrapper calls on buffers; each is one kernel.
_BUFFER_METHOD_LAUNCHES = frozenset({"copy_", "zero_", "fill_"})


def _dotted(expr: ast.expr) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def _kernel_kinds(tree: ast.Module) -> dict[str, str]:
    """Module-level ``name = async_compile.<how>(...)`` definitions -> "cpp" / "triton"."""
    kinds: dict[str, str] = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
            continue
        callee = _dotted(stmt.value.func) or ""
        if not callee.startswith("async_compile."):
            continue
        how = callee.split(".", 1)[1]
        kind = "cpp" if how.startswith("cpp") else "triton"
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                kinds[target.id] = kind
    return kinds


def _op_name(dotted: str) -> str | None:
    """``aten.mm.default`` / ``torch.ops.aten.mm`` -> ``mm``; None if not an op call."""
    parts = dotted.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    if parts[:2] == ["torch", "ops"] and len(parts) >= 4:
        return parts[3]
    return None


def _classify(call: ast.Call, kernels: Mapping[str, str]) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return kernels.get(func.id)
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, ast.Name) and func.value.id in kernels:
        return kernels[func.value.id] if func.attr == "run" else None
    dotted = _dotted(func)
    if dotted is None:
        return None
    if dotted.startswith("extern_kernels."):
        return "extern"
    op = _op_name(dotted)
    if op is not None:
        return None if op in _NON_LAUNCH_OPS else "fallback"
    if func.attr in _BUFFER_METHOD_LAUNCHES and isinstance(func.value, ast.Name):
        return "fallback"
    return None


def count_launches(code: str) -> Launches:
    """Count kernel launches in one Inductor-generated Python wrapper module.

    Raises ValueError for code that is not Python (e.g. ``cpp_wrapper=True`` output).
    """
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ValueError(f"not a Python wrapper module: {e}") from e
    kernels = _kernel_kinds(tree)
    own: dict[str, Launches] = {}       # function name -> the launches its own body makes
    callees: dict[str, list[str]] = {}  # function name -> the module's functions it calls, per call
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name in _HELPER_FUNCTIONS:
            continue
        counts = {"extern": 0, "cpp": 0, "triton": 0, "fallback": 0}
        calls = callees.setdefault(fn.name, [])
        # Nested functions are visited on their own, so walk only this function's body.
        for node in _walk_body(fn):
            if isinstance(node, ast.Call):
                kind = _classify(node, kernels)
                if kind is not None:
                    counts[kind] += 1
                elif isinstance(node.func, ast.Name):
                    calls.append(node.func.id)
        own[fn.name] = own.get(fn.name, Launches()) + Launches(**counts)
    # A subgraph the wrapper defines once and calls per use (invoke_subgraph's
    # `repeated_subgraph0`) launches its kernels on every call.
    called = {c for cs in callees.values() for c in cs if c in own}

    def total(name: str, seen: frozenset = frozenset()) -> Launches:
        out = own[name]
        for c in callees[name]:
            if c in own and c not in seen:
                out = out + total(c, seen | {name})
        return out

    return sum((total(f) for f in own if f not in called), Launches())


def _walk_body(fn: ast.FunctionDef) -> Iterable[ast.AST]:
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


@dataclass
class Compiled:
    """An Inductor-compiled graph: call ``fn(*example_inputs)``."""

    fn: Callable[..., Any]
    code: str
    compile_s: float
    launches: Launches
    codes: list[str] = field(default_factory=list)

    def __call__(self, *inputs: Any) -> Any:
        return self.fn(*inputs)


# Targets that only make views: a graph of these (or no calls at all) needs no kernel.
VIEW_TARGETS = {
    operator.getitem, torch.split, torch.functional.split, torch.unbind, torch.flatten,
    torch.unflatten, torch.movedim, torch.permute, torch.squeeze, torch.unsqueeze,
    torch.transpose, torch.reshape, torch.narrow, torch.select,
    "split", "unbind", "view", "reshape", "flatten", "unflatten", "movedim", "permute",
    "squeeze", "unsqueeze", "transpose", "narrow", "select",
}


def only_views(gm: fx.GraphModule) -> bool:
    """Whether every call in `gm` only makes a view (VIEW_TARGETS) or checks an input's shape
    (shapes.guard_example_shapes, folded away by tracing): Inductor emits no code for such a
    graph, honestly 0 launches."""
    checks: set[fx.Node] = set()  # the checks and what only they read
    for n in reversed(gm.graph.nodes):
        if is_shape_check(n) or (n.op != "placeholder" and n.users and all(u in checks for u in n.users)):
            checks.add(n)
    return all(n.target in VIEW_TARGETS for n in gm.graph.nodes
               if n.op in ("call_function", "call_method", "call_module") and n not in checks)


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule over a deep copy of ``gm``'s graph (node meta copied shallowly) and
    ``gm.meta``; weights and submodules are shared, not copied."""
    with warnings.catch_warnings():
        # Deep-copying a Dynamo-export graph's pytree codegen trips a torch-internal
        # deprecation warning (LeafSpec) that says nothing about our code.
        warnings.simplefilter("ignore", FutureWarning)
        graph = copy.deepcopy(gm.graph)
    out = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    out.meta.update(gm.meta)
    return out


def _backward_seed(out: Any) -> torch.Tensor | None:
    leaves = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    if not leaves:
        return None
    return sum(t.sum() for t in leaves)


def _tensors(x: Any) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def compile_inductor(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    training: bool = False,
    config_patches: Mapping[str, Any] | None = None,
    backward_config_patches: Mapping[str, Any] | None = None,
) -> Compiled:
    """Compile ``gm`` with Inductor (caches off), run it once, and count its launches.

    ``example_inputs`` are exactly what ``gm`` takes, lifted parameters included for
    Dynamo backend graphs. Inference (default) compiles and runs under ``torch.no_grad``;
    with ``training`` the forward runs with grad and one backward (of the sum of the
    outputs) runs too, so the lazily compiled backward is captured and counted as well;
    its ``compile_s`` includes that first backward call, and it leaves ``.grad`` on the
    parameters. Inductor options: ``gm.meta["inductor_config_patches"]`` (set by
    ``baselines.inductor_with_optimus``), then ``config_patches``; for the backward graph only,
    ``gm.meta["inductor_backward_config_patches"]`` (set by the bench for the optimus_egg
    arms, as the backend compiles), then ``backward_config_patches``. With
    ``gm.meta["hoist_parameters"]`` (``baselines.as_backend_compiles``) an inference graph's
    parameter copies are computed once (``hoist.compile_hoisted``), as the backend does: the
    launches and code are then the rest's. ``gm`` is not changed.
    """
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code

    from optimus_egg import hoist
    from optimus_egg.baselines import backward_patched

    patches: dict[str, Any] = {"force_disable_caches": True, "fx_graph_cache": False}
    patches.update(gm.meta.get("inductor_config_patches", {}))
    patches.update(config_patches or {})
    backward = {**gm.meta.get("inductor_backward_config_patches", {}), **(backward_config_patches or {})}
    inputs = list(example_inputs)
    # compile_fx runs pre-grad passes in place; compile a copy so callers keep their graph.
    model = copy_graph_module(gm)
    timing: dict[str, float] = {}

    def compile_(g: fx.GraphModule, xs: list[Any]) -> Callable[..., Any]:
        return compile_fx(g, xs, inner_compile=backward_patched(backward)) if backward else compile_fx(g, xs)

    def build_and_run() -> Callable[..., Any]:
        with config.patch(patches), torch.set_grad_enabled(training):
            start = time.perf_counter()
            compiled = None
            if gm.meta.get("hoist_parameters") and not hoist.grads_needed(model, inputs):
                compiled = hoist.compile_hoisted(model, inputs, compile_)
            if compiled is None:
                compiled = compile_(model, inputs)
            timing["compile_s"] = time.perf_counter() - start
            out = compiled(*inputs)
            if training and (seed := _backward_seed(out)) is not None:
                start = time.perf_counter()
                seed.backward()
                timing["compile_s"] += time.perf_counter() - start
        return compiled

    compiled, codes = run_and_get_code(build_and_run)
    if not codes and not only_views(gm):
        raise RuntimeError("Inductor produced no wrapper code for a graph that computes (was a cache hit?)")
    # (a graph that only returns its inputs or views of them compiles to no code: it launches nothing)
    launches = sum((count_launches(c) for c in codes), Launches())

    if training:
        fn = compiled
    else:

        def fn(*args: Any) -> Any:
            with torch.no_grad():
                return compiled(*args)

    return Compiled(
        fn=fn,
        code="\n\n".join(codes),
        compile_s=timing["compile_s"],
        launches=launches,
        codes=list(codes),
    )


def kernel_launches(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    training: bool = False,
    config_patches: Mapping[str, Any] | None = None,
) -> Launches:
    """Launches of ``gm`` compiled by Inductor (``compile_inductor(...).launches``)."""
    return compile_inductor(
        gm, example_inputs, training=training, config_patches=config_patches
    ).launches


def _count_device_kernels(events: Iterable[Any]) -> int:
    """Device kernels among profiler events (``prof.events()``, FunctionEvent-like objects).

    A kernel is an event on a CUDA device whose Kineto activity type is ``"kernel"``; CPU
    ops, CUDA runtime calls (``cudaLaunchKernel``, on the CPU side), ``"gpu_memcpy"``,
    ``"gpu_memset"`` and ``"gpu_user_annotation"`` events are not counted.
    """
    from torch.autograd import DeviceType

    return sum(1 for e in events if e.device_type == DeviceType.CUDA and e.activity_type == "kernel")


def profiled_kernel_launches(fn: Callable[..., Any], inputs: Sequence[Any], warmup: int = 2) -> int:
    """CUDA kernels one call of ``fn(*inputs)`` launches, counted by ``torch.profiler``.

    ``fn`` runs ``warmup`` times first (lazy compiles, autotuning, allocator growth), then
    once under the profiler (CPU and CUDA activities). Raises RuntimeError without CUDA: on
    CPU there is nothing to count this way (use ``count_launches``).
    """
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError("profiled_kernel_launches needs a CUDA device (torch.cuda.is_available() is False)")
    for _ in range(warmup):
        fn(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    return _count_device_kernels(prof.events())


def _sync(inputs: Sequence[Any]) -> Callable[[], None]:
    if torch.cuda.is_available() and any(
        isinstance(t, torch.Tensor) and t.is_cuda for t in _tensors(list(inputs))
    ):
        return torch.cuda.synchronize
    return lambda: None


def _time_once(fn: Callable[..., Any], inputs: Sequence[Any], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn(*inputs)
    sync()
    return (time.perf_counter() - start) * 1e3


def median_ms(
    fn: Callable[..., Any], inputs: Sequence[Any], reps: int = 50, warmup: int = 5
) -> float:
    """Median wall-clock milliseconds of ``fn(*inputs)`` over ``reps`` calls."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    sync = _sync(inputs)
    for _ in range(warmup):
        fn(*inputs)
    sync()
    return statistics.median(_time_once(fn, inputs, sync) for _ in range(reps))


def interleaved_medians(
    fns: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Any],
    rounds: int = 50,
    warmup: int = 3,
) -> dict[str, float]:
    """Median milliseconds per arm, timing one call of every arm per round.

    Each round runs the arms in an order shuffled for that round (seeded: the same orders on
    every run), so drift in machine load (frequency scaling, other processes) lands on all
    arms alike and no arm always runs after the same other arm. A fixed cyclic order did that,
    and the arm before leaves the caches its own way: of two arms compiling one identical
    graph, the one after Optimus's arm ran 3-4 % slower than its twin on mmoe (training).
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    names = list(fns)
    order = random.Random(0)
    sync = _sync(inputs)
    for name in names:
        for _ in range(warmup):
            fns[name](*inputs)
    sync()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            samples[name].append(_time_once(fns[name], inputs, sync))
    return {name: statistics.median(s) for name, s in samples.items()}


def peak_rss_mb() -> float:
    """Peak resident set size so far, in MiB: this process's plus its largest finished child's.

    optimize's search runs in a forked worker; the sum bounds the memory both held (it counts
    pages the child shares with this process twice)."""
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    # Linux reports KiB, macOS bytes.
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def values_match(a: Any, b: Any, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = False) -> bool:
    """Whether two (nested) outputs are equal under ``torch.testing.assert_close``.

    Tuples and lists compare alike (compiled graphs may return a list where eager returns
    a tuple); dicts compare by key. Give both tolerances or neither (dtype defaults);
    ``equal_nan`` counts NaN equal to NaN.
    """
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(values_match(x, y, rtol, atol, equal_nan) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_match(a[k], b[k], rtol, atol, equal_nan) for k in a)
    if a is None or b is None:
        return a is b
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False
    try:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def rounds_no_worse(got: Any, exact: Any, *references: Any, factor: float = 3.0, noise_factor: float = 100.0) -> bool:
    """Whether a low-precision run's (nested) outputs `got` are as close to `exact` (the same
    model computed in float64) as the `references` (runs of the model in the same dtype: eager,
    plain Inductor), allowing for rounding in another order: per tensor, the distance from
    `exact` (L2) at most `factor` times the farthest reference's, or where that is less, the
    distance of `exact` rounded once to `got`'s dtype (no run can do better). Two compiles of
    one model round at different points (what a fused kernel keeps in float32, eager stores
    rounded): in bfloat16, gradients of plain Inductor's training step were up to 4 x further
    from float64's than eager's (dcn_v2), while a wrong value is off by its own size. The
    floor is one rounding of the whole tensor, not a step per element: a second rounding (a
    bias added after its GEMM's result is rounded) is about that size. A tensor every reference is as far from as its
    own size (a gradient that is zero but for rounding: interformer's score biases, |exact|
    1e-17, eager's 2e-5 off) holds rounding noise only, whose size varies with the order of
    the sums (17 x apart between two compiles there): the bound is then `noise_factor` times
    the farthest reference's distance, which still fails a value off by orders of magnitude.
    Elements whose exact value is finite but past the dtype's range, or that every reference
    lost to inf or NaN on the way (an overflow before the last op), are not compared: the runs
    in that dtype cannot compute them (a float16 program whose sums reached 1e6 gave inf and NaN
    in optimus_egg and NaN in eager and plain Inductor). The rest of the tensor is, as if they
    were not there.
    Non-tensor leaves must be equal; a NaN not in `exact` fails."""
    leaves = [tree_leaves(x) for x in (got, exact, *references)]
    if len({len(x) for x in leaves}) != 1:
        return False
    for g, x, *refs in zip(*leaves):
        if not isinstance(g, torch.Tensor):
            if g != x:
                return False
            continue
        if not isinstance(x, torch.Tensor) or g.shape != x.shape or not all(isinstance(r, torch.Tensor) for r in refs):
            return False
        if not g.numel():
            continue
        if not g.is_floating_point():
            if not torch.equal(g, x.to(g.dtype)):
                return False
            continue
        x = x.double()
        lost = ~x.to(g.dtype).isfinite()  # past the dtype's range ...
        if refs:  # ... or lost on the way (an overflow before the last op) in every reference
            lost = lost | torch.stack([~r.isfinite() for r in refs]).all(0)
        held = ~(x.isfinite() & lost)
        if not held.all():
            g, x, refs = g[held], x[held], [r[held] for r in refs]
            if not g.numel():
                continue
        rounded = float((x.to(g.dtype).double() - x).norm())
        off = [float((r.double() - x).norm()) for r in refs]
        noise = bool(off) and min(off) >= float(x.norm())
        bound = max((noise_factor if noise else factor) * max(off, default=0.0), rounded)
        if not float((g.double() - x).norm()) <= bound:
            return False
    return True


def aliased_outputs(outputs: Any, inputs: Sequence[Any]) -> int:
    """How many output tensors share memory (an element) with an input tensor or an earlier
    output: a caller writing into one in place writes into the other. Pieces of one buffer
    that do not overlap (an unbind's items) do not count. Eagerly a model's computed outputs
    are fresh tensors; a rewrite that returns an input's view in place of one (Optimus's
    split-cat passes do) changes that (optimus_egg copies such an output:
    pipeline.copy_new_aliases)."""
    seen = [t for t in tree_leaves(list(inputs)) if isinstance(t, torch.Tensor) and t.numel()]
    count = 0
    for t in tree_leaves(outputs):
        if isinstance(t, torch.Tensor) and t.numel():
            count += any(_share_memory(t, o) for o in seen)
            seen.append(t)
    return count


def _share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do two tensors share an element of memory (one storage: shapes.share_elements)?"""
    if a.device != b.device or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    return share_elements(a, b)
