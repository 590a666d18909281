"""`optimus-egg compare`: a fast end-to-end smoke run, and argument errors."""
import pytest

from optimus_egg.cli import main


def test_compare_smoke_runs_every_arm_and_values_match(capsys):
    code = main(["compare", "--model", "parallel_mlp", "--budgets", "0.5", "--rounds", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    for arm in ("inductor", "optimus", "optimus_egg@0.5s", "greedy_rules"):
        assert arm in out
    assert "match" in out and "DIFFER" not in out
    assert "1 torch thread" in out


def test_compare_in_bfloat16_checks_values_against_float64(capsys, tmp_path):
    code = main(["compare", "--model", "parallel_mlp", "--rounds", "2", "--dtype", "bfloat16",
                 "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "on cpu, bfloat16" in out and "DIFFER" not in out
    from optimus_egg import bench

    rows = bench.read_results(tmp_path)
    assert (tmp_path / "parallel_mlp_bf16.csv").exists() and {r["dtype"] for r in rows} == {"bfloat16"}
    by = {r["arm"]: r for r in rows}
    assert int(by["optimus_egg@1s"]["launches"]) < int(by["inductor"]["launches"])


@pytest.mark.parametrize("argv,loops", [
    (["compare"], True), (["compare", "--no-gemm-loops"], False),
    (["bench", "--models", "dlrm"], True), (["bench", "--models", "dlrm", "--no-gemm-loops"], False),
])
def test_gemm_loops_reach_the_bench_as_the_backend_default(argv, loops, monkeypatch):
    """compare and bench optimize and compile the optimus_egg arms with the backend's GEMM loops
    unless --no-gemm-loops."""
    from optimus_egg import bench

    seen = []

    def fake_run_model(name, budgets, **kw):
        seen.append(kw["gemm_loops"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(bench, "run_model", fake_run_model)
    try:
        main([*argv, "--no-readme"] if argv[0] == "bench" else argv)
    except RuntimeError:
        pass
    assert seen == [loops]


@pytest.mark.parametrize("dtype,why", [("float32", "differ from eager"), ("bfloat16", "further from float64")])
def test_bench_names_the_arm_whose_values_differ(dtype, why, monkeypatch, capsys, tmp_path):
    """A model whose arm fails the value check (a baseline's too) fails the bench, naming the
    arm and the check of its dtype."""
    from optimus_egg import bench

    rows = [{"arm": "inductor", "values_match": True, "grads_match": True},
            {"arm": "optimus", "values_match": True, "grads_match": False},
            {"arm": "optimus_egg@1s", "values_match": True, "grads_match": True}]
    monkeypatch.setattr(bench, "run_model", lambda name, budgets, **kw: rows)
    monkeypatch.setattr(bench, "print_table", lambda rows, out: None)
    monkeypatch.setattr(bench, "write_results", lambda rows, results_dir, stem: None)
    rc = main(["bench", "--models", "dcn_v2", "--train", "--dtype", dtype, "--no-readme",
               "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1 and f"FAILED dcn_v2: optimus: values or gradients {why}" in out, out


@pytest.mark.parametrize("argv", [
    ["compare", "--budgets", "-1"],
    ["compare", "--budgets", "abc"],
    ["compare", "--budgets", ""],
    ["compare", "--rounds", "0"],
    ["compare", "--model", "no_such_model"],
    ["bench"],
    ["bench", "--models", "no_such_model"],
    ["compare", "--dtype", "float8"],
])
def test_bad_arguments_exit_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code not in (0, None)
    assert capsys.readouterr().err  # argparse explains what was wrong


def test_spearman_average_ranks_for_ties():
    from optimus_egg.bench import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # scipy.stats.spearmanr([1, 2, 2, 3], [1, 3, 2, 4]) == 0.9486832980505138
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 1, 1], [1, 2, 3]) != spearman([1, 1, 1], [1, 2, 3])  # undefined: nan


def test_update_readme_replaces_only_the_marked_section(tmp_path):
    from optimus_egg.bench import README_END, README_START, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{README_START}\nold table\n{README_END}\n\nafter\n")
    assert update_readme(readme, f"{README_START}\nnew table\n{README_END}")
    assert readme.read_text() == f"# title\n\nbefore\n\n{README_START}\nnew table\n{README_END}\n\nafter\n"
    assert not update_readme(readme, f"{README_START}\nnew table\n{README_END}")

    bare = tmp_path / "BARE.md"
    bare.write_text("# title\n")
    assert update_readme(bare, f"{README_START}\nt\n{README_END}")
    assert bare.read_text() == f"# title\n\n## Benchmarks\n\n{README_START}\nt\n{README_END}\n"
