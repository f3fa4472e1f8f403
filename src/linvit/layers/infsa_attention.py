"""InfSA token mixers as drop-in `attn_layer`s for timm's VisionTransformer.

Each module keeps timm's Attention parameter layout (qkv, q_norm, k_norm, norm, proj), so timm
tooling (weight init, checkpoint filters, layer-wise lr decay) works unchanged, and adds a per-head
discount gamma = sigmoid(theta) that trains (the reference release freezes it through `.item()`).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import linear_infsa, pure_infsa, soft_query
from ..ops._common import no_autocast
from ..ops.infsa import l1_normalize


class _InfSABase(nn.Module):
    """Shared projections, per-head learnable discount and output path of the InfSA attentions."""

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
        gamma_init: float = 0.9,
        eps: float = 1e-6,
        **kwargs,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if not 0.0 < gamma_init < 1.0:
            raise ValueError(f"gamma_init must lie in (0, 1), got {gamma_init}")
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer must be given when qk_norm or scale_norm is set")
        dd = {k: kwargs.pop(k) for k in ("device", "dtype") if k in kwargs}
        kwargs.pop("depth", None)
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.gamma_init = gamma_init
        self.eps = eps
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **dd) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(dim, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.theta = nn.Parameter(torch.empty(num_heads, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """gamma = sigmoid(theta) starts at gamma_init in every head (timm's init calls this)."""
        with torch.no_grad():
            self.theta.fill_(math.log(self.gamma_init / (1.0 - self.gamma_init)))

    @property
    def gamma(self) -> torch.Tensor:
        """Per-head discount in (0, 1), shape (H,)."""
        return torch.sigmoid(self.theta)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, N, C) -> q, k, v of shape (B, H, N, D), with optional q/k norms."""
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) -> projected (B, N, C)."""
        B, H, N, D = out.shape
        return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(B, N, H * D))))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, gamma_init={self.gamma_init}"


class PureInfSAAttention(_InfSABase):
    """Pure InfSA: one Frobenius-normalised diffusion hop, gamma * A^ v (quadratic in tokens).

    ``impl`` selects the dense form, the memory-bounded two-pass form, or "auto" (by size).
    """

    def __init__(self, dim: int, num_heads: int = 8, *, impl: str = "auto", block_size: int | None = None, **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.impl = impl
        self.block_size = block_size

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        q, k, v = self.project_qkv(x)
        if is_causal:
            N = x.shape[1]
            causal = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
            attn_mask = causal if attn_mask is None else attn_mask & causal
        out = pure_infsa(
            q,
            k,
            v,
            self.gamma,
            self.eps,
            impl=self.impl,
            block_size=self.block_size,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
        )
        return self.merge_heads(out)


class LinearInfSAAttention(_InfSABase):
    """Linear-InfSA: every token receives the importance-pooled value z (O(N) in tokens).

    With ``fold_kv=True`` (default) the K and V projections are folded into the soft query
    (spec/infsa.md section 3): a_j = ReLU(x_j . W_k^T q_bar + b_k . q_bar) and
    z = W_v (sum_j a_j x_j) + b_v sum_j a_j, so only Q is projected per token and the output
    projection runs once per sample. The result equals the unfolded module; q/k norms break the
    linearity in k, so with ``qk_norm`` the unfolded path is used.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, fold_kv: bool = True, **kwargs):
        super().__init__(dim, num_heads, **kwargs)
        self.fold_kv = fold_kv

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("Linear-InfSA pools all tokens into one state; attention masks are not supported")
        if self.fold_kv and isinstance(self.k_norm, nn.Identity) and isinstance(self.q_norm, nn.Identity):
            return self._forward_folded(x)
        q, k, v = self.project_qkv(x)
        out = linear_infsa(q, k, v, self.gamma, self.eps, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.merge_heads(out)

    def importance(self, x: torch.Tensor) -> torch.Tensor:
        """Token importance a of shape (B, H, N) for the (already normalised) block input x."""
        return self._folded_state(x)[0]

    def _folded_state(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Importance a (B, H, N) and pooled value z (B, H, D) before gamma, from one Q projection."""
        B, N, C = x.shape
        H, D = self.num_heads, self.head_dim
        w_q, w_k, w_v = self.qkv.weight.chunk(3)
        b_q, b_k, b_v = self.qkv.bias.chunk(3) if self.qkv.bias is not None else (None, None, None)
        q = F.linear(x, w_q, b_q).reshape(B, N, H, D).transpose(1, 2)
        with no_autocast(x):
            q_bar = soft_query(q, self.eps)  # (B, H, D), already scaled by 1/sqrt(D)
            acc = q_bar.dtype
            xa = x.to(acc)
            q_key = q_bar * D**-0.5  # the release scales k by 1/sqrt(D) too
            u = torch.einsum("bhd,hdc->bhc", q_key, w_k.to(acc).reshape(H, D, C))
            logits = torch.einsum("bnc,bhc->bhn", xa, u)
            if b_k is not None:
                logits = logits + torch.einsum("bhd,hd->bh", q_key, b_k.to(acc).reshape(H, D))[..., None]
            a = l1_normalize(torch.relu(logits), self.eps)
            if self.training and self.attn_drop.p > 0:
                a = self.attn_drop(a)
            pooled_x = torch.einsum("bhn,bnc->bhc", a, xa)
            z = torch.einsum("bhc,hdc->bhd", pooled_x, w_v.to(acc).reshape(H, D, C))
            if b_v is not None:
                z = z + a.sum(-1, keepdim=True) * b_v.to(acc).reshape(H, D)
        return a, z

    def _forward_folded(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        _, z = self._folded_state(x)
        z = (self.gamma.to(z.dtype)[:, None] * z).to(x.dtype).reshape(B, 1, C)
        y = self.proj(self.norm(z)).expand(B, N, C)  # identical rows: project once per sample
        return self.proj_drop(y) if self.training and self.proj_drop.p > 0 else y
