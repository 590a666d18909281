"""pieces family: facts `pieces_from(xs, p, i)` meaning xs[j] == p[j] for all j >= i, for cat/stack operands."""
from egglog import Vec, eq, i64, rule, ruleset

from optimus_egg.sorts import Pieces, Tensor, cat, pieces_from, stack

pieces = ruleset(name="pieces")


@pieces.register
def _(xs: Vec[Tensor], p: Pieces, i: i64, n: i64, d: i64):
    # mirrors: the "all getitems of one split, in order" check inside split_cat_pass
    yield rule(eq(cat(xs, d)).to(cat(xs, d)), eq(n).to(xs.length()), n > 0,  # guard: a non-empty cat
               eq(xs[n - 1]).to(p[n - 1]),                                  # guard: last operand is last piece
               name="pieces-last-of-cat").then(pieces_from(xs, p, n - 1))
    # mirrors: the "all getitems of one unbind, in order" check inside unbind_stack_pass
    yield rule(eq(stack(xs, d)).to(stack(xs, d)), eq(n).to(xs.length()), n > 0,
               eq(xs[n - 1]).to(p[n - 1]),
               name="pieces-last-of-stack").then(pieces_from(xs, p, n - 1))
    # mirrors: the per-getitem index walk inside split_cat_pass / unbind_stack_pass
    yield rule(pieces_from(xs, p, i), i > 0,
               eq(xs[i - 1]).to(p[i - 1]),                                  # guard: previous operand is previous piece
               name="pieces-step").then(pieces_from(xs, p, i - 1))
