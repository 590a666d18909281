"""batch_linear family: N independent same-signature linears are one bmm on stacked operands, unbound."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import Tensor, batched_linear, group_vec, linear, linear_slot, shape, stack, unbind

batch_linear = ruleset(name="batch_linear")


@batch_linear.register
def _(g: i64, xs: Vec[Tensor], ws: Vec[Tensor], bs: Vec[Tensor], i: i64, s: Vec[i64]):
    y = batched_linear(stack(xs, 0), stack(ws, 0), stack(bs, 0))

    # mirrors: batch_linear (BatchLinearFusion); groups come from from_fx (same signature, same depth)
    yield rule(linear_slot(g, s, i),                   # guard: seeded group slot (independent members)
               eq(xs).to(group_vec(g, 0)), eq(ws).to(group_vec(g, 1)), eq(bs).to(group_vec(g, 2)),
               name="batch-linear").then(
        union(linear(xs[i], ws[i], bs[i])).with_(unbind(y, 0)[i]),
        set_(shape(y)).to(s),
    )
