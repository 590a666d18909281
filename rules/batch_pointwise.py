"""batch_pointwise family: one elementwise op on N same-shape tensors is one op on their stack, unbound;
an elementwise op on a piece is the piece of the op on the whole."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import (
    Pieces, Tensor, group_vec, pointwise, pointwise_slot, shape, split, stack, unbind,
)

batch_pointwise = ruleset(name="batch_pointwise")


@batch_pointwise.register
def _(op: i64, g: i64, xs: Vec[Tensor], args: Vec[Tensor], i: i64, d: i64, y: Tensor, sizes: Vec[i64],
      p: Pieces, s: Vec[i64]):
    member = Tensor.call(op, Vec(xs[i]))
    batched = Tensor.call(op, Vec(stack(xs, 0)))

    # mirrors: batch_tanh / batch_sigmoid / batch_relu / batch_clamp / batch_nan_to_num / batch_detach
    yield rule(pointwise_slot(op, g, i),               # guard: seeded group slot (independent members)
               eq(xs).to(group_vec(g, 0)),
               eq(s).to(shape(xs[i])),                 # guard: member shape known
               name="batch-pointwise").then(
        union(member).with_(unbind(batched, 0)[i]),
        set_(shape(batched)).to(Vec[i64](xs.length()).append(s)),
    )

    # mirrors: beyond Optimus (a batched chain stays stacked instead of unbind -> op -> stack)
    yield rule(eq(Tensor.call(op, args)).to(Tensor.call(op, args)), pointwise(op),  # guard: elementwise op
               eq(args.length()).to(i64(1)),                                         # guard: one tensor operand
               eq(args[0]).to(p[i]), eq(p).to(unbind(y, d)),                         # guard: on an unbind piece
               eq(s).to(shape(y)),                                                   # guard: whole shape known
               name="pointwise-of-unbind-piece").then(
        union(Tensor.call(op, args)).with_(unbind(Tensor.call(op, Vec(y)), d)[i]),
        set_(shape(Tensor.call(op, Vec(y)))).to(s),
    )

    # mirrors: batch_* pointwise fusion on split outputs (one op on the whole, then split)
    yield rule(eq(Tensor.call(op, args)).to(Tensor.call(op, args)), pointwise(op),  # guard: elementwise op
               eq(args.length()).to(i64(1)),                                         # guard: one tensor operand
               eq(args[0]).to(p[i]), eq(p).to(split(y, sizes, d)),                   # guard: on a split piece
               eq(s).to(shape(y)),                                                   # guard: whole shape known
               name="pointwise-of-split-piece").then(
        union(Tensor.call(op, args)).with_(split(Tensor.call(op, Vec(y)), sizes, d)[i]),
        set_(shape(Tensor.call(op, Vec(y)))).to(s),
    )
