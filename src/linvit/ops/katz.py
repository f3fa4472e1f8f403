"""Katz-InfSA: the exact infinite-hop InfSA series in linear time (docs/spec/infsa.md section 4, ours).

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

import torch

from .common import (
    GammaLike,
    accumulation_dtype,
    as_batched,
    check_qkv,
    eager_autocast_off,
    elu_plus_one,
    gamma_as_tensor,
    is_exporting,
    no_autocast,
    products_dtype,
    sum_over_tokens,
)


def feature_map(t: torch.Tensor, kind: str = "relu") -> torch.Tensor:
    """phi(t / sqrt(d)): ReLU or ELU + 1 of the scaled queries/keys (non-negative); "identity" takes t as the
    features themselves (a learned map's output, layers.feature_maps)."""
    if kind == "identity":
        return t
    t = t * math.sqrt(1.0 / t.shape[-1])
    if kind == "relu":
        return torch.relu(t)
    if kind == "elu+1":
        return elu_plus_one(t)
    raise ValueError(f"feature_map must be 'relu', 'elu+1' or 'identity', got '{kind}'")


def katz_features(t: torch.Tensor, kind: str = "relu", dtype: torch.dtype | None = None) -> tuple[torch.Tensor, float]:
    """f and c^2 with phi(t) = c f, (B, H, N, d) in dtype (default: the accumulation dtype), laid out for
    batched products (as_batched: one copy at most, where each token sum would otherwise copy t again).

    ReLU is positively homogeneous, so its 1/sqrt(d) stays in the scalar c^2 = 1/d and the N-sized factor
    is never rescaled; ELU + 1 is not, so there c = 1, and neither for "identity" (t are the features).
    """
    t = as_batched(t, accumulation_dtype(t) if dtype is None else dtype)
    if kind == "relu":
        return torch.relu(t), 1.0 / t.shape[-1]
    return feature_map(t, kind), 1.0


def feature_dtype(t: torch.Tensor, kind: str) -> torch.dtype:
    """The dtype Katz-InfSA's token features are multiplied in: products_dtype(t), except ELU + 1's, which stay
    in the accumulation dtype: its features are 1 + t / sqrt(d) for small t, and bfloat16's 8-bit mantissa would
    keep little of the part that differs between tokens (1.1e-2 relative error in a converted ViT)."""
    return accumulation_dtype(t) if kind == "elu+1" else products_dtype(t)


def _norm_ratio(gram_q: torch.Tensor, gram_k: torch.Tensor, eps: float, c2: float) -> torch.Tensor:
    """r = c^2 / s with s = ||phi(Q) phi(K)^T||_F + eps = c^2 sqrt(sum(fq^T fq * fk^T fk)) + eps, (B, H, 1, 1).

    The clamp keeps the square root's gradient finite where phi(Q) or phi(K) is all zero (sqrt'(0) is
    infinite: NaN gradients for the whole layer); any sum that small is far below eps."""
    squared = gram_q.flatten(-2).unsqueeze(-2) @ gram_k.flatten(-2).unsqueeze(-1)  # sum of products, one op
    return 1.0 / (squared.clamp_min(1e-30).sqrt() + eps / c2)


def _factors(q: torch.Tensor, k: torch.Tensor, eps: float, kind: str):
    """fq, fk with phi = c f and r = c^2 / s, shape (B, H, 1, 1)."""
    (fq, c2), (fk, _) = katz_features(q, kind), katz_features(k, kind)
    return fq, fk, _norm_ratio(sum_over_tokens(fq, fq), sum_over_tokens(fk, fk), eps, c2)


# fq^T fq, fk^T fk, fk^T fq, fk^T v (see katz_token_sums)
KatzSums = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# terms of the Katz series summed in exported graphs: 2^EXPORT_SQUARINGS (see neumann_by_squaring)
EXPORT_SQUARINGS = 20


def _eye_minus(m: torch.Tensor) -> torch.Tensor:
    """I - m for (..., d, d) matrices, out of place (graphs for torch.export / ONNX must be functional)."""
    return torch.eye(m.shape[-1], dtype=m.dtype, device=m.device) - m


def katz_token_sums(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor) -> KatzSums:
    """The four d x d / d x D token sums Katz-InfSA needs, fq^T fq, fk^T fk, fk^T fq, fk^T v, in the
    accumulation dtype (features from katz_features; half ones multiply in half, see sum_over_tokens).

    They add over token chunks, so a streaming pass can accumulate them chunk by chunk.
    """
    v = as_batched(v, fq.dtype)
    return sum_over_tokens(fq, fq), sum_over_tokens(fk, fk), sum_over_tokens(fk, fq), sum_over_tokens(fk, v)


def katz_mixing(sums: KatzSums, gamma: GammaLike, eps: float, c2: float) -> torch.Tensor:
    """X of shape (B, H, d, D) with sum_t gamma^t A^^t V = fq X, from katz_token_sums (phi = c f, c^2 = c2).

    X = gamma c^2 / s (I - gamma c^2 / s fk^T fq)^{-1} fk^T V: every scale acts on a d x d or d x D matrix.
    The solve reports no errors (no host synchronisation); the system is always invertible since
    rho(gamma A^) <= gamma ||A^||_F < 1.
    """
    gram_q, gram_k, kq, kv = sums
    gr = gamma_as_tensor(gamma, kq.shape[1], kq) * _norm_ratio(gram_q, gram_k, eps, c2)  # (B, H, 1, 1)
    if is_exporting():  # ONNX has no linear solve: the same series, summed by squaring
        return neumann_by_squaring(kq * gr) @ (kv * gr)
    return torch.linalg.solve_ex(_eye_minus(kq * gr), kv * gr, check_errors=False)[0]


def neumann_by_squaring(m: torch.Tensor, squarings: int = EXPORT_SQUARINGS) -> torch.Tensor:
    """(I - m)^{-1} = prod_j (I + m^(2^j)) for spectral radius rho(m) < 1, with 2^squarings terms of the series.

    Matrix products only (what exported graphs support); the truncation error is m^(2^squarings), below
    1e-8 for rho(m) <= 1 - 2e-5 at the default 20 squarings (2^20 terms).
    """
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    inverse, power = eye + m, m
    for _ in range(squarings - 1):
        power = power @ power
        inverse = inverse + inverse @ power
    return inverse


def katz_infsa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: str = "relu",
) -> torch.Tensor:
    """sum_{t>=1} gamma^t A^^t v exactly, A^ = phi(Q) phi(K)^T / (||.||_F + eps); (B, H, N, D) -> same.

    The d x d solve, the norm and every sum over tokens run in float32 (float64 for float64 inputs) even under
    autocast; token products stay in half precision where the device sums them in float32 (products_dtype).
    Degenerate inputs (phi(Q) or phi(K) all zero) give a zero output, never NaN.
    """
    check_qkv(q, k, v)
    return _katz_infsa(q, k, v, gamma, eps, feature_map)


