"""Body results as buffers of their own: an Inductor post-grad pass the backend always compiles with.

torch 2.13's Inductor compiles a body graph (a `nested_compile_region`'s invoke_subgraph body,
a torch.cond branch, and the backward bodies AOT autograd derives from them) that returns a
view of one of its own buffers at an offset to wrong values: plain torch.compile of a shared
body that stacks its layer norms' weights (`y * stack(ws)`) trains to wrong weight gradients,
as each weight's gradient is a piece of one buffer the backward body returns. optimus_egg's
rewrites made such bodies (batch_layernorm inside a shared body), which is why optimize() now
rewrites a graph calling a trained shared body only where it is compiled without buffer reuse
(parts.trains_a_shared_body) and copies
a rewritten body's forward results itself (parts.py); the backward bodies exist only inside
Inductor, and a body written that way by hand trains right with this pass (tests/test_body_outputs.py).
This pass, run on each graph Inductor compiles, replaces each view that a body graph
the graph calls returns with a multiplication by one (bool: an and with True), which Inductor
computes into a buffer of its own; a clone would not do, Inductor drops it as a no-op. Values
are unchanged.
"""
from __future__ import annotations

import operator

import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from optimus_egg.gemm_loops import call_with_val

COUNTER = "body_outputs_copied"

aten = torch.ops.aten


def is_view(node: fx.Node) -> bool:
    """Is `node` a view op's result (its schema's result aliases an input and writes nothing),
    or a piece of one (a getitem of an unbind's or split's results)? An op named without its
    overload (`aten.select`, as Inductor's post-grad batch fusions write their results' pieces)
    is a view op if each of its overloads is."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and is_view(node.args[0])
    if isinstance(node.target, torch._ops.OpOverloadPacket):
        overloads = [getattr(node.target, name) for name in node.target.overloads()]
        return bool(overloads) and all(_returns_a_view(o) for o in overloads)
    return isinstance(node.target, torch._ops.OpOverload) and _returns_a_view(node.target)


def _returns_a_view(op: torch._ops.OpOverload) -> bool:
    alias = op._schema.returns[0].alias_info if op._schema.returns else None
    return alias is not None and not alias.is_write


def copy_view_results(body: fx.GraphModule) -> int:
    """Replace each view `body` returns with a computed copy; returns how many."""
    graph = body.graph
    out = graph.output_node()
    done = 0
    for node in list(dict.fromkeys(out.all_input_nodes)):
        val = node.meta.get("val")
        if not is_view(node) or not isinstance(val, torch.Tensor):
            continue
        with graph.inserting_before(out):
            if val.dtype == torch.bool:
                copied = call_with_val(graph, aten.bitwise_and.Scalar, (node, True))
            else:
                copied = call_with_val(graph, aten.mul.Tensor, (node, 1))
        out.replace_input_with(node, copied)
        done += 1
    if done:
        body.recompile()
    return done


def rewrite(graph: fx.Graph) -> int:
    """Copy the view results of every body graph `graph` reads (module doc); returns how many."""
    owner = graph.owning_module
    if owner is None:
        return 0
    bodies = {}
    for node in graph.find_nodes(op="get_attr"):
        body = getattr(owner, node.target, None)
        if isinstance(body, fx.GraphModule):
            bodies[id(body)] = body
    done = sum(copy_view_results(b) for b in bodies.values())
    counters["inductor"][COUNTER] += done
    return done


class BodyOutputs(CustomGraphPass):
    """`rewrite` as an Inductor post-grad pass (its uuid keys Inductor's cache)."""

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph)

    def uuid(self) -> str:
        return "optimus_egg.body_outputs:" + get_hash_for_files((__file__,)).hex()


BODY_OUTPUTS = BodyOutputs()
