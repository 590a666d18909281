"""The e-graph language: sorts, op constructors and analyses that rules match on.

Every FX value is a `Tensor` (non-tensor values such as sizes travel the same way through
`Tensor.call`). Ops that rules read have their own constructor; every other FX node is a
`Tensor.call(op, args)` whose `op` indexes a template kept by `from_fx` (target and
non-tensor arguments), so any graph round-trips unchanged. `egg_fn` names are the op names
that `extract` and `to_fx` read from the serialized e-graph.
"""
from __future__ import annotations

from egglog import Expr, StringLike, Unit, Vec, f64, f64Like, function, i64, i64Like, method


class Tensor(Expr):
    @method(egg_fn="input")
    @classmethod
    def input(cls, name: StringLike) -> Tensor: ...  # placeholder or get_attr, by FX name

    @method(egg_fn="none")
    @classmethod
    def none(cls) -> Tensor: ...  # an absent optional tensor (bias, affine weight)

    @method(egg_fn="call")
    @classmethod
    def call(cls, op: i64Like, args: Vec[Tensor]) -> Tensor: ...

    @method(egg_fn="unary")
    @classmethod
    def unary(cls, op: i64Like, x: Tensor) -> Tensor: ...  # an elementwise template op on one tensor

    @method(egg_fn="binary")
    @classmethod
    def binary(cls, op: i64Like, x: Tensor, y: Tensor) -> Tensor: ...  # elementwise template op, same-shape x and y


class Pieces(Expr):
    """A tuple of tensors (split, unbind, or a tuple-valued template op)."""

    @method(egg_fn="call_multi")
    @classmethod
    def call(cls, op: i64Like, args: Vec[Tensor]) -> Pieces: ...

    @method(egg_fn="item")
    def __getitem__(self, i: i64Like) -> Tensor: ...


class Outputs(Expr):
    """The synthetic root: all graph outputs, extracted together so sharing is kept."""

    @method(egg_fn="outputs")
    @classmethod
    def of(cls, values: Vec[Tensor]) -> Outputs: ...


@function(egg_fn="linear")
def linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor: ...


@function(egg_fn="layer_norm")
def layer_norm(x: Tensor, shape: Vec[i64], w: Tensor, b: Tensor, eps: f64Like) -> Tensor: ...


@function(egg_fn="cat")
def cat(xs: Vec[Tensor], d: i64Like) -> Tensor: ...


@function(egg_fn="stack")
def stack(xs: Vec[Tensor], d: i64Like) -> Tensor: ...


@function(egg_fn="split")
def split(x: Tensor, sizes: Vec[i64], d: i64Like) -> Pieces: ...


@function(egg_fn="unbind")
def unbind(x: Tensor, d: i64Like) -> Pieces: ...


@function(egg_fn="movedim")
def movedim(x: Tensor, src: i64Like, dst: i64Like) -> Tensor: ...  # a view


@function(egg_fn="flatten")
def flatten(x: Tensor, start: i64Like, end: i64Like) -> Tensor: ...  # a view when x is contiguous


@function(egg_fn="unflatten")
def unflatten(x: Tensor, d: i64Like, sizes: Vec[i64]) -> Tensor: ...  # a view


@function(egg_fn="reshape")
def reshape(x: Tensor, sizes: Vec[i64]) -> Tensor: ...  # to static sizes (no -1); a view where strides allow


@function(egg_fn="narrow")
def narrow(x: Tensor, d: i64Like, start: i64Like, length: i64Like) -> Tensor: ...  # a view: x[start:start+length] on d


@function(egg_fn="squeeze")
def squeeze(x: Tensor, d: i64Like) -> Tensor: ...  # a view: drops dim d, whose size is 1


@function(egg_fn="batched_linear")
def batched_linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """x [N, M, K] @ w[N, O, K]^T + b[N, O] (or no bias): one bmm / baddbmm."""


@function(egg_fn="batched_layer_norm")
def batched_layer_norm(x: Tensor, shape: Vec[i64], w: Tensor, b: Tensor, eps: f64Like) -> Tensor:
    """layer_norm over the trailing `shape` dims of x [N, ...], then per-member affine w/b [N, *shape]."""