@eager_autocast_off
def _katz_infsa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: GammaLike, eps: float, feature_map: str):
    fq, mixing = katz_factors(q, k, v, gamma, eps, feature_map)
    return (fq @ mixing_as(mixing, fq.dtype)).to(v.dtype)


def katz_infsa_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: str = "relu",
) -> torch.Tensor:
    """Katz-InfSA with every query's weights summing to 1: y_i = sum_j M_ij v_j / (sum_j M_ij + eps), with
    M = sum_{t>=1} gamma^t A^^t as in katz_infsa; (B, H, N, D) -> same.

    The row sums M 1 come from the same solve as M V (a column of ones beside the values), so the cost stays
    O(N d^2). Softmax's and linear attention's rows sum to 1; Katz-InfSA's vary with each query's features
    (docs/results.md, why Katz students keep less). The division runs in the accumulation dtype; a query whose
    row is all zero (ReLU features all zero) gets 0.
    """
    check_qkv(q, k, v)
    return _katz_infsa_rows(q, k, v, gamma, eps, feature_map)


@eager_autocast_off
def _katz_infsa_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: GammaLike, eps: float, feature_map: str):
    fq, mixing = katz_factors(q, k, with_ones(v), gamma, eps, feature_map)
    return divide_rows(fq @ mixing_as(mixing, fq.dtype), eps).to(v.dtype)


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """v with a column of ones after its D columns, (B, H, N, D + 1), in v's dtype (1 is exact in any)."""
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def divide_rows(mixed: torch.Tensor, eps: float) -> torch.Tensor:
    """(M [V, 1]) -> M V / (M 1 + eps), in the accumulation dtype: the last column is each query's row sum."""
    mixed = mixed.to(accumulation_dtype(mixed))
    return mixed[..., :-1] / (mixed[..., -1:] + eps)


