"""mm_adds.py: adds to an mm written so that Inductor's addmm fold keeps their values and
computes the product once."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._dynamo.utils import counters

import optimus_egg
from optimus_egg.baselines import as_backend_compiles
from optimus_egg.measure import compile_inductor
from optimus_egg.mm_adds import ALPHAS, DOUBLED, MM_ADDS

WITH_PASS = {"post_grad_custom_pre_pass": MM_ADDS}


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)]


def _doubled_product(x, w, b):
    m = torch.tanh(x) @ w
    return torch.tanh(m + m)


@pytest.mark.parametrize("with_pass", [False, True])
def test_a_product_added_to_itself_is_computed_once(with_pass):
    """Inductor folds `m + m` into addmm(m, a, b), a second GEMM beside the mm (2 calls);
    written `m * 2` first, it is code fused with the tanh (1 call). Values as eager's."""
    gm, inputs = fx.symbolic_trace(_doubled_product), _inputs()
    counters.clear()
    with torch.no_grad():
        compiled = compile_inductor(gm, inputs, config_patches=WITH_PASS if with_pass else None)
        torch.testing.assert_close(compiled.fn(*inputs), gm(*inputs))
    assert counters["inductor"][DOUBLED] == (1 if with_pass else 0)
    assert compiled.launches.extern == (1 if with_pass else 2)


# adds with an alpha reading an mm: Inductor's addmm fold drops the alpha (torch 2.13)
_ALPHAS = {
    "product-first": lambda x, w, b: torch.add(x @ w, b, alpha=3),
    "product-second": lambda x, w, b: torch.add(b, x @ w, alpha=3),
    "product-to-itself": lambda x, w, b: (lambda m: torch.add(m, m, alpha=3))(x @ w),
    "method": lambda x, w, b: (x @ w).add(b, alpha=-1),
    "in-place": lambda x, w, b: (x @ w).add_(b, alpha=2),
    "linear": lambda x, w, b: torch.add(F.linear(x, w), b, alpha=3),
    "int64": lambda x, w, b: torch.add(x @ w, b, alpha=3),
}


@pytest.mark.parametrize("case", list(_ALPHAS))
def test_an_add_with_an_alpha_keeps_it(case):
    """Plain Inductor computes `add(mm, t, alpha=s)` as `t + mm` (the fold into addmm drops
    the alpha): a wrong value. With the pass the alpha is a multiplication the fold keeps."""
    gm, inputs = fx.symbolic_trace(_ALPHAS[case]), _inputs()
    if case == "int64":
        inputs = [(t * 4).long() for t in inputs]
    counters.clear()
    with torch.no_grad():
        expected = gm(*inputs)
        plain = compile_inductor(gm, inputs).fn(*inputs)
        fixed = compile_inductor(gm, inputs, config_patches=WITH_PASS).fn(*inputs)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the fold's wrong value, which the pass is for
    torch.testing.assert_close(fixed, expected)
    assert counters["inductor"][ALPHAS] == 1


class _Doubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        m = torch.tanh(x) @ self.w
        return torch.tanh(m + m), torch.add(x, m, alpha=0.5)


def test_the_backend_computes_right_and_trains_as_eager():
    """Through the backend the pass runs on what Inductor compiles: the output and the
    gradients are eager's; and a product added to itself is computed once (optimize()'s
    result compiled as the backend does, small GEMMs as calls: 1 extern call, plain Inductor 2)."""
    model, x = _Doubled(), torch.randn(4, 8, requires_grad=True)
    expected = copy.deepcopy(model)
    ys_eager = expected(x)
    sum(y.sum() for y in ys_eager).backward()
    gx_eager, x.grad = x.grad, None
    torch._dynamo.reset()
    counters.clear()
    ys = torch.compile(model, backend="optimus_egg")(x)
    sum(y.sum() for y in ys).backward()
    for y, e in zip(ys, ys_eager):
        torch.testing.assert_close(y, e)
    assert counters["inductor"][DOUBLED] >= 1 and counters["inductor"][ALPHAS] >= 1
    torch.testing.assert_close(model.w.grad, expected.w.grad)
    torch.testing.assert_close(x.grad, gx_eager)
    gm, inputs = fx.symbolic_trace(_doubled_product), _inputs()
    with torch.no_grad():
        plain = compile_inductor(gm, inputs).launches
        egg = compile_inductor(as_backend_compiles(optimus_egg.optimize(gm, inputs), gemm_loops=False),
                               inputs).launches
    assert (plain.extern, egg.extern) == (2, 1)


@pytest.mark.parametrize("case", ["not-a-product", "two-products"])
def test_other_adds_stay(case):
    """The pass writes only adds reading an mm with an alpha or to itself: a tanh added to
    itself and the sum of two products are left as they are (and keep eager's values)."""
    fns = {"not-a-product": lambda x, w, b: (lambda t: t + t)(torch.tanh(x @ w)),
           "two-products": lambda x, w, b: x @ w + torch.tanh(x) @ w}
    gm, inputs = fx.symbolic_trace(fns[case]), _inputs()
    counters.clear()
    with torch.no_grad():
        compiled = compile_inductor(gm, inputs, config_patches=WITH_PASS)
        torch.testing.assert_close(compiled.fn(*inputs), gm(*inputs))
    assert counters["inductor"][DOUBLED] == counters["inductor"][ALPHAS] == 0
