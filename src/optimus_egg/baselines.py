"""The greedy baseline: PyTorch's own Optimus passes (torch 2.13), applied without compiling.

This module owns the Optimus configuration we compare against (``OPTIMUS_PRE_GRAD``,
``OPTIMUS_POST_GRAD``), the function that applies the pre-grad passes to a copy of an FX
graph (``optimus``), the counters those passes leave behind, and ``capture`` for getting a
Dynamo-level graph out of an ``nn.Module``.

What Optimus needs before it fires (measured on torch 2.13):

* ``call_function`` nodes on torch-level functions (``F.linear``/``torch._C._nn.linear``,
  ``F.layer_norm``, ``torch.tanh``, ``torch.split`` ...). ``torch.fx.symbolic_trace`` keeps
  ``nn.Linear``/``nn.LayerNorm``/``nn.Tanh`` as ``call_module`` nodes, which no Optimus
  pattern matches. Dynamo graphs already have the functional form.
* ``node.meta["example_value"]`` on every node it looks at (inputs and weights included).
  ``symbolic_trace`` graphs have no meta at all; Dynamo graphs have it, but
  ``torch._dynamo.export`` gives symbolic batch sizes by default, on which the fused
  ``baddbmm`` meta fails (logged, leaves ``example_value`` missing).
* cat/stack given a list of tensors. ``symbolic_trace`` passes a tuple-valued node
  (``torch.stack(torch.unbind(x))``), on which Optimus's normalization_pass asserts.

``prepare`` (run by ``optimus``) therefore re-traces the graph through built-in
``torch.nn`` modules, turning them into functional calls on ``get_attr`` weights (the form
Dynamo produces), propagates static-shape fake tensors into ``meta["val"]`` and
``meta["example_value"]`` unless Dynamo already left static ones, and unpacks tuple
arguments of cat/stack into getitems. With that, Optimus fires identically on
``symbolic_trace`` graphs, Dynamo backend graphs (parameters lifted to placeholders) and
``capture`` (``torch._dynamo.export``) graphs: same counters, same node count after, on
every model of the bench zoo up to illustrative_1k.
"""

from __future__ import annotations

import copy
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from optimus_egg.from_fx import is_mutation
from optimus_egg.measure import copy_graph_module

__all__ = [
    "MIN_FUSE_SET_SIZE",
    "OPTIMUS_PRE_GRAD",
    "OPTIMUS_POST_GRAD",
    "EGG_POST_GRAD",
    "egg_post_grad",
    "SAME_DTYPE_BATCH_LINEAR",
    "BATCH_BMM",
    "MAX_STACKED_PER_LAUNCH",
    "verify_options",
    "capture",
    "prepare",
    "optimus",
    "optimus_counters",
    "inductor_with_optimus",
    "post_grad_patches",
    "backend_patches",
    "as_backend_compiles",
]

# Optimus groups at least 5 same-key nodes by default (min_fuse_set_size). A fair
# baseline on small test graphs and on models with a few parallel branches lets it group
# as few as 2, the smallest group that can save a launch.
MIN_FUSE_SET_SIZE = 2

_BATCH = {"min_fuse_set_size": MIN_FUSE_SET_SIZE}

# Execution order: Inductor always runs normalization_pass first, then every batch fusion
# in key order, then the remaining pattern passes in key order. Batch fusions are listed
# with batch_linear_lhs before batch_linear so that linears sharing an input become one
# wide addmm rather than a baddbmm over copies of that input. The split/cat passes follow
# torch's own pre_grad_pass_names order. Left out: batch_dropout (changes random masks),
# merge_stack_tahn_unbind_pass (a name with no registered pattern in 2.13) and
# einsum_to_pointwise_pass (outside the split/cat and batching families).
OPTIMUS_PRE_GRAD: dict[str, dict[str, Any]] = {
    "normalization_pass": {},
    "batch_linear_lhs": dict(_BATCH),
    "batch_linear": dict(_BATCH),
    "batch_layernorm": dict(_BATCH),
    "batch_tanh": dict(_BATCH),
    "batch_sigmoid": dict(_BATCH),
    "batch_relu": dict(_BATCH),
    "batch_detach": dict(_BATCH),
    "batch_nan_to_num": dict(_BATCH),
    "batch_clamp": dict(_BATCH),
    "remove_split_with_size_one_pass": {},
    "merge_getitem_cat_pass": {},
    "merge_splits_pass": {},
    "mutate_cat_pass": {},
    "split_cat_pass": {},
    "unbind_stack_pass": {},
    "split_cat_to_slices_pass": {},
    "unbind_cat_to_view_pass": {},
    "split_stack_to_cats_pass": {},
    "unbind_stack_to_slices_pass": {},
    "move_reshape_out_of_split_stack_pass": {},
}

