"""measure: launch counting on real and hand-written Inductor wrappers, compiling, timing."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.fx
import torch.nn as nn

from optimus_egg.measure import (
    Compiled,
    Launches,
    compile_inductor,
    count_launches,
    interleaved_medians,
    kernel_launches,
    median_ms,
    peak_rss_mb,
    rounds_no_worse,
    values_match,
)

# One compile worker: on a 2-core machine the subprocess pool costs more than it saves.
FAST = {"compile_threads": 1}


class TwoLinears(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x, y):
        return torch.tanh(self.a(x)), torch.tanh(self.b(y))


@pytest.fixture(scope="module")
def two_linears():
    torch.manual_seed(0)
    model = TwoLinears().eval()
    inputs = [torch.randn(4, 16), torch.randn(4, 16)]
    gm = torch.fx.symbolic_trace(model)
    before = gm.code
    compiled = compile_inductor(gm, inputs, config_patches=FAST)
    return model, gm, inputs, compiled, before


def test_two_independent_linears_launch_two_gemms(two_linears):
    _, _, _, compiled, _ = two_linears
    # Measured on torch 2.13 CPU: 2 addmm + one C++ tanh kernel per branch.
    assert compiled.launches.extern == 2
    assert compiled.launches.cpp in (1, 2)
    assert compiled.launches.triton == 0
    assert compiled.launches.fallback == 0
    assert compiled.launches.total == 2 + compiled.launches.cpp


def test_definitions_and_views_are_not_counted(two_linears):
    _, _, _, compiled, _ = two_linears
    code = compiled.code
    assert "reinterpret_tensor(" in code
    definitions = re.findall(r"^(cpp_fused_\w+) = async_compile\.cpp", code, re.M)
    calls = re.findall(r"^\s+(cpp_fused_\w+)\(", code, re.M)
    assert definitions and set(calls) <= set(definitions)
    # Measured: Inductor reuses one tanh kernel for both branches (1 definition, 2 calls).
    assert len(calls) == compiled.launches.cpp
    assert code.count("extern_kernels.addmm(") == compiled.launches.extern


def test_compiled_values_match_eager_and_gm_untouched(two_linears):
    model, gm, inputs, compiled, before = two_linears
    assert isinstance(compiled, Compiled)
    assert compiled.compile_s > 0
    assert values_match(compiled.fn(*inputs), model(*inputs))
    assert values_match(compiled(*inputs), model(*inputs))
    assert gm.code == before
    assert compiled.launches == sum(map(count_launches, compiled.codes), Launches())


def test_lifted_parameter_graph_compiles():
    """Dynamo hands backends graphs whose weights are placeholders."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(3, 8)
    captured = {}

    def backend(gm, example_inputs):
        captured["gm"], captured["inputs"] = gm, list(example_inputs)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(x)
    gm, inputs = captured["gm"], captured["inputs"]
    assert sum(isinstance(t, nn.Parameter) for t in inputs) == 2  # weight and bias

    compiled = compile_inductor(gm, inputs, config_patches=FAST)
    assert compiled.launches.extern == 1
    assert values_match(compiled.fn(*inputs), (model(x),))
    # A second compile (caches off) gives the same counts.
    assert kernel_launches(gm, inputs, config_patches=FAST) == compiled.launches


def test_training_counts_forward_and_backward():
    torch.manual_seed(2)
    model = TwoLinears().train()
    inputs = [torch.randn(4, 16), torch.randn(4, 16)]
    gm = torch.fx.symbolic_trace(model)
    compiled = compile_inductor(gm, inputs, training=True, config_patches=FAST)
    assert len(compiled.codes) == 2  # forward and backward wrappers
    forward, backward = (count_launches(c) for c in compiled.codes)
    # Forward: 2 addmm. Backward: one weight-gradient mm per linear (inputs need no grad).
    assert forward.extern == 2
    assert backward.extern == 2
    assert compiled.launches == forward + backward


