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


def test_narrow_of_cat_operand():
    def before(x, y):
        z = torch.cat([x.tanh(), y.sigmoid(), x.relu()], dim=1)
        a, b, c = torch.split(z, [4, 2, 4], dim=1)
        return a * 2, b + 1, c.sum(1)

    after, report = optimize_with(before, merge_splits, torch.randn(3, 4), torch.randn(3, 2))
    assert fired(report, "narrow-of-cat-operand")
    assert calls(after, torch.cat) == 0 and calls(after, torch.split) + calls(after, torch.functional.split) == 0


def test_narrow_of_cat_operand_needs_an_operand_window():
    def before(x, y):
        z = torch.cat([x.tanh(), y.sigmoid()], dim=1)
        a, b = torch.split(z, [3, 3], dim=1)  # the first piece ends inside the first operand
        return a * 2, b + 1

    _, report = optimize_with(before, merge_splits, torch.randn(3, 4), torch.randn(3, 2))
    assert not fired(report, "narrow-of-cat-operand")


def test_narrow_of_cat_operand_needs_the_cat_dim():
    def before(x, y):
        z = torch.cat([x.tanh(), y.sigmoid()], dim=0)
        a, b = torch.split(z, [4, 4], dim=1)  # operands stacked on dim 0, pieces cut on dim 1
        return a * 2, b + 1

    _, report = optimize_with(before, merge_splits, torch.randn(3, 8), torch.randn(2, 8))
    assert not fired(report, "narrow-of-cat-operand")
