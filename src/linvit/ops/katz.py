"""Katz-InfSA: the exact infinite-hop InfSA series in linear time (spec/infsa.md section 5, ours).

With a non-negative feature map phi applied to q and k separately, A = phi(Q) phi(K)^T has rank <= d,
so with s = ||A||_F + eps, U = phi(Q)/sqrt(s), W = phi(K)/sqrt(s) (A^ = U W^T):
    ||A||_F^2           = sum((phi(Q)^T phi(Q)) * (phi(K)^T phi(K)))
    sum_t gamma^t A^^t V = gamma U (I_d - gamma W^T U)^{-1} W^T V
    Katz centrality      = ((I - gamma A^)^{-1} - I)^T 1 = gamma W (I_d - gamma U^T W)^{-1} U^T 1
    left Perron vector   = W u, u the Perron vector of the d x d matrix U^T W
all in O(N d^2 + d^3) per head. rho(gamma A^) <= gamma ||A^||_F < 1, so the series converges.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from ._common import GammaLike, accumulation_dtype, check_qkv, gamma_as_tensor, no_autocast

FeatureMap = Literal["relu", "elu+1"]


def feature_map(t: torch.Tensor, kind: FeatureMap = "relu") -> torch.Tensor:
    """phi(t / sqrt(d)): ReLU or ELU + 1 of the scaled queries/keys (non-negative)."""
    t = t * math.sqrt(1.0 / t.shape[-1])
    if kind == "relu":
        return torch.relu(t)
    if kind == "elu+1":
        return F.elu(t) + 1.0
    raise ValueError(f"feature_map must be 'relu' or 'elu+1', got {kind!r}")


def _factors(q, k, eps, kind):
    """phi(Q), phi(K) in the accumulation dtype and s = ||phi(Q) phi(K)^T||_F + eps, shape (B, H, 1, 1)."""
    acc = accumulation_dtype(q)
    fq, fk = feature_map(q.to(acc), kind), feature_map(k.to(acc), kind)
    gram = (fq.transpose(-2, -1) @ fq) * (fk.transpose(-2, -1) @ fk)
    s = gram.sum(dim=(-2, -1), keepdim=True).clamp_min(0).sqrt() + eps
    return fq, fk, s


def _eye_minus(m: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return torch.eye(m.shape[-1], dtype=m.dtype, device=m.device) - g * m


def katz_infsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: FeatureMap = "relu",
) -> torch.Tensor:
    """sum_{t>=1} gamma^t A^^t v exactly, A^ = phi(Q) phi(K)^T / (||.||_F + eps); (B, H, N, D) -> same.

    The d x d solve and the norm run in float32 (float64 for float64 inputs) even under autocast.
    Degenerate inputs (phi(Q) or phi(K) all zero) give a zero output, never NaN.
    """
    check_qkv(q, k, v)
    with no_autocast(v):
        fq, fk, s = _factors(q, k, eps, feature_map)
        g = gamma_as_tensor(gamma, q.shape[1], fq)
        m = (fk.transpose(-2, -1) @ fq) / s  # W^T U, (B, H, d, d)
        rhs = (fk.transpose(-2, -1) @ v.to(fq.dtype)) / s  # W^T V with U's 1/sqrt(s) folded in: (B, H, d, D)
        out = g * (fq @ torch.linalg.solve(_eye_minus(m, g), rhs))
    return out.to(v.dtype)


def katz_centrality(
    q: torch.Tensor, k: torch.Tensor, gamma: GammaLike, eps: float = 1e-6, feature_map: FeatureMap = "relu"
) -> torch.Tensor:
    """Katz in-centrality ((I - gamma A^)^{-1} - I)^T 1 of every token, shape (B, H, N)."""
    with no_autocast(q):
        fq, fk, s = _factors(q, k, eps, feature_map)
        g = gamma_as_tensor(gamma, q.shape[1], fq)
        m = (fq.transpose(-2, -1) @ fk) / s  # U^T W
        rhs = fq.sum(dim=-2, keepdim=True).transpose(-2, -1) / s  # U^T 1 (scaled), (B, H, d, 1)
        return (g * (fk @ torch.linalg.solve(_eye_minus(m, g), rhs)))[..., 0]


def perron_vector(
    q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, feature_map: FeatureMap = "relu", iters: int = 200
) -> torch.Tensor:
    """Left Perron vector of A^ (principal eigenvector of A^^T), L1-normalised, shape (B, H, N).

    Power iteration on the d x d matrix P = U^T W shifted by I (same eigenvectors, aperiodic), then
    x = W u. Costs O(N d^2 + iters d^2). Tokens with phi(k) = 0 get exactly 0.
    """
    with no_autocast(q):
        fq, fk, s = _factors(q, k, eps, feature_map)
        p = (fq.transpose(-2, -1) @ fk) / s
        p = p + torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
        u = torch.ones(*p.shape[:-1], 1, dtype=p.dtype, device=p.device)
        for _ in range(iters):
            u = p @ u
            u = u / u.sum(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
        x = (fk @ u)[..., 0]
        return x / x.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
