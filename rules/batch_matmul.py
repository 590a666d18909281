"""batch_matmul family: independent matmuls of alike operands are one matmul of the stacked
operands, unbound (attention rows over separate keys: one batched product)."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, group_vec, matmul_slot, shape, stack, unbind

batch_matmul = ruleset(name="batch_matmul")


@batch_matmul.register
def _(op: i64, g: i64, xs: Vec[Tensor], ys: Vec[Tensor], s: Vec[i64], i: i64):
    wide = Tensor.call(op, Vec[Tensor](stack(xs, 0), stack(ys, 0)))

    # mirrors: beyond Optimus (batch_linear for matmul / @: one batched product of stacked operands); groups come from from_fx (alike operands, independent members)
    yield rule(matmul_slot(op, g, s, i),                # guard: seeded slot; `op` a matmul that broadcasts
               eq(xs).to(group_vec(g, 0)), eq(ys).to(group_vec(g, 1)),
               name="batch-matmul").then(
        union(Tensor.call(op, Vec[Tensor](xs[i], ys[i]))).with_(unbind(wide, 0)[i]),
        set_(shape(wide)).to(s),
    )
