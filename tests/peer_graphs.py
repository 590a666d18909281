"""The graphs of PyTorch's own Optimus tests, re-created for the peer suite.

PyTorch tests its Optimus passes (torch/_inductor/fx_passes/group_batch_fusion.py and
split_cat.py) in test/inductor/test_group_batch_fusion.py and
test/inductor/test_split_cat_fx_passes.py. Those tests are the nearest thing to a
specification of what the greedy baseline does, so tests/test_peer_suite.py holds
optimus_egg to at most Optimus's kernel launches on the same graphs. The graphs below are
written afresh from what those tests build (same ops, same wiring, same split sizes and
dims), not copied: every module and function here is CPU float32, traceable with
``torch.fx.symbolic_trace``, and deterministic (seeded weights, no dropout).

Differences from the originals, all forced by symbolic_trace or by value checking:

* FX cannot iterate a Proxy, so ``[f(s) for s in torch.split(x, 2, 1)]`` is written with
  explicit indices (``parts[i] for i in range(16)``); the traced graph (split -> getitems)
  is the one Dynamo produces from the original.
* Modules that take a Python list of tensors (highway self-gating, the BMM fusion module)
  take the tensors as separate positional inputs.
* ``.to(device)`` calls are dropped (CPU only); unregistered ``Parameter`` lists become
  ``ParameterList`` so FX can address them.
* In the pointwise module the original computes ``sub(mul, mul)`` then ``div(sub, sub)``,
  which is 0 / 0 = NaN everywhere and makes every value check pass trivially. Here
  ``sub(mul, add)`` and ``div(sub, add)`` (add > 0): the same ops in the same order per
  piece, with finite values.
* The highway module has 8 branches (the original, 20).
* consecutive-split ``multi_split_2`` returns its 32 sub-pieces as one flat list (the
  original returns a list of tuples; Dynamo flattens outputs, compile_fx on a
  symbolic_trace graph does not).
* A piece used more than once is indexed once (``_items``), as Dynamo does; indexing the
  split again at every use gives one getitem node per use, on which Optimus's
  mutate_cat_pass and split_stack_to_cats_pass do not fire.

Fidelity, measured on torch 2.13 CPU: on every graph here ``baselines.optimus`` leaves
the same Optimus counters as on the Dynamo-captured graph (``baselines.capture``) of the
same module or function, except normalization_pass on split_cat_split (Dynamo also
normalizes its tuple-argument cats), and the counters PyTorch's tests assert on fire
(``OPTIMUS_FIRES``, checked by tests/test_peer_suite.py::test_optimus_fires).

``GRAPHS`` maps a case name to a ``Peer`` (where it comes from and how to build it);
``build(name)`` returns ``(callable, inputs)`` where callable is the eager module or
function, and ``trace(name)`` the symbolic_trace GraphModule with its inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GRAPHS", "Peer", "build", "trace"]

GBF = "test_group_batch_fusion.py"
SCF = "test_split_cat_fx_passes.py"


@dataclass(frozen=True)
class Peer:
    name: str
    origin: str                        # "<file>::<test> (<graph>)" in pytorch/test/inductor
    make: Callable[[], tuple]          # () -> (module or function, inputs tuple)
    optimus: tuple[str, ...] = ()      # Optimus counters that must fire (see OPTIMUS_FIRES)


# ---- test_group_batch_fusion.py ------------------------------------------------------


class LayerNormSplitCat(nn.Module):
    """MyModule3: split(10, dim 2) -> 5 layer_norm((10,)) -> cat -> split(10) ->
    5 layer_norm((5, 10)) -> cat, with per-member affine parameters."""

    def __init__(self, n: int = 5):
        super().__init__()
        self.n = n
        self.w0 = nn.ParameterList(nn.Parameter(torch.randn(10)) for _ in range(n))
        self.b0 = nn.ParameterList(nn.Parameter(torch.randn(10)) for _ in range(n))
        self.w1 = nn.ParameterList(nn.Parameter(torch.randn(5, 10)) for _ in range(n))
        self.b1 = nn.ParameterList(nn.Parameter(torch.randn(5, 10)) for _ in range(n))

    def forward(self, x):
        first = torch.split(x, 10, dim=2)
        normed = [F.layer_norm(first[i], (10,), weight=self.w0[i], bias=self.b0[i])
                  for i in range(self.n)]
        y = torch.cat(normed, dim=2)
        second = torch.split(y, 10, dim=2)
        normed2 = [F.layer_norm(second[i], (5, 10), weight=self.w1[i], bias=self.b1[i])
                   for i in range(self.n)]
        return torch.cat(normed2, dim=2)


class LinearsOneInput(nn.Module):
    """MyModule4: 10 F.linear of one input (out widths z - i % 5) -> cat -> split(10) ->
    cat on dim 0 -> 10 F.linear of that -> cat -> sigmoid."""

    def __init__(self, z: int = 10, n: int = 10, bias: bool = True):
        super().__init__()
        self.n, self.bias = n, bias
        self.w1 = nn.ParameterList(nn.Parameter(torch.randn(z - i % 5, z)) for i in range(n))
        self.w2 = nn.ParameterList(nn.Parameter(torch.randn(z - i % 5, z)) for i in range(n))
        self.b1 = nn.ParameterList(nn.Parameter(torch.randn(z - i % 5)) for i in range(n))
        self.b2 = nn.ParameterList(nn.Parameter(torch.randn(z - i % 5)) for i in range(n))

    def forward(self, x):
        x = x + 1.2
        first = [F.linear(x, self.w1[i], self.b1[i] if self.bias else None) for i in range(self.n)]
        parts = torch.split(torch.cat(first, dim=1), 10, dim=1)
        rows = torch.cat([parts[i] for i in range(8)])
        second = [F.linear(rows, self.w2[i], self.b2[i] if self.bias else None)
                  for i in range(self.n)]
        return torch.sigmoid(torch.cat(second, dim=1))


class SplitLinearsCat(nn.Module):
    """MyModule5: split(100, dim 1) -> 5 F.linear (100 -> 50) -> cat -> sin."""

    def __init__(self, bias: bool = True, n: int = 5):
        super().__init__()
        self.n, self.bias = n, bias
        self.w = nn.ParameterList(nn.Parameter(torch.randn(50, 100)) for _ in range(n))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(50)) for _ in range(n))

    def forward(self, x):
        parts = torch.split(x, 100, dim=1)
        outs = [F.linear(parts[i], self.w[i], self.b[i] if self.bias else None)
                for i in range(self.n)]
        return torch.sin(torch.cat(outs, dim=1))


def pointwise_ops(x):
    """_TestPointwiseOps: split(500) -> each half split(50) -> sigmoid -> F.relu per piece,
    then add / mul / sub / div pairing the two halves' pieces -> cat."""
    halves = torch.split(x, 500, dim=1)
    xs = torch.split(halves[0], 50, dim=1)
    ys = torch.split(halves[1], 50, dim=1)
    out = []
    for i in range(10):
        a = F.relu(torch.sigmoid(xs[i]))
        b = F.relu(torch.sigmoid(ys[i]))
        add = torch.add(a, b)
        mul = torch.mul(add, add)
        sub = torch.sub(mul, add)
        out.append(torch.div(sub, add))
    return torch.cat(out, dim=1)


