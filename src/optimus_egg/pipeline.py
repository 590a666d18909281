"""optimize(): from_fx -> saturate -> extract -> to_fx, with a report and safe fallbacks.

Bad arguments raise TypeError / ValueError. Anything that goes wrong inside the optimizer
returns the unmodified graph with a warning (strict=True raises instead). The result is
never costlier than the input under the cost model (launches, ties broken by work): if
extraction finds nothing cheaper, the input graph is returned unchanged.
"""
from __future__ import annotations

import copy
import gc
import logging
import math
import numbers
import operator
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.fx.graph_module import _copy_attr
from torch.multiprocessing.reductions import StorageWeakRef

from optimus_egg import hoist, ops, parts, worker
from optimus_egg.extract.fusion_cost import COPIES, MAY_COPY, fused_launches, loops_work, node_kind
from optimus_egg.extract.fusion_cost import _target_name as target_name
from optimus_egg.extract.graph import Graph, Node, serialize
from optimus_egg.extract.greedy import EPS, Extraction, greedy
from optimus_egg.extract.launch_cost import (GEMM_TARGETS, batch_of_loops, elementwise_batched_linear,
                                             elementwise_linear, elementwise_matmul, gemm_macs, launch_cost, linear_macs, loop_work, loops_gemm,
                                             scalar_gemm_price, scalar_loops)
from optimus_egg.extract.work import class_shapes, numel, sizes, work
from optimus_egg.from_fx import (ANYWHERE, GRAD_REACH, Lowered, _grad_reach, _may_share, _name, _place, from_fx,
                                 is_mutation, rebinds_memory, written_aliases)
from optimus_egg.rules import RULESETS, SCHEDULE_ORDER, rule_names, without
from optimus_egg.saturate import Limits, SaturationReport, egraph_nodes, saturate, warm
from optimus_egg.shapes import _fetch, buffers_kept, check_inputs, guard_example_shapes, share_elements, state_kept
from optimus_egg.to_fx import graph_module, prepare, to_fx

# The report of every optimize() call at INFO (how to see it through torch.compile).
log = logging.getLogger(__name__)


@dataclass
class Report:
    """What optimize did; stored on the result as gm.meta["optimus_egg"]."""
    timings: dict[str, float] = field(default_factory=dict)
    egraph_nodes: int = 0
    egraph_classes: int = 0
    iterations: int = 0
    stop_reason: str = "not_run"
    matches: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    cost_table: str = ""            # extract/launch_cost.py TABLES entry used ("cpu": the only one calibrated)
    training: bool = False          # priced for a compile with a backward (optimize's `training`)
    cost_before: float = math.nan   # extraction objective: launches per node (extract/launch_cost.py) + tie-breakers
    cost_after: float = math.nan
    launches_before: int | None = None  # whole-graph estimate with fusion (extract/fusion_cost.py)
    launches_after: int | None = None
    changed: bool = False
    fallback: str | None = None  # an internal failure: the input came back
    kept_input: str | None = None  # why the input came back (a cheaper graph found, or a graph left as it is)
    hard_stop: bool = False      # the search worker was killed at the hard deadline
    parts: int = 1               # parts kept apart: stretches between state changes, bodies (parts.py)
    zero_grads: list[str] = field(default_factory=list)  # tensors given zero gradients by ops.keep_grads
    out_of_place: int = 0        # writes into fresh values made out-of-place before lowering (functional.py)
    copied_outputs: int = 0      # outputs copied not to alias an input, a parameter or another output (copy_new_aliases)
    contiguous_outputs: int = 0  # outputs made contiguous as the input's were (keep_contiguous_outputs)
    stacked_spans: int = 0       # batched linears whose returned spans became bmm rows (stack_returned_spans)
    shape_checks: int = 0        # inputs the result checks against the example's shape (shapes.guard_example_shapes)
    hoisted: int = 0             # parameter copies computed once, not per call (hoist.py: the backend, in inference)

    def __str__(self) -> str:
        t = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.timings.items())
        fired = ", ".join(f"{k}={v}" for k, v in sorted(self.matches.items()) if v) or "none"
        lines = [
            f"optimus_egg: cost {self.cost_before:.2f} -> {self.cost_after:.2f} (launches + tie-breaks)"
            f" ({'changed' if self.changed else 'unchanged'}; {self.cost_table or 'no'} cost table)"
            + (f", predicted launches {self.launches_before} -> {self.launches_after}"
               if self.launches_before is not None else ""),
            f"  search: {self.iterations} iterations, stopped by {self.stop_reason}, "
            f"e-graph {self.egraph_nodes} nodes / {self.egraph_classes} classes",
            f"  rules fired: {fired}",
            f"  time: {t}",
        ]
        if self.parts != 1:
            lines.insert(1, f"  {self.parts} parts kept apart (stretches between grad-mode / autocast changes, "
                            "bodies: checkpointed, cond branches, shared layers)")
        if self.out_of_place:
            lines.append(f"  in-place writes into fresh values made out-of-place: {self.out_of_place}")
        if self.kept_input:
            lines.append(f"  kept the input: {self.kept_input}")
        if self.copied_outputs:
            lines.append(f"  outputs copied so as not to alias what the input's did not: {self.copied_outputs}")
        if self.shape_checks:
            lines.append(f"  inputs checked against the example's shape on entry: {self.shape_checks}")
        if self.hoisted:
            lines.append(f"  parameter copies computed once, not per call (hoist.py): {self.hoisted}")
        if self.zero_grads:
            lines.append(f"  zero gradients kept by the outputs (ops.keep_grads): {', '.join(self.zero_grads)}")
        if self.fallback:
            lines.append(f"  fallback: {self.fallback}")
        return "\n".join(lines)


def _check_args(gm, example_inputs, budget_s, disable) -> None:
    if not isinstance(gm, fx.GraphModule):
        hint = ("pass its graph module, ep.module()" if isinstance(gm, torch.export.ExportedProgram)
                else "trace a module first with torch.fx.symbolic_trace(model)")
        raise TypeError(f"optimize expects a torch.fx.GraphModule, got {type(gm).__name__}; {hint}")
    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"example_inputs must be a list or tuple of tensors, got {type(example_inputs).__name__}")
    check_budget_and_disable(budget_s, disable)


