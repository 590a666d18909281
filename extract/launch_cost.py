"""Cost = kernels Inductor would launch for one node; views, leaves and tuple plumbing are free.

Figures measured by `python bench/calibrate.py` (Inductor C++ on CPU, torch 2.13), per op
with four independent copies in one graph:

    linear 1.00   pointwise after a GEMM 1.00   pointwise alone 0.25   layer_norm 1.00
    stack of inputs 0.25   cat of GEMM outputs 0.00 (the GEMMs write into the cat buffer)

A GEMM and a reduction always launch; elementwise ops and copies fuse with a neighbour or
with each other (horizontally), so they cost a fraction: 0.5 for elementwise, 0.25 for
stack/cat. These stay per-node figures: fusion depends on neighbours, which a per-node cost
cannot see, so the table errs towards counting elementwise work; fusion_cost.py estimates a
whole graph with its fusion, and optimize() checks its result with it.

Equal launch counts are told apart by work (work.py), added by pipeline.node_cost.

The prices are data, one table per target (`TABLES`). Only "cpu" is measured; no GPU has been
available to calibrate a "cuda" table (`python bench/calibrate.py --device cuda` prints the
probes), so graphs on a GPU are priced with the CPU table and the optimize report says so.
"cpu_loops" is the CPU target compiled with small GEMMs as loops (src/optimus_egg/gemm_loops.py,
`optimize(..., gemm_loops=True)`): the same prices, but a GEMM of at most gemm_loops.MAX_MACS
multiply-adds, which the pass writes as loops, is elementwise code there, like Inductor's own
small decompositions below, plus its loops' work in launch-equivalents (`loop_work`: a group of
them can take longer than one batched call); one past it is priced a call (`LOOP_LIMITS`).
"""
from __future__ import annotations

import math

from optimus_egg.gemm_loops import DTYPES as LOOP_DTYPES, MAX_MACS

FREE = {"input", "none", "item", "split", "unbind", "outputs", "movedim", "unflatten", "narrow", "squeeze",
        "reshape"}  # as a template reshape (VIEW_TARGETS); it copies only where strides allow no view
# Launches per node kind, per target (calibrated figures above).
TABLES: dict[str, dict[str, float]] = {
    "cpu": {"gemm": 1.0, "reduction": 1.0, "elementwise": 0.5, "copy": 0.25},
}
LOOPS = "cpu_loops"  # the CPU target with small GEMMs as loops: CPU prices, loops_gemm below
# The loops' limit per table: the most multiply-adds of a GEMM priced as loops (the pass's).
LOOP_LIMITS = {LOOPS: MAX_MACS}
for _t in LOOP_LIMITS:
    TABLES[_t] = dict(TABLES["cpu"])
CPU_TABLES = ("cpu", *LOOP_LIMITS)  # tables of Inductor's C++ backend: the fusion estimate counts its kernels
# The kind of each constructor with a price; flatten copies when its input is not contiguous.
KIND = {"linear": "gemm", "batched_linear": "gemm", "layer_norm": "reduction", "batched_layer_norm": "reduction",
        "cat": "copy", "stack": "copy", "flatten": "copy", "unary": "elementwise", "binary": "elementwise"}
VIEW_TARGETS = {"view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "movedim",
                "squeeze", "unsqueeze", "expand", "narrow", "select", "getitem", "split", "chunk",
                "unbind", "view_as", "reshape_as", "contiguous", "detach", "size", "dim",
                "split_with_sizes", "diagonal", "as_strided", "sym_size", "getattr"}
# Template calls by FX target name; batched_* are optimus_egg's own ops (src/optimus_egg/ops.py)
# in a graph it already optimized, which must cost what their constructors cost.
GEMM_TARGETS = {"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "einsum", "embedding_bag",
                "conv1d", "conv2d", "scaled_dot_product_attention", "batched_linear"}
REDUCTION_TARGETS = {"sum", "mean", "softmax", "log_softmax", "amax", "max", "min", "layer_norm",
                     "native_layer_norm", "var", "std", "norm", "cumsum", "prod", "logsumexp",
                     "batched_layer_norm"}


def table_for(device_type: str, gemm_loops: bool = False) -> str:
    """The name of the table that prices graphs on `device_type` ("cpu", "cuda", ...), compiled
    with small GEMMs as loops if `gemm_loops` (a CPU-only pass: other devices ignore it)."""
    if device_type == "cpu" and gemm_loops:
        return LOOPS
    return device_type if device_type in TABLES and device_type not in LOOP_LIMITS else "cpu"


