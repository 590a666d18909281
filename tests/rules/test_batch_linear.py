import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from optimus_egg import ops
from optimus_egg.rules.batch_linear import batch_linear
from optimus_egg.testing import calls, fired, optimize_with


class ParallelLinears(nn.Module):
    def __init__(self, n=8, k=16, o=32, bias=True):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(k, o, bias=bias) for _ in range(n))

    def forward(self, x):
        xs = torch.unbind(x, dim=0)
        return [l(xs[i]) for i, l in enumerate(self.ls)]


def test_batch_linear():
    m = ParallelLinears()
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(8, 4, 16))
    assert fired(report, "batch-linear")
    assert calls(after, nn.Linear) == 0 and calls(after, ops.batched_linear) == 1


def test_one_row_linears_that_inductor_computes_elementwise_stay_apart():
    """On CPU Inductor computes addmm(b, x[1, K], w.T) with K, N <= 16 as elementwise code
    fused with its neighbours (no GEMM launch); batched they would be one baddbmm, a launch
    more. Such linears join no group (the rule cannot fire), and Inductor launches no more
    than for the input. With two rows each they are GEMMs and batch; without biases too
    (each an mm; their batch is a bmm of one row, which Inductor computes as elementwise
    code: fewer launches)."""
    from optimus_egg.measure import compile_inductor

    m = ParallelLinears(n=3, k=3, o=3)
    x = torch.randn(3, 1, 3)
    gm = torch.fx.symbolic_trace(m)
    after, report = optimize_with(gm, batch_linear, x)
    assert "linear" not in report.groups and not fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == 0
    with torch.no_grad():
        before_n, after_n = (compile_inductor(g, [x]).launches.total for g in (gm, after))
    assert after_n <= before_n
    wider, _ = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(3, 2, 3))
    assert calls(wider, ops.batched_linear) == 1
    plain = ParallelLinears(n=3, k=3, o=3, bias=False)
    gm = torch.fx.symbolic_trace(plain)
    after, report = optimize_with(gm, batch_linear, x)
    assert fired(report, "batch-linear") and calls(after, ops.batched_linear) == 1
    with torch.no_grad():
        before_n, after_n = (compile_inductor(g, [x]).launches for g in (gm, after))
    assert before_n.extern == 3 and after_n.extern == 0 and after_n.total < before_n.total


def test_batch_linear_mixed_bias_beyond_optimus():
    m = ParallelLinears(n=6)
    m.ls[1].bias = None
    m.ls[4].bias = None
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(6, 4, 16))
    assert fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == 1 and calls(after, ops.stack_bias) == 1


def test_batch_linear_3d_inputs_beyond_optimus():
    m = ParallelLinears(n=6)
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(6, 2, 3, 16))
    assert fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == 1


def test_batch_linear_needs_same_shape():
    wa, wb = torch.randn(32, 16), torch.randn(8, 16)

    def before(x, y):
        return F.linear(x, wa), F.linear(y, wb)

    _, report = optimize_with(before, batch_linear, torch.randn(4, 16), torch.randn(4, 16))
    assert not fired(report, "batch-linear")


def test_batch_linear_needs_independence():
    w = torch.randn(16, 16)

    def before(x):
        return F.linear(F.linear(x, w), w)  # same signature, but the second reads the first

    _, report = optimize_with(before, batch_linear, torch.randn(4, 16))
    assert not fired(report, "batch-linear")


def test_batch_linear_left_alone_when_cost_model_says_so(monkeypatch):
    from optimus_egg.extract import launch_cost

    monkeypatch.setitem(launch_cost.TABLES["cpu"], "copy", 1.0)  # 3 stacks + 1 bmm > 2 GEMMs
    m = ParallelLinears(n=2)
    after, report = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(2, 4, 16))
    assert fired(report, "batch-linear")  # the alternative exists ...
    assert calls(after, nn.Linear) == 2 and not report.changed  # ... and is not extracted


