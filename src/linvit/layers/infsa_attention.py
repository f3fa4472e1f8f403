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

from ..ops import katz_infsa, linear_infsa, pure_infsa
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
        q_key = self._soft_query_key([x])
        with no_autocast(x):
            logits = self._key_logits(x.to(q_key.dtype), q_key)
            return l1_normalize(torch.relu(logits), self.eps)

    def _qkv_slices(self):
        w_q, w_k, w_v = self.qkv.weight.chunk(3)
        b_q, b_k, b_v = self.qkv.bias.chunk(3) if self.qkv.bias is not None else (None, None, None)
        return w_q, w_k, w_v, b_q, b_k, b_v

    def _soft_query_key(self, chunks) -> torch.Tensor:
        """Soft query over all chunks, pre-scaled for the key side: q_bar / sqrt(D), shape (B, H, D).

        q_bar = sum_i e_i q~_i / (sum_i e_i + eps) is accumulated chunk by chunk (numerator and
        denominator), so the Q projection never needs all tokens at once.
        """
        H, D = self.num_heads, self.head_dim
        w_q, _, _, b_q, _, _ = self._qkv_slices()
        num = den = None
        for xc in chunks:
            B, n, _ = xc.shape
            q = F.linear(xc, w_q, b_q).reshape(B, n, H, D).transpose(1, 2)
            qs = q.to(torch.float64 if q.dtype == torch.float64 else torch.float32) * D**-0.5
            with no_autocast(qs):
                energy = torch.linalg.vector_norm(qs, dim=-1)  # (B, H, n)
                part_num, part_den = torch.einsum("bhn,bhnd->bhd", energy, qs), energy.sum(-1)
            num, den = (part_num, part_den) if num is None else (num + part_num, den + part_den)
        return num / (den[..., None] + self.eps) * D**-0.5

    def _key_logits(self, xa: torch.Tensor, q_key: torch.Tensor) -> torch.Tensor:
        """q_bar . k~_j for every token of xa without projecting K: x_j . (W_k^T q_key) + b_k . q_key."""
        H, D, C = self.num_heads, self.head_dim, xa.shape[-1]
        _, w_k, _, _, b_k, _ = self._qkv_slices()
        u = torch.einsum("bhd,hdc->bhc", q_key, w_k.to(q_key.dtype).reshape(H, D, C))
        logits = torch.einsum("bnc,bhc->bhn", xa, u)
        if b_k is not None:
            logits = logits + torch.einsum("bhd,hd->bh", q_key, b_k.to(q_key.dtype).reshape(H, D))[..., None]
        return logits

    def pooled_output(self, chunks) -> torch.Tensor:
        """The mixer output shared by every token, (B, 1, C), from a re-iterable of input chunks.

        Two streaming passes (soft query, then importance-weighted sums), with K and V folded:
        z = gamma * (W_v sum_j a_j x_j + b_v sum_j a_j), a_j = ReLU(logit_j) / (sum_l ReLU(logit_l) + eps).
        Only O(B H C) state is kept between chunks, so memory is bounded by the chunk size.
        """
        H, D = self.num_heads, self.head_dim
        _, _, w_v, _, _, b_v = self._qkv_slices()
        first = next(iter(chunks))
        B, _, C = first.shape
        q_key = self._soft_query_key(chunks)  # the Q projection itself may run under autocast
        with no_autocast(first):
            acc = q_key.dtype
            total = mass = pooled_x = None
            for xc in chunks:
                xa = xc.to(acc)
                a = torch.relu(self._key_logits(xa, q_key))
                kept = self.attn_drop(a) if self.training and self.attn_drop.p > 0 else a
                parts = (a.sum(-1), kept.sum(-1), torch.einsum("bhn,bnc->bhc", kept, xa))
                total, mass, pooled_x = (
                    parts if total is None else (total + parts[0], mass + parts[1], pooled_x + parts[2])
                )
            scale = 1.0 / (total + self.eps)  # the L1 normalisation of a, applied once at the end
            z = torch.einsum("bhc,hdc->bhd", pooled_x * scale[..., None], w_v.to(acc).reshape(H, D, C))
            if b_v is not None:
                z = z + (mass * scale)[..., None] * b_v.to(acc).reshape(H, D)
            z = (self.gamma.to(acc)[:, None] * z).to(first.dtype).reshape(B, 1, C)
        return self.proj(self.norm(z))

    def _forward_folded(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        y = self.pooled_output([x]).expand(B, N, C)  # identical rows: projected once per sample
        return self.proj_drop(y) if self.training and self.proj_drop.p > 0 else y


class KatzInfSAAttention(_InfSABase):
    """Katz-InfSA: the exact infinite-hop series sum_t gamma^t A^^t v in O(N d^2) (linvit.ops.katz_infsa).

    Token-dependent outputs like pure InfSA, linear cost like Linear-InfSA. The attention matrix is
    never formed, so attention dropout and masks are not available.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, feature_map: str = "relu", **kwargs):
        if kwargs.get("attn_drop", 0.0):
            raise ValueError("Katz-InfSA never forms the attention matrix; attn_drop must be 0")
        super().__init__(dim, num_heads, **kwargs)
        self.feature_map = feature_map

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("Katz-InfSA works on low-rank factors; attention masks are not supported")
        q, k, v = self.project_qkv(x)
        return self.merge_heads(katz_infsa(q, k, v, self.gamma, self.eps, feature_map=self.feature_map))
