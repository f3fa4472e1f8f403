"""How linvit's modules behave when a tool captures them as a graph instead of running them eagerly.

torch.compile / torch.export, torch.fx.symbolic_trace (torchvision's create_feature_extractor) and TorchScript
(torch.jit.trace and torch.jit.script) each see the same modules; eager-only conveniences (token chunking, input
checks, autocast guards) step aside for them.

Scripting. torch.jit.script compiles forward and everything it calls, except the body of an
``if not torch.jit.is_scripting():`` block (or of ``if cond and not torch.jit.is_scripting():``), which it parses
but never compiles. linvit keeps its eager-only Python in such blocks, each followed by the plain computation the
scripted graph runs, so every formula still has one definition, and each formula has at most one such block.
Such a block must hold TorchScript syntax (no try, import, lambda, nested def or f-string conversion; anything
else goes into a helper called from it). TorchScript cannot call super() either: a subclass calls the parent's
method through ``parent_method`` instead. The questions scripted code may ask too (stateless_call, is_fx_tracing,
ops.common.is_exporting) hold their block themselves, so their callers need none, and
ops.common.eager_autocast_off is the one block of every formula that runs with autocast off.

FX. Proxies carry no sizes, so size-dependent Python stays out of traced graphs: each InfSA and dynamic-weight
layer is one node (call_eagerly), and so is a ViT's resampled position table (traced_pos_embed).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from timm.layers import register_notrace_function, resample_abs_pos_embed


def stateless_call() -> bool:
    """True inside torch.compile, torch.export, TorchScript (scripted or traced) or an FX symbolic trace: input
    checks and size-dependent eager paths stay out of graphs."""
    if not torch.jit.is_scripting():
        return torch.compiler.is_compiling() or torch.jit.is_tracing() or is_fx_tracing()
    return True


def is_fx_tracing() -> bool:
    """torch.fx.symbolic_trace (torchvision's create_feature_extractor) is running: values are Proxies."""
    if not torch.jit.is_scripting():
        return _fx_symbolic_tracing()
    return False


def _fx_symbolic_tracing() -> bool:
    """torch >= 2.9 tells symbolic tracing apart (is_fx_symbolic_tracing); before, is_fx_tracing meant just that."""
    trace = torch.fx._symbolic_trace
    return trace.is_fx_symbolic_tracing() if hasattr(trace, "is_fx_symbolic_tracing") else trace.is_fx_tracing()


def call_eagerly(module: torch.nn.Module, *args):
    """module(*args) as one node of an FX graph (each calling module registers it with torch.fx.wrap).

    Under torch.fx.symbolic_trace the InfSA and dynamic-weight layers return this call instead of tracing
    their size- and dtype-dependent Python (which FX proxies cannot evaluate); when the graph runs, the
    layer's ordinary forward runs, so results and gradients are the eager ones.
    """
    return module(*args)


def parent_method(method: Callable, name: str) -> Callable:
    """``method`` (a parent class's function) under another name, to be set as a class attribute ``name``.

    ``self.<name>(...)`` then runs the parent's code in eager mode and compiles as a method of the subclass
    under TorchScript, which has no super() (a plain alias keeps the function's own name, which TorchScript
    would compile as a second ``forward``).
    """
    copy = types.FunctionType(method.__code__, method.__globals__, name, method.__defaults__, method.__closure__)
    copy.__kwdefaults__, copy.__annotations__ = method.__kwdefaults__, dict(method.__annotations__)
    copy.__qualname__, copy.__module__, copy.__doc__ = name, method.__module__, method.__doc__
    return copy


def traced_pos_embed(vit: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """timm's dynamic-size VisionTransformer._pos_embed for FX tracing, with the table from
    resampled_position_table (one FX node: the resampling needs concrete sizes)."""
    B, H, W, C = x.shape
    prefix = 0 if vit.no_embed_class else vit.num_prefix_tokens
    gh, gw = vit.patch_embed.grid_size
    pos = resampled_position_table(vit.pos_embed, x, [gh, gw], prefix)
    x = x.view(B, H * W, C)
    prefix_tokens = [t.expand(B, -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
    if vit.no_embed_class:  # as timm: add, then prepend the prefix tokens (or prepend, then add)
        x = x + pos
    if prefix_tokens:
        x = torch.cat([*prefix_tokens, x], dim=1)
    if not vit.no_embed_class:
        x = x + pos
    return vit.pos_drop(x)


def resampled_position_table(pos_embed: torch.Tensor, x: torch.Tensor, grid: list[int], prefix: int) -> torch.Tensor:
    """The position table resampled (timm's bicubic) from the trained grid to x's (B, H, W, C) token grid.

    An FX leaf in traced graphs; written so that TorchScript compiles it too (FX graph, then torch.jit.script).
    """
    return resample_abs_pos_embed(pos_embed, [x.shape[1], x.shape[2]], grid, num_prefix_tokens=prefix)


torch.fx.wrap("resampled_position_table")
register_notrace_function(resampled_position_table)  # the same in timm's FX helpers
