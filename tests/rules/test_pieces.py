"""The pieces facts are what cat/stack identities guard on; checked through the rules that use them."""
import pytest
import torch
from egglog import run
from torch import fx

from optimus_egg.from_fx import from_fx
from optimus_egg.rules.pieces import pieces
from optimus_egg.rules.split_cat import split_cat
from optimus_egg.rules.unbind_stack import unbind_stack
from optimus_egg.testing import fired, optimize_with


def test_pieces_last_of_cat():
    def before(x):
        a, b = torch.split(x, [1, 3], dim=1)
        return torch.cat([a, b], dim=1)

    _, report = optimize_with(before, split_cat, torch.randn(2, 4))
    assert fired(report, "pieces-last-of-cat") and fired(report, "cat-of-split-pieces")


def test_pieces_last_of_stack():
    def before(x):
        a, b = torch.unbind(x, dim=0)
        return torch.stack([a, b], dim=0)

    _, report = optimize_with(before, unbind_stack, torch.randn(2, 4))
    assert fired(report, "pieces-last-of-stack") and fired(report, "stack-of-unbind-pieces")


@pytest.fixture(scope="module")
def five():
    """A cat of all five pieces of a split, optimized once (values checked by optimize_with):
    [0, 5) halves into [0, 2) [2, 5), then [0, 1) [1, 2) [2, 3) [3, 5), then [3, 4) [4, 5)."""
    def before(x):
        a, b, c, d, e = torch.split(x, 1, dim=0)
        return torch.cat([a, b, c, d, e], dim=0) + 1

    _, report = optimize_with(before, split_cat, torch.randn(5, 3))
    assert fired(report, "cat-of-split-pieces")
    return report


def test_pieces_last(five):
    assert five.matches["pieces-last"] >= 1


def test_pieces_halve(five):
    assert five.matches["pieces-halve"] >= 4   # one per probe of two operands or more


def test_pieces_leaf(five):
    assert five.matches["pieces-leaf"] >= 5    # one per operand


def test_pieces_join(five):
    assert five.matches["pieces-join"] >= 4    # one per probe of two operands or more


def test_pieces_all(five):
    assert five.matches["pieces-all"] >= 1


def test_pieces_long_cat_in_log_iterations():
    """A 512-operand cat of every split piece is checked in about 2 log2(512) egglog iterations
    (the one-operand-at-a-time walk needed 512), and the cat is gone."""
    def before(x):
        return torch.cat(torch.split(x, 1, dim=0), dim=0) + 1

    x = torch.randn(512, 2)
    lowered = from_fx(fx.symbolic_trace(before), [x])
    steps = 0
    while lowered.egraph.run(run(pieces)).updated:
        steps += 1
        assert steps <= 2 * 9 + 4
    assert steps >= 2 * 9
    after, report = optimize_with(before, split_cat, x)
    assert report.matches["pieces-leaf"] == 512 and fired(report, "cat-of-split-pieces")
    assert not any(n.target is torch.cat for n in after.graph.nodes)


def test_pieces_step_needs_matching_piece():
    def before(x):
        a, b, c = torch.split(x, 1, dim=0)
        return torch.cat([b, b, c], dim=0)

    _, report = optimize_with(before, split_cat, torch.randn(3, 3))
    assert fired(report, "pieces-last") and not fired(report, "pieces-all")
    assert not fired(report, "cat-of-split-pieces")
