"""Standard torch.nn models through torch.compile(backend=optimus_egg.backend(strict=True)).

The bench models and the fuzzer's programs are built from the rules' vocabulary; these models
bring what a user's model brings besides it: convolutions with BatchNorm (running statistics
written in training), nn.MultiheadAttention and nn.TransformerEncoder, scaled_dot_product_attention,
GroupNorm / InstanceNorm, dict outputs, a buffer written in place, a graph break. Each runs two
steps, inference and training, against eager: outputs, every parameter's gradient and every
buffer. Strict, so an internal failure raises instead of falling back to Dynamo's graph. Where a
model has independent linears, a rewrite must have fired on one of its graphs.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import optimus_egg
from optimus_egg.bench import GRAD_TOL, VALUE_TOL


class ConvBranches(nn.Module):
    """Two conv + BatchNorm + relu branches on one image, concatenated, pooled, classified."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(3, 8, 3, padding=1) for _ in range(2))
        self.bns = nn.ModuleList(nn.BatchNorm2d(8) for _ in range(2))
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        y = torch.cat([F.relu(bn(conv(x))) for conv, bn in zip(self.convs, self.bns)], 1)
        return self.fc(F.adaptive_avg_pool2d(y, 4).flatten(1))


class CausalAttention(nn.Module):
    """Separate q, k, v projections of one input (one batched GEMM), causal SDPA, output projection."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (m(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Norms(nn.Module):
    """Three linears of one input, normalized three ways (GroupNorm, LayerNorm, InstanceNorm)."""

    def __init__(self, d=64):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))
        self.group, self.layer, self.instance = nn.GroupNorm(4, d), nn.LayerNorm(d), nn.InstanceNorm1d(d, affine=True)

    def forward(self, x):  # x: [b, t, d]
        a = self.group(self.ls[0](x).transpose(1, 2)).transpose(1, 2)
        c = self.instance(self.ls[2](x).transpose(1, 2)).transpose(1, 2)
        return a + self.layer(self.ls[1](x)) * c


class DictOut(nn.Module):
    """Per-chunk linears returned in a dict."""

    def __init__(self, d=64):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        return {f"out{i}": torch.sigmoid(m(p)) for i, (m, p) in enumerate(zip(self.ls, x.chunk(4, dim=1)))}


class CountingBuffer(nn.Module):
    """A buffer incremented in place each call; three linears of one input stacked and summed."""

    def __init__(self, d=64):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        y = torch.stack([m(x) for m in self.ls]).sum(0)
        return y.relu_() + self.calls.detach()


class GraphBreak(nn.Module):
    """A data-dependent branch (`.item()`) between linears: two graphs, the second with two linears of one input."""

    def __init__(self, d=64):
        super().__init__()
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        y = self.ls[0](x)
        if y.sum().item() > 0:
            y = y * 2
        return self.ls[1](y) + self.ls[2](y)


class Embeddings(nn.Module):
    """Per-field embedding, linear, gelu, LayerNorm; stacked and summed."""

    def __init__(self, fields=4, d=64):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(50, d) for _ in range(fields))
        self.ls = nn.ModuleList(nn.Linear(d, d) for _ in range(fields))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(fields))

    def forward(self, idx):
        outs = [n(F.gelu(l(e(idx[:, i])))) for i, (e, l, n) in enumerate(zip(self.emb, self.ls, self.norms))]
        return torch.stack(outs, 1).sum(1)


def _encoder():
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


# name -> (model factory, input factory, whether a rewrite must fire). The GEMMs of those that must
# be rewritten are past gemm_loops.MAX_MACS: smaller ones the backend writes as loops, unbatched.
MODELS = {
    "transformer_encoder": (_encoder, lambda: (torch.randn(4, 10, 32),), False),
    "multihead_attention": (lambda: nn.MultiheadAttention(32, 4, batch_first=True),
                            lambda: (torch.randn(4, 10, 32),) * 3, False),
    "conv_branches": (ConvBranches, lambda: (torch.randn(4, 3, 8, 8),), False),
    "causal_attention": (CausalAttention, lambda: (torch.randn(4, 16, 64),), True),
    "norms": (Norms, lambda: (torch.randn(8, 16, 64),), True),
    "dict_out": (DictOut, lambda: (torch.randn(64, 256),), True),
    "counting_buffer": (CountingBuffer, lambda: (torch.randn(64, 64),), True),
    "graph_break": (GraphBreak, lambda: (torch.randn(64, 64),), True),
    "embeddings": (Embeddings, lambda: (torch.randint(0, 50, (64, 4)),), True),
}


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("name", list(MODELS))
def test_standard_model_through_the_backend_computes_as_eager(name, train, reports):
    make, make_inputs, rewrites = MODELS[name]
    torch.manual_seed(0)
    model, inputs = make().train(train), make_inputs()
    ref, model = model, copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=optimus_egg.backend(strict=True))
    with torch.set_grad_enabled(train):
        for step in range(2):  # the second step runs the compiled code without compiling
            want, got = _tensors(ref(*inputs)), _tensors(compiled(*inputs))
            assert len(got) == len(want)
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w, **VALUE_TOL, msg=lambda s: f"{name} step {step}: {s}")
            if train:
                sum(t.sum() for t in want).backward()
                sum(t.sum() for t in got).backward()
    torch._dynamo.reset()
    for (pname, p), q in zip(ref.named_parameters(), model.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, **GRAD_TOL, msg=lambda s: f"{pname}.grad: {s}")
    for (bname, b), c in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(c, b, msg=lambda s: f"buffer {bname}: {s}")
    assert reports, "optimize never ran"
    assert all(r.fallback is None for r in reports), [r.fallback for r in reports]
    if rewrites:
        assert any(r.changed for r in reports), "no graph was rewritten: " + "; ".join(str(r) for r in reports)
