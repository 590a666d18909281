import operator

import torch
from optimus_egg.rules.batch_matmul import batch_matmul
from optimus_egg.rules.batch_matmul_lhs import batch_matmul_lhs
from optimus_egg.rules.unbind_stack import unbind_stack

from optimus_egg.testing import calls, fired, optimize_with


def attend_apart(q1, q2, q3, k1, k2, k3):
    """Three queries, each over its own keys (stored [d, n]): three products of alike operands."""
    return [torch.softmax(q @ k, -1) for q, k in ((q1, k1), (q2, k2), (q3, k3))]


def test_batch_matmul():
    qs, ks = [torch.randn(4, 8) for _ in range(3)], [torch.randn(8, 6) for _ in range(3)]
    after, report = optimize_with(attend_apart, batch_matmul, *qs, *ks)
    assert fired(report, "batch-matmul") and report.groups["matmul"] == 1
    assert calls(after, operator.matmul) == 1 and calls(after, torch.stack) == 2


def attend_transposed(q1, q2, q3, k1, k2, k3):
    """Keys stored [n, d], read transposed (`k.t()`, `k.transpose(-2, -1)`)."""
    return (torch.softmax(q1 @ k1.t(), -1), torch.softmax(q2 @ k2.transpose(-2, -1), -1),
            torch.softmax(q3 @ k3.transpose(1, 0), -1))


def test_batch_matmul_transposed():
    """The stack of the transposed keys is the stack of the keys, its last dims swapped: a
    movedim (a view) of one stack, not a stack of transposes."""
    qs, ks = [torch.randn(4, 8) for _ in range(3)], [torch.randn(6, 8) for _ in range(3)]
    after, report = optimize_with(attend_transposed, batch_matmul, *qs, *ks)
    assert fired(report, "batch-matmul-transposed") and not fired(report, "batch-matmul")
    assert report.groups["matmul"] == 1 and calls(after, operator.matmul) == 1
    assert calls(after, torch.movedim) == 1 and calls(after, "t") == 0 and calls(after, "transpose") == 0


def one_query_two_keys(q, k1, k2):
    return [torch.softmax(q @ k, -1) for k in (k1, k2)]


def test_products_of_one_first_operand_are_left_to_batch_matmul_lhs():
    """Products of one first operand seed no batch_matmul group: stacking the operand with
    itself is a copy (`stack([q, q])`), where batch_matmul_lhs's one matmul of the concatenated
    second operands reads it once (`bench/differential.py --seed 56`: 11 launches, the greedy
    ablation's graph 10)."""
    q, ks = torch.randn(4, 8), [torch.randn(8, 6) for _ in range(2)]
    after, report = optimize_with(one_query_two_keys, (batch_matmul, batch_matmul_lhs), q, *ks)
    assert "matmul" not in report.groups and report.groups["matmul_lhs"] == 1
    assert fired(report, "batch-matmul-lhs") and calls(after, operator.matmul) == 1 and calls(after, torch.stack) == 0


def per_feature_attention(queries, seqs):
    """Each feature's queries over its own sequence: operands are slices `x[:, i]` of two inputs."""
    out = []
    for i in range(3):
        q, s = queries[:, i], seqs[:, i]
        out.append(torch.matmul(torch.softmax(torch.matmul(q, s.transpose(1, 2)), -1), s))
    return torch.cat(out, 2)


def test_batch_matmul_stacks_slices_on_their_own_dim():
    """Stacked on dim 1, the slices `x[:, i]` are x itself (unbind_stack): both products read
    the inputs uncopied, with no stack of them left."""
    queries, seqs = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)
    after, report = optimize_with(per_feature_attention, (batch_matmul, unbind_stack), queries, seqs)
    assert fired(report, "batch-matmul-transposed") and fired(report, "batch-matmul")
    assert report.groups["matmul"] == 2 and calls(after, torch.matmul) == 2
    first = next(n for n in after.graph.nodes if n.target is torch.matmul)
    assert first.args[0].name == "queries" and first.args[1].args[0].name == "seqs"  # matmul(queries, movedim(seqs))
    assert not any(n.target is torch.stack and n.args[0][0].op == "placeholder" for n in after.graph.nodes)


def test_batch_matmul_of_batched_operands_and_methods():
    """3-D operands stack to 4-D (matmul broadcasts over the new dim, on dim 0 or 1: a match
    each); `x.matmul(y)` groups too, apart from `@` (another op)."""

    def before(a, b, c, d):
        return a.matmul(b), c.matmul(d), a @ d, c @ b

    a, c = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    b, d = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    after, report = optimize_with(before, batch_matmul, a, b, c, d)
    assert report.matches["batch-matmul"] == 8 and report.groups["matmul"] == 2
    assert calls(after, "matmul") == 1 and calls(after, operator.matmul) == 1


def test_batch_matmul_needs_independent_members():
    """The second product reads the first: the two stay apart."""

    def before(a, b, c):
        return torch.matmul(torch.tanh(torch.matmul(a, b)), c)

    a, b, c = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    after, report = optimize_with(before, batch_matmul, a, b, c)
    assert "matmul" not in report.groups and calls(after, torch.matmul) == 2


