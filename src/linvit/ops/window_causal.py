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

import math
from typing import NamedTuple

import torch

from .common import accumulation_dtype, gamma_as_tensor, no_autocast
from .katz_causal import CHUNK, FEATURES, CausalKatzState, _inputs, causal_katz_chunked, causal_katz_recurrent
from .linear_causal import pooled_chunk


class WindowState(NamedTuple):
    """What the hybrid carries between calls, per sample (in float32; float64 for float64 inputs): the ring of
    the last W tokens (raw keys for the softmax, their features, values, X; keep False for padding and empty
    slots; each slot's packed document), the delayed state (S, z) and its document, the document of the last
    token seen, the current causal Katz state (None under linear attention, where X = v) and the ring's oldest
    slot: decoding writes each token over it in place (O(1) per token, no copy of the ring), so the slots run
    from position to W - 1, then 0 to position - 1, in order of age."""

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
    position: torch.Tensor  # (B,) long, every row the same: the ring's oldest slot, where the next token goes


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
        torch.zeros(B, dtype=torch.long, device=k.device),
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
    """Decoding: the tokens one at a time, O(W d + f D) work per token and head: each token is written over the
    ring's oldest slot, whose token enters the delayed state. The ring of `state` is updated in place and
    returned (no copy per token; a cache that must branch copies its state, as reorder_cache does), except when
    gradients flow: then each token makes a new ring and the given state is left as it was. Same arguments,
    results and dtypes as window_causal_chunked."""
    katz, fq, fk, vv, g, state, keep, document = _prepare(
        q, k, v, window, 1, gamma, feature_map, features, key_mask, resets, state
    )
    if q.shape[2] == 0:
        return v, state
    with no_autocast(fq):
        in_place = not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, fq, fk, g)))
        bias = None if window_log_weight is None else gamma_as_tensor(window_log_weight, q.shape[1], fq)
        qs, ks = q.to(fq.dtype) * _scale(q, scale), k.to(fq.dtype)
        outs = []
        for i in range(q.shape[2]):
            token = (qs, ks, fq, fk, vv) if q.shape[2] == 1 else [t[:, :, i : i + 1] for t in (qs, ks, fq, fk, vv)]
            reset = None if resets is None else resets[:, i]
            args = (g if katz else None, eps, keep[:, i : i + 1], document[:, i], reset, state, bias, in_place)
            out, state = _step(*token, *args)
            outs.append(out)
    return torch.cat(outs, dim=2).to(v.dtype) if len(outs) > 1 else outs[0].to(v.dtype), state


BLOCK_CHUNKS = 8  # chunks per vectorised block of the prompt: 512 queries at the default chunk of 64
# queries per band of the window's scores (a divisor of the chunk): C x (C + W - 1) scores hold C x W wanted ones
WINDOW_CHUNK = 16
RING = ("keys", "features", "values", "carried", "keep", "document")


def _step(q, k, fq, fk, v, g, eps, keep, document, reset, state: WindowState, bias, in_place: bool):
    """One token (q already scaled; (B, H, 1, x) tensors, document (B,)): the oldest slot's token enters the
    delayed state (S, z), the new token is written over it, and the query reads the W slots of its document and
    the delayed state of its document. A few dozen small ops: decoding's cost is their count."""
    x, katz = (v, {}) if g is None else _katz_step(fq, fk, v, g, eps, state, reset)
    slot = state.position[:1]
    old_f = state.features.index_select(2, slot)  # (B, H, 1, f)
    old_x = (state.values if state.carried is None else state.carried).index_select(2, slot)
    old_document = state.document.index_select(1, slot)[:, 0]
    kept = (old_document == state.state_document).to(fq.dtype)[:, None, None]  # else the old state is another's
    S = torch.addcmul(old_f.transpose(-2, -1) @ old_x, kept[..., None], state.S)
    z = torch.addcmul(old_f[:, :, 0], kept, state.z)
    ring = {}
    for name, new in zip(RING, (k, fk, v, x, keep, document[:, None]), strict=True):
        if (old := getattr(state, name)) is not None:  # in place, or a new tensor where autograd saves the old
            write = old.index_copy_ if in_place else old.index_copy
            ring[name] = write(old.dim() - 2 if old.dim() == 4 else 1, slot, new)
    state = state._replace(**ring)
    reads = (document == old_document).to(fq.dtype)[:, None, None, None]  # the delayed state is this document's
    scores = q @ state.keys.transpose(-2, -1)  # (B, H, 1, W), the slots in ring order
    visible = (state.keep & (state.document == document[:, None]))[:, None, None]
    rows = reads * (fq @ S), reads * (fq @ z[..., None])
    out = _mix(scores if bias is None else scores + bias, visible, state.values, *rows)
    position = torch.remainder(state.position + 1, state.keys.shape[-2])
    new = {"S": S, "z": z, "state_document": old_document, "current": document, "position": position}
    return out, state._replace(**new, **katz)


