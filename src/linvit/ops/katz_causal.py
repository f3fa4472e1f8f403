"""Causal Katz-InfSA: the infinite-hop series of a causal graph in linear time (docs/spec/infsa.md section 4.1).

With a causal mask, A_ij = phi(q_i) . phi(k_j) / n_i for j <= i (0 above the diagonal) is lower-triangular, so
(I - gamma A) X = V is solved by forward substitution and the series sum_{t>=1} gamma^t A^t V = X - V needs only
a running d x D state per head:

    z_i = z_{i-1} + phi(k_i)                       n_i = phi(q_i) . z_i + eps    (prefix-only normaliser)
    a_i = phi(q_i) . phi(k_i) / n_i                h_i = gamma phi(q_i)^T S_{i-1} / n_i
    O_i = (gamma a_i V_i + h_i) / (1 - gamma a_i)  S_i = S_{i-1} + phi(k_i) (O_i + V_i)^T

n_i is row i's L1 norm, so A is (sub-)stochastic: every |O_i| <= gamma / (1 - gamma) max_j |V_j|, at any length.
Three forms of one operator: `causal_katz_dense` (O(N^2), the N x N triangular solve), `causal_katz_chunked`
(training: one C x C triangular solve per chunk, the state carried between chunks) and `causal_katz_recurrent`
(decoding, token by token). Both linear forms take and return the state, so a prompt processed in one call and
then continued token by token gives what one call over the whole sequence gives.

Packed sequences (several documents in one row, transformers' padding-free packing) are `resets` (B, N), True
where a document starts: the operator is then block-diagonal, one independent series per document, and the
linear forms empty the state at each start (a token of document s sees only document s's earlier tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .common import GammaLike, accumulation_dtype, check_qkv, gamma_as_tensor, no_autocast
from .katz import feature_map as _feature_map

# phi: ELU + 1, never zero. Each query's row is normalised to sum 1, so its output does not shrink with its
# scores; a row of small ReLU features (n_i far below its neighbours') is then a ratio of numbers that carry the
# input's absolute rounding error (half precision: 1.6% logit error on a tiny Qwen3, ELU + 1: 0.09%; spec 4.1)
FEATURES = "elu+1"
CHUNK = 64  # tokens per triangular solve in the chunked form: C^2 D work per chunk against N/C steps of state


class CausalKatzState(NamedTuple):
    """What causal Katz-InfSA carries from one position to the next, per sample and head, in float32
    (float64 for float64 inputs): S = sum_j phi(k_j) X_j^T (B, H, d, D) and z = sum_j phi(k_j) (B, H, d)."""

    S: torch.Tensor
    z: torch.Tensor


def empty_state(q: torch.Tensor, v: torch.Tensor) -> CausalKatzState:
    """The state before the first token (all zeros), for (B, H, N, d) queries and (B, H, N, D) values."""
    B, H, _, d = q.shape
    dtype = accumulation_dtype(q)
    return CausalKatzState(q.new_zeros(B, H, d, v.shape[-1], dtype=dtype), q.new_zeros(B, H, d, dtype=dtype))


def _inputs(q, k, v, gamma, feature_map, key_mask=None):
    """phi(q), phi(k), v in the accumulation dtype and gamma (1, H, 1, 1). key_mask (B, N) or (B, H, N), True =
    keep: a removed key's features are zero, so it adds nothing to any normaliser or state (padding)."""
    check_qkv(q, k, v)
    dtype = accumulation_dtype(q)
    fq, fk = _feature_map(q.to(dtype), feature_map), _feature_map(k.to(dtype), feature_map)
    if key_mask is not None:
        keep = key_mask[:, None] if key_mask.dim() == 2 else key_mask
        fk = fk * keep[..., None].to(dtype)
    return fq, fk, v.to(dtype), gamma_as_tensor(gamma, q.shape[1], fq)


