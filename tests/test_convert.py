"""linvit.convert: timm, torch and Hugging Face attention to InfSA, weights kept, masks honoured or refused."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention

from linvit import convert, convert_report
from linvit.conversion import AttentionWeights
from linvit.layers import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention
from linvit.models.variants import create_variant
from linvit.ops import pure_infsa

LINVIT_TWIN = {
    "linear_infsa": ("linear_infvit_tiny_patch16_224", LinearInfSAAttention),
    "pure_infsa": ("infvit_tiny_patch16_224", PureInfSAAttention),
    "katz_infsa": ("katz_infvit_tiny_patch16_224", KatzInfSAAttention),
}


@pytest.fixture(scope="module")
def deit_state():
    torch.manual_seed(0)
    return timm.create_model("deit_tiny_patch16_224", num_classes=7).state_dict()


@pytest.mark.parametrize("variant", sorted(LINVIT_TWIN))
def test_converted_deit_equals_the_linvit_model_from_the_same_weights(variant, deit_state, tmp_path):
    source = timm.create_model("deit_tiny_patch16_224", num_classes=7)
    source.load_state_dict(deit_state)
    convert(source, variant).eval()
    name, layer_type = LINVIT_TWIN[variant]
    assert sum(isinstance(m, layer_type) for m in source.modules()) == 12
    attn = source.blocks[5].attn
    assert torch.equal(attn.qkv.weight, deit_state["blocks.5.attn.qkv.weight"])
    assert torch.equal(attn.proj.bias, deit_state["blocks.5.attn.proj.bias"])
    torch.save({"model": deit_state}, tmp_path / "deit.pth")  # timm's pretrained path fills the discounts
    twin = create_variant(name, img_size=224, num_classes=7, pretrained_file=tmp_path / "deit.pth").eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(source(x), twin(x), rtol=0, atol=1e-5)


def test_report_lists_converted_and_skipped_modules():
    model = timm.create_model("vit_tiny_patch16_224", depth=4, num_classes=0)
    convert(model, "pure_infsa", include=r"blocks\.[0-2]\.", exclude=r"blocks\.1\.", gamma_init=0.8)
    report = convert_report(model)
    assert [c.name for c in report.converted] == ["blocks.0.attn", "blocks.2.attn"]
    assert {s.name: s.reason for s in report.skipped} == {
        "blocks.1.attn": "matched by exclude",
        "blocks.3.attn": "not matched by include",
    }
    assert type(model.blocks[1].attn) is Attention and isinstance(model.blocks[2].attn, PureInfSAAttention)
    torch.testing.assert_close(model.blocks[0].attn.gamma, torch.full((3,), 0.8))
    assert "blocks.0.attn" in str(report) and report.to_dict()["variant"] == "pure_infsa"
    with pytest.raises(ValueError, match="not converted"):
        convert_report(nn.Linear(2, 2))


def test_converted_model_trains_its_discounts_and_projections():
    model = convert(timm.create_model("vit_tiny_patch16_224", depth=2, num_classes=3, img_size=32), "katz_infsa")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.blocks[0].attn.theta.grad is not None and model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_copy_weights_false_reinitialises_the_projections():
    model = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=0, img_size=32)
    before = model.blocks[0].attn.qkv.weight.clone()
    convert(model, "linear_infsa", copy_weights=False)
    assert not torch.allclose(model.blocks[0].attn.qkv.weight, before)


def test_errors_name_the_module_and_leave_the_model_unchanged():
    model = nn.Sequential(
        nn.MultiheadAttention(16, 2, batch_first=True),  # convertible
        nn.MultiheadAttention(16, 2, kdim=8, vdim=8),  # cross-attention: refused
    )
    with pytest.raises(ValueError, match=r"1: cross-attention"):
        convert(model, "linear_infsa")
    assert type(model[0]) is nn.MultiheadAttention  # nothing half-converted
    with pytest.raises(ValueError, match="unknown variant"):
        convert(model, "softmax")
    with pytest.raises(ValueError, match="no attention layer"):
        convert(nn.Linear(3, 3), "linear_infsa")
    with pytest.raises(ValueError, match="gamma_init"):
        convert(model, "linear_infsa", gamma_init=1.0)
    for wrong in ("0.5", True, torch.tensor([0.5, 0.5])):  # one line, not a TypeError deep in a comparison
        with pytest.raises(ValueError, match=r"gamma_init must be a number in \(0, 1\), got"):
            convert(model, "katz_infsa", gamma_init=wrong)
    assert convert(nn.Sequential(Attention(16, 2)), "katz_infsa", gamma_init=None).linvit_conversion.gamma_init == 0.9
    for number in (np.float32(0.25), torch.tensor(0.25)):  # any real number is taken, and recorded as a float
        converted = convert(nn.Sequential(Attention(16, 2)), "katz_infsa", gamma_init=number)
        assert type(converted.linvit_conversion.gamma_init) is float
        torch.testing.assert_close(converted[0].gamma, torch.full((2,), 0.25))
    with pytest.raises(ValueError, match="pattern"):
        convert(model, "linear_infsa", include="blocks[")
    gated = nn.Sequential(Attention(16, 2, gated=True))
    with pytest.raises(ValueError, match="0: gated"):
        convert(gated, "pure_infsa")


# torch.nn.MultiheadAttention -------------------------------------------------------------------------------


def _mha_reference(mha: nn.MultiheadAttention, x: torch.Tensor, gamma: float, mask=None) -> torch.Tensor:
    """Pure InfSA computed by hand from MultiheadAttention's packed weights, x batch-first."""
    B, N, C = x.shape
    H = mha.num_heads
    q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).view(B, N, 3, H, C // H).permute(2, 0, 3, 1, 4)
    out = pure_infsa(q, k, v, gamma, attn_mask=mask).transpose(1, 2).reshape(B, N, C)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_converts_with_its_calling_convention(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    model = convert(nn.ModuleDict({"attn": mha}), "pure_infsa", gamma_init=0.7)
    x = torch.randn(2, 5, 16)
    expected = _mha_reference(mha, x, 0.7)
    inp = x if batch_first else x.transpose(0, 1)
    out, weights = model["attn"](inp, inp, inp)  # need_weights defaults to True: weights are None
    assert weights is None
    torch.testing.assert_close(out if batch_first else out.transpose(0, 1), expected, rtol=1e-5, atol=1e-6)
    single, _ = model["attn"](inp[:, 0] if not batch_first else inp[0], None, None, need_weights=False)
    torch.testing.assert_close(single, expected[0], rtol=1e-5, atol=1e-6)  # unbatched input
    with pytest.raises(ValueError, match="key and value must be the query"):
        model["attn"](inp, torch.randn_like(inp), inp)


def test_torchvision_vit_converts_and_matches_a_hand_computed_block():
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    mha = vit.encoder.layers[0].self_attention
    convert(vit, "pure_infsa").eval()
    assert [c.name for c in convert_report(vit).converted] == [
        "encoder.layers.encoder_layer_0.self_attention",
        "encoder.layers.encoder_layer_1.self_attention",
    ]
    x = torch.randn(2, 17, 16)
    block = vit.encoder.layers[0]
    with torch.no_grad():
        got, _ = block.self_attention(block.ln_1(x), block.ln_1(x), block.ln_1(x), need_weights=False)
        expected = _mha_reference(mha, block.ln_1(x), 0.9)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert vit(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_transformer_encoder_honours_causal_masks_and_skips_its_fused_path():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    encoder = convert(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True), "pure_infsa").eval()
    x = torch.randn(2, 8, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(8)  # float, -inf above the diagonal
    t = 3
    later = x.clone()
    later[:, t + 1 :] = torch.randn(2, 8 - t - 1, 16)
    with torch.no_grad():
        out, out_later = encoder(x, mask=causal, is_causal=True), encoder(later, mask=causal, is_causal=True)
        torch.testing.assert_close(out_later[:, : t + 1], out[:, : t + 1], rtol=0, atol=1e-6)
        padding = torch.zeros(2, 8, dtype=torch.bool)
        padding[:, 6:] = True  # eval + key padding mask: the nested-tensor fast path would run softmax kernels
        padded = encoder(x, src_key_padding_mask=padding)
        assert torch.isfinite(padded).all()
        unpadded = encoder(x[:, :6])
        torch.testing.assert_close(padded[:, :6], unpadded, rtol=1e-4, atol=1e-5)


def test_partly_converted_encoder_skips_the_fused_path_too():
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    encoder = convert(nn.TransformerEncoder(layer, num_layers=2), "pure_infsa", exclude=r"layers\.0\.").eval()
    assert type(encoder.layers[0].self_attn) is nn.MultiheadAttention and not encoder.use_nested_tensor
    padding = torch.zeros(1, 6, dtype=torch.bool)
    padding[:, 4:] = True
    with torch.no_grad():
        assert torch.isfinite(encoder(torch.randn(1, 6, 16), src_key_padding_mask=padding)).all()


@pytest.mark.parametrize("variant", ["linear_infsa", "katz_infsa"])
def test_pooled_variants_refuse_masks_instead_of_ignoring_them(variant):
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    encoder = convert(nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False), variant)
    x = torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match="mask"):
        encoder(x, mask=nn.Transformer.generate_square_subsequent_mask(6), is_causal=True)
    encoder(x, mask=torch.zeros(6, 6))  # a mask that hides nothing is no mask
    with pytest.raises(ValueError, match="additive"):
        encoder(x, mask=torch.full((6, 6), 0.5))


# custom modules through target_types -----------------------------------------------------------------------


class MyAttention(nn.Module):
    """A user's attention with its own names: to_qkv / to_out, heads in .heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.to_qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        return self.to_out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


def my_adapter(m: MyAttention) -> AttentionWeights:
    return AttentionWeights(m.heads, m.to_qkv.weight, m.to_qkv.bias, m.to_out.weight, m.to_out.bias)


def test_custom_attention_converts_through_target_types():
    model = nn.Sequential(MyAttention(16, 4), nn.GELU(), MyAttention(16, 4))
    convert(model, "linear_infsa", target_types={MyAttention: my_adapter})
    assert isinstance(model[0], LinearInfSAAttention) and model(torch.randn(2, 5, 16)).shape == (2, 5, 16)
    plain = nn.Sequential(MyAttention(16, 4))
    with pytest.raises(ValueError, match="no attention layer"):
        convert(plain, "linear_infsa")  # without an adapter it is reported as skipped, never guessed
    bad = nn.Sequential(MyAttention(16, 4))
    with pytest.raises(ValueError, match="0: unknown number of heads"):
        headless = lambda m: dataclasses.replace(my_adapter(m), num_heads=0)  # noqa: E731
        convert(bad, "linear_infsa", target_types={MyAttention: headless})


def test_target_types_as_a_list_restricts_the_conversion():
    model = nn.Sequential(Attention(16, 2), nn.MultiheadAttention(16, 2, batch_first=True))
    convert(model, "pure_infsa", target_types=[nn.MultiheadAttention])
    assert type(model[0]) is Attention and isinstance(model[1].mixer, PureInfSAAttention)
    with pytest.raises(ValueError, match="no adapter"):
        convert(nn.Sequential(MyAttention(16, 2)), "pure_infsa", target_types=[MyAttention])


# Hugging Face transformers ---------------------------------------------------------------------------------

HF_MODELS = {
    "vit": ("ViTConfig", "ViTModel"),
    "deit": ("DeiTConfig", "DeiTModel"),
    "dinov2": ("Dinov2Config", "Dinov2Model"),
}


@pytest.mark.parametrize("kind", sorted(HF_MODELS))
def test_hugging_face_models_convert(kind):
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls = (getattr(transformers, n) for n in HF_MODELS[kind])
    config = config_cls(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
    )
    torch.manual_seed(0)
    model = model_cls(config).eval()
    attn = model.layers[0].attention if hasattr(model, "layers") else model.encoder.layer[0].attention
    q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
    convert(model, "pure_infsa")
    assert len(convert_report(model).converted) == 2
    converted = model.layers[0].attention if hasattr(model, "layers") else model.encoder.layer[0].attention
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        out, weights = converted(x)
        B, N, C = x.shape
        heads = [p(x).view(B, N, 4, 8).transpose(1, 2) for p in (q, k, v)]
        expected = o(pure_infsa(*heads, 0.9).transpose(1, 2).reshape(B, N, C))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        assert weights is None
        assert model(pixel_values=torch.randn(1, 3, 32, 32)).last_hidden_state.shape[-1] == 32
        # an eager-style additive padding mask (0 / dtype minimum) hides the padded tokens completely
        padding = torch.zeros(2, 1, 9, 9)
        padding[..., 6:] = torch.finfo(torch.float32).min
        changed = x.clone()
        changed[:, 6:] = torch.randn(2, 3, 32)
        torch.testing.assert_close(converted(changed, padding)[0][:, :6], converted(x, padding)[0][:, :6])
    linear = convert(model_cls(config), "linear_infsa")
    with pytest.raises(ValueError, match="mask"):
        linear(pixel_values=torch.randn(1, 3, 32, 32), attention_mask=torch.tensor([[1] * 12 + [0] * 5]))


def test_a_converted_timm_model_saves_and_reloads_the_timm_way(tmp_path):
    from timm.models import save_for_hf

    model = timm.create_model("deit_tiny_patch16_224", patch_size=8, img_size=32, depth=2, num_classes=4)
    convert(model, "katz_infsa", gamma_init=0.7, exclude=r"blocks\.1\.")
    model.blocks[0].attn.theta.data.add_(0.3)  # as if trained
    save_for_hf(model, tmp_path, safe_serialization=True)
    again = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    assert isinstance(again.blocks[0].attn, KatzInfSAAttention) and type(again.blocks[1].attn) is Attention
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again(x), model.eval()(x), rtol=0, atol=0)


def test_a_form_without_a_discount_ignores_gamma_init():
    """Plain linear attention (the anchor) has no discount: convert does not range-check a value it never reads,
    and the layers are the same whatever is given."""
    torch.manual_seed(0)
    model = nn.Sequential(Attention(16, 2))
    x = torch.randn(2, 5, 16)
    with pytest.warns(UserWarning, match="gamma_init=0.0 is ignored: linear_attention has no discount"):
        ignored = convert(copy.deepcopy(model), "linear_attention", gamma_init=0.0)
    default = convert(copy.deepcopy(model), "linear_attention")
    torch.testing.assert_close(ignored(x), default(x), rtol=0, atol=0)
    assert ignored.linvit_conversion.gamma_init == 0.9  # recorded as the default it runs with
    assert str(ignored.linvit_conversion).splitlines()[0] == "converted 1 attention layers to linear_attention"
    with pytest.warns(UserWarning, match="is ignored"):  # any value, a tensor too: one warning, not an ambiguous bool
        convert(copy.deepcopy(model), "linear_attention", gamma_init=torch.tensor([0.5, 0.5]))
    assert "(gamma_init 0.9)" in str(convert(copy.deepcopy(model), "katz_infsa").linvit_conversion)


def test_a_form_without_score_map_variants_ignores_linear_variant_and_says_so():
    """linear_variant is Linear-InfSA's option: another form warns, runs as without it and records nothing of it
    (it was taken silently and stored in the model's config)."""
    torch.manual_seed(0)
    model = timm.create_model("vit_4l_patch16_224", patch_size=8, embed_dim=32, depth=1, num_heads=2, img_size=32)
    x = torch.randn(2, 3, 32, 32)
    with pytest.warns(UserWarning, match="linear_variant='floor' is ignored: it is linear_infsa's option, not katz"):
        ignored = convert(copy.deepcopy(model), "katz_infsa", linear_variant="floor")
    default = convert(copy.deepcopy(model), "katz_infsa")
    torch.testing.assert_close(ignored(x), default(x), rtol=0, atol=0)
    assert "linear_variant" not in ignored._model_args
    floor = convert(copy.deepcopy(model), "linear_infsa", linear_variant="floor")
    assert floor._model_args["linear_variant"] == "floor"
    assert floor.linvit_conversion.variant == "linear_infsa:floor"  # the report names the form that runs


def test_a_first_discount_that_is_one_in_float32_is_refused():
    """1 - 1e-9 lies in (0, 1) but its discount sigmoid(logit) rounds to 1 in float32: the series diverges (NaN)."""
    with pytest.raises(ValueError, match="is 1 in float32"):
        convert(nn.Sequential(Attention(16, 2)), "katz_infsa", gamma_init=1 - 1e-9)
    assert (convert(nn.Sequential(Attention(16, 2)), "katz_infsa", gamma_init=0.9999999)[0].gamma < 1).all()
