"""Helpers shared by the attention ops: argument checks, gamma broadcasting, float32 accumulation."""

from __future__ import annotations

import contextlib

import torch

GammaLike = float | torch.Tensor


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError unless q, k, v are (B, H, N, D) tensors of matching shape (eager only: TorchScript
    cannot compile these messages, and a scripted graph fails in the first op with a shape it cannot take)."""
    if not torch.jit.is_scripting():
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4:
                raise ValueError(f"{name} must have shape (B, H, N, D), got {t.dim()}-D shape {tuple(t.shape)}")
        if q.shape != k.shape or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"q, k, v shapes disagree: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def gamma_as_tensor(gamma: GammaLike, num_heads: int, ref: torch.Tensor) -> torch.Tensor:
    """Return gamma shaped (1, H, 1, 1) for broadcasting against (B, H, N, D) tensors."""
    if not isinstance(gamma, torch.Tensor):
        return torch.full((1, num_heads, 1, 1), float(gamma), dtype=ref.dtype, device=ref.device)
    if gamma.dim() == 0:
        return gamma.to(ref.dtype).reshape(1, 1, 1, 1).expand(1, num_heads, 1, 1)
    if gamma.shape != (num_heads,) and not torch.jit.is_scripting():
        raise ValueError(f"gamma must be a float or a tensor of shape ({num_heads},), got shape {tuple(gamma.shape)}")
    return gamma.to(ref.dtype).reshape(1, num_heads, 1, 1)


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """Reductions over tokens run in float32 for half inputs (and stay float64 for float64 inputs)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def autocast_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on t's device, or None when autocast is off (or unknown there,
    or in a scripted graph: TorchScript cannot read the autocast state)."""
    if not torch.jit.is_scripting():
        device = t.device.type
        # cpu and cuda always have autocast; asking only for other devices keeps torch < 2.10's dynamo in one graph
        available = device in ("cpu", "cuda") or torch.amp.is_autocast_available(device)
        if available and torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    return None


def no_autocast(t: torch.Tensor):
    """Context that switches autocast off on t's device so our explicit dtypes are honoured."""
    if autocast_dtype(t) is not None:
        return torch.autocast(t.device.type, enabled=False)
    return contextlib.nullcontext()
