"""WeightFormer's published weights through timm's Hub path, tested offline against a Hub cache built here.

The cache holds what the release's PyTorchModelHubMixin uploads (model.safetensors with the release's own
parameter names, and config.json), filled from the reference implementation with random weights, under
HF_HUB_OFFLINE=1: `timm.create_model(..., pretrained=True)` must give the reference model's logits.
"""

from __future__ import annotations

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

from linvit.models import PUBLISHED
from reference_weightformer import RefWeightFormer

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A Hub cache holding RuizeHe/weightformer-t as the release publishes it; returns the reference model."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    torch.manual_seed(0)
    reference = RefWeightFormer().eval()
    repo = tmp_path / "hub" / ("models--" + PUBLISHED["weightformer_tiny_patch16_224"].replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, snapshot / "model.safetensors")
    (snapshot / "config.json").write_text(json.dumps({"embed_dim": 192, "depth": 17, "num_classes": 1000}))
    for name, value in (("HF_HUB_CACHE", str(tmp_path / "hub")), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return reference


def test_pretrained_weightformer_loads_from_the_hub_cache_with_the_release_logits(offline_hub):
    model = timm.create_model("weightformer_tiny_patch16_224", pretrained=True).eval()
    published = offline_hub.state_dict()
    assert all(torch.equal(v, published[k]) for k, v in model.state_dict().items())  # every tensor, bit for bit
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = offline_hub(x)
        assert (model(x) - expected).abs().max() <= 1e-5 * expected.abs().max()  # the release's own logits
    # another head: the backbone still comes from the Hub, the classifier is fresh
    ten = timm.create_model("weightformer_tiny_patch16_224", pretrained=True, num_classes=10)
    assert ten.head.out_features == 10
    assert torch.equal(ten.patch_embed.proj.weight, offline_hub.state_dict()["patch_embed.proj.weight"])


def test_the_release_preprocessing_is_what_timm_resolves():
    model = timm.create_model("weightformer_small_patch16_224", pretrained=False)
    config = timm.data.resolve_model_data_config(model)
    assert config["mean"] == timm.data.IMAGENET_DEFAULT_MEAN and config["std"] == timm.data.IMAGENET_DEFAULT_STD
    assert (config["crop_pct"], config["crop_mode"], config["interpolation"]) == (0.875, "squash", "bicubic")
    transform = timm.data.create_transform(**config)
    assert "Resize(size=(256, 256)" in str(transform)  # the release resizes to a 256 square, then crops 224
    assert model.pretrained_cfg["hf_hub_id"] == "RuizeHe/weightformer-s"


@pytest.mark.parametrize("name", ["linear_infvit_tiny_patch16_224", "vit_4l_patch16_224"])
def test_pretrained_without_published_weights_is_a_one_line_error(name):
    with pytest.raises(ValueError, match="has no published weights; published: weightformer_tiny_patch16_224"):
        timm.create_model(name, pretrained=True)


def test_pretrained_flag_on_the_command_line(offline_hub, tmp_path):
    import numpy as np
    from PIL import Image

    from linvit.cli import main as cli_main

    picture = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (240, 300, 3), dtype=np.uint8)).save(picture)
    out = tmp_path / "preds.jsonl"
    argv = ["predict", str(picture), "--model", "weightformer_tiny_patch16_224", "--pretrained", "--out", str(out)]
    assert cli_main(argv) == 0
    top1 = json.loads(out.read_text().splitlines()[0])["topk"][0]
    model = timm.create_model("weightformer_tiny_patch16_224", pretrained=True).eval()
    config = timm.data.resolve_model_data_config(model)
    x = timm.data.create_transform(**config)(Image.open(picture).convert("RGB"))[None]
    with torch.no_grad():
        assert top1["class"] == int(model(x).argmax())
    assert cli_main(["predict", str(picture), "--model", "linear_infvit_tiny_patch16_224", "--pretrained"]) == 2
