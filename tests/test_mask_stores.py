"""Saved masks stored as bytes (src/optimus_egg/mask_stores.py): which outputs it rewrites,
values before and after on real tensors, and the backend compiling with it by default."""
from __future__ import annotations

import pytest
import torch
from torch import fx, nn
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from optimus_egg import gemm_loops, mask_stores
from optimus_egg.baselines import PostPasses, backend_patches
from optimus_egg.measure import compile_inductor


def _outputs(x, flags):
    m = x <= 0
    return m, x + 1, flags, flags.t(), torch.logical_and(m, x > -1), m  # mask twice


def test_rewrites_bool_outputs_of_pointwise_ops_only():
    x, flags = torch.randn(4, 3), torch.rand(3, 4) > 0.5
    gm = make_fx(_outputs, tracing_mode="fake")(x, flags)
    expected = _outputs(x, flags)
    assert mask_stores.rewrite(gm.graph) == 2  # x <= 0 (once, read twice) and logical_and
    gm.recompile()
    got = gm(x, flags)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        assert torch.equal(g, e)
    assert got[2] is flags  # an input passed through stays itself; its transpose stays a view
    assert got[3].data_ptr() == flags.data_ptr()


def test_a_mask_whose_strides_would_change_is_left_alone():
    x = torch.randn(3, 4)
    gm = make_fx(lambda x: (x.t() <= 0,), tracing_mode="fake")(x)
    (mask,) = gm.graph.output_node().all_input_nodes
    mask.meta["val"] = torch.empty_strided((4, 3), (1, 5), dtype=torch.bool)  # as if Inductor had chosen a gap
    before = len(gm.graph.nodes)
    assert mask_stores.rewrite(gm.graph) == 0
    assert len(gm.graph.nodes) == before


class _GatedRelu(nn.Module):
    """A ReLU whose mask the partitioner saves for the backward (its output goes to a stack)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(16, 32)

    def forward(self, x):
        h = torch.stack([torch.relu(self.a(x)), torch.relu(self.b(x))], 1)
        return (h * torch.softmax(x[:, :2], -1).unsqueeze(-1)).sum(1)


def _eager(model, x):
    out = model(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.detach(), grads


def test_training_compile_stores_masks_as_bytes_with_the_same_grads():
    torch.manual_seed(0)
    model, x = _GatedRelu().train(), torch.randn(64, 16)
    gm = fx.symbolic_trace(model)
    expected, grads = _eager(model, x)
    fired, launches = {}, {}
    for on in (False, True):
        counters["inductor"][mask_stores.COUNTER] = 0
        c = compile_inductor(gm, [x], training=True, config_patches=backend_patches(mask_stores=on))
        model.zero_grad()  # (compiling ran a backward)
        got = c.fn(x)
        got.sum().backward()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        for p, want in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5)
        model.zero_grad()
        fired[on], launches[on] = counters["inductor"][mask_stores.COUNTER], c.launches.total
    assert fired == {False: 0, True: fired[True]} and fired[True] > 0, fired
    assert launches[True] == launches[False]  # the conversion is fused into the kernel that computes the mask


def test_backend_takes_mask_stores_as_an_option():
    """torch.compile(backend="optimus_egg", options={"mask_stores": False}) turns the pass off
    (on by default); values and gradients are eager's either way."""
    torch.manual_seed(0)
    model, x = _GatedRelu().train(), torch.randn(64, 16)
    expected, grads = _eager(model, x)
    fired = {}
    for on in (False, None):
        torch._dynamo.reset()
        counters["inductor"][mask_stores.COUNTER] = 0
        got = torch.compile(model, backend="optimus_egg", options={} if on is None else {"mask_stores": on})(x)
        got.sum().backward()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        for p, want in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-5)
        model.zero_grad()
        fired[on] = counters["inductor"][mask_stores.COUNTER]
    assert fired[False] == 0 and fired[None] > 0, fired


@pytest.mark.parametrize("name", ["post_grad", "kernel_order", "gemm_loops", "mask_stores"])
def test_backend_rejects_a_switch_that_is_not_a_bool(name):
    from optimus_egg import backend

    with pytest.raises(TypeError, match=name):
        backend(**{name: "yes"})


def test_the_custom_passes_share_inductor_s_one_slot():
    from optimus_egg.body_outputs import BODY_OUTPUTS

    every = backend_patches(gemm_loops=True, mask_stores=True)["post_grad_custom_post_pass"]
    assert isinstance(every, PostPasses)
    assert every.passes == (BODY_OUTPUTS, gemm_loops.GEMM_LOOPS, mask_stores.MASK_STORES)
    assert every.uuid().split("+")[1:] == [BODY_OUTPUTS.uuid(), gemm_loops.GEMM_LOOPS.uuid(), mask_stores.MASK_STORES.uuid()]
    assert every.uuid().startswith("optimus_egg.baselines:")  # the post-grad batchings' source
    assert backend_patches(gemm_loops=False, mask_stores=True)["post_grad_custom_post_pass"].passes == (
        BODY_OUTPUTS, mask_stores.MASK_STORES)
    assert backend_patches(gemm_loops=False, mask_stores=False)["post_grad_custom_post_pass"].passes == (BODY_OUTPUTS,)
    assert mask_stores.MaskStores().uuid() == mask_stores.MASK_STORES.uuid()
