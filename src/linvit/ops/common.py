"""Helpers shared by the attention ops: argument checks, gamma broadcasting, float32 accumulation, and the two
eager/scripted splits every op shares (is_exporting, eager_autocast_off; see layers/graph_capture.py)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

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


def elu_plus_one(t: torch.Tensor) -> torch.Tensor:
    """ELU(t) + 1, written as exp(t) for t <= 0 and t + 1 above: elu(t) + 1 = (exp(t) - 1) + 1 rounds to exactly 0
    below t = -17 in float32 (a dead feature where exp(t) is still 4e-8). exp reads min(t, 0), so its unused
    branch neither overflows nor sends inf x 0 = NaN into the gradient at large t."""
    return torch.where(t > 0, t + 1.0, torch.exp(t.clamp(max=0.0)))


HALF_DTYPES = (torch.float16, torch.bfloat16)


def _has_out_dtype_bmm(dispatch_key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::bmm.dtype", dispatch_key)
    except RuntimeError:  # a torch without the overload
        return False


# Devices whose bmm takes half inputs and returns float32 sums in this torch build (torch's out_dtype overload:
# CUDA since torch 2.8, XPU in later builds; meta computes its shapes and dtypes). CPU has none.
OUT_DTYPE_BMM_DEVICES = tuple(
    d for d, key in (("cuda", "CUDA"), ("xpu", "XPU"), ("meta", "Meta")) if _has_out_dtype_bmm(key)
)
# Where token products therefore stay in half precision: tensor cores, no float32 copies of Q, K, V.
FLOAT32_SUM_DEVICES = tuple(d for d in OUT_DTYPE_BMM_DEVICES if d != "meta")


def products_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype token-by-feature products of t run in: t's half dtype where the device sums half products
    in float32 (FLOAT32_SUM_DEVICES), otherwise the accumulation dtype (half inputs are upcast once)."""
    if not torch.jit.is_scripting():  # scripted graphs upcast (TorchScript cannot read module-level tuples)
        if t.dtype in HALF_DTYPES and t.device.type in FLOAT32_SUM_DEVICES:
            return t.dtype
    return accumulation_dtype(t)


def merges_with_next(t: torch.Tensor, dim: int) -> bool:
    """Whether dims dim and dim + 1 of t flatten into one as a view (no copy)."""
    return t.shape[dim] == 1 or t.shape[dim + 1] == 1 or t.stride(dim) == t.shape[dim + 1] * t.stride(dim + 1)


def as_batched(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, H, N, x) t in dtype, laid out so that (B, H) flattens into one batch dimension without a copy: a
    batched product then reads it as it is. Q, K, V arrive as token-major views of the qkv projection, which
    every 4-D matmul would copy again (batch 1 merges as they are, so there t stays a view)."""
    if t.dtype != dtype:
        return t.to(dtype, memory_format=torch.contiguous_format)  # the cast makes the copy
    if not merges_with_next(t, 0):
        return t.contiguous()
    return t


def sum_over_tokens(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b summed over the token axis of (B, H, N, x) and (B, H, N, y) tensors: (B, H, x, y) in the
    accumulation dtype. Half inputs multiply in half and add in float32 (HalfProductsFloat32Sum); pass
    contiguous tensors and the batched product reads them without a copy."""
    if not torch.jit.is_scripting():  # scripted graphs get upcast features (products_dtype)
        if a.dtype in HALF_DTYPES:
            summed = HalfProductsFloat32Sum.apply(a.flatten(0, 1).transpose(1, 2), b.flatten(0, 1), False)
            return summed.unflatten(0, (a.shape[0], a.shape[1]))
    return a.transpose(-2, -1) @ b


def float32_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of (B, H, n, N) and (B, H, N, y) half tensors, summed over N in float32 with a float32 result
    (call with autocast off), so that a scale applied next rounds once, not three times. float16 gradients
    stay float32 until they reach a and b: pure InfSA's gamma / (norm + eps) of an all-zero head (~1e6) and
    its unnormalised sums over ~2k tokens exceed float16's 65504; bfloat16 has float32's range."""
    summed = HalfProductsFloat32Sum.apply(a.flatten(0, 1), b.flatten(0, 1), a.dtype == torch.float16)
    return summed.unflatten(0, (a.shape[0], a.shape[1]))


class HalfProductsFloat32Sum(torch.autograd.Function):
    """bmm(a, b) of half tensors with float32 accumulation and a float32 result (each half product is exact in
    float32). On CUDA/XPU torch's bmm(out_dtype=float32) does it on tensor cores; elsewhere an upcast gives the
    same numbers. torch has no derivative for the out_dtype overload, hence this Function. With
    float32_grad False the backward products contract the small (x, y) axes, so they run in the inputs' half
    dtype, as autocast would; with float32_grad True (float32_matmul) they run in float32 and only the
    gradients of a and b are rounded to half."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, float32_grad: bool = False) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.float32_grad = float32_grad
        if a.device.type in OUT_DTYPE_BMM_DEVICES:
            return torch.bmm(a, b, out_dtype=torch.float32)
        return torch.bmm(a.float(), b.float())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        dtype_a, dtype_b = a.dtype, b.dtype
        if ctx.float32_grad:
            grad, a, b = grad.float(), a.float(), b.float()
        else:
            grad = grad.to(a.dtype)
        grad_a = torch.bmm(grad, b.transpose(1, 2)).to(dtype_a) if ctx.needs_input_grad[0] else None
        grad_b = torch.bmm(a.transpose(1, 2), grad).to(dtype_b) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


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


def eager_autocast_off(fn: Callable) -> Callable:
    """fn run with autocast off on its first argument's device, so that its explicit dtypes hold (float32 sums
    under a half autocast).

    The one eager/scripted split of every formula that needs it: torch.jit.script compiles fn itself (through
    the ``__prepare_scriptable__`` hook; TorchScript has no autocast state to switch), while eager calls,
    torch.compile and torch.export run this wrapper.
    """

    @functools.wraps(fn)
    def without_autocast(*args, **kwargs):
        with no_autocast(args[0]):
            return fn(*args, **kwargs)

    without_autocast.__prepare_scriptable__ = lambda: fn
    return without_autocast


def is_exporting() -> bool:
    """torch.export is capturing (pt2, ONNX): sizes are symbolic, so a form chosen by size gives way to one that
    takes every size. False in scripted graphs, which compile the exported form but never run it."""
    if not torch.jit.is_scripting():
        return torch.compiler.is_exporting()
    return False
