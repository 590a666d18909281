"""Greedy DAG-aware extraction over the serialized e-graph.

Costs are computed bottom-up to a fixpoint. A tuple (Pieces) class is paid once and shared by
its items: each item is charged cost(pieces) / fanout, so a batched kernel that feeds N
outputs competes fairly with N separate kernels (egglog's greedy_dag decides per e-class and
keeps the unbatched graph). Amortizing can make a cyclic choice look cheap, so selection is
a DFS that never picks a node reaching a class on the current path: the result is acyclic.
Local passes then lower the choice's exact DAG cost (`_reuse`, `_unbatch`, `_swap`).
"""
from __future__ import annotations

import math
import sys
from collections import ChainMap, deque
from collections.abc import Callable
from dataclasses import dataclass

from optimus_egg.extract.graph import Graph, Node

EPS = 1e-3  # per-node tie-breaker: among equal launches and work (work.py) prefer fewer nodes


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
    if all(len(ks) == 1 for ks in g.classes.values()):
        forced = _forced(g, node_cost)
        if forced is not None:
            return forced
    # The fixpoint and the selection run on integer ids: node i is the i-th of g.nodes, class
    # j the j-th of g.classes (the same updates, in the same order, as on the string keys).
    keys = list(g.nodes)
    n_of = list(g.nodes.values())
    cls_id = {c: j for j, c in enumerate(g.classes)}
    idx = {k: i for i, k in enumerate(keys)}
    members = [[idx[k] for k in ks] for ks in g.classes.values()]
    node_cls = [cls_id[n.eclass] for n in n_of]
    own_of = [node_cost(n) + EPS for n in n_of]
    vec_kids = {c: [cls_id[e] for e in v if e in cls_id] for c, v in g.values.items() if isinstance(v, list)}
    kid_ids: list[list[int]] = []  # term_children, as class ids
    for n in n_of:
        ks = []
        for c in n.children:
            j = cls_id.get(c)
            if j is not None:
                ks.append(j)
            elif c in vec_kids:
                ks.extend(vec_kids[c])
        kid_ids.append(ks)
    # an item pays its tuple's cost over the tuple's fanout: (pieces class, item index) or None
    item_of = [(cls_id[n.children[0]], g.values[n.children[1]]) if n.op == "item" else None for n in n_of]
    parents: list[list[int]] = [[] for _ in members]
    distinct = [ks if len(ks) < 2 else list(dict.fromkeys(ks)) for ks in kid_ids]  # stack([x, x]) reads x once
    for i, ks in enumerate(distinct):
        for j in ks:
            parents[j].append(i)
    root = cls_id[g.root]
    divisor = _fanout(range(len(n_of)), item_of)  # every item the e-graph holds

    def extract(divisor: dict[int, int]) -> tuple[dict[int, int], float]:
        best = _prices(members, distinct, parents, node_cls, own_of, item_of, divisor)
        chosen = _reuse(root, _select(root, members, kid_ids, best), members, kid_ids, own_of)
        chosen = _unbatch(root, chosen, members, kid_ids, own_of, item_of)
        chosen = _swap(root, chosen, members, kid_ids, own_of, best, item_of)
        return chosen, sum(own_of[i] for i in chosen.values())

    chosen, total = extract(divisor)
    # The divisor assumes every item the e-graph holds is used; where the choice uses fewer, an
    # item was priced too cheaply (one piece of a wide op whose other pieces nothing reads
    # carries the whole op). Price again with the pieces the choice uses, while that helps.
    for _ in range(REFINE_ROUNDS):
        fewer = {p: k for p, k in _fanout(chosen.values(), item_of).items() if k < divisor.get(p, 1)}
        if not fewer:
            break
        divisor = {**divisor, **fewer}
        again, again_total = extract(divisor)
        if again_total >= total - 1e-12:
            break
        chosen, total = again, again_total
    classes = list(g.classes)
    return Extraction({classes[c]: keys[i] for c, i in chosen.items()}, total)