def check_budget_and_disable(budget_s, disable) -> None:
    """TypeError / ValueError naming a bad `budget_s` or `disable` (optimize's, the backend's)."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real):
        raise TypeError(f"budget_s must be a number of seconds, got {type(budget_s).__name__}")
    if not math.isfinite(budget_s) or budget_s < 0:
        raise ValueError(f"budget_s must be a finite number of seconds >= 0, got {budget_s}")
    if isinstance(disable, str):
        raise TypeError("disable must be a list of rule family or rule names, not a string")
    unknown = set(disable) - set(RULESETS) - set(_RULE_FAMILY)
    if unknown:
        raise ValueError(f"disable names unknown rule families or rules {sorted(unknown)}; families: "
                         f"{list(SCHEDULE_ORDER)}; rules: see rules/README.md")


_RULE_FAMILY = {rule: family for family in SCHEDULE_ORDER for rule in rule_names(family)}


def enabled_rulesets(disable) -> dict:
    """SCHEDULE_ORDER minus the disabled families; a family with disabled rules runs without them."""
    off = set(disable)
    out = {}
    for family in SCHEDULE_ORDER:
        if family in off:
            continue
        rules = frozenset(r for r in off if _RULE_FAMILY.get(r) == family)
        out[family] = without(family, rules) if rules else RULESETS[family]
    return out


def node_cost(lowered: Lowered, g: Graph, with_work: bool = True):
    """The cost of one serialized node: its launches under the graph's cost table (template
    calls look up their FX target), plus (`with_work`) its work (extract/work.py) scaled by
    WORK_EPS per `work_unit(lowered)` elements, which breaks ties between equal launch counts."""
    table = lowered.cost_table
    memo: dict[tuple, tuple[float, str | None]] = {}  # (op, template) -> (launches, GEMM name): a few dozen keys
    shapes = class_shapes(g, known_shapes(lowered, g))
    strided = strided_classes(lowered, g)
    size = sizes(shapes) if with_work else {}
    scale = WORK_EPS / work_unit(lowered) if with_work else 0.0
    elementwise = launch_cost("unary", None, table)
    scalar_gemm = scalar_gemm_price(table, lowered.training)
    break_even = lowered.loop_break_even
    fixed = fixed_classes(lowered, g)

    def cost(n: Node) -> float:
        if n.op in ("cat", "stack") and all(_none(g, c) for c in g.values[n.children[0]]):
            return 0.0  # the biases of a group without any: to_fx emits nothing for them
        if fixed and n.op in _FIXED_COPIES and _fixed_node(lowered, g, n, fixed):
            return 0.0  # a copy of parameters computed once (optimize's hoisted)
        key = (n.op, g.values[n.children[0]]) if n.op in ("call", "call_multi", "unary") else (n.op, None)
        c = memo.get(key)
        if c is None:
            name = None if key[1] is None else _name(lowered.templates[key[1]].target)
            launches = launch_cost(n.op, name, table)
            gemm = "linear" if n.op in ("linear", "batched_linear") else name if name in GEMM_TARGETS else None
            c = memo[key] = (launches, gemm)
        launches = c[0]
        x, w = (shapes.get(n.children[0]), shapes.get(n.children[1])) if n.op in ("linear", "batched_linear") \
            else (None, None)
        # GEMMs written as code: elementwise, plus their loops' work (launch_cost.loop_work)
        if n.op == "linear" and elementwise_linear(x, w, n.children[2] in shapes, table, n.children[0] in strided):
            launches = elementwise + loop_work(linear_macs(x, w), table, n.children[0] in strided, break_even)
        elif n.op == "linear" and n.children[0] in strided and x and w and scalar_loops(gemm_macs(x, w[::-1]), table):
            launches = scalar_gemm  # loops that would run scalar: a call (launch_cost.scalar_loops)
        elif n.op == "batched_linear" and elementwise_batched_linear(x, w, not _no_bias(g, n.children[2]), table):
            launches = elementwise + loop_work(linear_macs(x, w), table, break_even=break_even)
        elif n.op == "batched_linear" and batch_of_loops(x, w, table):
            launches += w[0] * elementwise  # the call and its members' code apart
        elif c[1] in ("mm", "bmm", "matmul") and n.op == "call":
            args = g.values[n.children[1]]
            a, b = (shapes.get(args[0]), shapes.get(args[1])) if len(args) >= 2 else (None, None)
            if elementwise_matmul(a, b, table, strided.issuperset(args[:2])):
                launches = elementwise + loop_work(gemm_macs(a, b), table, strided.issuperset(args[:2]), break_even)
            elif strided.issuperset(args[:2]) and scalar_loops(gemm_macs(a, b), table):
                launches = scalar_gemm
        return launches + scale * work(g, n, shapes, size, c[1]) if launches and scale else launches
    return cost


# e-graph constructors that copy, and those that view, as hoist.py takes them
_FIXED_COPIES = ("cat", "stack", "flatten")
_FIXED_VIEWS = ("movedim", "flatten", "unflatten", "squeeze", "reshape")


def fixed_leaves(lowered: Lowered, inputs: list) -> frozenset[str]:
    """The leaf names of the parameters whose copies a hoisting compile computes once
    (hoist.fixed_parameters: the graph never writes into them), module parameters of a
    call_module (from_fx's `attr:` leaves) among them."""
    fixed, _ = hoist.fixed_parameters(lowered.gm, inputs)
    names = {n.name for n in fixed}
    params = hoist.parameter_names(lowered.gm)
    names.update(name for name, leaf in lowered.leaves.items() if isinstance(leaf, str) and leaf in params)
    return frozenset(names)


def _fixed_node(lowered: Lowered, g: Graph, n: Node, fixed: set[str]) -> bool:
    """Is node `n` a parameter (`lowered.fixed_leaves`), a missing bias, or a copy or view of
    classes in `fixed` alone?"""
    if n.op == "input":
        return g.values[n.children[0]] in lowered.fixed_leaves
    if n.op == "none":
        return True
    if n.op in ("cat", "stack"):
        return all(c in fixed for c in g.values[n.children[0]])
    if n.op in _FIXED_VIEWS:
        return n.children[0] in fixed
    if n.op == "call" and _name(lowered.templates[g.values[n.children[0]]].target) in hoist.VIEW_NAMES:
        tensors = [c for c in g.values[n.children[1]] if isinstance(c, str) and c in g.classes]
        return bool(tensors) and all(c in fixed for c in tensors)
    return False


def fixed_classes(lowered: Lowered, g: Graph) -> set[str]:
    """The classes of `g` computed from fixed parameters alone (`_fixed_node`); empty unless
    priced for hoisting (`lowered.fixed_leaves`)."""
    fixed: set[str] = set()
    if not lowered.fixed_leaves:
        return fixed
    grew = True
    while grew:
        grew = False
        for cls, ids in g.classes.items():
            if cls not in fixed and any(_fixed_node(lowered, g, g.nodes[k], fixed) for k in ids):
                fixed.add(cls)
                grew = True
    return fixed


def computed_once(lowered: Lowered, gm: fx.GraphModule, inputs: list) -> set[fx.Node]:
    """The nodes of `gm` a hoisting compile computes outside it (hoist.plan), where priced so."""
    if not lowered.fixed_leaves:
        return set()
    p = hoist.plan(gm, inputs)
    return set(p.nodes) if p is not None else set()


def strided_classes(lowered: Lowered, g: Graph) -> set[str]:
    """Tensor classes lowered from an FX value whose rows are not contiguous (from_fx's
    `strided`); classes the rules built (stacks, batched results) are contiguous."""
    return {c for c, i in g.origins.items() if lowered.nodes[i] in lowered.strided}


def _none(g: Graph, cls: str) -> bool:
    """Does class `cls` hold `none` (a missing bias)?"""
    return any(g.nodes[k].op == "none" for k in g.classes.get(cls, ()))


def _no_bias(g: Graph, cls: str) -> bool:
    """Is class `cls` a batched linear's missing bias: none, or a stack of nothing but none?"""
    return _none(g, cls) or any(g.nodes[k].op == "stack" and all(_none(g, c) for c in g.values[g.nodes[k].children[0]])
                                for k in g.classes.get(cls, ()))


# A node's work adds WORK_EPS per work_unit elements: the same order as greedy.EPS, the
# per-node tie-breaker, for an op on tensors of the graph's average size.
WORK_EPS = EPS


def work_unit(lowered: Lowered) -> float:
    """The graph's average tensor size (elements) over the FX values lowered: fixed per graph,
    so costs of extractions at different budgets compare."""
    sizes = [numel(s) for s in lowered.shapes.values()]
    return max(sum(sizes) / max(len(sizes), 1), 1.0)


def _tensor_shape(s) -> tuple[int, ...] | None:
    return s if isinstance(s, tuple) else None


def known_shapes(lowered: Lowered, g: Graph) -> dict[str, tuple[int, ...]]:
    """Tensor class -> shape from the e-graph's facts, the FX value a class was lowered from,
    and the graph's leaves by name (`Lowered.leaf_shapes`: placeholders, get_attrs, and the
    parameters of call_module Linear / LayerNorm)."""
    known = dict(g.shapes)
    by_origin, nodes = lowered.shapes, lowered.nodes
    for c, i in g.origins.items():
        s = by_origin.get(nodes[i])
        if s is not None:
            known.setdefault(c, s)
    leaves = lowered.leaf_shapes
    values = g.values
    for n in g.nodes.values():
        if n.op == "input" and n.eclass not in known:
            s = leaves.get(values[n.children[0]])
            if s is not None:
                known[n.eclass] = s
    return known


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    return graph_module(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)


def optimize(gm: fx.GraphModule, example_inputs, budget_s: float = 1.0, *, strict: bool = False,
             disable: tuple[str, ...] | list[str] = (), limits: Limits | None = None,
             verify: bool = False, gemm_loops: bool = False, training: bool | None = None,
             buffer_reuse: bool = True, hoisted: bool = False) -> fx.GraphModule:
    """Rewrite `gm` to launch fewer kernels; returns a new GraphModule with the same values.

    budget_s bounds the saturation search (0: no search, an equivalent graph comes back, its
    cost priced in the report); lowering and extraction add an overhead that grows linearly
    with graph size. A budget too small for one search iteration on a graph this size
    (FIRST_ITERATION_S_PER_NODE per FX node) returns an equivalent graph without lowering it.
    disable: rule families (optimus_egg.rules.SCHEDULE_ORDER) or single rules (rules/README.md)
    to leave out.
    verify: run both graphs on copies of example_inputs and keep the input graph if values differ.
    The model's buffers, the inputs and the random number generators are left as they were.
    A rewritten graph whose inputs carry no shapes of their own (symbolic_trace) is made for
    the example's and checks them on entry (shapes.guard_example_shapes: AssertionError).
    gemm_loops: price the graph as Inductor compiles it with small CPU GEMMs as loops
    (gemm_loops.py; the backend's gemm_loops option): such a GEMM is elementwise code fused
    with its neighbours, so the search leaves it unbatched. Prices only; values never change.
    training: price for a compile with a backward (launch_cost.TRAINING_SCALAR_GEMM); default
    (None) as AOT autograd decides: grad mode on and an input or parameter requiring grad.
    buffer_reuse: whether the result is compiled with Inductor's buffer reuse (its default). In
    training, a graph calling a `nested_compile_region` body whose results need a gradient is
    left as it is unless False (then the body is rewritten too): torch 2.13's Inductor trained
    such graphs rewritten around the calls to wrong gradients with the reuse on
    (baselines.SHARED_BODY_TRAINING; the backend compiles such graphs without it and passes False).
    hoisted: price the graph as compiled with its parameter-only copies computed once, outside
    the compiled graph (hoist.py; the backend's hoist option): a stack or cat of parameters the
    graph never writes into then costs nothing per call. Inference only: where `training`, the
    copies stay in the graph and are priced there. Prices only; values never change.
    """
    _check_args(gm, example_inputs, budget_s, disable)
    if not isinstance(gemm_loops, bool):
        raise TypeError(f"optimize: gemm_loops must be a bool, got {type(gemm_loops).__name__}")
    if training is not None and not isinstance(training, bool):
        raise TypeError(f"optimize: training must be a bool or None, got {type(training).__name__}")
    if not isinstance(buffer_reuse, bool):
        raise TypeError(f"optimize: buffer_reuse must be a bool, got {type(buffer_reuse).__name__}")
    if not isinstance(hoisted, bool):
        raise TypeError(f"optimize: hoisted must be a bool, got {type(hoisted).__name__}")
    inputs = check_inputs(gm, example_inputs)
    if training is None:
        training = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in [*inputs, *gm.parameters()])
    report = Report(training=training)
    start = time.perf_counter()
    try:
        with state_kept(gm, inputs):  # (running the graph for its values may change the caller's state)
            with worker.frozen_heap():
                result = _optimize(gm, inputs, budget_s, disable, limits or Limits(), report, gemm_loops, training,
                                   buffer_reuse, hoisted and not training)
            if verify and result is not gm and not _same_values(gm, result, inputs):
                raise RuntimeError("verify: the optimized graph's values differ from the input graph's")
            if result is not gm:
                report.copied_outputs = copy_new_aliases(gm, result)
                if report.launches_after is not None:
                    report.launches_after += report.copied_outputs
                report.shape_checks = guard_example_shapes(gm, result, inputs)
    except ValueError:
        raise
    except Exception as e:
        if strict:
            raise
        warnings.warn(f"optimus_egg: optimization failed ({type(e).__name__}: {e}); "
                      "returning the unmodified graph", RuntimeWarning, stacklevel=2)
        report.fallback = f"{type(e).__name__}: {e}"
        report.changed = False
        result = gm
    if result is gm:
        result = _copy(gm)
    if threading.current_thread() is not threading.main_thread():
        # egglog's e-graphs may be dropped only by the thread that made them (PyO3
        # "unsendable"): collect the cycles holding this call's before another thread does
        gc.collect()
    report.timings["total"] = time.perf_counter() - start
    keep_capture_metadata(gm, result)
    result.meta["optimus_egg"] = report
    log.info("graph of %d FX nodes: %s", len(gm.graph.nodes), report)
    return result


