"""mutate_cat family: a cat of adjacent narrows of one tensor, in order and on their dim, is one narrow;
inside a longer cat, each such run is one narrow operand."""
from egglog import Vec, eq, i64, ne, rule, ruleset, set_

from optimus_egg.dsl import rw
from optimus_egg.sorts import (
    Tensor,
    cat,
    narrow,
    narrow_merge,
    narrow_merge_len,
    narrow_run,
)

mutate_cat = ruleset(name="mutate_cat")


@mutate_cat.register
def _(x: Tensor, xs: Vec[Tensor], ys: Vec[Tensor], h: Tensor, d: i64, i: i64, a: i64, b: i64, c: i64, n: i64,
      m: i64, k: i64):
    # mirrors: merge_getitem_cat_pass (the last cat operand is a slice on the cat dim)
    yield rule(eq(cat(xs, d)).to(cat(xs, d)), eq(n).to(xs.length()), n > 0,  # guard: a non-empty cat
               eq(xs[n - 1]).to(narrow(x, d, a, m)),                      # guard: shared `d`: on the cat dim
               ne(x).to(cat(xs, d)),                                       # guard: not a slice of this cat itself
               name="narrow-run-last").then(narrow_run(xs, x, d, n - 1, a, a + m))

    # mirrors: merge_getitem_cat_pass (the operand before a run is the slice that ends where it starts)
    yield rule(narrow_run(xs, x, d, i, a, b), i > 0,
               eq(xs[i - 1]).to(narrow(x, d, c, m)),   # guard: a slice of the same x on the same dim
               eq(c + m).to(a),                        # guard: it ends where the run starts
               name="narrow-run-step").then(narrow_run(xs, x, d, i - 1, c, b))

    # mirrors: mutate_cat_pass / split_cat_to_slices_pass (every operand in one run: a slice)
    yield rw("cat-of-narrow-run", cat(xs, d), narrow(x, d, a, b - a),
             narrow_run(xs, x, d, 0, a, b))            # guard: the run starts at the first operand

    # mirrors: split_cat_to_slices_pass (construct_cat_args's walk over the cat operands; from the last here)
    yield rule(eq(cat(xs, d)).to(cat(xs, d)), eq(n).to(xs.length()), n > 1,  # guard: two operands or more
               name="narrow-merge-last").then(narrow_merge(xs, d, n - 1, xs, xs[n - 1]),
                                              set_(narrow_merge_len(xs, d, n - 1)).to(n))

    # mirrors: split_cat_to_slices_pass (construct_cat_args keeps an operand outside a run)
    yield rule(narrow_merge(xs, d, i, ys, h), i > 0,
               eq(narrow_merge_len(xs, d, i)).to(ys.length()),  # guard: only the most merged walk goes on
               name="narrow-merge-keep").then(narrow_merge(xs, d, i - 1, ys, xs[i - 1]),
                                              set_(narrow_merge_len(xs, d, i - 1)).to(ys.length()))

    # mirrors: merge_getitem_cat_pass / split_cat_to_slices_pass (consecutive getitems on the cat dim: one slice)
    yield rule(narrow_merge(xs, d, i, ys, h), i > 0,
               eq(narrow_merge_len(xs, d, i)).to(ys.length()),  # guard: only the most merged walk goes on
               eq(h).to(narrow(x, d, b, k)),                   # guard: shared `d`: the merged rest opens with a slice
               eq(xs[i - 1]).to(narrow(x, d, a, m)),           # guard: shared `x`, `d`: this operand slices the same x
               eq(a + m).to(b),                                # guard: it ends where the next one starts
               ne(x).to(cat(xs, d)),                           # guard: not a slice of this cat itself
               name="narrow-merge-join").then(
        narrow_merge(xs, d, i - 1, ys.set(i - 1, narrow(x, d, a, m + k)).remove(i), narrow(x, d, a, m + k)),
        set_(narrow_merge_len(xs, d, i - 1)).to(ys.length() - 1))

    # mirrors: merge_getitem_cat_pass / split_cat_to_slices_pass (the cat of the merged operands, others kept)
    yield rw("cat-of-merged-narrows", cat(xs, d), cat(ys, d),
             narrow_merge(xs, d, 0, ys, h),                    # guard: the walk reached the first operand
             eq(narrow_merge_len(xs, d, 0)).to(ys.length()),  # guard: the most merged walk
             ys.length() < xs.length())                       # guard: something merged
