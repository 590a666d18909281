"""Greedy DAG-aware extraction over the serialized e-graph.

Costs are computed bottom-up to a fixpoint. A tuple (Pieces) class is paid once and shared by
its items: each item is charged cost(pieces) / fanout, so a batched kernel that feeds N
outputs competes fairly with N separate kernels (egglog's greedy_dag decides per e-class and
keeps the unbatched graph). Amortizing can make a cyclic choice look cheap, so selection is
a DFS that never picks a node reaching a class on the current path: the result is acyclic.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from optimus_egg.extract.graph import Graph, Node

EPS = 1e-3  # per-node tie-breaker: among equal launch counts prefer fewer nodes


@dataclass
class Extraction:
    choice: dict[str, str]   # e-class -> chosen node id, for every class reachable from the root
    cost: float              # DAG cost: each chosen node counted once


def term_children(g: Graph, n: Node) -> list[str]:
    out = []
    for c in n.children:
        if c in g.classes:
            out.append(c)
        elif isinstance(g.values.get(c), list):
            out.extend(e for e in g.values[c] if e in g.classes)
    return out


def greedy(g: Graph, node_cost: Callable[[Node], float]) -> Extraction:
    fan = g.fanout()
    kids = {k: term_children(g, n) for k, n in g.nodes.items()}
    own = {k: node_cost(n) + EPS for k, n in g.nodes.items()}
    parents: dict[str, list[str]] = defaultdict(list)
    for k, cs in kids.items():
        for c in set(cs):
            parents[c].append(k)
    cost = {c: math.inf for c in g.classes}
    best_node: dict[str, float] = {}

    def node_total(k: str) -> float:
        n = g.nodes[k]
        if n.op == "item":
            p = n.children[0]
            return own[k] + cost[p] / max(fan.get(p, 1), 1)
        return own[k] + sum(cost[c] for c in kids[k])

    queue = deque(g.nodes)
    queued = set(queue)
    while queue:
        k = queue.popleft()
        queued.discard(k)
        total = node_total(k)
        best_node[k] = total
        cls = g.nodes[k].eclass
        if total < cost[cls] - 1e-12:
            cost[cls] = total
            for p in parents[cls]:
                if p not in queued:
                    queued.add(p)
                    queue.append(p)
    return select(g, kids, best_node, own)


def select(g: Graph, kids: dict[str, list[str]], rank: dict[str, float], own: dict[str, float]) -> Extraction:
    choice: dict[str, str] = {}
    on_path: set[str] = set()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * len(g.classes) + 1000))

    def visit(cls: str) -> bool:
        if cls in choice:
            return True
        if cls in on_path:
            return False
        on_path.add(cls)
        for k in sorted(g.classes[cls], key=lambda k: rank.get(k, math.inf)):
            if not math.isfinite(rank.get(k, math.inf)):
                break
            if all(visit(c) for c in kids[k]):
                choice[cls] = k
                break
        on_path.discard(cls)
        return cls in choice

    try:
        if not visit(g.root):
            raise RuntimeError("extraction found no acyclic term for the graph outputs")
    finally:
        sys.setrecursionlimit(limit)
    choice = reachable(g, kids, choice)
    return Extraction(choice, sum(own[k] for k in choice.values()))


def reachable(g: Graph, kids: dict[str, list[str]], choice: dict[str, str]) -> dict[str, str]:
    """The part of `choice` the root actually uses (failed DFS attempts leave extra entries)."""
    keep: dict[str, str] = {}
    todo = [g.root]
    while todo:
        c = todo.pop()
        if c not in keep:
            keep[c] = choice[c]
            todo.extend(kids[choice[c]])
    return keep
