"""pytest-benchmark: optimus_egg.optimize() per bench model at budget 1 s.

    pytest bench/ --benchmark-only                                   # table on the terminal
    pytest bench/ --benchmark-only --benchmark-json=bench/results/optimize.json
    OPTIMUS_EGG_BENCH_BIG=1 pytest bench/ --benchmark-only           # adds illustrative_10k (~20 s a round)

Not part of `pytest tests` (pyproject's testpaths is tests/). Each round optimizes a fresh
trace of the model with one torch thread; extra_info carries the report (cost before
and after, e-graph size, stop reason) so the saved JSON says what each timing bought.

    pytest bench/test_bench.py -k family_script  # smoke test of one bench/<family>.py (under a minute)
"""
from __future__ import annotations

import os

import _family
import pieces
import pytest
import torch
from optimus_egg.models import build
from torch import fx

from optimus_egg import optimize
from optimus_egg.bench import BIG_MODEL, default_models

BUDGET_S = 1.0
MODELS = default_models() + ([BIG_MODEL] if os.environ.get("OPTIMUS_EGG_BENCH_BIG") else [])


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", MODELS)
def test_optimize(benchmark, name):
    model, inputs = build(name)
    model.eval()
    gm = fx.symbolic_trace(model)
    rounds = 1 if name == BIG_MODEL else 3
    out = benchmark.pedantic(optimize, args=(gm, list(inputs)), kwargs={"budget_s": BUDGET_S},
                             rounds=rounds, iterations=1, warmup_rounds=0)
    report = out.meta["optimus_egg"]
    benchmark.extra_info.update(
        model=name, fx_nodes=len(gm.graph.nodes), budget_s=BUDGET_S,
        cost_before=report.cost_before, cost_after=report.cost_after, changed=report.changed,
        egraph_nodes=report.egraph_nodes, iterations=report.iterations, stop_reason=report.stop_reason,
        timings={k: round(v, 4) for k, v in report.timings.items()},
    )
    assert report.fallback is None, report.fallback
    assert report.cost_after <= report.cost_before + 1e-9


def test_family_script_end_to_end(tmp_path):
    """The cheapest family script, bench/pieces.py, into a fresh CSV: a row per arm, values
    equal to eager, and the family's rules fired in optimus_egg."""
    results = tmp_path / "families.csv"
    argv = ["--rounds", "3", "--results", str(results)]
    assert _family.main(pieces.FAMILY, pieces.MODEL, pieces.make, argv) == 0
    rows = _family.read(results)
    assert [(r["family"], r["arm"]) for r in rows] == [("pieces", arm) for arm in _family.ARMS]
    assert all(r["values_match"] == "True" and float(r["ms"]) > 0 for r in rows)
    egg = rows[-1]
    assert egg["family_fired"] == "True" and "pieces-leaf=" in egg["rule_counters"]


