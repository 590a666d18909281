"""The GPU path of the bench: `--device`, kernels counted with torch.profiler, results per device.

Everything here but the last test runs on a CPU-only machine; the last runs only where CUDA
is available (bench/gpu_check.sh runs this file on the GPU machine when pytest is there).
"""
from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from optimus_egg import bench, measure
from optimus_egg.cli import main

CUDA = torch.cuda.is_available()
OLD_COLUMNS = [c for c in bench.COLUMNS if c not in ("device", "device_name", "profiled_launches")]


def _event(device_type: DeviceType, activity_type: str, name: str = "k") -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device_type, activity_type=activity_type)


def test_count_device_kernels_counts_cuda_kernels_only():
    events = [
        _event(DeviceType.CPU, "cpu_op", "aten::mm"),
        _event(DeviceType.CPU, "cuda_runtime", "cudaLaunchKernel"),
        _event(DeviceType.CUDA, "kernel", "triton_poi_fused_tanh_0"),
        _event(DeviceType.CUDA, "kernel", "sm90_xmma_gemm_f32f32"),
        _event(DeviceType.CUDA, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)"),
        _event(DeviceType.CUDA, "gpu_memset", "Memset (Device)"),
        _event(DeviceType.CUDA, "gpu_user_annotation", "## Call CompiledFxGraph ##"),
    ]
    assert measure._count_device_kernels(events) == 2
    assert measure._count_device_kernels([]) == 0


@pytest.mark.skipif(CUDA, reason="checks the CPU-only error")
def test_profiled_kernel_launches_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        measure.profiled_kernel_launches(torch.tanh, [torch.ones(2)])


@pytest.mark.skipif(CUDA, reason="checks the CPU-only error")
def test_run_model_on_cuda_without_cuda_is_a_value_error():
    with pytest.raises(ValueError, match=r"torch\.cuda\.is_available\(\) is False"):
        bench.run_model("parallel_mlp", device="cuda", quiet=True)
    with pytest.raises(ValueError, match="device must be one of"):
        bench.check_device("tpu")


@pytest.mark.skipif(CUDA, reason="checks the CPU-only error")
@pytest.mark.parametrize("argv", [["compare", "--device", "cuda"],
                                  ["bench", "--models", "parallel_mlp", "--device", "cuda", "--no-readme"]])
def test_cli_device_cuda_without_cuda_exits_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code not in (0, None)
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_result_stem_keeps_devices_and_dtypes_apart():
    assert bench.result_stem("dlrm", False) == "dlrm"
    assert bench.result_stem("dlrm", True, "cpu") == "dlrm_train"
    assert bench.result_stem("dlrm", False, "cuda") == "dlrm_cuda"
    assert bench.result_stem("dlrm", True, "cuda") == "dlrm_train_cuda"
    assert bench.result_stem("dlrm", True, "cpu", "bfloat16") == "dlrm_train_bf16"
    assert bench.result_stem("dlrm", False, "cuda", "float16") == "dlrm_cuda_fp16"


def _rows(model: str, launches: dict[str, int], **extra: object) -> list[dict]:
    rows = []
    for arm, n in launches.items():
        row = dict.fromkeys(bench.COLUMNS, "")
        row.update(family=model, model=model, mode="infer", arm=arm, fx_nodes=37, launches=n, extern=1,
                   kernels=n - 1, pred_launches=1.0, optimize_s=0.1, compile_s=1.0, total_compile_s=1.1,
                   median_ms=0.5, ratio=1.0, launch_ratio=1.0, peak_rss_mb=500, values_match=True,
                   threads=1, rounds=3, **extra)
        rows.append(row)
    return rows


def _write_csv(path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def test_old_csvs_render_as_cpu_and_cuda_rows_get_their_own_table(tmp_path):
    _write_csv(tmp_path / "parallel_mlp.csv", _rows("parallel_mlp", {"inductor": 17, "optimus": 4}), OLD_COLUMNS)
    old = bench.read_results(tmp_path)
    section = bench.render_readme_section(old, tmp_path)
    assert "| parallel_mlp | 37 | 17 | 4 |" in section
    assert "GPU (Triton)" not in section
    bench.print_table(old, io.StringIO())  # rows without the new columns still print

    gpu = _rows("parallel_mlp", {"inductor": 9, "optimus": 3}, device="cuda", device_name="NVIDIA H200",
                profiled_launches=11)
    _write_csv(tmp_path / "parallel_mlp_cuda.csv", gpu, bench.COLUMNS)
    section = bench.render_readme_section(bench.read_results(tmp_path), tmp_path)
    cpu_part, gpu_part = section.split("GPU (Triton)", 1)
    assert "| parallel_mlp | 37 | 17 | 4 |" in cpu_part and "9 / 11" not in cpu_part
    assert "| parallel_mlp | 37 | 9 / 11 | 3 / 11 |" in gpu_part
    assert "NVIDIA H200" in gpu_part
    out = io.StringIO()
    bench.print_table(gpu, out)
    assert "on cuda" in out.getvalue()


def test_low_precision_rows_get_their_own_table(tmp_path):
    _write_csv(tmp_path / "dlrm.csv", _rows("dlrm", {"inductor": 16, "optimus": 16}), bench.COLUMNS)
    _write_csv(tmp_path / "dlrm_bf16.csv", _rows("dlrm", {"inductor": 15, "optimus": 14}, dtype="bfloat16"),
               bench.COLUMNS)
    section = bench.render_readme_section(bench.read_results(tmp_path), tmp_path)
    f32, bf16 = section.split("**Inference, bfloat16**", 1)
    assert "| dlrm | 37 | 16 | 16 |" in f32 and "| dlrm | 37 | 15 | 14 |" not in f32
    assert "| dlrm | 37 | 15 | 14 |" in bf16 and "--dtype bfloat16" in bf16
    out = io.StringIO()
    bench.print_table(_rows("dlrm", {"inductor": 15}, dtype="bfloat16"), out)
    assert "on cpu, bfloat16" in out.getvalue()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_parallel_mlp_end_to_end_on_cuda():
    rows = bench.run_model("parallel_mlp", (0.5,), rounds=2, arms=("inductor", "optimus_egg"),
                           predict=False, quiet=True, device="cuda")
    assert [r["arm"] for r in rows] == ["inductor", "optimus_egg@0.5s"]
    for r in rows:
        assert r["device"] == "cuda" and r["device_name"]
        assert r["values_match"] is True
        assert r["launches"] > 0 and r["profiled_launches"] > 0
        assert r["median_ms"] > 0
