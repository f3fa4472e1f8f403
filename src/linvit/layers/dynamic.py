"""WeightFormer's dynamic layers (spec/weightformer.md sections 2-3): W(X) = W0 + dW(X), O(N) in tokens.

Parameter names follow the official release (``w``, ``b``, ``wfm``, ``w1``, ``w2``) so its checkpoints
load unchanged. Both layers take the token grid size explicitly, so non-square grids and odd sides work.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import trunc_normal_

LINEAR_PREDICTORS = ("bilateral", "deep", "nonlinear", "linear", "gap")
CONV_PREDICTORS = ("adaptive", "gap")


def amplitude_direction(dw: torch.Tensor, dim: int | tuple[int, ...]) -> torch.Tensor:
    """dW / (||dW|| + 1) over ``dim``: keeps the direction, squashes the amplitude below 1."""
    return dw / (torch.linalg.vector_norm(dw, dim=dim, keepdim=True) + 1.0)


def _check_grid(x: torch.Tensor, grid_size: tuple[int, int], channels: int) -> tuple[int, int]:
    if x.dim() != 3:
        raise ValueError(f"expected tokens of shape (B, N, C), got {tuple(x.shape)}")
    H, W = grid_size
    if x.shape[1] != H * W:
        raise ValueError(f"{x.shape[1]} tokens do not form the given {H}x{W} grid")
    if x.shape[2] != channels:
        raise ValueError(f"expected {channels} channels, got {x.shape[2]}")
    return H, W


class DynamicLinear(nn.Module):
    """Linear layer whose weight W0 + dW(X) is predicted per sample from all tokens.

    dW is built from a correlation over the 2x2-average-pooled grid X_p (M ~ N/4 tokens) between a
    left factor P (M x C_in) and a right factor R (M x C_out): dW^ = P^T R / (sqrt(C_in) * N) with N
    the un-pooled token count, then each output column is normalised, dW = dW^ / (||dW^|| + 1).
    Predictor families (the paper's ablation; only "bilateral" is specified in detail, the others
    are our reading of its one-line descriptions):

    - ``bilateral`` (final): [Z1 | Z2] = wfm(X_p), P = SiLU(Z1) w1, R = SiLU(Z2) w2.
    - ``deep``: P = X_p, R = SiLU(wfm(X_p)) w2 (a bottleneck MLP on one side only).
    - ``nonlinear``: P = X_p, R = SiLU(X_p w2) (one activation, no bottleneck).
    - ``linear``: P = X_p, R = X_p w2, i.e. dW^ = (X_p^T X_p) w2 (correlation projected to C_in x C_out).
    - ``gap``: the bilateral branches applied to the global average token g: dW^ = P(g)^T R(g) / sqrt(C_in),
      a rank-1 update.

    Every family costs O(N C^2) for the predictor plus the static N C_in C_out product.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int | None = None,
        predictor: str = "bilateral",
        reduction: int = 4,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if predictor not in LINEAR_PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; choose from {LINEAR_PREDICTORS}")
        out_features = out_features or in_features
        self.in_features, self.out_features = in_features, out_features
        self.predictor = predictor
        self.scale = in_features**-0.5
        r_in, r_out = in_features // reduction, out_features // reduction
        self.w = nn.Parameter(torch.empty(in_features, out_features))
        self.b = nn.Parameter(torch.empty(out_features)) if bias else None
        if predictor in ("bilateral", "gap"):
            self.wfm = nn.Linear(in_features, r_in + r_out)
            self.w1 = nn.Parameter(torch.empty(r_in, in_features))
            self.w2 = nn.Parameter(torch.empty(r_out, out_features))
        elif predictor == "deep":
            self.wfm = nn.Linear(in_features, r_out)
            self.w2 = nn.Parameter(torch.empty(r_out, out_features))
        else:
            self.w2 = nn.Parameter(torch.empty(in_features, out_features))
        self.split = (r_in, r_out)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """trunc-normal(0.02) for W0, b, w1, w2; wfm as an ordinary timm Linear (trunc-normal, zero bias)."""
        for p in (self.w, self.b, getattr(self, "w1", None), self.w2):
            if p is not None:
                trunc_normal_(p, std=0.02)
        if hasattr(self, "wfm"):
            trunc_normal_(self.wfm.weight, std=0.02)
            nn.init.zeros_(self.wfm.bias)

    def factors(self, x: torch.Tensor, grid_size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Left/right factors P (B, M, C_in), R (B, M, C_out) and the scale of P^T R."""
        B, N, C = x.shape
        H, W = grid_size
        if self.predictor == "gap":
            pooled = x.mean(dim=1, keepdim=True)
            norm = 1.0
        else:
            if H < 2 or W < 2:
                raise ValueError(f"DynamicLinear pools 2x2 token windows; the {H}x{W} grid is too small")
            grid = x.transpose(1, 2).reshape(B, C, H, W)
            pooled = F.avg_pool2d(grid, 2).flatten(2).transpose(1, 2)  # floor, as nn.AvgPool2d(2)
            norm = N
        if self.predictor in ("bilateral", "gap"):
            z1, z2 = self.wfm(pooled).split(self.split, dim=-1)
            return F.silu(z1) @ self.w1, F.silu(z2) @ self.w2, self.scale / norm
        if self.predictor == "deep":
            return pooled, F.silu(self.wfm(pooled)) @ self.w2, self.scale / norm
        right = pooled @ self.w2
        return pooled, (F.silu(right) if self.predictor == "nonlinear" else right), self.scale / norm

    def delta_weight(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        """Per-sample dW of shape (B, C_in, C_out), after amplitude-direction normalisation."""
        left, right, scale = self.factors(x, grid_size)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32  # token sums in float32
        with torch.autocast(x.device.type, enabled=False):
            dw = (left.to(acc).transpose(1, 2) @ right.to(acc)) * scale
            return amplitude_direction(dw, dim=-2)

    def forward(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        """x: (B, N, C_in) tokens of an H x W grid (row-major) -> (B, N, C_out)."""
        _check_grid(x, grid_size, self.in_features)
        weight = self.w + self.delta_weight(x, grid_size)  # (B, C_in, C_out)
        out = x @ weight.to(x.dtype)
        return out + self.b if self.b is not None else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, predictor={self.predictor}"


class DynamicDWConv(nn.Module):
    """3x3 depthwise conv whose kernel K0 + dK(x) is predicted per sample.

    - ``adaptive`` (final): P = adaptive-avg-pool(x) to 3x3, so tap (i, j) of the kernel is predicted
      from image region (i, j); dK^ = wfm(P) with wfm = Conv1x1 -> GELU -> Conv1x1 (no bias).
    - ``gap``: all nine taps predicted from the global average: dK^ = reshape(wfm(mean(x)), 3x3), with
      wfm = Conv1x1 -> GELU -> Conv1x1 to 9C channels.

    Each kernel is normalised, dK = dK^ / (||dK^||_F + 1), and applied as one grouped conv with
    groups = B*C (no Python loop over the batch).
    """

    def __init__(self, dim: int, predictor: str = "adaptive", kernel_size: int = 3) -> None:
        super().__init__()
        if predictor not in CONV_PREDICTORS:
            raise ValueError(f"unknown predictor {predictor!r}; choose from {CONV_PREDICTORS}")
        self.dim, self.predictor, self.kernel_size = dim, predictor, kernel_size
        taps = 1 if predictor == "adaptive" else kernel_size * kernel_size
        self.w = nn.Parameter(torch.empty(dim, 1, kernel_size, kernel_size))
        self.b = nn.Parameter(torch.empty(dim))
        self.wfm = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=1),
            nn.GELU(),
            nn.Conv2d(dim, dim * taps, kernel_size=1, bias=False),
        )
        trunc_normal_(self.w, std=0.02)
        trunc_normal_(self.b, std=0.02)

    def delta_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample dK of shape (B, C, k, k)."""
        B, C, _, _ = x.shape
        k = self.kernel_size
        if self.predictor == "adaptive":
            dk = self.wfm(F.adaptive_avg_pool2d(x, k))
        else:
            dk = self.wfm(x.mean(dim=(2, 3), keepdim=True)).reshape(B, C, k, k)
        return amplitude_direction(dk, dim=(-2, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, H, W) -> (B, C, H, W), 'same' padding."""
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"expected (B, {self.dim}, H, W), got {tuple(x.shape)}")
        B, C, H, W = x.shape
        kernel = (self.w[:, 0].unsqueeze(0) + self.delta_kernel(x)).reshape(
            B * C, 1, self.kernel_size, self.kernel_size
        )
        out = F.conv2d(
            x.reshape(1, B * C, H, W),
            kernel.to(x.dtype),
            self.b.repeat(B).to(x.dtype),
            padding=self.kernel_size // 2,
            groups=B * C,
        )
        return out.reshape(B, C, H, W)


__all__ = ["DynamicLinear", "DynamicDWConv", "amplitude_direction", "LINEAR_PREDICTORS", "CONV_PREDICTORS"]