def test_post_grad_script_end_to_end(capsys):
    """bench/post_grad.py on the smallest model, inference: both compiles match eager."""
    import post_grad

    assert post_grad.main(["--models", "parallel_mlp", "--infer"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("parallel_mlp") and "without" in line and "with" in line and "DIFFER" not in line


def test_post_grad_pass_by_pass_end_to_end(capsys):
    """bench/post_grad.py --pass-by-pass on the smallest model: every arm trains to eager's
    values and gradients, the pass sets give launches no higher than no post-grad pass, and the
    GEMM loops none higher than EGG_POST_GRAD."""
    import post_grad

    assert post_grad.main(["--models", "parallel_mlp", "--pass-by-pass", "--rounds", "2"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    cells = dict(c.split(" ", 1) for c in line.split("  ")[1:])
    assert set(cells) == {"plain", "optimus", "egg", "egg-ungated", "egg+mul", "egg-gemm", "egg-bmm", "egg-none",
                          "loops"}, line
    launches = {k: int(v.split()[0]) for k, v in cells.items()}
    assert launches["loops"] <= launches["egg"] <= launches["egg-none"] < launches["plain"], line


def test_kernel_order_script_end_to_end():
    """bench/kernel_order.py on the smallest model, inference: every compile matches eager, the
    order takes plain Inductor's launches down (17 -> 10 measured), and neither the order nor
    the GEMM loops raise any arm's."""
    import kernel_order

    counts, ok = kernel_order.run("parallel_mlp", False)
    assert ok
    assert counts["inductor"][1] < counts["inductor"][0]
    assert all(loops <= order <= neither for neither, order, loops in counts.values()), counts


def test_hoist_script_end_to_end():
    """bench/hoist.py on parallel_mlp, two rounds: every arm matches eager, and computing the
    stacked weights once takes a launch off both batched graphs (4 -> 3 measured)."""
    import hoist

    launches, ratio, ok = hoist.run("parallel_mlp", rounds=2)
    assert ok and set(ratio) == set(hoist.ARMS)
    assert launches["egg+hoist"] < launches["egg"], launches
    assert launches["optimus+hoist"] < launches["optimus"], launches


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemm_loops_script_end_to_end(dtype):
    """bench/gemm_loops.py on mmoe, inference, two rounds: values checked (in
    bfloat16 against float64), and the loops take launches down from the arm without them."""
    import gemm_loops

    ok, launches = gemm_loops.run("mmoe", False, rounds=2, dtype=dtype)
    assert ok
    assert launches["optimus_egg"] < launches["no loops"], launches


def test_loops_limit_script_end_to_end():
    """bench/loops_limit.py on dcn_v2, inference, two rounds: every arm matches eager; priced
    at either limit the search batches the low-rank experts (their loops' work passes a call's),
    and the pass at the lower limit leaves more GEMMs calls, so it launches more (still fewer
    than Optimus); the backend's limits are back afterwards."""
    import loops_limit

    from optimus_egg import gemm_loops
    from optimus_egg.extract import launch_cost

    limits = dict(launch_cost.LOOP_LIMITS)
    ok, launches = loops_limit.run("dcn_v2", ["65536", "32768", "32768/65536"], rounds=2, dtype="float32", train=False)
    assert ok
    assert launches["egg@65536"] == launches["egg@32768/65536"] < launches["egg@32768"] < launches["optimus"], launches
    assert launch_cost.LOOP_LIMITS == limits
    assert gemm_loops.GEMM_LOOPS.max_macs == gemm_loops.MAX_MACS


def test_warm_start_script_end_to_end():
    """bench/warm_start.py on the smallest model, one round: started again, the optimus_egg
    backend loads its compiled graph from Inductor's cache as plain Inductor does."""
    import warm_start

    got = warm_start.run("parallel_mlp", repeat=1)
    for arm in warm_start.ARMS:
        assert got[arm]["caches"].get("fxgraph_cache_hit", 0) >= 1, got
        assert not any("bypass" in k for k in got[arm]["caches"]), got


@pytest.mark.parametrize("export", [False, True], ids=["backend", "export"])
def test_dynamic_script_end_to_end(export):
    """bench/dynamic.py on the smallest model: the graph with a symbolic batch (the backend's
    recompile, or torch.export's) is optimized, matches eager at three batch sizes, and
    launches fewer kernels than plain Inductor."""
    import re

    import dynamic

    line = dynamic.run("parallel_mlp", export=export)
    assert "symbolic batch True" in line and "values match" in line, line
    plain, egg = (int(v) for v in re.search(r"inductor (\d+) optimus \d+ optimus_egg (\d+)", line).groups())
    assert egg < plain, line


def test_parts_script_end_to_end():
    """bench/parts.py on two layers: the graph is cut into parts, optimized, and right."""
    import parts

    line = parts.run(2, 1.0, repeat=1)
    assert "parts 4" in line and "values match" in line and "stop saturated" in line, line


def test_regions_script_end_to_end(capsys):
    """bench/regions.py on three layers in training: the shared body is optimized, every call
    counted, values and gradients equal eager's, fewer launches than plain Inductor."""
    import re

    import regions

    regions.run(3, 2, train=True)
    out = capsys.readouterr().out
    plain, egg = (int(re.search(rf"^{arm}\s+(\d+) launches", out, re.MULTILINE).group(1)) for arm in ("inductor", "optimus_egg"))
    assert out.count("values and grads match") == 2 and egg < plain, out


@pytest.mark.parametrize("op", ["mm", "bmm"])
def test_stack_limit_probe_batches_two_gemms(op):
    """bench/stack_limit.py's probe: the batch fires (one extern call fewer), values equal
    the graph's (checked inside), and where the operands are written by their producers the
    batch saves a launch; a time ratio comes back."""
    import stack_limit

    stacked, batched, apart, ratio, ms = stack_limit.probe(op, True, 16, rounds=2)
    lead = stack_limit.EXPERTS if op == "bmm" else 1
    assert stacked == lead * 2 * 16 * (stack_limit.M + stack_limit.N)
    assert batched == apart - 1 and ratio > 0 and ms > 0


def test_extraction_script_random_programs_end_to_end(capsys):
    """bench/extraction.py --random on a few programs: one gap per program, none negative (the
    ILP starts from greedy's choice), and a summary that counts them."""
    import extraction

    gaps = extraction.random_gaps(seed=1, programs=3, ilp_limit=10.0)
    assert 1 <= len(gaps) <= 3 and min(gaps) >= -1e-6, gaps
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{len(gaps)} programs; greedy above ILP")


@pytest.mark.parametrize("train", [False, True])
def test_differential_script_end_to_end(capsys, train):
    """bench/differential.py on a few programs, every one compiled, PyTorch's Optimus too:
    summary lines that add up (in training, no fusion estimate)."""
    import re

    import differential

    differential.run(seed=1, programs=3 if not train else 2, every=True, with_optimus=True, train=train)
    lines = capsys.readouterr().out.strip().splitlines()
    summary, optimus = lines[-3 + train], lines[-1]
    n, compiled = (int(v) for v in re.search(r"^(\d+) programs;.* compiled (\d+):", summary).groups())
    assert n == compiled >= 1, summary
    if train:
        assert not any(line.startswith("fusion estimate") for line in lines)
    else:
        graphs, exact, over, under = (int(v) for v in re.search(
            r"on the (\d+) compiled graphs: exact on (\d+), over on (\d+), under on (\d+)", lines[-2]).groups())
        assert graphs == 3 * compiled == exact + over + under, lines[-2]
    ran, raised, wrong, fewer, equal, more = (int(v) for v in re.search(
        r"on the (\d+) compiled programs: raised on (\d+), other values than the program on (\d+) \(both left out\); "
        r"optimus_egg fewer launches on (\d+), equal on (\d+), more on (\d+)", optimus).groups())
    assert ran == compiled == raised + wrong + fewer + equal + more, optimus


@pytest.mark.skipif(not torch.__version__.startswith("2.13"), reason="a torch 2.13 pass's behaviour")
def test_differential_flags_optimus_computing_other_values():
    """torch 2.13's unbind_stack_to_slices_pass stacks unbound items in their unbind order,
    whatever order the stack reads them in (a random program of `differential.py --seed 31`,
    where Optimus's 0 launches against optimus_egg's 1 were a wrong result): the differential
    leaves such a program out of the comparison instead of counting Optimus fewer."""
    import differential

    def swapped(x):
        items = torch.unbind(x.reshape(-1, 5, 4), 1)
        return torch.stack([items[1], items[0], items[2], items[3], items[4]], 0)

    def in_order(x):
        return torch.stack(torch.unbind(x.reshape(-1, 5, 4), 1), 0)

    x = torch.randn(2, 20)
    launches, wrong, _, _ = differential.optimus_row(fx.symbolic_trace(swapped), x)
    assert wrong and launches is not None
    assert differential.optimus_row(fx.symbolic_trace(in_order), x)[1] is False


def test_differential_tells_where_optimus_returns_views_of_the_input():
    """A split concatenated again: Optimus's graph returns the input itself, eager a fresh
    tensor; optimus_egg copies it (pipeline.copy_new_aliases), and the differential says why
    Optimus launches fewer there."""
    import differential

    from optimus_egg import optimize
    from optimus_egg.measure import aliased_outputs

    def rejoined(x):
        return torch.cat(torch.split(x, 2, dim=1), 1)

    x = torch.randn(3, 8)
    gm = fx.symbolic_trace(rejoined)
    launches, wrong, aliases, _ = differential.optimus_row(gm, x)
    assert launches == 0 and not wrong and aliases
    out = optimize(gm, [x])
    assert out.meta["optimus_egg"].copied_outputs == 1 and aliased_outputs(out(x), [x]) == 0
    torch.testing.assert_close(out(x), x, rtol=0, atol=0)


def test_differential_tells_where_optimus_returns_strided_outputs():
    """Three linears of one input, of widths 8, 4, 8, returned: Optimus's graph returns column
    spans of one GEMM's result, strided where eager's outputs are contiguous; optimus_egg
    copies them contiguous (pipeline.keep_contiguous_outputs: spans of unequal widths make no
    bmm rows), and the differential says why Optimus launches fewer there."""
    import differential

    from optimus_egg import optimize

    ws = [torch.randn(n, 8) for n in (8, 4, 8)]

    def three(x):
        y = torch.relu(x)
        return [torch.nn.functional.linear(y, w) for w in ws]

    x = torch.randn(4, 8)
    gm = fx.symbolic_trace(three)
    launches, wrong, aliases, strided = differential.optimus_row(gm, x)
    assert launches is not None and not wrong and not aliases and strided
    out = optimize(gm, [x])
    with torch.no_grad():
        ys = out(x)
        torch.testing.assert_close(ys, gm(x))
    assert out.meta["optimus_egg"].contiguous_outputs == 3 and all(y.is_contiguous() for y in ys)


def test_differential_leaves_out_a_program_eager_cannot_train():
    """In training, a program whose eager step autograd rejects (a linear's input written in
    place after the linear read it: `differential.py --train --seed 36` stopped on one) has
    nothing to compare: `trains_eagerly` says so, and the program is an invalid draw."""
    import differential

    class WrittenAfterRead(torch.nn.Module):
        def __init__(self, write: bool):
            super().__init__()
            self.lin, self.write = torch.nn.Linear(3, 3, bias=False), write

        def forward(self, x):
            a, b = torch.split(x, 3, dim=1)
            y = self.lin(b)
            if self.write:
                b.add_(1.0)
            return torch.cat([a, y], 1)

    x = torch.randn(1, 6)
    assert not differential.trains_eagerly(WrittenAfterRead(True), x)
    model = WrittenAfterRead(False)
    assert differential.trains_eagerly(model, x) and model.lin.weight.grad is None


def test_predicted_launches_is_the_estimate_optimize_checks():
    """The bench's predicted launches (CSV pred_launches, extraction.py) give the fusion
    estimate the shapes from_fx propagates, as optimize() does for its input; dcn_v2 holds
    batched matrix-vector products, which only the shapes tell apart from GEMMs."""
    from optimus_egg.bench import predicted_launches
    from optimus_egg.extract.fusion_cost import fused_launches
    from optimus_egg.from_fx import from_fx

    module, inputs = build("dcn_v2")
    gm = fx.symbolic_trace(module.eval())
    expected = fused_launches(gm, from_fx(gm, list(inputs), seed_groups=False).shapes.get)
    assert predicted_launches(gm, inputs) == expected < fused_launches(gm)
