"""The blocks of linvit's diffusion transformers: adaLN-Zero conditioning around one token mixer.

AttentionDiTBlock is DiT's block (Peebles & Xie 2023) with any attention of linvit's InfViT family (timm's
fused softmax, pure, Linear or Katz InfSA). WeightFormerDiTBlock is the WeightFormer release's DiT block
(model/wfm_dit.py): a depthwise 3x3 convolution as the token mixer and an MLP, with dynamic weights
predicted from pooled tokens in every third block, under the release's parameter names. Token sums that
predict weights accumulate in float32 (no low-precision sums over N under autocast).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp, trunc_normal_

from ..ops.common import no_autocast


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def tokens_to_map(x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) map of the patch grid."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *grid)


class PooledDynamicLinear(nn.Module):
    """x W(x) + b with W(x) = W0 + dW(x): dW from 2x2-pooled tokens through two low-rank factors (the release's
    DynLinear: rank in/4 and out/4, summed over the pooled tokens and divided by N, column-normalised)."""

    rate = 4

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scale = in_features**-0.5
        self.w = nn.Parameter(torch.zeros(in_features, out_features))
        self.b = nn.Parameter(torch.zeros(out_features))
        self.wfm = nn.Linear(in_features, in_features // self.rate + out_features // self.rate)
        self.w1 = nn.Parameter(torch.zeros(in_features // self.rate, in_features))
        self.w2 = nn.Parameter(torch.zeros(out_features // self.rate, out_features))
        for p in (self.w, self.b, self.w1, self.w2):
            trunc_normal_(p, std=0.02)

    def delta(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """dW(x), (B, in, out), from float32 sums over the pooled tokens."""
        pooled = F.avg_pool2d(tokens_to_map(x, grid).float(), 2).flatten(2).transpose(1, 2)
        with no_autocast(pooled):
            wfm = F.linear(pooled, self.wfm.weight.float(), self.wfm.bias.float())
            left, right = wfm.split([self.in_features // self.rate, self.out_features // self.rate], dim=-1)
            left, right = F.silu(left) @ self.w1.float(), F.silu(right) @ self.w2.float()
            w = left.transpose(-2, -1) @ right * (self.scale / x.shape[1])
            return w / (w.norm(dim=-2, keepdim=True) + 1.0)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        w = self.delta(x, grid).to(x.dtype) + self.w.to(x.dtype)
        return x @ w + self.b.to(x.dtype)


class PooledDynamicDepthwise(nn.Module):
    """Depthwise 3x3 convolution whose kernel is W0 + dW(x), dW from the 3x3-pooled map (the release's DynCnn)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(dim, 1, 3, 3))
        self.b = nn.Parameter(torch.zeros(dim))
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 1, bias=False))
        trunc_normal_(self.w, std=0.02)
        trunc_normal_(self.b, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        pooled = F.adaptive_avg_pool2d(x.float(), 3).to(x.dtype)  # the sum over tokens in float32
        w = self.wfm(pooled).reshape(B * C, 1, 3, 3)
        w = w / (w.norm(dim=(-2, -1), keepdim=True) + 1.0) + self.w.repeat(B, 1, 1, 1)
        out = F.conv2d(x.reshape(1, B * C, H, W), w.to(x.dtype), self.b.to(x.dtype).repeat(B), padding=1, groups=B * C)
        return out.reshape(B, C, H, W)


class WeightFormerDiTBlock(nn.Module):
    """The release's WeightFormer DiT block; dynamic weights where (layer + 2) % 3 == 0.

    As in the release, the residual stream is the *normalised* input (x = norm1(x); x = x + ...), and the
    token mixer is a depthwise convolution over the patch grid, so any grid works (the release: squares).
    """

    def __init__(self, hidden_size: int, mlp_ratio: float = 4.0, layer: int = 0) -> None:
        super().__init__()
        hidden = int(hidden_size * mlp_ratio)
        self.dynamic = (layer + 2) % 3 == 0
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        if self.dynamic:
            self.linear1 = PooledDynamicLinear(hidden_size, hidden)
            self.dwc = PooledDynamicDepthwise(hidden_size)
        else:
            self.linear1 = nn.Linear(hidden_size, hidden)
            self.dwc = nn.Conv2d(hidden_size, hidden_size, kernel_size=3, padding=1, groups=hidden_size)
        self.linear2 = nn.Linear(hidden, hidden_size)

    def mlp(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        x = self.linear1(x, grid) if self.dynamic else self.linear1(x)
        return self.linear2(F.gelu(x, approximate="tanh"))

    def forward(self, x: torch.Tensor, c: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = self.norm1(x)
        mixed = self.dwc(tokens_to_map(modulate(x, shift_msa, scale_msa), grid)).flatten(2).transpose(1, 2)
        x = x + gate_msa.unsqueeze(1) * mixed
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp), grid)


class AttentionDiTBlock(nn.Module):
    """DiT's adaLN-Zero block around an attention layer (softmax or an InfSA variant)."""

    def __init__(self, hidden_size: int, num_heads: int, attn_layer: type[nn.Module], mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = attn_layer(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        gelu = lambda: nn.GELU(approximate="tanh")  # noqa: E731 - DiT's MLP activation
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio), act_layer=gelu)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: torch.Tensor, c: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
