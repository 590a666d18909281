import torch.fx as fx

from optimus_egg import ops
from optimus_egg.bisect import bisect
from optimus_egg.models import build


def test_bisect_finds_nothing_on_a_correct_model():
    m, inputs = build("parallel_mlp")
    assert bisect(fx.symbolic_trace(m.eval()), inputs) is None


def test_bisect_names_the_rule_that_breaks_values(monkeypatch):
    real = ops.batched_layer_norm

    def broken(x, shape, w, b, eps):
        return real(x, shape, w, b, eps) + 1.0

    monkeypatch.setattr(ops, "batched_layer_norm", broken)
    m, inputs = build("parallel_mlp")
    assert bisect(fx.symbolic_trace(m.eval()), inputs) == "batch-layernorm"
