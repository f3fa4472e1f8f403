"""Adapters: where an attention module keeps its weights, and how the InfSA layer replacing it is called.

An adapter is any object with ``weights(module) -> AttentionWeights``; it may also have
``wrap(layer, module, name) -> nn.Module`` to keep the source's calling convention around the linvit layer
(without it, the linvit layer itself replaces the module and is called as ``layer(x, attn_mask=None,
is_causal=False)``, timm's convention). A plain function ``module -> AttentionWeights`` is an adapter too.
Adapters raise ``UnmappableAttention`` for modules they recognise but cannot convert.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from timm.layers import Attention

from .wrappers import HFInfSAAttention, MultiheadInfSA


class UnmappableAttention(ValueError):
    """A recognised attention module whose weights or semantics have no InfSA equivalent."""


@dataclass
class AttentionWeights:
    """A self-attention's weights in timm's layout: qkv rows are [W_q; W_k; W_v], heads contiguous in each.

    The optional norms are modules (q/k norms on one head's width, the output norm on the full width);
    they are moved into the converted layer as they are.
    """

    num_heads: int
    qkv_weight: torch.Tensor  # (3 C, C)
    qkv_bias: torch.Tensor | None  # (3 C,)
    proj_weight: torch.Tensor  # (C, C)
    proj_bias: torch.Tensor | None  # (C,)
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    norm: nn.Module | None = None
    attn_drop: float = 0.0
    proj_drop: float = 0.0

    @property
    def dim(self) -> int:
        return self.qkv_weight.shape[1]

    def check(self, name: str) -> None:
        """Raise UnmappableAttention (naming the module) unless the shapes describe one C-wide self-attention."""
        C = self.dim
        if not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise UnmappableAttention(f"{name}: unknown number of heads ({self.num_heads!r})")
        if C % self.num_heads:
            raise UnmappableAttention(f"{name}: width {C} is not divisible by {self.num_heads} heads")
        expected = {"qkv_weight": (3 * C, C), "qkv_bias": (3 * C,), "proj_weight": (C, C), "proj_bias": (C,)}
        for field, shape in expected.items():
            t = getattr(self, field)
            if t is not None and tuple(t.shape) != shape:
                raise UnmappableAttention(f"{name}: {field} has shape {tuple(t.shape)}, expected {shape}")


def _dropout_p(module: nn.Module, attr: str) -> float:
    drop = getattr(module, attr, None)
    return float(drop.p) if isinstance(drop, nn.Dropout) else float(drop or 0.0)


class TimmAttentionAdapter:
    """timm's ``Attention`` (ViT, DeiT, and every timm model built on it): same layout as linvit's layers."""

    source = "timm"

    def weights(self, m: Attention) -> AttentionWeights:
        if getattr(m, "gate", None) is not None:
            raise UnmappableAttention("gated attention (an output gate per token) has no InfSA equivalent")
        dim = m.qkv.in_features
        if m.qkv.out_features != 3 * dim or m.proj.out_features != dim:
            raise UnmappableAttention(
                f"attention width {m.qkv.out_features // 3} or output width {m.proj.out_features} differs from "
                f"the token width {dim} (attn_head_dim / dim_out are not supported)"
            )
        present = lambda norm: None if isinstance(norm, nn.Identity) else norm  # noqa: E731
        return AttentionWeights(
            num_heads=m.num_heads,
            qkv_weight=m.qkv.weight,
            qkv_bias=m.qkv.bias,
            proj_weight=m.proj.weight,
            proj_bias=m.proj.bias,
            q_norm=present(m.q_norm),
            k_norm=present(m.k_norm),
            norm=present(m.norm),
            attn_drop=_dropout_p(m, "attn_drop"),
            proj_drop=_dropout_p(m, "proj_drop"),
        )


class MultiheadAttentionAdapter:
    """``torch.nn.MultiheadAttention`` (torchvision's ViTs, ``nn.TransformerEncoder``), self-attention only."""

    source = "torch"

    def weights(self, m: nn.MultiheadAttention) -> AttentionWeights:
        if m.kdim != m.embed_dim or m.vdim != m.embed_dim:
            raise UnmappableAttention(
                f"cross-attention (kdim={m.kdim}, vdim={m.vdim}, embed_dim={m.embed_dim}): InfSA is a self-attention"
            )
        if m.bias_k is not None or m.add_zero_attn:
            raise UnmappableAttention("add_bias_kv / add_zero_attn append key/value tokens that InfSA has no use for")
        if m.in_proj_weight is not None:
            qkv_weight = m.in_proj_weight
        else:  # separate projection weights
            qkv_weight = torch.cat([m.q_proj_weight, m.k_proj_weight, m.v_proj_weight])
        return AttentionWeights(
            num_heads=m.num_heads,
            qkv_weight=qkv_weight,
            qkv_bias=m.in_proj_bias,
            proj_weight=m.out_proj.weight,
            proj_bias=m.out_proj.bias,
            attn_drop=float(m.dropout),
        )

    def wrap(self, layer: nn.Module, m: nn.MultiheadAttention, name: str) -> nn.Module:
        return MultiheadInfSA(layer, batch_first=m.batch_first, name=name)


class HFAttentionAdapter:
    """Hugging Face ``transformers`` ViT / DeiT / DINOv2 attention (q_proj, k_proj, v_proj, o_proj)."""

    source = "transformers"

    def weights(self, m: nn.Module) -> AttentionWeights:
        heads = getattr(m, "num_attention_heads", None) or getattr(getattr(m, "config", None), "num_attention_heads", 0)
        projections = [m.q_proj, m.k_proj, m.v_proj]
        biases = [p.bias for p in projections]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            raise UnmappableAttention("some but not all of q/k/v have biases")
        return AttentionWeights(
            num_heads=heads,
            qkv_weight=torch.cat([p.weight for p in projections]),
            qkv_bias=None if biases[0] is None else torch.cat(biases),
            proj_weight=m.o_proj.weight,
            proj_bias=m.o_proj.bias,
            attn_drop=float(getattr(m, "attention_dropout", 0.0) or 0.0),
        )

    def wrap(self, layer: nn.Module, m: nn.Module, name: str) -> nn.Module:
        return HFInfSAAttention(layer, name=name)


# Hugging Face attention classes converted by default, imported only if transformers is installed.
HF_ATTENTION_CLASSES = (
    ("transformers.models.vit.modeling_vit", "ViTAttention"),
    ("transformers.models.deit.modeling_deit", "DeiTAttention"),
    ("transformers.models.dinov2.modeling_dinov2", "Dinov2Attention"),
)


def builtin_adapters() -> dict[type, object]:
    """Module type -> adapter for the sources linvit converts out of the box."""
    adapters: dict[type, object] = {Attention: TimmAttentionAdapter()}
    adapters[nn.MultiheadAttention] = MultiheadAttentionAdapter()
    for module_name, class_name in HF_ATTENTION_CLASSES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):  # transformers missing, or a version with another layout
            continue
        adapters[cls] = HFAttentionAdapter()
    return adapters


def adapter_for(module_type: type, adapters: dict[type, object]):
    """The adapter registered for the module class or its nearest base class, or None."""
    for cls in module_type.__mro__:
        if cls in adapters:
            return adapters[cls]
    return None
