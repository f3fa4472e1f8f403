"""WeightFormer's dynamic layers, W(X) = W0 + dW(X), O(N) in tokens (docs/spec/weightformer.md 2-3, arXiv:2605.01711).

Parameter names follow the official release (``w``, ``b``, ``wfm``, ``w1``, ``w2``) so its checkpoints
load unchanged. Both layers take the token grid size explicitly, so non-square grids and odd sides work.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import trunc_normal_

from ..errors import UsageError
from ..ops.common import autocast_dtype, eager_autocast_off, is_exporting
from .graph_capture import stateless_call

LINEAR_PREDICTORS = ("bilateral", "deep", "nonlinear", "linear", "gap")
CONV_PREDICTORS = ("adaptive", "gap")


def identity_tap(kernel_size: int) -> torch.Tensor:
    """The one-hot centre tap (1, 1, k, k): conv(x, K + I) = x + conv(x, K) under zero padding, since the centre
    tap always reads x itself. Modules keep it as a non-persistent buffer (a constant, so it can never be stale)
    and fold a residual connection into a depthwise convolution with one add."""
    tap = torch.zeros(1, 1, kernel_size, kernel_size)
    tap[..., kernel_size // 2, kernel_size // 2] = 1.0
    return tap


def refill_identity_tap(module: nn.Module, kernel_size: int, like: torch.Tensor) -> None:
    """Write identity_tap(kernel_size) into module.identity_tap (timm's init_non_persistent_buffers protocol):
    a non-persistent buffer is in no checkpoint, so after meta-device construction + to_empty it holds garbage,
    and after load_state_dict(assign=True) it is still on the meta device (then it moves to like's device)."""
    tap = identity_tap(kernel_size)
    with torch.no_grad():
        if module.identity_tap.is_meta:
            module.identity_tap = tap.to(device=like.device, dtype=module.identity_tap.dtype)
        else:
            module.identity_tap.copy_(tap)


def refill_after_load(module: nn.Module, incompatible_keys) -> None:
    """load_state_dict post-hook: loading restores the non-persistent buffers too (no checkpoint holds them)."""
    module.init_non_persistent_buffers()


def amplitude_denominator(raw: torch.Tensor, dim: list[int], scale: float = 1.0) -> torch.Tensor:
    """||raw|| + 1 / scale over ``dim``, so that raw / it = amplitude_direction(scale * raw)."""
    return torch.linalg.vector_norm(raw, dim=dim, keepdim=True) + 1.0 / scale


def amplitude_direction(dw: torch.Tensor, dim: list[int]) -> torch.Tensor:
    """dW / (||dW|| + 1) over ``dim``: keeps the direction, squashes the amplitude below 1."""
    return dw / amplitude_denominator(dw, dim)


def per_sample_depthwise(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """'same' depthwise convolution with one kernel per sample, (B, C, H, W) x (B, C, k, k) -> (B, C, H, W),
    as k*k shifted multiply-adds: the same result as the grouped convolution over B*C groups, without a
    group count that depends on the batch (what exported graphs with a dynamic batch need)."""
    k = kernel.shape[-1]
    H, W = x.shape[-2:]
    padded = F.pad(x, [k // 2] * 4)
    out = bias.view(1, -1, 1, 1)
    for i in range(k):
        for j in range(k):
            out = out + padded[..., i : i + H, j : j + W] * kernel[..., i, j, None, None]
    return out


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
            raise UsageError(f"unknown predictor {predictor!r}; choose from {LINEAR_PREDICTORS}")
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

    def pooled_tokens(self, x: torch.Tensor, grid_size: tuple[int, int]) -> tuple[torch.Tensor, int]:
        """The predictor's input and the token count it normalises by: the 2x2-average-pooled grid
        (floor on odd sides, as nn.AvgPool2d(2)) as a view + mean of the token-major tensor, or the mean token."""
        B, N, C = x.shape
        H, W = grid_size
        if self.predictor == "gap":
            return x.mean(dim=1, keepdim=True), 1
        if H < 2 or W < 2:
            raise ValueError(f"DynamicLinear pools 2x2 token windows; the {H}x{W} grid is too small")
        grid = x.reshape(B, H, W, C)[:, : H - H % 2, : W - W % 2]
        windows = grid.unflatten(1, (H // 2, 2)).unflatten(3, (W // 2, 2))  # (B, H/2, 2, W/2, 2, C)
        return windows.mean(dim=(2, 4)).flatten(1, 2), N

    def pooled_bands(self, bands) -> tuple[torch.Tensor, int]:
        """pooled_tokens of a grid streamed as row bands: (tokens (B, rows * W, C), (rows, W)) pairs, every band
        but the last of an even number of rows, so the 2x2 windows never straddle two bands."""
        parts, total, count = [], None, 0
        for tokens, band_grid in bands:
            count += tokens.shape[1]
            if self.predictor == "gap":
                total = tokens.sum(1, keepdim=True) if total is None else total + tokens.sum(1, keepdim=True)
            elif band_grid[0] >= 2:  # a last band of one row falls to the floor, as in the whole grid
                parts.append(self.pooled_tokens(tokens, band_grid)[0])
        return (total / count, 1) if self.predictor == "gap" else (torch.cat(parts, dim=1), count)

    def weight_of_bands(self, bands) -> torch.Tensor:
        """W0 + dW for a grid streamed as row bands (pooled_bands' pairs): token-chunked inference pools band
        by band and applies the weight with apply_weight."""
        return self.dynamic_weight(*self.correlation_of_pooled(*self.pooled_bands(bands)))

    def correlation(self, x: torch.Tensor, grid_size: tuple[int, int]) -> tuple[torch.Tensor, float]:
        """G = P^T R of shape (B, C_in, C_out) in float32 (float64 for float64 x) and s with dW^ = s G.

        P = L A and R = S Z are low-rank products (bilateral: L = SiLU(Z1), A = w1, S = SiLU(Z2), Z = w2),
        so G = A^T (L^T S) Z can also be formed core first: M r_in r_out + r_in C_out (r_out + C_in) work
        instead of M (r_in C_in + r_out C_out + C_in C_out). The cheaper order for the M pooled tokens is
        taken, so MACs are the release's only up to a width's switch point: M <= 48 for C = 192 (WeightFormer-T
        at 224 px, M = 49, runs core first), M <= 96 for C = 384 (docs/spec/weightformer.md 2). Both orders
        equal up to rounding; a symbolic M (an exported graph of any size) keeps both and picks per input.
        """
        return self.correlation_of_pooled(*self.pooled_tokens(x, grid_size))

    def correlation_of_pooled(self, pooled: torch.Tensor, norm: int) -> tuple[torch.Tensor, float]:
        """correlation() from pooled_tokens' output (a streamed pass can pool band by band)."""
        # which weights exist says which predictor this is (hasattr is static under TorchScript)
        left_map: torch.Tensor | None = None
        right_map: torch.Tensor | None = None
        if hasattr(self, "w1"):  # bilateral, gap
            left, right = F.silu(self.wfm(pooled)).split(self.split, dim=-1)
            left_map, right_map = self.w1, self.w2
        elif hasattr(self, "wfm"):  # deep
            left, right, right_map = pooled, F.silu(self.wfm(pooled)), self.w2
        elif self.predictor == "linear":
            left, right, right_map = pooled, pooled, self.w2
        else:  # nonlinear
            left, right = pooled, F.silu(pooled @ self.w2)
        return _low_rank_correlation(left, left_map, right, right_map), self.scale / norm

    def delta_weight(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        """Per-sample dW of shape (B, C_in, C_out), after amplitude-direction normalisation."""
        g, scale = self.correlation(x, grid_size)
        return g / amplitude_denominator(g, [-2], scale)  # = amplitude_direction(s G)

    def forward(self, x: torch.Tensor, grid_size: tuple[int, int]) -> torch.Tensor:
        """x: (B, N, C_in) tokens of an H x W grid (row-major) -> (B, N, C_out).

        W0 + dW in one addcdiv, x W + b in one baddbmm with the bias in the activation dtype.
        """
        if not torch.jit.is_scripting():
            _check_grid(x, grid_size, self.in_features)
        return self.apply_weight(x, self.dynamic_weight(*self.correlation(x, grid_size)))

    def dynamic_weight(self, g: torch.Tensor, scale: float) -> torch.Tensor:
        """W0 + dW, (B, C_in, C_out) in float32, from correlation(): one addcdiv (g is float32, and neither the
        norm nor addcdiv is an op autocast lowers, so this stays float32 under autocast)."""
        return torch.addcdiv(self.w.to(g.dtype), g, amplitude_denominator(g, [-2], scale))

    def apply_weight(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x W + b for tokens x (B, n, C_in) in the activation dtype (autocast's, when it is on)."""
        amp = autocast_dtype(x)
        dtype = x.dtype if amp is None else amp
        x, weight = x.to(dtype), weight.to(dtype)
        bias = self.b
        if bias is None:
            return torch.bmm(x, weight)
        return torch.baddbmm(bias.to(dtype), x, weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, predictor={self.predictor}"


COND_RUNS_SYMBOLIC = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 10)


def _low_rank_correlation(
    left: torch.Tensor, left_map: torch.Tensor | None, right: torch.Tensor, right_map: torch.Tensor | None
) -> torch.Tensor:
    """(left @ left_map)^T (right @ right_map), (B, M, a) x (a, C_in) and (B, M, b) x (b, C_out) -> (B, C_in, C_out),
    in the cheaper association; the token sum accumulates in float32 (float64 for float64 inputs)."""
    B, M, a = left.shape
    b = right.shape[-1]
    c_in = a if left_map is None else left_map.shape[-1]
    c_out = b if right_map is None else right_map.shape[-1]
    left_cost = 0 if left_map is None else a * c_in
    right_cost = 0 if right_map is None else b * c_out
    factors_first = M * (left_cost + right_cost + c_in * c_out)
    core_first = M * a * b + (0 if right_map is None else a * c_out * b) + (0 if left_map is None else c_in * a * c_out)
    if not torch.jit.is_scripting():
        if isinstance(M, torch.SymInt) and (left_map is not None or right_map is not None):
            # a symbolic token count (torch.export with dynamic H, W): a Python choice would become a guard that
            # fails at the other order's sizes, so the graph keeps both orders and picks per input, as eager does.
            # torch < 2.10 cannot run such a cond (its schema check calls numel() on symbolic sizes): there the
            # graph takes the order that is cheaper at large sizes (the same values up to rounding)
            if not COND_RUNS_SYMBOLIC:
                return _correlation_in_order(left, left_map, right, right_map, False)
            return _correlation_in_cond(factors_first <= core_first, left, left_map, right, right_map)
    return _correlation_in_order(left, left_map, right, right_map, factors_first <= core_first)


def _correlation_in_order(
    left: torch.Tensor,
    left_map: torch.Tensor | None,
    right: torch.Tensor,
    right_map: torch.Tensor | None,
    factors_first: bool,
) -> torch.Tensor:
    """The correlation with the maps applied per token first (the release's order) or after the token sum."""
    if factors_first:  # maps applied per token (under autocast, as the release does)
        left = left if left_map is None else left @ left_map
        right = right if right_map is None else right @ right_map
        left_map = right_map = None
    return _correlation_core_first(left, left_map, right, right_map)


def _correlation_in_cond(
    factors_first,
    left: torch.Tensor,
    left_map: torch.Tensor | None,
    right: torch.Tensor,
    right_map: torch.Tensor | None,
) -> torch.Tensor:
    """_correlation_in_order as torch.cond on a symbolic choice: both orders in the graph, one runs per input."""

    def in_order(order: bool):
        return lambda lt, rt: _correlation_in_order(lt, left_map, rt, right_map, order)

    # torch.cond takes no operands that alias each other (left and right are views of one tensor where a
    # predictor splits one projection); the pooled tokens are small, so one copy costs nothing
    return torch.cond(factors_first, in_order(True), in_order(False), (left, right.clone()))


@eager_autocast_off  # the token sum and the maps in float32 even under autocast
def _correlation_core_first(
    left: torch.Tensor, left_map: torch.Tensor | None, right: torch.Tensor, right_map: torch.Tensor | None
) -> torch.Tensor:
    """left_map^T (left^T right) right_map in the accumulation dtype (a missing map is the identity)."""
    acc = torch.float64 if left.dtype == torch.float64 else torch.float32
    g = left.to(acc).transpose(1, 2) @ right.to(acc)  # (B, a, b)
    if right_map is not None:
        g = g @ right_map.to(acc)
    if left_map is not None:
        g = torch.bmm(left_map.to(acc).t().expand(left.shape[0], -1, -1), g)  # no copy of the transposed map
    return g


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
            raise UsageError(f"unknown predictor {predictor!r}; choose from {CONV_PREDICTORS}")
        self.dim, self.predictor, self.kernel_size = dim, predictor, kernel_size
        taps = 1 if predictor == "adaptive" else kernel_size * kernel_size
        self.w = nn.Parameter(torch.empty(dim, 1, kernel_size, kernel_size))
        self.b = nn.Parameter(torch.empty(dim))
        self.register_buffer("identity_tap", identity_tap(kernel_size), persistent=False)
        self.register_load_state_dict_post_hook(refill_after_load)
        self.wfm = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size=1),
            nn.GELU(),
            nn.Conv2d(dim, dim * taps, kernel_size=1, bias=False),
        )
        trunc_normal_(self.w, std=0.02)
        trunc_normal_(self.b, std=0.02)

    def init_non_persistent_buffers(self) -> None:
        """Refill identity_tap (timm.models._manipulate.reinit_non_persistent_buffers calls this)."""
        refill_identity_tap(self, self.kernel_size, self.w)

    def _raw_delta(self, x: torch.Tensor) -> torch.Tensor:
        B, C, _, _ = x.shape
        k = self.kernel_size
        if self.predictor == "adaptive":
            return self.wfm(F.adaptive_avg_pool2d(x, k))
        return self.wfm(x.mean(dim=(2, 3), keepdim=True)).reshape(B, C, k, k)

    def delta_kernel(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample dK of shape (B, C, k, k)."""
        return amplitude_direction(self._raw_delta(x), dim=[-2, -1])

    def forward(self, x: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """x: (B, C, H, W) -> (B, C, H, W), 'same' padding; with ``residual``, x + that, in the same conv.

        A channels-last x (the token-major grid viewed as NCHW) is convolved in place of layout at
        batch 1; K0 (+ I) + dK is one addcdiv, and the bias is passed as it is at batch 1.
        """
        if not torch.jit.is_scripting():
            if not stateless_call() and (x.dim() != 4 or x.shape[1] != self.dim):
                raise ValueError(f"expected (B, {self.dim}, H, W), got {tuple(x.shape)}")
        B, C, H, W = x.shape
        k = self.kernel_size
        base = self.w + self.identity_tap if residual else self.w  # derived every call: never stale
        raw = self._raw_delta(x)
        kernel = torch.addcdiv(base.view(1, C, k, k), raw, amplitude_denominator(raw, [-2, -1]))  # K0 + dK
        if is_exporting():  # ONNX / pt2 with a symbolic batch: conv groups must be constant
            return per_sample_depthwise(x, kernel.to(x.dtype), self.b.to(x.dtype))
        kernel = kernel.reshape(B * C, 1, k, k)
        bias = self.b if not stateless_call() and B == 1 else self.b.repeat(B)
        out = F.conv2d(x.reshape(1, B * C, H, W), kernel.to(x.dtype), bias.to(x.dtype), padding=k // 2, groups=B * C)
        return out.reshape(B, C, H, W)


__all__ = [
    "DynamicLinear",
    "DynamicDWConv",
    "amplitude_direction",
    "identity_tap",
    "LINEAR_PREDICTORS",
    "CONV_PREDICTORS",
]
