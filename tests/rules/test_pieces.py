"""The pieces facts are what cat/stack identities guard on; checked through the rules that use them."""
import torch

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


def test_pieces_step():
    def before(x):
        a, b, c, d = torch.split(x, 1, dim=0)
        return torch.cat([a, b, c, d], dim=0) + 1

    _, report = optimize_with(before, split_cat, torch.randn(4, 3))
    assert report.matches["pieces-step"] >= 3
    assert fired(report, "cat-of-split-pieces")


def test_pieces_step_needs_matching_piece():
    def before(x):
        a, b, c = torch.split(x, 1, dim=0)
        return torch.cat([b, b, c], dim=0)

    _, report = optimize_with(before, split_cat, torch.randn(3, 3))
    assert not fired(report, "cat-of-split-pieces")
