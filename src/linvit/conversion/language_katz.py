"""Causal Katz-InfSA in Hugging Face language models: linear time, and decoding without a key/value cache.

`linvit.convert(lm, "katz_infsa")` on a causal transformers model selects `katz_causal_attention` through the
attention interface (as pure InfSA does, conversion/language.py), so rotary embeddings, grouped-query heads
and masks stay the library's. The operator is linvit.ops.katz_causal (docs/spec/infsa.md 4.1): a forward pass
without a cache runs the chunked form; with a cache, each layer's slot in the Cache object is a
`KatzStateLayer`, which stores the running state (S, z) instead of keys and values, so decode memory stays
flat in the context length. The slot is installed by a pre-hook that sees the cache the layer is called with
(generate()'s DynamicCache, or one passed in); a slot another model already filled is refused in one line.
Padding (a boolean mask from transformers) removes the padded keys from every state; packed documents (a
block-diagonal causal mask, transformers' padding-free packing) empty the state where each one starts. Any
other pattern is refused in one line: the state cannot hide an arbitrary set of keys.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn as nn
from transformers.cache_utils import CacheLayerMixin  # this module is imported only for transformers models

from ..errors import UsageError
from ..layers.feature_maps import LEARNED_FEATURE_MAPS, query_and_key_maps
from ..ops.common import accumulation_dtype
from ..ops.katz_causal import FEATURES, CausalKatzState, causal_katz_chunked, causal_katz_recurrent
from ..ops.linear_causal import causal_linear_chunked, causal_linear_recurrent
from ..ops.window_causal import window_causal_chunked, window_causal_recurrent
from .language import repeat_heads

ATTENTION_NAME = "linvit_katz_infsa"
LINEAR_ATTENTION_NAME = "linvit_linear_attention"
EPS = 1e-6
# a DynamicCache's slots that a converted layer takes over while empty; a sliding window is not applied (the
# state sees the whole prefix), as a pooled state cannot forget the keys that leave the window
FRESH_SLOTS = ("DynamicLayer", "DynamicSlidingWindowLayer")


class KatzStateLayer(CacheLayerMixin):
    """One layer's slot in a transformers Cache: the causal Katz state and the number of tokens seen.

    update() keeps no keys or values and hands back only the new ones; get_seq_length() is the count of tokens
    seen, which is what position ids and masks are built from. Beam search's reorders and repeats apply to the
    state; cropping (assisted decoding) cannot undo a pooled state and is refused."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0
        self.state: CausalKatzState | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = key_states.new_zeros(0)
        self.values = value_states.new_zeros(0)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.seen += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def _apply(self, fn) -> None:
        if self.state is not None:  # a CausalKatzState, or the sliding-window hybrid's WindowState
            self.state = type(self.state)(*(None if t is None else fn(t) for t in self.state))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        raise UsageError("causal Katz-InfSA's cache pools every token into one state: it cannot be cropped")

    def reset(self) -> None:
        self.__init__()

    def offload(self) -> None:
        pass

    def prefetch(self) -> None:
        pass


def add_feature_maps(modules, feature_map: str | None, feature_dim: int | None) -> None:
    """Learned feature maps (infsa_feature_q, infsa_feature_k: one W per query head) on every selected layer
    for "katz_infsa:hedgehog"; the fixed ELU + 1 (spec 4.1) for no option or "elu+1"."""
    if feature_map in (None, FEATURES):
        return
    if feature_map not in LEARNED_FEATURE_MAPS:
        raise UsageError(
            f"causal language models take ELU + 1 features (spec/infsa.md 4.1) or a learned map, got {feature_map!r}: "
            "use katz_infsa, katz_infsa:hedgehog, linear_attention or linear_attention:hedgehog"
        )
    kept = [m.infsa_feature_q.feature_dim for _, m in modules if hasattr(m, "infsa_feature_q")]
    if kept and feature_dim is not None and feature_dim != kept[0]:
        warnings.warn(
            f"feature_dim={feature_dim} sizes no map: the layers converted before keep theirs (f = {kept[0]}); "
            "convert the softmax original for another size",
            stacklevel=4,  # the caller of linvit.convert
        )
    for _, module in modules:
        if hasattr(module, "infsa_feature_q"):
            continue
        heads, head_dim = int(module.config.num_attention_heads), int(module.head_dim)
        maps = query_and_key_maps(feature_map, heads, head_dim, feature_dim, next(module.parameters()))
        module.infsa_feature_q, module.infsa_feature_k = maps