def pointwise_chain(x):
    """_TestPointwiseOpsPostGrad at torch level: split(500) -> split(50) -> tanh -> sigmoid
    -> relu per piece, then add of the two halves' pieces -> cat."""
    halves = torch.split(x, 500, dim=1)
    xs = torch.split(halves[0], 50, dim=1)
    ys = torch.split(halves[1], 50, dim=1)
    out = []
    for i in range(10):
        a = torch.relu(torch.sigmoid(torch.tanh(xs[i])))
        b = torch.relu(torch.sigmoid(torch.tanh(ys[i])))
        out.append(torch.add(a, b))
    return torch.cat(out, dim=1)


def math_ops(x):
    """_TestMathOps: 2 x 10 clamp -> nan_to_num -> detach chains on one input, stacked twice
    and stacked again."""
    def chain():
        return [torch.nan_to_num(x.clamp(min=-1000.1, max=1000.1), 0.0).detach()
                for _ in range(10)]
    return torch.stack((torch.stack(chain(), dim=0), torch.stack(chain(), dim=0)), dim=0)


class HighwaySelfGating(nn.Module):
    """_TestHighwaySelfGating: per input x, gating_proj(x) * sigmoid(transform_proj(x)),
    the two Linear modules shared by every branch; cat on the last dim."""

    def __init__(self, d: int = 10):
        super().__init__()
        self.gating_proj = nn.Linear(d, d)
        self.transform_proj = nn.Linear(d, d)
        self.gating_func = nn.Sigmoid()

    def gate(self, x):
        return self.gating_proj(x) * self.gating_func(self.transform_proj(x))

    def forward(self, x0, x1, x2, x3, x4, x5, x6, x7):
        xs = (x0, x1, x2, x3, x4, x5, x6, x7)
        return torch.cat([self.gate(x) for x in xs], dim=-1)


