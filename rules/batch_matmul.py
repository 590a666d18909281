"""batch_matmul family: independent matmuls of alike operands are one matmul of the stacked
operands, unbound (attention rows over separate keys: one batched product)."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, group_vec, matmul_slot, matmul_t_slot, movedim, shape, stack, unbind

batch_matmul = ruleset(name="batch_matmul")


@batch_matmul.register
def _(op: i64, g: i64, d: i64, last: i64, xs: Vec[Tensor], ys: Vec[Tensor], zs: Vec[Tensor], s: Vec[i64], i: i64):
    wide = Tensor.call(op, Vec[Tensor](stack(xs, d), stack(ys, d)))

    # mirrors: beyond Optimus (batch_linear for matmul / @: one batched product of stacked operands); groups come from from_fx (alike operands, independent members)
    yield rule(matmul_slot(op, g, d, s, i),             # guard: seeded slot; `op` a matmul that broadcasts, `d` a batch dim
               eq(xs).to(group_vec(g, 0)), eq(ys).to(group_vec(g, 1)),
               name="batch-matmul").then(
        union(Tensor.call(op, Vec[Tensor](xs[i], ys[i]))).with_(unbind(wide, d)[i]),
        set_(shape(wide)).to(s),
    )

    wide_t = Tensor.call(op, Vec[Tensor](stack(xs, d), movedim(stack(zs, d), last, last - 1)))

    # mirrors: beyond Optimus (the same, second operands transposed: the stack of the untransposed ones, its last dims swapped)
    yield rule(matmul_t_slot(op, g, d, last, s, i),     # guard: seeded slot; ys[i] is zs[i] with its last two dims swapped
               eq(xs).to(group_vec(g, 0)), eq(ys).to(group_vec(g, 1)), eq(zs).to(group_vec(g, 2)),
               name="batch-matmul-transposed").then(
        union(Tensor.call(op, Vec[Tensor](xs[i], ys[i]))).with_(unbind(wide_t, d)[i]),
        set_(shape(wide_t)).to(s),
    )
