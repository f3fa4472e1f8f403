"""Pure InfSA (issue 25 part 1) and causal Katz-InfSA (issue 36) in Hugging Face language models, on tiny random
models built from transformers' config classes (nothing is downloaded): the attention function equals linvit's
op, no future token leaks, padding equals no padding, cached decoding equals recomputation, the discounts
train; Katz's cache keeps a fixed-size state instead of keys and values."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import linvit  # noqa: E402
from conftest import rel_err  # noqa: E402
from linvit.conversion.language import pure_infsa_attention  # noqa: E402
from linvit.ops import pure_infsa  # noqa: E402

VOCAB = 61


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg)


def _decoder(family: str, **extra):
    """A tiny random Llama-style decoder (LlamaConfig -> LlamaForCausalLM, and the same for Qwen3 and Mistral)."""
    config = getattr(transformers, f"{family}Config")
    shape = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4)
    return getattr(transformers, f"{family}ForCausalLM")(config(**shape, max_position_embeddings=64, **extra))


def _llama():
    return _decoder("Llama", num_hidden_layers=2, num_key_value_heads=2)  # grouped-query heads


def _qwen3():
    return _decoder("Qwen3", num_hidden_layers=3, num_key_value_heads=1, head_dim=8)


def _mistral():  # a window longer than every sequence here: the same path as full attention
    return _decoder("Mistral", num_hidden_layers=2, num_key_value_heads=2, sliding_window=32)


FAMILIES = {"gpt2": _gpt2, "llama": _llama, "qwen3": _qwen3, "mistral": _mistral}


CAUSAL_VARIANTS = ["pure_infsa", "katz_infsa", "katz_infsa:hedgehog"]


def _converted(family: str, variant: str = "pure_infsa"):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    model.generation_config.pad_token_id = 0
    return linvit.convert(model, variant, gamma_init=0.8)


class _Layer(torch.nn.Module):
    is_causal, layer_idx = True, 0

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.infsa_theta = torch.nn.Parameter(torch.linspace(-1.0, 2.0, heads, dtype=torch.float64))


def test_the_attention_function_is_linvits_masked_pure_infsa_in_float64():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64) for _ in range(3))
    layer = _Layer(3)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    padded = causal & torch.tensor([[True] * 9, [False, False] + [True] * 7])[:, None, None, :]
    for mask in (None, causal[None, None], padded):
        out, _ = pure_infsa_attention(layer, q, k, v, mask)
        gamma = torch.sigmoid(layer.infsa_theta)
        expected = pure_infsa(q, k, v, gamma, attn_mask=causal[None, None] if mask is None else mask)
        torch.testing.assert_close(out.transpose(1, 2), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_conversion_reports_every_attention_layer(variant, family):
    model = _converted(family, variant)
    report = linvit.convert_report(model)
    layers = model.config.num_hidden_layers
    assert len(report.converted) == layers and not report.skipped
    assert all(c.heads == 4 and c.width == 32 for c in report.converted)
    assert [c.name for c in report.converted] == [n for n, m in model.named_modules() if hasattr(m, "infsa_theta")]
    assert model.config._attn_implementation == f"linvit_{variant.partition(':')[0]}"
    learned = [n for n, _ in model.named_parameters() if "infsa_feature" in n]
    assert len(learned) == (2 * layers if variant.endswith(":hedgehog") else 0)  # W for queries and keys


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_no_future_token_reaches_an_earlier_output(variant, family):
    model = _converted(family, variant)
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    later = ids.clone()
    later[:, 6:] = (later[:, 6:] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(ids).logits, model(later).logits
    assert torch.equal(a[:, :6], b[:, :6])  # bit-identical up to the change
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3  # and the change does reach the later outputs


def _left_padded(lengths: list[int], total: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, total - n :] = torch.randint(1, VOCAB, (n,), generator=gen)
        mask[row, total - n :] = 1
    return ids, mask


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_a_left_padded_batch_gives_each_sequence_its_unpadded_outputs(variant, family):
    model = _converted(family, variant)
    ids, mask = _left_padded([9, 5], 9)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        for row, n in enumerate([9, 5]):
            alone = model(ids[row : row + 1, 9 - n :]).logits[0]
            torch.testing.assert_close(batch[row, 9 - n :], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_cached_decoding_equals_recomputing_the_prefix(variant, family, sample):
    """generate() with the KV cache (and linvit's row-norm state) on a left-padded batch: each step's logits
    equal a full forward of the same prefix without a cache, within 1e-5."""
    model = _converted(family, variant)
    ids, mask = _left_padded([8, 4], 8)
    torch.manual_seed(3)
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=6,
        do_sample=sample,
        top_k=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (2, 14)
    for step, logits in enumerate(out.logits):
        prefix = out.sequences[:, : 8 + step]
        prefix_mask = torch.cat([mask, torch.ones(2, step, dtype=torch.long)], dim=1)
        positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            full = model(prefix, attention_mask=prefix_mask, position_ids=positions, use_cache=False).logits[:, -1]
        torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_gradients_reach_every_layers_discounts(variant, family):
    model = _converted(family, variant).train()
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(4))
    model(ids, labels=ids).loss.backward()
    thetas = [m.infsa_theta for m in model.modules() if hasattr(m, "infsa_theta")]
    assert len(thetas) == model.config.num_hidden_layers
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in thetas)
    assert torch.allclose(torch.sigmoid(thetas[0].detach()), torch.tensor(0.8))  # gamma_init


def test_linear_infsa_refuses_a_causal_model_saying_why():
    with pytest.raises(ValueError, match="linear_infsa pools every token into one summary, which has no causal form"):
        linvit.convert(_llama(), "linear_infsa")


def test_a_reordered_cache_is_followed_by_the_row_norms():
    """Beam search reorders the cache between steps: the next step equals a full forward of the reordered
    prefix (the row-norm state is reordered with the keys, not refused, and no key is compared on the way)."""
    model = _converted("llama")
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        cache.reorder_cache(torch.tensor([1, 1]))  # what beam search does between steps
        step = model(ids[:, :1], cache=cache, use_cache=True).logits[:, -1]
        full = model(torch.cat([ids[[1, 1]], ids[:, :1]], dim=1), use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_float16_logits_are_finite_and_close_to_float32(variant, family):
    """Issue 39 item 1: .half() gave 100% NaN logits (position 0 sees only itself, so heads with no positive
    score there had gamma / (norm + eps) = inf in float16). Target: finite, within 1e-2 relative of float32."""
    model = _converted(family, variant)
    ids, mask = _left_padded([12, 7], 12)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        half = copy.deepcopy(model).half()(ids, attention_mask=mask).logits
    assert torch.isfinite(half).all()
    assert rel_err(half[mask.bool()], full[mask.bool()]) <= 1e-2


def test_an_encoder_hides_padding_from_the_kept_tokens():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    model = linvit.convert(transformers.BertModel(cfg).eval(), "pure_infsa")
    ids = torch.randint(1, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    other = ids.clone()
    other[:, 5:] = (other[:, 5:] + 3) % VOCAB
    with torch.no_grad():
        a = model(ids, attention_mask=mask).last_hidden_state
        b = model(other, attention_mask=mask).last_hidden_state
        alone = model(ids[:, :5]).last_hidden_state
    assert torch.equal(a[:, :5], b[:, :5])
    torch.testing.assert_close(a[:, :5], alone, rtol=1e-5, atol=1e-5)
    assert len(linvit.convert_report(model).converted) == 2


def test_a_sliding_window_cache_that_drops_keys_is_refused():
    """A window shorter than the text: the cache forgets keys, so the row-norm state no longer lines up."""
    torch.manual_seed(0)
    window = _decoder("Mistral", num_hidden_layers=1, num_key_value_heads=2, sliding_window=4)
    model = linvit.convert(window.eval(), "pure_infsa")
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="static or sliding"):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0)


def test_layers_left_out_by_include_keep_softmax_attention():
    torch.manual_seed(0)
    source = _llama().eval()
    model = linvit.convert(copy.deepcopy(source), "pure_infsa", include=r"layers\.1\.")
    report = linvit.convert_report(model)
    assert [c.name for c in report.converted] == ["model.layers.1.self_attn"]
    assert [s.name for s in report.skipped] == ["model.layers.0.self_attn"]
    ids, mask = _left_padded([7, 4], 7)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hidden = {}
        for name, net in (("source", source), ("converted", model)):
            out = net(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
            hidden[name] = out.hidden_states
        alone = model(ids[1:, 3:]).logits[0]
    # layer 0 is the source's softmax layer in both; layer 1 differs; padding stays hidden
    torch.testing.assert_close(hidden["converted"][1][:, 3:], hidden["source"][1][:, 3:], rtol=1e-5, atol=1e-5)
    assert (hidden["converted"][2][:, 3:] - hidden["source"][2][:, 3:]).abs().max() > 1e-3
    torch.testing.assert_close(out.logits[1, 3:], alone, rtol=1e-5, atol=1e-5)


def test_an_encoder_decoder_model_is_refused_in_one_line():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    with pytest.raises(ValueError, match="encoder-decoder models .* are not supported"):
        linvit.convert(transformers.T5ForConditionalGeneration(cfg), "pure_infsa")


def test_a_decoding_step_compares_no_keys_on_the_host():
    """Issue 39: every layer's torch.equal(key, last_key) read the device once per step (a host sync, which
    also blocks one CUDA-graph decode step); the cache check is now by shapes alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountEqual(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket == torch.ops.aten.equal:
                CountEqual.calls += 1
            return func(*args, **(kwargs or {}))

    model = _converted("llama")
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(8))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        with CountEqual():
            model(ids[:, :1], cache=cache, use_cache=True)
    assert CountEqual.calls == 0


