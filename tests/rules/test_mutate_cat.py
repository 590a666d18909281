import operator

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_egg.rules.merge_splits import merge_splits
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


def _cat_sizes(gm) -> list[int]:
    """Operand counts of the graph's cats."""
    return [len(n.args[0]) for n in gm.graph.nodes if n.target is torch.cat]


def _narrows(gm) -> int:
    return calls(gm, "narrow") + calls(gm, torch.narrow)


def test_narrow_merge_last():
    def before(x, y):
        return torch.cat([y, x.narrow(1, 0, 2), x.narrow(1, 2, 2)], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(2, 4), torch.randn(2, 3))
    assert fired(report, "narrow-merge-last")
    assert _cat_sizes(after) == [2] and _narrows(after) == 1


def test_narrow_merge_last_needs_two_operands():
    def before(x):
        return torch.cat([x.narrow(1, 0, 2)], dim=1) + 1

    _, report = optimize_with(before, mutate_cat, torch.randn(2, 4))
    assert not fired(report, "narrow-merge-last")


def test_narrow_merge_keep():
    def before(x, y, z):
        return torch.cat([y, x.narrow(1, 0, 2), x.narrow(1, 2, 2), z], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(2, 4), torch.randn(2, 3), torch.randn(2, 1))
    assert fired(report, "narrow-merge-keep") and fired(report, "narrow-merge-join")
    assert _cat_sizes(after) == [3] and _narrows(after) == 1


def test_narrow_merge_keep_walks_only_the_most_merged():
    def before(x, y, z):  # a run of 16: every subset of its joins would be 2^15 walks
        return torch.cat([y, *(x.narrow(1, j, 1) for j in range(16)), z], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(2, 16), torch.randn(2, 3), torch.randn(2, 1))
    assert fired(report, "cat-of-merged-narrows")
    assert report.matches["narrow-merge-keep"] + report.matches["narrow-merge-join"] < 4 * 18
    assert _cat_sizes(after) == [3] and _narrows(after) == 1


def test_narrow_merge_join():
    def before(a, x, b):
        return torch.cat([a, x.narrow(1, 0, 2), x.narrow(1, 2, 2), b], dim=1) * 2

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5), torch.randn(3, 2))
    assert fired(report, "narrow-merge-join") and fired(report, "cat-of-merged-narrows")
    assert _cat_sizes(after) == [3] and _narrows(after) == 1


def test_narrow_merge_join_needs_cat_dim():
    def before(a, x):
        return torch.cat([a, x.narrow(1, 0, 2), x.narrow(1, 2, 2)], dim=0) * 2

    _, report = optimize_with(before, mutate_cat, torch.randn(1, 2), torch.randn(3, 5))
    assert not fired(report, "narrow-merge-join")


def test_narrow_merge_join_needs_adjacent():
    def before(a, x):
        gap = torch.cat([a, x.narrow(1, 0, 2), x.narrow(1, 3, 2)], dim=1)
        swapped = torch.cat([a, x.narrow(1, 2, 2), x.narrow(1, 0, 2)], dim=1)
        return gap + swapped

    _, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5))
    assert not fired(report, "narrow-merge-join")


def test_narrow_merge_join_needs_same_tensor():
    def before(a, x, y):
        return torch.cat([a, x.narrow(1, 0, 2), y.narrow(1, 2, 2)], dim=1) * 2

    _, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5), torch.randn(3, 5))
    assert not fired(report, "narrow-merge-join")


def test_cat_of_merged_narrows():
    def before(a, x, b, y, c):
        parts = [a, x.narrow(1, 0, 2), x.narrow(1, 2, 1), x.narrow(1, 3, 3), b,
                 y.narrow(1, 1, 2), y.narrow(1, 3, 1), c]
        return torch.cat(parts, dim=1) + 1

    inputs = (torch.randn(4, 1), torch.randn(4, 7), torch.randn(4, 2), torch.randn(4, 5), torch.randn(4, 3))
    after, report = optimize_with(before, mutate_cat, *inputs)
    assert report.matches["cat-of-merged-narrows"] == 1
    assert _cat_sizes(after) == [5] and _narrows(after) == 2


def test_cat_of_merged_narrows_needs_a_merge():
    def before(a, x, b):
        return torch.cat([x.narrow(1, 0, 2), a, x.narrow(1, 2, 2), b], dim=1) + 1

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5), torch.randn(3, 2))
    assert not fired(report, "cat-of-merged-narrows")
    assert _cat_sizes(after) == [4]


