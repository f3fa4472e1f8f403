"""Plain linear attention, the anchor form (issue 44.3): the vision layer and the causal forms against float64
references written from the definition, causality, packed documents and cached decoding in language models."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import linvit
from linvit.layers import LinearAttention
from linvit.ops.linear_causal import causal_linear_chunked, causal_linear_dense, causal_linear_recurrent


def _elu1(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.elu(t.double() / t.shape[-1] ** 0.5) + 1


def _definition(kind: str, t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """phi written out: ELU + 1 or ReLU of t / sqrt(d), or Hedgehog's [softmax(t W), softmax(-t W)]."""
    if kind == "relu":
        return torch.relu(t.double() / t.shape[-1] ** 0.5)
    if kind == "elu+1":
        return _elu1(t)
    scores = torch.einsum("bhnd,hdf->bhnf", t.double(), weight.double())
    return torch.cat([scores.softmax(-1), (-scores).softmax(-1)], dim=-1)


def _masked_reference(q, k, v, keep, documents):
    """out_i = sum_{j <= i, same document, kept} phi(q_i).phi(k_j) v_j / (sum of the same weights + eps)."""
    N = q.shape[2]
    allowed = torch.ones(N, N, dtype=torch.bool).tril()[None] & keep[:, None, :]
    allowed = allowed & (documents[:, :, None] == documents[:, None, :])
    weights = (_elu1(q) @ _elu1(k).transpose(-2, -1)) * allowed[:, None].double()
    return (weights @ v.double()) / (weights.sum(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("feature_map", ["elu+1", "relu", "hedgehog"])
def test_the_vision_layer_equals_its_definition_in_float64(feature_map):
    torch.manual_seed(0)
    layer = LinearAttention(32, num_heads=2, qkv_bias=True, feature_map=feature_map).double()
    if feature_map == "hedgehog":
        with torch.no_grad():  # away from the identity start, and different for queries and keys
            layer.feature_q.weight.normal_()
            layer.feature_k.weight.normal_()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    q, k, v = layer.qkv(x).reshape(2, 11, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
    learned = feature_map == "hedgehog"
    fq = _definition(feature_map, q, layer.feature_q.weight if learned else None)
    fk = _definition(feature_map, k, layer.feature_k.weight if learned else None)
    weights = fq @ fk.transpose(-2, -1)
    mixed = (weights @ v) / (weights.sum(-1, keepdim=True) + layer.eps)
    assert (layer(x) - layer.proj(mixed.transpose(1, 2).reshape(2, 11, 32))).abs().max() <= 1e-12


def test_the_vision_layer_is_permutation_equivariant_and_refuses_masks():
    torch.manual_seed(1)
    layer = LinearAttention(32, num_heads=2, feature_map="hedgehog").double()
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    perm = torch.randperm(9)
    assert (layer(x)[:, perm] - layer(x[:, perm])).abs().max() <= 1e-12
    with pytest.raises(ValueError, match="masks are not supported"):
        layer(x, attn_mask=torch.ones(9, 9, dtype=torch.bool))


@settings(deadline=None, max_examples=20)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    padded=st.integers(0, 5),
    chunk=st.integers(1, 70),
    cut=st.integers(0, 200),
)
def test_causal_forms_equal_the_masked_float64_reference(lengths, padded, chunk, cut):
    """Chunked, recurrent and dense forms, padding and packed documents, and a call cut anywhere then continued
    from its state: all equal the weights written out from the definition."""
    N = sum(lengths)
    gen = torch.Generator().manual_seed(N)
    q, k, v = (torch.randn(1, 2, N, 6, dtype=torch.float64, generator=gen) for _ in range(3))
    keep = torch.ones(1, N, dtype=torch.bool)
    keep[0, : min(padded, N - 1)] = False
    resets = torch.zeros(1, N, dtype=torch.bool)
    resets[0, torch.tensor([0, *lengths]).cumsum(0)[1:-1]] = True
    expected = _masked_reference(q, k, v, keep, resets.long().cumsum(-1))
    rows = keep[:, None, :, None]  # padded queries' rows are never read
    for out in (
        causal_linear_dense(q, k, v, key_mask=keep, resets=resets),
        causal_linear_chunked(q, k, v, chunk_size=chunk, key_mask=keep, resets=resets)[0],
        causal_linear_recurrent(q, k, v, key_mask=keep, resets=resets)[0],
    ):
        assert ((out - expected) * rows).abs().max() <= 1e-12
    c = cut % (N + 1)
    head, state = causal_linear_chunked(*(t[:, :, :c] for t in (q, k, v)), key_mask=keep[:, :c], resets=resets[:, :c])
    tail, _ = causal_linear_recurrent(
        *(t[:, :, c:] for t in (q, k, v)), state=state, key_mask=keep[:, c:], resets=resets[:, c:]
    )
    assert ((torch.cat([head, tail], dim=2) - expected) * rows).abs().max() <= 1e-12


def _gpt2(form: str):
    transformers = pytest.importorskip("transformers")  # the vision and op tests above run without it
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=400)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.generation_config.pad_token_id = 0
    return linvit.convert(model, form)


@pytest.mark.parametrize("form", ["linear_attention", "linear_attention:hedgehog"])
def test_a_language_model_decodes_300_tokens_from_its_state_as_the_full_forward(form):
    model = _gpt2(form)
    ids = torch.randint(1, 61, (2, 320), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :20], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        for t in range(20, 320):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5
    sizes = [layer.state.S.numel() for layer in cache.layers]
    assert sizes == [2 * 4 * (16 if form.endswith("hedgehog") else 8) * 8] * 2  # fixed, whatever the context


@pytest.mark.parametrize("form", ["linear_attention", "linear_attention:hedgehog"])
def test_no_future_token_changes_an_earlier_output(form):
    model = _gpt2(form)
    ids = torch.randint(1, 61, (1, 150), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 100:] = (changed[0, 100:] + 7) % 61
    with torch.no_grad():
        assert torch.equal(model(ids).logits[:, :100], model(changed).logits[:, :100])


def test_linear_attention_has_no_discount_and_its_maps_train():
    model = _gpt2("linear_attention:hedgehog").train()
    assert not [n for n, _ in model.named_parameters() if "infsa_theta" in n]
    ids = torch.randint(1, 61, (2, 70))
    model(ids, labels=ids).loss.backward()
    weight = model.transformer.h[0].attn.infsa_feature_k.weight
    assert weight.grad is not None and bool((weight.grad.abs().flatten(1).sum(-1) > 0).all())