# Extra pricing rounds with the fanout the last choice uses. Measured: the bench e-graphs need
# none (their choice uses every item it prices over); on the fuzz programs where it matters one
# round reaches what two, three or four do.
REFINE_ROUNDS = 1


def _fanout(nodes, item_of) -> dict[int, int]:
    """Tuple class -> the number of distinct items among `nodes` taken from it."""
    items: dict[int, set] = {}
    for i in nodes:
        if item_of[i] is not None:
            items.setdefault(item_of[i][0], set()).add(item_of[i][1])
    return {p: len(ks) for p, ks in items.items()}


def _prices(members, kid_ids, parents, node_cls, own_of, item_of, divisor) -> list[float]:
    """Each node's cost by the fixpoint: its own cost plus its children's classes' costs (each
    class once: `kid_ids` lists them without repeats), an item its tuple's class cost over
    `divisor[tuple]`."""
    inf = math.inf
    cost = [inf] * len(members)
    best = [inf] * len(own_of)  # a node's cost once the fixpoint has priced it
    # Start from the nodes without term children: any other node costs inf until a child's
    # class gets a cost, and that pushes it (the same fixpoint, without the wasted visits).
    queue = deque(i for i in range(len(own_of)) if not kid_ids[i] and item_of[i] is None)
    queued = [False] * len(own_of)
    for i in queue:
        queued[i] = True
    popleft, push = queue.popleft, queue.append
    while queue:
        i = popleft()
        queued[i] = False
        it = item_of[i]
        if it is not None:
            total = own_of[i] + cost[it[0]] / divisor.get(it[0], 1)
        else:
            total = own_of[i] + sum([cost[c] for c in kid_ids[i]])
        best[i] = total
        c = node_cls[i]
        if total < cost[c] - 1e-12:
            cost[c] = total
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = True
                    push(p)
    return best


def _select(root: int, members: list[list[int]], kid_ids: list[list[int]], rank: list[float]) -> dict[int, int]:
    """Class -> node for the classes the root reaches: in each class the cheapest node (by
    `rank`) whose children can all be chosen without closing a cycle (`_pick`)."""
    choice: dict[int, int] = {}
    if not _pick([root], {}, members, kid_ids, rank, choice):
        raise RuntimeError("extraction found no acyclic term for the graph outputs")
    return reachable(root, kid_ids, choice)


def _pick(starts: list[int], done: dict[int, int], members: list[list[int]], kid_ids: list[list[int]],
          rank: list[float], out: dict[int, int]) -> bool:
    """Into `out`, for each class below `starts` that neither `done` nor `out` holds, the
    cheapest node by `rank` whose children can all be picked, by a depth-first search that
    never enters a class on its own path. False if a start has no such node. Failed attempts
    may leave entries that nothing picked reads."""
    on_path: set[int] = set()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20 * len(members) + 1000))
    isfinite = math.isfinite

    def visit(cls: int) -> bool:
        if cls in out or cls in done:
            return True
        if cls in on_path:
            return False
        on_path.add(cls)
        for k in sorted(members[cls], key=rank.__getitem__):
            if not isfinite(rank[k]):
                break
            if all(visit(c) for c in kid_ids[k]):
                out[cls] = k
                break
        on_path.discard(cls)
        return cls in out

    try:
        return all(visit(c) for c in starts)
    finally:
        sys.setrecursionlimit(limit)
        visit = None  # a recursive closure is a reference cycle that would keep its lists alive


def _reuse(root: int, choice: dict[int, int], members: list[list[int]], kid_ids: list[list[int]],
           own: list[float]) -> dict[int, int]:
    """Local improvement of an acyclic choice: a class switches to a node that costs less itself
    and reads only classes the choice already computes (an item of a batched op chosen for
    another member: the fixpoint priced it with the batched op's tree cost, which counts
    upstream work shared with the current node twice). The DAG cost never rises: no new class
    is computed, and the classes only the old node read drop out. A switch that would close a
    cycle is skipped."""
    changed = True
    while changed:
        changed = False
        for c in list(choice):
            if c not in choice:
                continue
            for k in members[c]:
                kids = kid_ids[k]
                if own[k] < own[choice[c]] - 1e-12 and all(j in choice for j in kids) \
                        and not _reaches(kids, c, choice, kid_ids):
                    choice[c] = k
                    changed = True
        if changed:
            choice = reachable(root, kid_ids, choice)
    return choice


