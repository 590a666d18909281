"""batch_layernorm family: N independent same-signature layer norms are one norm on the stacked input, unbound."""
from egglog import Vec, eq, f64, i64, rule, ruleset, set_, union

from optimus_egg.sorts import (
    Tensor, batched_layer_norm, group_vec, layer_norm, layer_norm_slot, shape, stack, unbind,
)

batch_layernorm = ruleset(name="batch_layernorm")


@batch_layernorm.register
def _(g: i64, xs: Vec[Tensor], ns: Vec[i64], ws: Vec[Tensor], bs: Vec[Tensor], eps: f64, i: i64, s: Vec[i64]):
    y = batched_layer_norm(stack(xs, 0), ns, stack(ws, 0), stack(bs, 0), eps)

    # mirrors: batch_layernorm (BatchLayernormFusion); groups come from from_fx (same signature, same depth)
    yield rule(layer_norm_slot(g, ns, eps, s, i),         # guard: seeded group slot (independent members)
               eq(xs).to(group_vec(g, 0)), eq(ws).to(group_vec(g, 1)), eq(bs).to(group_vec(g, 2)),
               name="batch-layernorm").then(
        union(layer_norm(xs[i], ns, ws[i], bs[i], eps)).with_(unbind(y, 0)[i]),
        set_(shape(y)).to(s),
    )