def _katz_step(fq, fk, v, g, eps, state: WindowState, reset):
    """X = v + O of one token, O its causal Katz output (ops.katz_causal's recurrent form, one token, written
    with matrix products), and the Katz state after it; reset (B,) or None empties the state first."""
    S, z = state.katz_S, state.katz_z
    if reset is not None:
        carry = (~reset).to(fq.dtype)
        S, z = S * carry[:, None, None, None], z * carry[:, None, None]
    z = z + fk[:, :, 0]
    n = fq @ z[..., None] + eps  # (B, H, 1, 1)
    ga = g * (fq @ fk.transpose(-2, -1)) / n  # gamma a_i
    out = (ga * v + g * (fq @ S) / n) / (1.0 - ga)
    x = v + out
    return x, {"katz_S": S + fk.transpose(-2, -1) @ x, "katz_z": z}


def _prepare(q, k, v, window, chunk_size, gamma, feature_map, features, key_mask, resets, state):
    """Checked arguments, the features and values in the accumulation dtype, the state (empty for None), each
    token's keep flag (B, N) and packed document (B, N), counted across calls."""
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
    state = _check_state(state, k, fk, v, window, katz)
    B, N = q.shape[0], q.shape[2]
    keep = torch.ones(B, N, dtype=torch.bool, device=q.device) if key_mask is None else key_mask.bool()
    document = state.current[:, None].expand(B, N)
    return katz, fq, fk, vv, g, state, keep, document if resets is None else document + torch.cumsum(resets.long(), -1)


def _katz_x(fq, fk, vv, g, eps, state, resets, chunk_size, katz):
    """X = v + O under Katz, O the plain causal Katz output (its own normaliser over the whole prefix), and the
    Katz state after (chunk_size None: its recurrent form); X = v and None under linear attention."""
    if not katz:
        return vv, None
    carried = CausalKatzState(state.katz_S, state.katz_z)
    if chunk_size is None or (chunk_size == 1 and fq.shape[2] == 1):
        hops, katz_state = causal_katz_recurrent(fq, fk, vv, g[0, :, 0, 0], eps, "identity", carried, resets=resets)
    else:
        hops, katz_state = causal_katz_chunked(
            fq, fk, vv, g[0, :, 0, 0], eps, "identity", carried, chunk_size, resets=resets
        )
    return vv + hops, katz_state


def _katz_fields(katz_state) -> dict:
    return {} if katz_state is None else {"katz_S": katz_state[0], "katz_z": katz_state[1]}


def _scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else scale


def _hybrid(q, k, v, window, gamma, scale, feature_map, features, eps, state, chunk_size, key_mask, resets, log_weight):
    katz, fq, fk, vv, g, state, keep, document = _prepare(
        q, k, v, window, chunk_size, gamma, feature_map, features, key_mask, resets, state
    )
    N = q.shape[2]
    if N == 0:
        return v, state
    with no_autocast(fq):
        x, katz_state = _katz_x(fq, fk, vv, g, eps, state, resets, chunk_size, katz)
        C = min(chunk_size, N)
        pad = -N % C
        entries = _entries(state, k.to(fq.dtype), fk, vv, x, keep, document, pad)
        bias = None if log_weight is None else gamma_as_tensor(log_weight, q.shape[1], fq)  # (1, H, 1, 1)
        qs = q.to(fq.dtype) * _scale(q, scale)
        out, delayed = _blocks(qs, fq, entries, document, state, window, C, bias, packed=resets is not None)
    ring = [None if t is None else t[..., N : N + window, :] if t.dim() == 4 else t[:, N : N + window] for t in entries]
    new = (*ring, *delayed, document[:, -1], *(katz_state if katz else (None, None)), torch.zeros_like(document[:, -1]))
    # copies: a view would keep the whole prompt's keys (or its document numbers) alive in the cache
    new = WindowState(*(None if t is None else t.clone(memory_format=torch.contiguous_format) for t in new))
    return out.to(v.dtype), new