# Post-grad (ATen) passes that do something on CPU. Left out: group_linear (needs
# fbgemm's gmm), decompose_mm_pass (M <= 1 only on CPU), pad_aten_mm_pass and
# shape_padding_multiplier (CUDA + Triton).
OPTIMUS_POST_GRAD: dict[str, dict[str, Any]] = {
    "batch_linear_post_grad": dict(_BATCH),
    "batch_aten_tanh": dict(_BATCH),
    "batch_aten_sigmoid": dict(_BATCH),
    "batch_aten_relu": dict(_BATCH),
    "batch_aten_add": dict(_BATCH),
    "batch_aten_sub": dict(_BATCH),
    "batch_aten_div": dict(_BATCH),
    "batch_aten_mul": dict(_BATCH),
    "normalization_aten_pass": {},
    "unbind_stack_aten_pass": {},
    "split_cat_aten_pass": {},
    "select_cat_aten_pass": {},
    "move_view_after_cat_aten_pass": {},
}


# torch 2.13's batch_linear_post_grad groups mm / addmm nodes by their sizes alone: an fp64
# and an fp32 GEMM of one size are stacked into one fp64 bmm, and the fp32 result comes out
# fp64 (devices are not compared either). SAME_DTYPE_BATCH_LINEAR is the same pass with each
# operand's dtype and device in the group key; the optimus_egg backend runs it instead.
SAME_DTYPE_BATCH_LINEAR = "batch_linear_post_grad_same_dtype"
_REFINED = {"batch_linear_post_grad": SAME_DTYPE_BATCH_LINEAR}

# optimus_egg's own post-grad fusion: independent aten.bmm nodes of one shape, dtype and device
# become one bmm over their operands concatenated on the batch dim, each result a slice of it.
# PyTorch's post-grad passes batch mm / addmm only; the backward of a batch of linears (and of
# a low-rank mixture of experts) computes one weight gradient per layer as a bmm, and those are
# independent of each other. A bmm Inductor computes as elementwise code
# (`launch_cost.elementwise_matmul`) is left alone.
BATCH_BMM = "batch_bmm_post_grad"

# Both GEMM batchings stack their members' operands. On this CPU a batch never ran faster than
# its members apart (bench/stack_limit.py: operands copied into the stack save no launch and
# take ~1.3 x the time at every size; operands written there by their producers save one launch
# at 1.12 x down to 1.005 x as the GEMMs grow), so on CPU the backend trades step time for
# launches, the objective, and bounds the trade: it batches a group only where it stacks at
# most MAX_STACKED_PER_LAUNCH operand elements per launch it saves (the option
# "max_stacked_per_launch"; absent: no limit). Set on the bench models in training (README,
# Design "backward"), between the groups measured: batched, those of dcn_v2, wukong and dhen
# up to 32,768 elements per launch saved; apart, hstu's and interformer's bmm groups (49,152),
# dhen's at 61,440-65,536, hstu's and interformer's linear groups at 65,536-163,840. With the
# GEMM loops and the mask stores, hstu's bmm groups saved 4 launches for 4-7 % more step time
# (38 launches at 1.04-1.07 x plain Inductor against 42 at 1.005 x; interformer 76 at 0.935 x
# against 79 at 0.910 x), which put hstu past the latency target.
# On a GPU, where a launch costs a fixed few microseconds, no limit (not measured there).
MAX_STACKED_PER_LAUNCH = 32768
# A batch saves launches only where its stacking code joins code the graph runs anyway: a
# stack of inputs or of GEMM results in a phase between two calls that had no code is a C++
# kernel of its own (two [64, 64] @ [64, 64] linears of one weight over a split's pieces: their
# forward and weight-gradient GEMMs batched launched 5 where the members apart launched 4,
# `bench/differential.py --seed 40 --train`). So on CPU (the option "fewer_launches") each
# batch is tried on a copy of the graph first and made only where the fusion estimate
# (extract/fusion_cost.py, which counts the backend's CPU kernel order) falls.
FEWER_LAUNCHES = "fewer_launches"
_GATED = {**_BATCH, "max_stacked_per_launch": MAX_STACKED_PER_LAUNCH, FEWER_LAUNCHES: True}

