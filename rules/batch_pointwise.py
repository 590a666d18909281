"""batch_pointwise family: one elementwise op on N same-shape tensors is one op on their stack, unbound;
an elementwise op on a piece is the piece of the op on the whole."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, group_vec, pointwise_slot, shape, split, stack, unbind

batch_pointwise = ruleset(name="batch_pointwise")


@batch_pointwise.register
def _(op: i64, g: i64, xs: Vec[Tensor], i: i64, d: i64, y: Tensor, sizes: Vec[i64], s: Vec[i64]):
    batched = Tensor.unary(op, stack(xs, 0))

    # mirrors: batch_tanh / batch_sigmoid / batch_relu / batch_clamp / batch_nan_to_num / batch_detach
    yield rule(pointwise_slot(op, g, s, i),            # guard: seeded group slot (independent members)
               eq(xs).to(group_vec(g, 0)),
               name="batch-pointwise").then(
        union(Tensor.unary(op, xs[i])).with_(unbind(batched, 0)[i]),
        set_(shape(batched)).to(s),
    )

    # mirrors: beyond Optimus (a batched chain stays stacked instead of unbind -> op -> stack)
    yield rule(eq(Tensor.unary(op, unbind(y, d)[i])).to(Tensor.unary(op, unbind(y, d)[i])),
               eq(s).to(shape(y)),                     # guard: whole shape known
               name="pointwise-of-unbind-piece").then(
        union(Tensor.unary(op, unbind(y, d)[i])).with_(unbind(Tensor.unary(op, y), d)[i]),
        set_(shape(Tensor.unary(op, y))).to(s),
    )

    # mirrors: batch_* pointwise fusion on split outputs (one op on the whole, then split)
    yield rule(eq(Tensor.unary(op, split(y, sizes, d)[i])).to(Tensor.unary(op, split(y, sizes, d)[i])),
               eq(s).to(shape(y)),                     # guard: whole shape known
               name="pointwise-of-split-piece").then(
        union(Tensor.unary(op, split(y, sizes, d)[i])).with_(split(Tensor.unary(op, y), sizes, d)[i]),
        set_(shape(Tensor.unary(op, y))).to(s),
    )
