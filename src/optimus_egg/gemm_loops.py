"""Small GEMMs as loops: an Inductor post-grad pass the backend compiles with (`gemm_loops`, on by default).

On CPU Inductor calls every mm / addmm / bmm / baddbmm as an extern kernel (MKL), one launch
each, except the few it decomposes itself (a dot or small outer product; `launch_cost.
elementwise_matmul`), and each call splits the C++ code around it into two kernels. A small
GEMM is cheaper written as what it is, a broadcast multiply and a sum over K, which Inductor
generates as C++ code and fuses with its neighbours: the launch goes, and with it the call
overhead that dominates a GEMM of a few thousand multiply-adds. This pass rewrites, in the
ATen graph Inductor compiles (forward and backward, after any post-grad batching), each GEMM
of at most MAX_MACS multiply-adds whose operands are CPU tensors of one of DTYPES and static
shape, beta and alpha 1, and whose loops vectorize (`vectorizes`). Every other GEMM stays an
extern call. bfloat16 and float16 operands are widened to float32, multiplied and summed, and
the result rounded once, as the GEMM library accumulates them (rounding each product would
lose precision the call keeps).

Inductor vectorizes the loops of A [M, K] @ B [K, N] along N where B's rows are contiguous, or
along K where A's rows and B's columns are; otherwise they run scalar. Inductor reads through
the views and copies between an operand and the buffer it comes from, so the layout that counts
is that buffer's: `vectorizes` replays them on the buffer's element offsets. Scalar loops lose
to the call: wukong's linears over transposed embeddings ([1024, 8] @ [8, 8], each row read
with stride 16), as loops, left its forward 1.07 x slower than plain Inductor's; called, with
the search merging them into one extern GEMM, 0.83 x (`python bench/gemm_loops.py`). Where the
layout cannot be replayed (a symbolic size, an op that fails on it) the GEMM stays a call.

The limit is measured (`python bench/loops_limit.py`: the pricing, the pass and the post-grad
batchings at each limit, 1 torch thread, interleaved rounds, latency against plain Inductor).
The pass writes every vectorizing GEMM of at most MAX_MACS = 65,536 multiply-adds, in every
mode and dtype, and the post-grad batchings leave those alone: against the same graph with
every GEMM a call no model ran slower up to it, while at 131,072 illustrative's chained
[64, 64] x [64, 64] layers ran 1.15 x slower. The post-grad batchings must leave alone
everything the pass writes: leaving alone only GEMMs within 32,768, wukong and dhen compiled
to 40 and 32 training launches against 39 and 28.

The search knows it: `optimize(..., gemm_loops=True)` (what the backend calls) prices a GEMM
within MAX_MACS as elementwise code plus its loops' work, its multiply-adds over MAX_MACS
(extract/launch_cost.py, table "cpu_loops", `loop_work`), so it leaves such GEMMs unbatched
instead of batching them into one past the limit that stays a call, unless a group's work
passes one call's (illustrative's sixteen [32, 16] @ [16, 16] linears: batched, 0.35 x plain
Inductor with 12 launches; as loops, 0.87 x with 1; dcn_v2's twelve low-rank experts:
batched into calls, 16 launches); and the backend's post-grad GEMM batchings leave alone what
the pass writes (baselines.egg_post_grad). One limit serves both: pricing as loops only GEMMs
within 32,768 (a call past it, which the search batches with its siblings) gave the same graph
on every model and mode but mmoe and, in float16 (whose loop work is free:
launch_cost.loop_break_even), dcn_v2, each slower (float32 inference mmoe 0.70 x plain
Inductor against 0.59 x, bfloat16 0.41 x against 0.35 x; float16 dcn_v2 0.86 x against 0.41 x,
its training step 0.98 x against 0.39 x: bench/HISTORY.md).

A GEMM whose loops would not vectorize stays a call forward, but its backward GEMMs read other
layouts and the pass writes them up to MAX_MACS; the search prices it so up to MAX_MACS
(launch_cost.scalar_loops), or it would merge wukong's [1024, 8] @ [8, 4] and [1024, 8] @ [8, 8]
transposed-embedding linears into one past MAX_MACS, two calls more in the backward.
`backend(gemm_loops=False)` compiles without the pass.
"""
from __future__ import annotations