# The post-grad passes the optimus_egg backend (and the bench's optimus_egg and greedy-rules
# arms) compile with: OPTIMUS_POST_GRAD without the pointwise batching (batch_aten_*). Those
# stack operands that Inductor then copies: on CPU, training step time, and on wukong a launch;
# with the CPU kernel order none of them saves a launch on any bench model (batch_aten_mul,
# the last kept, saved hstu one before it). Measurements: bench/HISTORY.md, Design decisions
# ("The backward is left to post-grad passes").
# Also left out: select_cat_aten_pass and split_cat_aten_pass. Neither changes a launch count on
# any bench model (inference or training, measured), and torch 2.13's versions raise IndexError
# inside Inductor on graphs optimus_egg's rewrites make likelier: select_cat_aten_pass takes every
# user of a cat's input for a select (the backward of a rewritten graph); split_cat_aten_pass takes
# every user of a split piece for a cat, the graph's output tuple included, and then every getitem
# among those outputs for a split piece (a training forward returns its saved tensors: with ten or
# more, and a piece of an `unbind(x)` among them, it reads the unbind's missing split sizes).
# And normalization_aten_pass: without it no bench model launches more (inference and training,
# measured), and torch 2.13's raises TypeError inside Inductor on a split whose size is a node (a
# chunk of a symbolic dim): it takes the size for an int and compares it with a SymInt.
_LEFT_OUT = ("select_cat_aten_pass", "split_cat_aten_pass", "normalization_aten_pass")
EGG_POST_GRAD: dict[str, dict[str, Any]] = {
    SAME_DTYPE_BATCH_LINEAR: dict(_GATED),
    BATCH_BMM: dict(_GATED),
    **{k: v for k, v in OPTIMUS_POST_GRAD.items()
       if not k.startswith("batch_aten_") and k not in _LEFT_OUT and k not in _REFINED},
}

# With small GEMMs as loops (gemm_loops.py) both GEMM batchings leave alone each GEMM the loops
# pass writes as loops (the option "loops_max_macs"): fused with its neighbours it launches
# nothing, while a batch of them can grow past the limit and stay a call.
LOOPS_MAX_MACS = "loops_max_macs"


def egg_post_grad(gemm_loops: bool = False) -> dict[str, dict[str, Any]]:
    """EGG_POST_GRAD, its GEMM batchings told about the GEMM loops where `gemm_loops`: they
    leave alone what the pass writes (gemm_loops.GEMM_LOOPS's limit)."""
    from optimus_egg.gemm_loops import GEMM_LOOPS

    if not gemm_loops:
        return EGG_POST_GRAD
    return {k: {**v, LOOPS_MAX_MACS: GEMM_LOOPS.max_macs} if k in (SAME_DTYPE_BATCH_LINEAR, BATCH_BMM) else v
            for k, v in EGG_POST_GRAD.items()}


def _written_as_loops(fusion, node: fx.Node) -> bool:
    """Does the fusion's "loops_max_macs" option say the GEMM loops write `node` as loops?"""
    from optimus_egg.gemm_loops import written_as_loops

    limit = fusion.graph_search_options.get(LOOPS_MAX_MACS)
    return limit is not None and written_as_loops(node, limit)


def _stacks_too_much(fusion, subset: list[fx.Node]) -> bool:
    """Would batching ``subset`` stack more operand elements per launch saved than the fusion's
    "max_stacked_per_launch" option allows? The operands are each GEMM's last two arguments."""
    limit = fusion.graph_search_options.get("max_stacked_per_launch")
    if limit is None or len(subset) < 2 or subset[0].meta["val"].device.type != "cpu":
        return False
    stacked = sum(a.meta["val"].numel() for n in subset for a in n.args[-2:])
    return stacked > limit * (len(subset) - 1)


def _saves_a_launch(fusion, graph: fx.Graph, subset: list[fx.Node]) -> bool:
    """Does batching `subset` (`fusion.batch`) leave `graph` fewer launches by the fusion
    estimate? Tried on a copy of the graph where the fusion's "fewer_launches" option asks and
    the GEMMs are on CPU; elsewhere yes. GEMMs the GEMM loops write as loops (the option
    "loops_max_macs") are priced as their code (the table launch_cost.LOOPS)."""
    if not fusion.graph_search_options.get(FEWER_LAUNCHES) or subset[0].meta["val"].device.type != "cpu":
        return True
    from torch._inductor.pattern_matcher import stable_topological_sort

    from optimus_egg.extract.fusion_cost import fused_launches, meta_shape
    from optimus_egg.extract.launch_cost import LOOPS

    table = LOOPS if fusion.graph_search_options.get(LOOPS_MAX_MACS) is not None else "cpu"
    trial, copies = _ordered_copy(graph)
    launches = fused_launches(trial, meta_shape, table)
    counted = counters["inductor"]
    before = counted.copy()
    fusion.batch(trial, [copies[n] for n in subset])
    counted.clear()  # the trial batched nothing
    counted.update(before)
    stable_topological_sort(trial)
    return fused_launches(trial, meta_shape, table) < launches


