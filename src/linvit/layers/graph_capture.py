"""How linvit's modules behave when a tool captures them as a graph instead of running them eagerly.

torch.compile / torch.export, torch.fx.symbolic_trace (torchvision's create_feature_extractor) and TorchScript
(torch.jit.trace and torch.jit.script) each see the same modules; eager-only conveniences (token chunking, input
checks, autocast guards) step aside for them.

Scripting. torch.jit.script compiles forward and everything it calls, except the body of an
``if not torch.jit.is_scripting():`` block (or of ``if cond and not torch.jit.is_scripting():``), which it parses
but never compiles. linvit keeps its eager-only Python in such blocks, each followed by the plain computation the
scripted graph runs, so every formula still has one definition. Such a block must hold TorchScript syntax (no
try, import, lambda or nested def; anything else goes into a helper called from it). TorchScript cannot call
super() either: a subclass calls the parent's method through ``parent_method`` instead.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch


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
