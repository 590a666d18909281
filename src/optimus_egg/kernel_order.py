"""Kernel order: an Inductor scheduler pass that packs a CPU graph's code into fewest C++ kernels.

Inductor's C++ backend writes every node it schedules between two calls (an extern GEMM, an
ATen fallback such as the seed draw of a dropout) into one C++ kernel, so a CPU graph's C++
kernel count is the number of runs of code in the schedule, not the number of fused nodes.
Inductor orders the fused nodes for peak memory, which may put a node that waits on nothing
(a weight cat, a tanh of an input) between two calls where no other code runs: a kernel of its
own.

`fewest_cpu_kernels` runs after fusion (`config._post_fusion_custom_pass`). It takes Inductor's
peak-memory order, then regroups: it alternates "every code node that is ready" and "every
call that is ready", which gives the fewest runs of code a topological order can have (what is
done after k phases is the most any order can have done), calls first (a first phase of calls
adds no run, and never leaves more to do than a first phase of code). Each node
then moves to the last phase of its kind that its readers allow, so values are computed as
late as they were needed (memory), and nodes keep their peak-memory order within a phase. The
fused nodes, and so the values and the GEMMs, stay as Inductor made them (but for the fusions
the pre-fusion pass below refuses).

Fusion can join code of two phases: Inductor fuses nodes that read one buffer, and a node
needed before a call fused with one that reads that call's result runs between the two calls,
splitting a phase of calls (a layer norm's output read by a GEMM, by the stack of a batched
GEMM and by an op on the first GEMM's result: one kernel more). `fuse_within_phases`
(`config._pre_fusion_custom_pass`) computes each node's window, the earliest and the latest
phase it has in the orders of fewest code runs, and for the fusion that follows wraps
Inductor's fusion heuristics (`V.choices`) so they refuse to fuse nodes whose windows do not
meet (a fused node's window: its parts'); the post-fusion pass puts Inductor's back. On CPU
code of two phases is two kernels anyway, so this costs no launch; it only keeps two loops
that read one buffer apart.

`KERNEL_ORDER` is the config that turns it on: both passes, and Inductor's own peak-memory pass
off (it runs after fusion passes and would undo the regrouping; this pass runs it first).
Graphs on other devices (Triton: one launch per fused node whatever the order) keep the
peak-memory order and Inductor's fusion unchanged, and so does a schedule that calls a body graph (a
`nested_compile_region` body, a cond): regrouped around a shared body's calls, one random
program's training step got other weight gradients than with Inductor's order (with the GEMM
loops; torch 2.13 trains that program wrongly without optimus_egg too, so the fault is not
pinned down), a precaution. If a step fails (an Inductor internal that moved), the pass
warns and keeps the order it has (the pre-fusion pass: leaves fusion to Inductor).
"""
from __future__ import annotations

import heapq
import warnings
from typing import Any

from torch._inductor.custom_graph_pass import CustomSchedulerPass, get_hash_for_files

CODE, CALL, FREE = "code", "call", "free"


def fewest_cpu_kernels(nodes: list[Any]) -> list[Any]:
    """Inductor's peak-memory order of the scheduler nodes `nodes`, regrouped on CPU graphs so
    that code runs between calls are fewest (module docstring)."""
    _PhaseChoices.uninstall()
    try:
        nodes = _peak_memory_order(nodes)
        if not _regrouped(nodes):
            return nodes
        return [nodes[i] for i in regroup(*_kinds_and_deps(nodes))]
    except Exception as e:  # an Inductor internal that moved: keep the order reached so far
        warnings.warn(f"optimus_egg: kernel order skipped ({type(e).__name__}: {e}); "
                      f"Inductor's order kept", RuntimeWarning, stacklevel=2)
        return nodes