def _check_state(state: CausalKatzState | None, q: torch.Tensor, v: torch.Tensor) -> CausalKatzState:
    if state is None:
        return empty_state(q, v)
    B, H, _, d = q.shape
    if tuple(state.S.shape) != (B, H, d, v.shape[-1]) or tuple(state.z.shape) != (B, H, d):
        raise ValueError(
            f"causal Katz state of shape S {tuple(state.S.shape)}, z {tuple(state.z.shape)} does not fit "
            f"q {tuple(q.shape)} and v {tuple(v.shape)}: it belongs to another batch, layer or model"
        )
    return state


def causal_katz_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: str = FEATURES,
    key_mask: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_{t>=1} gamma^t A^t v for the row-normalised causal operator A, from the N x N triangular system.

    O(N^2) memory: for tests and maps of short sequences; the linear forms compute the same. resets (B, N):
    True where a packed document starts; A then links only tokens of one document."""
    fq, fk, vv, g = _inputs(q, k, v, gamma, feature_map, key_mask)
    with no_autocast(fq):
        A = causal_katz_operator_from_features(fq, fk, eps, same_document(resets))
        system = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device) - g * A
        out = torch.linalg.solve_triangular(system, (g * A) @ vv, upper=False)
    return out.to(v.dtype)


def causal_katz_operator(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6, feature_map: str = FEATURES):
    """The dense causal operator A (B, H, N, N): phi(q_i) . phi(k_j) / n_i on and below the diagonal."""
    dtype = accumulation_dtype(q)
    return causal_katz_operator_from_features(
        _feature_map(q.to(dtype), feature_map), _feature_map(k.to(dtype), feature_map), eps
    )


def same_document(resets: torch.Tensor | None) -> torch.Tensor | None:
    """(B, 1, N, N) True where tokens i and j belong to one packed document; None without resets."""
    if resets is None:
        return None
    document = torch.cumsum(resets.long(), dim=-1)
    return (document[:, :, None] == document[:, None, :])[:, None]


def causal_katz_operator_from_features(
    fq: torch.Tensor, fk: torch.Tensor, eps: float, same: torch.Tensor | None = None
) -> torch.Tensor:
    scores = torch.tril(fq @ fk.transpose(-2, -1))
    if same is not None:
        scores = scores * same.to(scores.dtype)
    return scores / (scores.sum(-1, keepdim=True) + eps)  # n_i = phi(q_i) . sum_{j<=i} phi(k_j) + eps


def causal_katz_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: str = FEATURES,
    state: CausalKatzState | None = None,
    chunk_size: int = CHUNK,
    key_mask: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, CausalKatzState]:
    """Causal Katz-InfSA of (B, H, N, d) q, k and (B, H, N, D) v, continuing from state (None: the start).

    Returns the output (B, H, N, D) in v's dtype and the state after the last token. Per chunk of C tokens:
    O_c = (I - gamma A_cc)^{-1} (gamma A_cc V_c + gamma diag(1/n) phi(Q_c) S), one C x C triangular solve, then
    S += phi(K_c)^T (O_c + V_c). Everything runs in float32 (float64 for float64 inputs), autocast or not.
    key_mask (B, N) or (B, H, N), True = keep, removes keys (padding) from every later position; resets (B, N),
    True where a packed document starts, empties the state there."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    fq, fk, vv, g = _inputs(q, k, v, gamma, feature_map, key_mask)
    S, z = _check_state(state, q, v)
    document = torch.cumsum(resets.long(), dim=-1) if resets is not None else None
    state_document = q.new_zeros(q.shape[0], dtype=torch.long)  # the document the state belongs to (0: given)
    outs = []
    with no_autocast(fq):
        for start in range(0, q.shape[2], chunk_size):
            part = slice(start, start + chunk_size)
            if document is None:
                out, S, z = _chunk(fq[:, :, part], fk[:, :, part], vv[:, :, part], g, eps, S, z)
            else:
                out, S, z, state_document = _packed_chunk(
                    fq[:, :, part], fk[:, :, part], vv[:, :, part], g, eps, S, z, document[:, part], state_document
                )
            outs.append(out)
    out = torch.cat(outs, dim=2) if outs else vv
    return out.to(v.dtype), CausalKatzState(S, z)


