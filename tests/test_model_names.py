"""Every model-name form timm accepts works in linvit, with linvit's ':variant' suffix (issue 22, item 6)."""

from __future__ import annotations

import pytest
import timm
import torch

import linvit
from linvit.models import create_any_size, create_variant, split_name


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("vit_4l_patch16_224", ("vit_4l_patch16_224", None)),
        ("vit_4l_patch16_224:naive", ("vit_4l_patch16_224", "naive")),
        ("vit_tiny_patch16_224.augreg_in21k", ("vit_tiny_patch16_224.augreg_in21k", None)),
        ("vit_tiny_patch16_224.augreg_in21k:fused", ("vit_tiny_patch16_224.augreg_in21k", "fused")),
        ("hf-hub:org/repo", ("hf-hub:org/repo", None)),
        ("hf-hub:org/repo:naive", ("hf-hub:org/repo", "naive")),
        ("local-dir:naive", ("local-dir:naive", None)),  # the folder 'naive', not a variant
        ("local-dir:runs/a:chunked", ("local-dir:runs/a", "chunked")),
    ],
)
def test_split_name_reads_every_timm_form(spec, expected):
    assert split_name(spec) == expected


def test_linvit_create_model_takes_variants():
    model = linvit.create_model("vit_4l_patch16_224:naive", depth=1, num_classes=3)
    assert model.blocks[0].attn.fused_attn is False
    assert linvit.create_model("vit_4l_patch16_224:fused", depth=1).blocks[0].attn.fused_attn is True


def test_pretrained_tags_build_with_their_config():
    model = create_variant("vit_tiny_patch16_224.augreg_in21k", img_size=48, num_classes=3)
    assert model.pretrained_cfg["tag"] == "augreg_in21k" and model(torch.randn(1, 3, 48, 48)).shape == (1, 3)


def test_local_dir_models_build_with_variants(tmp_path):
    source = timm.create_model("linear_infvit_tiny_patch16_224", depth=1, num_classes=3, img_size=32, patch_size=8)
    timm.models.save_for_hf(source, str(tmp_path), model_args=dict(depth=1, num_classes=3, img_size=32, patch_size=8))
    model = create_any_size(f"local-dir:{tmp_path}:unfolded", pretrained=True)
    assert model.blocks[0].attn.fold_kv is False
    x = torch.randn(1, 3, 40, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source.eval()(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("vit_4l_patch16_224:navie", "unknown variant 'navie'"),
        ("no_such_model", r"unknown model 'no_such_model' \(see `linvit models` or timm.list_models\(\)\)$"),
        ("infvit_tiny", "did you mean infvit_tiny_patch16_224[?]$"),  # the name without its suffix
        ("linear_infvit_tiny_patch16_244", "did you mean linear_infvit_tiny_patch16_224"),  # a typo
        ("org/repo", "hf-hub:org/repo"),
        ("local-dir:/does/not/exist", "not found"),
    ],
)
def test_bad_names_fail_in_one_line(spec, match):
    with pytest.raises(ValueError, match=match):
        create_variant(spec)


def test_only_a_missing_img_size_argument_is_retried(monkeypatch):
    """A TypeError inside a model's constructor is the caller's error, not a cue to drop img_size and build the
    model again at its default size (which the old blanket retry did)."""
    import linvit.models.variants as variants

    calls = []

    def create(name, **kwargs):
        calls.append(kwargs)
        raise TypeError("a bug inside the model's constructor")

    monkeypatch.setattr(variants.timm, "create_model", create)
    with pytest.raises(TypeError, match="a bug inside"):
        create_variant("vit_4l_patch16_224", img_size=32)
    assert calls == [{"img_size": 32}]  # not retried without img_size
    calls.clear()
    monkeypatch.setattr(variants.timm, "create_model", lambda name, **kw: calls.append(kw) or _raise_for(kw))
    create_variant("vit_4l_patch16_224", img_size=32)
    assert calls == [{"img_size": 32}, {}]  # a model that takes no img_size is built without it


def _raise_for(kwargs: dict) -> torch.nn.Module:
    if "img_size" in kwargs:
        raise TypeError("Net.__init__() got an unexpected keyword argument 'img_size'")
    return torch.nn.Identity()