def fuse_within_phases(nodes: list[Any]) -> list[Any]:
    """Before fusion, on a graph `fewest_cpu_kernels` will regroup: keep Inductor from fusing
    code nodes that no order of fewest code runs puts in one phase (module docstring). The
    nodes and their order are unchanged."""
    _PhaseChoices.uninstall()
    try:
        if nodes and _regrouped(nodes):
            kinds, deps = _kinds_and_deps(nodes)
            windows = {n: w for n, w, k in zip(nodes, phase_windows(kinds, deps), kinds) if k == CODE}
            _PhaseChoices.install(nodes[0].scheduler, windows)
    except Exception as e:  # an Inductor internal that moved: fuse as Inductor would
        warnings.warn(f"optimus_egg: fusion left to Inductor ({type(e).__name__}: {e})",
                      RuntimeWarning, stacklevel=2)
    return nodes


def _regrouped(nodes: list[Any]) -> bool:
    """Does the kernel order regroup this schedule: CPU only, no body graph called."""
    return {d.type for n in nodes if (d := n.get_device()) is not None} == {"cpu"} and not _calls_a_body(nodes)


def _kinds_and_deps(nodes: list[Any]) -> tuple[list[str], list[set[int]]]:
    made = {name: i for i, n in enumerate(nodes) for name in n.get_buffer_names()}
    deps = [{made[d.name] for d in n.unmet_dependencies if made.get(d.name, i) != i} for i, n in enumerate(nodes)]
    return [_kind(n) for n in nodes], deps


class _PhaseChoices:
    """Inductor's fusion heuristics (`V.choices`, whatever was installed) for one scheduler,
    refusing to fuse two nodes whose phase windows (`phase_windows`, a fused node's the
    intersection of its parts') do not meet. Installed by `fuse_within_phases`, removed by
    `fewest_cpu_kernels` (or by the next install, if fusion raised in between)."""

    def __init__(self, prior: Any, scheduler: Any, windows: dict[Any, tuple[int, int]]):
        self.prior, self.scheduler, self.windows = prior, scheduler, windows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.prior, name)

    def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        if scheduler is self.scheduler:
            low, high = self._window(node1)
            low2, high2 = self._window(node2)
            if max(low, low2) > min(high, high2):
                return False
        return self.prior.can_fuse(scheduler, node1, node2, shared_data_score)

    def _window(self, node: Any) -> tuple[float, float]:
        spans = [self.windows[n] for n in node.get_nodes() if n in self.windows]
        return max((lo for lo, _ in spans), default=float("-inf")), min((hi for _, hi in spans), default=float("inf"))

    @staticmethod
    def install(scheduler: Any, windows: dict[Any, tuple[int, int]]) -> None:
        from torch._inductor.virtualized import V

        V.set_choices_handler(_PhaseChoices(V.choices, scheduler, windows))

    @staticmethod
    def uninstall() -> None:
        from torch._inductor.virtualized import V

        while isinstance(current := V.choices, _PhaseChoices):
            V.set_choices_handler(current.prior)


class KernelOrder(CustomSchedulerPass):
    """fewest_cpu_kernels as Inductor's `_post_fusion_custom_pass`. Its uuid (this file's
    source) keys Inductor's FX graph cache, which a plain function there bypasses."""

    def __call__(self, nodes: list[Any]) -> list[Any]:
        return fewest_cpu_kernels(nodes)

    def uuid(self) -> str:
        return f"optimus_egg.kernel_order.{type(self).__name__}:{get_hash_for_files((__file__,)).hex()}"


class PhaseFusion(KernelOrder):
    """fuse_within_phases as Inductor's `_pre_fusion_custom_pass`."""

    def __call__(self, nodes: list[Any]) -> list[Any]:
        return fuse_within_phases(nodes)


KERNEL_ORDER: dict[str, Any] = {"_pre_fusion_custom_pass": PhaseFusion(), "_post_fusion_custom_pass": KernelOrder(),
                                "reorder_for_peak_memory": False}


