import torch

from optimus_egg.rules.mutate_cat import mutate_cat
from optimus_egg.testing import calls, fired, optimize_with


def test_narrow_run_last():
    def before(x, y):
        return torch.cat([y, x.narrow(1, 1, 2)], dim=1)

    _, report = optimize_with(before, mutate_cat, torch.randn(2, 4), torch.randn(2, 3))
    assert fired(report, "narrow-run-last")


def test_narrow_run_last_needs_cat_dim():
    def before(x, y):
        return torch.cat([y, x.narrow(1, 1, 2)], dim=0)

    _, report = optimize_with(before, mutate_cat, torch.randn(2, 4), torch.randn(3, 2))
    assert not fired(report, "narrow-run-last")


def test_narrow_run_step():
    def before(x):
        return torch.cat([x.narrow(0, 1, 1), x.narrow(0, 2, 2)], dim=0) * 2

    _, report = optimize_with(before, mutate_cat, torch.randn(5, 3))
    assert fired(report, "narrow-run-step")


def test_narrow_run_step_needs_adjacent():
    def before(x):
        return torch.cat([x.narrow(0, 0, 1), x.narrow(0, 2, 2)], dim=0) * 2

    _, report = optimize_with(before, mutate_cat, torch.randn(5, 3))
    assert not fired(report, "narrow-run-step")


def test_narrow_run_step_needs_same_tensor():
    def before(x, y):
        return torch.cat([y.narrow(0, 0, 1), x.narrow(0, 1, 2)], dim=0) * 2

    _, report = optimize_with(before, mutate_cat, torch.randn(5, 3), torch.randn(5, 3))
    assert not fired(report, "narrow-run-step")


def test_cat_of_narrow_run():
    def before(x):
        parts = [x.narrow(1, 1, 2), x.narrow(1, 3, 1), torch.narrow(x, 1, 4, 2)]
        return torch.cat(parts, dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 7))
    assert fired(report, "cat-of-narrow-run")
    assert calls(after, torch.cat) == 0
    assert calls(after, "narrow") + calls(after, torch.narrow) == 1


def test_cat_of_narrow_run_needs_order():
    def before(x):
        return torch.cat([x.narrow(1, 3, 1), x.narrow(1, 1, 2)], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 7))
    assert not fired(report, "cat-of-narrow-run")
    assert calls(after, torch.cat) == 1


def test_cat_of_narrow_run_needs_every_operand():
    def before(x, y):
        return torch.cat([x.narrow(1, 1, 2), x.narrow(1, 3, 1), y], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 7), torch.randn(3, 2))
    assert not fired(report, "cat-of-narrow-run")
    assert calls(after, torch.cat) == 1