def _unbatch(root: int, choice: dict[int, int], members: list[list[int]], kid_ids: list[list[int]],
             own: list[float], item_of: list) -> dict[int, int]:
    """Local improvement by whole tuples: every class the choice takes as an item of one tuple
    switches at once to its cheapest other node whose children the choice already computes,
    where the DAG cost (counted exactly, with the classes that drop out) falls. The fixpoint
    prices an item at a share of its tuple's tree, upstream operands included, so a batch of
    two products can win there while costing more as a DAG than the two products (their
    operands are computed anyway); `_reuse` cannot undo it one class at a time, since the
    tuple stays paid for while another item reads it. A move that only drops views (pieces
    of a split taken as narrows instead) is not taken: such a tie is Inductor's to decide,
    not the cost model's (dhen's split of a fused QKV projection as narrows cost a launch)."""
    refs: dict[int, int] = {}  # chosen class -> edges from chosen nodes (+1 for the root)
    users: dict[int, list[int]] = {}  # tuple class -> classes chosen as one of its items
    for c, i in choice.items():
        for k in kid_ids[i]:
            refs[k] = refs.get(k, 0) + 1
        if item_of[i] is not None:
            users.setdefault(item_of[i][0], []).append(c)
    refs[root] = refs.get(root, 0) + 1
    changed = False
    for p, cs in users.items():
        if not all(refs.get(c, 0) and item_of[choice[c]] is not None and item_of[choice[c]][0] == p for c in cs):
            continue  # an earlier move switched or dropped these classes
        plan = {}
        for c in cs:
            alts = [k for k in members[c] if (item_of[k] is None or item_of[k][0] != p)
                    and all(refs.get(j, 0) and j != c for j in kid_ids[k])]
            if not alts:
                break
            plan[c] = min(alts, key=own.__getitem__)
        if len(plan) != len(cs):
            continue
        delta, counts, freed = _switch_delta(plan, choice, refs, kid_ids, own)
        if delta < -1e-12 and freed:
            new = {**choice, **plan}
            if not any(_reaches(kid_ids[k], c, new, kid_ids) for c, k in plan.items()):
                choice, changed = new, True
                refs.update(counts)
    return reachable(root, kid_ids, choice) if changed else choice


def _swap(root: int, choice: dict[int, int], members: list[list[int]], kid_ids: list[list[int]],
          own: list[float], rank: list[float], item_of: list) -> dict[int, int]:
    """Local search by single switches: a chosen class takes another of its nodes, the classes
    that node needs and the choice lacks get their cheapest acyclic nodes by `rank` (as
    `_select` picks), and the switch is kept where the DAG cost, counted exactly, falls and no
    cycle closes. It undoes what the fixpoint's tree prices get wrong the other way from
    `_unbatch`: a stack of products of a split's pieces chosen over the batched product that
    computes them all, each piece priced at a share of its tuple, the batched product with
    its whole operand tree. A switch that does not lower the cost by itself but leaves a tuple
    read by fewer items is tried once more followed by `_unbatch` (the items still read may
    then be cheaper apart): two batches over one member, where moving the member from one to
    the other needs both changes at once. Each kept switch lowers the cost, so the search ends."""
    refs = _refcounts(root, choice, kid_ids)
    level = _levels(root, choice, kid_ids)
    total = sum(own[i] for i in choice.values())
    isfinite = math.isfinite
    changed = True
    while changed:
        changed = False
        for c in sorted(choice):
            if c not in choice:
                continue  # an earlier switch dropped it
            for k in sorted(members[c], key=rank.__getitem__):
                if not isfinite(rank[k]):
                    break
                if k == choice[c]:
                    continue
                plan = _complete(c, k, choice, members, kid_ids, rank)
                if plan is None:
                    continue
                delta, thinned = _plan_delta(plan, choice, refs, kid_ids, own, item_of)
                if delta > -1e-9 and not thinned:
                    continue
                # (the plan over the choice, not a copy of it: most candidates close a cycle,
                # and copying the choice for each took most of illustrative_10k's 0.8 s here)
                if _reaches(kid_ids[k], c, ChainMap(plan, choice), kid_ids, level):
                    continue
                new = reachable(root, kid_ids, {**choice, **plan})
                if delta > -1e-9:
                    new = _unbatch(root, new, members, kid_ids, own, item_of)
                    if sum(own[i] for i in new.values()) > total - 1e-9:
                        continue
                choice = new
                total = sum(own[i] for i in choice.values())
                refs = _refcounts(root, choice, kid_ids)
                level = _levels(root, choice, kid_ids)
                changed = True
                break
    return choice


