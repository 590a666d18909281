"""The benchmark suite shared by `optimus-egg compare` / `optimus-egg bench` and bench/*.py.

`run_model(name, budgets)` runs one model of the zoo (optimus_egg.models) side by side, in one
process, under these arms and returns one row (a dict, see `COLUMNS`) per arm:

* ``inductor``           plain Inductor (caches off)
* ``optimus``            Inductor + PyTorch's Optimus (baselines.inductor_with_optimus; its
                         post-grad ATen passes too when training)
* ``optimus_egg@<b>s``   optimus_egg.optimize at budget b seconds, then Inductor with the
                         post-grad Optimus passes, as the torch.compile backend runs it
                         (backend.py: they batch the backward optimus_egg never sees)
* ``greedy_rules``       the ablation: optimus_egg's own rules applied greedily, one family
                         at a time, no e-graph search (``ablation.rewrite_greedily``): each
                         family in SCHEDULE_ORDER gets one round and its extraction is
                         committed before the next family runs, passes repeating until
                         nothing changes. Its optimize_s is the whole ablation's time; its
                         report columns sum the steps (see ``ablation.GreedyReport``);
                         compiled like optimus_egg.

Every arm compiles with ``measure.compile_inductor`` (after one uncounted warm-up compile of
a tiny graph per process, so the first arm does not pay Inductor's start-up) and is checked
against eager (outputs;
gradients of every parameter too when training). Latency is the median of interleaved
rounds (``measure.interleaved_medians``); training arms time forward + sum + backward.
The whole run uses ONE torch thread (``torch.set_num_threads(1)``), compile included (the
C++ kernels Inductor writes take their OpenMP thread count from it): on a small shared
machine two threads under load made a small graph 100x slower, so single-thread figures are
the only ones comparable from run to run.

``peak_rss_mb`` is the process's high-water mark after the arm (monotonic within a run);
bench/budget_sweep.py measures optimize's memory honestly in fresh subprocesses.

``device="cuda"`` builds the model and its inputs on the CPU as usual, moves both to the GPU,
then traces, optimizes and compiles there (Inductor writes Triton kernels). Launches are
then counted twice: in the generated wrapper code as on CPU (``launches``), and as the CUDA
kernels one timed call really launched (``profiled_launches``, torch.profiler; blank on
CPU). Results go to ``<model>[_train]_cuda.csv`` next to the CPU ones.

``dtype="bfloat16"`` (or ``"float16"``) converts the model's parameters and floating inputs
before tracing. Eager in that dtype rounds differently from any compile, so each arm's
values (and gradients) are checked against the same model run in float64 from the rounded
weights: no further from those than three times eager's or plain Inductor's distance, the
farther, or than the float64 values rounded once (``measure.rounds_no_worse``; plain
Inductor's arm is thus a reference itself). Results go to ``<model>[_train]_bf16.csv`` (``_fp16``).
"""
from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import torch
import torch.fx as fx

from optimus_egg.extract.launch_cost import graph_table
from optimus_egg.measure import _tensors

__all__ = [
    "COLUMNS",
    "DEVICES",
    "DTYPES",
    "GREEDY_RULES",
    "default_models",
    "BIG_MODEL",
    "check_device",
    "device_info",
    "device_of",
    "dtype_of",
    "run_model",
    "run_optimize_only",
    "print_table",
    "result_stem",
    "write_results",
    "read_results",
    "markdown_table",
    "update_readme",
    "plot",
    "spearman",
    "predicted_launches",
    "fx_shapes",
    "family_of",
]

GREEDY_RULES = "greedy_rules"
BIG_MODEL = "illustrative_10k"
README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
VALUE_TOL = dict(rtol=1e-4, atol=1e-4)
GRAD_TOL = dict(rtol=1e-3, atol=1e-4)

DEVICES = ("cpu", "cuda")
DTYPES = {"float32": "", "bfloat16": "bf16", "float16": "fp16"}  # name -> results-file suffix

COLUMNS = [
    "family", "model", "mode", "device", "device_name", "dtype", "arm", "budget", "fx_nodes",
    "launches", "extern", "kernels", "profiled_launches", "pred_launches",
    "optimize_s", "compile_s", "total_compile_s", "median_ms", "ratio", "launch_ratio",
    "peak_rss_mb", "egraph_nodes", "iterations", "stop_reason", "cost_before", "cost_after",
    "changed", "values_match", "grads_match", "rule_counters", "threads", "rounds",
]


def family_of(model: str) -> str:
    """``illustrative_1k`` -> ``illustrative``; other zoo names are their own family."""
    return re.sub(r"_\d+k$", "", model)


def default_models() -> list[str]:
    """Every zoo model except illustrative_10k (whose Inductor compiles take minutes)."""
    from optimus_egg.models import MODELS

    return [m for m in MODELS if m != BIG_MODEL]