def _chunk(fq, fk, v, g, eps, S, z):
    """One chunk of causal_katz_chunked: its output and the state after it."""
    prefix = z.unsqueeze(-2) + torch.cumsum(fk, dim=-2)  # z_i for each position of the chunk
    n = (fq * prefix).sum(-1, keepdim=True) + eps  # (B, H, C, 1)
    ga = g * torch.tril(fq @ fk.transpose(-2, -1)) / n  # gamma A restricted to the chunk
    rhs = ga @ v + g * (fq @ S) / n
    system = torch.eye(ga.shape[-1], dtype=ga.dtype, device=ga.device) - ga
    out = torch.linalg.solve_triangular(system, rhs, upper=False)
    return out, S + fk.transpose(-2, -1) @ (out + v), prefix[:, :, -1]


def _packed_chunk(fq, fk, v, g, eps, S, z, document, state_document):
    """_chunk for packed rows: document (B, C) is each token's document, state_document (B,) the state's. A token
    reads the state only if its document is the state's, and the chunk's tokens only of its own document; the
    state after the chunk holds only the chunk's last document."""
    dtype = fq.dtype
    within = torch.tril(document[:, :, None] == document[:, None, :]).to(dtype)[:, None]  # (B, 1, C, C)
    carried = (document == state_document[:, None]).to(dtype)[:, None, :, None]  # (B, 1, C, 1)
    prefix = carried * z.unsqueeze(-2) + within @ fk  # z_i: the document's keys so far
    n = (fq * prefix).sum(-1, keepdim=True) + eps
    ga = g * (fq @ fk.transpose(-2, -1)) * within / n
    rhs = ga @ v + g * carried * (fq @ S) / n
    system = torch.eye(ga.shape[-1], dtype=dtype, device=ga.device) - ga
    out = torch.linalg.solve_triangular(system, rhs, upper=False)
    last = document[:, -1]
    tail = fk * (document == last[:, None]).to(dtype)[:, None, :, None]  # the last document's keys
    kept = (last == state_document).to(dtype)
    S = kept[:, None, None, None] * S + tail.transpose(-2, -1) @ (out + v)
    return out, S, kept[:, None, None] * z + tail.sum(-2), last


def causal_katz_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: GammaLike,
    eps: float = 1e-6,
    feature_map: str = FEATURES,
    state: CausalKatzState | None = None,
    key_mask: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, CausalKatzState]:
    """The recurrent form for decoding: the tokens of q, k, v one at a time, O(d D) work and state per token
    and head. Same arguments, results and dtypes as causal_katz_chunked."""
    fq, fk, vv, g = _inputs(q, k, v, gamma, feature_map, key_mask)
    S, z = _check_state(state, q, v)
    g = g.squeeze(-1)  # (1, H, 1)
    outs = []
    with no_autocast(fq):
        for i in range(q.shape[2]):
            if resets is not None:  # a packed document starts: forget the state of the one before
                carry = (~resets[:, i]).to(fq.dtype)[:, None]
                S, z = S * carry[..., None, None], z * carry[..., None]
            fq_i, fk_i, v_i = fq[:, :, i], fk[:, :, i], vv[:, :, i]  # (B, H, d), (B, H, d), (B, H, D)
            z = z + fk_i
            n = (fq_i * z).sum(-1, keepdim=True) + eps
            ga = g * (fq_i * fk_i).sum(-1, keepdim=True) / n  # gamma a_i, (B, H, 1)
            h = g * (fq_i.unsqueeze(-2) @ S).squeeze(-2) / n
            out = (ga * v_i + h) / (1.0 - ga)
            S = S + fk_i.unsqueeze(-1) * (out + v_i).unsqueeze(-2)
            outs.append(out)
    out = torch.stack(outs, dim=2) if outs else vv
    return out.to(v.dtype), CausalKatzState(S, z)
