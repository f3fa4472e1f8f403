"""katz_rows: Katz-InfSA with per-query normalised rows (ops.katz.katz_infsa_rows, layers.katz_rows)."""

from __future__ import annotations

import copy

import pytest
import timm
import torch

import linvit
from linvit.layers import KatzInfSAAttention, KatzRowsAttention
from linvit.ops import katz_infsa, katz_infsa_rows
from linvit.ops.katz import katz_kernel, katz_operator

GAMMA = torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64)


def qkv(n: int, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("kernel", ["relu", "elu+1"])
@pytest.mark.parametrize("n", [5, 40])  # the N x N form (N <= d) and the d x d one
def test_equals_the_dense_series_with_each_row_divided_by_its_sum(kernel, n):
    q, k, v = qkv(n)
    M = katz_kernel(katz_operator(q, k, 1e-6, kernel), GAMMA)
    reference = (M @ v) / (M.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(katz_infsa_rows(q, k, v, GAMMA, 1e-6, kernel), reference, rtol=1e-10, atol=1e-12)


def test_every_querys_weights_sum_to_one_where_katz_infsas_do_not():
    """Constant values come back unchanged, and adding c to every value adds c to every output (softmax's
    property); plain Katz-InfSA scales them by each query's own row sum."""
    q, k, v = qkv(40, seed=1)
    ones = torch.ones_like(v)
    assert (katz_infsa_rows(q, k, ones, GAMMA, 1e-12, "elu+1") - 1).abs().max() < 1e-10
    shifted = katz_infsa_rows(q, k, v + 3.0, GAMMA, 1e-12, "elu+1") - katz_infsa_rows(q, k, v, GAMMA, 1e-12, "elu+1")
    torch.testing.assert_close(shifted, torch.full_like(v, 3.0), rtol=0, atol=1e-10)
    assert katz_infsa(q, k, ones, GAMMA, 1e-12, "elu+1").std() > 0.01  # the spread this form removes


def test_tokens_permute_with_their_outputs_and_images_do_not_mix():
    q, k, v = qkv(24, seed=2)
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    out = katz_infsa_rows(q, k, v, GAMMA, 1e-6, "relu")
    permuted = katz_infsa_rows(q[:, :, perm], k[:, :, perm], v[:, :, perm], GAMMA, 1e-6, "relu")
    torch.testing.assert_close(permuted, out[:, :, perm], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(katz_infsa_rows(q[:1], k[:1], v[:1], GAMMA, 1e-6, "relu"), out[:1])


@pytest.mark.parametrize("half_products", [False, True])
def test_a_query_with_no_weight_gets_zero_not_nan_in_float16(half_products, monkeypatch):
    """half_products: token products in float16 as on CUDA (CPU upcasts them otherwise), where the mixing is
    clamped to float16's range (ops.katz.mixing_as)."""
    if half_products:
        import linvit.ops.common as common

        monkeypatch.setattr(common, "FLOAT32_SUM_DEVICES", ("cpu",))
    q, k, v = (t.half() for t in qkv(12, seed=3))
    q[:, 0] = -1.0  # head 0: ReLU features all zero, every row sums to 0
    out = katz_infsa_rows(q, k, v, GAMMA.float(), 1e-6, "relu")
    assert out.dtype == torch.float16 and torch.isfinite(out).all() and (out[:, 0] == 0).all()


@pytest.mark.parametrize("feature_map", ["relu", "hedgehog"])
def test_the_layer_is_katz_infsas_parameters_with_normalised_rows_and_streams_the_same(feature_map):
    torch.manual_seed(0)
    katz = KatzInfSAAttention(24, 3, feature_map=feature_map, qkv_bias=True).double()
    rows = KatzRowsAttention(24, 3, feature_map=feature_map, qkv_bias=True).double()
    rows.load_state_dict(katz.state_dict())  # the same parameters: a Katz student converts either way
    x = torch.randn(2, 17, 24, dtype=torch.float64)
    q, k, v = rows.featured_qkv(x)
    expected = rows.merge_heads(katz_infsa_rows(q, k, v, rows.gamma, rows.eps, rows.kernel))
    torch.testing.assert_close(rows(x), expected, rtol=1e-12, atol=1e-12)
    assert (rows(x) - katz(x)).abs().max() > 1e-3  # not Katz-InfSA's output
    with torch.no_grad():  # token-streamed inference (two passes over spans) equals the whole forward
        streamed = rows.residual_streamed(x.clone(), [(0, 5), (5, 12), (12, 17)], lambda t: t, lambda t: t)
    torch.testing.assert_close(streamed, x + rows(x), rtol=1e-12, atol=1e-12)


def test_every_public_path_takes_it():
    """timm's mixer=, linvit.convert with its feature map (keeping the teacher's projections), and a causal
    language model refused in one line that says why."""
    model = timm.create_model("infvit_tiny_patch16_224", mixer="katz_rows", img_size=32, depth=1, embed_dim=24)
    assert isinstance(model.blocks[0].attn, KatzRowsAttention)
    spelled = timm.create_model("infvit_tiny_patch16_224", mixer="katz_rows:hedgehog", img_size=32, depth=1)
    assert spelled.blocks[0].attn.feature_map == "hedgehog"  # convert's spelling works in mixer= too
    with pytest.raises(ValueError, match="contradicts feature_map='relu'"):  # relu is katz_rows' default
        timm.create_model("infvit_tiny_patch16_224", mixer="katz_rows:hedgehog", feature_map="relu", depth=1)
    with pytest.raises(ValueError, match="'pure_infsa' takes no ':option'"):
        timm.create_model("infvit_tiny_patch16_224", mixer="pure_infsa:hedgehog", depth=1)
    vit = timm.create_model("vit_4l_patch16_224", img_size=32, patch_size=8, embed_dim=24, depth=1, num_heads=3)
    student = linvit.convert(copy.deepcopy(vit), "katz_rows:hedgehog", gamma_init=0.5)
    layer = student.blocks[0].attn
    assert isinstance(layer, KatzRowsAttention) and layer.feature_map == "hedgehog"
    torch.testing.assert_close(layer.qkv.weight, vit.blocks[0].attn.qkv.weight)
    from linvit.explain import default_method, importance_maps

    assert default_method(model) == "grad"  # Katz's operator maps read A^, not the row-normalised series
    with pytest.raises(ValueError, match="katz"):
        importance_maps(model.eval(), torch.randn(1, 3, 32, 32), method="katz")
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=4)
    config.bos_token_id = config.eos_token_id = 0
    with pytest.raises(ValueError, match="katz_rows normalises each query's row over the whole series, which has no"):
        linvit.convert(transformers.GPT2LMHeadModel(config), "katz_rows")
