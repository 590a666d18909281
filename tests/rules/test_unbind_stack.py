import torch

from optimus_egg.rules.unbind_stack import unbind_stack
from optimus_egg.testing import calls, fired, optimize_with


def test_stack_of_unbind_pieces():
    def before(x):
        a, b, c = torch.unbind(x, dim=1)
        return torch.stack([a, b, c], dim=1) + 1

    after, report = optimize_with(before, unbind_stack, torch.randn(4, 3, 5))
    assert fired(report, "stack-of-unbind-pieces")
    assert calls(after, torch.stack) == calls(after, torch.unbind) == 0


def test_stack_of_unbind_pieces_needs_same_dim():
    def before(x):
        a, b, c = torch.unbind(x, dim=1)
        return torch.stack([a, b, c], dim=0)

    _, report = optimize_with(before, unbind_stack, torch.randn(3, 3, 5))
    assert not fired(report, "stack-of-unbind-pieces")


def test_stack_of_unbind_pieces_needs_every_piece():
    def before(x):
        a, b, c = torch.unbind(x, dim=0)
        return torch.stack([a, b], dim=0), c

    _, report = optimize_with(before, unbind_stack, torch.randn(3, 5))
    assert not fired(report, "stack-of-unbind-pieces")


def test_unbind_of_stack():
    def before(x, y):
        s = torch.stack([torch.tanh(x), y], dim=0)
        a, b = torch.unbind(s, dim=0)
        return a * b

    after, report = optimize_with(before, unbind_stack, torch.randn(3, 5), torch.randn(3, 5))
    assert fired(report, "unbind-of-stack")
    assert calls(after, torch.stack) == calls(after, torch.unbind) == 0


def test_unbind_of_stack_needs_same_dim():
    def before(x, y):
        a, b, c = torch.unbind(torch.stack([x, y], dim=0), dim=1)
        return a + b + c

    _, report = optimize_with(before, unbind_stack, torch.randn(3, 2), torch.randn(3, 2))
    assert not fired(report, "unbind-of-stack")


def test_stack_of_unbind_pieces_moved():
    def before(x):
        return torch.stack(torch.unbind(x, dim=1), dim=0) * 2

    after, report = optimize_with(before, unbind_stack, torch.randn(3, 4, 5))
    assert fired(report, "stack-of-unbind-pieces-moved")
    assert calls(after, torch.stack) == calls(after, torch.unbind) == 0


def test_stack_of_unbind_pieces_moved_needs_every_piece():
    def before(x):
        a, b, c = torch.unbind(x, dim=1)
        return torch.stack([a, b], dim=0), c

    _, report = optimize_with(before, unbind_stack, torch.randn(2, 3, 5))
    assert not fired(report, "stack-of-unbind-pieces-moved")


def test_cat_of_unbind_pieces():
    def before(x):
        return torch.cat(torch.unbind(x, dim=-3), dim=1) + 1

    after, report = optimize_with(before, unbind_stack, torch.randn(4, 3, 5))
    assert fired(report, "cat-of-unbind-pieces")
    assert calls(after, torch.cat) == calls(after, torch.unbind) == 0


def test_cat_of_unbind_pieces_needs_every_piece():
    def before(x):
        a, b, c = torch.unbind(x, dim=0)
        return torch.cat([a, c], dim=0), b

    _, report = optimize_with(before, unbind_stack, torch.randn(3, 2, 5))
    assert not fired(report, "cat-of-unbind-pieces")
