"""Tensors derived from parameters, computed once per parameter version at inference.

At batch 1 on a GPU every derived tensor (a reshaped weight with a bias appended, a resampled position
table, a kernel with the residual folded in) costs a launch per forward. At inference the parameters do
not change between calls, so the derived tensor is kept and recomputed only when a parameter is replaced
or updated in place (its data pointer or version counter moves: load_state_dict, optimiser steps, .to()).
Under autograd, torch.compile or tracing it is computed on every call, so gradients flow and graphs stay pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .graph_capture import stateless_call


def derived_at_inference(
    owner: object,
    slot: str,
    params: Iterable[torch.Tensor | None],
    compute: Callable[[], object],
    extra: tuple = (),
) -> object:
    """compute(), kept in ``owner.<slot>`` at inference until one of ``params`` (or ``extra``) changes."""
    if torch.is_grad_enabled() or stateless_call():
        return compute()
    key = (extra, tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params if p is not None))
    cached = getattr(owner, slot, None)
    if cached is None or cached[0] != key:
        cached = (key, compute())
        setattr(owner, slot, cached)
    return cached[1]
