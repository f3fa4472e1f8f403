"""The sliding-window hybrid of causal language models (docs/spec/infsa.md 4.2): exact softmax over the last W
tokens, causal Katz-InfSA (or linear attention, LoLCATs' form) over every older token, one shared normaliser.

Query t weighs a window key j in (t - W, t] by exp(s_tj), s_tj = q_t . k_j * scale, and an older key j <= t - W
by phi(q_t) . phi(k_j), which brings X_j (v_j under linear attention; v_j + O_j, the value and its Katz hops,
under Katz-InfSA, O the causal Katz output of ops.katz_causal):

    y_t = (sum_window exp(s_tj) v_j + phi(q_t) S_{t-W}) / (sum_window exp(s_tj) + phi(q_t) . z_{t-W})

S_{t-W} = sum_{j <= t-W} phi(k_j) X_j^T and z_{t-W} = sum_{j <= t-W} phi(k_j): the causal state delayed by W.
Both sums are taken in one frame, times exp(-f) with f = max(m_t, log(phi(q_t) . z_{t-W})) and m_t the row's
largest window score (a stabiliser: y does not depend on it, so it carries no gradient); the older part enters
as its weight exp(log(phi(q_t) . z_{t-W}) - f) times its mean phi(q_t) S_{t-W} / phi(q_t) . z_{t-W}. Every
weight is then <= 1 and the largest is 1, so neither part overflows (exp(-f) alone would, for f far below 0)
and the denominator never underflows; a row with no key (a padded query) gives 0.

Linear in N: the state delayed by W is causal linear attention over the keys shifted by W (the last W keys of
earlier calls come from the ring), and the window a band of W keys per query, C x (C + W - 1) scores per chunk
of C queries. `WindowState` carries the last W keys, their features, values (and X), the delayed state and, for
Katz, the current Katz state: its size does not grow with the context. Padding removes keys from both parts;
packed documents (resets) empty both at each document start.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .common import accumulation_dtype, gamma_as_tensor, no_autocast
from .katz_causal import CHUNK, FEATURES, CausalKatzState, _inputs, causal_katz_chunked, causal_katz_recurrent
from .linear_causal import pooled_chunk


class WindowState(NamedTuple):
    """What the hybrid carries between calls, per sample (in float32; float64 for float64 inputs): the ring of
    the last W tokens (raw keys for the softmax, their features, values, X; keep False for padding and empty
    slots; each slot's packed document), the delayed state (S, z) and its document, the document of the last
    token seen, and the current causal Katz state (None under linear attention, where X = v)."""

    keys: torch.Tensor  # (B, H, W, d)
    features: torch.Tensor  # (B, H, W, f)
    values: torch.Tensor  # (B, H, W, D)
    carried: torch.Tensor | None  # (B, H, W, D): X = v + O under Katz; None under linear attention
    keep: torch.Tensor  # (B, W) bool
    document: torch.Tensor  # (B, W) long
    S: torch.Tensor  # (B, H, f, D)
    z: torch.Tensor  # (B, H, f)
    state_document: torch.Tensor  # (B,) long
    current: torch.Tensor  # (B,) long
    katz_S: torch.Tensor | None  # (B, H, f, D)
    katz_z: torch.Tensor | None  # (B, H, f)


def empty_window_state(k, fk, v, window: int, katz: bool) -> WindowState:
    """The state before the first token: W empty slots (keep False, document -1) and zero states."""
    B, H, _, d = k.shape
    f, D, dtype = fk.shape[-1], v.shape[-1], accumulation_dtype(k)

    def zeros(*shape):
        return k.new_zeros(*shape, dtype=dtype)

    katz_S, katz_z = (zeros(B, H, f, D), zeros(B, H, f)) if katz else (None, None)
    return WindowState(
        zeros(B, H, window, d),
        zeros(B, H, window, f),
        zeros(B, H, window, D),
        zeros(B, H, window, D) if katz else None,
        torch.zeros(B, window, dtype=torch.bool, device=k.device),
        torch.full((B, window), -1, dtype=torch.long, device=k.device),
        zeros(B, H, f, D),
        zeros(B, H, f),
        torch.zeros(B, dtype=torch.long, device=k.device),
        torch.zeros(B, dtype=torch.long, device=k.device),
        katz_S,
        katz_z,
    )


def window_causal_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    gamma=None,
    scale: float | None = None,
    feature_map: str = FEATURES,
    features: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
    state: WindowState | None = None,
    chunk_size: int = CHUNK,
    key_mask: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
    window_log_weight=None,
) -> tuple[torch.Tensor, WindowState]:
    """The hybrid of (B, H, N, d) q, k and (B, H, N, D) v, continuing from state (None: the start), chunk by chunk.

    gamma: Katz-InfSA's discount (float or (H,)) over the older tokens; None for linear attention. scale: the
    softmax's (default d^-0.5). features: (phi(q), phi(k)) already mapped (a learned map), else feature_map of
    q and k. key_mask (B, N), True = keep; resets (B, N), True where a packed document starts.
    window_log_weight (float or (H,), opt-in): log of a per-head factor on the window's softmax terms (LoLCATs'
    learned window factor, docs/spec/infsa.md 4.2); None (the default) is no factor. Returns the output in v's
    dtype and the state after the last token."""
    args = (gamma, scale, feature_map, features, eps, state, chunk_size, key_mask, resets, window_log_weight)
    return _hybrid(q, k, v, window, *args)


def window_causal_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    gamma=None,
    scale: float | None = None,
    feature_map: str = FEATURES,
    features: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
    state: WindowState | None = None,
    key_mask: torch.Tensor | None = None,
    resets: torch.Tensor | None = None,
    window_log_weight=None,
) -> tuple[torch.Tensor, WindowState]:
    """Decoding: the tokens one at a time, O(W d + f D) work per token and head from the ring and the states.
    Same arguments, results and dtypes as window_causal_chunked."""
    outs = []
    for i in range(q.shape[2]):
        part = slice(i, i + 1)
        feats = None if features is None else (features[0][:, :, part], features[1][:, :, part])
        out, state = _hybrid(
            q[:, :, part],
            k[:, :, part],
            v[:, :, part],
            window,
            gamma,
            scale,
            feature_map,
            feats,
            eps,
            state,
            1,
            None if key_mask is None else key_mask[:, part],
            None if resets is None else resets[:, part],
            window_log_weight,
        )
        outs.append(out)
    return (torch.cat(outs, dim=2) if outs else v), state


def _hybrid(q, k, v, window, gamma, scale, feature_map, features, eps, state, chunk_size, key_mask, resets, log_weight):
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window must be a positive whole number of tokens, got {window!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if key_mask is not None and key_mask.dim() != 2:
        raise ValueError(f"the hybrid's key_mask is (B, N), got shape {tuple(key_mask.shape)}")
    katz = gamma is not None
    fq_in, fk_in = features if features is not None else (q, k)
    kernel = "identity" if features is not None else feature_map
    fq, fk, vv, g = _inputs(fq_in, fk_in, v, 1.0 if gamma is None else gamma, kernel, key_mask)
    dtype, (B, N) = fq.dtype, q.shape[0:3:2]
    state = _check_state(state, k, fk, v, window, katz)
    if N == 0:
        return v, state
    keep = torch.ones(B, N, dtype=torch.bool, device=q.device) if key_mask is None else key_mask.bool()
    starts = torch.cumsum(resets.long(), -1) if resets is not None else torch.zeros_like(keep, dtype=torch.long)
    document = state.current[:, None] + starts  # (B, N): each token's packed document, counted across calls
    with no_autocast(fq):
        x, katz_state = vv, None
        if katz:  # X = v + O, O the plain causal Katz output (its own normaliser over the whole prefix)
            form = causal_katz_recurrent if N == 1 and chunk_size == 1 else causal_katz_chunked
            extra = {} if form is causal_katz_recurrent else {"chunk_size": chunk_size}
            hops, katz_state = form(
                fq, fk, vv, g[0, :, 0, 0], eps, "identity", state=CausalKatzState(state.katz_S, state.katz_z),
                resets=resets, **extra,
            )  # fmt: skip
            x = vv + hops
        entries = _entries(state, k.to(dtype), fk, vv, x, keep, document)
        bias = None if log_weight is None else gamma_as_tensor(log_weight, q.shape[1], fq)  # (1, H, 1, 1)
        out, delayed = _chunks(q.to(dtype), fq, entries, document, window, scale, state, chunk_size, bias)
    ring = [None if t is None else t[..., -window:, :] if t.dim() == 4 else t[:, -window:] for t in entries]
    new = (*ring, *delayed, document[:, -1], *(katz_state if katz else (None, None)))
    # copies: a view would keep the whole prompt's keys (or its document numbers) alive in the cache
    new = WindowState(*(None if t is None else t.clone(memory_format=torch.contiguous_format) for t in new))
    return out.to(v.dtype), new


def _entries(state: WindowState, k, fk, v, x, keep, document):
    """The ring's W slots, then the new tokens: entry i is the key query i's delayed state takes in last, and
    entries i + 1 .. i + W its window."""

    def cat(old, new):
        return None if old is None else torch.cat([old, new], dim=-2 if new.dim() == 4 else -1)

    return (
        cat(state.keys, k),
        cat(state.features, fk),
        cat(state.values, v),
        cat(state.carried, x),
        cat(state.keep, keep),
        cat(state.document, document),
    )


def _chunks(q, fq, entries, document, window, scale, state, chunk_size, bias=None):
    """Each chunk of queries: the delayed state's rows (pooled_chunk over entries a..b-1, keys shifted by W)
    and the window's band (entries a+1..b-1+W), combined in one frame; bias (1, H, 1, 1) or None is added to
    the window's scores (the log of a per-head factor)."""
    keys, features, values, carried, keep, entry_document = entries
    x = values if carried is None else carried
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S, z, state_document = state.S, state.z, state.state_document
    outs = []
    for a in range(0, q.shape[2], chunk_size):
        b = min(a + chunk_size, q.shape[2])
        numerator, denominator, S, z, state_document = pooled_chunk(
            fq[:, :, a:b], features[:, :, a:b], x[:, :, a:b], S, z, document[:, a:b], state_document,
            key_document=entry_document[:, a:b],
        )  # fmt: skip
        band = slice(a + 1, b + window)
        outs.append(
            _combine(
                q[:, :, a:b] * scale,
                keys[:, :, band],
                values[:, :, band],
                keep[:, None, band] & (entry_document[:, None, band] == document[:, a:b, None]),
                window,
                numerator,
                denominator,
                bias,
            )  # fmt: skip
        )
    return torch.cat(outs, dim=2), (S, z, state_document)


