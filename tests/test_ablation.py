"""rewrite_greedily: the bench's "rules one family at a time, no search" ablation."""
import contextlib
import io

import pytest
import torch
from optimus_egg.extract.fusion_cost import fused_launches
from optimus_egg.models import build
from optimus_egg.rules import SCHEDULE_ORDER
from torch import fx

from optimus_egg import bench
from optimus_egg.ablation import GreedyReport, rewrite_greedily


@pytest.fixture(scope="module")
def parallel_mlp():
    torch.manual_seed(0)
    model, inputs = build("parallel_mlp", batch=8)
    model.eval()
    gm = fx.symbolic_trace(model)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = rewrite_greedily(gm, list(inputs))
    finally:
        torch.set_num_threads(before)
    return gm, list(inputs), out


def test_values_equal_the_input_graph(parallel_mlp):
    gm, inputs, out = parallel_mlp
    with torch.no_grad():
        torch.testing.assert_close(out(*inputs), gm(*inputs))


def test_steps_commit_one_family_at_a_time(parallel_mlp):
    _, _, out = parallel_mlp
    report = out.meta["optimus_egg_greedy"]
    assert isinstance(report, GreedyReport) and "optimus_egg" not in out.meta
    first_pass = [s.family for s in report.steps if s.pass_no == 1]
    assert first_pass == [f for f in SCHEDULE_ORDER if f != "pieces"]
    assert any(s.changed for s in report.steps) and report.changed
    assert report.matches.get("batch-linear", 0) > 0
    assert report.stop_reason == "fixpoint"
    assert not any(s.changed for s in report.steps if s.pass_no == report.passes)
    assert report.seconds > 0 and report.fallback is None


def test_never_costlier_than_the_input(parallel_mlp):
    gm, _, out = parallel_mlp
    report = out.meta["optimus_egg_greedy"]
    assert report.cost_after < report.cost_before
    assert fused_launches(out) <= fused_launches(gm)


def test_the_bench_table_says_which_step_kept_its_input(parallel_mlp, monkeypatch):
    """A step whose cheaper graph the fusion estimate rejects keeps its input: here the
    estimate is made to price a batched LayerNorm ten launches dear, so the batch_layernorm
    step keeps its input and the later steps go on from it. The bench row says a step kept
    its input (the ablation's result is still its own), and the compare table keeps the long
    stop cell apart from the next."""
    from optimus_egg import ops, pipeline

    gm, inputs, _ = parallel_mlp
    estimate = pipeline.fused_launches

    def dear_layer_norms(g, *args, **kwargs):
        batched = any(n.target is ops.batched_layer_norm for n in g.graph.nodes)
        return estimate(g, *args, **kwargs) + (10 if batched else 0)

    monkeypatch.setattr(pipeline, "fused_launches", dear_layer_norms)
    out = rewrite_greedily(gm, inputs)
    report = out.meta["optimus_egg_greedy"]
    assert report.kept_input.startswith("batch_layernorm: the fusion estimate predicts")
    assert not any(n.target is ops.batched_layer_norm for n in out.graph.nodes)
    assert any(n.target is ops.batched_linear for n in out.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(out(*inputs), gm(*inputs))
    fields = bench._report_fields(report)
    assert fields["stop_reason"] == "fixpoint (a step kept its input)"
    row = dict.fromkeys(bench.COLUMNS, "")
    row.update(model="parallel_mlp", mode="infer", arm="greedy_rules", fx_nodes=37, rounds=3,
               values_match=True, **fields)
    text = io.StringIO()
    bench.print_table([row], text)
    assert "fixpoint (a step kept its input) match" in text.getvalue()


def test_max_passes_stops_early(parallel_mlp):
    gm, inputs, _ = parallel_mlp
    report = rewrite_greedily(gm, inputs, max_passes=1).meta["optimus_egg_greedy"]
    assert report.passes == 1 and report.stop_reason == "max_passes"


def test_bad_input():
    with pytest.raises(TypeError, match="GraphModule"):
        rewrite_greedily(torch.nn.Linear(2, 2), [torch.randn(1, 2)])
    gm = fx.symbolic_trace(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_passes"):
        rewrite_greedily(gm, [torch.randn(1, 2)], max_passes=0)
    with pytest.raises(TypeError, match="max_passes"):
        rewrite_greedily(gm, [torch.randn(1, 2)], max_passes=1.5)


def test_biases_stay_stacked_between_steps(parallel_mlp, monkeypatch):
    """parallel_mlp's batched linears feed LayerNorms. Between steps the batch's biases stay
    stacked, so the batch_layernorm step reads one batch plus one stacked bias add. With the
    biases added per row after every step (as to_fx does for optimize) that step reads eight
    rows, eight adds and a stack of them: the same values and the same launches (Inductor
    fuses the adds into the stack's consumer), but 16 more nodes for every later step."""
    from optimus_egg import ablation, ops
    from optimus_egg.measure import compile_inductor

    gm, inputs, out = parallel_mlp
    monkeypatch.setattr(ablation, "biases_stacked", contextlib.nullcontext)
    each = rewrite_greedily(gm, inputs)
    for g in (out, each):
        assert sum(n.target is ops.batched_layer_norm for n in g.graph.nodes) == 1
    assert not any(n.target is torch.unbind for n in out.graph.nodes)
    assert any(n.target is torch.unbind for n in each.graph.nodes)
    assert len(each.graph.nodes) >= len(out.graph.nodes) + 16
    assert fused_launches(out) == fused_launches(each) == 4
    with torch.no_grad():
        torch.testing.assert_close(each(*inputs), gm(*inputs))
        assert compile_inductor(out, inputs).launches.total == compile_inductor(each, inputs).launches.total == 4


class RowsRead(torch.nn.Module):
    """Three linears on an input's rows, each result read by another activation."""
    def __init__(self, d_in: int = 16, d_out: int = 32):
        super().__init__()
        self.ls = torch.nn.ModuleList(torch.nn.Linear(d_in, d_out) for _ in range(3))

    def forward(self, x):
        xs = x.unbind(0)
        return [f(lin(xs[i])) for i, (f, lin) in enumerate(zip((torch.relu, torch.tanh, torch.sigmoid), self.ls))]


def test_the_result_adds_its_biases_per_row_as_optimize_does():
    """The steps leave a batch's biases stacked; the result adds them per row, where each
    row's reader fuses the add, as optimize's own result does."""
    from optimus_egg import ops, optimize

    torch.manual_seed(0)
    gm, x = fx.symbolic_trace(RowsRead()), torch.randn(3, 8, 16)
    out = rewrite_greedily(gm, [x])
    [bl] = [n for n in out.graph.nodes if n.target is ops.batched_linear]
    assert bl.args[2] is None and sum(n.target is torch.add for n in out.graph.nodes) == 3
    assert out.code == optimize(gm, [x]).code
    with torch.no_grad():
        torch.testing.assert_close(out(x), gm(x))
