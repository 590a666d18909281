"""baselines: PyTorch's Optimus as the greedy baseline, on symbolic_trace and Dynamo graphs."""

from __future__ import annotations

import pytest
import torch
import torch.fx
import torch.nn as nn

from optimus_egg.baselines import (
    MIN_FUSE_SET_SIZE,
    OPTIMUS_POST_GRAD,
    OPTIMUS_PRE_GRAD,
    capture,
    inductor_with_optimus,
    optimus,
    optimus_counters,
    prepare,
    verify_options,
)
from optimus_egg.measure import compile_inductor, values_match

FAST = {"compile_threads": 1}


class ParallelLinears(nn.Module):
    """n same-shape Linear -> tanh branches on slices of one input, concatenated."""

    def __init__(self, n: int = 8, d: int = 32):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(n))

    def forward(self, x):
        return torch.cat([torch.tanh(layer(x[:, i])) for i, layer in enumerate(self.layers)], 1)


def _model(n: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    model = ParallelLinears(n).eval()
    return model, [torch.randn(4, n, 32)]


@pytest.fixture(scope="module")
def eight():
    model, inputs = _model(8)
    gm = torch.fx.symbolic_trace(model)
    before = (gm.code, [dict(n.meta) for n in gm.graph.nodes])
    fused = inductor_with_optimus(gm, inputs)
    return model, gm, inputs, fused, before


@pytest.fixture(scope="module")
def eight_compiled(eight):
    _, gm, inputs, fused, _ = eight
    return compile_inductor(gm, inputs, config_patches=FAST), compile_inductor(
        fused, inputs, config_patches=FAST
    )


def test_options_are_known_to_torch():
    from torch._inductor.fx_passes.group_batch_fusion import PRE_GRAD_FUSIONS
    from torch._inductor.fx_passes.split_cat import PRE_GRAD_PATTERNS

    verify_options()
    assert next(iter(OPTIMUS_PRE_GRAD)) == "normalization_pass"
    assert "batch_dropout" not in OPTIMUS_PRE_GRAD
    fusions = [k for k in OPTIMUS_PRE_GRAD if k in PRE_GRAD_FUSIONS]
    patterns = [k for k in OPTIMUS_PRE_GRAD if k in PRE_GRAD_PATTERNS]
    assert len(fusions) == 9 and len(patterns) == 12
    assert all(OPTIMUS_PRE_GRAD[k]["min_fuse_set_size"] == MIN_FUSE_SET_SIZE for k in fusions)
    assert "batch_aten_tanh" in OPTIMUS_POST_GRAD
    with pytest.raises(KeyError):
        verify_options({"no_such_pass": {}}, {})
    with pytest.raises(KeyError):
        verify_options({}, {"batch_tanh": {}})  # a pre-grad key is not a post-grad key


def test_torch_itself_rejects_unknown_keys():
    """The premise of verify_options: torch raises KeyError on an unknown pass name."""
    from torch._inductor import config
    from torch._inductor.fx_passes.pre_grad import pre_grad_passes

    model, inputs = _model(2)
    gm = prepare(torch.fx.symbolic_trace(model), inputs)
    with config.patch(pre_grad_fusion_options={"no_such_pass": {}}):
        with pytest.raises(KeyError):
            pre_grad_passes(gm, inputs)


def test_optimus_does_not_mutate_input(eight):
    _, gm, _, fused, (code, metas) = eight
    assert fused is not gm
    assert gm.code == code
    assert [dict(n.meta) for n in gm.graph.nodes] == metas
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    assert fused.code != code


def test_optimus_counters_recorded(eight):
    _, _, _, fused, _ = eight
    fired = fused.meta["optimus_counters"]
    assert fired["batch_linear"] == 1  # all 8 linears in one group
    assert fired["batch_tanh"] == 1
    assert optimus_counters() == fired  # the global snapshot is the last run's
    assert fused.meta["inductor_config_patches"]["post_grad_fusion_options"] == OPTIMUS_POST_GRAD


def test_optimus_graph_values_equal_eager(eight):
    model, _, inputs, fused, _ = eight
    assert values_match(fused(*inputs), model(*inputs))
    targets = [n.target for n in fused.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.baddbmm) == 1
    assert targets.count(torch.tanh) == 1


def test_optimus_cuts_extern_gemms(eight, eight_compiled):
    model, _, inputs, _, _ = eight
    plain, fused = eight_compiled
    # Measured on torch 2.13 CPU: plain 8 addmm + 1 C++ kernel (9 launches); with
    # Optimus 1 baddbmm + 2 C++ kernels (3 launches).
    assert plain.launches.extern == 8
    assert fused.launches.extern == 1
    assert fused.launches.total < plain.launches.total
    expected = model(*inputs)
    assert values_match(plain.fn(*inputs), expected)
    assert values_match(fused.fn(*inputs), expected)


def test_prepare_inlines_modules_and_adds_meta():
    model, inputs = _model(3)
    gm = prepare(torch.fx.symbolic_trace(model), inputs)
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    assert sum(n.op == "get_attr" for n in gm.graph.nodes) == 6  # 3 weights, 3 biases
    for node in gm.graph.nodes:
        if node.op != "output":
            assert "example_value" in node.meta and "val" in node.meta
    assert values_match(gm(*inputs), model(*inputs))


def test_modules_that_cannot_be_inlined_stay_call_module():
    class Gate(nn.Module):
        def forward(self, x):
            return x * 2

    class Custom(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, Gate) or super().is_leaf_module(m, name)

    # BatchNorm1d branches on input.dim() (untraceable); Gate is a custom leaf.
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), Gate()).eval()
    gm = torch.fx.GraphModule(model, Custom().trace(model))
    x = torch.randn(2, 4)
    out = prepare(gm, [x])
    assert [n.target for n in out.graph.nodes if n.op == "call_module"] == ["1", "2"]
    assert [n.target for n in out.graph.nodes if n.op == "get_attr"] == ["0.weight", "0.bias"]
    assert all("example_value" in n.meta for n in out.graph.nodes if n.op != "output")
    assert values_match(out(x), model(x))


