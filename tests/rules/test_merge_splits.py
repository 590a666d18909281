import torch

from optimus_egg.rules.merge_splits import merge_splits
from optimus_egg.testing import calls, fired, optimize_with


def test_split_piece_narrow():
    def before(x):
        _, b = torch.split(x, [1, 3], dim=1)
        return b.tanh()

    _, report = optimize_with(before, merge_splits, torch.randn(2, 4))
    assert fired(report, "split-piece-narrow")


def test_split_piece_narrow_needs_seeded_starts():
    def before(x):
        a, b = torch.split(x, [1, 3], dim=1)
        b.add_(1)  # a mutated piece: the split stays opaque, without seeded starts
        return a.tanh(), b

    _, report = optimize_with(before, merge_splits, torch.randn(2, 4))
    assert not fired(report, "split-piece-narrow")


def test_narrow_of_narrow():
    def before(x):
        a, b = torch.split(x, [2, 6], dim=1)
        c, d = torch.split(b, [4, 2], dim=1)
        return a.tanh(), c.tanh(), d.tanh()

    _, report = optimize_with(before, merge_splits, torch.randn(3, 8))
    assert fired(report, "narrow-of-narrow")


def test_narrow_of_narrow_needs_same_dim():
    def before(x):
        a, b = torch.split(x, [2, 2], dim=1)
        c, d = torch.split(b, [1, 2], dim=0)
        return a.tanh(), c.tanh(), d.tanh()

    _, report = optimize_with(before, merge_splits, torch.randn(3, 4))
    assert not fired(report, "narrow-of-narrow")


def test_narrow_of_narrow_user_narrow():
    def before(x):
        return torch.narrow(x.narrow(1, 2, 5), 1, -3, 2).tanh()

    after, report = optimize_with(before, merge_splits, torch.randn(3, 8))
    assert fired(report, "narrow-of-narrow")
    assert calls(after, "narrow") + calls(after, torch.narrow) == 1


def test_narrow_of_narrow_getitem_slices():
    def before(x):
        return x[:, 2:7][..., -4:-2].tanh()  # columns 2:7, then 3:5 of those

    after, report = optimize_with(before, merge_splits, torch.randn(3, 8))
    assert fired(report, "narrow-of-narrow")
    assert calls(after, torch.narrow) == 1


def test_narrow_whole():
    def before(x):
        (a,) = torch.split(x, [4], dim=1)
        return torch.tanh(a)

    after, report = optimize_with(before, merge_splits, torch.randn(3, 4))
    assert fired(report, "narrow-whole")
    assert calls(after, torch.split) == calls(after, torch.narrow) == 0


def test_narrow_whole_needs_whole_dim():
    def before(x):
        return torch.tanh(x.narrow(1, 0, 3))

    _, report = optimize_with(before, merge_splits, torch.randn(3, 4))
    assert not fired(report, "narrow-whole")