def _ordered_copy(graph: fx.Graph) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    """A copy of `graph` with every node after its inputs (a post-grad batching leaves readers
    of its members before the batch until the pass sorts the graph), and node -> its copy."""
    copy_, copies = fx.Graph(), {}
    for n in graph.nodes:
        todo = [n]
        while todo:
            m = todo[-1]
            waiting = [a for a in m.all_input_nodes if a not in copies]
            if m in copies or not waiting:
                if m not in copies:
                    copies[m] = copy_.node_copy(m, copies.__getitem__)
                todo.pop()
            else:
                todo.extend(waiting)
    return copy_, copies


def _operand_key(node: fx.Node) -> tuple:
    """Each tensor operand's dtype and device, for a post-grad fusion's group key."""
    vals = [a.meta["val"] for a in node.args if isinstance(a, fx.Node)]
    return tuple((str(v.dtype), str(v.device)) for v in vals)


def _bias_rounded_twice(node: fx.Node) -> bool:
    """Would PyTorch's batch round `node`, an addmm, twice? It computes a bmm and adds each bias
    after it, each op rounding to its dtype, where addmm rounds once: in bfloat16 / float16 that
    second rounding is the size of the first (masknet's training step: gradients 1.7 x further
    from float64's than plain Inductor's). Such a batch is one baddbmm instead
    (`_fuse_as_baddbmm`)."""
    addmm = torch.ops.aten.addmm
    return node.target in (addmm, addmm.default) and node.meta["val"].dtype in (torch.bfloat16, torch.float16)


def _fuse_as_baddbmm(graph: fx.Graph, subset: list[fx.Node]) -> None:
    """Replace the addmm nodes of `subset` (one shape, dtype and device) by one baddbmm over
    their inputs, weights and biases stacked, each result a select of it: one rounding per
    result, as addmm's (equal to it bit for bit on CPU). 1-D biases stack as [k, 1, n] and
    broadcast; others are expanded to the result's shape first."""
    aten = torch.ops.aten
    rows, cols = subset[0].meta["val"].shape

    def node(target, args):
        made = graph.call_function(target, args)
        made.meta["val"] = target(*fx.node.map_arg(args, lambda a: a.meta["val"]))
        return made

    def stacked(tensors: list[fx.Node]) -> fx.Node:
        return node(aten.cat.default, ([node(aten.unsqueeze.default, (t, 0)) for t in tensors], 0))

    with graph.inserting_before(subset[-1]):
        biases = [n.args[0] for n in subset]
        if all(b.meta["val"].shape == (cols,) for b in biases):
            biases = [node(aten.unsqueeze.default, (b, 0)) for b in biases]
        else:
            biases = [node(aten.expand.default, (b, [rows, cols])) for b in biases]
        fused = node(aten.baddbmm.default, (stacked(biases), stacked([n.args[1] for n in subset]),
                                            stacked([n.args[2] for n in subset])))
        for i, member in enumerate(subset):
            piece = graph.call_function(aten.select.int, (fused, 0, i))
            piece.meta.update(member.meta)
            member.replace_all_uses_with(piece)
            graph.erase_node(member)


def _register_refined_fusions() -> None:
    """Register SAME_DTYPE_BATCH_LINEAR with Inductor's post-grad fusions (once): PyTorch's
    pass with each operand's dtype and device in the group key."""
    from torch._inductor.fx_passes import group_batch_fusion as gbf
    from torch._inductor.pattern_matcher import stable_topological_sort

    if SAME_DTYPE_BATCH_LINEAR in gbf.POST_GRAD_FUSIONS:
        return

    @gbf.register_fusion(SAME_DTYPE_BATCH_LINEAR, pre_grad=False)
    class SameDtypeBatchLinear(gbf.PostGradBatchLinearFusion):
        def match(self, node: fx.Node):
            key = super().match(node)
            if key is None or _written_as_loops(self, node):
                return None
            if _bias_rounded_twice(node) and not isinstance(getattr(node.args[0], "meta", {}).get("val"), torch.Tensor):
                return None  # (`_fuse_as_baddbmm` stacks the biases by their shapes)
            return (*key, *_operand_key(node))

        def fuse(self, graph, subset: list[fx.Node]) -> None:
            if not _stacks_too_much(self, subset) and _saves_a_launch(self, graph, subset):
                self.batch(graph, subset)

        def batch(self, graph, subset: list[fx.Node]) -> None:
            if _bias_rounded_twice(subset[0]):
                _fuse_as_baddbmm(graph, subset)
                stable_topological_sort(graph)
                counters["inductor"]["batch_linear_post_grad"] += 1  # as PyTorch's fuse counts
            else:
                super().fuse(graph, subset)

    gbf.register_fusion(BATCH_BMM, pre_grad=False)(_batch_bmm_fusion(gbf))