# Modeled on torch 2.13's Python wrapper for CUDA: kernels defined at module level with
# async_compile.triton, launched with .run(...) inside Runner.call and a graph partition.
TRITON_WRAPPER = '''
import torch
from torch._inductor.select_algorithm import extern_kernels
aten = torch.ops.aten
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
async_compile = AsyncCompile()


triton_poi_fused_tanh_0 = async_compile.triton('triton_poi_fused_tanh_0', """
import triton
import triton.language as tl

@triton.jit
def triton_poi_fused_tanh_0(in_out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
    # a string is not a launch: extern_kernels.mm(a, b) aten.sort.default(x)
""", device_str='cuda')


triton_per_fused_native_layer_norm_1 = async_compile.triton('triton_per_fused_native_layer_norm_1', """
@triton.jit
def triton_per_fused_native_layer_norm_1(in_ptr0, out_ptr0, xnumel, r0_numel):
    pass
""", device_str='cuda')


async_compile.wait(globals())
del async_compile


def partition_0(args):
    buf3, = args
    args.clear()
    with torch.cuda._DeviceGuard(0):
        stream0 = get_raw_stream(0)
        triton_per_fused_native_layer_norm_1.run(buf3, buf3, 4, 16, stream=stream0)
    return (buf3, )


class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1 = args
        args.clear()
        assert_size_stride(arg0_1, (16, 16), (16, 1), 'input')
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((4, 16), (16, 1), torch.float32)
            # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.addmm]
            extern_kernels.addmm(arg1_1, arg2_1, reinterpret_tensor(arg0_1, (16, 16), (1, 16), 0), alpha=1, beta=1, out=buf0)
            del arg0_1
            buf1 = buf0; del buf0  # reuse
            stream0 = get_raw_stream(0)
            triton_poi_fused_tanh_0.run(buf1, 64, stream=stream0)
            buf2 = aten.view.dtype(buf1, torch.int32)
            buf4 = torch.ops.aten.sort.default(buf1)
            buf5 = buf4[0]
            triton_poi_fused_tanh_0.run(buf5, 64, stream=stream0)
        partition0_args = [buf5]
        (buf6,) = self.partitions[0](partition0_args)
        return (buf6, )

runner = Runner(partitions=[partition_0,])
call = runner.call


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((16, 16), (16, 1), device='cuda:0', dtype=torch.float32)
    return [arg0_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    triton_poi_fused_tanh_0.run(args[0], 64)
    return print_performance(fn, times=times, repeat=repeat, device='cuda')


if __name__ == "__main__":
    triton_poi_fused_tanh_0.run(None, 64)
'''


def test_count_launches_triton_wrapper():
    launches = count_launches(TRITON_WRAPPER)
    # addmm; tanh twice + layer_norm in the partition; sort (the view is free).
    assert launches == Launches(extern=1, cpp=0, triton=3, fallback=1)
    assert launches.total == 5


def test_count_launches_cpu_fallbacks_and_buffer_ops():
    code = """
cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], r'''kernel''')
def call(args):
    buf0 = empty_strided_cpu((4,), (1,), torch.float32)
    cpp_fused_add_0(buf0)
    buf1 = torch.ops.aten.as_strided.default(buf0, (2,), (1,))
    buf2 = aten.randint.low_out(-1, 2, [1], out=buf0)
    buf0.copy_(buf2)
    buf0.resize_(8)
    buf3 = torch.ops.mkldnn._linear_pointwise.default(buf0, buf1, None, 'none', [], '')
    return (buf0, )
"""
    assert count_launches(code) == Launches(extern=0, cpp=1, triton=0, fallback=3)


def test_count_launches_counts_a_repeated_subgraph_per_call():
    """invoke_subgraph (`torch.compiler.nested_compile_region`): the wrapper defines the body
    once and calls it per use; its launches happen on every call."""
    code = """
cpp_fused_tanh_0 = async_compile.cpp_pybinding(['float*'], r'''kernel''')
def repeated_subgraph0(args):
    arg0, arg1 = args
    buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
    extern_kernels.mm(arg0, arg1, out=buf0)
    cpp_fused_tanh_0(buf0)
    return (buf0, )
class Runner:
    def call(self, args):
        buf0 = repeated_subgraph0([args[0], args[1]])
        buf1 = repeated_subgraph0([buf0[0], args[2]])
        buf2 = repeated_subgraph0([buf1[0], args[3]])
        cpp_fused_tanh_0(buf2[0])
        return (buf2[0], )
"""
    assert count_launches(code) == Launches(extern=3, cpp=4, triton=0, fallback=0)


def test_count_launches_rejects_cpp_wrapper():
    with pytest.raises(ValueError):
        count_launches('extern "C" void call(AtenTensorHandle* inputs) { kernel(buf0); }')


def test_launches_str_and_sum():
    a = Launches(extern=2, cpp=1)
    b = Launches(triton=3, fallback=1)
    assert (a + b).total == 7
    assert str(a + b) == "7 launches (extern 2, cpp 1, triton 3, fallback 1)"


def test_interleaved_medians_and_median_ms(two_linears):
    _, gm, inputs, compiled, _ = two_linears
    arms = {"eager": gm, "inductor": compiled.fn}
    medians = interleaved_medians(arms, inputs, rounds=15, warmup=1)
    assert set(medians) == {"eager", "inductor"}
    assert all(m > 0 for m in medians.values())
    assert median_ms(compiled.fn, inputs, reps=10, warmup=1) > 0
    with pytest.raises(ValueError):
        interleaved_medians(arms, inputs, rounds=0)


