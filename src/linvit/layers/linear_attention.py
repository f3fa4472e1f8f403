"""Plain linear attention, the anchor form of linearization work: out_i = phi(q_i) S / (phi(q_i) . z) with
S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) (Katharopoulos et al. 2020; with Hedgehog's learned map, the
student form of ViT-AdaLA (vision) and of LoLCATs without its window). One row-normalised hop, no discount:
what Katz-InfSA's infinite-hop series is measured against (docs/distill.md), not a mixer linvit recommends.

timm ``Attention``'s parameter layout (qkv, q_norm, k_norm, norm, proj), so it converts and loads like the
InfSA layers. The token sums accumulate in float32 (float64 for float64 inputs) under any autocast.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from timm.layers import register_notrace_module

from ..errors import UsageError
from ..mixers import Option, register_mixer
from ..ops.common import accumulation_dtype, no_autocast
from ..ops.katz import feature_map as fixed_feature_map
from .feature_maps import LEARNED_FEATURE_MAPS, FeatureMap, query_and_key_maps
from .infsa_attention import FEATURE_MAPS, check_feature_map, timm_attention_layout


def linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps) for (B, H, N, F) features and (B, H, N, D) values, in the
    accumulation dtype, returned in v's dtype (call with autocast off). A query whose features meet no key's
    gives 0, never NaN."""
    dtype = accumulation_dtype(v)
    fq, fk, vv = fq.to(dtype), fk.to(dtype), v.to(dtype)
    kv = fk.transpose(-2, -1) @ vv  # (B, H, F, D)
    normaliser = fq @ fk.sum(dim=-2).unsqueeze(-1)  # (B, H, N, 1)
    return ((fq @ kv) / (normaliser + eps)).to(v.dtype)


@register_mixer(
    "linear_attention",
    option=Option("feature_map", FEATURE_MAPS, "elu+1"),
    cannot=("attn_drop", "attn_mask"),
    causal=True,
)
@register_notrace_module
class LinearAttention(nn.Module):
    """Plain linear attention with a fixed ("elu+1", Katharopoulos et al.'s, or "relu") or learned ("hedgehog")
    feature map per head."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        *,
        feature_map: FeatureMap = "elu+1",
        feature_dim: int | None = None,
        eps: float = 1e-6,
        **kwargs,
    ) -> None:
        super().__init__()
        if attn_drop:
            raise UsageError("linear attention never forms the attention matrix; attn_drop must be 0")
        layout = (dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias, proj_drop, norm_layer)
        timm_attention_layout(self, *layout, kwargs)
        self.eps = eps
        self.use_feature_map(feature_map, feature_dim)

    def use_feature_map(self, feature_map: FeatureMap, feature_dim: int | None = None) -> None:
        """The map of queries and keys: fixed (ops.katz.feature_map) or learned, built on the layer's device."""
        check_feature_map(feature_map, feature_dim)
        self.feature_map = feature_map
        self.learned = feature_map in LEARNED_FEATURE_MAPS
        maps = query_and_key_maps(feature_map, self.num_heads, self.head_dim, feature_dim, self.qkv.weight)
        self.feature_q, self.feature_k = maps

    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """phi(q), phi(k): the learned maps' outputs, or the fixed map in the accumulation dtype."""
        if self.learned:
            return self.feature_q(q), self.feature_k(k)
        dtype = accumulation_dtype(q)
        return fixed_feature_map(q.to(dtype), self.feature_map), fixed_feature_map(k.to(dtype), self.feature_map)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("linear attention is computed from token sums here; attention masks are not supported")
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        fq, fk = self.features(self.q_norm(q), self.k_norm(k))
        if not torch.jit.is_scripting():  # the token sums in float32 under any autocast (TorchScript has none)
            with no_autocast(v):
                out = linear_attention(fq, fk, v, self.eps)
        else:
            out = linear_attention(fq, fk, v, self.eps)
        return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(B, N, C))))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, feature_map={self.feature_map}"