class LinearsSummed(nn.Module):
    """_TestBMMFusionModule: 10 Linear(10, 10), one per input, summed."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(10, 10) for _ in range(10))

    def forward(self, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9):
        xs = (x0, x1, x2, x3, x4, x5, x6, x7, x8, x9)
        out = self.layers[0](xs[0])
        for layer, x in zip(self.layers[1:], xs[1:]):
            out = out + layer(x)
        return out


class LinearChains(nn.Module):
    """MyModule (group_linear test): three rounds of 10 Linear(z, z) with pointwise glue,
    later rounds mixing outputs of earlier rounds, then cat."""

    def __init__(self, z: int = 10, n: int = 10):
        super().__init__()
        self.n = n
        self.seq1 = nn.ModuleList(nn.Linear(z, z) for _ in range(n))
        self.seq2 = nn.ModuleList(nn.Linear(z, z) for _ in range(n))
        self.seq3 = nn.ModuleList(nn.Linear(z, z) for _ in range(n))

    def forward(self, x):
        n = self.n
        x1 = [x + 0.1 * i for i in range(n)]
        x2 = [self.seq1[i](x1[i]) for i in range(n)]
        x3 = [x2[i] - 0.1 * i for i in range(n)]
        x4 = x1[:3] + x3[3:]
        x5 = [self.seq2[i](x4[i]) for i in range(n)]
        x6 = [x5[i] + 0.1 * (n - i) for i in range(n)]
        x7 = x1[:4] + x3[6:8] + x6[:4]
        x8 = [self.seq3[i](x7[i]) for i in range(n)]
        return torch.cat(x8, dim=1)


# ---- test_split_cat_fx_passes.py: normalization, consecutive splits --------------------


def split_norm_kwargs(x):
    """test_split_normalization kwarg3: split(tensor=x, split_size_or_sections=2, dim=-1)."""
    parts = torch.split(tensor=x, split_size_or_sections=2, dim=-1)
    return [torch.relu(parts[i]) for i in range(16)]


def split_norm_unequal_method(x):
    """test_split_normalization unequal_split_cm: x.split(3, 1) (10 x 3 and 1 x 2)."""
    parts = x.split(3, 1)
    return [torch.relu(parts[i]) for i in range(11)]


def split_merge_split2(x):
    """test_consecutive_split_merge multi_split_2: split(2, 1) then each piece split(1, 1);
    the 32 sub-pieces are the outputs (flat, as Dynamo returns them)."""
    parts = torch.split(x, 2, 1)
    out = []
    for i in range(16):
        sub = torch.split(parts[i], 1, 1)
        out += [sub[0], sub[1]]
    return out


def split_merge_unequal(x):
    """test_consecutive_split_merge unequal_multi_split: [10, 10, 12] then [4, 6], [6, 4],
    [4, 4, 4], relu on each of the 7 pieces."""
    fs = torch.split(x, [10, 10, 12], dim=1)
    a, b, c = fs[0].split([4, 6], 1), fs[1].split([6, 4], 1), fs[2].split([4, 4, 4], 1)
    items = [a[0], a[1], b[0], b[1], c[0], c[1], c[2]]
    return [torch.relu(s) for s in items]


def split_merge_some_users_not_splits(x):
    """test_consecutive_split_merge some_users_not_splits: like unequal_multi_split but the
    last piece goes through sin instead of a second split."""
    fs = torch.split(x, [10, 10, 12], dim=1)
    a, b = fs[0].split([4, 6], 1), fs[1].split([6, 4], 1)
    items = [a[0], a[1], b[0], b[1], torch.sin(fs[2])]
    return [torch.relu(s) for s in items]


def split_merge_with_cat(x):
    """test_consecutive_split_merge split_with_cat: split [4, 4, 24], the last piece split
    into six 4s, all eight pieces concatenated back (the identity)."""
    fs = torch.split(x, [4, 4, 24], dim=1)
    inner = fs[2].split((4, 4, 4, 4, 4, 4), 1)
    return torch.cat([fs[0], fs[1]] + [inner[i] for i in range(6)], dim=1)


def split_merge_out_of_order(x):
    """test_consecutive_split_merge split_getitem_out_of_order: pieces 0, 2, 1 then the
    last piece's five sub-pieces, concatenated."""
    fs = torch.split(x, [4, 4, 4, 20], dim=1)
    inner = fs[3].split((4, 4, 4, 4, 4), 1)
    return torch.cat([fs[0], fs[2], fs[1]] + [inner[i] for i in range(5)], dim=1)


# ---- test_split_cat_fx_passes.py: test_split_cat_merge ---------------------------------
# x: [2, 32, 32, 16]; split(4, dim 1) gives 8 pieces [2, 4, 32, 16].


def _ones(*shape):
    return torch.ones(*shape)


def _items(pieces, n: int) -> list:
    """One getitem per piece, each reused wherever the piece is (Dynamo's graph shape;
    indexing the tuple again at every use would make a getitem node per use)."""
    return [pieces[i] for i in range(n)]


def split_cat_identity(x):
    """simple_split_cat: cat(split(x, 4, 1), 1) is x."""
    return torch.cat(torch.split(x, 4, dim=1), dim=1)


def split_cat_other_dim(x):
    """simple_split_cat_argspec3: split on dim 1, cat on dim -2."""
    return torch.cat(torch.split(x, 4, dim=1), -2)


def split_stack(x):
    """simple_split_stack: stack(split(x, 4, 1), 1)."""
    return torch.stack(torch.split(x, 4, dim=1), dim=1)


def split_cat_addn_args(x):
    """split_cat_addn_args: cat([ones, *split pieces, ones], 1)."""
    p = torch.split(x, 4, dim=1)
    return torch.cat([_ones(2, 5, 32, 16)] + [p[i] for i in range(8)] + [_ones(2, 6, 32, 16)],
                     dim=1)


def split_stack_dim_mismatch(x):
    """split_stack_dim_mismatch: stack([ones, *split(dim 1) pieces, ones], dim 2)."""
    p = torch.split(x, 4, dim=1)
    return torch.stack([_ones(2, 4, 32, 16)] + [p[i] for i in range(8)] + [_ones(2, 4, 32, 16)],
                       dim=2)