def test_katz_attention_function_is_linvits_causal_op_in_float64():
    """Without a cache the layer computes ops.katz_causal on its heads; padded keys (the mask's columns no query
    sees) are removed from every later position."""
    from linvit.conversion.language_katz import katz_causal_attention
    from linvit.ops.katz_causal import causal_katz_dense

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64) for _ in range(3))
    layer = _Layer(3)
    gamma = torch.sigmoid(layer.infsa_theta)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    keep = torch.tensor([[True] * 9, [False, False] + [True] * 7])
    for mask, key_mask in ((None, None), (causal[None, None], None), (causal & keep[:, None, None, :], keep)):
        out, _ = katz_causal_attention(layer, q, k, v, mask)
        expected = causal_katz_dense(q, k, v, gamma, key_mask=key_mask)
        torch.testing.assert_close(out.transpose(1, 2), expected, rtol=1e-12, atol=1e-12)


def test_katz_decoding_keeps_a_fixed_size_state_not_keys():
    """The cache's memory does not grow with the context: after 8 and after 24 tokens every layer holds the same
    (B, H, d, D) + (B, H, d) state and no keys or values."""
    model = _converted("llama", "katz_infsa")
    ids = torch.randint(1, VOCAB, (1, 8), generator=torch.Generator().manual_seed(8))
    sizes = []
    for new in (1, 17):
        out = model.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
        cache = out.past_key_values
        assert cache.get_seq_length() == 8 + new - 1
        layers = cache.layers
        assert all(type(layer).__name__ == "KatzStateLayer" and layer.keys.numel() == 0 for layer in layers)
        sizes.append([tuple(t.shape) for layer in layers for t in layer.state])
    assert sizes[0] == sizes[1] and sizes[0][0] == (1, 4, 8, 8)


