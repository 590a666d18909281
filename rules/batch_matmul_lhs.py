"""batch_matmul_lhs family: matmuls of one first operand are one matmul of the second operands
concatenated on their last dim, split (two attention score products of one query are one)."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, cat, group_vec, matmul_lhs_slot, shape, split

batch_matmul_lhs = ruleset(name="batch_matmul_lhs")


@batch_matmul_lhs.register
def _(x: Tensor, op: i64, g: i64, ys: Vec[Tensor], sizes: Vec[i64], dy: i64, d: i64, s: Vec[i64], i: i64):
    wide = Tensor.call(op, Vec[Tensor](x, cat(ys, dy)))

    # mirrors: beyond Optimus (batch_linear_lhs for bmm / matmul with a shared first operand); groups come from from_fx (same x, independent members)
    yield rule(matmul_lhs_slot(x, op, g, sizes, dy, d, s, i),  # guard: seeded slot; shared `x` and `op`
               eq(ys).to(group_vec(g, 1)),
               name="batch-matmul-lhs").then(
        union(Tensor.call(op, Vec[Tensor](x, ys[i]))).with_(split(wide, sizes, d)[i]),
        set_(shape(wide)).to(s),
    )