def _batch_bmm_fusion(gbf) -> type:
    """The BATCH_BMM fusion class (see BATCH_BMM), built on torch's BatchFusion."""
    from torch._inductor.pattern_matcher import stable_topological_sort

    from optimus_egg.extract.launch_cost import elementwise_matmul

    aten = torch.ops.aten

    class BatchBmm(gbf.BatchFusion):
        def match(self, node: fx.Node):
            if node.op != "call_function" or node.target not in (aten.bmm, aten.bmm.default):
                return None
            if node.kwargs or len(node.args) != 2:
                return None
            vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args]
            if any(not isinstance(v, torch.Tensor) or v.dim() != 3 for v in vals):
                return None
            a, b = (tuple(v.shape) for v in vals)
            if not all(isinstance(d, int) for d in a + b) or elementwise_matmul(a, b) or _written_as_loops(self, node):
                return None
            return (BATCH_BMM, a, b, *_operand_key(node))

        def fuse(self, graph: fx.Graph, subset: list[fx.Node]) -> None:
            if not _stacks_too_much(self, subset) and _saves_a_launch(self, graph, subset):
                self.batch(graph, subset)

        def batch(self, graph: fx.Graph, subset: list[fx.Node]) -> None:
            lhs = [n.args[0] for n in subset]
            rhs = [n.args[1] for n in subset]
            batch = subset[0].args[0].meta["val"].shape[0]
            with graph.inserting_before(subset[-1]):
                cat_a = graph.call_function(aten.cat.default, (lhs, 0))
                cat_a.meta["val"] = torch.cat([n.meta["val"] for n in lhs], 0)
                cat_b = graph.call_function(aten.cat.default, (rhs, 0))
                cat_b.meta["val"] = torch.cat([n.meta["val"] for n in rhs], 0)
                fused = graph.call_function(aten.bmm.default, (cat_a, cat_b))
                fused.meta["val"] = torch.bmm(cat_a.meta["val"], cat_b.meta["val"])
                for i, node in enumerate(subset):
                    piece = graph.call_function(
                        aten.slice.Tensor, (fused, 0, i * batch, (i + 1) * batch))
                    piece.meta.update(node.meta)
                    node.replace_all_uses_with(piece)
                    graph.erase_node(node)
            # The members are independent but may interleave with each other's operands and
            # readers: put every node after its inputs again (stable otherwise).
            stable_topological_sort(graph)
            counters["inductor"][BATCH_BMM] += 1

    return BatchBmm


def verify_options(
    pre_grad: dict[str, dict] | None = None, post_grad: dict[str, dict] | None = None
) -> None:
    """Raise KeyError naming every option key the installed torch does not know."""
    from torch._inductor.fx_passes.group_batch_fusion import (
        POST_GRAD_FUSIONS,
        PRE_GRAD_FUSIONS,
    )
    from torch._inductor.fx_passes.split_cat import POST_GRAD_PATTERNS, PRE_GRAD_PATTERNS

    _register_refined_fusions()
    pre_grad = OPTIMUS_PRE_GRAD if pre_grad is None else pre_grad
    post_grad = OPTIMUS_POST_GRAD if post_grad is None else post_grad
    unknown = [k for k in pre_grad if k not in PRE_GRAD_FUSIONS and k not in PRE_GRAD_PATTERNS]
    unknown += [k for k in post_grad if k not in POST_GRAD_FUSIONS and k not in POST_GRAD_PATTERNS]
    if unknown:
        raise KeyError(f"unknown Optimus options for torch {torch.__version__}: {unknown}")


