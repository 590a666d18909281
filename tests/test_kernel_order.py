"""kernel_order: the CPU scheduler pass that packs code into fewest C++ kernels."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optimus_egg import measure
from optimus_egg.kernel_order import CALL, CODE, FREE, KERNEL_ORDER, phase_windows, regroup


def code_runs(order: list[int], kinds: list[str]) -> int:
    """C++ kernels of an order: runs of CODE items between CALL items (FREE items are no code)."""
    runs, in_code = 0, False
    for i in order:
        if kinds[i] == CODE and not in_code:
            runs, in_code = runs + 1, True
        elif kinds[i] == CALL:
            in_code = False
    return runs


def is_topological(order: list[int], deps: list[set[int]]) -> bool:
    at = {i: k for k, i in enumerate(order)}
    return sorted(order) == list(range(len(deps))) and all(at[d] < at[i] for i, ds in enumerate(deps) for d in ds)


@st.composite
def dags(draw, most: int = 8):
    n = draw(st.integers(1, most))
    kinds = draw(st.lists(st.sampled_from([CODE, CODE, CALL, FREE]), min_size=n, max_size=n))
    deps = [set(draw(st.lists(st.integers(0, i - 1), max_size=3))) if i else set() for i in range(n)]
    return kinds, deps


@settings(max_examples=300, deadline=None)
@given(dags())
def test_regroup_gives_the_fewest_code_runs_of_any_topological_order(dag):
    kinds, deps = dag
    order = regroup(kinds, deps)
    assert is_topological(order, deps)
    fewest = min(code_runs(list(p), kinds) for p in itertools.permutations(range(len(kinds)))
                 if is_topological(list(p), deps))
    assert code_runs(order, kinds) == fewest
    assert code_runs(order, kinds) <= code_runs(list(range(len(kinds))), kinds)


def test_regroup_moves_code_that_waits_on_nothing_next_to_other_code_as_late_as_it_can():
    # 1 call -> 2 code -> 3 call -> 4 code; 0 is code reading nothing, read by 4. In the given
    # order 0 runs alone before the first call: three kernels. Regrouped it joins 4 (not 2).
    kinds = [CODE, CALL, CODE, CALL, CODE]
    deps = [set(), set(), {1}, {2}, {3, 0}]
    assert code_runs(list(range(5)), kinds) == 3
    order = regroup(kinds, deps)
    assert order == [1, 2, 3, 0, 4]
    assert code_runs(order, kinds) == 2


def one_run(order: list[int], kinds: list[str], i: int, j: int) -> bool:
    """Are items i and j in one run of code in `order` (no CALL between them)?"""
    a, b = sorted((order.index(i), order.index(j)))
    return all(kinds[k] != CALL for k in order[a:b + 1])


@settings(max_examples=200, deadline=None)
@given(dags(most=7))
def test_code_whose_phase_windows_do_not_meet_shares_a_kernel_only_in_orders_of_more_runs(dag):
    """What the pre-fusion pass relies on: two CODE items whose windows (phase_windows) do not
    meet are in one run of code only in orders of more code runs than the fewest, so a kernel
    fusing them costs a launch."""
    kinds, deps = dag
    windows = phase_windows(kinds, deps)
    fewest = code_runs(regroup(kinds, deps), kinds)
    apart = [(i, j) for i, j in itertools.combinations(range(len(kinds)), 2)
             if kinds[i] == kinds[j] == CODE and max(windows[i][0], windows[j][0]) > min(windows[i][1], windows[j][1])]
    for p in itertools.permutations(range(len(kinds))):
        order = list(p)
        if apart and is_topological(order, deps):
            assert all(code_runs(order, kinds) > fewest for i, j in apart if one_run(order, kinds, i, j))


def test_phase_windows_of_code_between_two_calls():
    # 0 code -> 1 call -> 2 code; 3 code reads 0, read by nothing: it may join either run.
    # Phases alternate call (even: the first and the last, here empty) and code (odd).
    assert phase_windows([CODE, CALL, CODE, CODE], [set(), {0}, {1}, {0}]) == [(1, 1), (2, 2), (3, 3), (1, 3)]
    # A call read by nothing may run last: 2 may join 0's run or 4's (then the call 5 runs last).
    kinds = [CODE, CALL, CODE, CALL, CODE, CALL]
    assert phase_windows(kinds, [set(), set(), set(), {0}, {3}, {2}])[2] == (1, 3)


def _shared_read_across_a_call(x, w1, w2):
    h = torch.layer_norm(x, [64])
    a = h @ w1
    b = (h + 1) @ w2   # h + 1 is needed before the call b, ...
    return h * a, b * 2  # ... h * a after the call a: both read h


def test_kernel_order_keeps_inductor_from_fusing_code_of_two_phases():
    """Inductor fuses `h + 1` with `h * a` (both read h) into one kernel, which must then run
    after the GEMM a and before the GEMM b: layer norm, a, fused, b, `b * 2`, 5 launches. With
    the pre-fusion pass it leaves them apart and the kernel order packs the code into 2 kernels
    around the two GEMMs, 4 launches, the fusion estimate's count. Values equal eager's, and
    the fusion heuristics Inductor had are back in place afterwards."""
    from torch import fx
    from torch._inductor.virtualized import V

    from optimus_egg.extract import fusion_cost
    from optimus_egg.kernel_order import _PhaseChoices

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(64, 64, generator=g) for _ in range(3)]
    gm = fx.symbolic_trace(_shared_read_across_a_call)
    post_only = {k: v for k, v in KERNEL_ORDER.items() if k != "_pre_fusion_custom_pass"}
    fused = measure.compile_inductor(gm, inputs, config_patches=post_only)
    kept_apart = measure.compile_inductor(gm, inputs, config_patches=KERNEL_ORDER)
    assert (fused.launches.extern, fused.launches.cpp) == (2, 3)
    assert (kept_apart.launches.extern, kept_apart.launches.cpp) == (2, 2)
    assert fusion_cost.fused_launches(gm) == 4
    expected = _shared_read_across_a_call(*inputs)
    assert measure.values_match(kept_apart(*inputs), expected)
    assert measure.values_match(fused(*inputs), expected)
    assert not isinstance(V.choices, _PhaseChoices)


def _weight_cat_between_gemms(x, w0, w1, w2, w3, v):
    h = torch.tanh(x @ w0)
    y = h @ torch.cat([w1, w2], 1)          # the weight cat waits on nothing
    z = torch.tanh(y @ w3)
    return z @ v.t(), torch.tanh(x[:, :4])  # so does this tanh of an input piece


def test_kernel_order_compiles_fewer_cpu_kernels_with_the_same_values():
    g = torch.Generator().manual_seed(0)
    x, w0, w1, w2 = (torch.randn(s, generator=g) for s in ((8, 16), (16, 16), (16, 8), (16, 8)))
    w3, v = torch.randn(16, 16, generator=g), torch.randn(4, 16, generator=g)
    inputs = [x, w0, w1, w2, w3, v]
    gm = torch.fx.symbolic_trace(_weight_cat_between_gemms)
    before = measure.compile_inductor(gm, inputs)
    after = measure.compile_inductor(gm, inputs, config_patches=KERNEL_ORDER)
    assert after.launches.extern == before.launches.extern == 4
    assert after.launches.cpp < before.launches.cpp, (before.launches, after.launches)
    expected = _weight_cat_between_gemms(*inputs)
    assert measure.values_match(after(*inputs), expected)
    assert measure.values_match(before(*inputs), expected)


def test_kernel_order_keeps_values_and_gradients_in_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8), torch.nn.ReLU())
    x = torch.randn(8, 16)
    gm = torch.fx.symbolic_trace(model)
    compiled = measure.compile_inductor(gm, [x], training=True, config_patches=KERNEL_ORDER,
                                        backward_config_patches=KERNEL_ORDER)
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    assert measure.values_match(compiled(x), model(x))
    for k, p in model.named_parameters():
        assert torch.allclose(grads[k], p.grad, rtol=1e-5, atol=1e-6), k


@pytest.mark.parametrize("bad", ["cuda", "meta"])
def test_kernel_order_leaves_graphs_on_other_devices_in_inductors_order(bad, monkeypatch):
    from optimus_egg import kernel_order

    class Node:
        def __init__(self, device):
            self.device = torch.device(device)

        def get_device(self):
            return self.device

    nodes = [Node("cpu"), Node(bad)]
    monkeypatch.setattr(kernel_order, "_peak_memory_order", lambda ns: list(reversed(ns)))
    monkeypatch.setattr(kernel_order, "regroup", lambda *a: pytest.fail("regrouped a non-CPU graph"))
    assert kernel_order.fewest_cpu_kernels(nodes) == [nodes[1], nodes[0]]


def test_the_backend_compiles_with_the_kernel_order_on_cpu():
    import optimus_egg
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator().manual_seed(0)
    x, w0, w1, w2 = (torch.randn(s, generator=g) for s in ((8, 16), (16, 16), (16, 8), (16, 8)))
    w3, v = torch.randn(16, 16, generator=g), torch.randn(4, 16, generator=g)
    inputs = [x, w0, w1, w2, w3, v]
    expected = _weight_cat_between_gemms(*inputs)
    cpp = {}
    for on in (True, False):
        torch._dynamo.reset()
        fn = torch.compile(_weight_cat_between_gemms, backend=optimus_egg.backend(budget_s=1.0, kernel_order=on, gemm_loops=False))
        got, codes = run_and_get_code(fn, *inputs)
        assert measure.values_match(got, expected)
        cpp[on] = sum(measure.count_launches(c).cpp for c in codes)
    assert cpp[True] < cpp[False], cpp


def test_kernel_order_warns_and_keeps_the_order_when_an_inductor_internal_fails(monkeypatch):
    from optimus_egg import kernel_order

    def moved(nodes):
        raise TypeError("reorder_for_peak_memory() got an unexpected keyword argument")

    monkeypatch.setattr(kernel_order, "_peak_memory_order", moved)
    nodes = [object(), object()]
    with pytest.warns(RuntimeWarning, match="kernel order skipped .TypeError"):
        assert kernel_order.fewest_cpu_kernels(nodes) == nodes


def test_phase_choices_refuse_only_their_schedulers_fusions_of_windows_apart():
    from torch._inductor.virtualized import V

    from optimus_egg.kernel_order import _PhaseChoices, fuse_within_phases

    class Node:
        def __init__(self, *parts):
            self.parts = parts or (self,)

        def get_nodes(self):
            return list(self.parts)

    class Prior:
        def can_fuse(self, scheduler, node1, node2, shared_data_score):
            return True

    a, b, c, call = Node(), Node(), Node(), Node()  # call: no window (not code)
    scheduler = object()
    choices = _PhaseChoices(Prior(), scheduler, {a: (1, 1), b: (3, 3), c: (1, 3)})
    assert not choices.can_fuse(scheduler, a, b, 1)
    assert choices.can_fuse(scheduler, a, c, 1) and choices.can_fuse(scheduler, c, b, 1)
    assert not choices.can_fuse(scheduler, Node(a, c), b, 1)  # a fused node: its parts' window
    assert choices.can_fuse(scheduler, call, b, 1)
    assert choices.can_fuse(object(), a, b, 1)  # another scheduler's: Inductor's heuristics
    inductors = V.choices
    _PhaseChoices.install(scheduler, {})
    _PhaseChoices.install(scheduler, {})  # as if a fusion had raised before the post-fusion pass
    assert V.choices.prior.prior is inductors
    fuse_within_phases([])  # the next compile's pre-fusion pass puts Inductor's back first
    assert V.choices is inductors


def test_pre_fusion_pass_warns_and_leaves_fusion_to_inductor_when_an_inductor_internal_fails():
    from torch._inductor.virtualized import V

    from optimus_egg import kernel_order

    nodes = [object(), object()]  # no get_device: as if Inductor's scheduler nodes had changed
    with pytest.warns(RuntimeWarning, match="fusion left to Inductor .AttributeError"):
        assert kernel_order.fuse_within_phases(nodes) == nodes
    assert not isinstance(V.choices, kernel_order._PhaseChoices)


class _Tanhs(torch.nn.Module):
    """`n` rows of one input, each through tanh: one run of code with n + 1 buffers."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x):
        return [torch.tanh(x[i]) for i in range(self.n)]


def test_fusion_estimate_cuts_a_kernel_past_inductors_argument_limit():
    """Inductor's C++ backend starts a new kernel once one takes more than 500 buffers
    (fusion_cost.MAX_KERNEL_ARGS): 600 outputs in one run of code compile to two kernels, and
    the estimate says two; 400 stay one. Values equal eager's."""
    from torch import fx

    from optimus_egg.baselines import backend_patches
    from optimus_egg.bench import predicted_launches
    from optimus_egg.extract.fusion_cost import MAX_KERNEL_ARGS

    assert MAX_KERNEL_ARGS == 500
    x = torch.randn(600, 8)
    assert predicted_launches(fx.symbolic_trace(_Tanhs(400)), [x[:400]]) == 1
    gm = fx.symbolic_trace(_Tanhs(600))
    with torch.no_grad():
        c = measure.compile_inductor(gm, [x], config_patches=backend_patches())
        for got, want in zip(c.fn(x), gm(x)):
            torch.testing.assert_close(got, want)
    assert c.launches.cpp == 2 == c.launches.total
    assert predicted_launches(gm, [x]) == 2
