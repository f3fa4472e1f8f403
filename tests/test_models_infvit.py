"""The InfViT family through timm: registry, forward/backward at any size, features, weights, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import linvit
from conftest import assert_checkpointing_keeps_gradients
from linvit.layers import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention

INFVIT_MODELS = [
    "vit_4l_patch16_224",
    "infvit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "infvit_24l_patch16_224",
    "infvit_tiny_patch16_224",
    "infvit_small_patch16_224",
    "linear_infvit_tiny_patch16_224",
    "linear_infvit_small_patch16_224",
    "katz_infvit_4l_patch16_224",
    "katz_infvit_tiny_patch16_224",
    "katz_infvit_small_patch16_224",
]
README = Path(__file__).resolve().parents[1] / "README.md"


def readme_param_counts() -> dict[str, int]:
    """Model name -> parameter count from the README's model table (| `name` | ... | 5,717,452 | ...)."""
    rows = re.findall(r"^\|\s*`([a-z0-9_]+)`\s*\|[^\n]*?\|\s*(\d{1,3}(?:,\d{3})+)\s*\|", README.read_text(), flags=re.M)
    return {name: int(count.replace(",", "")) for name, count in rows}


def test_registry_lists_every_model():
    assert set(INFVIT_MODELS) <= set(linvit.list_models())
    assert set(INFVIT_MODELS) <= set(timm.list_models("*infvit*") + timm.list_models("vit_4l*"))
    assert set(INFVIT_MODELS) | {"weightformer_tiny_patch16_224"} == set(linvit.list_models()) - {
        "weightformer_small_patch16_224",
        "weightformer_base_patch16_448",
    }


@pytest.mark.parametrize("name", INFVIT_MODELS)
def test_builds_runs_forward_backward_at_224_and_non_square(name):
    model = timm.create_model(name, num_classes=7)
    counts = readme_param_counts()
    assert counts.get(name) == sum(p.numel() for p in timm.create_model(name).parameters()), (
        f"README model table must state {name}'s parameter count"
    )
    for size in ((224, 224), (96, 160)):
        x = torch.randn(1, 3, *size)
        out = model(x)
        assert out.shape == (1, 7) and torch.isfinite(out).all()
        out.sum().backward()
        assert model.patch_embed.proj.weight.grad is not None
        model.zero_grad()


def test_mixer_types_and_attention_config():
    assert isinstance(timm.create_model("infvit_tiny_patch16_224").blocks[0].attn, PureInfSAAttention)
    lin = timm.create_model("linear_infvit_tiny_patch16_224", fold_kv=False, gamma_init=0.5)
    assert isinstance(lin.blocks[3].attn, LinearInfSAAttention) and not lin.blocks[3].attn.fold_kv
    torch.testing.assert_close(lin.blocks[3].attn.gamma, torch.full((3,), 0.5))
    katz = timm.create_model("katz_infvit_tiny_patch16_224", feature_map="elu+1")
    assert isinstance(katz.blocks[0].attn, KatzInfSAAttention) and katz.blocks[0].attn.feature_map == "elu+1"
    pure = timm.create_model("infvit_tiny_patch16_224", attn_impl="chunked")
    assert pure.blocks[0].attn.impl == "chunked"
    with pytest.raises(ValueError, match="mixer"):
        linvit.models.InfViT(mixer="bogus")


def test_folded_model_equals_unfolded_model():
    a = timm.create_model("linear_infvit_tiny_patch16_224").eval()
    b = timm.create_model("linear_infvit_tiny_patch16_224", fold_kv=False).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 128, 96)
    torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-5)


def test_features_only_and_forward_intermediates():
    feats = timm.create_model("linear_infvit_tiny_patch16_224", features_only=True, out_indices=(3, 7, 11))
    outs = feats(torch.randn(2, 3, 96, 128))
    assert [o.shape for o in outs] == [(2, 192, 6, 8)] * 3
    model = timm.create_model("infvit_tiny_patch16_224")
    final, inter = model.forward_intermediates(torch.randn(1, 3, 64, 64), indices=2)
    assert final.shape == (1, 1 + 16, 192) and [t.shape for t in inter] == [(1, 192, 4, 4)] * 2


def test_grad_checkpointing_gives_same_gradients():
    model = timm.create_model("infvit_tiny_patch16_224", num_classes=3)
    assert_checkpointing_keeps_gradients(model, torch.randn(2, 3, 64, 64))


def test_no_weight_decay_lists_discounts_and_classifier_reset():
    model = timm.create_model("linear_infvit_tiny_patch16_224")
    nwd = model.no_weight_decay()
    assert {"pos_embed", "cls_token", "blocks.0.attn.theta", "blocks.11.attn.theta"} <= nwd
    model.reset_classifier(5)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_pretrained_from_local_file(tmp_path, suffix):
    src = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=10).eval()
    path = tmp_path / f"weights{suffix}"
    state = {k: v.contiguous() for k, v in src.state_dict().items()}
    save_file(state, path) if suffix == ".safetensors" else torch.save(state, path)
    dst = timm.create_model(
        "linear_infvit_tiny_patch16_224",
        pretrained=True,
        num_classes=10,
        pretrained_cfg_overlay=dict(file=str(path), num_classes=10),  # timm drops the head if these differ
    ).eval()
    x = torch.randn(1, 3, 64, 80)
    torch.testing.assert_close(dst(x), src(x))


