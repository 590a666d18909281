import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def saturated():
    """Bench models' e-graphs saturated with every rule: name -> (Graph, node cost, Lowered)."""
    import time

    from optimus_egg.extract.graph import serialize
    from optimus_egg.models import build
    from optimus_egg.rules import RULESETS
    from torch import fx

    from optimus_egg.from_fx import from_fx
    from optimus_egg.pipeline import node_cost
    from optimus_egg.saturate import Limits, saturate

    out = {}
    for name in ("parallel_mlp", "dcn_v2", "masknet", "interformer"):
        m, inputs = build(name)
        lw = from_fx(fx.symbolic_trace(m.eval()), list(inputs))
        saturate(lw.egraph, RULESETS, Limits(), time.perf_counter() + 30)
        g = serialize(lw.egraph)
        out[name] = (g, node_cost(lw, g), lw)
    return out


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches cleared before and after the test."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def reports(monkeypatch):
    """Every Report optimize returns while the test runs (the torch.compile backend's calls included)."""
    import optimus_egg.pipeline as pipeline

    seen = []
    real = pipeline.optimize

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out.meta["optimus_egg"])
        return out

    monkeypatch.setattr(pipeline, "optimize", spy)
    return seen
