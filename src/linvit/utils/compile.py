"""torch.compile for linvit's commands: one static graph per (batch, resolution), CUDA graphs made safe.

Every linvit family compiles as one graph without breaks (tests/test_compile.py), so eager Python and
per-operator launches, which bound small-batch GPU latency, disappear. Two inference conveniences stay
eager: token chunking turns off inside a compiled graph (a compiled model at a very large input takes the
whole-tensor path), and ``check_finite=True`` reads the input on the host, which splits the graph in two
(an error with fullgraph=True).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UsageError

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


class CudaGraphSafe(nn.Module):
    """Wraps a module compiled with CUDA graphs ("reduce-overhead"): marks each call as a new step and
    clones the outputs, which otherwise live in the graph's static buffers and are overwritten by the
    next replay."""

    def __init__(self, compiled: nn.Module) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = self.compiled(*args, **kwargs)
        return out.clone() if isinstance(out, torch.Tensor) else torch.utils._pytree.tree_map(_clone, out)


def _clone(t):
    return t.clone() if isinstance(t, torch.Tensor) else t


def compile_model(model: nn.Module, mode: str = "off", *, fullgraph: bool = False) -> nn.Module:
    """model unchanged for "off", else torch.compile(model, mode=mode, dynamic=False) (static shapes:
    one graph per input size, as inference and fixed-crop training use). The returned module shares
    the parameters of ``model``; keep using ``model`` for state dicts and checkpoints."""
    if mode not in COMPILE_MODES:
        raise UsageError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "off":
        return model
    compiled = torch.compile(model, mode=None if mode == "default" else mode, dynamic=False, fullgraph=fullgraph)
    return CudaGraphSafe(compiled) if mode == "reduce-overhead" else compiled
