"""Parameter stacks built once: inference graphs compiled without the per-call copies of weights.

A batched linear or layer norm reads its members' weights stacked (`torch.stack`, `torch.cat`,
`ops.stack_bias` of parameters), and so does Optimus's: a copy of every weight on every call,
though in inference no parameter changes between calls. On the bench models compiled for the
CPU that copy was most of what batching cost: masknet's optimus_egg graph ran 0.98 x plain
Inductor with it and 0.78 x without, parallel_mlp 0.99 x and 0.78 x, one C++ kernel fewer
each (`python bench/hoist.py`; README, Design).

`plan` finds the part of a graph computed from parameters alone (`_COPIES` and `_VIEWS` ops
over parameter placeholders or `get_attr` parameters that the graph never writes into) and
the copies in it whose results the rest of the graph reads (not what it returns, nor any copy
of a parameter it writes into); `compile_hoisted` computes those
apart, compiles the rest with them as extra inputs, and returns a `Hoisted` callable that
computes them again before a call where any parameter they read is another tensor, has other
storage (`data_ptr`, as after `p.data = ...`) or another version (an in-place write into the
parameter bumps it: an optimizer step, `load_state_dict`, `p.add_(1)` under no_grad; one through
`p.data`, whose tensor counts its own versions, does not, and is not seen: README, Not promised). Views of parameters stay
in the graph (free there). Inference only: a graph that computes gradients needs the stacks
in it, as autograd nodes. The backend does this unless `backend(hoist=False)`, and not for a CUDA
graph with CUDA graphs on (Inductor would copy each hoisted input into its static buffer on every
replay).
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from optimus_egg import ops

# Ops that make a fresh tensor of their operands: worth computing once.
_COPIES = {torch.cat, torch.concat, torch.concatenate, torch.stack, ops.stack_bias, torch.clone}
_COPY_METHODS = {"contiguous", "clone"}
# Ops that only view or reshape: computed from parameters, kept in the graph, or read on the way to a copy.
_VIEWS = {torch.transpose, torch.t, torch.permute, torch.reshape, torch.flatten, torch.unflatten, torch.unsqueeze,
          torch.squeeze, torch.movedim, operator.getitem}
_VIEW_METHODS = {"t", "transpose", "permute", "reshape", "view", "flatten", "unflatten", "unsqueeze", "squeeze",
                 "movedim", "expand"}
# The same ops by name, as the e-graph's call templates name them (pipeline._fixed_node).
VIEW_NAMES = _VIEW_METHODS | {"getitem"}


@dataclass(frozen=True)
class Plan:
    """What `compile_hoisted` computes apart: `sources`, the parameters read, each ("arg", index
    into the graph's inputs) or ("attr", get_attr target); `nodes`, the nodes computed from
    them, in graph order; `outputs`, those of `nodes` the rest of the graph reads."""

    sources: tuple[tuple[str, Any], ...]
    source_nodes: tuple[fx.Node, ...]
    nodes: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]


def _is_copy(n: fx.Node) -> bool:
    return (n.op == "call_function" and n.target in _COPIES) or (n.op == "call_method" and n.target in _COPY_METHODS)


def _is_view(n: fx.Node) -> bool:
    return (n.op == "call_function" and n.target in _VIEWS) or (n.op == "call_method" and n.target in _VIEW_METHODS)


def _parameter_sources(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> dict[fx.Node, tuple[str, Any]]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out: dict[fx.Node, tuple[str, Any]] = {}
    for i, (n, x) in enumerate(zip(placeholders, example_inputs)):
        if isinstance(x, torch.nn.Parameter):
            out[n] = ("arg", i)
    params = parameter_names(gm)
    for n in gm.graph.nodes:
        if n.op == "get_attr" and n.target in params:
            out[n] = ("attr", n.target)
    return out


def parameter_names(gm: fx.GraphModule) -> set[str]:
    """The qualified name of each parameter of `gm` (a shared one under each of its names): what
    `gm.get_parameter` finds, in one walk of the modules instead of one per name."""
    return {name for name, _ in gm.named_parameters(remove_duplicate=False)}


def fixed_parameters(gm: fx.GraphModule, example_inputs: Sequence[Any]
                     ) -> tuple[dict[fx.Node, tuple[str, Any]], set[fx.Node]]:
    """The parameters of `gm` (placeholders and `get_attr` nodes: their `Plan.sources` entries)
    that the graph never writes into, and the nodes it writes into."""
    from optimus_egg.from_fx import _submodules, is_mutation, written_aliases

    sources = _parameter_sources(gm, example_inputs)
    if not sources:
        return {}, set()
    modules = _submodules(gm)
    mutated = [n for n in gm.graph.nodes if is_mutation(n, modules)]
    written = written_aliases(gm.graph, modules, mutated) if mutated else set()
    return {n: s for n, s in sources.items() if n not in written}, written


def plan(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Plan | None:
    """The parameter-only copies of `gm` worth computing once (None: there are none)."""
    sources, written = fixed_parameters(gm, example_inputs)
    if not sources:
        return None
    # What the graph returns, and what that views: a fresh tensor each call, never one kept.
    returned: set[fx.Node] = set()
    todo = [a for n in gm.graph.nodes if n.op == "output" for a in n.all_input_nodes]
    while todo:
        n = todo.pop()
        if n not in returned:
            returned.add(n)
            if _is_view(n):
                todo.extend(n.all_input_nodes)
    # Nodes computed from sources alone by copies and views.
    region: set[fx.Node] = set(sources)
    for n in gm.graph.nodes:
        if n not in written and n not in returned and (_is_copy(n) or _is_view(n)) and n.all_input_nodes \
                and all(a in region for a in n.all_input_nodes):
            region.add(n)
    # The copies and what they read; the rest of the region (views downstream) stays in the graph.
    hoisted: set[fx.Node] = set()
    todo = [n for n in region if _is_copy(n)]
    while todo:
        n = todo.pop()
        if n not in hoisted and n not in sources:
            hoisted.add(n)
            todo.extend(n.all_input_nodes)
    outputs = [n for n in gm.graph.nodes if n in hoisted and any(u not in hoisted for u in n.users)]
    if not outputs:
        return None
    read = {a for n in hoisted for a in n.all_input_nodes if a in sources}
    source_nodes = tuple(n for n in gm.graph.nodes if n in read)
    return Plan(tuple(sources[n] for n in source_nodes), source_nodes,
                tuple(n for n in gm.graph.nodes if n in hoisted), tuple(outputs))


def split(gm: fx.GraphModule, p: Plan) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(prologue, main): the prologue takes the plan's sources' values and returns its outputs;
    main is `gm` reading those outputs as extra inputs after its own."""
    pro = fx.Graph()
    env: dict[fx.Node, fx.Node] = {n: pro.placeholder(f"source_{i}") for i, n in enumerate(p.source_nodes)}
    for n in p.nodes:
        env[n] = pro.node_copy(n, env.__getitem__)
    pro.output(tuple(env[n] for n in p.outputs))
    prologue = fx.GraphModule(torch.nn.Module(), pro)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        raise ValueError("hoist.split: a graph without inputs")
    graph = fx.Graph()
    remap: dict[fx.Node, fx.Node] = {}
    for n in gm.graph.nodes:
        if n not in p.nodes:
            remap[n] = graph.node_copy(n, remap.__getitem__)
        if n is placeholders[-1]:  # the hoisted values come after the graph's own inputs
            for k, out in enumerate(p.outputs):
                remap[out] = graph.placeholder(f"hoisted_{k}")
                remap[out].meta.update({key: out.meta[key] for key in ("val", "example_value", "tensor_meta")
                                        if key in out.meta})
    for n in list(graph.nodes):  # parameters only the prologue reads
        if n.op == "get_attr" and not n.users:
            graph.erase_node(n)
    main = fx.GraphModule(gm, graph)
    main.meta.update(gm.meta)
    return prologue, main


class Hoisted:
    """`compiled` (main's compiled callable) fed the prologue's results, computed again when a
    parameter they read changed. Called as Inductor's compile_fx result is, `fn(*inputs)`."""

    def __init__(self, prologue: fx.GraphModule, p: Plan, module: torch.nn.Module):
        self.compiled: Callable[..., Any] | None = None
        self.prologue, self.plan = prologue, p
        # get_attr parameters, looked up once: the compiled graph holds the objects it was
        # compiled with too (AOT autograd lifts them then); their in-place changes count.
        self._attrs = [module.get_parameter(where) if kind == "attr" else None for kind, where in p.sources]
        self._args = [(i, where) for i, (kind, where) in enumerate(p.sources) if kind == "arg"]
        self.values: list[torch.Tensor] = []
        self._read: list[torch.Tensor] = []
        self._versions: list[int] = []
        self._pointers: list[int] = []
        self.computed = 0  # times the prologue ran (the first, at compile time, included)

    def refresh(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """The hoisted values for these inputs, computed again if a parameter they read changed."""
        sources = self._attrs
        if self._args:
            sources = list(sources)
            for i, where in self._args:
                sources[i] = args[where]
        if (not self._read or [t._version for t in sources] != self._versions
                or [t.data_ptr() for t in sources] != self._pointers
                or (self._args and any(sources[i] is not self._read[i] for i, _ in self._args))):
            with torch.no_grad():
                self.values = list(self.prologue(*sources))
            self._read = list(sources)
            self._versions = [t._version for t in sources]
            self._pointers = [t.data_ptr() for t in sources]
            self.computed += 1
        return self.values

    def __call__(self, *args: Any) -> Any:
        return self.compiled(*args, *self.refresh(args))


def compile_hoisted(gm: fx.GraphModule, example_inputs: Sequence[Any],
                    compile_fn: Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]) -> Hoisted | None:
    """`compile_fn(main, inputs + hoisted values)` wrapped in a `Hoisted`, or None where `gm`
    has no parameter-only copy (compile it as it is). Where the inputs are fake (Dynamo's), the
    hoisted values are handed over as fakes of their mode with static shapes: Inductor would
    otherwise fake each real one with fresh symbols for its sizes, symbols no Dynamo input is
    the source of, which fail Dynamo's shape guards ("sources must not be empty")."""
    p = plan(gm, example_inputs)
    if p is None:
        return None
    prologue, main = split(gm, p)
    hoisted = Hoisted(prologue, p, gm)
    values = hoisted.refresh(example_inputs)
    mode = torch._guards.detect_fake_mode(example_inputs)
    if mode is not None:
        values = [v if isinstance(v, FakeTensor) or not isinstance(v, torch.Tensor)
                  else mode.from_tensor(v, static_shapes=True) for v in values]
    hoisted.compiled = compile_fn(main, [*example_inputs, *values])
    return hoisted


def grads_needed(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Would compiling `gm` now trace a backward (grad mode on and an input or parameter that
    requires grad)? Then its stacks stay in it."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) or any(
        p.requires_grad for p in gm.parameters())