def test_katz_follows_beam_search_reorders():
    model = _converted("llama", "katz_infsa")
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        cache.reorder_cache(torch.tensor([1, 1]))
        step = model(ids[:, :1], cache=cache, use_cache=True).logits[:, -1]
        full = model(torch.cat([ids[[1, 1]], ids[:, :1]], dim=1), use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
    beams = model.generate(ids, num_beams=3, max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(ids))
    assert beams.shape == (2, 10)


def test_katz_refuses_a_cache_another_model_filled_and_cropping():
    source = _llama().eval()
    model = linvit.convert(copy.deepcopy(source), "katz_infsa")
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    cache = transformers.DynamicCache(config=source.config)
    with torch.no_grad():
        source(ids, cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="holding 5 tokens: pass a fresh DynamicCache"):
            model(ids[:, :1], cache=cache, use_cache=True)
        fresh = transformers.DynamicCache(config=model.config)
        model(ids, cache=fresh, use_cache=True)
    with pytest.raises(ValueError, match="cannot be cropped"):
        fresh.crop(-1)


def test_katz_refuses_an_encoder_in_one_line():
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    with pytest.raises(ValueError, match="katz_infsa is not wired into transformers' encoders"):
        linvit.convert(transformers.BertModel(cfg), "katz_infsa")


def test_a_converted_model_is_not_converted_again_to_the_other_variant():
    model = _converted("llama", "pure_infsa")
    with pytest.raises(ValueError, match="already converted \\(linvit_pure_infsa\\): convert its softmax original"):
        linvit.convert(model, "katz_infsa")


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("variant", CAUSAL_VARIANTS)
def test_packed_documents_each_equal_the_document_alone(variant, family):
    """Issue 45.2: transformers' padding-free packing (position ids restarting, no attention mask) gives a
    block-diagonal causal mask; each document's logits equal running it alone (causal Katz used to carry its
    state across the boundary: 4.2 apart). Rows of 120 tokens cross the 64-token chunks."""
    model = _converted(family, variant)
    lengths = [[40, 50, 30], [64, 56, 0]]
    g = torch.Generator().manual_seed(5)
    docs = [[torch.randint(1, VOCAB, (1, n), generator=g) for n in row if n] for row in lengths]
    ids = torch.cat([torch.cat(row, dim=1) for row in docs])
    positions = torch.stack([torch.cat([torch.arange(n) for n in row if n]) for row in lengths])
    with torch.no_grad():
        packed = model(ids, position_ids=positions, use_cache=False).logits
        for b, row in enumerate(docs):
            start = 0
            for doc in row:
                alone = model(doc, use_cache=False).logits
                assert (packed[b : b + 1, start : start + doc.shape[1]] - alone).abs().max() < 1e-5
                start += doc.shape[1]


def test_katz_refuses_a_mask_its_state_cannot_follow():
    """A custom 4-D mask that hides one earlier key from one query is no causal, padding or packed pattern."""
    from linvit.conversion.language_katz import katz_causal_attention

    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    katz_causal_attention(_Layer(2), q, k, v, mask[None, None])  # causal: accepted
    mask[4, 1] = False
    with pytest.raises(ValueError, match="causal, padding and packed-document masks only"):
        katz_causal_attention(_Layer(2), q, k, v, mask[None, None])


def test_a_cached_call_whose_tokens_see_no_cached_key_starts_a_new_document():
    """A packed document that begins exactly at a call with a cache (its rows see none of the cached keys) must
    not read the earlier document's state: it equals that document run alone."""
    from types import SimpleNamespace

    from linvit.conversion.language_katz import katz_causal_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    layer = _Layer(2)
    layer._linvit_katz_slot = slot = SimpleNamespace(state=None)
    katz_causal_attention(
        layer, q[:, :, :5], k[:, :, :5], v[:, :, :5], torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    )
    assert slot.state is not None  # the first document's state, carried by the slot
    fresh = torch.cat([torch.zeros(4, 5, dtype=torch.bool), torch.ones(4, 4, dtype=torch.bool).tril()], dim=1)
    out, _ = katz_causal_attention(layer, q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], fresh[None, None])
    layer._linvit_katz_slot = None
    alone, _ = katz_causal_attention(layer, q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], None)
    assert (out - alone).abs().max() <= 1e-12


