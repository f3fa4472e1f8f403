"""linvit.weights' run-folder reading on typed configs, and the one model builder (linvit.create_model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import linvit
from linvit.errors import UsageError
from linvit.evaluate import EvalConfig
from linvit.models import create_any_size, create_variant
from linvit.segment.engine import SegmentEvalConfig
from linvit.weights import load_weights, use_run_folder

FIXTURES = Path(__file__).parent / "fixtures"
CLASSIFY, SEGMENT = FIXTURES / "run_v0_classify", FIXTURES / "run_v0_segment"


def test_a_run_folder_completes_an_eval_config_without_changing_it():
    given = EvalConfig(data="d", checkpoint=str(CLASSIFY))
    config, folder = use_run_folder(given)
    assert folder == CLASSIFY and given.model is None and given.checkpoint == str(CLASSIFY)
    assert config.checkpoint == str(CLASSIFY / "model.safetensors") and config.data == "d"
    assert config.model == "linear_infvit_tiny_patch16_224" and config.model_kwargs["embed_dim"] == 32
    assert (config.img_size, config.crop_pct) == (32, 1.0)  # the run's input settings, as it trained
    named, _ = use_run_folder(EvalConfig(model="deit_tiny_patch16_224", checkpoint=str(CLASSIFY), img_size=48))
    assert named.model == "deit_tiny_patch16_224" and named.model_kwargs == {} and named.img_size == 48


def test_a_run_folder_completes_another_commands_config_with_its_own_fields():
    config, _ = use_run_folder(SegmentEvalConfig(checkpoint=str(SEGMENT)))
    assert (config.pyramid_channels, config.head_channels) == (4, 4) and config.model_kwargs["embed_dim"] == 16
    assert not hasattr(config, "crop_pct")  # a field the command's config lacks is not added


def test_run_folder_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="--model is required without --checkpoint"):
        use_run_folder(EvalConfig())
    with pytest.raises(UsageError, match="no model.safetensors in this folder"):
        use_run_folder(EvalConfig(checkpoint=str(tmp_path)))
    loose = tmp_path / "w.safetensors"
    loose.write_bytes((CLASSIFY / "model.safetensors").read_bytes())
    with pytest.raises(UsageError, match="--model is required: .* not in a linvit run folder"):
        use_run_folder(EvalConfig(checkpoint=str(loose)))
    config, folder = use_run_folder(EvalConfig(model="linear_infvit_tiny_patch16_224", checkpoint=str(loose)))
    assert folder is None and config.checkpoint == str(loose)


def test_the_builder_makes_a_run_model_that_its_weights_fit():
    kwargs = dict(patch_size=8, depth=1, embed_dim=32, num_heads=2, num_classes=10)
    model = linvit.create_model("linear_infvit_tiny_patch16_224:unfolded", img_size=32, **kwargs)
    assert load_weights(model, CLASSIFY / "model.safetensors") == "ema"  # its config.json says which
    assert not model.blocks[0].attn.fold_kv and model.pos_embed.shape[1] == 1 + 16
    with torch.no_grad():
        reference = linvit.load_run(CLASSIFY)(torch.zeros(1, 3, 32, 32))
        torch.testing.assert_close(model.eval()(torch.zeros(1, 3, 32, 32)), reference)


def test_the_builder_drops_only_the_size_arguments_a_model_does_not_take():
    any_size = create_any_size("weightformer_tiny_patch16_224", img_size=64, depth=1, num_classes=3)
    assert any_size(torch.zeros(1, 3, 48, 80)).shape == (1, 3)  # no position table: any size as it is
    resampled = create_any_size("deit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    assert resampled.dynamic_img_size and resampled(torch.zeros(1, 3, 48, 64)).shape == (1, 3)
    assert create_variant is linvit.create_model
    with pytest.raises(TypeError, match="cannot build deit_tiny_patch16_224"):
        linvit.create_model("deit_tiny_patch16_224", no_such_argument=1)
