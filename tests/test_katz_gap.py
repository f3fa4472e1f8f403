"""scripts/katz_gap.py: the dense weight matrices it compares must be the layers' own, and its measures mean
what its table says (row sums, hops, distances)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import timm
import torch

import linvit

SCRIPT = Path(__file__).parents[1] / "scripts/katz_gap.py"
TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10)


@pytest.fixture(scope="module")
def katz_gap():
    spec = importlib.util.spec_from_file_location("katz_gap", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def teacher_and_input():
    torch.manual_seed(0)
    teacher = timm.create_model("vit_4l_patch16_224", **TINY).double().eval()
    return teacher, torch.randn(2, 17, 48, dtype=torch.float64)


@pytest.mark.parametrize("mixer", ["katz_infsa", "katz_infsa:hedgehog", "linear_attention:hedgehog"])
def test_dense_weights_reproduce_each_converted_layer(katz_gap, mixer):
    teacher, x = teacher_and_input()
    student = linvit.convert(copy.deepcopy(teacher), mixer, gamma_init=0.5).double()
    layer = student.blocks[0].attn
    with torch.no_grad():
        M = katz_gap.dense_weights(layer, x)
        torch.testing.assert_close(katz_gap.mixed_output(layer, x, M), layer(x), rtol=1e-10, atol=1e-12)
        measures = katz_gap.layer_measures(teacher.blocks[0].attn, layer, x, teacher.blocks[0].attn(x))
    if mixer.startswith("linear_attention"):  # row-normalised, one hop: no spread, nothing beyond the first hop
        assert measures["row_sum_cv"] < 1e-6 and measures["multi_hop_share"] == pytest.approx(0, abs=1e-12)
        assert measures["gamma"] is None
    else:
        assert measures["row_sum_cv"] > 1e-3 and 0.05 < measures["multi_hop_share"] < 1
        assert measures["gamma"] == pytest.approx(0.5)
    assert 0 < measures["tv_distance"] <= 1


def test_the_teacher_against_itself_is_at_distance_zero(katz_gap):
    teacher, x = teacher_and_input()
    layer = teacher.blocks[0].attn
    with torch.no_grad():
        P = katz_gap.dense_weights(layer, x)
        torch.testing.assert_close(katz_gap.mixed_output(layer, x, P), layer(x), rtol=1e-10, atol=1e-12)
    assert torch.allclose(P.sum(-1), torch.ones_like(P[..., 0]))
    assert katz_gap.tv_distance(P, P) == pytest.approx(0, abs=1e-12)


def test_katz_weight_beyond_the_first_hop_vanishes_with_its_discount(katz_gap):
    teacher, x = teacher_and_input()
    shares = []
    for gamma in (0.9, 0.5, 0.01):
        layer = linvit.convert(copy.deepcopy(teacher), "katz_infsa", gamma_init=gamma).double().blocks[0].attn
        with torch.no_grad():
            M, first = katz_gap.dense_weights(layer, x), katz_gap.dense_weights(layer, x, hops=1)
        shares.append(float(1 - first.sum() / M.sum()))
    assert shares[0] > shares[1] > shares[2] and shares[2] < 0.02