def test_default_min_fuse_set_size_would_not_fire():
    model, inputs = _model(3)
    gm = torch.fx.symbolic_trace(model)
    torch_default = {"batch_linear": {}, "batch_tanh": {}}  # min_fuse_set_size 5
    assert "batch_linear" not in optimus(gm, inputs, torch_default).meta["optimus_counters"]
    assert optimus(gm, inputs).meta["optimus_counters"]["batch_linear"] == 1


def test_optimus_fires_on_dynamo_graphs():
    model, inputs = _model(4)
    expected = model(*inputs)

    exported = capture(model, inputs)
    assert not any(n.op == "call_module" for n in exported.graph.nodes)
    fused = optimus(exported, inputs)
    assert fused.meta["optimus_counters"]["batch_linear"] == 1
    assert values_match(fused(*inputs), expected)

    seen = {}

    def backend(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, list(example_inputs)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    lifted, lifted_inputs = seen["gm"], seen["inputs"]
    assert len(lifted_inputs) == 1 + 2 * 4  # x plus lifted weights and biases
    fused = optimus(lifted, lifted_inputs)
    assert fused.meta["optimus_counters"]["batch_linear"] == 1
    assert values_match(fused(*lifted_inputs), lifted(*lifted_inputs))


def test_split_cat_passes_keep_values():
    class SplitCat(nn.Module):
        def forward(self, x):
            a, b, c = torch.split(x, [2, 3, 3], dim=1)
            y = torch.cat([a, b, c], dim=1)
            parts = torch.unbind(y.reshape(4, 2, 4), dim=1)
            return torch.relu(torch.stack(parts, dim=1)).sum(1)

    model = SplitCat()
    x = torch.randn(4, 8)
    fused = optimus(torch.fx.symbolic_trace(model), [x])
    fired = fused.meta["optimus_counters"]
    assert fired.get("normalization_pass", 0) >= 1
    assert any(k.startswith(("scmerge", "unbind_stack")) for k in fired), fired
    assert values_match(fused(x), model(x))



def test_optimus_keeps_an_in_place_write_whose_result_is_unused():
    """`clone.mul_(y)` returns a value nobody reads; the write into `clone` is what counts.
    FX's dead-code elimination alone drops it (torch 2.13 calls a call_method pure), so the
    Optimus arm computed another function (found by `bench/differential.py --optimus --train
    --seed 26`). The arm keeps such writes and Optimus still fires."""

    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            _, b = torch.split(x, 4, dim=1)
            y = self.l(b)
            c = b.clone()
            c.mul_(y)
            return torch.cat([y, c], dim=1)

    model = InPlace()
    x = torch.randn(4, 8)
    fused = optimus(torch.fx.symbolic_trace(model), [x])
    assert fused.meta["optimus_counters"], "no Optimus pass fired"
    assert any(n.target == "mul_" for n in fused.graph.nodes)
    with torch.no_grad():
        assert values_match(fused(x), model(x))
