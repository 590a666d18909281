"""body_outputs.py: body graphs' view results copied, so that Inductor trains shared bodies right."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import optimus_egg
from optimus_egg import baselines
from optimus_egg.body_outputs import BODY_OUTPUTS, COUNTER


class Norms(nn.Module):
    """Three affine layer norms in a body two calls share (`nested_compile_region`), on the
    input's pieces and on them halved. `stacked`: the body stacks the weights itself, as
    optimus_egg's batch_layernorm does, so each weight's gradient is a piece of one buffer."""

    def __init__(self, stacked: bool, d: int = 8):
        super().__init__()
        self.stacked = stacked
        self.lns = nn.ModuleList(nn.LayerNorm(d) for _ in range(3))
        for ln in self.lns:
            nn.init.normal_(ln.weight)
            nn.init.normal_(ln.bias)

    @torch.compiler.nested_compile_region
    def body(self, *xs):
        if not self.stacked:
            return tuple(ln(x) for ln, x in zip(self.lns, xs))
        y = F.layer_norm(torch.stack(xs, 0), [xs[0].shape[-1]])
        w = torch.stack([ln.weight for ln in self.lns], 0).unsqueeze(1)
        b = torch.stack([ln.bias for ln in self.lns], 0).unsqueeze(1)
        return tuple(p * 1 for p in (y * w + b).unbind(0))

    def forward(self, x):
        ps = [p.clone() for p in x.split(8, 1)]
        a, b = self.body(*ps), self.body(*[p * 0.5 for p in ps])
        return torch.cat([u + 2 * v for u, v in zip(a, b)], 1)


def trained(model, x, backend, patches=None):
    """(output, parameter gradients) of one step of a copy of `model`."""
    m = copy.deepcopy(model)
    torch._dynamo.reset()
    fn = m if backend is None else torch.compile(m, backend=backend, options=patches)
    y = fn(x)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    return y, [p.grad for p in m.parameters()]


def assert_same(got, expected):
    torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-4)
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_the_pass_trains_a_body_returning_pieces_of_a_buffer_right():
    """Plain Inductor trains the stacked-weights body to wrong weight gradients (torch 2.13);
    with BODY_OUTPUTS as its post-grad pass it copies the backward body's pieces, and trains it
    as eagerly."""
    torch.manual_seed(0)
    model, x = Norms(stacked=True), torch.randn(4, 24)
    expected = trained(model, x, None)
    plain = trained(model, x, "inductor")
    torch.testing.assert_close(plain[0], expected[0], rtol=1e-4, atol=1e-4)
    assert not all(torch.allclose(g, e, rtol=1e-4, atol=1e-4) for g, e in zip(plain[1], expected[1])), \
        "torch's Inductor trains this body right now: body_outputs.py may no longer be needed"
    counters.clear()
    assert_same(trained(model, x, "inductor", {"post_grad_custom_post_pass": BODY_OUTPUTS}), expected)
    assert counters["inductor"][COUNTER] > 0


class SharedLinear(nn.Module):
    """Three inputs through one bias-less linear in a body two calls share: a post-grad batch
    linear fusion (PyTorch's, and the backend's same-dtype one) makes the body's three GEMMs one
    bmm and returns its pieces by `aten.select`, an op named without its overload."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)

    @torch.compiler.nested_compile_region
    def body(self, *xs):
        return tuple(self.lin(x) for x in xs)

    def forward(self, x):
        ps = [p.clone() for p in x.split(8, 1)]
        a, b = self.body(*ps), self.body(*[p * 0.5 for p in ps])
        return torch.cat([u + 2 * v for u, v in zip(a, b)], 1)


def test_the_pass_copies_the_pieces_a_post_grad_batch_fusion_returns():
    """In inference plain Inductor with PyTorch's post-grad batch_linear_post_grad compiles
    SharedLinear to wrong values (torch 2.13: the body returns pieces of the bmm's buffer);
    with BODY_OUTPUTS it copies them (an op named without its overload counts as a view op if
    every overload is), as the backend, whose defaults run such a fusion, does."""
    torch.manual_seed(0)
    model, x = SharedLinear(), torch.randn(3, 24)
    expected = model(x)
    fusion = baselines.post_grad_patches({"batch_linear_post_grad": dict(baselines.OPTIMUS_POST_GRAD["batch_linear_post_grad"])})

    def compiled(backend="inductor", options=None):
        torch._dynamo.reset()
        counters.clear()
        with torch.no_grad():
            out = torch.compile(copy.deepcopy(model), backend=backend, options=options)(x)
        assert backend != "inductor" or counters["inductor"]["batch_linear_post_grad"] > 0  # (the fusion fired)
        return out

    assert not torch.allclose(compiled(options=fusion), expected, rtol=1e-4, atol=1e-4), \
        "torch's Inductor computes this body right now: body_outputs.py may no longer be needed here"
    torch.testing.assert_close(compiled(options={**fusion, "post_grad_custom_post_pass": BODY_OUTPUTS}), expected)
    assert counters["inductor"][COUNTER] == 3
    torch.testing.assert_close(compiled(optimus_egg.backend(budget_s=1.0, strict=True)), expected)


@pytest.mark.parametrize("switches", [True, False], ids=["defaults", "every_switch_off"])
def test_a_shared_body_with_batched_layer_norms_trains_as_eagerly(switches):
    """The backend batches the shared body's three layer norms (batch_layernorm) in training
    too, compiling without buffer reuse (optimize's buffer_reuse=False, as it calls it): the
    backward body returns the weights' gradients as pieces of one buffer, which this pass
    copies; whatever the backend's switches, the step's output and gradients equal eager's.
    optimize() alone (buffer reuse on) leaves the graph as it is (parts.trains_a_shared_body)."""
    torch.manual_seed(0)
    model, x = Norms(stacked=False), torch.randn(4, 24)
    expected = trained(model, x, None)
    reports = []
    off = {} if switches else dict(post_grad=False, kernel_order=False, gemm_loops=False, mask_stores=False)
    real = optimus_egg.backend(budget_s=1.0, strict=True, **off)

    def backend(gm, example_inputs, buffer_reuse=False):
        out = optimus_egg.optimize(gm, list(example_inputs), 1.0, strict=True, buffer_reuse=buffer_reuse)
        reports.append(out.meta["optimus_egg"])
        return real(gm, example_inputs)

    assert_same(trained(model, x, backend), expected)
    (report,) = reports
    assert report.changed and report.matches["batch-layernorm"] > 0, report
    reports.clear()
    assert_same(trained(model, x, lambda gm, ex: backend(gm, ex, buffer_reuse=True)), expected)
    (report,) = reports
    assert not report.changed and "nested_compile_region" in report.kept_input, report
    reports.clear()
    with torch.no_grad():
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(copy.deepcopy(model), backend=backend)(x), model(x),
                                   rtol=1e-4, atol=1e-4)
    (report,) = reports
    assert report.changed and report.matches["batch-layernorm"] > 0, report
