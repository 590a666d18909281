"""Command line: `optimus-egg compare` and `optimus-egg bench` (also `python -m optimus_egg ...`).

    optimus-egg compare                                  # parallel_mlp, budget 1 s
    optimus-egg compare --model dlrm --budgets 0.01,0.1,1,10 [--train] [--plot out.png]
    optimus-egg bench --all [--models a,b] [--budgets 1] [--train] [--big]
    optimus-egg bench --models parallel_mlp,dcn_v2 --device cuda    # Triton; profiled launches too
    optimus-egg bench --all --dtype bfloat16 [--train]              # bfloat16 model and inputs

`compare` runs one model side by side, in one process, under plain Inductor, Inductor +
PyTorch's Optimus, optimus_egg at each budget and the greedy ablation ("greedy_rules", one family at a time),
and prints kernel launches, optimize / compile time, median latency (interleaved runs, one
torch thread) and whether values match eager. `bench` does that for every model, writes
bench/results/<model>[_train].csv and .json, and regenerates the results table between the
`<!-- bench:start -->` / `<!-- bench:end -->` markers of README.md. The suite itself lives in
optimus_egg.bench. `--device cuda` (both commands) compiles for the GPU and also counts the
CUDA kernels a call launches with torch.profiler; its results go to <model>[_train]_cuda.csv.
`--dtype bfloat16` (or float16) runs the model in that dtype, its values checked against
float64 (optimus_egg.bench); results in <model>[_train]_bf16.csv (_fp16).
"""
from __future__ import annotations

import argparse
import sys
import time


