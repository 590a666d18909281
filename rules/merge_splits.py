"""merge_splits family: a split piece is a narrow of its input, a narrow of a narrow on the same dim is one
narrow, and a narrow of a cat that is exactly one operand is that operand."""
from egglog import Vec, eq, i64, rule, ruleset, union

from optimus_egg.dsl import rw
from optimus_egg.sorts import Tensor, cat_operand, narrow, shape, split, split_starts

merge_splits = ruleset(name="merge_splits")


@merge_splits.register
def _(x: Tensor, y: Tensor, t: Tensor, sizes: Vec[i64], starts: Vec[i64], d: i64, i: i64, a: i64, b: i64, n: i64, m: i64):
    # mirrors: merge_splits_pass (a split piece is its slice of the input)
    yield rw("split-piece-narrow", split(x, sizes, d)[i], narrow(x, d, starts[i], sizes[i]),
             eq(starts).to(split_starts(sizes)))       # guard: the pieces' starts are seeded

    # mirrors: merge_splits_pass (a split of a split piece, on the same dim, slices the input)
    yield rw("narrow-of-narrow", narrow(narrow(x, d, a, n), d, b, m), narrow(x, d, a + b, m))
    # guard: shared `d`: both on the same dim

    # mirrors: remove_split_with_size_one_pass (a slice of the whole dim is the input)
    yield rw("narrow-whole", narrow(x, d, 0, n), x,
             eq(shape(x)[d]).to(n))                    # guard: covers the whole dim

    # mirrors: beyond Optimus (a split of a cat into its operands: the cat and the split cancel)
    yield rule(cat_operand(x, d, a, n, y),                # guard: seeded: [a, a + n) of x's dim d is operand y
               eq(t).to(narrow(x, d, a, n)),
               name="narrow-of-cat-operand").then(union(t).with_(y))
