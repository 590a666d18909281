"""Seeding an egglog e-graph from the text of many actions, fast.

from_fx writes its facts as egglog text (`(union (node 7) (linear (node 6) (input "w")
(input "b")))`); `register_text` runs them all in one pass. Building the same e-graph
through egglog-python expressions, or handing egglog one action at a time, is quadratic or
close to it on big graphs (see register_text).
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import tempfile
from typing import Any

from egglog import EGraph, bindings

from optimus_egg import sorts


class _Outside(Exception):
    """An action outside the grammar `_seed_actions` builds objects for."""


def quote(s: str) -> str:
    """`s` as an egglog string literal."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


_SEED_CHUNK = 50  # actions per seeding rule: egglog's type checker is superlinear in a rule's
# size, and each top-level action costs a pass over the e-graph, so actions go in small rules.


def register_text(egraph: EGraph, actions: list[str], lets: dict[str, str] | None = None,
                  uses: dict[int, tuple[str, ...]] | None = None) -> None:
    """Run egglog actions (text) in one pass; much faster than building Python exprs.

    Most actions share a few shapes (`(union (node 7) (linear (node 6) (input "w") (input
    "b")))`: the same text up to its int, float and string literals). Each shape that occurs
    at least _TABLE_MIN times becomes a relation whose rows are those literals, read by
    egglog's `input` command from a tab-separated file, and one rule that performs the action
    for each row (and deletes the row). egglog compiles that rule once instead of type-checking
    every action (measured on the 10,000-node bench graph: egglog takes 0.2 s instead of 2.1 s).

    The other actions go in seeding rules of _SEED_CHUNK actions each. `lets` names terms
    that actions refer to by a variable (a split's Pieces, which each of its items would
    otherwise repeat with its whole size list); `uses[i]` lists the variables action i reads.
    Each seeding rule binds the variables its actions read once, with a rule-local `let`, so
    the term is built once per rule, not once per item.

    The program goes to egglog as a file (`include`): egglog parses it natively, and its
    source spans share one copy of the text. (Parsing through `parse_program` hands every
    sub-term's span to Python with the whole text, which egglog then keeps with each rule:
    quadratic memory, ~1.8 GB for a 10,000-node graph.) If no temporary file can be written,
    the text is turned into egglog's command objects here (`_seed_actions`), or, for actions
    outside that simple grammar, parsed in chunks.
    """
    lets, uses = lets or {}, uses or {}
    for fn in sorts.DECLARED:
        egraph._callable_to_egg(fn)
    run = egraph._egraph.run_program
    parse = egraph._egraph.parse_program
    run(*parse("(ruleset optimus_egg_seed)"))
    folder = _write_seed_program(actions, lets, uses)
    if folder is not None:
        try:
            run(bindings.Include(_SPAN, os.path.join(folder, _PROGRAM)))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        actions = _inline_lets(actions, lets, uses)
        with no_gc():  # ~10^5 short-lived objects; collections would rescan the whole heap
            built = _seed_actions(actions)
            if built is None:
                for k in range(0, len(actions), 10):
                    run(*parse(f"(rule () ({' '.join(actions[k:k + 10])}) :ruleset optimus_egg_seed)"))
            else:
                for k in range(0, len(built), _SEED_CHUNK):
                    run(bindings.RuleCommand(bindings.Rule(_SPAN, built[k:k + _SEED_CHUNK], [], "", "optimus_egg_seed")))
                del built
    run(*parse("(run optimus_egg_seed 1)"))


_TABLE_MIN = 8  # actions of one shape that make a table (fewer go in seeding rules)
_PROGRAM = "seed.egg"
# Literals. Numbers follow a blank (never a term's head) and end at a blank or paren; a
# float always has a '.' or an exponent (repr). re.split with this pattern (one capture group)
# alternates an action's text and its literals; a string is matched whole first, so digits
# inside it are never numbers. A string is safe for a table if egglog's `input` reads it back
# exactly: not empty, not blank-padded, no tab, newline, NUL or escape.
_LITERALS = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*"'
                       r'|(?<= )-?[0-9]+(?:\.[0-9]+(?:e[-+]?[0-9]+)?|e[-+]?[0-9]+)?(?=[ )]))')