def regroup(kinds: list[str], deps: list[set[int]]) -> list[int]:
    """A new order of items 0..n-1 (given in a topological order) of `kinds` (CODE, CALL,
    FREE: no code, may go anywhere) where item i waits on the items `deps[i]`: fewest runs of
    CODE items between CALL items, each item as late as its readers allow."""
    latest = latest_phases(kinds, deps)
    return sorted(range(len(kinds)), key=lambda i: (latest[i], i))


def latest_phases(kinds: list[str], deps: list[set[int]]) -> list[int]:
    """Each item's phase in `regroup`'s order: the phases of fewest code runs (kinds alternate
    from phase to phase), each item in the last phase of its kind its readers allow."""
    return [latest for _, latest in phase_windows(kinds, deps)]


def phase_windows(kinds: list[str], deps: list[set[int]]) -> list[tuple[int, int]]:
    """Each item's (earliest, latest) phase among the orders of fewest code runs, phases
    alternating CALL (even, the first and the last) and CODE (odd): the phase `_phases` takes it
    in, calls first, and the last phase of its kind its readers allow. An order that puts a
    CODE item's run outside its window has more code runs."""
    users = _users(deps)
    taken = _phases(kinds, deps, users)
    last = max((p for _, p in taken), default=0)
    last += last % 2  # a last phase of calls, which adds no run
    kind_of = [CALL if p % 2 == 0 else CODE for p in range(last + 1)]
    windows = [(0, 0)] * len(kinds)
    for i, earliest in reversed(taken):  # a reverse topological order
        p = min((windows[u][1] for u in users[i]), default=last)
        while kinds[i] != FREE and kind_of[p] != kinds[i]:
            p -= 1
        windows[i] = (earliest, p)
    return windows


def _users(deps: list[set[int]]) -> list[list[int]]:
    users: list[list[int]] = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    return users


def _phases(kinds: list[str], deps: list[set[int]], users: list[list[int]]) -> list[tuple[int, int]]:
    """Phases of alternating kinds, calls first, each taking every ready item of its kind and
    every ready FREE item: [(item, phase)] in the order taken."""
    waiting = [len(d) for d in deps]
    ready: dict[str, list[int]] = {CODE: [], CALL: [], FREE: []}
    for i, w in enumerate(waiting):
        if not w:
            ready[kinds[i]].append(i)
    taken: list[tuple[int, int]] = []
    phase, kind = 0, CALL
    while len(taken) < len(kinds):
        while ready[kind] or ready[FREE]:
            i = heapq.heappop(ready[kind] or ready[FREE])
            taken.append((i, phase))
            for u in users[i]:
                waiting[u] -= 1
                if not waiting[u]:
                    heapq.heappush(ready[kinds[u]], u)
        phase, kind = phase + 1, CALL if kind == CODE else CODE
    return taken


def _calls_a_body(nodes: list[Any]) -> bool:
    """Does the schedule call a body graph (invoke_subgraph, cond, while_loop)?"""
    return any(type(getattr(n, "node", None)).__name__ in _BODY_CALLS for n in nodes)


_BODY_CALLS = {"InvokeSubgraph", "Conditional", "WhileLoop"}


def _kind(node: Any) -> str:
    from torch._inductor.scheduler import NopKernelSchedulerNode

    if node.is_extern() or node.is_template():
        return CALL  # Inductor's codegen ends the C++ kernel before these
    return FREE if isinstance(node, NopKernelSchedulerNode) else CODE


def _peak_memory_order(nodes: list[Any]) -> list[Any]:
    """What Inductor's scheduler does after fusion when `reorder_for_peak_memory` is on."""
    from torch._inductor.memory import reorder_for_peak_memory
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    if not nodes:
        return nodes
    scheduler = nodes[0].scheduler
    return reorder_for_peak_memory(nodes, scheduler.name_to_buf, scheduler.name_to_fused_node,
                                   OrderedSet(V.graph.graph_inputs.keys()), OrderedSet(V.graph.get_output_names()))
