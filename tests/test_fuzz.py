"""Property-based fuzzing: random graphs over the optimizer's vocabulary must optimize with
strict=True and compute the traced graph's values (rtol 1e-4, atol 1e-5).

A case is a small program over F parts of an input [B, F*D]: the input is split into the
parts (torch.split / chunk / unbind of a stacked view, in several spellings), then a list of
steps rewrites the parts: linears (own weights, one shared nn.Linear, F.linear with a shared
weight, several linears reading one part), layer norms, pointwise ops, binary ops between
parts, regrouping (cat / stack and back, in order or not, uneven re-splits), opaque ops
(cumsum, an fx.wrap-ped function), in-place ops (on a clone, or on a part itself, which may
be a view of the input) and dropout in training mode; the parts are finally put together
(cat / stack / sum / tuple). The program is a plain module traced with
torch.fx.symbolic_trace. Both graphs run from the same RNG seed, and the input is compared
after the call too.

A fifth as many programs are captured with Dynamo instead (static and dynamic=True), ~0.3 s
each. Examples: OPTIMUS_EGG_FUZZ_EXAMPLES (default 150, ~45 s in all on 2 cores); derandomized, so CI
sees the same cases every run. A long run: OPTIMUS_EGG_FUZZ_EXAMPLES=3000 pytest tests/test_fuzz.py
(add --hypothesis-show-statistics to see which rules the cases fired).
"""
from __future__ import annotations

import os
import warnings

import hypothesis.strategies as st
import pytest
import torch
import torch._dynamo
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, note, settings

import optimus_egg

EXAMPLES = int(os.environ.get("OPTIMUS_EGG_FUZZ_EXAMPLES", "150"))


@torch.fx.wrap
def opaque_mix(x):
    """A custom function symbolic_trace keeps as one call the optimizer knows nothing about."""
    return x * torch.sigmoid(x) - 0.25


# ---- pointwise ops: name -> spellings (each a function of one part) ---------------------------

POINTWISE = {
    "tanh": (torch.tanh, lambda p: p.tanh(), lambda p: F.tanh(p)),
    "sigmoid": (torch.sigmoid, lambda p: p.sigmoid()),
    "relu": (F.relu, torch.relu, lambda p: p.relu()),
    "gelu": (F.gelu, lambda p: F.gelu(p, approximate="tanh")),
    "silu": (F.silu,),
    "clamp": (lambda p: torch.clamp(p, -0.5, 0.5), lambda p: p.clamp(min=-0.25),
              lambda p: torch.clamp(p, max=0.75)),
    # Not the default posinf (the largest float): a linear of it overflows or not depending on
    # the summation order, which differs between mm and bmm.
    "nan_to_num": (lambda p: torch.nan_to_num(p, posinf=1e6, neginf=-1e6),
                   lambda p: torch.nan_to_num(p, nan=0.5, posinf=2.0, neginf=-2.0)),
    "mul_scalar": (lambda p: p * 1.5, lambda p: 0.5 * p, lambda p: torch.mul(p, 2.0)),
    "add_scalar": (lambda p: p + 1.5, lambda p: 0.25 + p, lambda p: p - 0.5),
}
BINARY = {
    "add": (lambda a, b: a + b, torch.add),
    "mul": (lambda a, b: a * b, torch.mul),
    "sub": (lambda a, b: a - b, lambda a, b: torch.sub(a, b)),
}


# ---- programs -----------------------------------------------------------------------------------

@st.composite
def programs(draw):
    n = draw(st.integers(2, 5))          # parts
    d = draw(st.sampled_from([3, 4, 8]))  # part width
    b = draw(st.integers(1, 4))          # batch
    parts = list(range(n))
    subset = st.lists(st.sampled_from(parts), min_size=1, max_size=n, unique=True).map(sorted)
    step = st.one_of(
        st.tuples(st.just("linear"), st.sampled_from(["own", "shared_module", "shared_fn"]),
                  st.booleans(), subset),
        st.tuples(st.just("fanout"), st.sampled_from(parts), st.booleans(), subset),  # linears on one input
        st.tuples(st.just("layer_norm"), st.sampled_from(["affine", "plain", "functional"]), subset),
        st.tuples(st.just("pointwise"), st.sampled_from(sorted(POINTWISE)), st.integers(0, 2), subset),
        st.tuples(st.just("binary"), st.sampled_from(parts), st.sampled_from(parts),
                  st.sampled_from(sorted(BINARY)), st.integers(0, 1)),
        st.tuples(st.just("regroup"), st.sampled_from(
            ["cat_split", "cat_split_neg", "cat_chunk", "stack_unbind", "stack0_unbind0",
             "cat_view_unbind", "reversed_cat_split", "reversed_stack_unbind"])),
        st.tuples(st.just("uneven"), st.sampled_from(sorted(POINTWISE)), st.randoms(use_true_random=False)),
        st.tuples(st.just("opaque"), st.sampled_from(["cumsum", "wrapped", "center"]), st.sampled_from(parts)),
        st.tuples(st.just("inplace"), st.sampled_from(["clone_add", "clone_mul", "clone_slice",
                                                       "direct_add", "direct_copy"]),
                  st.sampled_from(parts)),
        st.tuples(st.just("dropout"), st.sampled_from(["F.dropout", "torch.dropout"]), subset),
    )
    steps = draw(st.lists(step, min_size=1, max_size=8))
    # `uneven` carries a Random to draw its split sizes; turn it into the sizes now.
    fixed = []
    for s in steps:
        if s[0] == "uneven":
            rnd, total, sizes = s[2], n * d, []
            while total:
                k = rnd.randint(1, total)
                sizes.append(k)
                total -= k
            s = ("uneven", s[1], tuple(sizes))
        fixed.append(s)
    return {
        "n": n, "d": d, "b": b, "steps": tuple(fixed),
        "split": draw(st.sampled_from(["split", "split_list", "split_neg", "method_split", "chunk",
                                       "view_unbind", "reshape_unbind_neg"])),
        "out": draw(st.sampled_from(["cat", "stack", "tuple", "sum"])),
        "tap": draw(st.none() | st.tuples(st.integers(0, 7), st.sampled_from(parts))),
        "special": draw(st.booleans()),   # inf / nan entries in the input
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
        "seed": draw(st.integers(0, 2**16)),
    }