@pytest.mark.parametrize("form", ["katz_infsa", "katz_infsa:hedgehog", "linear_attention", "pure_infsa"])
def test_attention_dropout_acts_where_the_form_has_probabilities(form):
    """Pure InfSA drops attention probabilities, as softmax does; the O(N) forms never form them and apply no
    attention dropout (issue 45.6: dropping their output rows cost distillation 0.32 points of loss gap)."""
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.5)
    cfg.resid_pdrop = cfg.embd_pdrop = 0.0
    model = linvit.convert(transformers.GPT2LMHeadModel(cfg), form)
    ids = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        evaluated = model.eval()(ids).logits
        trained = [model.train()(ids).logits for _ in range(2)]
    if form == "pure_infsa":
        assert rel_err(trained[0], trained[1]) > 1e-3  # a fresh probability mask each call
    else:
        assert torch.equal(trained[0], evaluated) and torch.equal(trained[1], evaluated)


def test_converting_a_converted_lm_again_keeps_its_discounts_and_says_so():
    """Converting again (to add a window) keeps each layer's discounts: the report records the first gamma_init;
    a different one given now warns that it sets none, and none given says nothing (the report printed 0.9)."""
    import warnings

    model = linvit.convert(_gpt2(), "katz_infsa", gamma_init=0.5)
    with torch.no_grad():
        model.transformer.h[0].attn.infsa_theta.add_(1.0)  # as if trained
    trained = [layer.attn.infsa_theta.detach().clone() for layer in model.transformer.h]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = linvit.convert(model, "katz_infsa", window=16)  # docs/conversion.md's way to add a window
    assert "gamma_init 0.5, window 16" in str(model.linvit_conversion)
    with pytest.warns(UserWarning, match=r"gamma_init=0.9 sets no discount: .* keep theirs \(first gamma_init 0.5\)"):
        again = linvit.convert(model, "katz_infsa", gamma_init=0.9, window=8)
    assert again.linvit_conversion.gamma_init == 0.5 and "gamma_init 0.5, window 8" in str(again.linvit_conversion)
    assert all(torch.equal(layer.attn.infsa_theta, t) for layer, t in zip(again.transformer.h, trained, strict=True))


def test_converting_again_with_another_feature_dim_says_the_maps_keep_theirs():
    """Like the discounts, the learned maps of a converted LM stay as they are: another size is said to size none."""
    model = linvit.convert(_gpt2(), "katz_infsa:hedgehog", gamma_init=0.5)
    head_dim = model.transformer.h[0].attn.infsa_feature_q.feature_dim
    with pytest.warns(UserWarning, match=rf"feature_dim=4 sizes no map: .* keep theirs \(f = {head_dim}\)"):
        again = linvit.convert(model, "katz_infsa:hedgehog", feature_dim=4, window=8)
    assert again.transformer.h[0].attn.infsa_feature_q.feature_dim == head_dim
