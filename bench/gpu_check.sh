#!/usr/bin/env bash
# The GPU check: one call, from the repository root, on a machine with an NVIDIA GPU, Python 3.12,
# torch and triton, but no egglog (see "On a GPU" in bench/README.md for fetching the wheels):
#
#     OUT=/some/empty/dir bash bench/gpu_check.sh
#
# 1. installs egglog and its runtime dependencies from the wheels in .whl/ into /tmp/site;
# 2. prints the machine (GPU, driver, torch, CUDA, Triton) and a first torch.profiler count;
# 3. `optimus-egg bench --device cuda` on four models, short timing (results in $OUT/results/,
#    the GPU table in $OUT/README.md), then two of them in bfloat16;
# 4. `python bench/calibrate.py --device cuda` (also in $OUT/calibrate.txt);
# 5. tests/test_device.py, if pytest is importable there.
# Everything goes to $OUT/log as well. Each step has a time limit, so the whole run stays under
# about 8 minutes and partial results (one CSV per finished model) still come back.
set -u -o pipefail
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT/results"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

# The steps, as one function so that its whole output can go through tee (the python heredoc
# below keeps the body unindented).
check() {
status=0
step "install egglog and its runtime dependencies from .whl/"
ls .whl/*.whl || { echo "no wheels in .whl/ (carry it)"; return 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
# optimus_egg.models / .extract / .rules live outside src/ (pyproject's package-dir), so
# PYTHONPATH=src alone misses them: assemble the package as setuptools would, with links.
rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r src/optimus_egg /tmp/pkg/
ln -s "$PWD/bench/models" /tmp/pkg/optimus_egg/models
ln -s "$PWD/extract" /tmp/pkg/optimus_egg/extract
ln -s "$PWD/rules" /tmp/pkg/optimus_egg/rules
export PYTHONPATH=/tmp/site:/tmp/pkg

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
timeout 60 python3 - <<'EOF' || return 1
import importlib.metadata as md
import platform

import torch
import triton

import optimus_egg.models  # noqa: F401 - the whole package imports
from optimus_egg import measure

print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"triton {triton.__version__}, egglog {md.version('egglog')}, {platform.machine()}")
print(f"GPU: {torch.cuda.get_device_name()} ({torch.cuda.device_count()} visible)")
x = torch.randn(64, 64, device="cuda")
n = measure.profiled_kernel_launches(lambda a: torch.tanh(a) @ a, [x])
print(f"torch.profiler: {n} CUDA kernels for tanh(x) @ x (expected 2; 0 means CUPTI saw nothing)")
EOF

step "bench on cuda"
timeout 270 python3 -m optimus_egg bench --models parallel_mlp,masknet,dcn_v2,interformer --device cuda \
    --rounds 10 --results-dir "$OUT/results" --readme "$OUT/README.md" || status=1

step "bench on cuda in bfloat16"
timeout 90 python3 -m optimus_egg bench --models parallel_mlp,masknet --device cuda --dtype bfloat16 \
    --rounds 10 --results-dir "$OUT/results" --readme "$OUT/README.md" || status=1

step "calibrate on cuda"
timeout 75 python3 bench/calibrate.py --device cuda | tee "$OUT/calibrate.txt" || status=1

step "tests/test_device.py"
if python3 -c "import pytest" 2>/dev/null; then
    timeout 75 python3 -m pytest -q -p no:cacheprovider tests/test_device.py || status=1
else
    echo "pytest is not installed here: skipped"
fi

step "done, status $status"
ls -l "$OUT" "$OUT/results"
return $status
}

check 2>&1 | tee -a "$OUT/log"
exit "${PIPESTATUS[0]}"