def _writes_shared_memory(gm: fx.GraphModule, inputs: list) -> bool:
    """Does gm write into an input or a parameter (or a view of one) that shares an element
    with another input or parameter (`f(x, x[1:])`; two items of one unbind share a storage
    but no element)? The ordering of reads and writes (from_fx) takes distinct inputs and
    parameters for distinct memory."""
    modules = dict(gm.named_modules())
    mutated = [n for n in gm.graph.nodes if is_mutation(n, modules)]
    if not mutated:
        return False
    values = dict(zip(gm.graph.find_nodes(op="placeholder"), inputs))
    values.update((n, _fetch(gm, n.target)) for n in gm.graph.find_nodes(op="get_attr"))
    def dense(t) -> bool:
        return isinstance(t, torch.Tensor) and t.layout == torch.strided and t.untyped_storage().nbytes() > 0

    leaves = [(n, t) for n, t in values.items() if dense(t)]
    seen = {id(t) for _, t in leaves}
    leaves += [(None, t) for t in [*gm.parameters(), *gm.buffers()] if id(t) not in seen and dense(t)]  # (a module's own)
    by_storage: dict = defaultdict(list)
    for n, t in leaves:
        by_storage[StorageWeakRef(t.untyped_storage())].append((n, t))
    written = written_aliases(gm.graph, modules, mutated)
    return any(n in written and any(share_elements(t, u) for j, (_, u) in enumerate(group) if j != i)
               for group in by_storage.values() for i, (n, t) in enumerate(group))


