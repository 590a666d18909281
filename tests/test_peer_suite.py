"""The peer suite: PyTorch's own Optimus test graphs, and optimus_egg held to Optimus on them.

PyTorch tests its Optimus passes in test/inductor/test_group_batch_fusion.py and
test/inductor/test_split_cat_fx_passes.py; tests/peer_graphs.py re-creates the graphs those
tests build. For every graph (symbolic_trace, CPU float32):

* ``test_values``: ``optimus_egg.optimize(gm, inputs, budget_s=2.0)`` computes what eager
  computes (rtol 1e-4, atol 1e-5), without falling back;
* ``test_launches``: the optimized graph compiled by Inductor launches at most as many
  kernels per call as ``baselines.optimus(gm)`` compiled by Inductor (PyTorch's Optimus
  pre-grad passes, ``baselines.OPTIMUS_PRE_GRAD``);
* ``test_compiled_values``: the compiled optimized graph still computes eager's values;
* ``test_optimus_fires``: the Optimus pass PyTorch's test is about fires on our graph too,
  so the comparison is with Optimus at work, not with an idle baseline.

Where optimus_egg launches more kernels than Optimus today, the case is an
``xfail(strict=True)`` whose reason names the rewrite optimus_egg lacks (see ``MISSING``):
it starts failing (XPASS) the day the rewrite lands, so the marker cannot go stale.

Each graph is traced, optimized and compiled once per arm per process (``_arms`` and
``_compiled`` are caches). Inductor CPU compiles take seconds, so the default run covers a
representative subset (``DEFAULT``: both files, batch and split/cat families, wins and
known losses); the other graphs are marked slow (``--runslow``).

The launch table (graph, Optimus, optimus_egg) is printed at the end of the module; with
``OPTIMUS_EGG_PEER_PLAIN=1`` it also compiles each graph with plain Inductor for a third
column, and ``OPTIMUS_EGG_PEER_TABLE=<path>`` writes the table there as Markdown.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.fx as fx

import optimus_egg
from optimus_egg import baselines, measure
from optimus_egg.measure import Compiled, Launches, compile_inductor

import peer_graphs
from peer_graphs import GRAPHS

BUDGET_S = 2.0
RTOL, ATOL = 1e-4, 1e-5
FAST = {"compile_threads": 1}  # small graphs: a worker pool costs more than it saves

# The representative subset the default run compiles (>= 8 graphs, both source files).
DEFAULT = {
    "gbf_layernorm", "gbf_batch_linear", "gbf_linear_lhs", "gbf_pointwise", "gbf_math_ops",
    "gbf_highway", "gbf_bmm",
    "scf_split_norm_unequal", "scf_merge_splits_unequal", "scf_split_cat",
    "scf_input_shuffling", "scf_multi_split_cat", "scf_split_squeeze", "scf_unbind_stack",
    "scf_split_cat_split", "scf_remove_cat",
}


# Graphs where optimus_egg launches more kernels than Optimus today, and why.
MISSING: dict[str, str] = {}


def _marks(name: str) -> list:
    marks = []
    if name not in DEFAULT:
        marks.append(pytest.mark.slow)
    if name in MISSING:
        marks.append(pytest.mark.xfail(strict=True, reason=MISSING[name]))
    return marks


def _slow_marks(name: str) -> list:
    return [] if name in DEFAULT else [pytest.mark.slow]


NAMES = list(GRAPHS)
LAUNCH_CASES = [pytest.param(n, id=n, marks=_marks(n)) for n in NAMES]
COMPILED_CASES = [pytest.param(n, id=n, marks=_slow_marks(n)) for n in NAMES]
VALUE_CASES = [pytest.param(n, id=n) for n in NAMES]


# ---- arms, built once per graph -----------------------------------------------------------


@dataclass
class Arms:
    gm: fx.GraphModule
    inputs: tuple
    eager: Any
    egg: fx.GraphModule
    optimus: fx.GraphModule


@functools.cache
def _arms(name: str) -> Arms:
    gm, model, inputs = peer_graphs.trace(name)
    with torch.no_grad():
        eager = model(*inputs)
    egg = optimus_egg.optimize(gm, list(inputs), budget_s=BUDGET_S)
    opt = baselines.optimus(gm, list(inputs))
    return Arms(gm, inputs, eager, egg, opt)


def _compile(gm: fx.GraphModule, inputs) -> Compiled:
    """compile_inductor (0 launches for a graph Inductor emits no code for: it returns its
    inputs or views of them, `measure.only_views`)."""
    return compile_inductor(gm, list(inputs), config_patches=FAST)


@functools.cache
def _compiled(name: str) -> tuple[Compiled, Compiled]:
    """(optimus_egg arm, Optimus arm), each compiled by Inductor once."""
    a = _arms(name)
    return _compile(a.egg, a.inputs), _compile(a.optimus, a.inputs)


@functools.cache
def _plain(name: str) -> Launches:
    a = _arms(name)
    return _compile(a.gm, a.inputs).launches


def _assert_values(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)


# ---- the table -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def launch_table(request):
    rows: dict[str, tuple] = {}
    yield rows
    if not rows:
        return
    plain = os.environ.get("OPTIMUS_EGG_PEER_PLAIN") == "1"
    head = "| graph | " + ("plain Inductor | " if plain else "") + "Optimus | optimus_egg | |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for name in NAMES:
        if name not in rows:
            continue
        opt, egg, note = rows[name]
        verdict = "win" if egg < opt else ("tie" if egg == opt else f"copies: {note}" if note else "LOSS")
        cells = [name] + ([str(_plain(name).total)] if plain else []) + [str(opt), str(egg), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    path = os.environ.get("OPTIMUS_EGG_PEER_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # module teardown runs under capture
            reporter.write_line("")
            reporter.write_line("peer suite: kernel launches per call (Inductor, CPU)")
            for line in lines:
                reporter.write_line(line)


# ---- tests ---------------------------------------------------------------------------------


def test_registry_covers_both_peer_files():
    origins = [p.origin for p in GRAPHS.values()]
    assert sum(o.startswith(peer_graphs.GBF) for o in origins) >= 8
    assert sum(o.startswith(peer_graphs.SCF) for o in origins) >= 25
    assert DEFAULT <= set(GRAPHS) and set(MISSING) <= set(GRAPHS)
    unmarked = DEFAULT - set(MISSING)
    assert len(DEFAULT) >= 8 and len(unmarked) >= 8
    assert any(n.startswith("gbf_") for n in unmarked) and any(n.startswith("scf_") for n in unmarked)


@pytest.mark.parametrize("name", VALUE_CASES)
def test_values(name):
    a = _arms(name)
    report = a.egg.meta["optimus_egg"]
    assert report.fallback is None, f"{name}: optimize fell back: {report.fallback}"
    with torch.no_grad():
        _assert_values(a.egg(*a.inputs), a.eager)


@pytest.mark.parametrize("name", COMPILED_CASES)
def test_optimus_fires(name):
    """The Optimus pass the PyTorch test asserts on fires here too (a live baseline)."""
    expected = GRAPHS[name].optimus
    fired = _arms(name).optimus.meta["optimus_counters"]
    missing = [c for c in expected if not fired.get(c)]
    assert not missing, f"{name}: Optimus counters {missing} did not fire; fired: {fired}"


@pytest.mark.parametrize("name", LAUNCH_CASES)
def test_launches(name, launch_table, record_property):
    """Never more launches than Optimus, but for the outputs Optimus's graph returns as views
    of the inputs where eager's are fresh tensors: optimus_egg copies those (one launch;
    pipeline.copy_new_aliases), and its outputs alias no more than eager's do."""
    a = _arms(name)
    egg, opt = _compiled(name)
    e, o = egg.launches.total, opt.launches.total
    with torch.no_grad():
        eager = measure.aliased_outputs(a.eager, a.inputs)
        ours = measure.aliased_outputs(egg.fn(*a.inputs), a.inputs)
        theirs = measure.aliased_outputs(opt.fn(*a.inputs), a.inputs)
    launch_table[name] = (o, e, "Optimus's outputs alias its inputs" if theirs > eager else "")
    record_property("optimus_launches", o)
    record_property("optimus_egg_launches", e)
    report = a.egg.meta["optimus_egg"]
    fired = {k: v for k, v in report.matches.items() if v}
    assert ours <= eager, f"{name}: optimus_egg's outputs alias its inputs ({ours}, eager {eager})"
    copies = report.copied_outputs if theirs > eager else 0
    assert e <= o + copies, (f"{name}: optimus_egg {egg.launches} > Optimus {opt.launches}; "
                              f"optimus_egg rules fired: {fired or 'none'}")


@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiled_values(name):
    a = _arms(name)
    egg, _ = _compiled(name)
    with torch.no_grad():
        _assert_values(egg.fn(*a.inputs), a.eager)
