"""Importance maps on the patch grid, read from the models' own mixers through forward hooks.

Methods (``method=``):
    linear    Linear-InfSA's importance vector a (heads averaged).
    column    one-hop column centrality of A^ (sum_i A^_ij: how much token j is attended); at any size
              (query blocks for ReLU(q k^T) layers, the low-rank factors for Katz-InfSA layers).
    katz      Katz centrality ((I - gamma A^)^{-1} - I)^T 1 of A^ (the infinite-hop attention received).
    perron    the left Perron vector of A^ (power iteration, float64).
    cls       softmax ViT/DeiT: class-token attention row (heads averaged).
    rollout   softmax ViT/DeiT: attention rollout over layers (Abnar & Zuidema 2020, 0.5 A + 0.5 I).
    grad      any model: |d logit_c / d input| summed over channels and pooled per patch, c the prediction.
For InfSA layers A^ is the layer's own operator: ReLU(q k^T / d) Frobenius-normalised (pure and
Linear-InfSA layers), or phi(q) phi(k)^T normalised (Katz-InfSA layers). Maps never change outputs:
hooks read each mixer's input, and the maps are recomputed from it in float64 without autograd.

Size: "linear", "column", "grad" and Katz-InfSA layers' "katz"/"perron" work at every size the model runs at
(the capture runs the whole-tensor forward, since token chunking streams the mixers' inputs past the hooks).
Methods that need a dense N x N matrix ("katz"/"perron" on ReLU(q k^T) layers, "cls", "rollout") refuse, with
a one-line error, sizes whose float64 matrices would exceed DENSE_MAP_MAX_BYTES.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention

from ..errors import UsageError
from ..layers import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention
from ..mixers import get_mixer, list_mixers, mixer_of
from ..models import WeightFormer
from ..ops import (
    infsa_operator,
    katz_centrality,
    katz_kernel,
    katz_operator,
    perron_vector,
    perron_vector_dense,
)
from ..ops.infsa import infsa_column_sums
from ..ops.katz import katz_column_sums

METHODS = ("linear", "column", "katz", "perron", "cls", "rollout", "grad")
# dense maps hold ~3 float64 (B, H, N, N) matrices (operator, I - gamma A, inverse); above this they refuse
DENSE_MAP_MAX_BYTES = 2**32


@dataclass
class ImportanceMaps:
    """patch: (B, h, w) maps of the chosen layer(s); image: (B, H, W) upsampled (None with upsample=False);
    layers: (B, L, h, w) or None."""

    patch: torch.Tensor
    image: torch.Tensor | None
    layers: torch.Tensor | None
    method: str


def default_method(model: nn.Module, num_tokens: int | None = None) -> str:
    """The natural map of a model: its mixer's own importance, or gradients when it has none.

    Pure InfSA's Katz centrality and softmax rollout need dense N x N matrices; with num_tokens too many for
    that (one image), the defaults are pure InfSA's one-hop column centrality and gradients, which work at
    any size.
    """
    kinds = {type(m) for m in model.modules()}
    if LinearInfSAAttention in kinds:
        return "linear"
    if KatzInfSAAttention in kinds:
        return "katz"
    if PureInfSAAttention in kinds:
        return "katz" if _dense_fits(model, PureInfSAAttention, num_tokens) else "column"
    if Attention in kinds:
        return "rollout" if _dense_fits(model, Attention, num_tokens) else "grad"
    return "grad"


def _dense_fits(model: nn.Module, kind: type, num_tokens: int | None) -> bool:
    heads = max(m.num_heads for m in model.modules() if isinstance(m, kind))
    return num_tokens is None or _dense_bytes(1, heads, num_tokens) <= DENSE_MAP_MAX_BYTES


def attention_mixers(model: nn.Module, method: str) -> list[nn.Module]:
    """The model's mixer layers whose registered maps (linvit.mixers: Mixer.maps) include the method; a
    ValueError naming what is missing if none (a mixer registered without maps has none: 'grad' works)."""
    found = [(m, mixer_of(m)) for m in model.modules() if mixer_of(m) is not None]
    mixers = [m for m, record in found if method in record.maps]
    if not mixers:
        wanted = ", ".join(n for n in list_mixers() if method in get_mixer(n).maps) or "no registered"
        has = sorted({record.name for _, record in found if method not in record.maps})
        mine = f"its {', '.join(has)} mixer has no {method!r} map" if has else "it has no mixer layer"
        raise UsageError(f"method {method!r} needs {wanted} layers; {type(model).__name__}: {mine} (try method='grad')")
    return mixers


@contextlib.contextmanager
def whole_tensor_forward(model: nn.Module):
    """Every mixer sees its whole input for the duration (the chunked forward streams mixer inputs in chunks
    through its streaming passes, past forward hooks). Models that can keep their token-wise work chunked
    while doing so (``whole_mixer_inputs``) do, so a capture at 8K costs little more than inference; others
    turn chunking off."""
    switched = [m for m in model.modules() if hasattr(m, "whole_mixer_inputs")]
    chunked = [(m, m.token_chunk) for m in model.modules() if hasattr(m, "set_token_chunk") and m not in switched]
    for m in switched:
        m.whole_mixer_inputs = True
    for m, _ in chunked:
        m.set_token_chunk(None)
    try:
        yield
    finally:
        for m in switched:
            m.whole_mixer_inputs = False
        for m, setting in chunked:
            m.set_token_chunk(setting)


def capture_inputs(
    model: nn.Module, mixers: list[nn.Module], images: torch.Tensor, reduce=None
) -> tuple[list, torch.Tensor]:
    """Run the model once (whole-tensor path) and return each mixer's input tokens (detached) and the logits.

    With ``reduce(mixer, x)``, what is kept per mixer is that result, computed as the layer runs, so large
    inputs are not all held at once.
    """
    captured: list = [None] * len(mixers)

    def keep(i: int, mixer: nn.Module, x: torch.Tensor) -> None:
        captured[i] = x.detach() if reduce is None else reduce(mixer, x.detach())

    hooks = [m.register_forward_pre_hook(lambda mod, args, i=i: keep(i, mod, args[0])) for i, m in enumerate(mixers)]
    try:
        with torch.no_grad(), whole_tensor_forward(model):
            logits = model(images)
    finally:
        for h in hooks:
            h.remove()
    return captured, logits


def projected_qk(mixer: nn.Module, x: torch.Tensor, features: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's own q, k (B, H, N, D) on its input x, as float64, for any timm-layout attention; a Katz-InfSA
    layer's through its learned feature maps where it has them and features is set (its ops then read them with
    mixer.kernel)."""
    B, N, _ = x.shape
    q, k, _ = mixer.qkv(x).reshape(B, N, 3, mixer.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = mixer.q_norm(q).double(), mixer.k_norm(k).double()
    if features and isinstance(mixer, KatzInfSAAttention):
        return mixer.feature_q(q), mixer.feature_k(k)
    return q, k


def _dense_bytes(batch: int, heads: int, tokens: int) -> int:
    return 3 * batch * heads * tokens * tokens * 8


def check_dense_fits(mixer: nn.Module, x: torch.Tensor, method: str) -> None:
    """A one-line ValueError when a dense map of x's tokens would exceed DENSE_MAP_MAX_BYTES."""
    B, N = x.shape[:2]
    need = _dense_bytes(B, mixer.num_heads, N)
    if need > DENSE_MAP_MAX_BYTES:
        raise UsageError(
            f"method {method!r} on {type(mixer).__name__} forms dense {N} x {N} float64 matrices "
            f"({need / 2**30:.0f} GiB for {B} image(s)); use method='column', 'linear' or 'grad' at this size, "
            "or a smaller image"
        )


def mixer_operator(mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Dense A^ (B, H, N, N), float64, of an InfSA layer on its input x (small N only): the operator its
    forward applies (ops.katz_operator for Katz-InfSA layers, ops.infsa_operator otherwise)."""
    q, k = projected_qk(mixer, x)
    if isinstance(mixer, KatzInfSAAttention):
        return katz_operator(q, k, mixer.eps, mixer.kernel)
    return infsa_operator(q, k, mixer.eps)


def layer_scores(mixer: nn.Module, x: torch.Tensor, method: str) -> torch.Tensor:
    """Per-token scores (B, N) of one layer for a method (heads averaged)."""
    with torch.no_grad():
        if method == "linear":
            return mixer.importance(x).double().mean(1)
        if isinstance(mixer, KatzInfSAAttention) and method in ("katz", "perron", "column"):
            q, k = projected_qk(mixer, x)  # low-rank factors: O(N d^2) at any size
            if method == "katz":
                return katz_centrality(q, k, mixer.gamma.double(), mixer.eps, mixer.kernel).mean(1)
            if method == "column":
                return katz_column_sums(q, k, mixer.eps, mixer.kernel).mean(1)
            return perron_vector(q, k, mixer.eps, mixer.kernel).mean(1)
        if method == "column":
            q, k = projected_qk(mixer, x)
            return infsa_column_sums(q, k, mixer.eps).mean(1)  # query blocks: any size
        check_dense_fits(mixer, x, method)
        if method in ("cls", "rollout"):
            q, k = projected_qk(mixer, x)
            return ((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5).softmax(-1)  # (B, H, N, N) for rollout
        A = mixer_operator(mixer, x)
        if method == "katz":
            return katz_kernel(A, mixer.gamma.double()).sum(-2).mean(1)
        if method == "perron":
            return perron_vector_dense(A).mean(1)
    raise UsageError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def _grid(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    return tuple(model.patch_embed.dynamic_feat_size(images.shape[-2:]))


def _grid_tokens(model: nn.Module, images: torch.Tensor) -> int | None:
    if not hasattr(model, "patch_embed"):
        return None
    h, w = _grid(model, images)
    return h * w


def _prefix(model: nn.Module) -> int:
    return 0 if isinstance(model, WeightFormer) else int(getattr(model, "num_prefix_tokens", 0))


def _rollout(attns: list[torch.Tensor], prefix: int) -> torch.Tensor:
    """Attention rollout: product of row-normalised 0.5 A + 0.5 I over layers; the class token's row."""
    result = None
    for a in attns:
        a = a.mean(1)
        a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
    return result[:, 0, prefix:] if prefix else result.mean(1)


def gradient_saliency(model: nn.Module, images: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """|d logit_target / d image| summed over channels, (B, H, W); target defaults to the prediction."""
    x = images.clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model(x)
        target = logits.argmax(1) if target is None else target
        logits.gather(1, target[:, None]).sum().backward()
    return x.grad.abs().sum(1).detach()


def importance_maps(
    model: nn.Module,
    images: torch.Tensor,
    method: str | None = None,
    layer: int | str = "mean",
    target: torch.Tensor | None = None,
    upsample: bool = True,
) -> ImportanceMaps:
    """One importance map per image, on the patch grid and upsampled (bilinear) to the image.

    Args:
        model: a linvit or timm ViT/DeiT model (eval mode is used and restored).
        images: (B, 3, H, W) normalised batch.
        method: see the module docstring; default: default_method(model, tokens per image).
        layer: layer index (negative from the end) or "mean" over layers (ignored by cls/rollout/grad).
        target: classes for "grad" (default: the predicted class).
        upsample: also return the map at image size (at 8K, 256 MB per image: off when only the grid is needed).
    """
    method = method or default_method(model, _grid_tokens(model, images))
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    was_training = model.training
    model.eval()
    try:
        h, w = _grid(model, images)
        B = images.shape[0]
        if method == "grad":
            sal = gradient_saliency(model, images, target)
            patch = F.adaptive_avg_pool2d(sal[:, None], (h, w))[:, 0]
            layers = None
        else:
            mixers = attention_mixers(model, method)
            scores, _ = capture_inputs(model, mixers, images, reduce=lambda m, x: layer_scores(m, x, method))
            prefix = _prefix(model)
            if method in ("cls", "rollout"):
                attns = scores
                if method == "cls":
                    tokens = attns[-1].mean(1)[:, 0, prefix:] if prefix else attns[-1].mean(1).mean(1)
                else:
                    tokens = _rollout(attns, prefix)
                patch, layers = tokens.reshape(B, h, w), None
            else:
                layers = torch.stack([s[:, prefix:] for s in scores], 1).reshape(B, -1, h, w)
                patch = layers.mean(1) if layer == "mean" else layers[:, int(layer)]
    finally:
        model.train(was_training)
    patch = patch.float()
    image = None
    if upsample:
        image = F.interpolate(patch[:, None], size=images.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    return ImportanceMaps(patch=patch, image=image, layers=None if layers is None else layers.float(), method=method)