def _aten_linears(bias=True, weight_t=torch.t):
    """Three F.linear calls as make_fx writes them: addmm(b, x, t(w)), or mm(x, t(w)) without bias."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, *params):
        ws, bs = params[0::2], params[1::2]
        return [torch.addmm(bs[i], x[i], weight_t(ws[i])) if bias else torch.mm(x[i], weight_t(ws[i]))
                for i in range(3)]

    inputs = [torch.randn(3, 4, 16)] + [t for _ in range(3) for t in (torch.randn(32, 16), torch.randn(32))]
    return make_fx(f)(*inputs), inputs


def test_batch_linear_aten_addmm():
    gm, inputs = _aten_linears()
    after, report = optimize_with(gm, batch_linear, *inputs)
    assert fired(report, "batch-linear")
    assert calls(after, torch.ops.aten.addmm.default) == 0 and calls(after, ops.batched_linear) == 1


def test_batch_linear_aten_mm_and_permute():
    gm, inputs = _aten_linears(bias=False, weight_t=lambda w: w.permute(1, 0))
    after, report = optimize_with(gm, batch_linear, *inputs)
    assert fired(report, "batch-linear")
    assert calls(after, torch.ops.aten.mm.default) == 0 and calls(after, ops.batched_linear) == 1


def test_batch_linear_aten_needs_transposed_weight():
    gm, inputs = _aten_linears(weight_t=lambda w: w.t().contiguous())  # mm(x, clone(t(w))): not read as a linear
    _, report = optimize_with(gm, batch_linear, *inputs)
    assert not fired(report, "batch-linear")


def test_batch_linear_aten_needs_unit_beta_alpha():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w1, b1, w2, b2):
        return torch.addmm(b1, x[0], w1.t(), beta=2), torch.addmm(b2, x[1], w2.t(), beta=2)

    inputs = [torch.randn(2, 4, 16), torch.randn(32, 16), torch.randn(32), torch.randn(32, 16), torch.randn(32)]
    _, report = optimize_with(make_fx(f)(*inputs), batch_linear, *inputs)
    assert not fired(report, "batch-linear")


def test_batch_linear_aten_needs_vector_bias():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w1, b1, w2, b2):
        return torch.addmm(b1, x[0], w1.t()), torch.addmm(b2, x[1], w2.t())  # [M, out] biases

    inputs = [torch.randn(2, 4, 16), torch.randn(32, 16), torch.randn(4, 32), torch.randn(32, 16), torch.randn(4, 32)]
    _, report = optimize_with(make_fx(f)(*inputs), batch_linear, *inputs)
    assert not fired(report, "batch-linear")


class SharedWeightOverPieces(nn.Module):
    """One linear applied to each piece of a tensor (cut on a dim other than the last)."""

    def __init__(self, cut="unbind", k=16, o=32, pieces=(0, 1, 2)):
        super().__init__()
        self.l, self.cut, self.pieces = nn.Linear(k, o), cut, pieces

    def forward(self, x):
        y = x.tanh()
        ps = torch.unbind(y, 0) if self.cut == "unbind" else torch.split(y, [2, 1, 3], 1)
        return [self.l(ps[i]) * (i + 1) for i in self.pieces]


def test_linear_of_unbind_piece():
    """A linear of one weight on pieces of unbind(y, 0) is the pieces of one linear of y: one
    GEMM instead of one per piece (and no copy of the weight, which batching would stack)."""
    after, report = optimize_with(SharedWeightOverPieces(), batch_linear, torch.randn(3, 4, 16))
    assert fired(report, "linear-of-unbind-piece") and fired(report, "linear-piece-reader")
    assert calls(after, nn.Linear) + calls(after, F.linear) == 1 and calls(after, ops.batched_linear) == 0


def test_linear_of_split_piece():
    after, report = optimize_with(SharedWeightOverPieces("split"), batch_linear, torch.randn(4, 6, 16))
    assert fired(report, "linear-of-split-piece")
    assert calls(after, nn.Linear) + calls(after, F.linear) == 1


def test_linear_piece_reader():
    """The rewrite needs two pieces read by one (weight, bias): a lone piece's linear stays on
    the piece (the whole would compute more for the same launch), and so do pieces cut on the
    last dim (a linear reads that dim whole)."""
    after, report = optimize_with(SharedWeightOverPieces(pieces=(1,)), batch_linear, torch.randn(3, 4, 16))
    assert fired(report, "linear-piece-reader") and not fired(report, "linear-of-unbind-piece")
    assert calls(after, torch.unbind) + calls(after, torch.select) == 1

    class LastDim(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 8)

        def forward(self, x):
            a, b = torch.split(x.tanh(), [4, 4], -1)
            return self.l(a), self.l(b)

    after, report = optimize_with(LastDim(), batch_linear, torch.randn(3, 8))
    assert not fired(report, "linear-of-split-piece")

    def vector_weight(x, w):
        """F.linear with a 1-D weight drops the last dim: no rewrite, and no batch_linear group
        (batched_linear of stacked 1-D weights failed when raised)."""
        ps = torch.unbind(x.tanh(), 0)
        return F.linear(ps[0], w), F.linear(ps[1], w)

    after, report = optimize_with(vector_weight, batch_linear, torch.randn(2, 3, 4), torch.randn(4))
    assert not fired(report, "linear-of-unbind-piece") and not fired(report, "batch-linear")


def test_linear_of_pieces_fewer_launches_and_gradients():
    """Compiled with Inductor: fewer launches than the input; in training the gradients of the
    shared weight match too."""
    from optimus_egg.measure import compile_inductor

    torch.manual_seed(0)
    m = SharedWeightOverPieces()
    x = torch.randn(3, 4, 16)
    gm = torch.fx.symbolic_trace(m)
    after, _ = optimize_with(gm, batch_linear, x)
    with torch.no_grad():
        before_n, after_n = (compile_inductor(g, [x]).launches for g in (gm, after))
    assert after_n.extern == 1 < before_n.extern == 3 and after_n.total < before_n.total
    grads = []
    for g in (gm, after):
        m.zero_grad()
        sum(o.sum() for o in g(x)).backward()
        grads.append(m.l.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


class LinearOfACatOperand(nn.Module):
    """u = lin_u(x); p, q = split(cat([u, y]), [8, 8], 1) (or unbind(stack([u, y]))); lin_w(p)
    and lin_k(tanh(y)). p is u: the rules cancel the pair (narrow-of-cat-operand,
    unbind-of-stack), so lin_w is one linear deep, beside lin_k. Cut by depth in the input
    graph (the cat counted) the three were three GEMMs; looking through the cancelled pair,
    lin_w and lin_k are one batch."""

    def __init__(self, cut):
        super().__init__()
        self.cut = cut
        self.u, self.w, self.k = (nn.Linear(8, 8) for _ in range(3))

    def forward(self, x, y):
        u = self.u(x)
        if self.cut == "split":
            p, q = torch.cat([u, y], 1).split([8, 8], 1)
        else:
            p, q = torch.stack([u, y]).unbind(0)
        return self.w(p), self.k(y.tanh()), q * 2


@pytest.mark.parametrize("cut, family, rule", [("split", "merge_splits", "narrow-of-cat-operand"),
                                              ("unbind", "unbind_stack", "unbind-of-stack")])
def test_batch_linear_groups_by_depth_through_a_cancelled_pair(cut, family, rule):
    from optimus_egg.rules import RULESETS

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    after, report = optimize_with(LinearOfACatOperand(cut), (batch_linear, RULESETS[family]), x, y)
    assert fired(report, rule) and fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == 1 and calls(after, nn.Linear) + calls(after, F.linear) == 1


class LinearOfAPieceBesideTheOtherOperand(nn.Module):
    """b(x) is cat's second operand; a reads the first piece, which is y. Through the cat, a
    depends on b in the input graph, yet both are one linear deep (the piece is y): their group
    is independent only once the cat and split cancel."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y):
        p0, p1 = torch.cat([y, self.b(x)], 1).split([8, 8], 1)
        return self.a(p0), p1 * 3