def capture(model: torch.nn.Module, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """Capture ``model`` with Dynamo as one static-shape torch-level graph.

    The result is called like ``model`` (same positional inputs, same output structure),
    holds the weights as ``get_attr`` attributes and carries Dynamo's
    ``meta["example_value"]``. Raises on graph breaks.
    """
    result = torch._dynamo.export(model, assume_static_by_default=True)(*example_inputs)
    return result.graph_module


class _InlineTracer(fx.Tracer):
    """Traces through built-in torch.nn modules (Linear -> F.linear on get_attr weights)."""

    def __init__(self, opaque: set[str]):
        super().__init__()
        self.opaque = opaque

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.opaque or not _is_torch_nn(m)

    def trace(self, root, concrete_args=None):
        self._param_names: dict[int, str] = {}
        if isinstance(root, torch.nn.Module):
            for name, param in root.named_parameters():
                self._param_names.setdefault(id(param), name)
        return super().trace(root, concrete_args)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        # The base class finds a parameter's name by scanning root.named_parameters() on
        # every access: quadratic, 11 s on a 1k-node graph. A dict lookup is the same.
        name = self._param_names.get(id(attr_val))
        if isinstance(attr_val, torch.nn.Parameter) and name is not None:
            if name not in parameter_proxy_cache:
                parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
            return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)


def _is_torch_nn(m: torch.nn.Module) -> bool:
    return type(m).__module__.startswith("torch.nn")


def _traceable(m: torch.nn.Module) -> bool:
    try:
        _InlineTracer(set()).trace(m)
    except Exception:  # noqa: BLE001 - any tracing failure means "keep it a leaf"
        return False
    return True


def _inline_modules(gm: fx.GraphModule) -> fx.GraphModule:
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    if not calls:
        return copy_graph_module(gm)
    opaque: set[str] = set()
    verdict: dict[type, bool] = {}
    for node in calls:
        mod = gm.get_submodule(node.target)
        if not _is_torch_nn(mod):
            continue
        if type(mod) not in verdict:
            verdict[type(mod)] = _traceable(mod)
        if not verdict[type(mod)]:
            opaque.add(node.target)
    try:
        graph = _InlineTracer(opaque).trace(gm)
    except Exception:  # noqa: BLE001 - keep the original form; Optimus just matches less
        return copy_graph_module(gm)
    out = fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    out.meta.update(gm.meta)
    return out


def _meta_value(node: fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _is_static(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride()))
    if isinstance(value, (tuple, list)):
        return all(_is_static(v) for v in value)
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _has_static_meta(gm: fx.GraphModule) -> bool:
    """Whether every node already carries a static-shape example value (Dynamo graphs)."""
    return all(
        "example_value" in n.meta and _is_static(n.meta["example_value"])
        for n in gm.graph.nodes
        if n.op != "output"
    )


def _propagate_meta(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    # Static shapes on purpose: symbolic sizes make the meta of Optimus's fused nodes fail.
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*example_inputs)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]


_TENSOR_LIST_OPS = (torch.cat, torch.concat, torch.concatenate, torch.stack)


def _unpack_tensor_lists(gm: fx.GraphModule) -> None:
    """``cat(unbind(x))`` -> ``cat([getitem(u, 0), ...])``, the form Dynamo produces.

    symbolic_trace passes a tuple-valued node straight to cat/stack; Optimus's
    normalization asserts that argument is a list (torch 2.13, normalize_stack_default).
    """
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _TENSOR_LIST_OPS:
            continue
        in_kwargs = "tensors" in node.kwargs
        seq = node.kwargs["tensors"] if in_kwargs else (node.args[0] if node.args else None)
        if not isinstance(seq, fx.Node) or not isinstance(_meta_value(seq), (tuple, list)):
            continue
        items = []
        with gm.graph.inserting_before(node):
            for i, val in enumerate(_meta_value(seq)):
                item = gm.graph.call_function(operator.getitem, (seq, i))
                item.meta["val"] = item.meta["example_value"] = val
                items.append(item)
        if in_kwargs:
            node.update_kwarg("tensors", items)
        else:
            node.update_arg(0, items)
    gm.recompile()


