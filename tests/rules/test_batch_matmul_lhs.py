import operator

import torch
from optimus_egg.rules.batch_matmul_lhs import batch_matmul_lhs

from optimus_egg.testing import calls, fired, optimize_with


def attend_twice(q, t, s):
    """One query attends over two key sets (InterFormer's interaction arch); `t` is made from
    `s`, so the two score products lie at different depths."""
    t = torch.cat([t, torch.tanh(s[:, :1])], 1)
    a1 = torch.softmax(torch.bmm(q, t.transpose(1, 2)), -1)
    a2 = torch.softmax(torch.bmm(q, s.transpose(1, 2)), -1)
    return torch.cat([torch.bmm(a1, t), torch.bmm(a2, s)], 2)


def test_batch_matmul_lhs():
    q, t, s = torch.randn(4, 3, 8), torch.randn(4, 2, 8), torch.randn(4, 5, 8)
    after, report = optimize_with(attend_twice, batch_matmul_lhs, q, t, s)
    assert fired(report, "batch-matmul-lhs") and report.groups["matmul_lhs"] == 1
    assert calls(after, torch.bmm) == 3 and calls(after, torch.split) == 1  # one score product, two weighted sums


def test_batch_matmul_lhs_matmul_and_operator():
    """torch.matmul and @ with 4-D operands and a 2-D right operand: concatenated on the last dim."""
    w1, w2, w3 = torch.randn(8, 3), torch.randn(8, 5), torch.randn(8, 2)

    def before(x, k1, k2):
        return torch.matmul(x, k1), torch.matmul(x, k2), x @ w1, x @ w2, x @ w3

    x, k1, k2 = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 8, 6), torch.randn(2, 4, 8, 7)
    after, report = optimize_with(before, batch_matmul_lhs, x, k1, k2)
    assert report.matches["batch-matmul-lhs"] == 5 and report.groups["matmul_lhs"] == 2
    assert calls(after, torch.matmul) == 1 and calls(after, operator.matmul) == 1


def test_batch_matmul_lhs_needs_independent_members():
    """The second product reads the first: the two stay apart (one would be its own ancestor)."""

    def before(q, k):
        a = torch.bmm(q, k)
        return a, torch.bmm(q, torch.tanh(a))

    after, report = optimize_with(before, batch_matmul_lhs, torch.randn(2, 4, 4), torch.randn(2, 4, 4))
    assert not fired(report, "batch-matmul-lhs") and calls(after, torch.bmm) == 2


def test_batch_matmul_lhs_needs_alike_right_operands():
    """Right operands of another dtype, or another size outside the last dim, or a vector: no group."""

    def before(x, k, kd, k3, v):
        xd = x.double()
        return (torch.matmul(x, k), torch.matmul(xd, kd), torch.matmul(xd, kd * 2).sum(),
                torch.matmul(x, k3), torch.matmul(x, v), torch.matmul(x, v * 2))

    x, k, kd, k3, v = torch.randn(4, 8), torch.randn(8, 3), torch.randn(8, 5).double(), torch.randn(2, 8, 3), torch.randn(8)
    after, report = optimize_with(before, batch_matmul_lhs, x, k, kd, k3, v)
    # the two fp64 products group; x's fp32 ones with 2-D, 3-D and 1-D right operands do not
    assert report.groups.get("matmul_lhs") == 1 and calls(after, torch.matmul) == 5


def test_batch_matmul_lhs_products_indexed_by_row():
    """`bmm(q, k)[0]` selects a row of a tensor: the product still joins the group. The same
    product traced twice is one value and joins it once (k2 is concatenated once)."""

    def before(q, k1, k2):
        return torch.bmm(q, k1)[0], torch.bmm(q, k2)[0] + 1, torch.bmm(q, k2)[1:]

    q, k1, k2 = torch.randn(3, 4, 8), torch.randn(3, 8, 5), torch.randn(3, 8, 6)
    after, report = optimize_with(before, batch_matmul_lhs, q, k1, k2)
    assert fired(report, "batch-matmul-lhs") and report.groups["matmul_lhs"] == 1
    assert calls(after, torch.bmm) == 1
    (cat,) = [n for n in after.graph.nodes if n.target is torch.cat]
    assert [a.name for a in cat.args[0]] == ["k1", "k2"]


def attend_rows(q, k1, k2):
    """One query row attends over two single keys: the score products are dot products."""
    s1, s2 = torch.tanh(q @ k1.t() / 8), torch.tanh(q @ k2.t() / 8)
    return s1 @ k1 + s2 @ k2


def test_dot_products_that_inductor_computes_elementwise_stay_apart():
    """On CPU Inductor computes [1, K] @ [K, 1] as multiplies and a sum fused with its
    neighbours; the group's product of the concatenated keys ([1, K] @ [K, 2]) is a GEMM,
    a launch more (and a copy for the cat). Such products are not grouped, and Inductor
    launches no more than for the input. With two query rows the products are GEMMs and group."""
    from optimus_egg.measure import compile_inductor

    q, k1, k2 = torch.randn(1, 8), torch.randn(1, 8), torch.randn(1, 8)
    gm = torch.fx.symbolic_trace(attend_rows)
    after, report = optimize_with(gm, batch_matmul_lhs, q, k1, k2)
    assert "matmul_lhs" not in report.groups and not fired(report, "batch-matmul-lhs")
    with torch.no_grad():
        before_n, after_n = (compile_inductor(g, [q, k1, k2]).launches.total for g in (gm, after))
    assert after_n <= before_n
    wider, report = optimize_with(torch.fx.symbolic_trace(attend_rows), batch_matmul_lhs, torch.randn(2, 8), k1, k2)
    assert report.groups["matmul_lhs"] == 1 and fired(report, "batch-matmul-lhs")
    assert calls(wider, operator.matmul) == 3  # one score product of the concatenated keys, two weighted sums


def test_batch_matmul_lhs_in_the_order_a_cat_reads_it():
    """Three products of one query that a cat reads in reverse order: seeded in the cat's order
    too, the concatenated product is the result, with no split or cat of its pieces."""
    from optimus_egg.rules.split_cat import split_cat

    def before(x, k1, k2, k3):
        a, b, c = x @ k1, x @ k2, x @ k3
        return torch.cat([c, b, a], 1)

    x, ks = torch.randn(4, 8), [torch.randn(8, n) for n in (3, 5, 2)]
    after, report = optimize_with(before, (batch_matmul_lhs, split_cat), x, *ks)
    assert report.groups["matmul_lhs"] == 2 and fired(report, "batch-matmul-lhs")
    assert calls(after, operator.matmul) == 1 and calls(after, torch.split) == 0
    out = next(n for n in after.graph.nodes if n.op == "output").args[0]
    assert out.target is operator.matmul
