"""The serialized e-graph as plain Python data: term classes, their nodes, and primitive values."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from egglog import EGraph

# Constructors a term class may be extracted as; everything else (analyses, facts) is skipped.
TERM_OPS = {"input", "none", "call", "unary", "call_multi", "item", "outputs", "linear", "layer_norm",
            "cat", "stack", "split", "unbind", "movedim", "flatten", "unflatten", "batched_linear", "batched_layer_norm"}


@dataclass
class Node:
    op: str
    children: list[str]   # child e-class ids (a Vec argument is one child: its class)
    eclass: str


@dataclass
class Graph:
    nodes: dict[str, Node]
    classes: dict[str, list[str]]          # term e-class -> its node ids
    values: dict[str, object]              # primitive / Vec e-class -> Python value
    origins: dict[str, int] = field(default_factory=dict)   # term e-class -> FX node index
    root: str = ""

    def fanout(self) -> dict[str, int]:
        """Pieces class -> number of distinct items taken from it."""
        counts: dict[str, set] = {}
        for n in self.nodes.values():
            if n.op == "item":
                counts.setdefault(n.children[0], set()).add(self.values[n.children[1]])
        return {c: len(s) for c, s in counts.items()}


def _primitive(op: str, eclass: str):
    if eclass.startswith("i64"):
        return int(op)
    if eclass.startswith("f64"):
        return float(op)
    if eclass.startswith("String"):
        return op[1:-1]
    return op


def serialize(egraph: EGraph) -> Graph:
    raw = egraph._egraph.serialize([], max_functions=None, max_calls_per_function=None,
                                   include_temporary_functions=False)
    data = json.loads(raw.to_json())["nodes"]
    node_class = {k: v["eclass"] for k, v in data.items()}
    values: dict[str, object] = {}
    vecs: dict[str, list[str]] = {}
    for k, v in data.items():
        if k.startswith("primitive-"):
            if v["op"] == "vec-of":
                vecs[v["eclass"]] = [node_class[c] for c in v["children"]]
            else:
                values[v["eclass"]] = _primitive(v["op"], v["eclass"])
    for cls, elems in vecs.items():
        values[cls] = elems  # a Vec's value: its element classes (term classes or primitive classes)
    nodes: dict[str, Node] = {}
    classes: dict[str, list[str]] = {}
    origins: dict[str, int] = {}
    root = ""
    for k, v in data.items():
        if v["op"] == "node":
            origins.setdefault(v["eclass"], values[node_class[v["children"][0]]])
        if k.startswith("primitive-") or v["op"] not in TERM_OPS:
            continue
        n = Node(v["op"], [node_class[c] for c in v["children"]], v["eclass"])
        nodes[k] = n
        classes.setdefault(n.eclass, []).append(k)
        if n.op == "outputs":
            root = n.eclass
    return Graph(nodes, classes, values, origins, root)