def mixing_as(mixing: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The mixing X (or X folded into a projection) in the token features' dtype. float16 saturates at its
    largest finite value instead of overflowing: X is that large (~gamma c^2 / eps) only in a head whose
    features are (almost) all zero, where f X is ~0, and an inf would make it 0 * inf = NaN."""
    if dtype == torch.float16:
        mixing = mixing.clamp(-65504.0, 65504.0)  # float16's largest finite value (TorchScript has no finfo)
    return mixing.to(dtype)


def katz_factors(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: GammaLike, eps: float, feature_map: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """f = phi(q) / c (B, H, N, d) in feature_dtype(q) and the mixing X (B, H, d, D) in the accumulation
    dtype, with katz_infsa(q, k, v) = f X (call with autocast off). Layers that fold X into their output
    projection use these."""
    dtype = feature_dtype(q, feature_map)
    (fq, c2), (fk, _) = katz_features(q, feature_map, dtype), katz_features(k, feature_map, dtype)
    # exported graphs keep the d x d form: any N, a symbolic one never guarded
    if not is_exporting() and fq.shape[-2] <= fq.shape[-1]:  # N <= d tokens: an N x N system, small enough for float32
        acc = accumulation_dtype(q)
        return fq, katz_mixing_by_tokens(fq.to(acc), fk.to(acc), v, gamma, eps, c2)
    return fq, katz_mixing(katz_token_sums(fq, fk, v), gamma, eps, c2)


def katz_mixing_by_tokens(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, gamma: GammaLike, eps: float, c2: float
) -> torch.Tensor:
    """katz_mixing's X through the N x N system, for N <= d tokens, where it is cheaper in every term.

    Push-through identity: (I_d - g fk^T fq)^{-1} fk^T = fk^T (I_N - g fq fk^T)^{-1}, so with g = gamma c^2 / s,
    X = g fk^T (I_N - g fq fk^T)^{-1} V: an N^3 solve instead of a d^3 one and no d x d token sums (a 64 x 64
    solve per head dominated Katz-InfSA's training step at 17 tokens). ||fq fk^T||_F is the norm that
    _norm_ratio computes from the two grams.
    """
    a = fq @ fk.transpose(-2, -1)  # (B, H, N, N)
    norm = torch.linalg.vector_norm(a, dim=(-2, -1), keepdim=True)
    g = gamma_as_tensor(gamma, a.shape[1], a) / (norm + eps / c2)  # (B, H, 1, 1)
    z = torch.linalg.solve_ex(_eye_minus(a * g), v.to(a.dtype), check_errors=False)[0]
    return (fk.transpose(-2, -1) @ z) * g


def katz_operator(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, feature_map: str = "relu"):
    """The dense operator Katz-InfSA diffuses over, A^ = phi(Q) phi(K)^T / (||.||_F + eps), (B, H, N, N)."""
    (fq, c2), (fk, _) = katz_features(q, feature_map), katz_features(k, feature_map)
    A = fq @ fk.transpose(-2, -1)
    return A / (torch.linalg.vector_norm(A, dim=(-2, -1), keepdim=True) + eps / c2)  # c^2 cancels but in eps


def katz_kernel(A: torch.Tensor, gamma: GammaLike) -> torch.Tensor:
    """The Katz kernel sum_{t>=1} (gamma A)^t = (I - gamma A)^{-1} - I of dense (B, H, N, N) operators."""
    g = gamma_as_tensor(gamma, A.shape[1], A)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.inv(eye - g * A) - eye


def perron_vector_dense(A: torch.Tensor, iters: int = 500) -> torch.Tensor:
    """Left Perron vector (B, H, N) of a dense non-negative A, L1-normalised: power iteration on (A + I)^T
    (the shift keeps the eigenvectors and makes the iteration aperiodic)."""
    At = A.transpose(-2, -1) + torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    v = torch.full(A.shape[:-1], 1.0 / A.shape[-1], dtype=A.dtype, device=A.device)
    for _ in range(iters):
        v = (At @ v[..., None])[..., 0]
        v = v / v.sum(-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)
    return v


def katz_centrality(
    q: torch.Tensor, k: torch.Tensor, gamma: GammaLike, eps: float = 1e-6, feature_map: str = "relu"
) -> torch.Tensor:
    """Katz in-centrality ((I - gamma A^)^{-1} - I)^T 1 of every token, shape (B, H, N)."""
    with no_autocast(q):
        fq, fk, r = _factors(q, k, eps, feature_map)
        gr = gamma_as_tensor(gamma, q.shape[1], fq) * r
        system = _eye_minus((fq.transpose(-2, -1) @ fk) * gr)  # I - gamma U^T W
        rhs = fq.sum(dim=-2, keepdim=True).transpose(-2, -1) * gr  # gamma U^T 1 (scaled), (B, H, d, 1)
        return (fk @ torch.linalg.solve_ex(system, rhs, check_errors=False)[0])[..., 0]


def katz_column_sums(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, feature_map: str = "relu") -> torch.Tensor:
    """Column sums of katz_operator, sum_i A^_ij = r fk_j . sum_i fq_i, shape (B, H, N), in O(N d)."""
    with no_autocast(q):
        fq, fk, r = _factors(q, k, eps, feature_map)
        return (fk @ fq.sum(dim=-2, keepdim=True).transpose(-2, -1))[..., 0] * r[..., 0]


def perron_vector(
    q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, feature_map: str = "relu", iters: int = 200
) -> torch.Tensor:
    """Left Perron vector of A^ (principal eigenvector of A^^T), L1-normalised, shape (B, H, N).

    Power iteration on the d x d matrix P = U^T W shifted by I (same eigenvectors, aperiodic), then
    x = W u. Costs O(N d^2 + iters d^2). Tokens with phi(k) = 0 get exactly 0.
    """
    with no_autocast(q):
        fq, fk, r = _factors(q, k, eps, feature_map)
        p = (fq.transpose(-2, -1) @ fk) * r
        p = p + torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
        u = torch.ones(*p.shape[:-1], 1, dtype=p.dtype, device=p.device)
        for _ in range(iters):
            u = p @ u
            u = u / u.sum(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
        x = (fk @ u)[..., 0]
        return x / x.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