def _combine(q, keys, values, visible, window, numerator, denominator, bias=None):
    """One chunk's output: window weights exp(s - f) on the band e - i in [0, W) (visible (B, C, C + W - 1):
    kept, same document), the delayed rows' weight exp(log(denominator) - f) on their mean, one normaliser.
    Scores are masked before exp; a row without older keys (denominator 0) takes log = -inf, never 0 x inf."""
    C = q.shape[-2]
    i = torch.arange(C, device=q.device)[:, None]
    e = torch.arange(keys.shape[-2], device=q.device)[None, :]
    band = (e >= i) & (e < i + window)
    scores = q @ keys.transpose(-2, -1)
    if bias is not None:  # exp(s + log c) = c exp(s): the factor enters the frame with the scores
        scores = scores + bias
    scores = scores.masked_fill(~(band & visible)[:, None], float("-inf"))
    tiny = torch.finfo(scores.dtype).tiny
    present = denominator > 0
    log_older = torch.where(present, torch.log(denominator.clamp_min(tiny)), float("-inf"))
    with torch.no_grad():  # the frame: y does not depend on it
        frame = torch.maximum(scores.amax(-1, keepdim=True), log_older)
        frame = torch.where(torch.isfinite(frame), frame, torch.zeros_like(frame))
    weights = torch.exp(scores - frame)
    older = torch.exp(log_older - frame)  # phi(q) . z_{t-W} exp(-f), <= 1
    mean = numerator / denominator.clamp_min(tiny)  # the older tokens' linear-attention mean (0 without any)
    total = weights.sum(-1, keepdim=True) + older
    return (weights @ values + mean * older) / total.clamp_min(tiny)


def _check_state(state, k, fk, v, window, katz) -> WindowState:
    if state is None:
        return empty_window_state(k, fk, v, window, katz)
    B, H, _, d = k.shape
    expected = (B, H, window, d), (B, H, window, v.shape[-1]), (B, H, fk.shape[-1], v.shape[-1])
    found = tuple(state.keys.shape), tuple(state.values.shape), tuple(state.S.shape)
    if found != expected or (state.katz_S is not None) != katz:
        raise ValueError(
            f"window state of keys {found[0]}, values {found[1]}, state {found[2]} does not fit window {window}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)} ({'Katz' if katz else 'linear'}): it belongs to another "
            "batch, layer, window or form"
        )
    return state