def prepare(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A copy of ``gm`` in the form Optimus matches: the form Dynamo produces, plus meta.

    Built-in ``torch.nn`` modules become functional calls on ``get_attr`` weights (modules
    that cannot be traced stay ``call_module``) and tuple-valued arguments of cat/stack
    become lists of getitems. Unless every node already has a static-shape
    ``meta["example_value"]`` (Dynamo graphs), fake-tensor propagation sets
    ``meta["val"]`` and ``meta["example_value"]`` on every node; on symbolic_trace graphs
    this costs about 3 ms per node. Values and signature are unchanged.
    """
    out = _inline_modules(gm)
    if not _has_static_meta(out):
        _propagate_meta(out, example_inputs)
    _unpack_tensor_lists(out)
    return out


def optimus_counters() -> dict[str, int]:
    """Snapshot of ``torch._dynamo.utils.counters["inductor"]`` (which Optimus passes fired)."""
    return {k: v for k, v in counters["inductor"].items() if v}


def optimus(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, dict[str, Any]] | None = None,
) -> fx.GraphModule:
    """Apply Optimus's pre-grad passes to a copy of ``gm``; ``gm`` itself is not changed.

    ``options`` defaults to ``OPTIMUS_PRE_GRAD``. The result takes the same inputs as
    ``gm``; its ``meta`` holds ``optimus_counters`` (the counters the passes produced),
    ``optimus_prepare_s`` (``prepare``: the part Dynamo does during capture) and
    ``optimus_passes_s`` (Optimus itself).
    """
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes
    from torch._inductor.pattern_matcher import stable_topological_sort

    options = OPTIMUS_PRE_GRAD if options is None else options
    verify_options(options, {})
    start = time.perf_counter()
    out = prepare(gm, example_inputs)
    prepared = time.perf_counter()
    counters["inductor"].clear()
    with config.patch(pre_grad_fusion_options=copy.deepcopy(options), force_disable_caches=True):
        out = pre_grad_passes(out, list(example_inputs))
    fired = optimus_counters()
    # fuse() can insert a node ahead of its inputs, and leaves unused weights behind. FX's
    # dead-code elimination alone would also drop an in-place write whose result is unused.
    stable_topological_sort(out.graph)
    out.graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or is_mutation(n))
    out.graph.lint()
    out.recompile()
    out.meta["optimus_counters"] = fired
    out.meta["optimus_prepare_s"] = prepared - start
    out.meta["optimus_passes_s"] = time.perf_counter() - prepared
    return out


def inductor_with_optimus(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    post_grad: bool = True,
) -> fx.GraphModule:
    """The Optimus arm: ``optimus(gm)`` ready for ``measure.compile_inductor``.

    With ``post_grad`` the result also carries
    ``meta["inductor_config_patches"] = {"post_grad_fusion_options": OPTIMUS_POST_GRAD}``,
    which ``measure.compile_inductor`` applies, so the ATen-level Optimus passes run too.
    """
    out = optimus(gm, example_inputs)
    if post_grad:
        out.meta["inductor_config_patches"] = post_grad_patches()
    return out


# Inductor options the optimus_egg backend compiles the backward graph with. torch 2.13's
# in-place buffer reuse lets a backward kernel overwrite a saved activation that another saved
# tensor is a view of: with y = tanh(x @ cat([w0, w1]).T) and a piece of split(y) later
# multiplied by w0, plain torch.compile returns a wrong gradient for w0 (the tanh backward
# writes into y's buffer before an addmm reads the piece). Rewrites that apply an op to a
# wide tensor and split it after (batch_*_lhs, pointwise-of-split-piece) make that shape
# likelier. The forward keeps the reuse: it reads no saved tensors. Without it in the
# backward, same launches on the bench models (tests/test_backend.py has the case).
EGG_BACKWARD: dict[str, Any] = {"inplace_buffers": False}
# Inductor options the optimus_egg backend compiles a training graph with where it calls a
# shared body (`nested_compile_region`'s invoke_subgraph) whose results need a gradient
# (`parts.trains_a_shared_body`): neither buffer reuse nor in-place buffers, in the forward and
# the backward. With torch 2.13's buffer reuse in the forward, a random program's graph
# rewritten around such calls trained to wrong gradients while its values were right (a buffer
# reused while a saved tensor still needed it; aot_eager on the same graph, and Inductor
# without the reuse, are right). With its in-place buffers, plain torch.compile trains a body
# as small as one tanh, called twice, to wrong weight gradients
# (`tests/test_backend.py::test_a_shared_body_called_twice_trains_as_eagerly`). Costs memory,
# not launches. (Inductor then writes C++ that does not compile for the mask stores,
# `mask_stores.py`: the backend leaves them out.)
SHARED_BODY_TRAINING: dict[str, Any] = {"allow_buffer_reuse": False, "inplace_buffers": False}


def backward_patched(patches: dict[str, Any], inner: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """An `inner_compile` for Inductor's compile_fx that compiles the backward graph with the
    config `patches` and the forward as it is."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner

    inner = compile_fx_inner if inner is None else inner

    def compile_inner(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward"):
            with config.patch(patches):
                return inner(gm, example_inputs, **kwargs)
        return inner(gm, example_inputs, **kwargs)

    return compile_inner


def as_backend_compiles(gm: fx.GraphModule, post_grad: bool = True, kernel_order: bool = True,
                        gemm_loops: bool = True, mask_stores: bool = True, hoist: bool = True) -> fx.GraphModule:
    """Mark `gm` (optimize()'s result) so that measure.compile_inductor compiles it as the
    backend does: `backend_patches(post_grad, kernel_order, gemm_loops, mask_stores)`,
    EGG_BACKWARD for the backward graph, with `hoist` its parameter copies computed once in
    inference (hoist.py)."""
    gm.meta["inductor_config_patches"] = backend_patches(post_grad, kernel_order, gemm_loops, mask_stores)
    gm.meta["inductor_backward_config_patches"] = EGG_BACKWARD
    gm.meta["hoist_parameters"] = hoist
    return gm


def backend_patches(post_grad: bool = True, kernel_order: bool = True, gemm_loops: bool = True,
                    mask_stores: bool = True) -> dict[str, Any]:
    """The Inductor config the optimus_egg backend compiles with: with `post_grad` the post-grad
    passes EGG_POST_GRAD, with `kernel_order` the CPU kernel order (`kernel_order.KERNEL_ORDER`),
    with `gemm_loops` small GEMMs as loops after the post-grad batching, which then
    leaves those GEMMs alone (`gemm_loops.GEMM_LOOPS`, `egg_post_grad`), with `mask_stores`
    saved bool masks stored as bytes (`mask_stores.MASK_STORES`); they apply to the backward
    graph too. Whatever the switches, body graphs' view results are copied
    (`body_outputs.BODY_OUTPUTS`, a fix for Inductor, not a codegen choice), adds to an mm
    are written so that Inductor's addmm fold keeps their `alpha` and computes `m + m` once
    (`mm_adds.MM_ADDS`, a fix too), and the ops of `optimus_egg.ops` are marked cacheable
    (`ops.cacheable`). Each pass has a uuid, so Inductor's and AOT autograd's caches work as
    for plain torch.compile."""
    from optimus_egg.body_outputs import BODY_OUTPUTS
    from optimus_egg.gemm_loops import GEMM_LOOPS
    from optimus_egg.kernel_order import KERNEL_ORDER
    from optimus_egg.mask_stores import MASK_STORES
    from optimus_egg.mm_adds import MM_ADDS

    from torch._inductor import config

    from optimus_egg import ops

    custom = [p for p, on in ((BODY_OUTPUTS, True), (GEMM_LOOPS, gemm_loops), (MASK_STORES, mask_stores)) if on]
    return {**(post_grad_patches(egg_post_grad(gemm_loops)) if post_grad else {}), **(KERNEL_ORDER if kernel_order else {}),
            "post_grad_custom_pre_pass": MM_ADDS, "post_grad_custom_post_pass": PostPasses(custom),
            "unsafe_marked_cacheable_functions": {**config.unsafe_marked_cacheable_functions, **ops.cacheable()}}


class PostPasses(CustomGraphPass):
    """Post-grad passes run in order from Inductor's one `post_grad_custom_post_pass` slot. Its
    uuid, which keys Inductor's FX graph cache, names each pass's and this file's source (the
    post-grad batchings registered here run by name from `post_grad_fusion_options`), and the
    fusion estimate's, which the batchings consult."""

    def __init__(self, passes: Sequence[CustomGraphPass]):
        self.passes = tuple(passes)

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> str:
        from optimus_egg import kernel_order
        from optimus_egg.extract import fusion_cost, launch_cost

        # (the batchings' "fewer_launches" check reads the fusion estimate's files)
        source = get_hash_for_files((__file__, fusion_cost.__file__, launch_cost.__file__, kernel_order.__file__)).hex()
        return "+".join([f"optimus_egg.baselines:{source}", *(str(p.uuid()) for p in self.passes)])


def post_grad_patches(passes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Inductor config patches that run post-grad (ATen-level) Optimus passes, ``passes``
    (default ``OPTIMUS_POST_GRAD``; the optimus_egg backend uses ``EGG_POST_GRAD``), next to
    any post-grad fusions already configured."""
    from torch._inductor import config

    passes = OPTIMUS_POST_GRAD if passes is None else passes
    verify_options({}, passes)
    return {"post_grad_fusion_options": {**copy.deepcopy(config.post_grad_fusion_options),
                                         **copy.deepcopy(passes)}}