# What Dynamo records on its GraphModule besides its meta (torch/_dynamo/output_graph.py)
_CAPTURE_ATTRS = ("_param_name_to_source", "_source_to_user_stacks", "compile_subgraph_reason", "_backend_id")


def keep_capture_metadata(gm: fx.GraphModule, out: fx.GraphModule) -> None:
    """Give `out` what the capture recorded on `gm` that `out` lacks: gm.meta (Dynamo's
    `dynamo_compile_id` tells AOT autograd the graph is Dynamo's), Dynamo's attributes (the
    parameters' sources) and each placeholder's `_dynamo_source`. From these AOT autograd
    finds the static inputs (parameters), which CUDA graphs (mode="reduce-overhead") keep in
    place instead of copying them in on each call."""
    for k, v in gm.meta.items():
        out.meta.setdefault(k, v)
    for a in _CAPTURE_ATTRS:
        if hasattr(gm, a) and not hasattr(out, a):
            setattr(out, a, getattr(gm, a))
    ours = [n for n in out.graph.nodes if n.op == "placeholder"]
    theirs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(ours) == len(theirs):
        for p, q in zip(theirs, ours):
            if hasattr(p, "_dynamo_source") and not hasattr(q, "_dynamo_source"):
                q._dynamo_source = p._dynamo_source


# A lower bound on the first search iteration's seconds per FX node (measured on the bench's
# illustrative graphs: 81 us at 1,000 nodes, 100 us at 10,000). A budget below it on the
# input's node count could not pay for one iteration: nothing is lowered or searched.
FIRST_ITERATION_S_PER_NODE = 2e-5


