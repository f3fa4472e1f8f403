"""Learned feature maps (issue 44): Hedgehog's [softmax(x W), softmax(-x W)] per head, in Katz-InfSA layers,
converted timm models and causal language models, against float64 references built from the map's definition."""

from __future__ import annotations

import math

import pytest
import timm
import torch

import linvit
from linvit.conversion import FORMS, convert_report
from linvit.layers import KatzInfSAAttention
from linvit.layers.feature_maps import INIT_SCALE, HedgehogFeatureMap
from linvit.ops.katz_causal import causal_katz_chunked, causal_katz_recurrent
from reference import katz_dense_ref


def _phi(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The map's definition, float64, written out independently of layers.feature_maps."""
    scores = torch.einsum("bhnd,hdf->bhnf", x.double(), weight.double())
    return torch.cat([scores.softmax(-1), (-scores).softmax(-1)], dim=-1)


def _layer(feature_dim=None, seed=0) -> KatzInfSAAttention:
    torch.manual_seed(seed)
    layer = KatzInfSAAttention(32, num_heads=2, qkv_bias=True, feature_map="hedgehog", feature_dim=feature_dim)
    with torch.no_grad():  # away from the identity start, so a map applied to the wrong tensor shows
        layer.feature_q.weight.normal_()
        layer.feature_k.weight.normal_()
    return layer.double()


@pytest.mark.parametrize("tokens, feature_dim", [(5, None), (40, None), (40, 3), (7, 24)])
def test_katz_with_a_learned_map_equals_the_dense_float64_series(tokens, feature_dim):
    """Both of Katz's forms (the N x N system for N <= 2f, the d x d one above) and a feature size other than
    the head dim: sum_t gamma^t A^^t V with A^ = phi(Q) phi(K)^T / ||.||_F, phi from its definition."""
    layer = _layer(feature_dim)
    x = torch.randn(2, tokens, 32, dtype=torch.float64)
    q, k, v = layer.project_qkv(x)
    fq, fk = _phi(q, layer.feature_q.weight), _phi(k, layer.feature_k.weight)
    A = fq @ fk.transpose(-2, -1)
    A = A / (A.norm(dim=(-2, -1), keepdim=True) + layer.eps)
    eye = torch.eye(tokens, dtype=torch.float64)
    mixed = (torch.linalg.inv(eye - layer.gamma.view(1, -1, 1, 1) * A) - eye) @ v
    expected = layer.proj(mixed.transpose(1, 2).reshape(2, tokens, 32))
    assert (layer(x) - expected).abs().max() <= 1e-12


def test_gradients_reach_both_maps_and_every_head():
    layer = _layer().float()
    layer(torch.randn(2, 9, 32)).square().sum().backward()
    for maps in (layer.feature_q, layer.feature_k):
        per_head = maps.weight.grad.abs().flatten(1).sum(-1)
        assert per_head.shape == (2,) and bool((per_head > 0).all())


def test_the_map_starts_as_a_scaled_identity():
    maps = HedgehogFeatureMap(3, 8, 5)
    expected = torch.eye(8, 5).expand(3, 8, 5) * INIT_SCALE / math.sqrt(8)
    assert torch.allclose(maps.weight.detach(), expected, rtol=1e-6, atol=0)
    assert maps(torch.randn(2, 3, 4, 8)).shape == (2, 3, 4, 10)


def test_token_chunked_inference_equals_the_whole_tensor_path():
    """The streamed passes (models/_chunking.py) apply the learned maps as the whole-tensor forward does."""
    torch.manual_seed(0)
    model = timm.create_model(
        "katz_infvit_4l_patch16_224", feature_map="hedgehog", depth=2, embed_dim=64, num_heads=2, num_classes=5
    ).eval()
    for block in model.blocks:
        with torch.no_grad():
            block.attn.feature_q.weight.normal_()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        whole = model(x)
        model.token_chunk = 5
        chunked = model(x)
    assert (whole - chunked).abs().max() <= 1e-5


def test_a_converted_timm_model_rebuilds_with_its_maps_and_feature_size():
    torch.manual_seed(0)
    source = timm.create_model("vit_4l_patch16_224", depth=2, embed_dim=32, num_heads=2, num_classes=5)
    model = linvit.convert(source, "katz_infsa:hedgehog", feature_dim=6).eval()
    assert convert_report(model).variant == "katz_infsa:hedgehog"
    rebuilt = timm.create_model("infsa_converted", **model._model_args).eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: the same maps, the same shapes
    assert rebuilt.blocks[0].attn.feature_q.weight.shape == (2, 16, 6)
    x = torch.randn(2, 3, 224, 224)
    assert torch.equal(model(x), rebuilt(x))


@pytest.mark.parametrize(
    "variant, kwargs, message",
    [
        ("pure_infsa:hedgehog", {}, "pure_infsa takes no ':option'"),
        ("katz_infsa:softmax", {}, "feature_map must be one of"),
        ("katz_infsa", {"feature_dim": 4}, "feature_dim sizes a learned feature map"),
        ("katz_infsa:hedgehog", {"feature_dim": 0}, "feature_dim must be a positive whole number"),
        ("katz_infsa:hedgehog", {"feature_dim": "8"}, "feature_dim must be a positive whole number"),
        ("linear_attention:hedgehog", {"feature_dim": 2.5}, "feature_dim must be a positive whole number"),
    ],
)
def test_bad_forms_are_refused_in_one_line(variant, kwargs, message):
    source = timm.create_model("vit_4l_patch16_224", depth=1, embed_dim=32, num_heads=2)
    with pytest.raises(ValueError, match=message):
        linvit.convert(source, variant, **kwargs)


def test_every_form_is_listed_once_and_converts():
    assert len(set(FORMS)) == len(FORMS) and "katz_infsa:hedgehog" in FORMS
    for form in FORMS:
        source = timm.create_model("vit_4l_patch16_224", depth=1, embed_dim=32, num_heads=2)
        assert convert_report(linvit.convert(source, form)).variant == form


def test_causal_forms_with_learned_features_equal_the_float64_series():
    """The causal ops take a learned map's output as the features ("identity"): chunked and recurrent forms
    against the row-normalised series summed term by term, its features from the map's definition."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 150, 8, dtype=torch.float64) for _ in range(3))
    weight = torch.randn(2, 8, 5, dtype=torch.float64)
    fq, fk = _phi(q, weight), _phi(k, weight)
    scores = torch.tril(fq @ fk.transpose(-2, -1))
    A = 0.8 * scores / (scores.sum(-1, keepdim=True) + 1e-6)
    term, expected = v, torch.zeros_like(v)
    for _ in range(400):
        term = A @ term
        expected = expected + term
    chunked, state = causal_katz_chunked(fq, fk, v, 0.8, feature_map="identity")
    recurrent, _ = causal_katz_recurrent(fq, fk, v, 0.8, feature_map="identity")
    assert (chunked - expected).abs().max() <= 1e-10
    assert (recurrent - expected).abs().max() <= 1e-10
    assert state.S.shape == (2, 2, 10, 8)  # the state holds 2 f features a head, whatever the context


def test_katz_dense_reference_is_unchanged_for_the_fixed_maps():
    """The identity kernel leaves the fixed maps' paths alone: ReLU Katz still equals its dense reference."""
    layer = KatzInfSAAttention(32, num_heads=2).double()
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    q, k, v = layer.project_qkv(x)
    mixed = katz_dense_ref(q, k, v, layer.gamma)
    assert (layer(x) - layer.proj(mixed.transpose(1, 2).reshape(1, 12, 32))).abs().max() <= 1e-12