def split_cat_dim_mismatch3(x):
    """split_cat_dim_mismatch3: split on dim 2, cat on dim 0 with ones around."""
    p = torch.split(x, 4, dim=2)
    return torch.cat([_ones(2, 32, 4, 16)] + [p[i] for i in range(8)] + [_ones(2, 32, 4, 16)],
                     dim=0)


def input_shuffling(x):
    """input_shuffling: pieces 1-3 and 5-7 between ones, cat on dim 1."""
    p = torch.split(x, 4, dim=1)
    return torch.cat([_ones(2, 4, 32, 16), p[1], p[2], p[3], _ones(2, 4, 32, 16), p[5], p[6],
                      p[7], _ones(2, 4, 32, 16)], dim=1)


def input_shuffling_stack_dim_mismatch(x):
    """input_shuffling_dim_mismatch_stack: the same operands stacked on dim 2."""
    p = torch.split(x, 4, dim=1)
    return torch.stack([_ones(2, 4, 32, 16), p[1], p[2], p[3], _ones(2, 4, 32, 16), p[5], p[6],
                        p[7], _ones(2, 4, 32, 16)], dim=2)


def input_shuffling_multiple_output(x):
    """input_shuffling_multiple_output: a cat (dim 2) of pieces 1-3, a stack (dim 1) of
    pieces 4-5, relu of piece 6."""
    p = torch.split(x, 4, dim=1)
    cat1 = torch.cat([_ones(2, 4, 32, 16), p[1], p[2], p[3], _ones(2, 4, 32, 16)], dim=2)
    stack1 = torch.stack([_ones(2, 4, 32, 16), p[4], p[5], _ones(2, 4, 32, 16)], dim=1)
    return cat1, stack1, torch.relu(p[6])


def unequal_split_multiple_output(x):
    """unequal_split_multiple_output: sections [2, 4, 4, 4, 4, 4, 8, 2], then as above."""
    p = torch.split(x, [2, 4, 4, 4, 4, 4, 8, 2], dim=1)
    cat1 = torch.cat([_ones(2, 4, 32, 16), p[1], p[2], p[3], _ones(2, 4, 32, 16)], dim=2)
    stack1 = torch.stack([_ones(2, 4, 32, 16), p[4], p[5], _ones(2, 4, 32, 16)], dim=1)
    return cat1, stack1, torch.relu(p[6])


def multi_split_cat(x1, x2):
    """multi_split_cat: two inputs split alike; one cat and one stack mixing both."""
    p = _items(torch.split(x1, 4, dim=1), 8)
    q = _items(torch.split(x2, 4, dim=1), 8)
    o = _ones  # a fresh constant per use, as in the original
    cat1 = torch.cat([o(2, 4, 32, 16), p[1], p[2], p[3], o(2, 4, 32, 16), q[1], q[2], q[3],
                      o(2, 4, 32, 16)], dim=2)
    stack1 = torch.stack([o(2, 4, 32, 16), p[4], p[5], o(2, 4, 32, 16), q[4], q[5],
                          o(2, 4, 32, 16)], dim=1)
    return cat1, stack1, torch.relu(p[6]), torch.relu(q[6])


# ---- test_split_cat_fx_passes.py: split-squeeze and unbind ----------------------------


def split_squeeze_stack(x):
    """test_split_squeeze split_squeeze_stack: split(1, dim 1) -> squeeze(1) -> stack."""
    p = torch.split(x, 1, dim=1)
    return torch.stack([torch.squeeze(p[i], 1) for i in range(32)])


def split_squeeze_multi_users(x):
    """test_split_squeeze split_squeeze_multi_squeeze_users: the squeezed pieces also feed
    relu (piece 0) and tanh (piece 1)."""
    p = torch.split(x, 1, dim=1)
    s = [torch.squeeze(p[i], 1) for i in range(32)]
    return torch.stack(s), torch.relu(s[0]), torch.tanh(s[1])


def split_squeeze_sin_stack(x):
    """test_split_squeeze graph_should_be_topological_sorted: split(1) on dim 0 ->
    squeeze(0) -> sin -> stack."""
    p = x.split(1)
    return torch.stack([torch.sin(p[i].squeeze(dim=0)) for i in range(2)])


# x: [2, 32, 32, 16]
def unbind_stack(x):
    """test_unbind_stack unbind_stack: stack(unbind(x, 1), 1) is x."""
    return torch.stack(torch.unbind(x, 1), 1)


def unbind_cat(x):
    """test_unbind_stack unbind_cat: cat(unbind(x, dim=-3), 1)."""
    return torch.cat(torch.unbind(x, dim=-3), 1)


def unbind_stack_dim_mismatch(x):
    """test_unbind_stack dim_mismatch: stack(unbind(x, 1), 0)."""
    return torch.stack(torch.unbind(x, dim=1), 0)


def unbind_cat_addn_args(x):
    """test_unbind_stack unbind_cat_addn_args: cat([ones, *unbind(x, 1), ones], 1)."""
    u = torch.unbind(x, dim=1)
    return torch.cat([_ones(2, 32, 16)] + [u[i] for i in range(32)] + [_ones(2, 32, 16)], dim=1)


