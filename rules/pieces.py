"""pieces family: `pieces_from(xs, p, 0)` when every cat/stack operand xs[j] is the piece p[j], checked by halving."""
from egglog import Vec, eq, i64, rule, ruleset

from optimus_egg.sorts import (
    Pieces,
    Tensor,
    cat,
    last_operand,
    pieces_from,
    pieces_probe,
    pieces_span,
    stack,
)

pieces = ruleset(name="pieces")

# The check splits [0, n) in halves down to single operands and joins the checked halves back:
# about 2 log2(n) egglog iterations, where a walk over the operands one by one takes n (at the
# 10,000-node bench graph's 256-operand cats, each iteration costs 3 ms: one search iteration
# there went from 0.86 to 0.42 s).


@pieces.register
def _(xs: Vec[Tensor], p: Pieces, t: Tensor, a: i64, b: i64, m: i64, n: i64, d: i64):
    # mirrors: the "all getitems of one split, in order" check inside split_cat_pass (from the last operand)
    yield rule(eq(cat(xs, d)).to(cat(xs, d)), eq(n).to(xs.length()), n > 0,  # guard: a non-empty cat
               name="pieces-last-of-cat").then(last_operand(xs, xs[n - 1]))
    # mirrors: the "all getitems of one unbind, in order" check inside unbind_stack_pass (from the last operand)
    yield rule(eq(stack(xs, d)).to(stack(xs, d)), eq(n).to(xs.length()), n > 0,  # guard: a non-empty stack
               name="pieces-last-of-stack").then(last_operand(xs, xs[n - 1]))
    # mirrors: the same checks' "the last getitem is the last piece"
    yield rule(last_operand(xs, t), eq(t).to(p[n]),                         # guard: shared `t`: a piece of p
               eq(n + 1).to(xs.length()),                                   # guard: at the last index
               name="pieces-last").then(pieces_probe(xs, p, 0, n + 1))
    # mirrors: the per-getitem index walk inside split_cat_pass / unbind_stack_pass, halved
    yield rule(pieces_probe(xs, p, a, b), b - a > 1,                       # guard: two operands or more
               name="pieces-halve").then(pieces_probe(xs, p, a, a + (b - a) / 2),
                                         pieces_probe(xs, p, a + (b - a) / 2, b))
    # mirrors: the per-getitem check `getitem.args[1] == index` inside split_cat_pass
    yield rule(pieces_probe(xs, p, a, b), eq(a + 1).to(b),                 # guard: one operand
               eq(xs[a]).to(p[a]),                                          # guard: it is the piece at its index
               name="pieces-leaf").then(pieces_span(xs, p, a, b))
    # mirrors: the walk's "every getitem checked" conclusion, two checked halves at a time
    yield rule(pieces_probe(xs, p, a, b), pieces_span(xs, p, a, m),        # guard: shared `m`: adjacent halves
               pieces_span(xs, p, m, b),
               name="pieces-join").then(pieces_span(xs, p, a, b))
    # mirrors: split_cat_pass / unbind_stack_pass's "all pieces, in order" precondition
    yield rule(pieces_span(xs, p, 0, n), eq(n).to(xs.length()),            # guard: the whole operand list
               name="pieces-all").then(pieces_from(xs, p, 0))
