import torch

from optimus_egg.rules.split_cat import split_cat
from optimus_egg.rules.unbind_stack import unbind_stack
from optimus_egg.testing import calls, fired, optimize_with


def test_cat_of_split_pieces():
    def before(x):
        a, b, c = torch.split(x, [2, 3, 1], dim=1)
        return torch.cat([a, b, c], dim=1) * 2

    after, report = optimize_with(before, split_cat, torch.randn(4, 6))
    assert fired(report, "cat-of-split-pieces")
    assert calls(after, torch.split) == calls(after, torch.cat) == 0


def test_cat_of_split_pieces_needs_same_dim():
    def before(x):
        a, b = torch.split(x, [2, 2], dim=1)
        return torch.cat([a, b], dim=0)

    _, report = optimize_with(before, split_cat, torch.randn(4, 4))
    assert not fired(report, "cat-of-split-pieces")


def test_cat_of_split_pieces_needs_order():
    def before(x):
        a, b = torch.split(x, [2, 2], dim=1)
        return torch.cat([b, a], dim=1)

    _, report = optimize_with(before, split_cat, torch.randn(4, 4))
    assert not fired(report, "cat-of-split-pieces")


def test_cat_of_split_pieces_needs_every_piece():
    def before(x):
        a, b, c = torch.split(x, [1, 2, 1], dim=1)
        return torch.cat([a, b], dim=1), c

    _, report = optimize_with(before, split_cat, torch.randn(4, 4))
    assert not fired(report, "cat-of-split-pieces")


def test_cat_of_split_pieces_keeps_piece_with_other_user():
    def before(x):
        a, b = torch.split(x, [2, 2], dim=1)
        return torch.cat([a, b], dim=1) + 1, torch.tanh(a)

    after, report = optimize_with(before, split_cat, torch.randn(4, 4))
    assert fired(report, "cat-of-split-pieces")
    assert calls(after, torch.cat) == 0


def test_split_one_piece():
    def before(x):
        (a,) = torch.split(x, [4], dim=1)
        return torch.tanh(a)

    after, report = optimize_with(before, split_cat, torch.randn(3, 4))
    assert fired(report, "split-one-piece")
    assert calls(after, torch.split) == 0


def test_split_one_piece_needs_one_piece():
    def before(x):
        a, b = torch.split(x, [2, 2], dim=1)
        return torch.tanh(a) + b

    after, report = optimize_with(before, split_cat, torch.randn(3, 4))
    assert not fired(report, "split-one-piece")


def test_cat_of_split_pieces_whole_tuple():
    def before(x):
        return torch.cat(torch.split(x, 4, dim=1), dim=-1) * 2  # the tuple passed whole

    after, report = optimize_with(before, split_cat, torch.randn(3, 16))
    assert fired(report, "cat-of-split-pieces")
    assert calls(after, torch.cat) == calls(after, torch.split) == 0


def test_stack_of_split_pieces():
    def before(x):
        return torch.stack(torch.split(x, 4, dim=1), dim=1) + 1

    after, report = optimize_with(before, split_cat, torch.randn(3, 16))
    assert fired(report, "stack-of-split-pieces")
    assert calls(after, torch.stack) == calls(after, torch.split) == 0


def test_stack_of_split_pieces_needs_order():
    def before(x):
        a, b, c = torch.split(x, 2, dim=1)
        return torch.stack([b, a, c], dim=0)

    _, report = optimize_with(before, split_cat, torch.randn(3, 6))
    assert not fired(report, "stack-of-split-pieces")


def test_squeeze_of_split_piece():
    def before(x):
        p = torch.split(x, 1, dim=1)
        return torch.stack([torch.squeeze(p[i], 1) for i in range(4)]) + 1

    after, report = optimize_with(before, split_cat, torch.randn(3, 4))
    assert fired(report, "squeeze-of-split-piece")
    assert calls(after, torch.squeeze) == calls(after, torch.split) == 0
    assert calls(after, torch.unbind) == 1


def test_squeeze_of_split_piece_method_spellings():
    def before(x):
        p = x.split(1, -2)
        return torch.stack([p[0].squeeze(-2), p[1].squeeze(dim=1)], dim=1) + 1

    after, report = optimize_with(before, split_cat, torch.randn(3, 2, 5))
    assert fired(report, "squeeze-of-split-piece")
    assert calls(after, "squeeze") == calls(after, torch.squeeze) == 0


def test_squeeze_of_split_piece_needs_same_dim():
    def before(x):
        p = torch.split(x, 1, dim=1)
        return torch.squeeze(p[0], 0) + torch.squeeze(p[1], 0)

    _, report = optimize_with(before, split_cat, torch.randn(1, 2, 3))
    assert not fired(report, "squeeze-of-split-piece")


def test_squeeze_of_split_piece_needs_size_one_pieces():
    def before(x):
        a, b = torch.split(x, [1, 2], dim=1)
        return torch.squeeze(a, 1).sum() + b.sum()

    _, report = optimize_with(before, split_cat, torch.randn(2, 3))
    assert not fired(report, "squeeze-of-split-piece")


def test_squeeze_of_split_piece_leaves_dimless_squeeze():
    def before(x):
        p = torch.split(x, 1, dim=1)
        return torch.squeeze(p[0]) + torch.squeeze(p[1])  # no dim: left opaque

    _, report = optimize_with(before, split_cat, torch.randn(2, 2))
    assert not fired(report, "squeeze-of-split-piece")


def _reshapes(gm) -> int:
    return calls(gm, torch.reshape) + calls(gm, "reshape") + calls(gm, "view")


def test_reshape_of_split_piece():
    def before(x):
        p = torch.split(x, 2, dim=1)
        return torch.stack([p[i].reshape(3, 4) for i in range(4)], dim=0) + 1

    after, report = optimize_with(before, (split_cat, unbind_stack), torch.randn(6, 8))
    assert fired(report, "reshape-of-split-piece") and fired(report, "stack-of-unbind-pieces")
    assert calls(after, torch.stack) == calls(after, torch.split) == 0
    assert _reshapes(after) == 1


def test_reshape_of_split_piece_view_then_cat():
    def before(x):
        p = torch.split(x, 1, dim=1)
        return torch.cat([p[i].view(-1, 5) for i in range(3)], dim=1) + 1  # move_view_after_cat, on dim 1

    after, report = optimize_with(before, (split_cat, unbind_stack), torch.randn(50, 3))
    assert fired(report, "reshape-of-split-piece") and fired(report, "cat-of-unbind-pieces")
    assert calls(after, torch.cat) == calls(after, torch.split) == 0


def test_reshape_of_split_piece_needs_even_split():
    def before(x):
        a, b = torch.split(x, [2, 4], dim=1)
        return torch.cat([a.reshape(-1), b.reshape(-1)]) + 1

    _, report = optimize_with(before, (split_cat, unbind_stack), torch.randn(3, 6))
    assert not fired(report, "reshape-of-split-piece")


def test_reshape_of_split_piece_keeps_stack_of_mismatched_reshapes():
    def before(x):
        a, b = torch.split(x, 2, dim=1)
        return torch.stack([a.reshape(6, 2), b.reshape(2, 6).t()], dim=0) + 1

    after, report = optimize_with(before, (split_cat, unbind_stack), torch.randn(6, 4))
    assert fired(report, "reshape-of-split-piece")  # each piece alone: two different reshaped stacks
    assert not fired(report, "stack-of-unbind-pieces")
    assert calls(after, torch.stack) == 1
