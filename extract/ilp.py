"""Exact extraction by integer programming (HiGHS): the measuring stick for greedy.

Minimizes the DAG cost (each chosen node paid once). x_n in {0,1} picks node n; the root
class picks one node; a picked node needs one picked node in each child class; acyclicity
by an order t_c per class: t_parent >= t_child + 1 when the parent's node is picked (big-M).
Time-limited: on timeout the best feasible solution is returned and `optimal` is False.
`start` (greedy's extraction) is given to HiGHS as a first feasible solution, so a run that
stops at its limit returns nothing costlier than greedy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimus_egg.extract.graph import Graph, Node
from optimus_egg.extract.greedy import EPS, Extraction, reachable, term_children


@dataclass
class IlpResult:
    extraction: Extraction | None
    optimal: bool
    seconds: float


def ilp(g: Graph, node_cost: Callable[[Node], float], time_limit_s: float = 10.0,
        start: Extraction | None = None) -> IlpResult:
    import time

    import highspy

    t0 = time.perf_counter()
    node_ids = list(g.nodes)
    col = {k: i for i, k in enumerate(node_ids)}
    classes = list(g.classes)
    tcol = {c: len(node_ids) + i for i, c in enumerate(classes)}
    kids = {k: term_children(g, g.nodes[k]) for k in node_ids}
    own = {k: node_cost(g.nodes[k]) + EPS for k in node_ids}
    big_m = float(len(classes) + 1)

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    # HiGHS stops at a 1e-4 relative gap by default, which can accept a solution one 0.001
    # tie-breaker (EPS) worse than the best; "optimal" here means exact below that.
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", EPS / 10)
    n_x, n_t = len(node_ids), len(classes)
    costs = np.array([own[k] for k in node_ids] + [0.0] * n_t)
    lower = np.zeros(n_x + n_t)
    upper = np.array([1.0] * n_x + [big_m] * n_t)
    _check(h.addVars(n_x + n_t, lower, upper), "addVars")
    _check(h.changeColsCost(n_x + n_t, np.arange(n_x + n_t, dtype=np.int32), costs), "changeColsCost")
    _check(h.changeColsIntegrality(n_x, np.arange(n_x, dtype=np.int32), np.full(n_x, 1, dtype=np.uint8)),
           "changeColsIntegrality")

    rows_lo, rows_hi, starts, index, value = [], [], [], [], []

    def row(lo, hi, entries):
        starts.append(len(index))
        rows_lo.append(lo)
        rows_hi.append(hi)
        for i, v in entries:
            index.append(i)
            value.append(v)

    row(1.0, 1.0, [(col[k], 1.0) for k in g.classes[g.root]])
    for k in node_ids:
        c = g.nodes[k].eclass
        if c in kids[k]:  # a node cannot be its own child (its row would name x_k twice)
            row(-highspy.kHighsInf, 0.0, [(col[k], 1.0)])
            continue
        for child in set(kids[k]):
            # picking k needs some node of `child`: sum(x_m) - x_k >= 0
            row(0.0, highspy.kHighsInf, [(col[m], 1.0) for m in g.classes[child]] + [(col[k], -1.0)])
            # order: t_c - t_child - M x_k >= 1 - M
            row(1.0 - big_m, highspy.kHighsInf, [(tcol[c], 1.0), (tcol[child], -1.0), (col[k], -big_m)])
    _check(h.addRows(len(rows_lo), np.array(rows_lo), np.array(rows_hi), len(index),
                     np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value)),
           "addRows")
    if start is not None:
        h.setSolution(_start_solution(start, kids, col, tcol, n_x + n_t))
    h.run()
    status = h.getModelStatus()
    optimal = status == highspy.HighsModelStatus.kOptimal
    sol = h.getSolution().col_value
    if not sol or h.getInfo().primal_solution_status != 2:  # 2: feasible
        return IlpResult(None, False, time.perf_counter() - t0)
    choice = {}
    for c, ks in g.classes.items():
        picked = [k for k in ks if sol[col[k]] > 0.5]
        if picked:
            choice[c] = min(picked, key=lambda k: own[k])
    choice = reachable(g.root, kids, choice)
    return IlpResult(Extraction(choice, sum(own[k] for k in choice.values())), optimal,
                     time.perf_counter() - t0)


def _check(status, call: str) -> None:
    """HiGHS reports a rejected model edit in its return status, not by raising: a model that
    silently lost its rows would be "solved" to the empty choice."""
    import highspy

    if status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS {call} failed while building the extraction ILP")


def _start_solution(ex: Extraction, kids: dict, col: dict, tcol: dict, n: int):
    """`ex` as a HiGHS solution: its nodes picked, each chosen class ordered by its height in
    the chosen DAG (a class above its children, as the order rows need)."""
    import highspy

    x = [0.0] * n
    height: dict[str, int] = {}

    def visit(c: str) -> int:  # iterative post-order: chosen DAGs can be deep
        todo = [c]
        while todo:
            top = todo[-1]
            below = [k for k in kids[ex.choice[top]] if k not in height]
            if below:
                todo.extend(below)
                continue
            todo.pop()
            height[top] = 1 + max((height[k] for k in kids[ex.choice[top]]), default=0)
        return height[c]

    for c, k in ex.choice.items():
        x[col[k]] = 1.0
        x[tcol[c]] = float(visit(c))
    sol = highspy.HighsSolution()
    sol.col_value = x
    return sol
