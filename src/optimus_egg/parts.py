"""Graphs optimized in parts: where the e-graph cannot see across, each part is a graph of its own.

Stretches. `torch.no_grad()`, `torch.autocast()` and `torch.inference_mode()` blocks inside a
forward are nodes of a Dynamo graph (`_set_grad_enabled`, `_enter_autocast`, ...;
from_fx.GLOBAL_STATE) that change how every node after them runs. Between two such nodes the
state is fixed, so each stretch is a graph of its own: its operands from before become
placeholders and its values read after it become outputs. Each stretch is optimized on its
share of the budget (by node count) and spliced back in place, so no rewrite crosses a change of
state (a no_grad linear batched with a grad one would give the no_grad output a gradient; a
split under no_grad and a cat after it do not cancel).

Bodies. `torch.utils.checkpoint.checkpoint(fn, ...)` reaches Dynamo's graph as one call of a
higher-order op on a body graph (`tag_activation_checkpoint(wrap_body_0, x, *params)`), opaque
to the outer graph's rules; torch.export puts no_grad and autocast blocks in such bodies too
(`wrap_with_set_grad_enabled`, `wrap_with_autocast`). Each such body, called once, is optimized
as a graph of its own (its placeholders' meta are its example values) and replaces the original
in a copy of the module.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from optimus_egg.from_fx import GLOBAL_STATE, _name
from optimus_egg.shapes import _meta_value

MIN_NODES = 2  # a stretch with fewer call nodes has nothing to batch or cancel


def changes_state(n: fx.Node) -> bool:
    return n.op == "call_function" and _name(n.target) in GLOBAL_STATE


def has_state_changes(gm: fx.GraphModule) -> bool:
    return any(changes_state(n) for n in gm.graph.nodes)


def stretches(gm: fx.GraphModule) -> list[list[fx.Node]]:
    """The runs of call nodes between state changes, in graph order (empty runs left out).
    Placeholders, get_attr nodes (free to read anywhere) and the output belong to none."""
    runs: list[list[fx.Node]] = [[]]
    for n in gm.graph.nodes:
        if changes_state(n):
            runs.append([])
        elif n.op.startswith("call"):
            runs[-1].append(n)
    return [r for r in runs if r]


@dataclass
class Stretch:
    nodes: list[fx.Node]
    inputs: list[fx.Node]   # nodes before the stretch that it reads (not get_attr), in order
    outputs: list[fx.Node]  # its nodes read after it
    gm: fx.GraphModule      # the stretch alone: placeholders `inputs`, output the tuple `outputs`


def cut(gm: fx.GraphModule, nodes: list[fx.Node]) -> Stretch:
    members = set(nodes)
    inputs = list(dict.fromkeys(a for n in nodes for a in n.all_input_nodes
                                if a not in members and a.op != "get_attr"))
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for a in inputs:
        env[a] = g.placeholder(a.name)
        env[a].meta = copy.copy(a.meta)

    def operand(a: fx.Node) -> fx.Node:
        if a not in env:  # a get_attr: read again here
            env[a] = g.get_attr(a.target)
            env[a].meta = copy.copy(a.meta)
        return env[a]

    for n in nodes:
        env[n] = g.node_copy(n, operand)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    g.output(tuple(env[n] for n in outputs))
    return Stretch(nodes, inputs, outputs, fx.GraphModule(gm, g, class_name=type(gm).__name__))


def example_values(gm: fx.GraphModule, example_inputs: list, wanted: set[fx.Node]) -> dict[fx.Node, object]:
    """A value for each node in `wanted`: the example input of a placeholder, else the node's
    meta value; if some node has neither, fake values propagated through the whole graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    got = dict(zip(placeholders, example_inputs))
    for n in wanted - got.keys():
        if _meta_value(n) is not None:
            got[n] = _meta_value(n)
    if wanted <= got.keys():
        return got
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    values: dict[fx.Node, object] = {}

    class Recording(FakeTensorProp):
        def run_node(self, n):
            values[n] = super().run_node(n)
            return values[n]

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    grad = torch.is_grad_enabled()
    try:  # the graph's own state changes run for real: leave the state as it was
        with mode:
            Recording(gm, mode).propagate_dont_convert_inputs(*fakes)
    finally:
        torch.set_grad_enabled(grad)
    return {**values, **got}


