"""Compiling again in a new process: the first call (inference) or first training step of a
bench model through torch.compile, plain Inductor against the optimus_egg backend, each in a
fresh process, twice per arm against one cache folder: the first run compiles (cold), the
second may load the compiled graphs from Inductor's FX graph cache and AOT autograd's cache
(warm), as a program started again does.

    python bench/warm_start.py [--models dhen,masknet] [--train] [--repeat 3]

Per model and arm: the cold and warm first-call seconds (median of --repeat rounds, each round
with a new cache folder and the arms in turn) and the cache counters of the warm run
(`fxgraph_cache_hit`, `autograd_cache_hit`; `bypass` where a cache was skipped). One torch
thread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = ("inductor", "optimus_egg")

# One process: build the model, compile it with the backend, time the first call (and backward).
_CHILD = r"""
import json, sys, time, warnings
import torch
from torch._dynamo.utils import counters
import optimus_egg
from optimus_egg.models import build
name, backend, train = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
torch.set_num_threads(1)
model, inputs = build(name)
model.train(train)
with warnings.catch_warnings(), torch.set_grad_enabled(train):
    warnings.simplefilter("ignore")
    fn = torch.compile(model, backend=backend)
    start = time.perf_counter()
    out = fn(*inputs)
    if train:
        out.sum().backward()
    seconds = time.perf_counter() - start
caches = {k: v for group in ("inductor", "aot_autograd") for k, v in counters[group].items() if "cache" in k}
print(json.dumps({"seconds": seconds, "caches": caches}))
"""


def first_call(name: str, arm: str, train: bool, cache: Path) -> dict:
    """The child's result: seconds to the first call's end, and the cache counters."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", _CHILD, name, arm, "1" if train else "0"],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(name: str, train: bool = False, repeat: int = 3) -> dict[str, dict]:
    """Per arm: median cold and warm seconds and the last warm run's cache counters."""
    cold: dict[str, list[float]] = {a: [] for a in ARMS}
    warm: dict[str, list[float]] = {a: [] for a in ARMS}
    caches: dict[str, dict] = {}
    for _ in range(repeat):
        for arm in ARMS:
            with tempfile.TemporaryDirectory() as cache:
                cold[arm].append(first_call(name, arm, train, Path(cache))["seconds"])
                again = first_call(name, arm, train, Path(cache))
                warm[arm].append(again["seconds"])
                caches[arm] = again["caches"]
    return {arm: {"cold": statistics.median(cold[arm]), "warm": statistics.median(warm[arm]), "caches": caches[arm]}
            for arm in ARMS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="dhen,masknet")
    ap.add_argument("--train", action="store_true", help="time the first training step (forward + backward)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'model':<14}{'arm':<13}{'cold s':>8}{'warm s':>8}  warm run's caches")
    for name in args.models.split(","):
        for arm, r in run(name, args.train, args.repeat).items():
            print(f"{name:<14}{arm:<13}{r['cold']:8.2f}{r['warm']:8.2f}  {r['caches']}", flush=True)


if __name__ == "__main__":
    main()
