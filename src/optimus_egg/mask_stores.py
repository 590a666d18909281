"""Saved masks stored as bytes: an Inductor post-grad pass the backend compiles with (`mask_stores`, on by default).

In training, AOT autograd's partitioner often saves a comparison for the backward, the bool
mask of a ReLU (`x <= 0`, read by threshold_backward), because one byte per element is less to
keep than the float it comes from. Inductor's C++ code writes a vectorized compare to a bool
buffer through VecMask::store, which converts the lanes one by one: on the bench machine (x86,
AVX-512, torch 2.13, 1 thread) storing 8,192 of them took 68-100 us, where the scalar loop
takes 3.2 us and a ReLU of the same floats 0.9 us (bench/mask_stores.py measures it). The same
mask converted to int32, then uint8, and stored as bytes took 8.6 us; reinterpreted as bool
(a view, no copy) it is the tensor the backward expects, bit for bit.

This pass rewrites, in a CPU graph Inductor compiles (forward and backward), each graph output
that a pointwise op computes as bool into that chain: `view(convert(convert(m, int32), uint8),
bool)`. Only graph outputs: they are always stored, while a mask read inside the graph is
usually fused into its reader and never stored. Values are unchanged (True is 1, False is 0).
A mask whose chain would get other strides than the original is left alone: the backward
graph asserts the strides of what it is given.
"""
from __future__ import annotations


import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from optimus_egg.gemm_loops import call_with_val

COUNTER = "mask_stores_as_bytes"

aten, prims = torch.ops.aten, torch.ops.prims


def stored_mask(node: fx.Node) -> bool:
    """Is `node` a bool CPU tensor computed by a pointwise op (a fresh tensor, no view)?"""
    val = node.meta.get("val")
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags
            and isinstance(val, torch.Tensor) and val.dtype == torch.bool and val.device.type == "cpu")


def rewrite(graph: fx.Graph) -> int:
    """Store each bool graph output of a pointwise op as bytes (module doc); returns how many."""
    out = graph.output_node()
    done = 0
    for node in list(dict.fromkeys(out.all_input_nodes)):
        if not stored_mask(node):
            continue
        with graph.inserting_before(out):
            as_int = call_with_val(graph, prims.convert_element_type.default, (node, torch.int32))
            as_bytes = call_with_val(graph, prims.convert_element_type.default, (as_int, torch.uint8))
            mask = call_with_val(graph, aten.view.dtype, (as_bytes, torch.bool))
        if mask.meta["val"].stride() != node.meta["val"].stride():
            for n in (mask, as_bytes, as_int):
                graph.erase_node(n)
            continue
        out.replace_input_with(node, mask)
        done += 1
    counters["inductor"][COUNTER] += done
    return done


class MaskStores(CustomGraphPass):
    """`rewrite` as an Inductor post-grad pass (its uuid keys Inductor's cache)."""

    def __call__(self, graph: fx.Graph) -> None:
        rewrite(graph)

    def uuid(self) -> str:
        return "optimus_egg.mask_stores:" + get_hash_for_files((__file__,)).hex()


MASK_STORES = MaskStores()
