"""batch_binary family: one binary elementwise op on N same-shape operand pairs is one op on their stacks,
unbound; the op on matching unbind pieces is the piece of the op on the wholes."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, binary_slot, group_vec, shape, stack, unbind

batch_binary = ruleset(name="batch_binary")


@batch_binary.register
def _(op: i64, g: i64, xs: Vec[Tensor], ys: Vec[Tensor], i: i64, d: i64, a: Tensor, b: Tensor, s: Vec[i64]):
    batched = Tensor.binary(op, stack(xs, 0), stack(ys, 0))
    piece = Tensor.binary(op, unbind(a, d)[i], unbind(b, d)[i])

    # mirrors: batch_aten_add / batch_aten_sub / batch_aten_mul / batch_aten_div (BatchPointwiseMathOpsPostGradFusion)
    yield rule(binary_slot(op, g, s, i),               # guard: seeded group slot (independent, same shapes and dtypes)
               eq(xs).to(group_vec(g, 0)), eq(ys).to(group_vec(g, 1)),
               name="batch-binary").then(
        union(Tensor.binary(op, xs[i], ys[i])).with_(unbind(batched, 0)[i]),
        set_(shape(batched)).to(s),
    )

    # mirrors: beyond Optimus (a batched binary chain stays stacked instead of unbind -> op -> stack)
    yield rule(eq(piece).to(piece),
               eq(s).to(shape(a)), eq(s).to(shape(b)),  # guard: shared `s`: same whole shapes (no broadcasting);
                                                        # shared `d`: both unbound on one dim
               name="binary-of-unbind-pieces").then(
        union(piece).with_(unbind(Tensor.binary(op, a, b), d)[i]),
        set_(shape(Tensor.binary(op, a, b))).to(s),
    )
