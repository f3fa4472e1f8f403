"""Learned feature maps for linear-time attention: Hedgehog's phi(x) = [softmax(x W), softmax(-x W)].

Hedgehog (Zhang et al., ICLR 2024) and LoLCATs (ICLR 2025) learn one W (head dim x f) per head, so that the
dot products of positive features mimic softmax attention's spiky weights, which a fixed ReLU or ELU + 1 map
cannot fit. The features are positive (never zero in float32), so every Katz-InfSA form takes them as they are.

W starts as a scaled identity (f = head dim, the default), INIT_SCALE / sqrt(head dim): chosen by measurement
against relu and elu+1 on converted layers of trained teachers (docs/distill.md, "Learned feature maps").
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn as nn

from ..errors import UsageError
from ..ops.common import accumulation_dtype, no_autocast

LearnedFeatureMap = Literal["hedgehog"]
# every map a Katz-InfSA or linear-attention layer takes: fixed (ops.katz.feature_map) or learned
FeatureMap = Literal["relu", "elu+1", LearnedFeatureMap]
LEARNED_FEATURE_MAPS = get_args(LearnedFeatureMap)
INIT_SCALE = 24.0  # W = INIT_SCALE / sqrt(d) * I (3 I at head dim 64): the lowest starting loss of 1-32 on digit


def hedgehog(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[softmax(x W), softmax(-x W)] for x (B, H, N, d) and weight (H, d, f): (B, H, N, 2f) in x's dtype.

    The product and both softmaxes run in float32 (float64 for float64 inputs; call with autocast off, as the
    module does), so half-precision inputs get features that sum to 2 per token to rounding, never an
    overflowed exponential."""
    dtype = accumulation_dtype(x)
    scores = torch.matmul(x.to(dtype), weight.to(dtype).unsqueeze(0))  # (B, H, N, f)
    return torch.cat([torch.softmax(scores, dim=-1), torch.softmax(-scores, dim=-1)], dim=-1).to(x.dtype)


class HedgehogFeatureMap(nn.Module):
    """One learned map per head, (B, H, N, d) -> (B, H, N, 2 feature_dim); feature_dim defaults to d."""

    def __init__(self, num_heads: int, head_dim: int, feature_dim: int | None = None, *, device=None, dtype=None):
        super().__init__()
        feature_dim = head_dim if feature_dim is None else feature_dim
        if isinstance(feature_dim, bool) or not isinstance(feature_dim, int) or feature_dim < 1:
            raise UsageError(f"feature_dim must be a positive whole number of features, got {feature_dim!r}")
        self.num_heads, self.head_dim, self.feature_dim = num_heads, head_dim, feature_dim
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A scaled identity per head (the first min(d, f) coordinates): softmax of the scaled query at init."""
        with torch.no_grad():
            self.weight.zero_()
            eye = torch.eye(self.head_dim, self.feature_dim, dtype=self.weight.dtype, device=self.weight.device)
            self.weight.add_(eye * (INIT_SCALE / math.sqrt(self.head_dim)))

    @property
    def out_features(self) -> int:
        return 2 * self.feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # autocast would run the product in half precision (TorchScript has none)
            with no_autocast(x):
                return hedgehog(x, self.weight)
        return hedgehog(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, feature_dim={self.feature_dim}"


def query_and_key_maps(feature_map: str, num_heads: int, head_dim: int, feature_dim: int | None, like: torch.Tensor):
    """A layer's two maps (queries, keys): learned ones on like's device and dtype, or identities for a fixed map
    (which the ops apply themselves)."""
    if feature_map not in LEARNED_FEATURE_MAPS:
        return nn.Identity(), nn.Identity()
    dd = {"device": like.device, "dtype": like.dtype}
    return tuple(HedgehogFeatureMap(num_heads, head_dim, feature_dim, **dd) for _ in range(2))
