"""Pure InfSA in Hugging Face language models, through transformers' own attention interface.

`linvit.convert(model, "pure_infsa")` on a transformers model whose attention layers call
ALL_ATTENTION_FUNCTIONS (GPT-2, Llama, Qwen3, Mistral, BERT, ...) registers one attention function and
selects it for that model, so rotary embeddings, grouped-query heads, the masks and the KV cache stay the
library's. Each attention layer gets one trainable discount per head (gamma = sigmoid(infsa_theta)).

The one thing the interface cannot carry is pure InfSA's per-query normaliser under a mask: query i is
normalised over the squared score rows of the queries it sees (linvit.ops.infsa.masked_row_norms), so an
incremental step needs the row norms of every earlier query, which no key/value cache holds. linvit keeps
them beside the cache (one float32 per position, head and layer, attached to the Cache object by a pre-hook
that sees the cache the layer is called with). Beam search's reorders (Cache.reorder_cache) reorder it too; a
cache that was cropped, slides or was filled by another model no longer lines up with it, which every step
checks by shapes alone (no device read), refusing in one line.
Katz-InfSA converts causal models with its causal form (conversion/language_katz.py: linear time, a state in
place of the key/value cache); Linear-InfSA pools every token into one summary, which has no causal form: it
refuses causal models.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..errors import UsageError
from ..ops.infsa import masked_row_norms, row_square_sums, scaled_product
from .records import ConvertedModule

ATTENTION_NAME = "linvit_pure_infsa"
STATE = "_linvit_row_sq"  # the attribute of a Cache that holds each layer's squared score rows
EPS = 1e-6
# why each bidirectional form has no causal one; any other mixer without one: NO_CAUSAL_FORM
NO_CAUSAL_WHY = {
    "linear_infsa": "pools every token into one summary",
    "katz_rows": "normalises each query's row over the whole series",
}
NO_CAUSAL_FORM = "is a bidirectional mixer"
CAUSAL_REFUSAL = (
    "{variant} {why}, which has no causal form here: a causal language model "
    "would see future tokens. Use variant='katz_infsa' (causal, linear time, no key/value cache), "
    "'pure_infsa' (quadratic, exact causal and padding masks) or 'linear_attention' (the one-hop anchor form)"
)


def interface_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The (name, module) pairs of a transformers model's attention layers that call the attention interface."""
    found = []
    for name, module in model.named_modules():
        cls = type(module)
        if cls.__module__.startswith("transformers.models.") and all(
            hasattr(module, a) for a in ("config", "is_causal", "layer_idx")
        ):
            found.append((name, module))
    return found


def is_causal_model(model: nn.Module, modules: list[tuple[str, nn.Module]]) -> bool:
    return bool(getattr(model.config, "is_decoder", False)) or any(m.is_causal for _, m in modules)


def register_attention(name: str, attention, causal_skip: bool = False) -> None:
    """transformers' attention function `name`, with its boolean masks (True = keep). Pure InfSA's are never
    skipped (it has no is_causal shortcut: the mask is its causality). The causal state forms (causal_skip) take
    no mask where transformers' SDPA would skip one (causal, nothing padded, no packed documents): they are causal
    by construction, and reading and checking a q x q mask made every prefill quadratic (at 8,192 tokens about
    70% of the hybrid's prefill time: scripts/mask_skip_ab.py). They read the padded keys and document starts
    from any mask they are given."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def boolean_mask(*args, **kwargs):
        kwargs["allow_is_causal_skip"] = causal_skip and kwargs.get("allow_is_causal_skip", True)
        kwargs["allow_is_bidirectional_skip"] = False
        return sdpa_mask(*args, **kwargs)

    AttentionInterface.register(name, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, boolean_mask)


def convert_language_model(
    model: nn.Module, variant: str, gamma_init: float, modules, report, feature_map=None, feature_dim=None, window=None
) -> nn.Module:
    """Select pure InfSA or causal Katz-InfSA (with learned feature maps for feature_map "hedgehog") for every
    interface attention layer of a transformers model (see the module doc)."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise UsageError(
            "encoder-decoder models (cross-attention over the encoder) are not supported; decoders and encoders are"
        )
    refuse_what_conversion_drops(model, modules)
    current = str(getattr(model.config, "_attn_implementation", None))
    previous = getattr(getattr(model, "linvit_conversion", None), "variant", None)
    asked = report.variant  # the whole form, "katz_infsa:hedgehog"
    if current.startswith("linvit_") and (current != f"linvit_{variant}" or previous not in (None, asked)):
        # its hooks, state and feature maps are the other form's
        raise UsageError(f"this model is already converted ({current}): convert its softmax original to {asked}")
    causal = is_causal_model(model, modules)
    if window is not None and not (causal and variant in ("katz_infsa", "linear_attention")):
        what = "is not a causal language model" if not causal else f"under {variant} has no causal state to window"
        raise UsageError(f"window= is for causal Katz-InfSA and linear attention: {type(model).__name__} {what}")
    positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if window is not None and isinstance(positions, int) and window > positions:
        # the ring holds W slots from the first token on (its memory grows with W, not with the text)
        raise UsageError(
            f"window={window} is longer than the model's {positions} positions: a window as long as the context is "
            f"already exact softmax; give at most {positions}"
        )
    if variant in ("katz_infsa", "linear_attention") and causal:
        from . import language_katz

        katz = variant == "katz_infsa"
        name = language_katz.ATTENTION_NAME if katz else language_katz.LINEAR_ATTENTION_NAME
        attention = language_katz.katz_causal_attention if katz else language_katz.linear_causal_attention
        register_attention(name, attention, causal_skip=True)
        language_katz.add_feature_maps(modules, feature_map, feature_dim)
        for _, module in modules:  # the sliding-window hybrid (ops.window_causal); a new window replaces the old
            module.infsa_window = window
        _add_discounts(model, modules, gamma_init if katz else None, report, language_katz.install_state_layer)
        model.set_attn_implementation(name)
        return model
    if variant != "pure_infsa" and causal:
        raise UsageError(CAUSAL_REFUSAL.format(variant=variant, why=NO_CAUSAL_WHY.get(variant, NO_CAUSAL_FORM)))
    if variant != "pure_infsa":
        raise UsageError(f"{variant} is not wired into transformers' encoders; use variant='pure_infsa'")
    register_attention(ATTENTION_NAME, pure_infsa_attention)
    _add_discounts(model, modules, gamma_init, report, _remember_cache)
    model.set_attn_implementation(ATTENTION_NAME)
    return model