class Program(nn.Module):
    """Runs a drawn program; forward only indexes proxies (never iterates them), so it traces."""

    def __init__(self, prog):
        super().__init__()
        self.prog = prog
        n, d = prog["n"], prog["d"]
        torch.manual_seed(prog["seed"])
        mods = []
        for s in prog["steps"]:
            if (s[0] == "linear" and s[1] == "own") or s[0] == "fanout":
                mods.append(nn.ModuleList(nn.Linear(d, d, bias=s[2]) for _ in range(n)))
            elif s[0] == "linear":
                mods.append(nn.Linear(d, d, bias=s[2]))
            elif s[0] == "layer_norm" and s[1] != "functional":
                mods.append(nn.ModuleList(nn.LayerNorm(d, elementwise_affine=s[1] == "affine")
                                          for _ in range(n)))
            else:
                mods.append(nn.Identity())
        self.mods = nn.ModuleList(mods)
        for m in self.modules():  # non-trivial affine parameters
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                nn.init.normal_(m.weight, 1.0, 0.3)
                nn.init.normal_(m.bias, 0.0, 0.3)

    def split_input(self, x):
        n, d, how = self.prog["n"], self.prog["d"], self.prog["split"]
        if how == "split":
            pieces = torch.split(x, d, dim=1)
        elif how == "split_list":
            pieces = torch.split(x, [d] * n, 1)
        elif how == "split_neg":
            pieces = torch.split(x, d, dim=-1)
        elif how == "method_split":
            pieces = x.split(d, 1)
        elif how == "chunk":
            pieces = torch.chunk(x, n, dim=1)
        elif how == "view_unbind":
            pieces = x.view(x.shape[0], n, d).unbind(1)
        else:
            pieces = torch.unbind(x.reshape(-1, n, d), -2)
        return [pieces[i] for i in range(n)]

    def step(self, k, s, ps):
        n, d = self.prog["n"], self.prog["d"]
        kind, mod = s[0], self.mods[k]
        ps = list(ps)
        if kind == "linear":
            for i in s[3]:
                if s[1] == "own":
                    ps[i] = mod[i](ps[i])
                elif s[1] == "shared_module":
                    ps[i] = mod(ps[i])
                else:
                    ps[i] = F.linear(ps[i], mod.weight, mod.bias)
        elif kind == "fanout":
            src = ps[s[1]]
            for i in s[3]:
                ps[i] = mod[i](src)
        elif kind == "layer_norm":
            for i in s[2]:
                ps[i] = F.layer_norm(ps[i], (d,)) if s[1] == "functional" else mod[i](ps[i])
        elif kind == "pointwise":
            spellings = POINTWISE[s[1]]
            fn = spellings[s[2] % len(spellings)]
            for i in s[3]:
                ps[i] = fn(ps[i])
        elif kind == "binary":
            ps[s[1]] = BINARY[s[3]][s[4]](ps[s[1]], ps[s[2]])
        elif kind == "regroup":
            how = s[1]
            src = ps[::-1] if how.startswith("reversed") else ps
            if how in ("cat_split", "reversed_cat_split"):
                pieces = torch.split(torch.cat(src, dim=1), d, dim=1)
            elif how == "cat_split_neg":
                pieces = torch.cat(src, -1).split([d] * n, -1)
            elif how == "cat_chunk":
                pieces = torch.cat(src, 1).chunk(n, 1)
            elif how in ("stack_unbind", "reversed_stack_unbind"):
                pieces = torch.unbind(torch.stack(src, dim=1), dim=1)
            elif how == "stack0_unbind0":
                pieces = torch.stack(src).unbind()
            else:
                whole = torch.cat(src, 1)
                pieces = whole.view(whole.shape[0], n, d).unbind(1)
            ps = [pieces[i] for i in range(n)]
        elif kind == "uneven":  # cat, split unevenly, one op per piece, cat, split back
            fn = POINTWISE[s[1]][0]
            sizes = list(s[2])
            pieces = torch.split(torch.cat(ps, 1), sizes, 1)
            whole = torch.cat([fn(pieces[j]) for j in range(len(sizes))], 1)
            pieces = torch.split(whole, d, 1)
            ps = [pieces[i] for i in range(n)]
        elif kind == "opaque":
            i = s[2]
            if s[1] == "cumsum":
                ps[i] = torch.cumsum(ps[i], dim=1)
            elif s[1] == "wrapped":
                ps[i] = opaque_mix(ps[i])
            else:
                ps[i] = ps[i] - ps[i].mean(dim=-1, keepdim=True)
        elif kind == "inplace":
            i = s[2]
            q = ps[i].clone()
            if s[1] == "clone_add":
                q.add_(1.0)
            elif s[1] == "clone_mul":
                q.mul_(ps[(i + 1) % n])
            elif s[1] == "clone_slice":
                q[:, 0:2].mul_(-2.0)  # a write through a view of the clone
            elif s[1] == "direct_add":  # into the part itself: maybe a view of the input
                q = ps[i]
                q.add_(0.5)
            else:
                q = ps[i]
                q.copy_(ps[(i + 1) % n])
            ps[i] = q
        elif kind == "dropout":  # RNG draws: their order decides every mask
            for i in s[2]:
                ps[i] = F.dropout(ps[i], 0.5, training=True) if s[1] == "F.dropout" else torch.dropout(ps[i], 0.25, True)
        return ps

    def forward(self, x):
        n = self.prog["n"]
        ps = self.split_input(x)
        taps = []
        tap = self.prog["tap"]
        for k, s in enumerate(self.prog["steps"]):
            ps = self.step(k, s, ps)
            if tap is not None and tap[0] == k:
                taps.append(ps[tap[1]])
        out = self.prog["out"]
        if out == "cat":
            y = torch.cat([ps[i] for i in range(n)], dim=1)
        elif out == "stack":
            y = torch.stack([ps[i] for i in range(n)], dim=0)
        elif out == "sum":
            y = ps[0]
            for i in range(1, n):
                y = y + ps[i]
        else:
            return (*[ps[i] for i in range(n)], *taps)
        return (y, *taps) if taps else y


