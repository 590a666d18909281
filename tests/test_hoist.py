"""Parameter copies computed once in inference (hoist.py): fewer launches, the same values, and
recomputed whenever a parameter they read changes."""
import pytest
import torch
import torch.nn as nn

import optimus_egg
from optimus_egg import hoist
from optimus_egg.baselines import as_backend_compiles
from optimus_egg.bench import GRAD_TOL, predicted_launches
from optimus_egg.measure import compile_inductor


class Chunks(nn.Module):
    """Per-chunk linears (batched by optimus_egg into one bmm over stacked weights) and a LayerNorm each."""

    def __init__(self, n=4, d=64):
        super().__init__()
        self.n = n
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(n))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))

    def forward(self, x):
        parts = x.chunk(self.n, dim=1)
        return torch.cat([self.norms[i](self.ls[i](parts[i])) for i in range(self.n)], 1)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # (tests/conftest.py)


def _hoisted(fn):
    """The Hoisted object inside measure.compile_inductor's inference wrapper."""
    cells = [c.cell_contents for c in fn.__closure__ or ()]
    found = [c for c in cells if isinstance(c, hoist.Hoisted)]
    assert found, "not compiled with hoisting"
    return found[0]


def test_stacked_weights_are_computed_once_and_launch_nothing_per_call():
    torch.manual_seed(0)
    m, x = Chunks().eval(), torch.randn(64, 256)
    fast = optimus_egg.optimize(torch.fx.symbolic_trace(m), [x], budget_s=5.0, gemm_loops=True, strict=True)
    p = hoist.plan(fast, [x])
    assert p is not None and len(p.outputs) >= 2  # the stacked linear weights and biases at least
    kept = compile_inductor(as_backend_compiles(fast, hoist=False), [x])
    hoisted = compile_inductor(as_backend_compiles(fast, hoist=True), [x])
    assert hoisted.launches.total < kept.launches.total, (hoisted.launches, kept.launches)
    with torch.no_grad():
        want = m(x)
        for _ in range(3):
            torch.testing.assert_close(hoisted.fn(x), want)
    assert _hoisted(hoisted.fn).computed == 1


def test_backend_recomputes_the_stacks_after_a_parameter_changes(reports):
    torch.manual_seed(0)
    m, x = Chunks().eval(), torch.randn(64, 256)
    compiled = torch.compile(m, backend=optimus_egg.backend(strict=True))

    def check(what):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), m(x), msg=lambda s: f"after {what}: {s}")

    check("compiling")
    assert reports and reports[0].hoisted >= 2, str(reports[0])
    with torch.no_grad():
        m.ls[1].weight.add_(1.0)
    check("an in-place add")
    other = Chunks()
    m.load_state_dict(other.state_dict())
    check("load_state_dict")
    m.ls[2].bias.data = torch.randn(64)
    check("p.data = ...")
    m.norms[3].weight = nn.Parameter(torch.randn(64))
    check("a new Parameter object")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x[:8]), m(x[:8]))  # another batch size (recompiled)


def test_training_keeps_the_stacks_in_the_graph(reports):
    torch.manual_seed(0)
    m, x = Chunks(), torch.randn(64, 256)
    ref = Chunks()
    ref.load_state_dict(m.state_dict())
    torch.compile(m, backend=optimus_egg.backend(strict=True))(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert reports and reports[0].changed and reports[0].hoisted == 0
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **GRAD_TOL, msg=lambda s: f"{name}: {s}")


def test_no_hoisting_when_switched_off(reports):
    torch.manual_seed(0)
    m, x = Chunks().eval(), torch.randn(64, 256)
    with torch.no_grad():
        for b in (optimus_egg.backend(hoist=False), optimus_egg.backend(inductor={"triton.cudagraphs": True})):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(m, backend=b)(x), m(x))
    # (CUDA graphs replay only CUDA graphs: on CPU the option changes nothing)
    assert len(reports) == 2 and all(r.changed for r in reports) and [r.hoisted > 0 for r in reports] == [False, True]
    with pytest.raises(TypeError, match="hoist must be a bool"):
        optimus_egg.backend(hoist="yes")