# Higher-order ops that run a body graph on their other operands -> the body's operand index:
# Dynamo's checkpoint and wrap, torch.export's no_grad and autocast blocks.
BODY_OPS = {"tag_activation_checkpoint": 0, "wrap": 0, "wrap_with_set_grad_enabled": 1, "wrap_with_autocast": 4}


def bodies(gm: fx.GraphModule) -> list[str]:
    """Attributes of `gm` holding the body of exactly one BODY_OPS call and read nowhere else
    (a body run twice might run on other shapes than its example values)."""
    reads: dict[str, int] = {}
    calls: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            reads[n.target] = reads.get(n.target, 0) + len(n.users)
        elif n.op == "call_function" and len(n.args) > BODY_OPS.get(_name(n.target), len(n.args)):
            body = n.args[BODY_OPS[_name(n.target)]]
            if isinstance(body, fx.Node) and body.op == "get_attr":
                calls[body.target] = calls.get(body.target, 0) + 1
    return [t for t, k in calls.items() if k == 1 and reads.get(t) == 1 and "." not in t
            and isinstance(getattr(gm, t, None), fx.GraphModule)]


def optimize_bodies(gm: fx.GraphModule, names: list[str], budget_s: float,
                    optimize_one: Callable[[fx.GraphModule, list, float], fx.GraphModule]) -> fx.GraphModule:
    """A copy of `gm` whose bodies `names` are `optimize_one(body, its example values, share)`
    (`budget_s` split by node count), or `gm` itself if none changed."""
    total = sum(len(getattr(gm, name).graph.nodes) for name in names)
    new = {}
    for name in names:
        body = getattr(gm, name)
        values = [_meta_value(p) for p in body.graph.nodes if p.op == "placeholder"]
        if any(v is None for v in values):
            continue  # no example values to optimize it on
        out = optimize_one(body, values, budget_s * len(body.graph.nodes) / total)
        if out is not body:
            new[name] = out
    if not new:
        return gm
    from optimus_egg.to_fx import graph_module

    g = fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    g._codegen = copy.copy(gm.graph._codegen)  # (a deepcopy of export's pytree specs warns)
    copied = graph_module(gm, g, class_name=type(gm).__name__)
    for name, out in new.items():
        setattr(copied, name, out)
    return copied


def optimize_stretches(gm: fx.GraphModule, example_inputs: list, budget_s: float,
                       optimize_one: Callable[[fx.GraphModule, list, float], fx.GraphModule]) -> fx.GraphModule:
    """`gm` with each stretch of MIN_NODES or more call nodes replaced by
    `optimize_one(stretch_gm, its example inputs, its share of budget_s)`."""
    parts = [cut(gm, run) for run in stretches(gm) if len(run) >= MIN_NODES]
    values = example_values(gm, example_inputs, {a for p in parts for a in p.inputs})
    total = sum(len(p.nodes) for p in parts)
    done: dict[fx.Node, tuple[Stretch, fx.GraphModule]] = {}
    for p in parts:
        out = optimize_one(p.gm, [values[a] for a in p.inputs], budget_s * len(p.nodes) / total)
        if out is not p.gm:
            done[p.nodes[0]] = (p, out)
    if not done:
        return gm
    return splice(gm, done)


def splice(gm: fx.GraphModule, done: dict[fx.Node, tuple[Stretch, fx.GraphModule]]) -> fx.GraphModule:
    """`gm` with each stretch in `done` (keyed by its first node) replaced by its new graph."""
    from optimus_egg.to_fx import graph_module

    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    skip: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n in skip:
            continue
        if n in done:
            p, out = done[n]
            new_placeholders = [m for m in out.graph.nodes if m.op == "placeholder"]
            vals = g.graph_copy(out.graph, {m: env[a] for m, a in zip(new_placeholders, p.inputs)})
            env.update(zip(p.outputs, vals))
            skip.update(p.nodes)
            for m in out.graph.nodes:  # a target the stretch's module has and gm lacks
                if m.op == "get_attr" and not _has_attr(gm, m.target):
                    raise RuntimeError(f"stretch result reads {m.target}, which the graph module lacks")
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    g._codegen = copy.copy(gm.graph._codegen)
    return graph_module(gm, g, class_name=type(gm).__name__)


def _has_attr(root: torch.nn.Module, target: str) -> bool:
    obj = root
    for atom in target.split("."):
        if not hasattr(obj, atom):
            return False
        obj = getattr(obj, atom)
    return True
