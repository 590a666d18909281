"""batch_linear family: N independent same-signature linears are one bmm on stacked operands, unbound
(one linear of the stacked inputs where they read one weight and bias); a linear of a piece (not
cut on the last dim) is the piece of the linear of the whole."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.sorts import (Pieces, Tensor, batched_linear, group_vec, linear, linear_slot, piece_linear_hi,
                               piece_linear_lo, shape, shared_weight, split, stack, unbind)

batch_linear = ruleset(name="batch_linear")


@batch_linear.register
def _(g: i64, xs: Vec[Tensor], ws: Vec[Tensor], bs: Vec[Tensor], i: i64, s: Vec[i64], z: Tensor, w: Tensor,
      b: Tensor, d: i64, sizes: Vec[i64], ws_shape: Vec[i64], t: Tensor, p: Pieces):
    y = batched_linear(stack(xs, 0), stack(ws, 0), stack(bs, 0))

    # mirrors: batch_linear (BatchLinearFusion); groups come from from_fx (same signature, same depth)
    yield rule(linear_slot(g, s, i),                   # guard: seeded group slot (independent members)
               eq(xs).to(group_vec(g, 0)), eq(ws).to(group_vec(g, 1)), eq(bs).to(group_vec(g, 2)),
               name="batch-linear").then(
        union(linear(xs[i], ws[i], bs[i])).with_(unbind(y, 0)[i]),
        set_(shape(y)).to(s),
    )

    # mirrors: beyond Optimus (members of one weight and bias: one linear of the stacked inputs, no stacked weights)
    yield rule(linear_slot(g, s, i), shared_weight(g),
               eq(xs).to(group_vec(g, 0)), eq(ws).to(group_vec(g, 1)), eq(bs).to(group_vec(g, 2)),
               name="batch-linear-shared-weight").then(
        union(linear(xs[i], ws[i], bs[i])).with_(unbind(linear(stack(xs, 0), ws[0], bs[0]), 0)[i]),
        set_(shape(linear(stack(xs, 0), ws[0], bs[0]))).to(s),
    )

    # mirrors: beyond Optimus (marks the pieces a linear of one weight reads, for the two below)
    yield rule(eq(t).to(linear(p[i], w, b)),
               name="linear-piece-reader").then(
        set_(piece_linear_lo(p, w, b)).to(i),
        set_(piece_linear_hi(p, w, b)).to(i),
    )

    # mirrors: beyond Optimus (linears sharing a weight over two pieces or more of one tensor are one GEMM)
    yield rule(eq(t).to(linear(unbind(z, d)[i], w, b)),
               piece_linear_lo(unbind(z, d), w, b) < piece_linear_hi(unbind(z, d), w, b),  # guard: 2 pieces or more
               eq(s).to(shape(z)), d >= 0, d < s.length() - 1,  # guard: whole shape known; not the last dim
               eq(ws_shape).to(shape(w)),                       # guard: weight shape known
               name="linear-of-unbind-piece").then(
        union(t).with_(unbind(linear(z, w, b), d)[i]),
        set_(shape(linear(z, w, b))).to(s.set(s.length() - 1, ws_shape[0])),
    )

    # mirrors: beyond Optimus (as above, over split pieces)
    yield rule(eq(t).to(linear(split(z, sizes, d)[i], w, b)),
               piece_linear_lo(split(z, sizes, d), w, b) < piece_linear_hi(split(z, sizes, d), w, b),
               eq(s).to(shape(z)), d >= 0, d < s.length() - 1,
               eq(ws_shape).to(shape(w)),
               name="linear-of-split-piece").then(
        union(t).with_(split(linear(z, w, b), sizes, d)[i]),
        set_(shape(linear(z, w, b))).to(s.set(s.length() - 1, ws_shape[0])),
    )