def _entries(state: WindowState, k, fk, v, x, keep, document, pad: int):
    """The ring's W slots in order of age, the new tokens, then pad empty slots (so that the chunks' bands are
    whole): entry i is the key query i's delayed state takes in last, and entries i + 1 .. i + W its window."""
    order = torch.remainder(
        state.position[:1] + torch.arange(state.keys.shape[-2], device=k.device), state.keys.shape[-2]
    )

    def cat(old, new, fill):
        if old is None:
            return None
        dim = 2 if new.dim() == 4 else 1
        tail = new.new_full((*new.shape[:dim], pad, *new.shape[dim + 1 :]), fill)
        return torch.cat([old.index_select(dim, order), new, tail], dim=dim)

    return (
        cat(state.keys, k, 0),
        cat(state.features, fk, 0),
        cat(state.values, v, 0),
        cat(state.carried, x, 0),
        cat(state.keep, keep, False),
        cat(state.document, document, -1),
    )


def _blocks(q, fq, entries, document, state, window, C, bias, packed: bool):
    """The output, block by block (BLOCK_CHUNKS chunks of C queries each, every chunk of a block at once: fewer
    ops than a chunk at a time, and a block's scores stay in cache where the whole prompt's would not), and the
    delayed state (S, z, document) after the last query."""
    N, W = q.shape[2], window
    _, features, values, carried, _, entry_document = entries
    x = values if carried is None else carried
    if packed:  # documents start in this call: the delayed rows chunk by chunk, as pooled_chunk follows them
        numerator, denominator, delayed = _delayed_packed(fq, entries, document, state, C)
    else:  # one document: other documents' entries (earlier ones, empty slots) and state are left out
        current = document[:, 0]
        mine = (entry_document[:, :N] == current[:, None]).to(fq.dtype)[:, None, :, None]  # (B, 1, N, 1)
        features = features[:, :, :N] * mine
        own = (state.state_document == current).to(fq.dtype)
        S, z = own[:, None, None, None] * state.S, own[:, None, None] * state.z
    outs, block = [], BLOCK_CHUNKS * C
    for a in range(0, N, block):
        b = min(a + block, N)
        if packed:
            rows = numerator[:, :, a:b], denominator[:, :, a:b]
        else:
            *rows, S, z = _delayed(fq[:, :, a:b], features[:, :, a:b], x[:, :, a:b], S, z, C)
        end = b + -(b - a) % C + W  # the block's whole chunks and the window after them
        band = [None if t is None else t[:, :, a:end] if t.dim() == 4 else t[:, a:end] for t in entries]
        outs.append(_window(q[:, :, a:b], band, document[:, a:b], W, math.gcd(C, WINDOW_CHUNK), *rows, bias))
    return torch.cat(outs, 2) if len(outs) > 1 else outs[0], delayed if packed else (S, z, current)


def _delayed(fq, fk, x, S, z, C):
    """The delayed rows of a block of queries of one document: causal linear attention of fq over its keys fk, x
    (the entries shifted by W, other documents' features zeroed), every chunk at once: the state before each chunk
    a running sum over the chunks, the given state first, so it adds in the order of the token loop. Returns the
    rows' numerator (B, H, n, D), denominator (B, H, n, 1) and the state (S, z) after the block."""
    n, pad = fq.shape[2], -fq.shape[2] % C
    fk, xs, fqc = (_pad(t, pad).unflatten(2, (-1, C)) for t in (fk, x, fq))  # (B, H, chunks, C, .)
    kv, ksum = fk.transpose(-2, -1) @ xs, fk.sum(-2)  # each chunk's sums
    before = torch.cumsum(torch.cat([S[:, :, None], kv[:, :, :-1]], 2), 2)  # the state before each chunk
    z_before = torch.cumsum(torch.cat([z[:, :, None], ksum[:, :, :-1]], 2), 2)
    scores = (fqc @ fk.transpose(-2, -1)).tril()
    numerator = scores @ xs + fqc @ before
    denominator = scores.sum(-1, keepdim=True) + fqc @ z_before[..., None]
    rows = numerator.flatten(2, 3)[:, :, :n], denominator.flatten(2, 3)[:, :, :n]
    return *rows, before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + ksum[:, :, -1]