def _optimize(gm, inputs, budget_s, disable, limits, report, gemm_loops=False, training=False,
              buffer_reuse=True, hoisted=False, whole=True) -> fx.GraphModule:
    """optimize's search; `whole`: gm's outputs are the caller's (not a graph of parts')."""
    if training and budget_s > 0 and buffer_reuse and parts.trains_a_shared_body(gm):
        report.kept_input = ("in training, a graph calling a nested_compile_region body a gradient reaches stays as "
                             "it is where it is compiled with Inductor's buffer reuse (optimize's buffer_reuse)")
        return gm
    if budget_s > 0 and parts.writes_a_body_input(gm):
        report.kept_input = "a graph calling a body that writes into its inputs stays as it is"
        return gm
    if budget_s > 0 and any(rebinds_memory(n) for n in gm.graph.nodes):
        report.kept_input = "a graph that moves a tensor into another's memory (Tensor.set_) stays as it is"
        return gm
    if budget_s > 0 and _writes_shared_memory(gm, inputs):
        report.kept_input = ("a graph writing into an input or a parameter that shares memory with another stays "
                             "as it is")
        return gm
    if parts.has_state_changes(gm) or (budget_s > 0 and parts.bodies(gm)):
        return _by_part(gm, inputs, budget_s, disable, limits, report, gemm_loops, training, buffer_reuse, hoisted)
    if 0 < budget_s < FIRST_ITERATION_S_PER_NODE * len(gm.graph.nodes):
        report.stop_reason = "budget"  # cost_before stays NaN: the input was not priced
        return gm
    rulesets = enabled_rulesets(disable)
    t = time.perf_counter()
    # egglog-python translates the rules on first use: done beside the shape propagation
    meanwhile = (lambda: warm(rulesets)) if budget_s > 0 else None
    lowered = from_fx(gm, inputs, seed_groups=budget_s > 0, meanwhile=meanwhile, gemm_loops=gemm_loops)
    lowered.training = training
    if hoisted:
        lowered.fixed_leaves = fixed_leaves(lowered, inputs)
    report.groups = lowered.groups
    report.out_of_place = lowered.out_of_place
    src = lowered.gm  # gm, or its copy with writes into fresh values made out-of-place
    report.cost_table = lowered.cost_table
    report.timings["from_fx"] = time.perf_counter() - t

    before = _Before(src, lowered, report, inputs)
    if budget_s == 0:
        before.measure()
        report.stop_reason = "budget"
        return gm

    prepared: list = []  # raising's extraction-independent part, built while a worker searches
    found = _search(lowered, rulesets, limits, budget_s, before, lambda: prepared.append(prepare(lowered)))
    sat = found.sat
    report.timings["saturate"] = sat.seconds
    report.iterations, report.stop_reason = sat.iterations, sat.stop_reason
    report.matches = dict(sat.matches)
    report.hard_stop = found.hard_stop
    if found.ex is None:
        return gm  # nothing was added (or nothing came back in time): the input is the best extraction
    report.egraph_nodes, report.egraph_classes = found.nodes, found.classes
    report.timings["extract"] += found.extract_s
    g1, ex = found.g, found.ex
    if ex.cost >= report.cost_before - 1e-9:
        return gm  # never worse: nothing cheaper was found
    t = time.perf_counter()
    classes: dict[fx.Node, str] = {}
    out = to_fx(lowered, g1, ex, inputs, prepared=prepared[0] if prepared else None, classes=classes)
    shapes = class_shapes(g1, known_shapes(lowered, g1))
    shape_of = lambda n: _tensor_shape(shapes.get(classes.get(n)))  # noqa: E731
    rows = stack_returned_spans(out, lowered.contiguous_outputs, shape_of, lowered.cost_table) if whole else set()
    wrapped = keep_contiguous_outputs(out, lowered.contiguous_outputs, rows) if whole else 0
    report.timings["to_fx"] = time.perf_counter() - t
    # The per-node table cannot see fusion; the whole-graph estimate can. Keep the input if
    # it predicts more launches for the result (never seen on the bench models).
    report.launches_before = before.launches()
    strided = strided_classes(lowered, g1)
    strided_of = lambda n: classes.get(n) in strided  # noqa: E731
    report.launches_after = fused_launches(out, shape_of, lowered.cost_table, strided_of,
                                           computed_once(lowered, out, inputs))
    # launches plus the loops' work (launch_cost.loop_work), which launches do not count
    work_before = before.loops_work()
    work_after = loops_work(out, shape_of, lowered.cost_table, strided_of, lowered.loop_break_even)
    if report.launches_after + work_after > report.launches_before + work_before + 1e-9:
        report.kept_input = (f"the fusion estimate predicts {report.launches_after} launches"
                             f"{f' and loops worth {work_after:.2f}' if work_after else ''} for the result, "
                             f"{report.launches_before}{f' and {work_before:.2f}' if work_before else ''} for the input")
        report.launches_after = report.launches_before
        return gm
    lost = _lost_leaves(src, out, inputs, lowered.grad_reach)
    if any(lost):
        if not _keep_zero_grads(src, out, inputs, lost, lowered.grad_reach):
            report.kept_input = "a parameter's gradient would be None where the input's is zeros"
            return gm
        report.zero_grads = [f"input {i}" for i in sorted(lost[0])] + sorted(lost[1])
    report.cost_after, report.changed, report.contiguous_outputs = ex.cost, True, wrapped
    report.stacked_spans = len({r.args[0] for r in rows})
    return out


_SIZE_TARGETS = {"size", "dim", "sym_size", "numel", "sym_numel", "stride"}


def _lost_leaves(gm: fx.GraphModule, out: fx.GraphModule, inputs,
                 reach: set[fx.Node] | None) -> tuple[set[int], set[str]]:
    """The tensors requiring grad (inputs by index; parameters and buffers by name) that a
    gradient of gm's outputs reaches (`reach`, from_fx's; eagerly each gets a gradient, zeros
    at least) and none of out's does. A parameter that only fed values nothing reads (a stack
    unbound, one row used) gets zeros eagerly; with those values gone it would get None, which
    an optimizer with weight decay or momentum treats differently. out's reach is walked from
    its outputs whose counterparts `reach` holds (a superset): its nodes copied from gm keep the
    reach a graph of parts carries in meta, new ones have none. (Walked from every output, a
    graph of parts would count what reaches a part's outputs that only feed a no_grad block.)"""
    ins, names = _reached_leaves(gm, inputs, reach)
    theirs, ours, reach_out = _flat_outputs(gm), _flat_outputs(out), None
    if reach is not None and len(theirs) == len(ours):
        starts = [y for o, y in zip(theirs, ours) if isinstance(y, fx.Node) and (o in reach or not isinstance(o, fx.Node))]
        reach_out = _grad_reach(out.graph, _grad_values(out), starts=starts)
    ins_out, names_out = _reached_leaves(out, inputs, reach_out)
    lost_ins = {i for i in ins - ins_out if inputs[i].requires_grad}
    if names <= names_out:
        return lost_ins, set()
    tensors = (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False))
    return lost_ins, {name for name, t in tensors if t.requires_grad and _under(name, names) and not _under(name, names_out)}


def _under(name: str, targets: set[str]) -> bool:
    """Is `name`, or a module holding it, among `targets`?"""
    while name:
        if name in targets:
            return True
        name = name.rpartition(".")[0]
    return False


def _keep_zero_grads(gm: fx.GraphModule, out: fx.GraphModule, inputs, lost: tuple[set[int], set[str]],
                     reach: set[fx.Node] | None) -> bool:
    """Give the `lost` tensors their zeros back in `out` (in place): each output of out whose
    counterpart in gm a gradient reached them from is wrapped in `ops.keep_grads(y, *lost)`.
    False (out unchanged) for a graph of parts (its outputs are the parts') or outputs that do
    not line up."""
    if reach is None or any(GRAD_REACH in n.meta for n in gm.graph.nodes):
        return False
    output = next(n for n in out.graph.nodes if n.op == "output")
    theirs, ours = _flat_outputs(gm), _flat_outputs(out)
    if len(theirs) != len(ours) or any(isinstance(a, fx.Node) != isinstance(b, fx.Node) for a, b in zip(theirs, ours)):
        return False
    lost_ins, lost_names = lost
    values = _grad_values(gm)
    placeholders = [n for n in out.graph.nodes if n.op == "placeholder"]
    wrapped: list = []
    for o, y in zip(theirs, ours):
        if isinstance(o, fx.Node) and o in reach:
            ins, names = _reached_leaves(gm, inputs, _grad_reach(gm.graph, values, starts=[o]) & reach)
            ins, names = sorted(ins & lost_ins), sorted(name for name in lost_names if _under(name, names))
            if ins or names:
                with out.graph.inserting_before(output):
                    for name in names:
                        _copy_attr(gm, out, name)  # (out holds only what its graph reads)
                    leaves = [placeholders[i] for i in ins] + [out.graph.get_attr(name) for name in names]
                    y = out.graph.call_function(ops.keep_grads, (y, *leaves))
                y.meta = dict(y.args[0].meta)
        wrapped.append(y)
    at = iter(wrapped)
    output.args = fx.node.map_aggregate(output.args, lambda _: next(at))
    out.recompile()
    return True


