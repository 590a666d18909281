"""unbind_stack family: stack and unbind on the same dim are inverses."""
from egglog import Vec, eq, i64, ne, ruleset

from optimus_egg.dsl import rw
from optimus_egg.sorts import Pieces, Tensor, cat, flatten, movedim, pieces_from, shape, stack, unbind

unbind_stack = ruleset(name="unbind_stack")


@unbind_stack.register
def _(x: Tensor, d: i64, e: i64, i: i64, xs: Vec[Tensor], p: Pieces):
    # mirrors: unbind_stack_pass (stack of every unbind piece, in order)
    yield rw("stack-of-unbind-pieces", stack(xs, d), x,
             pieces_from(xs, p, 0),                    # guard: every operand is the matching piece
             eq(p).to(unbind(x, d)),                   # guard: shared `d`: stack on the unbind dim
             eq(shape(x)[d]).to(xs.length()))          # guard: no piece left out

    # mirrors: unbind_stack_to_slices_pass (an unbound stack member is the member)
    yield rw("unbind-of-stack", unbind(stack(xs, d), d)[i], xs[i],
             i < xs.length())                          # guard: an existing member

    # mirrors: unbind_stack_pass (stack on another dim: a view)
    yield rw("stack-of-unbind-pieces-moved", stack(xs, e), movedim(x, d, e),
             pieces_from(xs, p, 0),                    # guard: every operand is the matching piece
             eq(p).to(unbind(x, d)),
             ne(d).to(e),                              # guard: another dim (same dim: the rule above)
             eq(shape(x)[d]).to(xs.length()))          # guard: no piece left out

    # mirrors: unbind_cat_to_view_pass (cat of every unbind piece: a reshape of the input)
    yield rw("cat-of-unbind-pieces", cat(xs, e), flatten(movedim(x, d, e), e, e + 1),
             pieces_from(xs, p, 0),                    # guard: every operand is the matching piece
             eq(p).to(unbind(x, d)),
             eq(shape(x)[d]).to(xs.length()))          # guard: no piece left out
