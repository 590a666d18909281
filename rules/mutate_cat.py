"""mutate_cat family: a cat of adjacent narrows of one tensor, in order and on their dim, is one narrow."""
from egglog import Vec, eq, i64, rule, ruleset

from optimus_egg.dsl import rw
from optimus_egg.sorts import Tensor, cat, narrow, narrow_run

mutate_cat = ruleset(name="mutate_cat")


@mutate_cat.register
def _(x: Tensor, xs: Vec[Tensor], d: i64, i: i64, a: i64, b: i64, c: i64, n: i64, m: i64):
    # mirrors: merge_getitem_cat_pass (the last cat operand is a slice on the cat dim)
    yield rule(eq(cat(xs, d)).to(cat(xs, d)), eq(n).to(xs.length()), n > 0,  # guard: a non-empty cat
               eq(xs[n - 1]).to(narrow(x, d, a, m)),                      # guard: shared `d`: on the cat dim
               name="narrow-run-last").then(narrow_run(xs, x, d, n - 1, a, a + m))

    # mirrors: merge_getitem_cat_pass (the operand before a run is the slice that ends where it starts)
    yield rule(narrow_run(xs, x, d, i, a, b), i > 0,
               eq(xs[i - 1]).to(narrow(x, d, c, m)),   # guard: a slice of the same x on the same dim
               eq(c + m).to(a),                        # guard: it ends where the run starts
               name="narrow-run-step").then(narrow_run(xs, x, d, i - 1, c, b))

    # mirrors: mutate_cat_pass / split_cat_to_slices_pass (every operand in one run: a slice)
    yield rw("cat-of-narrow-run", cat(xs, d), narrow(x, d, a, b - a),
             narrow_run(xs, x, d, 0, a, b))            # guard: the run starts at the first operand