def _storage(n, modules: dict) -> tuple:
    """Where n's value lies (from_fx._place), with the fusion estimate's views (node_kind) and
    keep_grads, which returns its input, looked through too."""
    return _place(n, modules, is_view=lambda m: node_kind(m, modules) == "view",
                  through=lambda m: m.target is ops.keep_grads)


# Views that keep every element of what they view (a transpose, an unsqueeze, a view).
_WHOLE_VIEWS = {"t", "transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "unsqueeze",
                "squeeze", "view", "view_as", "unflatten", "expand", "expand_as", "adjoint", "detach", "alias"}


def _must_overlap(a: tuple, b: tuple) -> bool:
    """Do two _storage places surely share memory (where either has an element)? One root,
    none of the views one that may copy, and one's views those the other starts with,
    spelled alike, or one's views all keeping every element of the root (`x.t()` and a
    split piece of `x`)."""
    if a[0] is not b[0] or a[0] is ANYWHERE or any(v[0] in MAY_COPY for v in a[1] + b[1]):
        return False
    m = min(len(a[1]), len(b[1]))
    return a[1][:m] == b[1][:m] or any(all(v[0] in _WHOLE_VIEWS for v in p[1]) for p in (a, b))


def _leaf(place: tuple) -> bool:
    """May the place be a graph input's or a parameter's?"""
    return place[0] is ANYWHERE or isinstance(place[0], fx.Node) and place[0].op in ("placeholder", "get_attr")


def copy_new_aliases(gm: fx.GraphModule, out: fx.GraphModule) -> int:
    """Copy each output of `out` (rewritten from `gm`) that may share memory with a graph
    input, a parameter or an earlier output where gm's output in its place does not: a split
    concatenated again is its input, and returned as it is, writing into the result in place
    would write into the caller's input (eagerly it is a fresh tensor). Pieces of one batched
    result (an unbind's items) do not overlap. Inductor's own passes never introduce such
    aliases (remove_noop_ops). Returns the number of outputs copied."""
    before, after = _flat_outputs(gm), _flat_outputs(out)
    if len(before) != len(after):
        raise RuntimeError("the optimized graph's outputs differ from the input's")
    mods_before, mods_after = dict(gm.named_modules()), dict(out.named_modules())
    kept: list[tuple[tuple, tuple]] = []  # (place in gm, place in out) of the outputs kept as they are
    copy_at: set[int] = set()
    for i, (b, a) in enumerate(zip(before, after)):
        if not isinstance(a, fx.Node):
            continue
        pb = _storage(b, mods_before) if isinstance(b, fx.Node) else (None, ())
        pa = _storage(a, mods_after)
        if (_leaf(pa) and not _leaf(pb)) or any(_may_share(pa, qa) and not _must_overlap(pb, qb)
                                                 for qb, qa in kept):
            copy_at.add(i)
        else:
            kept.append((pb, pa))
    output = next(n for n in out.graph.nodes if n.op == "output")

    def copied(a):  # a copy per place
        with out.graph.inserting_before(output):
            return out.graph.call_function(torch.clone, (a,))

    _replace_outputs(out, copy_at, copied)
    return len(copy_at)


def keep_contiguous_outputs(out: fx.GraphModule, contiguous: tuple, known: set[fx.Node] = frozenset()) -> int:
    """Make each output of `out` contiguous where the input graph's output in its place was
    (`contiguous`, per output leaf): a piece of a batched result (a column span of one
    linear's output) or an elementwise op of a permuted one would otherwise keep that layout,
    and Inductor keeps the strides of the graph it is given, so `view` on it would raise where
    eager's works. `.contiguous()` is a no-op on a tensor that already is one, eagerly and in
    Inductor's trace alike; a GEMM's result, a cat, an input or a `contiguous()` already is
    left as it is, and so are the nodes `known` to be contiguous. Returns the values wrapped."""
    leaves = _flat_outputs(out)
    if len(leaves) != len(contiguous):
        return 0
    modules = dict(out.named_modules())
    wrap = {i for i, (a, c) in enumerate(zip(leaves, contiguous))
            if c and isinstance(a, fx.Node) and a not in known and a.op not in ("placeholder", "get_attr", "output")
            and node_kind(a, modules) != "extern" and target_name(a, modules) not in COPIES | {"contiguous"}}
    made: dict[fx.Node, fx.Node] = {}  # (a value returned twice stays one tensor)

    def wrapped(a):
        if a not in made:
            with out.graph.inserting_after(a):
                made[a] = out.graph.call_method("contiguous", (a,))
        return made[a]

    _replace_outputs(out, wrap, wrapped)
    return len(made)


def stack_returned_spans(out: fx.GraphModule, contiguous: tuple, shape_of: Callable, table: str) -> set[fx.Node]:
    """A linear of one 2-D input with concatenated weights (batch_linear_lhs), split into equal
    column spans of which one at least is returned where the input graph's output was
    contiguous, becomes one bmm of the input broadcast to each weight, unbound: its rows are
    contiguous, where each span returned would need a copy (keep_contiguous_outputs), a kernel
    of its own that PyTorch's Optimus's strided spans do not launch. The broadcast is a view;
    the stacked weights cost what the concatenated ones did. Not where cost table `table`
    writes a member's GEMM as loops (launch_cost.loops_gemm): the copies fuse into that code.
    `shape_of`: a node's shape or None. Returns the rows made (contiguous)."""
    leaves = _flat_outputs(out)
    if len(leaves) != len(contiguous):
        return set()
    returned = {a for a, c in zip(leaves, contiguous) if c and isinstance(a, fx.Node)}
    graph, made = out.graph, set()
    for sp in [n for n in graph.nodes if n.op == "call_function" and n.target is torch.split]:
        if len(sp.args) != 3 or sp.kwargs:
            continue
        lin, spans, d = sp.args
        if not (isinstance(lin, fx.Node) and lin.target is torch.nn.functional.linear and len(lin.users) == 1
                and d == 1 and isinstance(spans, (list, tuple)) and len(set(spans)) == 1 and not lin.kwargs
                and len(lin.args) in (2, 3)):
            continue
        x, w, b = (*lin.args, None)[:3]
        weights, biases = _cat_operands(w), _cat_operands(b) if b is not None else None
        shape = shape_of(x)
        if (weights is None or len(weights) != len(spans) or (b is not None and biases is None)
                or shape is None or len(shape) != 2 or any(not isinstance(v, int) for v in shape)
                or loops_gemm(math.prod(shape) * spans[0], table)):
            continue
        items = list(sp.users)
        if any(u.target is not operator.getitem for u in items) or not any(u in returned for u in items):
            continue
        with graph.inserting_before(lin):
            stacked_b = None if b is None else graph.call_function(torch.stack, (biases, 0))
            wide = graph.call_method("expand", (graph.call_method("unsqueeze", (x, 0)), len(spans), *shape))
            y = graph.call_function(ops.batched_linear, (wide, graph.call_function(torch.stack, (weights, 0)),
                                                         stacked_b))
            rows = graph.call_function(torch.unbind, (y, 0))
        last = rows
        for u in sorted(items, key=lambda u: u.args[1]):
            with graph.inserting_after(last):
                last = graph.call_function(operator.getitem, (rows, u.args[1]))
            u.replace_all_uses_with(last)
            graph.erase_node(u)
            made.add(last)
        for n in (sp, lin, w, b):
            if n is not None and not n.users:
                graph.erase_node(n)
    if made:
        out.recompile()
    return made