def make_input(prog):
    g = torch.Generator().manual_seed(prog["seed"])
    x = torch.randn(prog["b"], prog["n"] * prog["d"], generator=g, dtype=prog["dtype"])
    if prog["special"]:
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=g)
        flat[picks[0]], flat[picks[1]], flat[picks[2]] = float("nan"), float("inf"), float("-inf")
    return x


def run(gm, x):
    """Outputs, and the input after the call (a graph may write into it through a view)."""
    x = x.clone()
    torch.manual_seed(0)
    with torch.no_grad():
        return gm(x), x


@pytest.fixture(autouse=True, scope="module")
def _reset_dynamo_after():
    yield
    torch._dynamo.reset()  # leave no compiled frames to later test modules


def run_all(gm, inputs):
    inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    torch.manual_seed(0)
    with torch.no_grad():
        return gm(*inputs), inputs


def optimize_strict(gm, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # strict: no silent fallback either
        out = optimus_egg.optimize(gm, inputs, budget_s=0.5, strict=True)
    report = out.meta["optimus_egg"]
    note(str(report))
    if report.changed:
        note(f"optimized:\n{out.code}")
    assert report.fallback is None
    event(f"changed={report.changed}")  # --hypothesis-show-statistics: what the cases exercise
    for rule, count in report.matches.items():
        if count:
            event(f"fired {rule}")
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prog=programs())
def test_random_graph_optimizes_to_same_values(prog):
    note(f"program: {prog}")
    model = Program(prog).to(prog["dtype"]).eval()
    gm = fx.symbolic_trace(model)
    x = make_input(prog)
    note(f"graph:\n{gm.code}")
    out = optimize_strict(gm, [x])
    torch.testing.assert_close(run(out, x), run(gm, x), rtol=1e-4, atol=1e-5, equal_nan=True)


@settings(max_examples=max(1, EXAMPLES // 5), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prog=programs(), dynamic=st.booleans())
def test_random_dynamo_graph_optimizes_to_same_values(prog, dynamic):
    """The same programs captured by Dynamo (parameters lifted to inputs, example_value meta;
    with dynamic=True, a symbolic batch size that static-shape rules skip)."""
    note(f"program: {prog}, dynamic={dynamic}")
    model = Program(prog).to(prog["dtype"]).eval()
    x = make_input(prog)
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, dynamic=dynamic)(x.clone())
    assert captured
    for gm, inputs in captured:
        note(f"graph:\n{gm.code}")
        out = optimize_strict(gm, inputs)
        # A symbolic size input runs as its value (a SymInt cannot size a real tensor).
        inputs = [int(v) if isinstance(v, torch.SymInt) else v for v in inputs]
        torch.testing.assert_close(run_all(out, inputs), run_all(gm, inputs),
                                   rtol=1e-4, atol=1e-5, equal_nan=True)