def _delayed_packed(fq, entries, document, state, C):
    """_delayed for a call with packed documents starting in it: chunk by chunk (ops.linear_causal.pooled_chunk),
    each query reading only its document's keys and state."""
    _, features, values, carried, _, entry_document = entries
    x = values if carried is None else carried
    S, z, state_document = state.S, state.z, state.state_document
    numerators, denominators = [], []
    for a in range(0, fq.shape[2], C):
        b = min(a + C, fq.shape[2])
        numerator, denominator, S, z, state_document = pooled_chunk(
            fq[:, :, a:b], features[:, :, a:b], x[:, :, a:b], S, z, document[:, a:b], state_document,
            key_document=entry_document[:, a:b],
        )  # fmt: skip
        numerators.append(numerator)
        denominators.append(denominator)
    return torch.cat(numerators, 2), torch.cat(denominators, 2), (S, z, state_document)


def _pad(t, pad: int):
    """(B, H, N, x) t with pad zero tokens after the last."""
    return t if pad == 0 else torch.cat([t, t.new_zeros(*t.shape[:2], pad, t.shape[3])], 2)


def _window(q, entries, document, window, C, numerator, denominator, bias=None):
    """Every chunk of C (scaled) queries at once: chunk c's band is entries cC + 1 .. cC + C + W - 1 (an unfold:
    a view), query i of it weighs entry e of it by exp(s) where e - i in [0, W) and the key is kept and of its
    document, and the delayed rows join in _mix. bias (1, H, 1, 1) or None is added to the window's scores."""
    B, H, N, _ = q.shape
    keys, _, values, _, keep, entry_document = entries
    L, pad = C + window - 1, -N % C
    end = N + pad + window  # the entries the bands cover
    # (B, H, n, L, d) and (B, H, n, L, D), copied row by row (the batched products would copy the overlapping
    # views element by element, key dimension outermost)
    band_keys, band_values = (t[:, :, 1:end].unfold(2, L, C).transpose(-2, -1).contiguous() for t in (keys, values))
    band_keep, band_document = (t[:, 1:end].unfold(1, L, C) for t in (keep, entry_document))  # (B, n, L)
    queries = torch.cat([document, document.new_full((B, pad), -2)], 1).unflatten(1, (-1, C))  # (B, n, C)
    i, e = torch.arange(C, device=q.device)[:, None], torch.arange(L, device=q.device)[None, :]
    visible = (e >= i) & (e < i + window) & band_keep[:, :, None] & (band_document[:, :, None] == queries[..., None])
    scores = _pad(q, pad).unflatten(2, (-1, C)) @ band_keys.transpose(-2, -1)  # (B, H, n, C, L)
    if bias is not None:  # exp(s + log c) = c exp(s): the factor enters the frame with the scores
        scores = scores + bias[..., None]
    rows = (_pad(t, pad).unflatten(2, (-1, C)) for t in (numerator, denominator))
    return _mix(scores, visible[:, None], band_values, *rows).flatten(2, 3)[:, :, :N]


def _mix(scores, visible, values, numerator, denominator):
    """Window weights exp(s - f) on the visible keys, the delayed rows' weight exp(log(denominator) - f) on their
    mean, one normaliser. Scores are masked before exp; a row without older keys (denominator 0) takes
    log = -inf, never 0 x inf."""
    scores = torch.where(visible, scores, float("-inf"))
    tiny = torch.finfo(scores.dtype).tiny
    present = denominator > 0
    log_older = torch.where(present, torch.log(denominator.clamp_min(tiny)), float("-inf"))
    with torch.no_grad():  # the frame: y does not depend on it
        frame = torch.maximum(scores.amax(-1, keepdim=True), log_older).nan_to_num(0.0, 0.0, 0.0)  # no key: 0
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