def check_device(device: str) -> None:
    """Raise ValueError unless ``device`` is "cpu", or "cuda" on a machine where CUDA works."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ValueError(f"device 'cuda' asked for, but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}, {build})")


def check_dtype(dtype: str) -> None:
    """Raise ValueError unless ``dtype`` names one of DTYPES."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def device_info(device: str) -> dict[str, Any]:
    """What a run on ``device`` ran on, for the results' JSON: the GPU, CUDA and Triton on cuda."""
    info: dict[str, Any] = {"device": device}
    if device == "cuda":
        import triton

        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda, triton=triton.__version__,
                    gpu_count=torch.cuda.device_count())
    return info


@contextmanager
def one_thread():
    """torch.set_num_threads(1) for the duration; restores the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- helpers


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach(y) for y in x) if isinstance(x, list) else tuple(_detach(y) for y in x)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


def _seed(out: Any) -> torch.Tensor | None:
    leaves = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    return sum(t.sum() for t in leaves) if leaves else None


def _train_step(fn: Callable[..., Any], params: list[torch.nn.Parameter]) -> Callable[..., Any]:
    """forward, sum of the outputs, backward (gradients reset first so nothing accumulates)."""

    def step(*inputs: Any) -> Any:
        for p in params:
            p.grad = None
        out = fn(*inputs)
        seed = _seed(out)
        if seed is not None:
            seed.backward()
        return out

    return step


def _run_and_grads(fn, inputs, params: dict[str, torch.nn.Parameter], train: bool):
    """Outputs (detached) and, when training, {param name: grad} after one backward."""
    if not train:
        with torch.no_grad():
            return _detach(fn(*inputs)), {}
    for p in params.values():
        p.grad = None
    with torch.enable_grad():
        out = fn(*inputs)
        seed = _seed(out)
        if seed is not None:
            seed.backward()
    grads = {k: p.grad.detach().clone() for k, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    return _detach(out), grads


def exact_reference(model: torch.nn.Module, inputs: Sequence[Any], train: bool):
    """`model`'s outputs and gradients (`_run_and_grads`) computed in float64 from its own
    (rounded) parameters and inputs: what a low-precision run is measured against."""
    import copy

    exact = copy.deepcopy(model).double()
    wide = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    return _run_and_grads(exact, wide, dict(exact.named_parameters()), train)


def traced_with_reference(name: str, train: bool, dtype: str = "float32"):
    """A bench model in `train` mode (and `dtype`: its parameters and floating inputs), its
    symbolic_trace graph (same mode), its parameters, and its eager outputs and gradients
    (`_run_and_grads`): (model, inputs, gm, params, expected, expected_grads)."""
    from optimus_egg.models import build

    check_dtype(dtype)
    model, inputs = build(name)
    model.train(train)
    if dtype != "float32":  # (the zoo builds in float32)
        model.to(getattr(torch, dtype))
        inputs = tuple(x.to(getattr(torch, dtype)) if x.is_floating_point() else x for x in inputs)
    gm = fx.symbolic_trace(model)
    gm.train(train)
    params = dict(model.named_parameters())
    expected, expected_grads = _run_and_grads(model, inputs, params, train)
    return model, inputs, gm, params, expected, expected_grads


def matches_eager(fn, inputs, params: dict, expected, expected_grads: dict, train: bool, exact=None,
                  plain=None) -> bool:
    """Whether `fn`'s values (and, when training, every parameter's gradient) equal the eager
    reference of `traced_with_reference` (in a low precision: as `check_values` measures them
    against `exact`, from `exact_reference`, and plain Inductor's run `plain`)."""
    got, grads = _run_and_grads(fn, inputs, params, train)
    match, gmatch = check_values(got, grads, expected, expected_grads, train, exact, plain)
    return match and (not train or gmatch)


def check_values(got, grads: dict, expected, expected_grads: dict, train: bool, exact=None,
                 plain=None) -> tuple[bool, Any]:
    """(values match, gradients match or "" when not training) of an arm's run against eager's:
    equal within VALUE_TOL / GRAD_TOL, or, given `exact` (float64 outputs and gradients of a
    low-precision model, `exact_reference`), no further from those than eager's and plain
    Inductor's (`plain`: its outputs and gradients, where measured) allow
    (`measure.rounds_no_worse`)."""
    from optimus_egg.measure import rounds_no_worse, values_match

    if exact is None:
        match = values_match(got, expected, **VALUE_TOL)
        if not train:
            return match, ""
        return match, grads.keys() == expected_grads.keys() and all(
            values_match(grads[k], expected_grads[k], **GRAD_TOL) for k in expected_grads)
    refs = [(expected, expected_grads)] + ([plain] if plain is not None else [])
    exact_out, exact_grads = exact
    match = rounds_no_worse(got, exact_out, *(out for out, _ in refs))
    if not train:
        return match, ""
    return match, grads.keys() == exact_grads.keys() and all(k in g for _, g in refs for k in exact_grads) and all(
        rounds_no_worse(grads[k], exact_grads[k], *(g[k] for _, g in refs)) for k in exact_grads)


def _fmt_counters(counts: dict[str, int]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(counts.items()) if v)


def _optimus_counter_names() -> set[str]:
    from optimus_egg.baselines import OPTIMUS_POST_GRAD, OPTIMUS_PRE_GRAD

    return set(OPTIMUS_PRE_GRAD) | set(OPTIMUS_POST_GRAD)


def predicted_launches(gm: fx.GraphModule, inputs: Sequence[Any], gemm_loops: bool = False,
                       hoisted: bool = False) -> float:
    """Launches the cost model predicts for ``gm`` as written: the whole-graph estimate with
    Inductor's fusion (extract/fusion_cost.py), given the shapes of one run on ``inputs``
    (compiled with small GEMMs as loops where ``gemm_loops``: launch_cost.LOOPS; with its
    parameter copies computed once where ``hoisted``: hoist.py). NaN if the graph cannot be read."""
    from optimus_egg.extract.fusion_cost import fused_launches
    from optimus_egg.hoist import plan

    try:
        table = graph_table(gm, inputs, gemm_loops)
        shape_of, strided_of = fx_layouts(gm, inputs)
        once = plan(gm, inputs) if hoisted else None
        return float(fused_launches(gm, shape_of, table, strided_of, once.nodes if once else ()))
    except Exception:  # noqa: BLE001 - an unreadable graph has no prediction
        return math.nan


def fx_shapes(gm: fx.GraphModule, inputs: Sequence[Any]):
    """node -> its tensor shape (None where it is not one), as from_fx propagates them
    (shapes.propagate_shapes), run on copies of ``inputs`` with the random state and the
    model's buffers restored."""
    return fx_layouts(gm, inputs)[0]


def fx_layouts(gm: fx.GraphModule, inputs: Sequence[Any]):
    """`fx_shapes` and, from the same run, node -> are its value's rows strided
    (shapes.rows_strided): fused_launches' `shape_of` and `strided_of`."""
    from optimus_egg.shapes import propagate_shapes, rows_strided, state_kept

    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    with state_kept(gm, copies):
        values = propagate_shapes(gm, copies, mutates=False)
    return (lambda n: getattr(values.get(n), "shape", None)), (lambda n: rows_strided(values.get(n)))


def _outcome(report) -> str:
    """What the stop column adds: the input came back, or (the ablation's report, one per
    family step) one of its steps' did."""
    step = "a step " if hasattr(report, "steps") else ""
    if report.fallback:
        return f" ({step}fell back)" if step else " (fallback)"
    if report.kept_input:
        return f" ({step}kept its input)" if step else " (kept the input)"
    return ""


def _report_fields(report) -> dict[str, Any]:
    if report is None:
        return dict(egraph_nodes="", iterations="", stop_reason="", cost_before="", cost_after="", changed="")
    return dict(
        egraph_nodes=report.egraph_nodes,
        iterations=report.iterations,
        stop_reason=report.stop_reason + _outcome(report),
        cost_before=round(report.cost_before, 3),
        cost_after=round(report.cost_after, 3),
        changed=report.changed,
    )


def _budget_label(b: float) -> str:
    return f"{b:g}"


def egg_arm(b: float) -> str:
    return f"optimus_egg@{_budget_label(b)}s"


# --------------------------------------------------------------------------- the suite

_WARM: set[tuple[bool, str]] = set()


def warm_up_inductor(train: bool, device: str = "cpu") -> float:
    """Compile a tiny graph once per process (and mode and device), uncounted, so that the
    first arm does not pay Inductor's one-off start-up (imports, compile workers, first C++
    or Triton build: about 5 s here) and compile times compare fairly. Returns the seconds
    spent (0 if warm)."""
    from optimus_egg.measure import compile_inductor

    if (train, device) in _WARM:
        return 0.0

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(torch.cat([torch.tanh(self.a(x)), torch.relu(self.b(x))], 1))

    t = time.perf_counter()
    tiny = Tiny().train(train).to(device)
    compile_inductor(fx.symbolic_trace(tiny), [torch.randn(4, 8, device=device)], training=train)
    for p in tiny.parameters():
        p.grad = None
    _WARM.add((train, device))
    return time.perf_counter() - t



@dataclass
class _Arm:
    name: str
    budget: str
    graph: fx.GraphModule
    optimize_s: float
    report: Any = None
    counters: dict | None = None
    gemm_loops: bool = False  # optimized and compiled for small GEMMs as loops


def run_model(
    name: str,
    budgets: Sequence[float] = (1.0,),
    train: bool = False,
    rounds: int = 30,
    *,
    arms: Sequence[str] | None = None,
    predict: bool = True,
    out: TextIO | None = None,
    quiet: bool = False,
    model_kw: dict | None = None,
    device: str = "cpu",
    gemm_loops: bool = True,
    dtype: str = "float32",
) -> list[dict]:
    """Run model ``name`` under every arm, one process, and return one row per arm.

    ``arms`` picks a subset of ``("inductor", "optimus", "optimus_egg", "greedy_rules")``
    (default all; the ratio column needs "inductor"). ``predict`` adds the
    cost model's prediction (``pred_launches``) for each arm's graph. Progress goes to
    ``out`` (default: sys.stdout at call time) unless ``quiet``. ``device`` is "cpu" or
    "cuda" (ValueError when CUDA is not available); on cuda each arm's timed call is also
    profiled (``profiled_launches``). The optimus_egg and greedy-rules arms are optimized and
    compiled as the backend does, with its ``gemm_loops`` (default) or without. ``dtype``
    (one of DTYPES) is the model's and its floating inputs' (module doc: how values are checked).
    """
    from optimus_egg import measure
    from optimus_egg.ablation import rewrite_greedily
    from optimus_egg.baselines import as_backend_compiles, inductor_with_optimus
    from optimus_egg.models import build
    from optimus_egg.pipeline import optimize
    from torch._dynamo.utils import counters as dynamo_counters

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=out or sys.stdout, flush=True)

    wanted = set(arms or ("inductor", "optimus", "optimus_egg", GREEDY_RULES))
    unknown = wanted - {"inductor", "optimus", "optimus_egg", GREEDY_RULES}
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}")
    budgets = list(budgets)
    if any(not math.isfinite(b) or b < 0 for b in budgets):
        raise ValueError(f"budgets must be finite seconds >= 0, got {budgets}")
    check_device(device)
    check_dtype(dtype)
    device_name = device_info(device).get("gpu", "")
    mode = "train" if train else "infer"
    rows: list[dict] = []
    threads_before = torch.get_num_threads()
    with one_thread():
        model, inputs = build(name, **(model_kw or {}))
        # Built on the CPU; moved before tracing, so the GraphModule shares the moved parameters.
        model.train(train).to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        if dtype != "float32":  # (the zoo builds in float32)
            model.to(getattr(torch, dtype))
            inputs = [x.to(getattr(torch, dtype)) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
        reference = exact_reference(model, inputs, train) if dtype != "float32" else None
        gm = fx.symbolic_trace(model)
        gm.train(train)
        params = dict(model.named_parameters())
        expected, expected_grads = _run_and_grads(model, inputs, params, train)
        fx_nodes = len(gm.graph.nodes)
        say(f"model {name}: {fx_nodes} FX nodes, {'training (forward + backward)' if train else 'inference'}, on {device}"
            f"{'' if dtype == 'float32' else ', ' + dtype}, "
            f"1 torch thread for compile and timing (was {threads_before}: extra threads on a shared machine make timings noisy)")

        warm = warm_up_inductor(train, device)
        if warm:
            say(f"  warmed Inductor up on a tiny graph first ({warm:.1f} s, not counted)")
        # Build every arm's graph first (cheap next to compiling), then compile each.
        plan: list[_Arm] = []
        if "inductor" in wanted:
            plan.append(_Arm("inductor", "", gm, 0.0))
        if "optimus" in wanted:
            t = time.perf_counter()
            opt = inductor_with_optimus(gm, inputs, post_grad=train)
            plan.append(_Arm("optimus", "", opt, time.perf_counter() - t,
                             counters=dict(opt.meta.get("optimus_counters", {}))))
        if "optimus_egg" in wanted:
            for b in budgets:
                t = time.perf_counter()
                egg = optimize(gm, inputs, budget_s=b, gemm_loops=gemm_loops, training=train, hoisted=not train)
                as_backend_compiles(egg, gemm_loops=gemm_loops)
                plan.append(_Arm(egg_arm(b), _budget_label(b), egg, time.perf_counter() - t,
                                 report=egg.meta["optimus_egg"], gemm_loops=gemm_loops))
        if GREEDY_RULES in wanted:
            greedy = rewrite_greedily(gm, inputs, gemm_loops=gemm_loops, training=train, hoisted=not train)
            as_backend_compiles(greedy, gemm_loops=gemm_loops)
            rep = greedy.meta["optimus_egg_greedy"]
            plan.append(_Arm(GREEDY_RULES, "", greedy, rep.seconds, report=rep, gemm_loops=gemm_loops))

        fns: dict[str, Callable[..., Any]] = {}
        plain = None  # plain Inductor's outputs and gradients: a reference in low precision
        launches: dict[str, Any] = {}
        for i, arm in enumerate(plan, 1):
            say(f"  [{i}/{len(plan)}] {arm.name}: compiling ...")
            dynamo_counters["inductor"].clear()
            c = measure.compile_inductor(arm.graph, inputs, training=train)
            if arm.counters is not None:  # Optimus: pre-grad counters + post-grad ones from compile
                names = _optimus_counter_names()
                arm.counters.update({k: v for k, v in dynamo_counters["inductor"].items() if k in names and v})
            got, grads = _run_and_grads(c.fn, inputs, params, train)
            if arm.name == "inductor":
                plain = (got, grads)
            match, gmatch = check_values(got, grads, expected, expected_grads, train, reference, plain)
            fns[arm.name] = _train_step(c.fn, list(params.values())) if train else c.fn
            launches[arm.name] = c.launches
            L = c.launches
            rep = arm.report
            counters = arm.counters if arm.counters is not None else (
                dict(rep.matches) if rep is not None else {})
            row = dict(
                family=family_of(name), model=name, mode=mode, device=device, device_name=device_name, dtype=dtype,
                arm=arm.name, budget=arm.budget,
                fx_nodes=fx_nodes, launches=L.total, extern=L.extern,
                kernels=L.cpp + L.triton + L.fallback, profiled_launches="",
                pred_launches=predicted_launches(arm.graph, inputs, arm.gemm_loops,
                                                 bool(arm.graph.meta.get("hoist_parameters")) and not train)
                if predict else math.nan,
                optimize_s=round(arm.optimize_s, 4), compile_s=round(c.compile_s, 3),
                total_compile_s=round(arm.optimize_s + c.compile_s, 3),
                median_ms=math.nan, ratio=math.nan, launch_ratio=math.nan,
                peak_rss_mb=round(measure.peak_rss_mb(), 1),
                **_report_fields(rep),
                values_match=match, grads_match=gmatch, rule_counters=_fmt_counters(counters),
                threads=1, rounds=rounds,
            )
            rows.append(row)
            extra = f", {rep.stop_reason}, cost {rep.cost_before:.2f} -> {rep.cost_after:.2f}" if rep is not None else ""
            say(f"  [{i}/{len(plan)}] {arm.name}: optimize {arm.optimize_s:.2f} s, compile {c.compile_s:.2f} s, "
                f"{L.total} launches (extern {L.extern}){extra}, values {'match' if match else 'DIFFER'}"
                + (f", grads {'match' if gmatch else 'DIFFER'}" if train else ""))

        say(f"  timing {len(fns)} arms, {rounds} interleaved rounds, 1 torch thread ...")
        with torch.set_grad_enabled(train):
            medians = measure.interleaved_medians(fns, inputs, rounds=rounds)
        base = rows[0] if rows and rows[0]["arm"] == "inductor" else None
        for row in rows:
            row["median_ms"] = round(medians[row["arm"]], 4)
            if base is not None:
                row["ratio"] = round(medians[row["arm"]] / medians["inductor"], 3)
                row["launch_ratio"] = round(row["launches"] / max(base["launches"], 1), 3)
        if device == "cuda":  # after timing: the profiler must not disturb the timed calls
            with torch.set_grad_enabled(train):
                for row in rows:
                    row["profiled_launches"] = measure.profiled_kernel_launches(fns[row["arm"]], inputs)
                    say(f"  {row['arm']}: torch.profiler counted {row['profiled_launches']} CUDA kernels "
                        f"per call ({row['launches']} launches in the wrapper code)")
        for p in params.values():
            p.grad = None
    return rows


def run_optimize_only(name: str, budget: float = 1.0, out: TextIO | None = None) -> dict:
    """One optimus_egg row without Inductor (for illustrative_10k, whose compiles are slow)."""
    from optimus_egg import measure
    from optimus_egg.models import build
    from optimus_egg.pipeline import optimize

    with one_thread():
        model, inputs = build(name)
        model.eval()
        gm = fx.symbolic_trace(model)
        t = time.perf_counter()
        egg = optimize(gm, list(inputs), budget_s=budget, gemm_loops=True, training=False,
                       hoisted=True)  # as the bench's optimus_egg arm
        optimize_s = time.perf_counter() - t
    rep = egg.meta["optimus_egg"]
    row = {c: "" for c in COLUMNS}
    row.update(
        family=family_of(name), model=name, mode="infer", device="cpu", device_name="", arm=egg_arm(budget), budget=_budget_label(budget),
        fx_nodes=len(gm.graph.nodes), optimize_s=round(optimize_s, 3), total_compile_s=round(optimize_s, 3),
        peak_rss_mb=round(measure.peak_rss_mb(), 1), **_report_fields(rep),
        rule_counters=_fmt_counters(dict(rep.matches)), threads=1,
    )
    print(f"  {egg_arm(budget)} on {name} (optimize only, no Inductor): {optimize_s:.2f} s, "
          f"cost {rep.cost_before:.1f} -> {rep.cost_after:.1f}, {rep.stop_reason}", file=out or sys.stdout, flush=True)
    return row


# --------------------------------------------------------------------------- output


def _num(v: Any, fmt: str) -> str:
    if v == "" or v is None:
        return "-"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "-" if math.isnan(f) else format(f, fmt)


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() == "true"


def print_table(rows: list[dict], out: TextIO | None = None) -> None:
    """The compare table: one line per arm."""
    if not rows:
        return
    out = out or sys.stdout
    r0 = rows[0]
    stop_w = max(11, *(len(str(r["stop_reason"] or "-")) + 1 for r in rows))
    print(f"\n{r0['model']} ({r0['mode']}) on {device_of(r0)}, {dtype_of(r0)}, {r0['fx_nodes']} FX nodes, 1 torch thread, "
          f"{r0['rounds']} interleaved rounds", file=out)
    head = (f"{'arm':<20}{'launches':>9}{'extern':>7}{'kernels':>8}{'prof.':>6}{'pred':>7}{'optimize s':>11}"
            f"{'compile s':>10}{'total s':>9}{'median ms':>10}{'vs ind.':>8}{'RSS MB':>8}{'e-nodes':>8}"
            f"  {'stop':<{stop_w}}values")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        values = "match" if _truthy(r["values_match"]) else "DIFFER"
        if r["mode"] == "train":
            values += ", grads " + ("match" if _truthy(r["grads_match"]) else "DIFFER")
        print(f"{r['arm']:<20}{_num(r['launches'], 'g'):>9}{_num(r['extern'], 'g'):>7}{_num(r['kernels'], 'g'):>8}"
              f"{_num(r.get('profiled_launches'), 'g'):>6}{_num(r['pred_launches'], '.2f'):>7}{_num(r['optimize_s'], '.2f'):>11}{_num(r['compile_s'], '.2f'):>10}"
              f"{_num(r['total_compile_s'], '.2f'):>9}{_num(r['median_ms'], '.3f'):>10}{_num(r['ratio'], '.2f'):>8}"
              f"{_num(r['peak_rss_mb'], '.0f'):>8}{_num(r['egraph_nodes'], 'g'):>8}  {str(r['stop_reason'] or '-'):<{stop_w}}"
              f"{values}", file=out)
    fired = [(r["arm"], r["rule_counters"]) for r in rows if r["rule_counters"]]
    if fired:
        print("rule counters:", file=out)
        for arm, c in fired:
            print(f"  {arm}: {c.replace(';', ', ')}", file=out)


def device_of(row: dict) -> str:
    """A row's device; rows of CSVs written before the device column ran on the CPU."""
    return row.get("device") or "cpu"


def dtype_of(row: dict) -> str:
    """A row's dtype; rows of CSVs written before the dtype column ran in float32."""
    return row.get("dtype") or "float32"


def result_stem(model: str, train: bool, device: str = "cpu", dtype: str = "float32") -> str:
    """``<model>[_train]`` on CPU in float32, ``_cuda`` added on a GPU and ``_bf16`` / ``_fp16``
    in those dtypes (DTYPES): no run overwrites another."""
    return "_".join(p for p in (model, "train" if train else "", "" if device == "cpu" else device, DTYPES[dtype]) if p)


def write_results(rows: list[dict], results_dir: str | os.PathLike, stem: str) -> tuple[Path, Path]:
    """bench/results/<stem>.csv (COLUMNS) and <stem>.json (rows plus run metadata)."""
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = d / f"{stem}.csv", d / f"{stem}.json"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    meta = dict(
        created=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__, python=platform.python_version(),
        machine=platform.machine(), cpus=os.cpu_count(), torch_threads=1,
        **device_info(device_of(rows[0]) if rows else "cpu"),
    )
    clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
    json_path.write_text(json.dumps({"meta": meta, "rows": clean}, indent=1, default=str) + "\n")
    return csv_path, json_path


def read_results(results_dir: str | os.PathLike) -> list[dict]:
    """Every row of every suite CSV in ``results_dir`` (files with other columns, such as
    budget_sweep.csv, are skipped)."""
    rows: list[dict] = []
    for p in sorted(Path(results_dir).glob("*.csv")):
        with open(p, newline="") as f:
            reader = csv.DictReader(f)
            if not {"model", "mode", "arm", "launches"} <= set(reader.fieldnames or ()):
                continue
            rows.extend(reader)
    return rows


def _model_order() -> list[str]:
    from optimus_egg.models import MODELS

    return list(MODELS)


def _launch_cell(row: dict, gpu: bool) -> str:
    """Launches in the wrapper code; on a GPU ``wrapper / profiled`` (torch.profiler's count)."""
    cell = _num(row["launches"], "g")
    return f"{cell} / {_num(row.get('profiled_launches'), 'g')}" if gpu else cell


def markdown_table(rows: list[dict], device: str = "cpu", dtype: str = "float32") -> str:
    """One Markdown table per mode for the rows run on ``device`` in ``dtype`` (rows without
    those columns ran on the CPU in float32): a line per model, launches and latency per arm.
    The cuda tables are titled "GPU (Triton)" and give launches as ``wrapper / profiled``."""
    order = {m: i for i, m in enumerate(_model_order())}
    gpu = device != "cpu"
    out: list[str] = []
    for mode, title in (("infer", "Inference"), ("train", "Training (forward + backward)")):
        mrows = [r for r in rows if r["mode"] == mode and device_of(r) == device and dtype_of(r) == dtype]
        if not mrows:
            continue
        egg_arms = sorted({r["arm"] for r in mrows if r["arm"].startswith("optimus_egg@")},
                          key=lambda a: float(a[len("optimus_egg@"):-1]))
        arm_names = ["inductor", "optimus", *egg_arms, GREEDY_RULES]
        models = sorted({r["model"] for r in mrows}, key=lambda m: order.get(m, 99))
        by = {(r["model"], r["arm"]): r for r in mrows}
        short = {"inductor": "Inductor", "optimus": "Optimus", GREEDY_RULES: "greedy rules"}
        labels = [short.get(a, a.replace("optimus_egg@", "egg@")) for a in arm_names]
        if dtype != "float32":
            title = f"{title}, {dtype}"
        if gpu:
            out.append(f"**GPU (Triton): {title.lower()}** — kernel launches per call as `wrapper / profiled` "
                       "(counted in Inductor's generated code / CUDA kernels torch.profiler saw in one timed call; "
                       "lower is better), median latency relative to plain Inductor, optimize + compile seconds.\n")
        else:
            out.append(f"**{title}** — Inductor kernel launches per call (lower is better), median latency "
                       "relative to plain Inductor, optimize + compile seconds; 1 torch thread.\n")
        out.append("| model | FX nodes | " + " | ".join(f"launches {l}" for l in labels)
                   + " | " + " | ".join(f"ms× {l}" for l in labels[1:])
                   + " | " + " | ".join(f"compile s {l}" for l in labels) + " | values |")
        out.append("|" + " --- |" * (2 + 3 * len(labels)))
        for m in models:
            cells = [m, next(str(r["fx_nodes"]) for r in mrows if r["model"] == m)]
            for a in arm_names:
                r = by.get((m, a))
                cells.append(_launch_cell(r, gpu) if r else "-")
            for a in arm_names[1:]:
                r = by.get((m, a))
                cells.append(_num(r["ratio"], ".2f") if r else "-")
            for a in arm_names:
                r = by.get((m, a))
                cells.append(_num(r["total_compile_s"], ".1f") if r else "-")
            bad = [a for a in arm_names if (r := by.get((m, a))) and r["values_match"] != ""
                   and not (_truthy(r["values_match"]) and (mode == "infer" or _truthy(r["grads_match"])))]
            cells.append("match" if not bad else "DIFFER: " + ", ".join(bad))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def big_model_note(rows: list[dict]) -> str:
    big = [r for r in rows if r["model"] == BIG_MODEL]
    if not big:
        return ""
    lines = ["**illustrative_10k** (optimize only; its Inductor compiles are left out for time; peak RSS is the "
             "bench process's high-water mark, models run before it included: `python bench/budget_sweep.py` "
             "measures optimize alone in a fresh process):\n",
             "| arm | FX nodes | optimize s | cost (model) before -> after | e-graph nodes | stop | process peak RSS MB |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in big:
        lines.append(f"| {r['arm']} | {r['fx_nodes']} | {_num(r['optimize_s'], '.1f')} | "
                     f"{_num(r['cost_before'], '.0f')} -> {_num(r['cost_after'], '.0f')} | {r['egraph_nodes']} | "
                     f"{r['stop_reason']} | {_num(r['peak_rss_mb'], '.0f')} |")
    return "\n".join(lines) + "\n"


def gpu_note(rows: list[dict]) -> str:
    """What the GPU table was measured on (the ``device_name`` of its rows)."""
    names = sorted({r.get("device_name") or "an unnamed GPU" for r in rows})
    return (f"GPU tables measured on {', '.join(names)} with `optimus-egg bench --device cuda` "
            "(`bench/gpu_check.sh`); the Optimus arm keeps the pass lists of `baselines.py`, chosen for CPU.\n")


def low_precision_note(dtype: str) -> str:
    return (f"The {dtype} tables: `optimus-egg bench --all --dtype {dtype}` (add `--train`); values and "
            "gradients are checked against the model run in float64 from the same rounded weights: no further "
            "from those than three times eager's or plain Inductor's distance in the same dtype, the farther, "
            "or than the float64 values rounded once (`measure.rounds_no_worse`).\n")


def render_readme_section(rows: list[dict], results_dir: str | os.PathLike = "bench/results") -> str:
    """The README section, markers included, for the suite rows ``rows`` (read_results)."""
    small = [r for r in rows if r["model"] != BIG_MODEL or r["launches"] not in ("", None)]
    body = markdown_table(small) + "\n" + big_model_note(rows)
    for dtype in list(DTYPES)[1:]:
        if any(device_of(r) == "cpu" and dtype_of(r) == dtype for r in small):
            body += "\n" + markdown_table(small, "cpu", dtype) + "\n" + low_precision_note(dtype)
    gpu = [r for r in small if device_of(r) == "cuda"]
    if gpu:
        body += "\n" + "\n".join(t for t in (markdown_table(gpu, "cuda", d) for d in DTYPES) if t) + "\n" + gpu_note(gpu)
    how = ("Reproduce: `optimus-egg bench --all --big` (add `--train` for the training table; "
           "per-model CSV/JSON in `bench/results/`), `optimus-egg compare --model NAME --budgets "
           "0.01,0.1,1,10 --plot out.png` for one model, `python bench/extraction.py` (greedy vs ILP, "
           "cost-model rank correlation), `python bench/budget_sweep.py`, and "
           "`pytest bench/ --benchmark-only --benchmark-json=bench/results/optimize.json` (optimize() "
           "timings). Launches are counted in Inductor's generated wrapper code (extern GEMMs + C++ "
           "kernels). The optimus_egg and greedy-rules arms are optimized and compiled as the backend does: "
           "priced for small GEMMs as loops, compiled with the post-grad passes `baselines.egg_post_grad()`, the CPU "
           "kernel order (`src/optimus_egg/kernel_order.py`) and the GEMM loops (`src/optimus_egg/gemm_loops.py`; "
           "`--no-gemm-loops`: without them); plain Inductor and Optimus without the order or the loops (`python "
           "bench/kernel_order.py` compiles every arm with neither, the order, and both). \"greedy rules\" is the ablation `optimus_egg.ablation.rewrite_greedily`: optimus_egg's "
           "rules one family at a time, each family's result committed before the next runs, no e-graph search.")
    return (f"{README_START}\n<!-- generated by `optimus-egg bench` from every CSV in {results_dir}/; "
            f"edit bench/ or src/optimus_egg/bench.py, not this table -->\n\n{body.strip()}\n\n{how}\n\n{README_END}")


def update_readme(readme: str | os.PathLike, section: str) -> bool:
    """Replace the text between the bench markers in ``readme`` (read-modify-write, nothing
    else touched); when the markers are missing, append a "Benchmarks" section holding
    them. Returns True when the file changed."""
    path = Path(readme)
    text = path.read_text() if path.exists() else ""
    start, end = text.find(README_START), text.find(README_END)
    if start != -1 and end > start:
        new = text[:start] + section + text[end + len(README_END):]
    else:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        new = text + sep + "## Benchmarks\n\n" + section + "\n"
    if new == text:
        return False
    tmp = path.with_name(path.name + ".bench-tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    return True


def plot(rows: list[dict], path: str | os.PathLike) -> Path:
    """Launches and optimize + compile time against budget for the optimus_egg arms, with
    plain Inductor, Optimus and the greedy-rules ablation as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    egg = sorted((r for r in rows if str(r["arm"]).startswith("optimus_egg@")), key=lambda r: float(r["budget"]))
    if not egg:
        raise ValueError("plot needs at least one optimus_egg arm")
    xs = [float(r["budget"]) for r in egg]
    log_x = all(x > 0 for x in xs) and len(set(xs)) > 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "launches", "kernel launches per call"),
                           (axes[1], "total_compile_s", "optimize + compile (s)")):
        ax.plot(xs, [float(r[key]) for r in egg], "o-", color="C2", label="optimus_egg", zorder=3)
        for arm, color, style in (("inductor", "C0", "--"), ("optimus", "C1", "-."), (GREEDY_RULES, "C3", ":")):
            ref = next((r for r in rows if r["arm"] == arm), None)
            if ref is not None:
                ax.axhline(float(ref[key]), color=color, linestyle=style,
                           label={"inductor": "plain Inductor", "optimus": "Inductor + Optimus",
                                  GREEDY_RULES: "greedy rules"}[arm])
        if log_x:
            ax.set_xscale("log")
        elif any(x == 0 for x in xs):
            ax.set_xscale("symlog", linthresh=min([x for x in xs if x > 0] or [0.01]))
        ax.set_xlabel("optimus_egg budget (s)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(f"{r0['model']} ({r0['mode']}), {r0['fx_nodes']} FX nodes, 1 torch thread")
    fig.tight_layout()
    out = Path(path)
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- statistics


def _ranks(x: Sequence[float]):
    import numpy as np

    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    i = 0
    while i < len(a):  # average ranks over ties
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (ties get average ranks); NaN when undefined."""
    import numpy as np

    if len(x) != len(y):
        raise ValueError("spearman: x and y differ in length")
    if len(x) < 2:
        return math.nan
    rx, ry = _ranks(x), _ranks(y)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])
