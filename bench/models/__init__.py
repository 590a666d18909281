"""Benchmark model zoo: recommendation-style architectures written from their papers'
descriptions, plus a production-shaped generator.

    from optimus_egg.models import MODELS, build
    module, example_inputs = build("dlrm")
    module, example_inputs = build("illustrative", features=64, depth=2)

Every factory takes keyword arguments (sizes, ``batch``, ``seed``) with small defaults and
returns ``(module, example_inputs)``: the module in its default (train) mode with no
dropout anywhere, and a tuple of deterministic CPU tensors (float32, except DLRM's int64
embedding indices/offsets). Every module traces with ``torch.fx.symbolic_trace``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from . import dcn_v2, dhen, dlrm, hstu, interformer, masknet, mmoe, parallel_mlp, wukong
from .generator import fx_node_count, illustrative, illustrative_1k, illustrative_10k

Factory = Callable[..., "tuple[nn.Module, tuple[torch.Tensor, ...]]"]

MODELS: dict[str, Factory] = {
    "parallel_mlp": parallel_mlp.make,
    "dlrm": dlrm.make,
    "dcn_v2": dcn_v2.make,
    "wukong": wukong.make,
    "dhen": dhen.make,
    "masknet": masknet.make,
    "interformer": interformer.make,
    "hstu": hstu.make,
    "mmoe": mmoe.make,
    "illustrative": illustrative,
    "illustrative_1k": illustrative_1k,
    "illustrative_10k": illustrative_10k,
}


def build(name: str, **kw) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build registry entry ``name``; keyword arguments go to its factory."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}"
        ) from None
    return factory(**kw)


__all__ = ["MODELS", "build", "fx_node_count", "illustrative"]