def test_cat_of_merged_narrows_keeps_piece_with_other_user():
    def before(a, x, b):
        left = x.narrow(1, 0, 2)
        return torch.cat([a, left, x.narrow(1, 2, 2), b], dim=1) * 2, torch.tanh(left)

    _, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5), torch.randn(3, 2))
    assert fired(report, "cat-of-merged-narrows")  # tanh still reads its own slice (values checked)


def test_cat_of_merged_narrows_split_pieces():
    def before(a, x, b):
        p = torch.split(x, [2, 2, 3], dim=1)
        return torch.cat([a, p[0], p[1], b], dim=1) + p[2].sum()

    after, report = optimize_with(before, (mutate_cat, merge_splits), torch.randn(3, 1), torch.randn(3, 7),
                                  torch.randn(3, 2))
    assert fired(report, "split-piece-narrow") and fired(report, "cat-of-merged-narrows")
    assert _cat_sizes(after) == [3]


# x[:, a:b] (a getitem of slices) lowers to a narrow: the same rules merge it


def test_narrow_merge_join_getitem_slices():
    def before(a, x, b):
        return torch.cat([a, x[:, 0:2], x[:, 2:4], b], 1) * 2

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5), torch.randn(3, 2))
    assert fired(report, "narrow-merge-join") and fired(report, "cat-of-merged-narrows")
    assert _cat_sizes(after) == [3] and _narrows(after) == 1 and calls(after, operator.getitem) == 0


def test_cat_of_narrow_run_getitem_slices_whole():
    def before(x):
        return torch.cat([x[:, 0:4], x[:, 4:8]], 1) * 2

    after, report = optimize_with(before, (mutate_cat, merge_splits), torch.randn(3, 8))
    assert fired(report, "cat-of-narrow-run") and fired(report, "narrow-whole")
    assert _cat_sizes(after) == [] and _narrows(after) == calls(after, operator.getitem) == 0


def test_cat_of_narrow_run_aten_slices_whole():
    def before(x):
        return torch.cat([x[:, 0:4], x[:, 4:8]], 1)  # make_fx: aten.slice.Tensor(x, 1, 0, 4), ...

    x = torch.randn(3, 8)
    after, report = optimize_with(make_fx(before)(x), (mutate_cat, merge_splits), x)
    assert fired(report, "cat-of-narrow-run") and fired(report, "narrow-whole")
    out, = [n.args[0] for n in after.graph.nodes if n.op == "output"]
    # the graph returns x itself, copied: eager's cat is a fresh tensor (pipeline.copy_new_aliases)
    assert out.target is torch.clone and out.args[0].op == "placeholder"


def test_narrow_merge_join_getitem_slices_needs_step_one():
    def before(a, x):
        return torch.cat([a, x[:, 0:2:2], x[:, 2:4:2]], 1) * 2  # columns 0 and 2: not one slice

    after, report = optimize_with(before, mutate_cat, torch.randn(3, 1), torch.randn(3, 5))
    assert not fired(report, "narrow-merge-join")
    assert _cat_sizes(after) == [3] and _narrows(after) == 0 and calls(after, operator.getitem) == 2


def test_narrow_merge_join_getitem_slices_needs_one_sliced_dim():
    def before(a, x):
        return torch.cat([a, x[0:2, 0:2], x[0:2, 2:4]], 1) * 2

    after, report = optimize_with(before, mutate_cat, torch.randn(2, 1), torch.randn(3, 5))
    assert not fired(report, "narrow-merge-join")
    assert _cat_sizes(after) == [3] and _narrows(after) == 0 and calls(after, operator.getitem) == 2


def test_narrow_merge_join_getitem_slices_needs_cat_dim():
    def before(a, x):
        return torch.cat([a, x[0:2], x[2:4]], 1) * 2  # rows 0:2 and 2:4, put side by side

    after, report = optimize_with(before, mutate_cat, torch.randn(2, 1), torch.randn(4, 3))
    assert not fired(report, "narrow-merge-join")
    assert _cat_sizes(after) == [3]


def test_narrow_run_last_skips_a_slice_of_the_cat_itself():
    """Split back into its operands (merge_splits' narrow-of-cat-operand), each operand of z is
    also a slice of z: merging those slices would only rebuild z, operand by operand."""

    def before(x, y):
        z = torch.cat([x.tanh(), y.sigmoid()], dim=1)
        a, b = torch.split(z, [4, 2], dim=1)
        return a * 2, b + 1, z

    _, report = optimize_with(before, (mutate_cat, merge_splits), torch.randn(3, 4), torch.randn(3, 2))
    assert fired(report, "narrow-of-cat-operand")
    assert not fired(report, "narrow-run-last") and not fired(report, "narrow-merge-join")