def _cat_operands(n) -> list | None:
    """The operands of `n`, a `torch.cat(operands, 0)` node, or None."""
    if not (isinstance(n, fx.Node) and n.target is torch.cat and len(n.args) == 2 and n.args[1] == 0
            and not n.kwargs and isinstance(n.args[0], (list, tuple))):
        return None
    return list(n.args[0])


def _replace_outputs(out: fx.GraphModule, at: set[int], make) -> None:
    """Replace each leaf of out's output structure whose place (in _flat_outputs' order) is
    in `at` by make(leaf), and recompile; nothing where `at` is empty."""
    if not at:
        return
    output = next(n for n in out.graph.nodes if n.op == "output")
    place = iter(range(len(_flat_outputs(out))))
    output.args = fx.node.map_aggregate(output.args, lambda a: make(a) if next(place) in at else a)
    out.recompile()


def _flat_outputs(gm: fx.GraphModule) -> list:
    """The leaves of gm's output structure, in order."""
    leaves: list = []
    fx.node.map_aggregate(next(n for n in gm.graph.nodes if n.op == "output").args, leaves.append)
    return leaves


def _grad_values(gm: fx.GraphModule) -> dict:
    """Each node's value for _grad_reach: its meta value (None where unknown: walked through),
    0 for sizes."""
    return {n: 0 if _name(n.target) in _SIZE_TARGETS or n.target == "shape" else n.meta.get("val")
            for n in gm.graph.nodes}


def _reached_leaves(gm: fx.GraphModule, inputs, reach: set[fx.Node] | None = None) -> tuple[set[int], set[str]]:
    """The tensor inputs (their indices) and the get_attr / call_module targets that `reach`
    holds; by default, that a walk back from gm's outputs reaches (from_fx._grad_reach)."""
    if reach is None:
        reach = _grad_reach(gm.graph, _grad_values(gm), starts=[a for n in gm.graph.nodes if n.op == "output"
                                                                 for a in n.all_input_nodes])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ins = {i for i, n in enumerate(placeholders) if n in reach and i < len(inputs)
           and isinstance(inputs[i], torch.Tensor)}
    return ins, {n.target for n in reach if n.op in ("get_attr", "call_module")}


def _by_part(gm, inputs, budget_s, disable, limits, report, gemm_loops, training, buffer_reuse,
             hoisted) -> fx.GraphModule:
    """A graph with stretches between grad-mode / autocast changes or checkpointed bodies: its
    parts side by side in one graph, optimized once (parts.py)."""
    def one(combined: fx.GraphModule, example_values: list) -> fx.GraphModule:
        try:
            return _optimize(combined, example_values, budget_s, disable, limits, report, gemm_loops, training,
                             buffer_reuse, hoisted, whole=False)
        except ValueError as e:  # the parts' example values come from meta, not the caller
            raise RuntimeError(f"the graph's parts (parts.py): {e}") from e

    out, report.parts = parts.optimize_parts(gm, inputs, one, trained_shared_bodies=not buffer_reuse)
    return out


class _Before:
    """The input graph's costs: its extraction from the seeded e-graph (the launch cost the
    result must beat, and how long an extraction takes) and its whole-graph launch estimate.
    With a worker, the parent measures these while the worker searches."""

    def __init__(self, gm: fx.GraphModule, lowered: Lowered, report: Report, inputs: list):
        self.gm, self.lowered, self.report, self.inputs = gm, lowered, report, inputs
        self.measured = False
        self.serialize_s = 0.0  # of the seed graph, which predicts the search's extraction time

        self.launches_before: int | None = None

    def measure(self) -> None:
        """Fill the report's cost_before (and cost_after) and its extraction time (once)."""
        if not self.measured:
            t = time.perf_counter()
            g0 = serialize(self.lowered.egraph)
            self.serialize_s = time.perf_counter() - t
            self.report.cost_before = self.report.cost_after = greedy(g0, node_cost(self.lowered, g0)).cost
            self.report.timings["extract"] = time.perf_counter() - t
            self.measured = True

    def launches(self) -> int:
        """The input graph's whole-graph launch estimate (extract/fusion_cost.py)."""
        if self.launches_before is None:
            self.launches_before = fused_launches(self.gm, self.lowered.shapes.get, self.lowered.cost_table,
                                                  self.lowered.strided.__contains__,
                                                  computed_once(self.lowered, self.gm, self.inputs))
        return self.launches_before

    def loops_work(self) -> float:
        """The input graph's loop work in launch-equivalents (fusion_cost.loops_work)."""
        return loops_work(self.gm, self.lowered.shapes.get, self.lowered.cost_table, self.lowered.strided.__contains__,
                          self.lowered.loop_break_even)


@dataclass
class _Found:
    """What a search returns: its saturation report and, if anything was added, an extraction."""
    sat: SaturationReport
    g: Graph | None = None           # the serialized e-graph (from a worker: just the chosen nodes)
    ex: Extraction | None = None
    nodes: int = 0                   # e-graph size when extracted
    classes: int = 0
    extract_s: float = 0.0
    hard_stop: bool = False          # the worker was killed at the hard deadline


def _extract(lowered: Lowered, sat: SaturationReport, prune: bool) -> _Found:
    t = time.perf_counter()
    g = serialize(lowered.egraph)
    ex = greedy(g, node_cost(lowered, g))
    found = _Found(sat, g, ex, sum(len(v) for v in g.classes.values()), len(g.classes))
    if prune:
        found.g = _chosen_part(g, ex)
    found.extract_s = time.perf_counter() - t
    return found