@pytest.mark.parametrize(
    "x,msg",
    [
        (torch.randn(1, 1, 64, 64), "channels"),
        (torch.randn(3, 64, 64), "4-D"),
        (torch.randn(1, 3, 64, 70), "divisible"),
    ],
)
def test_bad_input_raises_value_error(x, msg):
    with pytest.raises(ValueError, match=msg):
        timm.create_model("linear_infvit_tiny_patch16_224")(x)


def test_fixed_size_model_names_the_fix_and_nan_check_is_opt_in():
    with pytest.raises(ValueError, match="dynamic_img_size"):
        timm.create_model("vit_4l_patch16_224", dynamic_img_size=False)(torch.randn(1, 3, 240, 224))
    x = torch.randn(1, 3, 32, 32)
    x[0, 0, 0, 0] = float("nan")
    assert torch.isnan(timm.create_model("infvit_tiny_patch16_224")(x)).any()
    with pytest.raises(ValueError, match="NaN"):
        timm.create_model("infvit_tiny_patch16_224", check_finite=True)(x)
    padded = timm.create_model("infvit_tiny_patch16_224", dynamic_img_pad=True)
    assert padded(torch.randn(1, 3, 40, 50)).shape == (1, 1000)


@pytest.mark.parametrize(
    "name",
    ["linear_infvit_tiny_patch16_224", "infvit_tiny_patch16_224", "katz_infvit_tiny_patch16_224", "vit_4l_patch16_224"],
)
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_token_chunked_inference_equals_full(name, chunk):
    kwargs = dict(depth=2) if name.startswith("vit_4l") else {}
    model = timm.create_model(name, num_classes=5, **kwargs).eval()
    for size in ((80, 48), (256, 352)):  # position embeddings resampled down and up
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            model.set_token_chunk(None)
            full = model(x)
            model.set_token_chunk(chunk)
            chunked = model(x)
            feats = model.forward_features(x)
        torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
        assert feats.shape == (2, 1 + (size[0] // 16) * (size[1] // 16), model.embed_dim)


def test_token_chunk_is_inference_only():
    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=3, token_chunk=4)
    x = torch.randn(1, 3, 64, 64)
    model(x).sum().backward()  # autograd on: the ordinary path, gradients flow
    assert model.blocks[0].attn.theta.grad is not None


def test_auto_token_chunking_switches_on_for_large_inputs(monkeypatch):
    from linvit.models import _chunking

    model = timm.create_model("katz_infvit_tiny_patch16_224", num_classes=5, depth=2).eval()
    x = torch.randn(1, 3, 96, 128)  # 48 tokens
    assert model.token_chunk == "auto"
    with torch.no_grad():
        assert model.token_chunk_for(x) is None
        whole = model(x)
        monkeypatch.setattr(_chunking, "AUTO_CHUNK_MIN_TOKENS", 48)
        monkeypatch.setattr(_chunking, "AUTO_TOKEN_CHUNK", 10)
        assert model.token_chunk_for(x) == 10
        torch.testing.assert_close(model(x), whole, rtol=1e-5, atol=1e-5)
    assert model.token_chunk_for(x) is None  # autograd on: never chunked


def test_resampled_position_table_follows_the_grid_and_the_weights():
    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=5, depth=1).eval()
    for size in ((64, 96), (128, 64), (64, 96)):
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            inference = model(x)
        torch.testing.assert_close(inference, model(x).detach(), rtol=1e-5, atol=1e-6)  # grad on: timm's own path
    with torch.no_grad():
        model.pos_embed.add_(1.0)  # in place, as load_state_dict and optimisers do
        after = model(x)
    torch.testing.assert_close(after, model(x).detach(), rtol=1e-5, atol=1e-6)


def test_folded_weights_follow_parameter_updates():
    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=5, depth=1).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["blocks.0.attn.qkv.weight"] += 0.1
        state["blocks.0.attn.theta"] -= 1.0
        model.load_state_dict(state)
        after = model(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, model(x).detach(), rtol=1e-5, atol=1e-6)  # grad on: the same derivation


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("infvit_tiny_patch16_224", dict(attn_impl="dnese"), "attn_impl"),
        ("katz_infvit_tiny_patch16_224", dict(feature_map="gelu"), "feature_map"),
        ("linear_infvit_tiny_patch16_224", dict(fold_kv="yes"), "fold_kv"),
        ("linear_infvit_tiny_patch16_224", dict(token_chunk="big"), "token_chunk"),
        ("weightformer_tiny_patch16_224", dict(linear_predictor="mlp"), "linear_predictor"),
        ("weightformer_tiny_patch16_224", dict(token_chunk=-5), "token_chunk"),
    ],
)
def test_bad_options_fail_at_construction(name, kwargs, match):
    """Typos in options built fine and failed at the first forward (or never, for unused ones)."""
    with pytest.raises(ValueError, match=match):
        timm.create_model(name, depth=1, **kwargs)


def test_bad_layer_options_fail_at_construction():
    from linvit.layers import KatzInfSAAttention, PureInfSAAttention

    with pytest.raises(ValueError, match="impl"):
        PureInfSAAttention(8, 2, impl="fast")
    with pytest.raises(ValueError, match="block_size"):
        PureInfSAAttention(8, 2, block_size=0)
    with pytest.raises(ValueError, match="feature_map"):
        KatzInfSAAttention(8, 2, feature_map="softplus")
    model = timm.create_model("linear_infvit_tiny_patch16_224", depth=1)
    with pytest.raises(ValueError, match="token_chunk"):
        model.set_token_chunk("everything")
