"""Where batching GEMMs stops paying on this CPU: a check of baselines.MAX_STACKED_PER_LAUNCH.

    python bench/stack_limit.py [--rounds 300]
    python bench/stack_limit.py --device cuda    # the same probes compiled to Triton

The backend's post-grad GEMM batchings (SAME_DTYPE_BATCH_LINEAR for mm, BATCH_BMM for bmm)
copy their members' operands into stacked tensors to save launches; on CPU they batch a group
only where it stacks at most MAX_STACKED_PER_LAUNCH operand elements per launch saved. Each
probe here is a graph of two independent GEMMs of one shape, in the shape of a weight
gradient (`[m, k] @ [k, n]`, m = n = 32, k rows swept; bmm: 4 such products per operand), so
a batch of the two saves one launch and stacks E = 2 k (m + n) elements (x 4 for bmm). Two
operand kinds: "copied" (graph inputs: the batch adds copy code, as for a saved activation)
and "written" (each operand a tanh of an input: its producer writes it into the stack).
Each probe is compiled twice (on CPU with the kernel order), with the batching and no limit,
and with no post-grad pass, and both are timed in one interleaved run (one torch thread).
Printed per probe: E, launches batched / apart, the median time batched / apart, the median
time apart and the difference in microseconds; the last line names the largest E at which the
batch was not more than 2 % slower, per kind. Timings are this machine's: rerun where the limit
matters.
"""
from __future__ import annotations

import argparse

import torch
from torch import fx

from optimus_egg.baselines import BATCH_BMM, EGG_POST_GRAD, MAX_STACKED_PER_LAUNCH, SAME_DTYPE_BATCH_LINEAR, post_grad_patches
from optimus_egg.bench import DEVICES, check_device, one_thread
from optimus_egg.kernel_order import KERNEL_ORDER
from optimus_egg.measure import compile_inductor, interleaved_medians

M = N = 32
ROWS = (16, 32, 64, 128, 256, 512, 1024, 2048)
EXPERTS = 4  # bmm probes: products per operand
TOLERANCE = 1.02


class TwoGemms(torch.nn.Module):
    """Two independent GEMMs; with `written`, each operand is computed (a tanh) first."""

    def __init__(self, op: str, written: bool):
        super().__init__()
        self.gemm = torch.bmm if op == "bmm" else torch.mm
        self.written = written

    def forward(self, a0, b0, a1, b1):
        if self.written:
            a0, b0, a1, b1 = (torch.tanh(t) for t in (a0, b0, a1, b1))
        return self.gemm(a0, b0), self.gemm(a1, b1)


def probe(op: str, written: bool, k: int, rounds: int, device: str = "cpu") -> tuple[int, int, int, float, float]:
    """(E, launches batched, launches apart, median time batched / apart, median ms apart)."""
    lead = (EXPERTS,) if op == "bmm" else ()
    g = torch.Generator().manual_seed(k)
    inputs = [torch.randn(*lead, *shape, generator=g).to(device) for shape in ((M, k), (k, N)) * 2]
    stacked = sum(t.numel() for t in inputs)  # two members, one launch saved
    gm = fx.symbolic_trace(TwoGemms(op, written))
    fusion = BATCH_BMM if op == "bmm" else SAME_DTYPE_BATCH_LINEAR
    ungated = {o: x for o, x in EGG_POST_GRAD[fusion].items() if o != "max_stacked_per_launch"}
    batched = compile_inductor(gm, inputs, config_patches={**post_grad_patches({fusion: ungated}), **KERNEL_ORDER})
    apart = compile_inductor(gm, inputs, config_patches=KERNEL_ORDER)
    if batched.launches.extern != apart.launches.extern - 1:
        raise RuntimeError(f"{op} k={k}: the batching did not fire ({batched.launches} vs {apart.launches})")
    for got, want in zip(batched.fn(*inputs), gm(*inputs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    t = interleaved_medians({"batched": batched.fn, "apart": apart.fn}, inputs, rounds=rounds)
    return stacked, batched.launches.total, apart.launches.total, t["batched"] / t["apart"], t["apart"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="k values to sweep (comma-separated)")
    ap.add_argument("--device", default="cpu", choices=DEVICES)
    args = ap.parse_args()
    check_device(args.device)
    rows = [int(r) for r in args.rows.split(",")]
    best: dict[str, int] = {}
    print(f"{'op':4} {'operands':8} {'k':>5} {'E':>8}  launches batched/apart  time batched/apart"
          f"  us apart  us batched - apart")
    with one_thread():
        for op in ("mm", "bmm"):
            for written in (False, True):
                kind = f"{op} {'written' if written else 'copied'}"
                for k in rows:
                    e, lb, la, ratio, ms = probe(op, written, k, args.rounds, args.device)
                    print(f"{op:4} {'written' if written else 'copied':8} {k:5d} {e:8d}  {lb:8d} / {la:<8d}    "
                          f"{ratio:15.3f}  {ms * 1e3:8.1f}  {(ratio - 1) * ms * 1e3:18.1f}", flush=True)
                    if ratio <= TOLERANCE:
                        best[kind] = max(best.get(kind, 0), e)
    print(f"MAX_STACKED_PER_LAUNCH = {MAX_STACKED_PER_LAUNCH}; largest E with the batch at most "
          f"{(TOLERANCE - 1) * 100:.0f} % slower: " + ", ".join(f"{k} {v}" for k, v in best.items()))


if __name__ == "__main__":
    main()