def table_of(inputs, gemm_loops: bool = False) -> str:
    """The table for a graph run on `inputs` (with its parameters, where given): their device's,
    "cpu" where they are on several; with `gemm_loops`, on CPU where every floating tensor has
    a dtype the loops rewrite (gemm_loops.DTYPES), LOOPS."""
    tensors = [x for x in inputs if hasattr(x, "device") and hasattr(x, "dtype")]
    devices = {x.device.type for x in tensors}
    floats = {x.dtype for x in tensors if x.dtype.is_floating_point}
    loops = gemm_loops and floats <= set(LOOP_DTYPES)
    return table_for(devices.pop() if len(devices) == 1 else "cpu", loops)


def graph_table(gm, inputs, gemm_loops: bool = False) -> str:
    """`table_of` a GraphModule run on `inputs`: its inputs, parameters and buffers."""
    return table_of([*inputs, *gm.parameters(), *gm.buffers()], gemm_loops)


def loops_gemm(macs: float, table: str, scalar: bool = False) -> bool:
    """Is a GEMM of `macs` multiply-adds one the target writes as loops (gemm_loops.py)? Shapes
    with a symbolic dim (priced as huge) never are, nor a GEMM whose loops would be `scalar`
    (not vectorized: gemm_loops.vectorizes)."""
    return macs <= LOOP_LIMITS.get(table, -1) and not scalar


# In training a GEMM's launches are three calls, its forward and two in the backward (the
# input's gradient and the weight's), and its price, one unit, stands for all three. A small
# GEMM whose loops would run scalar forward (an operand's rows strided: a call) has backward
# GEMMs the loops write as vectorized code (one reads the contiguous gradient, the other the
# weight): one call of the three. Wukong's linears over transposed embeddings, merged into one
# GEMM past the loops' limit, compiled to 41 launches for a training step, against 39 apart.
TRAINING_SCALAR_GEMM = 1 / 3


def scalar_gemm_price(table: str, training: bool) -> float:
    """The price of a GEMM the loops would write but run scalar, so it stays a call."""
    return TABLES[table]["gemm"] * (TRAINING_SCALAR_GEMM if training else 1.0)