class WritesItsWeight(nn.Module):
    """Stacks two weights, one of which the forward itself writes into first."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        self.a.add_(1.0)
        w = torch.stack([self.a, self.b])
        return x @ w


def test_a_parameter_the_graph_writes_into_is_not_hoisted():
    m, x = WritesItsWeight(), torch.randn(8)
    gm = torch.fx.symbolic_trace(m)
    assert hoist.plan(gm, [x]) is None
    with torch.no_grad():
        want = [WritesItsWeight.forward(m, x) for _ in range(2)]  # a += 1 each call
        m.a.sub_(2.0)
        compiled = compile_inductor(as_backend_compiles(gm), [x])  # (runs once: a += 1)
        m.a.sub_(1.0)
        got = [compiled.fn(x) for _ in range(2)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_copy_the_graph_returns_stays_fresh_each_call():
    class ReturnsItsStack(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            w = torch.stack([self.a, self.b])
            return x @ w.transpose(1, 2), torch.stack([self.a, self.b])

    m, x = ReturnsItsStack(), torch.randn(2, 4, 8)
    p = hoist.plan(torch.fx.symbolic_trace(m), [x])
    assert p is not None and len(p.outputs) == 1  # the first stack only
    compiled = torch.compile(m, backend=optimus_egg.backend(strict=True))
    with torch.no_grad():
        first = compiled(x)[1]
        first.zero_()
        torch.testing.assert_close(compiled(x)[1], torch.stack([m.a, m.b]))
        torch.testing.assert_close(compiled(x)[0], m(x)[0])


def test_views_of_parameters_stay_in_the_graph():
    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 8))

        def forward(self, x):
            return x @ self.w.t()

    x = torch.randn(3, 8)
    assert hoist.plan(torch.fx.symbolic_trace(Transposed()), [x]) is None


def test_split_keeps_the_inputs_and_appends_the_hoisted_values():
    torch.manual_seed(0)
    m, x = Chunks().eval(), torch.randn(64, 256)
    fast = optimus_egg.optimize(torch.fx.symbolic_trace(m), [x], budget_s=5.0, gemm_loops=True, strict=True)
    p = hoist.plan(fast, [x])
    prologue, main = hoist.split(fast, p)
    names = [n.name for n in main.graph.nodes if n.op == "placeholder"]
    assert names[0] == "x" and names[1:] == [f"hoisted_{k}" for k in range(len(p.outputs))]
    sources = [fast.get_parameter(where) for kind, where in p.sources]
    with torch.no_grad():
        torch.testing.assert_close(main(x, *prologue(*sources)), m(x))
    assert not any(n.op == "call_function" and n.target in (torch.stack, torch.cat) and
                   all(a.op == "get_attr" for a in n.all_input_nodes) for n in main.graph.nodes)


class TwoHeads(nn.Module):
    """Two linears reading one input: batched as one GEMM over their concatenated weights."""

    def __init__(self, d=64):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.a(x)), torch.tanh(self.b(x))


def test_optimize_prices_parameter_copies_computed_once_as_free():
    torch.manual_seed(0)
    m, x = TwoHeads().eval(), torch.randn(64, 64)
    gm = torch.fx.symbolic_trace(m)
    with torch.no_grad():
        per_call = optimus_egg.optimize(gm, [x], budget_s=2.0, strict=True)
        once = optimus_egg.optimize(gm, [x], budget_s=2.0, strict=True, hoisted=True)
        want = m(x)
    a, b = per_call.meta["optimus_egg"], once.meta["optimus_egg"]
    assert a.matches.get("batch-linear-lhs") and b.matches.get("batch-linear-lhs")
    # the same graph, the concatenation of weights and of biases priced as copies or as nothing
    assert b.cost_after < a.cost_after - 0.4, (a.cost_after, b.cost_after)
    assert a.launches_after == b.launches_after + 1, (a.launches_after, b.launches_after)
    compiled = compile_inductor(as_backend_compiles(once, gemm_loops=False, hoist=True), [x])
    assert compiled.launches.total == b.launches_after, (compiled.launches, b.launches_after)
    # the bench's estimate of a graph as written, with and without the copies computed once
    assert predicted_launches(once, [x], hoisted=True) == b.launches_after
    assert predicted_launches(once, [x]) == b.launches_after + 1
    for got, w in zip(compiled.fn(x), want):
        torch.testing.assert_close(got, w)
    with torch.no_grad():  # in training the copies stay in the graph: priced as copies
        trained = optimus_egg.optimize(gm, [x], budget_s=2.0, strict=True, hoisted=True, training=True)
    assert trained.meta["optimus_egg"].cost_after == pytest.approx(a.cost_after)


def test_optimize_checks_hoisted():
    with pytest.raises(TypeError, match="hoisted must be a bool"):
        optimus_egg.optimize(torch.fx.symbolic_trace(TwoHeads()), [torch.randn(2, 64)], hoisted="yes")


def test_hoisted_values_add_no_symbols_to_dynamo_s_shapes(reports):
    """Compiled with dynamic shapes, the hoisted values go to Inductor as fakes with static
    shapes: faked there from real tensors, each size became a fresh symbol no Dynamo input is
    the source of (sources `__meta_utils_unknown_tensor`), which can fail Dynamo's shape guards
    ("sources must not be empty for symbol s70": a random program through the backend, fuzz
    seed 160). The values equal eager's at two batch sizes."""
    torch.manual_seed(0)
    m = Chunks().eval()
    made: list[list[str]] = []

    def backend(gm, example_inputs):
        shape_env = torch._guards.detect_fake_mode(example_inputs).shape_env
        before = set(shape_env.var_to_range)
        compiled = optimus_egg.backend(strict=True)(gm, example_inputs)
        made.append([src.name for s in set(shape_env.var_to_range) - before
                     for src in shape_env.var_to_sources.get(s, [])])
        return compiled

    compiled = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (64, 16):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(compiled(x), m(x))
    assert max((r.hoisted for r in reports), default=0) >= 2, reports
    assert made and not any("unknown" in name for names in made for name in names), made
