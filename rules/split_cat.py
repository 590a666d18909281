"""split_cat family: a split whose pieces are put back together, in order and on the same dim, is its input."""
from egglog import Vec, eq, i64, rule, ruleset, set_, union

from optimus_egg.dsl import rw
from optimus_egg.sorts import (Pieces, Tensor, cat, even_split, movedim, pieces_from, reshape, shape, split, squeeze,
                                stack, unbind, unflatten)

split_cat = ruleset(name="split_cat")


@split_cat.register
def _(x: Tensor, sizes: Vec[i64], t: Vec[i64], d: i64, e: i64, i: i64, s: i64, xs: Vec[Tensor], p: Pieces):
    reshaped_piece = reshape(split(x, sizes, d)[i], t)
    stacked_shape = Vec[i64](sizes.length()).append(t)
    reshaped_stack = reshape(movedim(unflatten(x, d, Vec[i64](sizes.length(), s)), d, 0), stacked_shape)

    # mirrors: remove_split_with_size_one_pass
    yield rw("split-one-piece", split(x, sizes, d)[0], x,
             eq(sizes.length()).to(i64(1)))            # guard: exactly one piece

    # mirrors: split_cat_pass (simplify_split_cat, all pieces in order)
    yield rw("cat-of-split-pieces", cat(xs, d), x,
             pieces_from(xs, p, 0),                    # guard: every operand is the matching piece
             eq(p).to(split(x, sizes, d)),             # guard: shared `d`: cat on the split dim
             eq(xs.length()).to(sizes.length()))       # guard: no piece left out

    # mirrors: split_cat_pass (split -> stack of equal pieces: a view, split_stack_to_cats_pass)
    yield rw("stack-of-split-pieces", stack(xs, e), movedim(unflatten(x, d, Vec[i64](xs.length(), s)), d, e),
             pieces_from(xs, p, 0),                    # guard: every operand is the matching piece
             eq(p).to(split(x, sizes, d)),
             eq(xs.length()).to(sizes.length()),       # guard: no piece left out
             even_split(sizes, s))                     # guard: all pieces the same size

    # mirrors: split_cat_pass (merge_split_squeeze: split into size-1 pieces, then squeeze)
    yield rw("squeeze-of-split-piece", squeeze(split(x, sizes, d)[i], d), unbind(x, d)[i],
             even_split(sizes, 1))                     # guard: every piece has size 1 on d;
                                                       # shared `d`: squeezed on the split dim

    # mirrors: move_reshape_out_of_split_stack_pass (a reshaped piece is a piece of the reshaped stack of pieces)
    yield rule(reshaped_piece, even_split(sizes, s),  # guard: all pieces the same size (they stack)
               name="reshape-of-split-piece").then(union(reshaped_piece).with_(unbind(reshaped_stack, 0)[i]),
                                                  set_(shape(reshaped_stack)).to(stacked_shape))