def unbind_stack_addn_dim_mismatch(x):
    """test_unbind_stack unbind_stack_dim_mismatch: stack([ones, *unbind(x, 1), ones], 2)."""
    u = torch.unbind(x, dim=1)
    return torch.stack([_ones(2, 32, 16)] + [u[i] for i in range(32)] + [_ones(2, 32, 16)],
                       dim=2)


def unbind_cat_multi_users(x):
    """test_unbind_stack unbind_cat_multi_users: the unbound pieces feed a cat and a stack."""
    parts = torch.unbind(x, dim=1)
    u = [parts[i] for i in range(32)]
    return (torch.cat([_ones(2, 32, 16)] + u + [_ones(2, 32, 16)], dim=1),
            torch.stack([_ones(2, 32, 16)] + u + [_ones(2, 32, 16), _ones(2, 32, 16)], dim=1))


# ---- test_split_cat_fx_passes.py: test_split_cat_new_patterns (x: [500, 500]) ----------


def split_cat_split(x):
    """split_cat_split: pieces 0-1 and 9-10 of a split are concatenated and re-split; the
    result re-assembled with pieces 2-8 in one cat."""
    p = torch.split(x, [200, 50, 50, 20, 20, 20, 20, 20, 20, 50, 30], 1)
    a = torch.split(torch.cat((p[0], p[1]), 1), [50, 120, 80], 1)
    b = torch.split(torch.cat((p[9], p[10]), 1), [10, 20, 50], 1)
    return torch.cat([a[0], a[1], a[2], b[0], b[1], b[2]] + [p[i] for i in range(2, 9)], 1)


def remove_cat_with_all_getitems(x):
    """remove_cat_node_with_all_getitmes: a cat of every piece in order (x itself), plus
    cat -> split -> cat re-assemblies, on dim 0."""
    p = _items(torch.split(x, [50, 50, 200, 20, 20, 20, 20, 20, 40, 10, 50], dim=0), 11)
    whole = torch.cat(tuple(p), dim=0)
    a = torch.split(torch.cat((p[0], p[1]), dim=0), [20, 30, 50], dim=0)
    b = torch.split(torch.cat((p[0], p[10]), dim=0), [10, 60, 30], dim=0)
    out = torch.cat([a[0], a[1], a[2], b[0], b[1], b[2]] + [p[i] for i in range(2, 9)], dim=0)
    return torch.cat((out, whole), dim=0)


def mutate_cat_with_some_getitems(x):
    """mutate_cat_node_with_some_getitmes: a cat of pieces 6-10 then 2-5 (a rotation)."""
    p = _items(torch.split(x, [50, 50, 200, 20, 20, 20, 20, 20, 40, 10, 50], dim=0), 11)
    rot = torch.cat(tuple(p[i] for i in (6, 7, 8, 9, 10, 2, 3, 4, 5)), dim=0)
    a = torch.split(torch.cat((p[0], p[1]), dim=0), [20, 30, 50], dim=0)
    b = torch.split(torch.cat((p[0], p[10]), dim=0), [10, 60, 30], dim=0)
    out = torch.cat([a[0], a[1], a[2], b[0], b[1], b[2], p[2]], dim=0)
    return torch.cat((out, rot), dim=0)


def split_cat_to_slices(x):
    """split_cat_to_slices: three splits (two of clones) whose pieces, partly rotated, are
    concatenated with a clone of one piece."""
    xc, xc2 = x.clone(), x.clone()
    p = _items(torch.split(x, [50] * 10, dim=0), 10)
    q = _items(torch.split(xc, [50] * 10, dim=0), 10)
    r = _items(torch.split(xc2, [100] * 5, dim=0), 5)
    items = ([p[0].clone()] + [p[i] for i in range(10)] + [q[i] for i in (4, 5, 6, 7, 8, 9, 0, 1, 2, 3)]
             + [r[i] for i in range(5)])
    return torch.cat(items, dim=0)


def unbind_cat_to_view(x):
    """unbind_cat_to_view: two unbinds of x.view(10, 50, 500), cat on dim 1 with clones."""
    u = _items(torch.unbind(x.view(10, 50, 500), dim=0), 10)
    v = _items(torch.unbind(x.view(10, 50, 500), dim=0), 10)
    items = ([u[i] for i in range(7)] + [u[7].clone()] + [v[i] for i in range(10)]
             + [u[8].clone(), u[9].clone()])
    return torch.cat(items, dim=1)


def split_stack_to_cats_same_dim(x):
    """split_stack_to_cats_same_dim: unbind of a view, six pieces split in halves on dim 1,
    all halves stacked on dim 1 with three clones."""
    u = _items(torch.unbind(x.view(10, 50, 500), dim=0), 6)
    g = [h for i in range(6) for h in _items(torch.split(u[i], [250, 250], dim=1), 2)]
    items = g[:6] + [g[0].clone(), g[1].clone()] + g[6:] + [g[2].clone()]
    return torch.stack(items, dim=1)


