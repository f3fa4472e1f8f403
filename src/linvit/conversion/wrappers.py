"""Converted layers that keep their source's calling convention (torch MultiheadAttention, Hugging Face).

Each wrapper holds a linvit InfSA layer as ``.mixer`` (so explain, bench and token chunking find it) and
translates the source's masks into InfSA's boolean keep-mask: pure InfSA honours it, Linear- and
Katz-InfSA refuse any mask that hides something (they pool every token into one state).
"""

from __future__ import annotations

import torch
import torch.nn as nn


def keep_mask(mask: torch.Tensor, *, bool_means_keep: bool) -> torch.Tensor:
    """A boolean keep-mask from a boolean or additive float mask.

    Additive masks may only hold 0 (keep) and -inf or a huge negative number (remove): a finite bias changes
    softmax weights, which InfSA (ReLU scores, no exponential) has no way to express.
    """
    if mask.dtype == torch.bool:
        return mask if bool_means_keep else ~mask
    if not mask.is_floating_point():
        raise ValueError(f"attention masks must be boolean or float, got {mask.dtype}")
    removed = mask <= torch.finfo(mask.dtype).min / 2  # -inf, or the dtype's minimum as Hugging Face writes it
    if not torch.all(removed | (mask == 0)):
        raise ValueError("additive attention biases other than 0 / -inf cannot be expressed in InfSA")
    return ~removed


def _combine(masks: list[torch.Tensor]) -> torch.Tensor | None:
    """AND of broadcastable keep-masks; None when nothing is hidden (the unmasked fast path)."""
    keep = None
    for m in masks:
        keep = m if keep is None else keep & m
    if keep is None or bool(keep.all()):
        return None
    return keep


def _same(t: torch.Tensor | None, query: torch.Tensor) -> bool:
    """key/value is the query: the same tensor (as every self-attention caller passes it) or an equal one."""
    return t is None or t is query or (t.shape == query.shape and torch.equal(t, query))


class MultiheadInfSA(nn.Module):
    """InfSA behind ``nn.MultiheadAttention``'s forward: (query, key, value, ...) -> (output, None).

    Self-attention only: key and value must be the query (cross-attention raises a ValueError). The attention
    weights are not returned (None, whatever need_weights says): InfSA's operator is not a softmax
    distribution, and linvit.explain reads it from ``.mixer``.
    """

    # nn.TransformerEncoderLayer runs a fused softmax kernel on self_attn.in_proj_* in eval mode unless
    # self_attn reports no input-projection bias; reporting None keeps it on this module's forward.
    in_proj_bias = None
    _qkv_same_embed_dim = False

    def __init__(self, mixer: nn.Module, batch_first: bool, name: str = "") -> None:
        super().__init__()
        self.mixer = mixer
        self.batch_first = batch_first
        self.num_heads = mixer.num_heads
        self.name = name

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if not (_same(key, query) and _same(value, query)):
            name = self.name or "converted attention"
            raise ValueError(f"{name}: InfSA is self-attention; key and value must be the query")
        unbatched = query.dim() == 2
        x = query.unsqueeze(1 if not self.batch_first else 0) if unbatched else query
        if not self.batch_first:
            x = x.transpose(0, 1)
        B, N, _ = x.shape
        masks = []
        if attn_mask is not None:
            keep = keep_mask(attn_mask, bool_means_keep=False)
            masks.append(keep.view(B, -1, N, N) if keep.dim() == 3 else keep)
        if key_padding_mask is not None:
            padding = key_padding_mask.unsqueeze(0) if key_padding_mask.dim() == 1 else key_padding_mask
            masks.append(keep_mask(padding, bool_means_keep=False)[:, None, None, :])
        if is_causal:
            masks.append(torch.ones(N, N, dtype=torch.bool, device=x.device).tril())
        out = self.mixer(x, attn_mask=_combine(masks))
        if not self.batch_first:
            out = out.transpose(0, 1)
        if unbatched:
            out = out.squeeze(1 if not self.batch_first else 0)
        return out, None


class HFInfSAAttention(nn.Module):
    """InfSA behind Hugging Face's ViT / DeiT / DINOv2 attention forward: (hidden_states, mask) -> (output, None)."""

    def __init__(self, mixer: nn.Module, name: str = "") -> None:
        super().__init__()
        self.mixer = mixer
        self.name = name

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        masks = [] if attention_mask is None else [keep_mask(attention_mask, bool_means_keep=True)]
        return self.mixer(hidden_states, attn_mask=_combine(masks)), None