import math

import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

# The most multiply-adds of a GEMM written as loops, and priced so, in every mode and dtype
# (module doc: measured).
MAX_MACS = 65536
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
COUNTER = "gemm_as_loops"
REPEATS_COUNTER = "repeated_reductions_copied"

aten = torch.ops.aten
prims = torch.ops.prims
_WIDENED = (torch.bfloat16, torch.float16)  # multiplied and summed in float32 (module doc)
# target -> index of its first GEMM operand (1 where a bias comes first)
_GEMMS = {aten.mm.default: 0, aten.bmm.default: 0, aten.addmm.default: 1, aten.baddbmm.default: 1}


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def written_as_loops(node: fx.Node, max_macs: int = MAX_MACS) -> bool:
    """Is `node` a GEMM this pass rewrites?"""
    return small_gemm(node, max_macs) and vectorizes(node)


def small_gemm(node: fx.Node, max_macs: int = MAX_MACS) -> bool:
    """Is `node` a GEMM of at most `max_macs` multiply-adds on CPU tensors of
    one of DTYPES and static shape, beta and alpha 1 (the loops' operands, whatever their
    layout)?"""
    first = _GEMMS.get(node.target)
    if first is None or len(node.args) != first + 2:
        return False
    if any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or set(node.kwargs) - {"beta", "alpha"}:
        return False
    vals = [_val(a) for a in node.args]
    if any(not isinstance(v, torch.Tensor) for v in vals):
        return False
    a, b = vals[first], vals[first + 1]
    dtypes = {v.dtype for v in vals}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if dtype not in DTYPES:
        return False
    if any(v.device.type != "cpu" for v in vals):
        return False
    dims = (*a.shape, b.shape[-1])
    if not all(isinstance(d, int) for d in dims):
        return False
    return math.prod(dims) <= max_macs


# Ops Inductor reads through without a buffer of their own: an operand behind them is read
# from the buffer before them, with their index arithmetic.
_LAYOUT_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default,
               aten.permute.default, aten.transpose.int, aten.t.default, aten.unsqueeze.default,
               aten.squeeze.dim, aten.squeeze.default, aten.expand.default, aten.alias.default}


def source_offsets(a: fx.Node) -> torch.Tensor:
    """For each element of operand `a`, its offset in the buffer Inductor reads it from: the
    layout ops before `a` replayed on that buffer's offsets (an int64 tensor of a's shape)."""
    chain = []
    while a.op == "call_function" and a.target in _LAYOUT_OPS and isinstance(a.args[0], fx.Node):
        chain.append(a)
        a = a.args[0]
    v = _val(a)
    span = 1 + sum((s - 1) * st for s, st in zip(v.shape, v.stride()))
    t = torch.as_strided(torch.arange(span), v.shape, v.stride())
    for n in reversed(chain):
        t = n.target(t, *n.args[1:], **n.kwargs)
    return t


def _unit(offsets: torch.Tensor, dim: int) -> bool:
    """Are consecutive elements along `dim` adjacent in memory?"""
    return offsets.shape[dim] < 2 or bool((offsets.diff(dim=dim) == 1).all())


def vectorizes(node: fx.Node) -> bool:
    """Do the loops of GEMM `node` (A [.., M, K] @ B [.., K, N]) vectorize: B's rows contiguous
    in the buffer they are read from (along N), or A's rows and B's columns (along K)?"""
    first = _GEMMS[node.target]
    try:
        a, b = source_offsets(node.args[first]), source_offsets(node.args[first + 1])
        return _unit(b, -1) or (_unit(a, -1) and _unit(b, -2))
    except Exception:  # noqa: BLE001 - a layout that cannot be replayed: leave the GEMM a call
        return False