def refuse_what_conversion_drops(model: nn.Module, modules) -> None:
    """One line instead of a silently different model: no converted form applies attention logit soft-capping
    (Gemma 2: c tanh(s / c) before the softmax) or attention sinks (gpt-oss: a learned logit per head in every
    softmax's normaliser), so a model that has either is refused."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    caps = [getattr(config, "attn_logit_softcapping", None)] + [
        getattr(module, "attn_logit_softcapping", None) for _, module in modules
    ]
    cap = next((c for c in caps if c is not None), None)
    if cap is not None:
        raise UsageError(
            f"{type(model).__name__} soft-caps its attention logits (attn_logit_softcapping={cap}), which no converted "
            "attention form applies: converting would silently change every layer's scores"
        )
    sinks = [name for name, m in modules if any(getattr(m, a, None) is not None for a in ("sinks", "sink_proj"))]
    if sinks:
        raise UsageError(
            f"{type(model).__name__} has attention sinks (a learned logit in every softmax's normaliser, {sinks[0]}), "
            "which no converted attention form applies: converting would silently drop them"
        )


def _add_discounts(model, modules, gamma_init: float | None, report, pre_hook) -> None:
    """One trainable discount per head (gamma = sigmoid(infsa_theta)) on every selected layer (linear attention,
    gamma_init None, has none: the layer is marked infsa_linear_attention), and the hooks that hand each call's
    cache to the attention function."""
    if any(hasattr(module, "infsa_theta") for _, module in modules):
        _keep_first_gamma_init(model, report)
    for name, module in modules:
        heads = int(module.config.num_attention_heads)
        if not hasattr(module, "infsa_theta") and not hasattr(module, "infsa_linear_attention"):
            weight = next(module.parameters())
            if gamma_init is None:
                module.infsa_linear_attention = True
            else:
                theta = math.log(gamma_init / (1.0 - gamma_init))
                module.infsa_theta = nn.Parameter(torch.full((heads,), theta, dtype=weight.dtype, device=weight.device))
            module.register_forward_pre_hook(pre_hook, with_kwargs=True)
            module.register_forward_hook(_forget_cache)
        report.converted.append(_converted(name, module, heads))


def _keep_first_gamma_init(model, report) -> None:
    """Converting a converted model again (to add a window, say) keeps its layers' discounts, trained or not, so
    the report records the first conversion's gamma_init (linvit.convert warns where another was given)."""
    previous = getattr(getattr(model, "linvit_conversion", None), "gamma_init", None)
    if previous is not None:
        report.gamma_init = previous


def _converted(name: str, module: nn.Module, heads: int):
    source = f"{type(module).__module__}.{type(module).__qualname__}"
    return ConvertedModule(name, source, heads, int(module.config.hidden_size))


