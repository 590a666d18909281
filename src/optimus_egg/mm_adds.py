"""Adds to a matrix product, written so that Inductor's addmm fold keeps their values and
computes the product once: an Inductor post-grad pre-pass the backend always compiles with.

Inductor's post-grad pattern folds `add(mm(a, b), t)` (either order) into `addmm(t, a, b)`.
It does so in two cases where it should not (torch 2.13, measured on CPU):

- The add has an `alpha` (`torch.add(a @ b, t, alpha=3)`, `Tensor.add(..., alpha=...)`): the
  fold drops it and computes `t + a @ b`, a silently wrong value (plain torch.compile too;
  tests/test_mm_adds.py). This pass writes such an add as `add(x, mul(y, alpha))`, the
  product Inductor's lowering of the alpha computes, before the pattern runs; the fold then
  keeps the multiplication.
- `m + m`, the product added to itself: the fold is `addmm(m, a, b)`, the product computed a
  second time beside the mm, a GEMM call more than the program asked for (one row with
  K, N <= 16 excepted, which Inductor's CPU decomposition writes as code). This pass writes
  it as `m * 2`, code Inductor fuses with its neighbours; `m + m` and `m * 2` are the same
  value bit for bit in every dtype (doubling is exact, or overflows alike).

Only adds reading an ATen mm are written; values are otherwise unchanged.
"""
from __future__ import annotations

import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from optimus_egg.gemm_loops import call_with_val

DOUBLED, ALPHAS = "mm_adds_doubled", "mm_adds_alpha"  # counters["inductor"] keys

aten = torch.ops.aten


def _mm(a) -> bool:
    return isinstance(a, fx.Node) and a.op == "call_function" and a.target is aten.mm.default


def rewrite(graph: fx.Graph) -> int:
    """Write each add of an ATen mm in `graph` that Inductor would fold wrong or twice
    (module doc); returns how many."""
    done = {DOUBLED: 0, ALPHAS: 0}
    for add in list(graph.find_nodes(op="call_function", target=aten.add.Tensor)):
        if len(add.args) != 2 or not (_mm(add.args[0]) or _mm(add.args[1])):
            continue
        x, y = add.args
        alpha = add.kwargs.get("alpha", 1)
        with graph.inserting_before(add):
            if alpha != 1 and set(add.kwargs) == {"alpha"}:
                scaled = call_with_val(graph, aten.mul.Tensor, (y, alpha))
                new, key = call_with_val(graph, aten.add.Tensor, (x, scaled)), ALPHAS
            elif not add.kwargs and x is y:
                new, key = call_with_val(graph, aten.mul.Tensor, (x, 2)), DOUBLED
            else:
                continue
        new.meta = {**add.meta, "val": new.meta["val"]}
        add.replace_all_uses_with(new)
        graph.erase_node(add)
        done[key] += 1
    for key, n in done.items():
        counters["inductor"][key] += n
    return sum(done.values())


class MmAdds(CustomGraphPass):
    """`rewrite` as an Inductor post-grad pass (its uuid keys Inductor's cache)."""

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph)

    def uuid(self) -> str:
        return "optimus_egg.mm_adds:" + get_hash_for_files((__file__,)).hex()


MM_ADDS = MmAdds()