def call_with_val(graph: fx.Graph, target, args: tuple) -> fx.Node:
    """A call_function node of `target` on `args`, its meta["val"] computed from theirs (the
    fake tensors of a post-grad graph). Inserted where the graph's insert point is."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*(_val(a) if isinstance(a, fx.Node) else a for a in args))
    return node


def rewrite(graph: fx.Graph, max_macs: int = MAX_MACS) -> int:
    """Rewrite each small GEMM of `graph` as multiply + sum (module doc); returns how many."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not written_as_loops(node, max_macs):
            continue
        first = _GEMMS[node.target]
        a, b = node.args[first], node.args[first + 1]
        k = _val(a).dim() - 1  # the K dim of a; b's K dim is k - 1
        dtype = _val(a).dtype
        with graph.inserting_before(node):
            if dtype in _WIDENED:
                a, b = (call_with_val(graph, prims.convert_element_type.default, (x, torch.float32)) for x in (a, b))
            a_k1 = call_with_val(graph, aten.unsqueeze.default, (a, k + 1))
            b_1k = call_with_val(graph, aten.unsqueeze.default, (b, k - 1))
            prod = call_with_val(graph, aten.mul.Tensor, (a_k1, b_1k))
            out = call_with_val(graph, aten.sum.dim_IntList, (prod, [k]))
            if first:
                out = call_with_val(graph, aten.add.Tensor, (out, node.args[0]))
            if dtype in _WIDENED:
                out = call_with_val(graph, prims.convert_element_type.default, (out, dtype))
        # provenance only: the GEMM's tensor_meta (strides) need not hold for the sum
        out.meta.update({key: node.meta[key] for key in ("stack_trace", "nn_module_stack", "seq_nr") if key in node.meta})
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done += 1
    counters["inductor"][COUNTER] += done
    return done


_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.amax.default, aten.amin.default}


def copy_repeated_reductions(graph: fx.Graph) -> int:
    """Make each low-precision reduction that repeats an earlier one (same op, operands and
    arguments, no write between them) a copy of it; return how many. Inductor fuses such a pair
    into one loop over the shared sum and stores it twice, and its C++ code for that declares
    the rounded sum twice in one scope (`auto at_BFloat16_tmp_acc0_vec`): a compile error in
    torch 2.13. Plain Inductor's extern GEMMs keep the pair apart; the loops put them in one
    kernel (a training step whose two biases get one gradient: two equal sums over the rows).
    The copy keeps the results apart in memory, as they are: two parameters' gradients must
    not be one tensor."""
    from torch._inductor.pattern_matcher import compute_mutation_region_ids, same_mutation_regions

    compute_mutation_region_ids(graph)
    seen: dict[tuple, fx.Node] = {}
    done = 0
    for node in list(graph.nodes):
        val = _val(node)
        if node.op != "call_function" or node.target not in _REDUCTIONS or not isinstance(val, torch.Tensor) \
                or val.dtype not in _WIDENED:
            continue
        key = (node.target, repr(node.args), repr(node.kwargs))
        first = seen.setdefault(key, node)
        if first is node or not same_mutation_regions(first, node):
            continue
        with graph.inserting_after(node):
            copy = graph.call_function(aten.clone.default, (first,))
        copy.meta.update(node.meta)
        node.replace_all_uses_with(copy)
        graph.erase_node(node)
        done += 1
    counters["inductor"][REPEATS_COUNTER] += done
    return done


class GemmLoops(CustomGraphPass):
    """`rewrite` as an Inductor post_grad_custom_post_pass (its uuid keys Inductor's cache),
    then `copy_repeated_reductions`."""

    def __init__(self, max_macs: int = MAX_MACS):
        self.max_macs = max_macs

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph, self.max_macs)
        copy_repeated_reductions(graph)

    def uuid(self) -> str:
        source = get_hash_for_files((__file__,)).hex()
        return f"optimus_egg.gemm_loops:{self.max_macs}:{source}"


GEMM_LOOPS = GemmLoops()