def test_interleaving_shuffles_arm_order_each_round():
    """Every round times every arm once; the orders vary (no arm always follows the same one)
    and repeat from run to run (seeded)."""
    calls: list[str] = []
    fns = {name: (lambda *a, n=name: calls.append(n)) for name in "abcd"}
    interleaved_medians(fns, [], rounds=40, warmup=0)
    rounds = [calls[i:i + 4] for i in range(0, len(calls), 4)]
    assert len(rounds) == 40 and all(sorted(r) == list("abcd") for r in rounds)
    before = {n: {r[r.index(n) - 1] for r in rounds if r.index(n)} for n in "abcd"}
    assert all(len(b) == 3 for b in before.values()), before
    first = list(calls)
    calls.clear()
    interleaved_medians(fns, [], rounds=40, warmup=0)
    assert calls == first


def test_values_match():
    t = torch.arange(6.0).reshape(2, 3)
    assert values_match((t, [t, 1]), [t.clone(), (t.clone(), 1)])
    assert not values_match((t,), (t, t))
    assert not values_match(t, t + 1e-2)
    assert values_match(t, t + 1e-2, rtol=0.0, atol=0.1)
    assert not values_match(t, t.to(torch.float64))
    assert not values_match(t, None)
    assert values_match({"a": t, "b": None}, {"a": t.clone(), "b": None})


def test_rounds_no_worse_measures_against_float64():
    """A low-precision result passes when no further from the float64 one than three times the
    farthest reference (eager, plain Inductor), or than the float64 one rounded once where that
    is more; further, NaN, another shape or another int fails."""
    exact = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    eager = (exact + torch.tensor([0.01, 0.0, -0.01, 0.0], dtype=torch.float64)).to(torch.bfloat16)
    plain = (exact + torch.tensor([0.0, 0.1, 0.0, 0.0], dtype=torch.float64)).to(torch.bfloat16)
    off = {name: float((t.double() - exact).norm()) for name, t in (("eager", eager), ("plain", plain))}
    step = torch.finfo(torch.bfloat16).eps * float(exact.norm())
    assert rounds_no_worse(exact.to(torch.bfloat16), exact, eager)
    assert rounds_no_worse(eager, exact, eager)
    shift = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    near = (exact + 2.5 * off["eager"] * shift).to(torch.bfloat16)
    assert rounds_no_worse([near, 3], (exact, 3), [eager, 3])  # nested; ints equal
    far = (exact + (3 * off["plain"] + 2 * step + 0.05) * shift).to(torch.bfloat16)
    assert not rounds_no_worse(far, exact, eager, plain)
    mid = (exact + (3 * off["eager"] + 2 * step + 0.05) * shift).to(torch.bfloat16)
    assert not rounds_no_worse(mid, exact, eager) and rounds_no_worse(mid, exact, eager, plain)  # the farther counts
    assert not rounds_no_worse(torch.tensor([1.0, float("nan"), 3.0, 0.5], dtype=torch.bfloat16), exact, eager)
    assert not rounds_no_worse(exact[:2].to(torch.bfloat16), exact, eager)
    assert not rounds_no_worse([eager, 4], [exact, 3], [eager, 3])
    assert not rounds_no_worse([eager], [exact, exact], [eager, eager])
    # the floor is one rounding of the exact values, not a step per element: where both are
    # exact in bfloat16, one ulp off on every element fails
    rounded = exact.to(torch.bfloat16)
    up = torch.nextafter(rounded, torch.full_like(rounded, float("inf")))
    assert rounds_no_worse(rounded, exact, rounded) and not rounds_no_worse(up, exact, rounded)
    thirds = torch.tensor([1 / 3, 2 / 3, -1 / 3, 5 / 3], dtype=torch.float64)
    assert rounds_no_worse(thirds.to(torch.bfloat16), thirds, thirds.to(torch.bfloat16))
    idx = torch.tensor([0, 2])
    assert rounds_no_worse(idx, idx, idx) and not rounds_no_worse(idx + 1, idx, idx)
    # a value that is rounding noise in every reference: bounded by a hundred times the noise
    zero = torch.zeros(4, dtype=torch.float64)
    noisy = torch.tensor([1e-5, -2e-5, 0.0, 1e-5], dtype=torch.bfloat16)
    assert rounds_no_worse(noisy * 20, zero, noisy) and not rounds_no_worse(noisy * 500, zero, noisy)
    assert not rounds_no_worse(noisy * float("nan"), zero, noisy)


