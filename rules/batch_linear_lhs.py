"""batch_linear_lhs family: linears reading the same input are one GEMM with concatenated weights, split."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, cat, group_vec, linear, linear_lhs_slot, shape, split

batch_linear_lhs = ruleset(name="batch_linear_lhs")


@batch_linear_lhs.register
def _(x: Tensor, g: i64, ws: Vec[Tensor], bs: Vec[Tensor], sizes: Vec[i64], d: i64, s: Vec[i64], i: i64):
    wide = linear(x, cat(ws, 0), cat(bs, 0))

    # mirrors: batch_linear_lhs (BatchLinearLHSFusion); groups come from from_fx (same input, same depth, 3 or more, or 2 without twins)
    yield rule(linear_lhs_slot(x, g, sizes, d, s, i),  # guard: seeded slot; shared `x`: one input
               eq(ws).to(group_vec(g, 1)), eq(bs).to(group_vec(g, 2)),
               name="batch-linear-lhs").then(
        union(linear(x, ws[i], bs[i])).with_(split(wide, sizes, d)[i]),
        set_(shape(wide)).to(s),
    )