_UNSAFE_STRING = re.compile(r'\A""\Z|\A"\s|\s"\Z|[\\\t\n\r\0]')
_COLUMN = {"i": "i64", "f": "f64", "s": "String"}


def _tabulate(actions: list[str], uses: dict[int, tuple[str, ...]]):
    """Group actions by shape: returns ({shape: rows}, indices of the actions left as text).

    A shape is the action's text with each literal replaced by a NUL and its type letter (s,
    f, i); a row is the literals' text, tab-separated, strings without their quotes. Actions
    that read a let variable, or hold a string that is not safe for a table, stay text.
    """
    shapes: dict[str, tuple[list[int], list[str]]] = {}
    rest = []
    split, unsafe = _LITERALS.split, _UNSAFE_STRING.search
    for i, a in enumerate(actions):
        if i in uses:
            rest.append(i)
            continue
        parts = split(a)
        shape = parts[0]
        for k in range(1, len(parts), 2):
            lit = parts[k]
            if lit[0] == '"':
                if unsafe(lit):
                    break
                shape += "\0s" + parts[k + 1]
            elif "." in lit or "e" in lit:
                shape += "\0f" + parts[k + 1]
            else:
                shape += "\0i" + parts[k + 1]
        else:
            entry = shapes.get(shape)
            if entry is None:
                entry = shapes[shape] = ([], [])
            entry[0].append(i)
            entry[1].append("\t".join(parts[1::2]).replace('"', ""))
            continue
        rest.append(i)
    tables = {}
    for shape, (indices, rows) in shapes.items():
        if len(rows) >= _TABLE_MIN and "\0" in shape:
            tables[shape] = rows
        else:
            rest.extend(indices)
    rest.sort()
    return tables, rest


def _table_program(k: int, shape: str, path: str) -> str:
    """The relation, rule and input command that perform `shape`'s action for each row."""
    types = [_COLUMN[t] for t in re.findall(r"\0(.)", shape)]
    cols = [f"c{j}" for j in range(len(types))]
    it = iter(cols)
    action = re.sub(r"\0.", lambda m: next(it), shape)
    rel = f"optimus_egg_rows_{k}"
    atom = f"({rel} {' '.join(cols)})"
    return (f"(relation {rel} ({' '.join(types)}))\n"
            f"(rule ({atom}) ({action} (delete {atom})) :ruleset optimus_egg_seed :name \"{rel}\")\n"
            f"(input {rel} {quote(path)})\n")


def _seed_rules(actions: list[str], lets: dict[str, str], uses: dict[int, tuple[str, ...]],
                indices=None):
    """The seeding rules' text: _SEED_CHUNK actions each, with the lets their actions read."""
    indices = range(len(actions)) if indices is None else indices
    for k in range(0, len(indices), _SEED_CHUNK):
        body, bound = [], set()
        for i in indices[k:k + _SEED_CHUNK]:
            for v in uses.get(i, ()):
                if v not in bound:
                    bound.add(v)
                    body.append(f"(let {v} {lets[v]})")
            body.append(actions[i])
        yield f"(rule () ({' '.join(body)}) :ruleset optimus_egg_seed :name \"optimus_egg_seed_{k}\")\n"


def _write_seed_program(actions, lets, uses) -> str | None:
    """A temporary folder holding the seeding program (_PROGRAM) and its tables, or None if
    none can be written."""
    try:
        folder = tempfile.mkdtemp(prefix="optimus_egg_seed_")
    except OSError:
        return None
    try:
        tables, rest = _tabulate(actions, uses)
        with open(os.path.join(folder, _PROGRAM), "w", encoding="utf-8") as f:
            for k, (shape, rows) in enumerate(tables.items()):
                path = os.path.join(folder, f"rows_{k}.tsv")
                with open(path, "w", encoding="utf-8") as t:
                    t.writelines(r + "\n" for r in rows)
                f.write(_table_program(k, shape, path))
            f.writelines(_seed_rules(actions, lets, uses, rest))
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