def split_stack_to_cats_different_dim(x):
    """split_stack_to_cats_different_dim: two five-way splits (one of a clone) stacked on
    dim 2 after three clones."""
    p = _items(torch.split(x, [100] * 5, dim=1), 5)
    q = _items(torch.split(x.clone(), [100] * 5, dim=1), 5)
    items = ([p[0].clone(), p[1].clone(), p[2].clone()] + [p[i] for i in range(5)]
             + [q[i] for i in range(5)])
    return torch.stack(items, dim=2)


def unbind_stack_to_slices(x):
    """unbind_stack_to_slices: unbind(view(50, 10, 500), 1) stacked back on dim 1 after
    three clones."""
    u = _items(torch.unbind(x.view(50, 10, 500), dim=1), 10)
    items = [u[0].clone(), u[1].clone(), u[2].clone()] + [u[i] for i in range(10)]
    return torch.stack(items, dim=1)


def move_reshape_out_of_split_stack(x):
    """move_reshape_out_of_split_stack: split a [50000, 5] view into 5 columns, reshape each
    to [-1, 5], stack with clones."""
    p = _items(torch.split(x.view(50000, 5), [1, 1, 1, 1, 1], dim=1), 5)
    r = [p[i].reshape(-1, 5) for i in range(5)]
    items = [r[0].clone(), r[1].clone(), r[2].clone()] + r + [r[3].clone()]
    return torch.stack(items, dim=0)


# ---- the registry ------------------------------------------------------------------------


def _module(cls, *inputs_shape, **kw):
    def make():
        torch.manual_seed(0)
        mod = cls(**kw).eval()
        return mod, tuple(torch.randn(*s) for s in inputs_shape)
    return make


def _fn(fn, *inputs_shape):
    def make():
        torch.manual_seed(0)
        return fn, tuple(torch.randn(*s) for s in inputs_shape)
    return make


def _math_ops():
    return math_ops, (torch.tensor([float("nan"), float("inf"), -float("inf"), 3.14]),)


def _highway():
    torch.manual_seed(0)
    return HighwaySelfGating().eval(), tuple(torch.randn(10, 10) for _ in range(8))


def _summed():
    torch.manual_seed(0)
    return LinearsSummed().eval(), tuple(torch.randn(10, 10) for _ in range(10))