def install_state_layer(module: nn.Module, args, kwargs) -> None:
    """Pre-hook: make this layer's slot of the cache it is called with a KatzStateLayer (before it is updated)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    module._linvit_katz_slot = None
    if cache is None:
        return
    idx = module.layer_idx
    if getattr(cache, "layer_class_to_replicate", None) is not None:
        while len(cache.layers) <= idx:
            cache.layers.append(cache.layer_class_to_replicate())
    if idx >= len(cache.layers):
        raise UsageError(f"the cache has {len(cache.layers)} layers but attention layer {idx} is being called")
    slot = cache.layers[idx]
    if not isinstance(slot, KatzStateLayer):
        if type(slot).__name__ not in FRESH_SLOTS or slot.get_seq_length() > 0:
            raise UsageError(
                f"causal Katz-InfSA keeps its state in the cache, but layer {idx}'s slot is a "
                f"{type(slot).__name__} holding {slot.get_seq_length()} tokens: pass a fresh DynamicCache "
                "(or none) to a converted model, not a static or sliding one or one another model filled"
            )
        slot = cache.layers[idx] = KatzStateLayer()
    module._linvit_katz_slot = slot


class MaskLayout(NamedTuple):
    """What a causal Katz layer reads from a mask: the keys to keep (B, q) and where packed documents start
    (B, q), each None when the mask has none."""

    keep: torch.Tensor | None
    resets: torch.Tensor | None


def read_mask(attention_mask: torch.Tensor | None, q_len: int, sliding_window: int | None = None) -> MaskLayout:
    """The padding and packed-document starts of a transformers mask (B, 1, q, seen + q), checked: the mask must
    be causal, less padded keys, within each document; a sliding window is allowed and not applied
    (FRESH_SLOTS). A new token that sees none of the cached keys starts a document. Anything else (a custom
    pattern the state cannot follow) is refused in one line."""
    if attention_mask is None:
        return MaskLayout(None, None)
    if attention_mask.dtype != torch.bool:  # an additive float mask: 0 keeps, a large negative removes
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    mask = attention_mask[:, 0]  # (B, q, seen + q)
    new, cached = mask[..., -q_len:], mask[..., :-q_len]
    keep = new.any(dim=-2)  # a real key is seen at least by its own query
    resets = torch.zeros_like(keep)
    if cached.shape[-1] > 0:  # the first new token starts a document where it sees no cached key
        resets[:, 0] = keep[:, 0] & ~cached[:, 0].any(dim=-1)
    if q_len > 1:
        sees_previous = new.diagonal(offset=-1, dim1=-2, dim2=-1)  # query i sees key i - 1
        resets[:, 1:] = keep[:, 1:] & keep[:, :-1] & ~sees_previous
        _check_pattern(new, cached, keep, resets, sliding_window)
    return MaskLayout(keep, resets if bool(resets.any()) else None)


def _check_pattern(new, cached, keep, resets, sliding_window) -> None:
    """Refuse a mask that is not causal plus padding within packed documents (one line). O(q^2): prompts only,
    never a decoding step of one token."""
    document = torch.cumsum(resets.long(), dim=-1)
    q_len = new.shape[-1]
    i = torch.arange(q_len, device=new.device)
    expected = (i[None, :] <= i[:, None]) & keep[:, None, :] & (document[:, :, None] == document[:, None, :])
    if sliding_window is not None:
        expected &= i[:, None] - i[None, :] < sliding_window
    wrong = (new != expected) & keep[:, :, None]  # padded queries' rows are never read
    later = (cached.any(dim=-1) & (document > 0) & keep)[..., None]  # a new document sees no cache
    if bool(wrong.any() | later.any()):
        raise UsageError(
            "causal Katz-InfSA follows causal, padding and packed-document masks only (its state cannot hide an "
            "arbitrary set of keys): this mask has another pattern; use pure_infsa for custom masks"
        )


def katz_causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: causal Katz-InfSA of the new tokens, continuing the layer's state in
    the cache when there is one. Returns (output (B, q, H, D), None)."""
    if not hasattr(module, "infsa_theta"):  # a layer include/exclude left out: softmax attention, as before
        return _softmax(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    def forms(query, key, value, recurrent: bool, kernel: str, **state):
        gamma = torch.sigmoid(module.infsa_theta.to(accumulation_dtype(query)))
        form = causal_katz_recurrent if recurrent else causal_katz_chunked
        return form(query, key, value, gamma, EPS, kernel, **state)

    return _stateful_attention(module, query, key, value, attention_mask, dropout, kwargs, forms, scaling)


def linear_causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: causal linear attention (the anchor form, ops.linear_causal), with the
    same state, cache slot and mask handling as causal Katz-InfSA."""
    if not getattr(module, "infsa_linear_attention", False):  # left out by include/exclude: softmax attention
        return _softmax(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    def forms(query, key, value, recurrent: bool, kernel: str, **state):
        form = causal_linear_recurrent if recurrent else causal_linear_chunked
        return form(query, key, value, EPS, kernel, **state)

    return _stateful_attention(module, query, key, value, attention_mask, dropout, kwargs, forms, scaling)


def _softmax(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def _stateful_attention(module, query, key, value, attention_mask, dropout, kwargs, forms, scaling=None):
    """The new tokens through forms(q, k, v, recurrent, kernel, state=, key_mask=, resets=) -> (out, state), with
    grouped heads repeated, learned feature maps applied, the mask read and the cache slot's state carried. A
    layer with a window (infsa_window, linvit.convert's window=) runs the sliding-window hybrid instead
    (ops.window_causal: softmax at the layer's scaling over the last W tokens, this form over the older ones)."""
    heads, q_len = query.shape[1], query.shape[2]
    slot = getattr(module, "_linvit_katz_slot", None)
    if key.shape[2] != q_len:
        raise UsageError("causal Katz-InfSA got cached keys: its cache keeps a state, not keys (use a DynamicCache)")
    key, value = repeat_heads(key, heads), repeat_heads(value, heads)
    window = getattr(module, "infsa_window", None)
    if window is not None:
        forms = _window_forms(module, window, scaling, query, key)
    kernel, raw_query, raw_key = FEATURES, query, key
    if hasattr(module, "infsa_feature_q"):  # learned maps: their outputs are the features, kept in float32 (a
        # feature's gradient carries the softmax's constant-sum direction: 1.4e5 on a tiny Qwen3, past float16)
        query, key = (t.to(accumulation_dtype(t)) for t in (query, key))
        query, key, kernel = module.infsa_feature_q(query), module.infsa_feature_k(key), "identity"
    tap = getattr(module, "_linvit_weight_tap", None)
    if tap is not None:  # attention transfer's weight loss (distillation.attention_weights) reads this call's weights
        tap(raw_query, raw_key, query, key, kernel, scaling, window)
    keep, resets = read_mask(attention_mask, q_len, kwargs.get("sliding_window"))
    state = slot.state if slot is not None else None
    recurrent = state is not None and q_len == 1
    out, state = forms(query, key, value, recurrent, kernel, state=state, key_mask=keep, resets=resets)
    if slot is not None:  # the cache keeps no graph (a decoding step under no_grad has none to drop: no copies)
        graph = any(t is not None and t.requires_grad for t in state)
        slot.state = type(state)(*(None if t is None else t.detach() for t in state)) if graph else state
    # no attention dropout (the model's rate, `dropout`, is not applied): softmax drops attention probabilities,
    # which these O(N) forms never form, and dropping the output rows instead at the same rate cost 0.32 points of
    # the distilled GPT-2's loss gap [0.06, 0.58] (issue 45.6, scripts/lm_dropout.py, docs/distill.md)
    return out.transpose(1, 2).contiguous(), None


def _window_forms(module, window: int, scaling, raw_query, raw_key):
    """forms() of the sliding-window hybrid: the softmax reads the raw queries and keys, the older tokens the
    features forms() is handed (a learned map's, or ELU + 1 of the raw ones); Katz's discount where the layer
    has one (None: linear attention)."""

    def forms(query, key, value, recurrent: bool, kernel: str, **state):
        gamma = (
            torch.sigmoid(module.infsa_theta.to(accumulation_dtype(query))) if hasattr(module, "infsa_theta") else None
        )
        features = (query, key) if kernel == "identity" else None
        form = window_causal_recurrent if recurrent else window_causal_chunked
        return form(raw_query, raw_key, value, window, gamma=gamma, scale=scaling, features=features, eps=EPS, **state)

    return forms