def _chosen_part(g: Graph, ex: Extraction) -> Graph:
    """The nodes an extraction uses, the values they read and the shape facts of their
    classes: all that to_fx and the fusion estimate need."""
    values, todo = {}, [c for k in ex.choice.values() for c in g.nodes[k].children if c not in g.classes]
    while todo:
        c = todo.pop()
        if c not in values:
            values[c] = v = g.values[c]
            if isinstance(v, list):
                todo.extend(e for e in v if e not in g.classes)
    return Graph({k: g.nodes[k] for k in ex.choice.values()}, {c: [k] for c, k in ex.choice.items()},
                 values, {c: o for c, o in g.origins.items() if c in ex.choice}, g.root,
                 {c: s for c, s in g.shapes.items() if c in ex.choice})


# The search's extraction (serializing the grown e-graph, then greedy's fixpoint) over the seed
# graph's serialization time scaled by the growth: measured 2.1-3.6 on the bench graphs, 1k
# and 10k nodes included. The seed graph's own extraction is no measure of it: every class
# holds one node there, and greedy takes that forced choice without its fixpoint.
_EXTRACT_PER_SERIALIZE = 4.0

# Seconds per e-graph node of one extraction, assumed by the worker until it has timed its own
# (measured: 10-70 microseconds; a high guess only delays the first snapshot).
_EXTRACT_S_PER_NODE = 1e-4
# An e-graph of at most this many nodes is extracted after every iteration the search goes on
# from, whatever the clock says, and the cheapest extraction is kept (greedy is not monotone in
# the e-graph: a random program's last e-graph extracted at 17.51, the one before at 17.01,
# 9 and 8 launches). Snapshots taken by the clock alone made such a result depend on the
# machine's speed. Greedy takes about 6 microseconds a node (bench/extraction.py: 3,609 nodes in
# 0.02 s), so each costs at most a few milliseconds here.
SNAPSHOT_NODES = 2000


def _search(lowered: Lowered, rulesets, limits: Limits, budget_s: float, before: _Before,
            while_waiting: Callable[[], None] = lambda: None) -> _Found:
    """Saturate for `budget_s` seconds and extract; a hard deadline when a worker can be forked.

    The worker (a fork of this process, holding the seeded e-graph) saturates with the usual
    between-iteration checks, extracts, and sends the result. While searching it also sends
    its e-graph size after each iteration and, when the e-graph has at most SNAPSHOT_NODES
    nodes or an extraction costs at most as long as the search since the last one, a
    snapshot extraction (without a worker, the small e-graphs' snapshots are taken in
    process, so both paths keep the same extraction). Meanwhile the parent measures the
    input's costs (`before`) and calls `while_waiting` (raising's preparation). It then waits
    until deadline + allowance(size), where the allowance is twice the predicted extraction
    time (_EXTRACT_PER_SERIALIZE x the seed graph's serialization time x the e-graph's
    growth, which the node limit bounds), kills the
    worker and keeps the cheapest extraction it has: the final one, a snapshot, or none (the
    input graph). A budget already spent when the search could start forks nothing.
    """
    if not (limits.worker and worker.available()):
        before.measure()
        kept: list[_Found] = []

        def small_snapshot(rep: SaturationReport) -> None:
            if rep.nodes <= SNAPSHOT_NODES:
                found = _extract(lowered, rep, prune=True)
                if not kept or found.ex.cost <= kept[0].ex.cost:
                    kept[:] = [found]

        sat = saturate(lowered.egraph, rulesets, limits, time.perf_counter() + budget_s, on_iteration=small_snapshot)
        if not sat.iterations:
            return _Found(sat)
        return _cheaper(_extract(lowered, sat, prune=False), kept[0] if kept else None)

    deadline = time.perf_counter() + budget_s
    warm(rulesets)
    if time.perf_counter() >= deadline:  # spent before a search could start: no fork
        before.measure()
        return _Found(SaturationReport(stop_reason="budget"))

    def work(send) -> None:
        start = last = time.perf_counter()
        per_node = _EXTRACT_S_PER_NODE

        def snapshot(rep: SaturationReport) -> None:
            nonlocal last, per_node
            send(("progress", rep.nodes))
            now = time.perf_counter()
            if rep.nodes <= SNAPSHOT_NODES or now - last >= per_node * rep.nodes:
                rep.seconds, rep.stop_reason = now - start, "budget"  # what it means if it is kept
                found = _extract(lowered, rep, prune=True)
                per_node = found.extract_s / max(rep.nodes, 1)
                send(("snapshot", found))
                last = time.perf_counter()

        sat = saturate(lowered.egraph, rulesets, limits, deadline, on_iteration=snapshot)
        send(("done", _extract(lowered, sat, prune=True) if sat.iterations else _Found(sat)))

    best: _Found | None = None
    w = worker.Worker(work)
    try:
        size0 = max(egraph_nodes(lowered.egraph), 1)
        before.measure()  # while the worker searches
        before.launches()
        while_waiting()

        def hard_deadline(size: int) -> float:
            return deadline + 0.05 + 2 * _EXTRACT_PER_SERIALIZE * before.serialize_s * size / size0

        hard = hard_deadline(size0)
        while True:
            msg = w.recv(until=hard)
            if msg is None:
                if best is None:
                    best = _Found(SaturationReport(stop_reason="budget", seconds=budget_s))
                best.hard_stop = True
                return best
            kind, payload = msg
            if kind == "error":
                raise payload
            if kind == "progress":
                hard = hard_deadline(payload)
            elif kind == "snapshot" and (best is None or payload.ex.cost <= best.ex.cost):
                best = payload
            elif kind == "done":
                return _cheaper(payload, best)
    finally:
        w.stop()


def _cheaper(final: _Found, snapshot: _Found | None) -> _Found:
    """The final search result, with the snapshot's extraction where that is cheaper (greedy is
    not monotone in the e-graph)."""
    if snapshot is not None and final.ex is not None and final.ex.cost > snapshot.ex.cost:
        final.g, final.ex = snapshot.g, snapshot.ex
    return final


def _same_values(a: fx.GraphModule, b: fx.GraphModule, inputs) -> bool:
    """Whether a and b compute the same values on `inputs`, each run on copies of the tensor
    inputs from the same model state (both left as they were)."""
    def values(g: fx.GraphModule):
        fresh = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad(), buffers_kept(g):
            return torch.utils._pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, g(*fresh))

    ra, rb = values(a), values(b)
    try:
        torch.testing.assert_close(rb, ra, rtol=1e-4, atol=1e-5, equal_nan=True)
        return True
    except AssertionError:
        return False