def _parse_budgets(text: str) -> list[float]:
    import math

    try:
        budgets = [float(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budgets takes comma-separated seconds, got {text!r}") from None
    if not budgets or any(not math.isfinite(b) or b < 0 for b in budgets):
        raise argparse.ArgumentTypeError("--budgets needs at least one budget, each a finite number >= 0")
    return budgets


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def _model_list(text: str) -> list[str]:
    from optimus_egg.models import MODELS

    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(MODELS)}")
    return names


def _all_match(rows: list[dict]) -> bool:
    return all(r["values_match"] is True and r["grads_match"] in ("", True) for r in rows)


def compare(model: str, budgets: list[float], train: bool, rounds: int, plot: str | None = None,
            results_dir: str | None = None, out=None, device: str = "cpu", gemm_loops: bool = True,
            dtype: str = "float32") -> list[dict]:
    """Run `optimus_egg.bench.run_model` and print its table (and plot / save it)."""
    from optimus_egg import bench

    out = out or sys.stdout

    rows = bench.run_model(model, budgets, train=train, rounds=rounds, out=out, device=device, gemm_loops=gemm_loops,
                           dtype=dtype)
    bench.print_table(rows, out)
    if plot:
        print(f"plot: {bench.plot(rows, plot)}", file=out)
    if results_dir:
        csv_path, json_path = bench.write_results(rows, results_dir, bench.result_stem(model, train, device, dtype))
        print(f"results: {csv_path}, {json_path}", file=out)
    return rows


def run_bench(models: list[str], budgets: list[float], train: bool, rounds: int, big: bool,
              results_dir: str, readme: str | None, out=None, device: str = "cpu", gemm_loops: bool = True,
              dtype: str = "float32") -> int:
    from optimus_egg import bench

    out = out or sys.stdout
    failed: list[str] = []
    start = time.perf_counter()
    for i, name in enumerate(models, 1):
        print(f"\n=== [{i}/{len(models)}] {name} ({'train' if train else 'infer'}, {device}, {dtype}) ===", file=out, flush=True)
        try:
            rows = bench.run_model(name, budgets, train=train, rounds=rounds, out=out, device=device,
                                   gemm_loops=gemm_loops, dtype=dtype)
        except Exception as e:  # noqa: BLE001 - one broken model must not sink the whole table
            print(f"  FAILED: {type(e).__name__}: {e}", file=out, flush=True)
            failed.append(f"{name}: {type(e).__name__}: {e}")
            continue
        bench.print_table(rows, out)
        bench.write_results(rows, results_dir, bench.result_stem(name, train, device, dtype))
        differ = [r["arm"] for r in rows if not _all_match([r])]
        if differ:
            failed.append(f"{name}: {', '.join(differ)}: values or gradients differ from eager" if dtype == "float32"
                          else f"{name}: {', '.join(differ)}: values or gradients further from float64 than eager's "
                               "and plain Inductor's allow")
    if big and not train and dtype == "float32":
        print(f"\n=== {bench.BIG_MODEL}: optimus_egg at 1 s, optimize only ===", file=out, flush=True)
        try:
            row = bench.run_optimize_only(bench.BIG_MODEL, 1.0, out=out)
            bench.write_results([row], results_dir, bench.BIG_MODEL)
        except Exception as e:  # noqa: BLE001
            print(f"  FAILED: {type(e).__name__}: {e}", file=out, flush=True)
            failed.append(f"{bench.BIG_MODEL}: {type(e).__name__}: {e}")
    print(f"\nbench: {len(models)} models in {time.perf_counter() - start:.0f} s; results in {results_dir}/",
          file=out)
    if readme:
        rows = bench.read_results(results_dir)
        if bench.update_readme(readme, bench.render_readme_section(rows, results_dir)):
            print(f"updated the results table in {readme}", file=out)
        else:
            print(f"{readme}: results table unchanged", file=out)
    for f in failed:
        print(f"FAILED {f}", file=out)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    from optimus_egg.bench import DEVICES, DTYPES, check_device
    from optimus_egg.models import MODELS

    p = argparse.ArgumentParser(prog="optimus-egg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="plain Inductor vs Inductor + Optimus vs optimus_egg on one model")
    c.add_argument("--model", default="parallel_mlp", choices=list(MODELS))
    c.add_argument("--budgets", type=_parse_budgets, default=[1.0],
                   help="comma-separated optimus_egg budgets in seconds (default 1)")
    c.add_argument("--train", action="store_true", help="compile and time forward + backward")
    c.add_argument("--rounds", type=_positive_int, default=50, help="interleaved timing rounds (default 50)")
    c.add_argument("--plot", metavar="PNG", help="draw launches and compile time against budget")
    c.add_argument("--results-dir", metavar="DIR", help="also write <DIR>/<model>[_train][_cuda].csv and .json")
    c.add_argument("--device", choices=DEVICES, default="cpu",
                   help="compile and time on this device (default cpu; cuda: Triton, plus torch.profiler counts)")

    b = sub.add_parser("bench", help="compare every model; write bench/results/ and the README table")
    b.add_argument("--all", action="store_true",
                   help="every model except illustrative_10k (see --big)")
    b.add_argument("--models", type=_model_list, help="comma-separated subset of models")
    b.add_argument("--budgets", type=_parse_budgets, default=[1.0],
                   help="comma-separated optimus_egg budgets in seconds (default 1)")
    b.add_argument("--train", action="store_true", help="compile and time forward + backward")
    b.add_argument("--big", action="store_true",
                   help="also run optimus_egg (1 s, optimize only, no Inductor) on illustrative_10k")
    b.add_argument("--rounds", type=_positive_int, default=20, help="interleaved timing rounds (default 20)")
    b.add_argument("--results-dir", default="bench/results", metavar="DIR")
    b.add_argument("--readme", default="README.md", help="file holding the bench markers (default README.md)")
    b.add_argument("--no-readme", action="store_true", help="do not touch the README")
    b.add_argument("--device", choices=DEVICES, default="cpu",
                   help="compile and time on this device (default cpu; cuda: Triton, plus torch.profiler "
                        "counts, results in <model>[_train]_cuda.csv)")
    for parser in (c, b):
        parser.add_argument("--dtype", choices=list(DTYPES), default="float32",
                            help="the model's parameters and floating inputs (default float32; values checked "
                                 "against float64, results in <model>[_train]_bf16.csv / _fp16.csv)")
        parser.add_argument("--no-gemm-loops", action="store_true",
                            help="optimize and compile the optimus_egg and greedy-rules arms as "
                                 "backend(gemm_loops=False) does (default: as the backend does, with the GEMM loops)")

    args = p.parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as e:
        p.error(str(e))
    if args.command == "compare":
        rows = compare(args.model, args.budgets, args.train, args.rounds, args.plot, args.results_dir,
                       device=args.device, gemm_loops=not args.no_gemm_loops, dtype=args.dtype)
        return 0 if _all_match(rows) else 1

    from optimus_egg.bench import default_models

    if not args.all and not args.models:
        p.error("bench: give --all or --models a,b")
    models = args.models or default_models()
    return run_bench(models, args.budgets, args.train, args.rounds, args.big, args.results_dir,
                     None if args.no_readme else args.readme, device=args.device, gemm_loops=not args.no_gemm_loops,
                     dtype=args.dtype)