# ---- analyses and facts (seeded by from_fx, extended by rules) -----------------------

@function(egg_fn="shape")
def shape(x: Tensor) -> Vec[i64]:
    """Static shape. No merge: unioning tensors of different shapes is an error (soundness check)."""


@function(egg_fn="node")
def node(index: i64Like) -> Tensor:
    """The value of FX node `index`: from_fx names every value so, and to_fx reads origins from it."""


@function(egg_fn="linear_slot")
def linear_slot(g: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: independent same-signature linears, operands group_vec(g, 0..2);
    `out` is the shape of the stacked result [N, *member shape]."""


@function(egg_fn="shared_weight")
def shared_weight(g: i64Like) -> Unit:
    """The members of linear group g (linear_slot) read one weight, and one bias or none."""


@function(egg_fn="linear_lhs_slot")
def linear_lhs_slot(x: Tensor, g: i64Like, sizes: Vec[i64], d: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: linears reading the same x, weights/biases group_vec(g, 1..2);
    `sizes` their output widths, `d` the output's last dim, `out` the wide output's shape."""


@function(egg_fn="matmul_lhs_slot")
def matmul_lhs_slot(x: Tensor, op: i64Like, g: i64Like, sizes: Vec[i64], dy: i64Like, d: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: `call(op, [x, y])` matmuls (bmm, matmul, @) reading the same x, their
    second operands group_vec(g, 1), alike but for their last dim `dy`; `sizes` those dims, `d`
    the output's last dim, `out` the wide output's shape."""


@function(egg_fn="matmul_slot")
def matmul_slot(op: i64Like, g: i64Like, d: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: independent `call(op, [x, y])` matmuls (matmul, @) whose operands
    have one shape and dtype per side, operands group_vec(g, 0..1), stacked on batch dim `d`;
    `out` is the shape of the stacked result (N inserted at d)."""


@function(egg_fn="matmul_t_slot")
def matmul_t_slot(op: i64Like, g: i64Like, d: i64Like, last: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """As matmul_slot, where every second operand group_vec(g, 1) is group_vec(g, 2)'s member
    with its last two dims swapped (`k.transpose(-2, -1)`, `k.t()`): the stack of those
    transposes is the stack of the untransposed operands with its last dims swapped
    (`movedim(stack, last, last - 1)`, `last` the member rank), a view."""


@function(egg_fn="layer_norm_slot")
def layer_norm_slot(g: i64Like, shape: Vec[i64], eps: f64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: independent same-signature layer norms, operands group_vec(g, 0..2)."""


@function(egg_fn="pointwise_slot")
def pointwise_slot(op: i64Like, g: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: independent same-shape operands group_vec(g, 0) of one pointwise op."""


@function(egg_fn="binary_slot")
def binary_slot(op: i64Like, g: i64Like, out: Vec[i64], i: i64Like) -> Unit:
    """Member i of group g: independent same-shape, same-dtype operand pairs group_vec(g, 0..1) of one binary op."""


@function(egg_fn="even_split")
def even_split(sizes: Vec[i64], s: i64Like) -> Unit:
    """Every split size in `sizes` is `s` (seeded by from_fx)."""


@function(egg_fn="group_vec")
def group_vec(g: i64Like, k: i64Like) -> Vec[Tensor]:
    """Operand list k of seeded group g (written once, shared by the group's slots)."""


@function(egg_fn="split_starts")
def split_starts(sizes: Vec[i64]) -> Vec[i64]:
    """Where each piece of a split by `sizes` starts: [sum(sizes[:i]) for each i] (seeded by from_fx)."""


@function(egg_fn="piece_linear_lo", merge=lambda old, new: old.min(new))
def piece_linear_lo(p: Pieces, w: Tensor, b: Tensor) -> i64:
    """The lowest i with a linear(p[i], w, b) (batch_linear's linear-piece-reader)."""


@function(egg_fn="piece_linear_hi", merge=lambda old, new: old.max(new))
def piece_linear_hi(p: Pieces, w: Tensor, b: Tensor) -> i64:
    """The highest i with a linear(p[i], w, b): above the lowest, two pieces share the linear."""


@function(egg_fn="cat_operand")
def cat_operand(x: Tensor, d: i64Like, start: i64Like, length: i64Like, y: Tensor) -> Unit:
    """y is the operand of the cat x that covers [start, start + length) of its dim d (seeded by
    from_fx for a cat that is split or sliced)."""


@function(egg_fn="narrow_run")
def narrow_run(xs: Vec[Tensor], x: Tensor, d: i64Like, i: i64Like, start: i64Like, end: i64Like) -> Unit:
    """xs[i:] are adjacent narrows of x on dim d, in order, covering [start, end) of that dim."""


@function(egg_fn="narrow_merge")
def narrow_merge(xs: Vec[Tensor], d: i64Like, i: i64Like, ys: Vec[Tensor], head: Tensor) -> Unit:
    """ys is xs with each run of adjacent narrows of one tensor on dim d in xs[i:] merged into one
    narrow, and xs[:i] as it is. `head` is ys[i], as a column: a narrow the walk makes meets its
    walk fact through an index (matching a computed ys[i] re-scanned every walk fact for each new
    narrow: 6 s instead of 0.1 s for a 94-operand cat)."""


@function(egg_fn="narrow_merge_len", merge=lambda old, new: old.min(new))
def narrow_merge_len(xs: Vec[Tensor], d: i64Like, i: i64Like) -> i64:
    """The fewest operands a narrow_merge(xs, d, i, ...) has: only the most merged ys walks on."""


@function(egg_fn="pieces_from")
def pieces_from(xs: Vec[Tensor], p: Pieces, i: i64Like) -> Unit:
    """xs[j] is p[j] for every j >= i (the pieces family derives it for i = 0)."""


@function(egg_fn="last_operand")
def last_operand(xs: Vec[Tensor], t: Tensor) -> Unit:
    """t is xs's last element, kept as a column so that the piece it is can be looked up
    through an index on the getitem table (a computed xs[n - 1] was matched against every
    getitem row: 0.28 s on the 10,000-node bench graph)."""


@function(egg_fn="pieces_probe")
def pieces_probe(xs: Vec[Tensor], p: Pieces, a: i64Like, b: i64Like) -> Unit:
    """To check: is xs[j] p[j] for every a <= j < b? (a node of a binary split of [0, len(xs)))"""


@function(egg_fn="pieces_span")
def pieces_span(xs: Vec[Tensor], p: Pieces, a: i64Like, b: i64Like) -> Unit:
    """Checked: xs[j] is p[j] for every a <= j < b."""


# The pieces check's own facts (rules/pieces.py): at most four per cat/stack operand.
CHECK_FACTS = frozenset({"last_operand", "pieces_probe", "pieces_span"})


__all__ = [
    "Outputs", "Pieces", "Tensor", "Vec", "batched_layer_norm", "batched_linear", "cat", "cat_operand", "even_split", "flatten", "movedim", "unflatten", "f64",
    "group_vec", "i64", "layer_norm", "layer_norm_slot", "linear", "linear_lhs_slot", "linear_slot", "shared_weight", "matmul_lhs_slot", "matmul_slot", "matmul_t_slot", "node", "pieces_from",
    "pieces_probe", "pieces_span", "last_operand",
    "pointwise_slot", "shape", "split", "stack", "unbind", "binary_slot", "narrow", "narrow_merge", "narrow_merge_len", "narrow_run",
    "reshape", "split_starts", "squeeze", "piece_linear_lo", "piece_linear_hi",
]

# Everything from_fx's seed program may mention, declared to egglog before it runs.
DECLARED = [Tensor.input, Tensor.none, Tensor.call, Tensor.unary, Pieces.call, Pieces.__getitem__, Outputs.of,
            linear, layer_norm, cat, stack, split, unbind, movedim, flatten, unflatten, even_split, batched_linear, batched_layer_norm,
            shape, node, group_vec, linear_slot, shared_weight, linear_lhs_slot, matmul_lhs_slot, matmul_slot, matmul_t_slot, layer_norm_slot, pointwise_slot, pieces_from, pieces_probe, pieces_span, last_operand,
            Tensor.binary, binary_slot, narrow, squeeze, split_starts, narrow_run, reshape, cat_operand,
            piece_linear_lo, piece_linear_hi]