def test_rounds_no_worse_leaves_out_exact_values_past_the_dtypes_range():
    """float16 holds up to 65,504: an exact 1e6 is inf or NaN in every run (here inf in the
    result, NaN in the references, as a float16 program's overflowing sums were); those
    elements are not compared, and the others are, unbounded by the overflow's distance."""
    exact = torch.tensor([1e6, -2e6, 1.5, 0.25], dtype=torch.float64)
    inf, nan = float("inf"), float("nan")
    result = torch.tensor([inf, -inf, 1.5, 0.25], dtype=torch.float16)
    eager = torch.tensor([nan, nan, 1.5, 0.25], dtype=torch.float16)
    assert rounds_no_worse(result, exact, eager)
    wrong = torch.tensor([inf, -inf, 9.0, 0.25], dtype=torch.float16)
    assert not rounds_no_worse(wrong, exact, result)  # one inf's distance no longer bounds the rest
    assert not rounds_no_worse(wrong, exact, eager)
    assert rounds_no_worse(torch.full((2,), inf, dtype=torch.float16), exact[:2], eager[:2])
    assert not rounds_no_worse(torch.tensor([inf, -inf, nan, 0.25], dtype=torch.float16), exact, eager)
    # a value float16 holds (6e4) that every reference lost on the way (NaN): not compared either
    exact[2] = 6e4
    overflowed = torch.tensor([inf, -inf, nan, 0.25], dtype=torch.float16)
    lost = torch.tensor([nan, nan, nan, 0.25], dtype=torch.float16)
    assert rounds_no_worse(overflowed, exact, lost, lost)
    assert not rounds_no_worse(overflowed, exact, lost, torch.tensor([inf, -inf, 6e4, 0.25], dtype=torch.float16))


def test_peak_rss_mb():
    rss = peak_rss_mb()
    assert 50 < rss < 1024 * 1024  # torch alone needs more than 50 MiB
    _big = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    assert peak_rss_mb() >= rss


def test_graph_returning_its_input_launches_nothing():
    """An optimized graph can reduce to `return x` (split then cat): Inductor writes no code
    for it, which counts as zero launches, not as a failed compile."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(x)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    inp = torch.randn(3, 4)
    c = compile_inductor(gm, [inp])
    assert c.launches == Launches() and c.codes == []
    torch.testing.assert_close(c.fn(inp), inp)


def test_graph_of_views_launches_nothing():
    """A graph of views only (Optimus's passes reduce a stack and unbind of split pieces, then a
    cat, to an unflatten and a flatten): Inductor writes no code for it either, zero launches."""
    class Views(torch.nn.Module):
        def forward(self, x):
            return torch.flatten(torch.unflatten(x, 1, (3, -1)), 1, 2)

    gm = torch.fx.symbolic_trace(Views())
    inp = torch.randn(4, 9)
    c = compile_inductor(gm, [inp])
    assert c.launches == Launches() and c.codes == []
    torch.testing.assert_close(c.fn(inp), gm(inp))


def test_graph_of_views_and_shape_checks_launches_nothing():
    """The shape checks optimize puts at a graph's entry (shapes.guard_example_shapes) are
    folded away by tracing: with them, a graph of views is still zero launches."""
    from optimus_egg.shapes import guard_example_shapes

    class Views(torch.nn.Module):
        def forward(self, x):
            return torch.flatten(torch.unflatten(x, 1, (3, -1)), 1, 2)

    gm, inp = torch.fx.symbolic_trace(Views()), torch.randn(4, 9)
    checked = copy.deepcopy(gm)
    assert guard_example_shapes(gm, checked, [inp]) == 1
    c = compile_inductor(checked, [inp])
    assert c.launches == Launches() and c.codes == []
    torch.testing.assert_close(c.fn(inp), gm(inp))


def test_graph_that_computes_but_compiles_to_no_code_is_refused(monkeypatch):
    """No wrapper code for a graph that computes is a measurement failure (a cache hit, say),
    never zero launches."""
    import torch._inductor.utils as utils

    monkeypatch.setattr(utils, "run_and_get_code", lambda fn, *a, **k: (fn(*a, **k), []))
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(RuntimeError, match="no wrapper code for a graph that computes"):
        compile_inductor(gm, [torch.randn(3, 4)])


def test_aliased_outputs_counts_shared_elements_not_shared_storage():
    from optimus_egg.measure import aliased_outputs

    x, y = torch.randn(3, 4), torch.randn(2, 6)
    assert aliased_outputs(list(y.unbind(0)), [x]) == 0  # rows of one buffer
    assert aliased_outputs([y[:, 0::2], y[:, 1::2]], [x]) == 0  # interleaved columns
    assert aliased_outputs([y, y[1]], [x]) == 1  # a row of an earlier output
    assert aliased_outputs((x[:, 1:3], y), [x]) == 1  # a view of the input
    assert aliased_outputs([x.clone(), y.double()], [x]) == 0
