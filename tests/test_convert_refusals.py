"""linvit.convert refuses, in one line, language models whose attention has parts no converted form applies
(attention logit soft-capping, attention sinks), instead of silently returning a different model."""

from __future__ import annotations

import pytest
import torch

import linvit

transformers = pytest.importorskip("transformers")

FORMS = ["katz_infsa", "katz_infsa:hedgehog", "linear_attention", "pure_infsa"]


def _gemma2(softcap):
    config = transformers.Gemma2Config(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=2,
        attn_logit_softcapping=softcap,
    )
    return transformers.Gemma2ForCausalLM(config).eval()


def _gpt_oss():
    config = transformers.GptOssConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=2,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    return transformers.GptOssForCausalLM(config).eval()


def _refused(model, form, match):
    with pytest.raises(ValueError, match=match) as err:
        linvit.convert(model, form)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("form", FORMS)
def test_a_model_that_soft_caps_its_attention_logits_is_refused(form):
    message = _refused(_gemma2(50.0), form, r"soft-caps its attention logits \(attn_logit_softcapping=50.0\)")
    assert message.startswith("Gemma2ForCausalLM")


def test_a_soft_cap_on_any_config_or_layer_is_refused():
    config = transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4)
    config.attn_logit_softcapping = 30.0  # the config attribute alone
    _refused(transformers.GPT2LMHeadModel(config), "katz_infsa", "attn_logit_softcapping=30.0")
    model = _gemma2(None)
    model.model.layers[1].self_attn.attn_logit_softcapping = 20.0  # a layer that kept its own cap
    _refused(model, "katz_infsa", "attn_logit_softcapping=20.0")


@pytest.mark.parametrize("form", FORMS)
def test_a_model_with_attention_sinks_is_refused(form):
    _refused(_gpt_oss(), form, r"has attention sinks .*model\.layers\.0\.self_attn")


def test_without_a_cap_or_sinks_the_same_family_converts():
    """The refusal is the attribute's, not the family's: Gemma 2 without a soft cap converts and runs."""
    model = linvit.convert(_gemma2(None), "katz_infsa")
    logits = model(torch.randint(0, 61, (1, 12))).logits
    assert torch.isfinite(logits).all()