_X4 = (2, 32, 32, 16)
_ENTRIES = [
    # test_group_batch_fusion.py
    ("gbf_layernorm", f"{GBF}::test_batch_layer_norm_fusion (MyModule3)",
     _module(LayerNormSplitCat, (2, 5, 50))),
    ("gbf_linear_lhs", f"{GBF}::test_batch_linear_lhs_fusion (MyModule4, bias)",
     _module(LinearsOneInput, (20, 10))),
    ("gbf_linear_lhs_nobias", f"{GBF}::test_batch_linear_lhs_fusion (MyModule4, no bias)",
     _module(LinearsOneInput, (20, 10), bias=False)),
    ("gbf_batch_linear", f"{GBF}::test_batch_linear_pre_grad_fusion (MyModule5, bias)",
     _module(SplitLinearsCat, (50, 500))),
    ("gbf_batch_linear_nobias", f"{GBF}::test_batch_linear_pre_grad_fusion (MyModule5, no bias)",
     _module(SplitLinearsCat, (50, 500), bias=False)),
    ("gbf_pointwise", f"{GBF}::test_pointwise_op_fusion (_TestPointwiseOps)",
     _fn(pointwise_ops, (50, 1000))),
    ("gbf_pointwise_chain", f"{GBF}::test_pointwise_op_fusion_post_grad (_TestPointwiseOpsPostGrad)",
     _fn(pointwise_chain, (50, 1000))),
    ("gbf_math_ops", f"{GBF}::test_math_op_fusion (_TestMathOps)", _math_ops),
    ("gbf_highway", f"{GBF}::test_gate_fusion_post_grad (_TestHighwaySelfGating)", _highway),
    ("gbf_bmm", f"{GBF}::TestPostGradBatchLinearFusion (_TestBMMFusionModule)", _summed),
    ("gbf_linear_chains", f"{GBF}::test_group_linear_fusion (MyModule)",
     _module(LinearChains, (10, 10))),
    # test_split_cat_fx_passes.py
    ("scf_split_norm_kwargs", f"{SCF}::test_split_normalization (kwarg3)",
     _fn(split_norm_kwargs, (2, 32))),
    ("scf_split_norm_unequal", f"{SCF}::test_split_normalization (unequal_split_cm)",
     _fn(split_norm_unequal_method, (2, 32))),
    ("scf_merge_splits_2", f"{SCF}::test_consecutive_split_merge (multi_split_2)",
     _fn(split_merge_split2, (2, 32))),
    ("scf_merge_splits_unequal", f"{SCF}::test_consecutive_split_merge (unequal_multi_split)",
     _fn(split_merge_unequal, (2, 32))),
    ("scf_merge_splits_some_users", f"{SCF}::test_consecutive_split_merge (some_users_not_splits)",
     _fn(split_merge_some_users_not_splits, (2, 32))),
    ("scf_merge_splits_cat", f"{SCF}::test_consecutive_split_merge (split_with_cat)",
     _fn(split_merge_with_cat, (2, 32))),
    ("scf_merge_splits_out_of_order", f"{SCF}::test_consecutive_split_merge (split_getitem_out_of_order)",
     _fn(split_merge_out_of_order, (2, 32))),
    ("scf_split_cat", f"{SCF}::test_split_cat_merge (simple_split_cat)", _fn(split_cat_identity, _X4)),
    ("scf_split_cat_other_dim", f"{SCF}::test_split_cat_merge (simple_split_cat_argspec3)",
     _fn(split_cat_other_dim, _X4)),
    ("scf_split_stack", f"{SCF}::test_split_cat_merge (simple_split_stack)", _fn(split_stack, _X4)),
    ("scf_split_cat_addn", f"{SCF}::test_split_cat_merge (split_cat_addn_args)",
     _fn(split_cat_addn_args, _X4)),
    ("scf_split_stack_dim_mismatch", f"{SCF}::test_split_cat_merge (split_stack_dim_mismatch)",
     _fn(split_stack_dim_mismatch, _X4)),
    ("scf_split_cat_dim_mismatch3", f"{SCF}::test_split_cat_merge (split_cat_dim_mismatch3)",
     _fn(split_cat_dim_mismatch3, _X4)),
    ("scf_input_shuffling", f"{SCF}::test_split_cat_merge (input_shuffling)", _fn(input_shuffling, _X4)),
    ("scf_input_shuffling_stack", f"{SCF}::test_split_cat_merge (input_shuffling_dim_mismatch_stack)",
     _fn(input_shuffling_stack_dim_mismatch, _X4)),
    ("scf_multiple_output", f"{SCF}::test_split_cat_merge (input_shuffling_multiple_output)",
     _fn(input_shuffling_multiple_output, _X4)),
    ("scf_unequal_multiple_output", f"{SCF}::test_split_cat_merge (unequal_split_multiple_output)",
     _fn(unequal_split_multiple_output, _X4)),
    ("scf_multi_split_cat", f"{SCF}::test_split_cat_merge (multi_split_cat)",
     _fn(multi_split_cat, _X4, _X4)),
    ("scf_split_squeeze", f"{SCF}::test_split_squeeze (split_squeeze_stack)",
     _fn(split_squeeze_stack, (2, 32))),
    ("scf_split_squeeze_users", f"{SCF}::test_split_squeeze (split_squeeze_multi_squeeze_users)",
     _fn(split_squeeze_multi_users, (2, 32))),
    ("scf_split_squeeze_sin", f"{SCF}::test_split_squeeze (graph_should_be_topological_sorted)",
     _fn(split_squeeze_sin_stack, (2, 32))),
    ("scf_unbind_stack", f"{SCF}::test_unbind_stack (unbind_stack)", _fn(unbind_stack, _X4)),
    ("scf_unbind_cat", f"{SCF}::test_unbind_stack (unbind_cat)", _fn(unbind_cat, _X4)),
    ("scf_unbind_stack_dim_mismatch", f"{SCF}::test_unbind_stack (dim_mismatch)",
     _fn(unbind_stack_dim_mismatch, _X4)),
    ("scf_unbind_cat_addn", f"{SCF}::test_unbind_stack (unbind_cat_addn_args)",
     _fn(unbind_cat_addn_args, _X4)),
    ("scf_unbind_stack_addn_dim_mismatch", f"{SCF}::test_unbind_stack (unbind_stack_dim_mismatch)",
     _fn(unbind_stack_addn_dim_mismatch, _X4)),
    ("scf_unbind_cat_multi_users", f"{SCF}::test_unbind_stack (unbind_cat_multi_users)",
     _fn(unbind_cat_multi_users, _X4)),
    ("scf_split_cat_split", f"{SCF}::test_split_cat_new_patterns (split_cat_split)",
     _fn(split_cat_split, (500, 500))),
    ("scf_remove_cat", f"{SCF}::test_split_cat_new_patterns (remove_cat_node_with_all_getitmes)",
     _fn(remove_cat_with_all_getitems, (500, 500))),
    ("scf_mutate_cat", f"{SCF}::test_split_cat_new_patterns (mutate_cat_node_with_some_getitmes)",
     _fn(mutate_cat_with_some_getitems, (500, 500))),
    ("scf_split_cat_to_slices", f"{SCF}::test_split_cat_new_patterns (split_cat_to_slices)",
     _fn(split_cat_to_slices, (500, 500))),
    ("scf_unbind_cat_to_view", f"{SCF}::test_split_cat_new_patterns (unbind_cat_to_view)",
     _fn(unbind_cat_to_view, (500, 500))),
    ("scf_split_stack_to_cats", f"{SCF}::test_split_cat_new_patterns (split_stack_to_cats_same_dim)",
     _fn(split_stack_to_cats_same_dim, (500, 500))),
    ("scf_split_stack_to_cats_diff", f"{SCF}::test_split_cat_new_patterns (split_stack_to_cats_different_dim)",
     _fn(split_stack_to_cats_different_dim, (500, 500))),
    ("scf_unbind_stack_to_slices", f"{SCF}::test_split_cat_new_patterns (unbind_stack_to_slices)",
     _fn(unbind_stack_to_slices, (500, 500))),
    ("scf_move_reshape", f"{SCF}::test_split_cat_new_patterns (move_reshape_out_of_split_stack)",
     _fn(move_reshape_out_of_split_stack, (500, 500))),
]