def _complete(c: int, k: int, choice: dict[int, int], members: list[list[int]], kid_ids: list[list[int]],
              rank: list[float]) -> dict[int, int] | None:
    """{c: k} plus a node for each class below k that `choice` lacks (`_pick`); None if one
    has none."""
    picked: dict[int, int] = {c: k}
    if not _pick(kid_ids[k], choice, members, kid_ids, rank, picked):
        return None
    plan, todo = {}, [c]  # only what k reads: a failed attempt may have picked more
    while todo:
        x = todo.pop()
        if x in picked and x not in plan:
            plan[x] = picked[x]
            todo.extend(kid_ids[picked[x]])
    return plan


def _refcounts(root: int, choice: dict[int, int], kid_ids: list[list[int]]) -> dict[int, int]:
    """Chosen class -> edges into it from chosen nodes (+1 for the root)."""
    refs = {root: 1}
    for i in choice.values():
        for j in kid_ids[i]:
            refs[j] = refs.get(j, 0) + 1
    return refs


def _plan_delta(plan: dict[int, int], choice: dict[int, int], refs: dict[int, int],
                kid_ids: list[list[int]], own: list[float], item_of: list) -> tuple[float, bool]:
    """The exact DAG cost change of `plan` (class -> node; a class `choice` lacks is added):
    new edges first, then the replaced nodes' edges, dropping the classes nothing reads; and
    whether an item leaves the choice (replaced, or read no more) while its tuple stays read."""
    counts: dict[int, int] = {}
    tuples: list[int] = []  # tuples an item leaving the choice read
    delta = 0.0
    for cls, k in plan.items():
        delta += own[k] - (own[choice[cls]] if cls in choice else 0.0)
        for j in kid_ids[k]:
            counts[j] = counts.get(j, refs.get(j, 0)) + 1
        if cls in choice and item_of[choice[cls]] is not None:
            tuples.append(item_of[choice[cls]][0])  # the replaced node: an item of its tuple
    todo = [j for cls in plan if cls in choice for j in kid_ids[choice[cls]]]
    while todo:
        j = todo.pop()
        counts[j] = left = counts.get(j, refs.get(j, 0)) - 1
        if left == 0:
            i = plan.get(j, choice[j])
            delta -= own[i]
            todo.extend(kid_ids[i])
            if item_of[i] is not None:
                tuples.append(item_of[i][0])
    return delta, any(counts.get(p, refs.get(p, 0)) > 0 for p in tuples)