@pytest.mark.parametrize("cancel", [True, False])
def test_a_group_independent_only_through_a_cancelled_pair_never_closes_a_cycle(cancel):
    """With merge_splits the two linears are one batch (reading y); without it the batch would
    read its own output through the cat, and extraction keeps the two apart."""
    from optimus_egg.rules.merge_splits import merge_splits

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    families = (batch_linear, merge_splits) if cancel else batch_linear
    after, report = optimize_with(LinearOfAPieceBesideTheOtherOperand(), families, x, y)
    assert fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == (1 if cancel else 0)


class BranchesOfUnequalLength(nn.Module):
    """Three linears of one signature behind zero, one and two elementwise ops on three inputs:
    three depths and no path between them, one batch that depth groups miss."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x, y, z):
        return self.ls[0](x), self.ls[1](y.tanh()), self.ls[2](z.sigmoid() * 2)


def test_batch_linear_groups_independent_linears_across_depths(monkeypatch):
    from optimus_egg import from_fx

    args = [torch.randn(4, 8) for _ in range(3)]
    after, report = optimize_with(BranchesOfUnequalLength(), batch_linear, *args)
    assert fired(report, "batch-linear")
    assert calls(after, ops.batched_linear) == 1 and calls(after, nn.Linear) == 0
    monkeypatch.setattr(from_fx, "INDEPENDENT_MAX", 0)  # depth groups alone
    after, report = optimize_with(BranchesOfUnequalLength(), batch_linear, *args)
    assert calls(after, ops.batched_linear) == 0 and calls(after, nn.Linear) == 3


class RowsRead(nn.Module):
    """Three linears on an input's rows, each result read by a relu."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(16, 32) for _ in range(3))

    def forward(self, x):
        xs = x.unbind(0)
        return [l(xs[i]).relu() for i, l in enumerate(self.ls)]