def gemm_macs(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> int | None:
    """Multiply-adds of matmul(a [.., M, K], b [.., K, N]) where the loops could write it (b a
    matrix or with a's batch dims); None otherwise."""
    if a and b and len(a) >= 2 and len(b) >= 2 and (len(b) == 2 or tuple(a[:-2]) == tuple(b[:-2])):
        return math.prod(a) * b[-1]
    return None


def linear_macs(x: tuple[int, ...] | None, w: tuple[int, ...] | None) -> int | None:
    """Multiply-adds of linear(x [.., K], w [O, K]) or batched_linear(x [G, .., K], w [G, O, K]);
    None where a shape is unknown."""
    return math.prod(x) * w[-2] if x and w and len(w) in (2, 3) else None


def scalar_loops(macs: int | None, table: str) -> bool:
    """Is a GEMM of `macs` multiply-adds one the pass would write as loops were its layout to let
    them vectorize? Where it would not, it stays a call priced `scalar_gemm_price`: its backward
    GEMMs read other layouts, which the pass writes, so merged with a sibling into one GEMM past
    the limit it would make two more calls, not save one."""
    return macs is not None and loops_gemm(macs, table)


def launch_cost(op: str, target_name: str | None = None, table: str = "cpu") -> float:
    """Launches for node `op` under TABLES[table]; template calls pass their FX target's name."""
    price = TABLES[table]
    if op in FREE:
        return 0.0
    if op in KIND:
        return price[KIND[op]]
    if op in ("call", "call_multi"):
        if target_name in VIEW_TARGETS:
            return 0.0
        if target_name in GEMM_TARGETS:
            return price["gemm"]
        if target_name in REDUCTION_TARGETS:
            return price["reduction"]
        return price["elementwise"]
    raise ValueError(f"launch_cost: unknown op {op!r}")


# Inductor's CPU decomposition of addmm(bias, x [1, K], w.T [K, N]) with K, N <= 16 into
# elementwise code and a sum (torch/_inductor/decomposition.py `addmm`): such a linear launches
# no GEMM and fuses with its neighbours; a batch of them (one bmm) would launch one.
SMALL_ADDMM = 16


def elementwise_linear(x: tuple[int, ...] | None, w: tuple[int, ...] | None, bias: bool, table: str = "cpu",
                       strided: bool = False) -> bool:
    """Is linear(x, w, bias) one Inductor computes as elementwise code on this target? `strided`:
    x's rows are not contiguous (shapes.rows_strided), so the loops would not vectorize (w.T's
    rows never are)."""
    if not x or not w or len(w) != 2:
        return False
    if loops_gemm(linear_macs(x, w), table, scalar=strided):
        return True
    if table not in CPU_TABLES or not bias:
        return False
    return math.prod(x[:-1]) == 1 and w[0] <= SMALL_ADDMM and w[1] <= SMALL_ADDMM


def elementwise_matmul(a: tuple[int, ...] | None, b: tuple[int, ...] | None, table: str = "cpu",
                       strided: bool = False, bias: bool = False) -> bool:
    """Is mm / bmm / matmul(a, b) one Inductor computes as elementwise code on this target? On
    CPU its decompositions turn a dot product ([1, K] @ [K, 1]) and a small outer product
    ([M, 1] @ [1, N], at most 32 elements in) into multiplies and a sum; its bmm lowering does
    the same for every batched matrix-vector product ([B, 1, K] @ [B, K, N] or
    [B, M, K] @ [B, K, 1], any size) and its decomposition for a batch of outer products
    ([B, M, 1] @ [B, 1, N]). With the loops (LOOP_LIMITS) every product of at most the limit
    multiply-adds is, whose second operand is a matrix or has the first's batch dims, unless
    `strided`: neither operand's rows are contiguous (shapes.rows_strided), so the loops would
    not vectorize. `bias`: Inductor folds an add into a 2-D product as its bias (an addmm),
    whose decomposition computes [1, K] @ [K, N] with K, N <= 16 as elementwise code, as for a
    linear (SMALL_ADDMM)."""
    macs = gemm_macs(a, b)
    if macs is not None and loops_gemm(macs, table, scalar=strided):
        return True
    if table not in CPU_TABLES or not a or not b or len(a) != len(b) or len(a) not in (2, 3):
        return False
    if len(a) == 3:
        return a[1] == 1 or b[2] == 1 or (a[2] == 1 and b[1] == 1)
    if a[0] == 1 and (b[1] == 1 or (bias and b[0] <= SMALL_ADDMM and b[1] <= SMALL_ADDMM)):
        return True
    return a[1] == 1 and a[0] != 1 and b[1] != 1 and a[0] + b[1] <= 32


def loop_break_even(tensors) -> float:
    """The multiply-adds at which a GEMM call takes as long as loops of the same work, for a graph
    of these tensors (inputs, parameters): gemm_loops.MAX_MACS, the pass's break-even, but where
    one is float16, whose GEMM calls this machine's CPU runs without a fast kernel: there the
    loops always win (illustrative's float16 inference ran 0.50 x plain Inductor with its
    linears as loops, 0.79 x batched into calls; bfloat16 0.29 x and 0.18 x: the bench's tables)."""
    half = any(str(getattr(x, "dtype", "")) == "torch.float16" for x in tensors)
    return math.inf if half else float(MAX_MACS)


def loop_work(macs: int | None, table: str, scalar: bool = False, break_even: float = MAX_MACS) -> float:
    """The launch-equivalents of a GEMM of `macs` multiply-adds the target writes as loops
    (`loops_gemm`): its work over `break_even` (`loop_break_even`), the size at which one GEMM's
    loops take as long as a call; 0 for any other. Per GEMM the loops always win, but a group of
    them against one batched call loses once its total passes one call's: illustrative's 96
    [32, 16] @ [16, 16] linears as loops (1 launch) ran 0.87 x plain Inductor's latency, batched
    into 6 calls (12 launches) 0.35 x, side by side (README, "Small GEMMs as loops")."""
    return macs / break_even if macs is not None and loops_gemm(macs, table, scalar) else 0.0


def batch_of_loops(x: tuple[int, ...] | None, w: tuple[int, ...] | None, table: str = "cpu") -> bool:
    """Is batched_linear(x [G, *, K], w [G, O, K]) a call (past the loops' limit) whose G members the
    loops would write as code apart? Its price is then its members' code plus one call
    (pipeline.node_cost), against the members' code and loop work apart (`loop_work`): the
    batch wins once the group's work passes one call's, G x macs > MAX_MACS (never in
    float16). The members' code fuses into the kernels around them, so priced at the call
    alone the search batched 16
    [12, 16] @ [16, 16] linears between layer norms (49,152 multiply-adds in all) and the
    fusion estimate kept the input; priced so, it batches the layer norms and leaves the
    linears loops."""
    if not x or not w or len(x) < 2 or len(w) != 3:
        return False
    return loops_gemm(linear_macs(x[1:], w), table) and not loops_gemm(linear_macs(x, w), table)


def elementwise_batched_linear(x: tuple[int, ...] | None, w: tuple[int, ...] | None, bias: bool,
                               table: str = "cpu") -> bool:
    """Is batched_linear(x [G, *, K], w [G, O, K]) one the target computes as elementwise code?
    Without a bias it is one bmm of [G, M, K] @ [G, K, O] (M the product of x's middle dims,
    ops.batched_linear); with one, a baddbmm, which Inductor calls unless the loops write it."""
    if not x or not w or len(x) < 2 or len(w) != 3:
        return False
    if loops_gemm(linear_macs(x, w), table):
        return True
    if bias:
        return False
    return elementwise_matmul((x[0], math.prod(x[1:-1]), x[-1]), (w[0], w[2], w[1]), table)
