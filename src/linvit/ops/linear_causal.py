"""Causal linear attention, the anchor of language-model linearization (LoLCATs' form without its window): each
query's row-normalised hop over the keys so far, out_i = phi(q_i) S_i / (phi(q_i) . z_i + eps) with
S_i = sum_{j<=i} phi(k_j) v_j^T and z_i = sum_{j<=i} phi(k_j). The first term of causal Katz-InfSA's series
(ops.katz_causal) at gamma = 1: the same state (S, z), the same padding and packed-document handling, one hop.

Chunked (training, prompts) and recurrent (decoding) forms; both take and return the state, in float32
(float64 for float64 inputs), and equal the dense masked form.
"""

from __future__ import annotations

import torch

from .common import no_autocast
from .katz_causal import CHUNK, FEATURES, CausalKatzState, _check_state, _inputs


def causal_linear_dense(q, k, v, eps: float = 1e-6, feature_map: str = FEATURES, key_mask=None, resets=None):
    """The N x N masked form: tril(phi(Q) phi(K)^T), within each packed document, row-normalised, times V."""
    from .katz_causal import same_document

    fq, fk, vv, _ = _inputs(q, k, v, 1.0, feature_map, key_mask)
    with no_autocast(fq):
        scores = torch.tril(fq @ fk.transpose(-2, -1))
        same = same_document(resets)
        if same is not None:
            scores = scores * same.to(scores.dtype)
        return ((scores @ vv) / (scores.sum(-1, keepdim=True) + eps)).to(v.dtype)


def causal_linear_chunked(
    q,
    k,
    v,
    eps: float = 1e-6,
    feature_map: str = FEATURES,
    state=None,
    chunk_size: int = CHUNK,
    key_mask=None,
    resets=None,
) -> tuple[torch.Tensor, CausalKatzState]:
    """Causal linear attention of (B, H, N, d) q, k and (B, H, N, D) v from state (None: the start), chunk by
    chunk: O(N C d) work, the state carried between chunks. Returns the output in v's dtype and the state."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    fq, fk, vv, _ = _inputs(q, k, v, 1.0, feature_map, key_mask)
    S, z = _check_state(state, q, v)
    document = torch.cumsum(resets.long(), dim=-1) if resets is not None else None
    state_document = q.new_zeros(q.shape[0], dtype=torch.long)
    outs = []
    with no_autocast(fq):
        for start in range(0, q.shape[2], chunk_size):
            part = slice(start, start + chunk_size)
            docs = document[:, part] if document is not None else None
            out, S, z, state_document = _chunk(
                fq[:, :, part], fk[:, :, part], vv[:, :, part], eps, S, z, docs, state_document
            )
            outs.append(out)
    out = torch.cat(outs, dim=2) if outs else vv
    return out.to(v.dtype), CausalKatzState(S, z)


def _chunk(fq, fk, v, eps, S, z, document, state_document):
    """One chunk: document (B, C) each token's packed document (None: one document), state_document (B,) the
    state's. A token reads the state only within its document; the state after holds the last document's keys."""
    numerator, denominator, S, z, last = pooled_chunk(fq, fk, v, S, z, document, state_document)
    return numerator / (denominator + eps), S, z, last


def pooled_chunk(fq, fk, v, S, z, document, state_document, key_document=None):
    """The unnormalised rows of one chunk, phi(q_i) sum_j phi(k_j) v_j^T and phi(q_i) . sum_j phi(k_j) over the
    keys j <= i of query i's document (the state's too where its document is the state's), and the state after
    the chunk. key_document (B, C): the keys' documents where they differ from the queries' (document), as in
    the sliding-window hybrid's delayed keys (ops.window_causal)."""
    dtype = fq.dtype
    C = fq.shape[-2]
    if document is None:
        within = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()[None, None]
        carried, kept, tail = 1.0, 1.0, fk
        last = state_document
    else:
        keys = document if key_document is None else key_document
        within = torch.tril(document[:, :, None] == keys[:, None, :])[:, None]
        carried = (document == state_document[:, None]).to(dtype)[:, None, :, None]
        last = keys[:, -1]
        tail = fk * (keys == last[:, None]).to(dtype)[:, None, :, None]
        kept = (last == state_document).to(dtype)[:, None, None]
    scores = (fq @ fk.transpose(-2, -1)) * within.to(dtype)
    denominator = scores.sum(-1, keepdim=True) + carried * (fq * z.unsqueeze(-2)).sum(-1, keepdim=True)
    numerator = scores @ v + carried * (fq @ S)
    kept_s = kept if isinstance(kept, float) else kept[..., None]
    return numerator, denominator, kept_s * S + tail.transpose(-2, -1) @ v, kept * z + tail.sum(-2), last


def causal_linear_recurrent(
    q, k, v, eps: float = 1e-6, feature_map: str = FEATURES, state=None, key_mask=None, resets=None
) -> tuple[torch.Tensor, CausalKatzState]:
    """The recurrent form for decoding, token by token: O(d D) work and state per token and head."""
    fq, fk, vv, _ = _inputs(q, k, v, 1.0, feature_map, key_mask)
    S, z = _check_state(state, q, v)
    outs = []
    with no_autocast(fq):
        for i in range(q.shape[2]):
            if resets is not None:
                carry = (~resets[:, i]).to(fq.dtype)[:, None]
                S, z = S * carry[..., None, None], z * carry[..., None]
            fq_i, fk_i = fq[:, :, i], fk[:, :, i]
            z = z + fk_i
            S = S + fk_i[..., :, None] * vv[:, :, i, None, :]
            n = (fq_i * z).sum(-1, keepdim=True) + eps
            outs.append(((fq_i[..., None, :] @ S)[..., 0, :] / n)[:, :, None])
    out = torch.cat(outs, dim=2) if outs else vv
    return out.to(v.dtype), CausalKatzState(S, z)