def test_batched_biases_are_added_per_row_where_the_rows_readers_fuse_them(monkeypatch):
    """The batch's rows are each read by a relu: each adds its own bias there (fused with the
    relu) instead of a baddbmm over stacked biases. The same values and gradients, and no more
    launches than the stacked form (on dhen and interformer it saves launches: README)."""
    from optimus_egg import to_fx
    from optimus_egg.measure import compile_inductor

    torch.manual_seed(0)
    m = RowsRead()
    x = torch.randn(3, 8, 16)
    gm = torch.fx.symbolic_trace(m)
    after, report = optimize_with(gm, batch_linear, x)
    [bl] = [n for n in after.graph.nodes if n.target is ops.batched_linear]
    assert fired(report, "batch-linear") and bl.args[2] is None and calls(after, torch.add) == 3
    grads = []
    for g in (gm, after):
        m.zero_grad()
        sum(o.square().sum() for o in g(x)).backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    torch.testing.assert_close(grads[0], grads[1])
    monkeypatch.setattr(to_fx, "_bias_after_unbind", lambda *a: None)
    stacked, _ = optimize_with(gm, batch_linear, x)
    assert calls(stacked, ops.batched_linear) == 1 and calls(stacked, torch.add) == 0
    with torch.no_grad():
        assert compile_inductor(after, [x]).launches.total <= compile_inductor(stacked, [x]).launches.total


@pytest.mark.parametrize("biases", [(True, True, True), (True, False, True)])
def test_batched_biases_stay_stacked_where_a_row_is_an_output(biases):
    """Rows the graph returns would each need a kernel for their bias: the baddbmm keeps it."""
    m = ParallelLinears(n=3)
    for l, b in zip(m.ls, biases):
        l.bias = l.bias if b else None
    after, _ = optimize_with(torch.fx.symbolic_trace(m), batch_linear, torch.randn(3, 4, 16))
    [bl] = [n for n in after.graph.nodes if n.target is ops.batched_linear]
    assert bl.args[2] is not None and calls(after, torch.add) == 0 and calls(after, ops.stack_bias) == (not all(biases))


class RowsIntoGemms(nn.Module):
    """Three linears on an input's rows, each result multiplied by a matrix of its own."""

    def __init__(self):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(16, 32) for _ in range(3))
        self.ws = nn.ParameterList(nn.Parameter(torch.randn(32, 8)) for _ in range(3))

    def forward(self, x):
        xs = x.unbind(0)
        return [l(xs[i]) @ w for i, (l, w) in enumerate(zip(self.ls, self.ws))]


def test_batched_biases_stay_stacked_where_a_gemm_reads_a_row():
    """A row read by a GEMM (an extern call, no generated code to absorb an add) would need a
    kernel for its bias: the baddbmm keeps the stacked biases. The same rows read by relus
    add them per row (test above)."""
    after, report = optimize_with(RowsIntoGemms(), batch_linear, torch.randn(3, 4, 16))
    [bl] = [n for n in after.graph.nodes if n.target is ops.batched_linear]
    assert fired(report, "batch-linear") and bl.args[2] is not None and calls(after, torch.add) == 0


class SharedLinear(nn.Module):
    """One nn.Linear over n independent inputs (the members of a batch read one weight and bias)."""

    def __init__(self, n=3, k=16, o=32):
        super().__init__()
        self.n, self.l = n, nn.Linear(k, o)

    def forward(self, x):
        xs = torch.unbind(torch.sigmoid(x), dim=0)  # computed inputs: no view of x to read whole
        return [self.l(torch.tanh(xs[i]) * (i + 1)) for i in range(self.n)]


def test_batch_linear_shared_weight():
    """Members reading one weight and bias are one linear of their stacked inputs: no stack of
    the weight (a copy per call, and in training a sum of its slices in the backward)."""
    after, report = optimize_with(torch.fx.symbolic_trace(SharedLinear()), batch_linear, torch.randn(3, 4, 16))
    assert fired(report, "batch-linear-shared-weight")
    assert calls(after, ops.batched_linear) == 0 and calls(after, torch._C._nn.linear) == 1
    assert [n.args[0].target for n in after.graph.nodes if n.target is torch._C._nn.linear] == [torch.stack]


def test_batch_linear_shared_weight_needs_one_bias():
    """One weight but biases of their own: the group stacks them (batch-linear); the rule cannot fire."""
    w = torch.randn(32, 16)
    ba, bb = torch.randn(32), torch.randn(32)

    def before(x, y):
        return F.linear(torch.tanh(x), w, ba), F.linear(torch.tanh(y), w, bb)

    after, report = optimize_with(before, batch_linear, torch.randn(4, 16), torch.randn(4, 16))
    assert fired(report, "batch-linear") and not fired(report, "batch-linear-shared-weight")
    assert calls(after, ops.batched_linear) == 1