# The Optimus counters each PyTorch test asserts on (for tests of post-grad passes, the
# pre-grad passes that fuse the same ops); under baselines.OPTIMUS_PRE_GRAD they all fire
# on these graphs, so the comparison is with Optimus at work.
_SCMERGE = ("scmerge_split_removed", "scmerge_cat_removed")
OPTIMUS_FIRES: dict[str, tuple[str, ...]] = {
    "gbf_layernorm": ("batch_layernorm",),
    "gbf_linear_lhs": ("batch_linear_lhs",),
    "gbf_linear_lhs_nobias": ("batch_linear_lhs",),
    "gbf_batch_linear": ("batch_linear",),
    "gbf_batch_linear_nobias": ("batch_linear",),
    "gbf_pointwise": ("batch_sigmoid", "batch_relu"),
    "gbf_pointwise_chain": ("batch_tanh", "batch_sigmoid"),
    "gbf_math_ops": ("normalization_pass", "batch_clamp", "batch_nan_to_num", "batch_detach",
                     "unbind_stack_pass", "unbind_stack_to_slices_pass"),
    "gbf_highway": ("batch_linear_lhs", "batch_sigmoid"),
    "gbf_bmm": ("batch_linear",),
    "gbf_linear_chains": ("batch_linear",),
    "scf_split_norm_kwargs": ("normalization_pass",),
    "scf_split_norm_unequal": ("normalization_pass",),
    "scf_merge_splits_2": ("merge_splits_pass",),
    "scf_merge_splits_unequal": ("merge_splits_pass",),
    "scf_merge_splits_some_users": ("merge_splits_pass",),
    "scf_merge_splits_cat": ("merge_splits_pass",),
    "scf_merge_splits_out_of_order": ("merge_splits_pass",),
    "scf_split_cat": ("merge_getitem_cat_pass",),
    "scf_split_cat_other_dim": _SCMERGE,
    "scf_split_stack": _SCMERGE,
    "scf_split_cat_addn": _SCMERGE + ("scmerge_cat_added",),
    "scf_split_stack_dim_mismatch": _SCMERGE + ("scmerge_cat_added",),
    "scf_split_cat_dim_mismatch3": _SCMERGE + ("scmerge_cat_added",),
    "scf_input_shuffling": _SCMERGE + ("scmerge_split_added", "scmerge_cat_added"),
    "scf_input_shuffling_stack": _SCMERGE + ("scmerge_split_added", "scmerge_cat_added"),
    "scf_multiple_output": _SCMERGE + ("scmerge_split_added", "scmerge_cat_added"),
    "scf_unequal_multiple_output": _SCMERGE + ("scmerge_split_added", "scmerge_cat_added"),
    "scf_multi_split_cat": _SCMERGE + ("scmerge_split_added", "scmerge_cat_added"),
    "scf_split_squeeze": ("split_cat_pass",),
    "scf_split_squeeze_users": ("split_cat_pass",),
    "scf_split_squeeze_sin": ("split_cat_pass",),
    "scf_unbind_stack": _SCMERGE + ("normalization_pass",),
    "scf_unbind_cat": _SCMERGE + ("normalization_pass",),
    "scf_unbind_stack_dim_mismatch": _SCMERGE + ("normalization_pass",),
    "scf_unbind_cat_addn": _SCMERGE + ("scmerge_cat_added",),
    "scf_unbind_stack_addn_dim_mismatch": _SCMERGE + ("scmerge_cat_added",),
    "scf_unbind_cat_multi_users": _SCMERGE + ("scmerge_cat_added",),
    "scf_split_cat_split": ("merge_getitem_cat_pass",),
    "scf_remove_cat": ("mutate_cat_pass",),
    "scf_mutate_cat": ("mutate_cat_pass",),
    "scf_split_cat_to_slices": ("split_cat_to_slices_pass",),
    "scf_unbind_cat_to_view": ("unbind_cat_to_view_pass",),
    "scf_split_stack_to_cats": ("split_stack_to_cats_pass",),
    "scf_split_stack_to_cats_diff": ("split_stack_to_cats_pass",),
    "scf_unbind_stack_to_slices": ("unbind_stack_to_slices_pass",),
    "scf_move_reshape": ("move_reshape_out_of_split_stack_pass",),
}

GRAPHS: dict[str, Peer] = {
    name: Peer(name, origin, make, OPTIMUS_FIRES.get(name, ())) for name, origin, make in _ENTRIES
}


def build(name: str):
    """(eager module or function, example inputs) for one peer graph."""
    return GRAPHS[name].make()


def trace(name: str):
    """(symbolic_trace GraphModule, eager callable, example inputs) for one peer graph."""
    model, inputs = build(name)
    return fx.symbolic_trace(model), model, inputs
