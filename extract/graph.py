"""The serialized e-graph as plain Python data: term classes, their nodes, and primitive values."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from egglog import EGraph

# Constructors a term class may be extracted as; everything else (analyses, facts) is skipped.
TERM_OPS = {"input", "none", "call", "unary", "binary", "call_multi", "item", "outputs", "linear", "layer_norm",
            "cat", "stack", "split", "unbind", "movedim", "flatten", "unflatten", "batched_linear", "batched_layer_norm",
            "narrow", "squeeze", "reshape"}


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
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # tensor e-class -> its `shape` fact

    def __getstate__(self):
        # Columns instead of one Node object each: the search worker sends its extraction as
        # a Graph, and pickle takes lists of strings several times faster.
        ns = self.nodes.values()
        return (list(self.nodes), [n.op for n in ns], [n.children for n in ns], [n.eclass for n in ns],
                self.classes, self.values, self.origins, self.root, self.shapes)

    def __setstate__(self, state) -> None:
        if isinstance(state, dict):  # pickled field by field
            self.__dict__.update(state)
            return
        keys, ops, children, eclasses, self.classes, self.values, self.origins, self.root, self.shapes = state
        self.nodes = dict(zip(keys, map(Node, ops, children, eclasses)))


def _primitive(op: str, eclass: str):
    if eclass.startswith("i64"):
        return int(op)
    if eclass.startswith("f64"):
        return float(op)
    if eclass.startswith("String"):
        return op[1:-1]
    return op


_VEC = "egglog.builtins.Vec["
_BUILTIN = {"egglog.builtins.i64": "i64", "egglog.builtins.f64": "f64", "egglog.builtins.String": "String"}


def serialize(egraph: EGraph) -> Graph:
    """The term part of the e-graph, read from egglog's tables (`EGraph.freeze`).

    Same Graph as `serialize_json` (egglog's JSON serialization, ~50x slower on big graphs
    and skipped analyses included) up to the spelling of class ids: nodes are named
    `function-{row}-{op}` as there, and nodes, classes and each class's node list come in the
    same order (function declaration order, then table rows). Falls back to the JSON path for
    a sort it does not know.
    """
    try:
        return _serialize_frozen(egraph)
    except _UnknownSort:
        return serialize_json(egraph)


class _UnknownSort(Exception):
    pass


def _serialize_frozen(egraph: EGraph) -> Graph:
    eg = egraph._egraph
    functions = eg.freeze().functions
    term_sorts = {f.output_sort for name, f in functions.items() if name in TERM_OPS}
    ids: dict[str, dict] = {}       # sort -> Value -> class id
    values: dict[str, object] = {}
    convert = {"i64": eg.value_to_i64, "f64": eg.value_to_f64, "String": eg.value_to_string}

    def table_of(sort: str) -> dict:
        table = ids.get(sort)
        if table is None:
            if sort not in term_sorts and sort not in convert and not (sort.startswith(_VEC) and sort.endswith("]")):
                raise _UnknownSort(sort)
            table = ids[sort] = {}
        return table

    def cls_of(sort: str, v) -> str:
        table = table_of(sort)
        c = table.get(v)
        if c is None:
            c = table[v] = f"{sort}-{len(table)}"
            if sort in term_sorts:
                pass
            elif sort in convert:
                values[c] = convert[sort](v)
            else:  # a Vec's value: its element classes (term classes or primitive classes)
                elem = sort[len(_VEC):-1]
                elem = _BUILTIN.get(elem, elem)
                values[c] = [cls_of(elem, e) for e in eg.value_to_vec(v)]
        return c

    nodes: dict[str, Node] = {}
    classes: dict[str, list[str]] = {}
    origins: dict[str, int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    root = ""
    for op, f in functions.items():
        # `rows` builds a list of row objects on each access: read only the tables used, once
        if op not in TERM_OPS and op not in ("node", "shape") or f.is_let_binding:
            continue
        rows = f.rows
        if not rows:
            continue
        if op == "node" and f.input_sorts == ["i64"]:
            out_sort = f.output_sort
            for r in rows:
                origins.setdefault(cls_of(out_sort, r.output), eg.value_to_i64(r.inputs[0]))
            continue
        if op == "shape" and len(f.input_sorts) == 1:
            in_sort, to_int = f.input_sorts[0], eg.value_to_i64
            for r in rows:
                shapes[cls_of(in_sort, r.inputs[0])] = tuple(map(to_int, eg.value_to_vec(r.output)))
            continue
        if op not in TERM_OPS:
            continue
        sorts, out_sort = f.input_sorts, f.output_sort
        tables = [table_of(s) for s in sorts]
        out_table = table_of(out_sort)
        for i, r in enumerate(rows):
            k = f"function-{i}-{op}"
            # a table hit is a dict lookup; a first sight of a value goes through cls_of
            eclass = out_table.get(r.output) or cls_of(out_sort, r.output)
            nodes[k] = Node(op, [t.get(v) or cls_of(s, v) for t, s, v in zip(tables, sorts, r.inputs)], eclass)
            members = classes.get(eclass)
            if members is None:
                classes[eclass] = [k]
            else:
                members.append(k)
            if op == "outputs":
                root = eclass
    cls_of = None  # a recursive closure is a reference cycle that would keep its tables alive
    return Graph(nodes, classes, values, origins, root, shapes)


def serialize_json(egraph: EGraph) -> Graph:
    """The Graph from egglog's JSON serialization (the reference for `serialize`)."""
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
    shapes: dict[str, tuple[int, ...]] = {}
    root = ""
    for k, v in data.items():
        if v["op"] == "node":
            origins.setdefault(v["eclass"], values[node_class[v["children"][0]]])
        elif v["op"] == "shape" and len(v["children"]) == 1:
            shapes[node_class[v["children"][0]]] = tuple(values[e] for e in vecs.get(v["eclass"], []))
        if k.startswith("primitive-") or v["op"] not in TERM_OPS:
            continue
        n = Node(v["op"], [node_class[c] for c in v["children"]], v["eclass"])
        nodes[k] = n
        classes.setdefault(n.eclass, []).append(k)
        if n.op == "outputs":
            root = n.eclass
    return Graph(nodes, classes, values, origins, root, shapes)
