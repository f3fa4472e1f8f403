"""Diffusion transformers: WeightFormer-DiT against the release's layout and outputs, every mixer's contract."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from linvit.models.dit import MIXERS, DiT, create_dit, sincos_positions
from reference_wfm_dit import RefWFMDiT, ref_pos_embed

TINY = dict(input_size=16, patch_size=2, in_channels=4, hidden_size=64, depth=3, num_heads=4, num_classes=10)


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Small random values everywhere (adaLN-Zero starts at exactly zero, which would hide every block)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def _inputs(batch: int = 3, size: tuple[int, int] = (16, 16), seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, *size, generator=gen)
    return x, torch.tensor([1.0, 500.0, 999.0][:batch]), torch.tensor([0, 3, 9][:batch])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


def test_weightformer_dit_has_the_release_layout_and_outputs():
    reference = _randomise(RefWFMDiT(input_size=16, hidden_size=64, depth=3)).eval()
    model = DiT(**TINY, mixer="weightformer").eval()
    state = reference.state_dict()
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: tuple(v.shape) for k, v in state.items()}
    model.load_state_dict(state, strict=True)
    x, t, y = _inputs()
    with torch.no_grad():
        assert _rel(model(x, t, y), reference(x, t, y)) <= 1e-5
    assert [b.dynamic for b in model.blocks] == [False, True, False]  # (layer + 2) % 3 == 0, as released


RELEASE = os.environ.get("LINVIT_WFM_DIT_RELEASE")  # path to the release's model/wfm_dit.py, when at hand


@pytest.mark.skipif(not RELEASE, reason="set LINVIT_WFM_DIT_RELEASE to the release's model/wfm_dit.py")
def test_weightformer_dit_equals_the_release_code():
    spec = importlib.util.spec_from_file_location("wfm_dit_release", RELEASE)
    release = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(release)
    official = _randomise(
        release.DiT(input_size=16, patch_size=2, in_channels=4, hidden_size=64, depth=3, num_classes=10)
    )
    model = DiT(**TINY, mixer="weightformer").eval()
    model.load_state_dict(official.eval().state_dict(), strict=True)
    x, t, y = _inputs()
    with torch.no_grad():
        assert _rel(model(x, t, y), official(x, t, y)) <= 1e-5


def test_positions_are_the_release_table_and_extend_to_any_grid():
    assert np.allclose(sincos_positions(64, 8, 8), ref_pos_embed(64, 8))
    model = DiT(**TINY)
    assert torch.equal(model.pos_embed[0], torch.tensor(sincos_positions(64, 8, 8)).float())
    wide = sincos_positions(64, 8, 12).reshape(8, 12, 64)  # a rectangular grid: [column code, row code]
    assert np.array_equal(wide[3, 5, :32], sincos_positions(64, 1, 12)[5, :32])
    assert np.array_equal(wide[3, 5, 32:], sincos_positions(64, 12, 1)[3, 32:])
    assert not np.array_equal(wide[3, 5], wide[5, 3])


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_mixer_starts_at_zero_and_runs_at_any_grid(mixer):
    model = DiT(**TINY, mixer=mixer).eval()
    x, t, y = _inputs()
    with torch.no_grad():
        assert torch.equal(model(x, t, y), torch.zeros(3, 8, 16, 16))  # adaLN-Zero: the output layer starts at 0
    _randomise(model)
    with torch.no_grad():
        out = model(x, t, y)
        assert out.shape == (3, 8, 16, 16) and out.abs().max() > 0
        wide = model(*_inputs(size=(16, 24))[:1], t, y)
        assert wide.shape == (3, 8, 16, 24) and torch.isfinite(wide).all()
        alone = model(x[1:2], t[1:2], y[1:2])
        assert _rel(alone, out[1:2]) <= 1e-5  # samples do not see each other
    with pytest.raises(ValueError, match="not a multiple of the patch size 2"):
        model(torch.zeros(1, 4, 15, 16), t[:1], y[:1])


@pytest.mark.parametrize("mixer", ["pure_infsa", "linear_infsa", "katz_infsa"])
def test_infsa_discounts_learn(mixer):
    model = _randomise(DiT(**TINY, mixer=mixer)).train()
    x, t, y = _inputs()
    model(x, t, y).square().mean().backward()
    thetas = [b.attn.theta.grad for b in model.blocks]
    assert all(g is not None and g.abs().sum() > 0 for g in thetas)


def test_guidance_scale_one_is_the_conditional_prediction():
    model = _randomise(DiT(**TINY, mixer="linear_infsa")).eval()
    x, t, y = _inputs(batch=2)
    labels = torch.tensor([3, 10])  # the second half carries the "no class" label
    with torch.no_grad():
        guided = model.forward_with_cfg(torch.cat([x[:1], x[:1]]), t[:2], labels, cfg_scale=1.0)
        conditional = model(x[:1], t[:1], labels[:1])
    assert _rel(guided[:1, :4], conditional[:, :4]) <= 1e-5 and torch.equal(guided[:1, :4], guided[1:, :4])


def test_sizes_follow_dit_and_the_release():
    assert sum(p.numel() for p in create_dit("S", "softmax", input_size=32).parameters()) == pytest.approx(
        33e6, rel=0.03
    )
    wf = create_dit("S", "weightformer", input_size=32)
    assert len(wf.blocks) == 15 and wf.blocks[0].norm1.normalized_shape == (384,)
    with pytest.raises(ValueError, match="unknown DiT size"):
        create_dit("M")
    with pytest.raises(ValueError, match="unknown mixer"):
        DiT(**TINY, mixer="cosine")


def test_weight_prediction_sums_tokens_in_float32_under_autocast():
    model = _randomise(DiT(**TINY, mixer="weightformer")).eval()
    block = model.blocks[1]
    x = torch.randn(2, 64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        delta = block.linear1.delta(x, (8, 8))
    assert delta.dtype == torch.float32
    assert _rel(delta, block.linear1.delta(x, (8, 8))) <= 1e-2