def _inline_lets(actions: list[str], lets: dict[str, str], uses: dict[int, tuple[str, ...]]) -> list[str]:
    """`actions` with each let variable replaced by its term (outside string literals)."""
    if not uses:
        return actions
    out = list(actions)
    for i, names in uses.items():
        pattern = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![^\s()])(' + "|".join(map(re.escape, names)) + r')(?![^\s()])')
        out[i] = pattern.sub(lambda m: lets[m.group(1)] if m.group(1) else m.group(0), out[i])
    return out


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic garbage collector (bulk construction of acyclic data)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_SPAN = bindings.PanicSpan()
# A flat term `(f a b ...)` of atoms (strings without blanks or parens), an open or close
# paren, or an atom.
_TOKEN = re.compile(r'(\([^\s()"]+(?: (?:[^\s()"]+|"(?:[^"\\\s()]|\\.)*"))*\))|(\()|(\))|("(?:[^"\\]|\\.)*"|[^\s()"]+)')
_INT = re.compile(r"-?[0-9]+\Z")
_FLOAT = re.compile(r"-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?\Z")
_UNESCAPE = re.compile(r"\\(.)")
_ACTION_WORDS = {"let", "delete", "subsume", "panic", "extract", "change", "set", "union"}


def _atom(t: str):
    if t[0] == '"':
        if len(t) < 2 or t[-1] != '"':
            return None
        return bindings.Lit(_SPAN, bindings.String(_UNESCAPE.sub(r"\1", t[1:-1])))
    if _INT.match(t):
        return bindings.Lit(_SPAN, bindings.Int(int(t)))
    if _FLOAT.match(t):
        return bindings.Lit(_SPAN, bindings.Float(float(t)))
    return None  # a global or a keyword: left to egglog's parser


def _seed_actions(actions: list[str]) -> list | None:
    """egglog action objects for `(union a b)`, `(set (f ..) v)` and `(f ..)` actions over
    calls and int / float / string literals; None if any action is outside that grammar.
    Repeated flat terms and atoms (`(node 7)`, a split's size Vec) are built once and shared."""
    terms: dict[str, Any] = {}
    atoms: dict[str, Any] = {}
    Call, SPAN = bindings.Call, _SPAN
    out = []

    def atom(t):
        a = atoms.get(t)
        if a is None:
            a = atoms[t] = _atom(t)
            if a is None:
                raise _Outside(t)
        return a

    def flat_term(text):
        c = terms.get(text)
        if c is None:
            head, *args = text[1:-1].split()
            if head in _ACTION_WORDS:
                raise _Outside(text)
            c = terms[text] = Call(SPAN, head, [atom(a) for a in args])
        return c

    def action(head, args):
        if head == "union" and len(args) == 2:
            return bindings.Union(SPAN, args[0], args[1])
        if head == "set" and len(args) == 2 and isinstance(args[0], bindings.Call):
            return bindings.Set(SPAN, args[0].name, args[0].args, args[1])
        if head in _ACTION_WORDS:
            raise _Outside(head)
        return bindings.Expr_(SPAN, Call(SPAN, head, args))

    try:
        for text in actions:
            stack: list[list] = []
            for flat, opening, closing, tok in _TOKEN.findall(text):
                if flat:
                    if not stack:
                        c = flat_term(flat)
                        out.append(action(c.name, c.args))
                    else:
                        stack[-1][1].append(flat_term(flat))
                elif opening:
                    stack.append([None, []])
                elif closing:
                    head, args = stack.pop()
                    if head is None:
                        raise _Outside(text)
                    if stack:
                        if head in _ACTION_WORDS:
                            raise _Outside(head)
                        stack[-1][1].append(Call(SPAN, head, args))
                    else:
                        out.append(action(head, args))
                elif not stack:
                    raise _Outside(text)  # a bare atom at top level
                elif stack[-1][0] is None:
                    stack[-1][0] = tok
                else:
                    stack[-1][1].append(atom(tok))
            if stack:
                raise _Outside(text)
    except (_Outside, ValueError, IndexError):
        return None
    return out
