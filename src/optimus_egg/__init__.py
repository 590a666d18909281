"""optimus_egg: equality-saturation graph optimizer for PyTorch FX graphs.

    fast = optimus_egg.optimize(gm, example_inputs, budget_s=1.0)
    compiled = torch.compile(model, backend="optimus_egg")
"""
from optimus_egg.ablation import rewrite_greedily
from optimus_egg.backend import backend, optimus_egg_backend
from optimus_egg.bisect import bisect
from optimus_egg.ops import to_folder
from optimus_egg.pipeline import Report, optimize
from optimus_egg.saturate import Limits

__all__ = ["Limits", "Report", "backend", "bisect", "optimize", "optimus_egg_backend", "rewrite_greedily", "to_folder"]
__version__ = "0.1.0"