def _switch_delta(plan: dict[int, int], choice: dict[int, int], refs: dict[int, int],
                  kid_ids: list[list[int]], own: list[float]) -> tuple[float, dict[int, int], bool]:
    """The DAG cost change of switching each class in `plan` to its node (whose children are
    all chosen), the reference counts that change, and whether a node that costs more than a
    view drops out: new edges first, so a class the new nodes read never drops out; then the
    old edges, dropping the classes no chosen node reads."""
    counts: dict[int, int] = {}  # the changed entries of refs
    delta, freed = 0.0, False
    for c, k in plan.items():
        delta += own[k] - own[choice[c]]
        for j in kid_ids[k]:
            counts[j] = counts.get(j, refs[j]) + 1
    todo = [j for c in plan for j in kid_ids[choice[c]]]
    while todo:
        j = todo.pop()
        counts[j] = left = counts.get(j, refs[j]) - 1
        if left == 0:
            i = plan.get(j, choice[j])
            delta -= own[i]
            freed = freed or own[i] > EPS + 1e-12
            todo.extend(kid_ids[i])
    return delta, counts, freed


def _reaches(starts: list[int], target: int, choice: dict[int, int], kid_ids: list[list[int]],
             level: dict[int, int] | None = None) -> bool:
    """Does the chosen graph below `starts` contain class `target`? With `level` (`_levels` of
    a choice that `choice` differs from only in `target`'s node and in classes that one did not
    hold), a class of that choice no higher than `target` is not searched below: it reaches
    `target` only by its old edges, which would put it higher. On illustrative_10k this cut
    _swap's cycle checks from 15 s, each a search of most of the graph, to milliseconds."""
    seen: set[int] = set()
    todo = list(starts)
    floor = level.get(target) if level is not None else None
    while todo:
        c = todo.pop()
        if c == target:
            return True
        if c not in seen:
            seen.add(c)
            if floor is not None and level.get(c, floor + 1) <= floor:
                continue
            todo.extend(kid_ids[choice[c]])
    return False


def _levels(root: int, choice: dict[int, int], kid_ids: list[list[int]]) -> dict[int, int]:
    """Chosen class -> 1 + the highest level of its chosen node's children (0 for a leaf): a
    class reaching another is higher than it."""
    level: dict[int, int] = {}
    todo = [(root, False)]
    while todo:
        c, done = todo.pop()
        if c in level:
            continue
        kids = kid_ids[choice[c]]
        if done:
            level[c] = 1 + max((level[j] for j in kids), default=-1)
            continue
        todo.append((c, True))
        todo.extend((j, False) for j in kids if j not in level)
    return level


def reachable(root, kids, choice: dict) -> dict:
    """The part of `choice` (class -> node) the root actually uses (failed DFS attempts leave
    extra entries); `kids[node]` lists a node's term children. Works on string keys and on
    integer ids alike."""
    keep: dict = {}
    todo = [root]
    while todo:
        c = todo.pop()
        if c not in keep:
            keep[c] = choice[c]
            todo.extend(kids[choice[c]])
    return keep


def _forced(g: Graph, node_cost: Callable[[Node], float]) -> Extraction | None:
    """The extraction of an e-graph whose every class has one node (a freshly seeded one): the
    choice is forced, so only what the root reaches is priced. The same choice, in the same
    order, and the same cost as the fixpoint and `select` give; None if the forced choice has
    a cycle (then no extraction exists, and the general path says so)."""
    choice: dict[str, str] = {}
    kids: dict[str, list[str]] = {}  # class -> its chosen node's term children
    todo = [g.root]
    while todo:  # `reachable`'s traversal, so the order (and the cost's sum) match
        c = todo.pop()
        if c not in choice:
            k = choice[c] = g.classes[c][0]
            todo.extend(kids.setdefault(c, term_children(g, g.nodes[k])))
    # A cycle check: depth-first, a class met again while still open closes a cycle.
    done: set[str] = set()
    open_ = {g.root}
    stack = [(g.root, iter(kids[g.root]))]
    while stack:
        c, below = stack[-1]
        for k in below:
            if k in open_:
                return None
            if k not in done:
                open_.add(k)
                stack.append((k, iter(kids[k])))
                break
        else:
            stack.pop()
            open_.discard(c)
            done.add(c)
    return Extraction(choice, sum(node_cost(g.nodes[k]) + EPS for k in choice.values()))
