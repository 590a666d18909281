"""Graphs with a symbolic batch size: what torch.compile hands a backend when a model is called
with a second batch size (automatic dynamic shapes), or with dynamic=True, and what
torch.export (a dynamic Dim) and make_fx(tracing_mode="symbolic") give.

In Dynamo's graphs the symbolic size is a SymInt placeholder (s0) and tensors have shapes like
(s0, 96); export and make_fx graphs have only the tensors; flattened [b, l, d] rows have the
size l*b, an expression. The rules must still batch (shapes with the same symbolic size are
equal) and the result must compute eager's values at every batch
size, not only the one of the example inputs.
"""
import pytest
import test_backend  # tests/ is on sys.path under pytest (no __init__.py)
import torch
from torch import nn

import optimus_egg
from optimus_egg.shapes import (
    SYMBOLIC_MIN,
    has_symbolic_sizes,
    size_symbols,
    symbolic_shape,
)


class Parallel(test_backend.Parallel):
    def forward(self, x):
        xs = torch.split(x, self.d, dim=1)
        ys = [self.norms[i](torch.tanh(self.ls[i](xs[i]))) for i in range(self.n)]
        return torch.cat(ys, dim=1).view(-1, 2, self.n * self.d // 2)  # a view to the batch size


class Sliced(Parallel):
    """Cuts the symbolic dim (the last rows) and a static one: neither may use the example's size."""

    def forward(self, x):
        tail = x[-3:]
        return super().forward(x)[:, 0, : self.d].sum(0) + tail[:, : self.d].sum(0)


class CatRows(Parallel):
    """Rows stacked along the symbolic dim (2*s0 rows) and split back by SymInt sizes."""

    def forward(self, x):
        x = torch.cat([x, x * 2], 0)
        xs = torch.split(x, self.d, dim=1)
        y = torch.cat([self.norms[i](torch.tanh(self.ls[i](xs[i]))) for i in range(self.n)], dim=1)
        a, b = torch.split(y, [y.shape[0] // 2, y.shape[0] // 2], 0)
        return (a + b).view(-1, 2, self.n * self.d // 2)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)


def dynamic_graph(model, xs=None):
    """The graph Dynamo hands a backend on the second input, with every dim but the last marked
    dynamic (what the recompile would do anyway, whatever Dynamo's profile of earlier runs
    says): those sizes are symbolic. By default batches of 8 and 6 rows."""
    xs = xs if xs is not None else [torch.randn(b, model.n * model.d) for b in (8, 6)]
    graphs = []

    def grab(gm, inputs):
        graphs.append((gm, list(inputs)))
        return gm.forward

    compiled = torch.compile(model, backend=grab)
    with torch.no_grad():
        for k, x in enumerate(xs):
            for d in range(x.dim() - 1) if k else ():
                torch._dynamo.maybe_mark_dynamic(x, d)
            compiled(x)
    gm, inputs = graphs[-1]
    assert len(size_symbols(gm)) == xs[-1].dim() - 1, "Dynamo did not make every size but the last symbolic"
    return gm, inputs


def run_at(gm, inputs, x):
    """The captured graph's inputs for a new batch: the SymInt placeholder and the tensor
    placeholder change, the lifted parameters stay."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    args = []
    for p, v in zip(placeholders, inputs):
        if isinstance(p.meta.get("example_value"), torch.SymInt):
            args.append(x.shape[0])
        elif isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter) and v.dim() == 2 and v.shape[1] == x.shape[1]:
            args.append(x)
        else:
            args.append(v)
    with torch.no_grad():
        out = gm(*args)
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("model_cls", [Parallel, Sliced, CatRows])
def test_symbolic_batch_is_batched_and_right_at_every_size(model_cls):
    torch.manual_seed(0)
    model = model_cls().eval()
    gm, inputs = dynamic_graph(model)
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.changed and report.matches.get("batch-linear", 0) >= 6, report
    assert report.matches.get("batch-layernorm", 0) >= 6, report
    for b in (6, 8, 5, 17):  # the example's size, the first capture's, and others
        x = torch.randn(b, model.n * model.d)
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(run_at(out, inputs, x), want, rtol=1e-4, atol=1e-5)


def test_optimize_leaves_the_capture_symbolic():
    """Nothing optimize does may pin the capture's symbol to the example's size (filling the
    new nodes' meta from the example inputs did: s0 became 6 in Dynamo's ShapeEnv)."""
    gm, inputs = dynamic_graph(Parallel().eval())
    sym = next(n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt))
    assert not str(sym.meta["example_value"]).isdigit()
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    assert out.meta["optimus_egg"].changed
    assert not str(sym.meta["example_value"]).isdigit(), sym.meta["example_value"]
    assert has_symbolic_sizes(gm)


def test_symbolic_shapes_map_to_sentinels():
    gm, _ = dynamic_graph(Parallel().eval())
    symbols = size_symbols(gm)
    (_name, (sentinel, placeholder)), = symbols.items()
    assert sentinel >= SYMBOLIC_MIN and placeholder in {n.name for n in gm.graph.nodes}
    x = next(n for n in gm.graph.nodes if n.op == "placeholder" and hasattr(n.meta.get("example_value"), "shape"))
    assert symbolic_shape(x.meta["example_value"], symbols) == (sentinel, 96)
    assert symbolic_shape(x.meta["example_value"], {}) is None  # an unknown symbol: no shape
    assert symbolic_shape(torch.empty(2, 3), symbols) == (2, 3)


def train_through_backend(monkeypatch, model_cls, xs):
    """Train model_cls through torch.compile(backend="optimus_egg") on each input of xs (all
    but the first with every dim but the last marked dynamic: the recompile has them symbolic),
    with values and parameter gradients equal to eager's. Returns (number of size symbols,
    report) per graph optimized."""
    from optimus_egg import pipeline

    reports, real = [], pipeline.optimize

    def spy(gm, *a, **k):
        out = real(gm, *a, **k)
        reports.append((len(size_symbols(gm)), out.meta["optimus_egg"]))
        return out

    monkeypatch.setattr(pipeline, "optimize", spy)
    torch.manual_seed(0)
    model, ref = model_cls(), model_cls()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="optimus_egg")
    for k, x in enumerate(xs):
        for d in range(x.dim() - 1) if k else ():
            torch._dynamo.maybe_mark_dynamic(x, d)
        model.zero_grad()
        ref.zero_grad()
        out = compiled(x)
        torch.testing.assert_close(out, ref(x), rtol=1e-4, atol=1e-5)
        out.square().sum().backward()
        ref(x).square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
    return reports


def test_backend_trains_at_two_batch_sizes(monkeypatch):
    """torch.compile's recompile at a second batch size (a symbolic batch) is optimized too,
    and values and gradients match eager at a third size."""
    reports = train_through_backend(monkeypatch, Parallel, [torch.randn(b, 96) for b in (8, 6, 11)])
    symbolic = [r for n, r in reports if n]
    assert symbolic and all(r.changed and r.matches.get("batch-linear", 0) >= 6 for r in symbolic), reports


# ---- expressions of symbols: batch x sequence rows ------------------------------------------

class Tokens(nn.Module):
    """A parallel MLP over the rows of a [b, l, n*d] input flattened to [b*l, n*d]: with b and l
    symbolic every size of the rows is the expression l*b."""

    def __init__(self, n=4, d=16):
        super().__init__()
        self.n, self.d = n, d
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))

    def forward(self, x):
        b, l, _ = x.shape
        xs = torch.split(x.reshape(b * l, self.n * self.d), self.d, dim=1)
        ys = [self.norms[i](torch.relu(self.ls[i](xs[i]))) for i in range(self.n)]
        return torch.cat(ys, dim=1).view(-1, 2, self.n * self.d // 2).reshape(b, l, -1)


def rows_graph(model):
    return dynamic_graph(model, [torch.randn(b, l, model.n * model.d) for b, l in [(4, 6), (3, 5)]])


def test_expression_of_symbols_is_batched_and_right_at_every_size():
    torch.manual_seed(0)
    model = Tokens().eval()
    gm, inputs = rows_graph(model)
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.matches.get("batch-linear", 0) >= 4 and report.matches.get("batch-layernorm", 0) >= 4, report
    # view(-1, 2, 32) of the batched result is raised as a reshape to [l*b, 2, 32], computed from s0, s1
    assert any(n.op == "call_function" and n.target is torch.reshape and isinstance(n.args[1][0], torch.fx.Node)
               for n in out.graph.nodes), out.code
    for b, l in [(3, 5), (4, 6), (7, 2), (1, 9)]:
        x = torch.randn(b, l, model.n * model.d)
        args = [b if i == 0 else l if i == 1 else x if i == 2 else v for i, v in enumerate(inputs)]
        assert isinstance(inputs[0], (int, torch.SymInt)) and isinstance(inputs[1], (int, torch.SymInt))
        with torch.no_grad():
            got, want = out(*args), model(x)
        torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-5)


def test_expressions_get_sentinels_of_their_own():
    import sympy

    from optimus_egg.shapes import _computable

    gm, _ = rows_graph(Tokens().eval())
    symbols = size_symbols(gm)
    rows = next(n for n in gm.graph.nodes if n.op == "call_method" and n.target == "reshape")
    shape = symbolic_shape(rows.meta["example_value"], symbols)
    assert shape is not None and shape[1] == 64 and shape[0] >= SYMBOLIC_MIN
    sentinel, expr = symbols[str(rows.meta["example_value"].shape[0].node.expr)]
    assert sentinel == shape[0] and expr.is_Mul and len(symbols) == 3
    assert symbolic_shape(rows.meta["example_value"], symbols) == shape  # the same expression: the same sentinel
    s = sympy.Symbol(next(iter(symbols)), integer=True, positive=True)
    assert not _computable(sympy.Mod(s, 3), symbols)  # to_fx computes +, * and // only
    assert not _computable(s + sympy.Symbol("unknown"), symbols)


# ---- torch.export and make_fx graphs: the symbol is a size of the input tensor ------------

def exported_graph(model, b=8):
    from torch.export import Dim, export

    x = torch.randn(b, model.n * model.d)
    return export(model, (x,), dynamic_shapes=({0: Dim("batch", min=3)},)).module(), [x]


def make_fx_graph(model, b=8):
    """make_fx(tracing_mode="symbolic") of the model with its parameters as inputs: aten ops
    (addmm(b, x, t(w)) for a linear), and sizes that are constant SymInts."""
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(model.named_parameters())
    x = torch.randn(b, model.n * model.d)
    gm = make_fx(lambda p, x: torch.func.functional_call(model, p, (x,)), tracing_mode="symbolic")(params, x)
    return gm, [*params.values(), x]


@pytest.mark.parametrize("model_cls", [Parallel, Sliced])
@pytest.mark.parametrize("capture", [exported_graph, make_fx_graph])
def test_exported_symbolic_batch_is_batched_and_right_at_every_size(capture, model_cls):
    torch.manual_seed(0)
    model = model_cls().eval()
    gm, inputs = capture(model)
    (_sym, (_sentinel, source)), = size_symbols(gm).items()
    assert isinstance(source, tuple) and source[1] == 0, source  # (input tensor, dim 0): no SymInt placeholder
    out = optimus_egg.optimize(gm, inputs, budget_s=5.0, strict=True)
    report = out.meta["optimus_egg"]
    assert report.changed and report.matches.get("batch-linear", 0) >= 6, report
    assert report.matches.get("batch-layernorm", 0) >= 6, report
    if model_cls is Parallel:  # the view to the batch size reads the batch from the input
        assert any(n.target is torch.ops.aten.sym_size.int for n in out.graph.nodes), out.code
    for b in (8, 5, 17):
        x = torch.randn(b, model.n * model.d)
        with torch.no_grad():
            want = model(x)
            got = out(*inputs[:-1], x) if capture is exported_graph else out(dict(model.named_parameters()), x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_constant_symint_sizes_are_static():
    """make_fx's parameters have SymInt sizes that are constants: they are plain sizes."""
    gm, _ = make_fx_graph(Parallel().eval())
    w = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert all(isinstance(d, torch.SymInt) for d in w.meta["val"].shape)  # the case this is about
    assert symbolic_shape(w.meta["val"], {}) == (16, 16)


def test_backend_trains_flattened_rows_at_three_sizes(monkeypatch):
    """Through torch.compile with b and l symbolic: the l*b rows are batched, and values and
    gradients match eager at every (b, l)."""
    reports = train_through_backend(monkeypatch, Tokens, [torch.randn(b, l, 64) for b, l in [(4, 6), (3, 5), (2, 7)]])
    symbolic = [r for n, r in reports if n == 2]
    assert symbolic and all(r.matches.get("batch-linear", 0) >= 4 for r in symbolic), reports


def test_backend_with_dynamic_true(monkeypatch):
    """torch.compile(dynamic=True): Dynamo first lifts LayerNorm's eps to a tensor input, Inductor
    then restarts the capture with the floats specialized; the graph that is kept is batched and
    holds at every batch size."""
    from optimus_egg import pipeline

    reports, real = [], pipeline.optimize

    def spy(gm, *a, **k):
        out = real(gm, *a, **k)
        reports.append(out.meta["optimus_egg"])
        return out

    monkeypatch.setattr(pipeline, "optimize", spy)
    torch.manual_seed(0)
    model = Parallel().eval()
    compiled = torch.compile(model, backend="optimus_egg", dynamic=True)
    with torch.no_grad():
        for b in (8, 5, 13):
            x = torch.randn(b, 96)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    last = reports[-1]
    assert last.matches.get("batch-linear", 0) >= 6 and last.matches.get("batch-layernorm", 0) >= 6, reports