def test_batch_matmul_needs_alike_operands():
    """Operands of another shape, dtype or rank, and bmm (which takes no 4-D operands), group
    with nothing: only the two fp32 [4, 8] @ [8, 3] products do."""

    def before(a, a2, w, w5, wd, x3, w3):
        return (torch.matmul(a, w), torch.matmul(a2, w * 2), torch.matmul(a, w5),
                torch.matmul(a.double(), wd), torch.matmul(x3, w), torch.bmm(x3, w3), torch.bmm(x3 + 1, w3))

    a, a2, w, w5, wd = torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 3), torch.randn(8, 5), torch.randn(8, 3).double()
    x3, w3 = torch.randn(2, 4, 8), torch.randn(2, 8, 3)
    after, report = optimize_with(before, batch_matmul, a, a2, w, w5, wd, x3, w3)
    assert report.groups["matmul"] == 1 and report.matches["batch-matmul"] == 2
    assert calls(after, torch.matmul) == 4 and calls(after, torch.bmm) == 2


def test_products_that_inductor_computes_elementwise_stay_apart():
    """Dot products ([1, K] @ [K, 1]) are elementwise code on CPU: no group."""

    def before(q1, q2, k1, k2):
        return torch.tanh(q1 @ k1.t()), torch.tanh(q2 @ k2.t())

    q1, q2, k1, k2 = (torch.randn(1, 8) for _ in range(4))
    after, report = optimize_with(before, batch_matmul, q1, q2, k1, k2)
    assert "matmul" not in report.groups and calls(after, operator.matmul) == 2


def attention_rows(x, v):
    """Five one-row score products (outer products, [1, 1] @ [1, 8]) of a batched score row: an
    extern mm each for Inductor, which also copies each piece of the scores out apart."""
    scores = torch.tanh(x @ v.t() / 8)            # [1, 5]
    rows = scores.t().unsqueeze(1).unbind(0)      # five [1, 1]
    return torch.cat([rows[i] @ v[i:i + 1] for i in range(5)], 1)


def test_batch_matmul_of_outer_products_launches_none():
    """Batched, the outer products are one [5, 1, 1] @ [5, 1, 8] product, which Inductor's CPU
    bmm lowering computes as elementwise code: 5 mm calls and their copies go (unbind_stack
    rejoins the score pieces into the stacked scores)."""
    from optimus_egg.measure import compile_inductor

    x, v = torch.randn(1, 8), torch.randn(5, 8)
    gm = torch.fx.symbolic_trace(attention_rows)
    after, report = optimize_with(gm, (batch_matmul, unbind_stack), x, v)
    assert fired(report, "batch-matmul") and report.groups["matmul"] == 1
    with torch.no_grad():
        before_n, after_n = (compile_inductor(g, [x, v]).launches for g in (gm, after))
    assert before_n.extern == 6 and after_n.extern == 1, (before_n, after_n)  # the score product stays
    assert after_n.total < before_n.total


class _Heads(torch.nn.Module):
    """Per-head products with parameter keys: batched, the gradients reach every key."""

    def __init__(self):
        super().__init__()
        self.keys = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(6, 8)) for _ in range(3))

    def forward(self, x):
        return torch.cat([torch.tanh(x[:, i] @ k.t()) for i, k in enumerate(self.keys)], 1)


def test_batch_matmul_keeps_gradients():
    torch.manual_seed(0)
    model, x = _Heads(), torch.randn(4, 3, 8, requires_grad=True)
    gm = torch.fx.symbolic_trace(model)
    after, report = optimize_with(gm, batch_matmul, x)
    assert fired(report, "batch-matmul-transposed") and calls(after, operator.matmul) == 1
    grads = []
    for g in (gm, after):
        model.zero_grad()
        x.grad = None
        g(x).square().sum().backward()
        grads.append([x.grad.clone(), *(k.grad.clone() for k in model.keys)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_batch_matmul_through_dynamo():
    """Dynamo's graph (inputs as placeholders, selects as getitems) batches alike."""
    reports = []

    def backend(gm, example_inputs):
        from optimus_egg.pipeline import optimize

        out = optimize(gm, example_inputs, budget_s=2.0, strict=True)
        reports.append(out.meta["optimus_egg"])
        return out.forward

    torch._dynamo.reset()
    queries, seqs = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8)
    compiled = torch.compile(per_feature_attention, backend=backend)
    torch.testing.assert_close(compiled(queries, seqs), per_feature_attention(queries, seqs))
    assert fired(reports[0], "batch-matmul") and fired(reports[0], "batch-matmul-transposed")


def test_groups_are_cut_in_graph_order_and_in_reverse():
    """m0 -> m1 -> m2 and m0 -> m3: first-fit in graph order groups {m1, m3}, in reverse order
    {m2, m3}; both are seeded (which one pays depends on the other rewrites: a group that
    another batch reads through cannot be extracted). Each group is independent."""
    from torch import fx

    from optimus_egg.from_fx import _Ancestors

    def f(x, w):
        m0 = x @ w
        m1 = torch.tanh(m0) @ w
        m2 = torch.tanh(m1) @ w
        m3 = torch.sigmoid(m0) @ w
        return m2, m3

    gm = fx.symbolic_trace(f)
    m0, m1, m2, m3 = (n for n in gm.graph.nodes if n.target is operator.matmul)
    ancestors = _Ancestors(gm.graph)
    sets = ancestors.independent_sets([m3, m2, m1, m0])
    assert sorted(map(frozenset, sets), key=len) == sorted(
        map(frozenset, ([m0], [m1, m3], [m2], [m2, m3], [m1])), key=len)
    assert not any(ancestors.related(a, b) for s in sets for a in s for b in s if a is not b)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    after, report = optimize_with(f, batch_matmul, x, w)
    assert report.groups["matmul"] == 2 and calls(after, operator.matmul) == 3