def _remember_cache(module: nn.Module, args, kwargs) -> None:
    """The cache this call of the layer updates (the interface passes it no further), for the row-norm state."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    self_attention = getattr(cache, "self_attention_cache", None)  # encoder-decoder caches
    module._linvit_cache = self_attention if self_attention is not None else cache


def _forget_cache(module: nn.Module, args, output) -> None:
    module._linvit_cache = module._linvit_katz_slot = None  # the state lives on the cache, not on the layer


def repeat_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: each key/value head serves heads / kv_heads query heads."""
    if t.shape[1] == heads:
        return t
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _keep_mask(attention_mask: torch.Tensor | None, module, q_len: int, kv_len: int, device) -> torch.Tensor | None:
    """A boolean (B|1, 1|H, q, T) keep-mask; None means every query sees every key."""
    if attention_mask is None:
        if not module.is_causal or q_len == 1:
            return None
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # queries are the last q positions
        return (torch.arange(kv_len, device=device)[None, :] <= rows)[None, None]
    if attention_mask.dtype != torch.bool:  # an additive float mask: 0 keeps, a large negative removes
        return attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return attention_mask


def pure_infsa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: gamma * ReLU(q k^T / d) v / norm, with norm_i the Frobenius norm of the
    score rows query i sees (the whole matrix without a mask). Returns (output (B, q, H, D), None).

    The product with v and its scale run in float32 for float16 models (ops.infsa.scaled_product): position 0
    of a causal model sees only itself, so about half the heads have no positive score there, and float16
    cannot hold gamma / (norm + eps) for them."""
    if not hasattr(module, "infsa_theta"):  # a layer include/exclude left out: softmax attention, as before
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    heads, q_len, kv_len = query.shape[1], query.shape[2], key.shape[2]
    key, value = repeat_heads(key, heads), repeat_heads(value, heads)
    d = query.shape[-1]
    scores = torch.relu_((query * (1.0 / d)) @ key.transpose(-2, -1))  # InfSA's q k^T / d, not softmax's scaling
    mask = _keep_mask(attention_mask, module, q_len, kv_len, query.device)
    if mask is None:  # every query sees every row: the whole matrix's Frobenius norm
        mask = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=query.device)
    else:
        scores = scores.masked_fill(~mask, 0.0)
    rows = _all_rows(module, row_square_sums(scores), kv_len)  # (B, H, T): float32 sums for half inputs
    norm = masked_row_norms(rows, mask)[..., None]  # the mask is shared by the heads: never copied per head
    gamma = torch.sigmoid(module.infsa_theta.to(rows.dtype)).view(1, heads, 1, 1)
    probs = nn.functional.dropout(scores, dropout, training=module.training and dropout > 0)
    return scaled_product(probs, value, gamma / (norm + EPS)).transpose(1, 2).contiguous(), None


def _all_rows(module, row_sq: torch.Tensor, kv_len: int) -> torch.Tensor:
    """The squared score rows of every position 0..T-1: the earlier ones from the cache's state, then these.

    Checked by shapes only (no device read on the decoding hot path); beam search's reorders reach the state
    through the cache's own reorder_cache (_follow_reorders)."""
    cache = getattr(module, "_linvit_cache", None)
    q_len = row_sq.shape[-1]
    if cache is None:
        if kv_len != q_len:
            raise UsageError("pure InfSA got cached keys but no cache object to keep its row norms with")
        return row_sq
    _follow_reorders(cache)
    states = cache.__dict__.setdefault(STATE, {})
    earlier = states.get(module.layer_idx, row_sq[..., :0])
    if earlier.shape[-1] != kv_len - q_len or earlier.shape[0] != row_sq.shape[0]:
        raise UsageError(
            f"pure InfSA's normaliser state holds {earlier.shape[-1]} positions but the cache {kv_len - q_len}: "
            "the cache was cropped, is static or sliding, or was filled by another model (use a DynamicCache)"
        )
    rows = torch.cat([earlier, row_sq], dim=-1)
    states[module.layer_idx] = rows.detach()
    return rows


def _follow_reorders(cache) -> None:
    """Make cache.reorder_cache (beam search, between steps) reorder the row-norm state with the keys and values."""
    if "reorder_cache" not in cache.__dict__:
        cache.reorder_cache = _ReorderWithRowNorms(cache)


class _ReorderWithRowNorms:
    """A cache's reorder_cache that also reorders linvit's row-norm state. An object, not a bound method, so
    the cache still pickles (torch.save) and deep-copies (the copy's reorder reorders the copy)."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def __call__(self, beam_idx: torch.Tensor) -> None:
        type(self.cache).reorder_cache(self.cache, beam_idx)
        states = self.cache.__dict__.get(STATE, {})
        for layer, rows in states.items():
            states[layer] = rows.index_select(0, beam_idx.to(rows.device))
