"""InfSA attention modules: agreement with the ops, the folded fast path, learnable gamma, timm use."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from timm.models.vision_transformer import VisionTransformer

from conftest import rel_err
from linvit.layers import KatzInfSAAttention, LinearInfSAAttention, PureInfSAAttention
from reference import katz_dense_ref, linear_infsa_ref, pure_infsa_ref

MODULES = [PureInfSAAttention, LinearInfSAAttention, KatzInfSAAttention]


def _module_ref(m, x, ref):
    """Float64 projection + reference op + output projection."""
    B, N, C = x.shape
    H, D = m.num_heads, m.head_dim
    qkv = torch.nn.functional.linear(
        x.double(), m.qkv.weight.double(), None if m.qkv.bias is None else m.qkv.bias.double()
    )
    q, k, v = qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    out = ref(q, k, v, m.gamma.detach().double()).transpose(1, 2).reshape(B, N, C)
    return torch.nn.functional.linear(out, m.proj.weight.double(), m.proj.bias.double())


@pytest.mark.parametrize(
    "cls,ref",
    [
        (PureInfSAAttention, pure_infsa_ref),
        (LinearInfSAAttention, linear_infsa_ref),
        (KatzInfSAAttention, katz_dense_ref),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_module_matches_float64_reference(cls, ref, bias):
    m = cls(48, num_heads=4, qkv_bias=bias)
    with torch.no_grad():
        m.theta.copy_(torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    x = torch.randn(2, 37, 48)
    assert rel_err(m(x), _module_ref(m, x, ref)) <= 1e-5


@given(
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 16),
    n=st.integers(1, 60),
    bias=st.booleans(),
)
def test_folded_equals_unfolded_forward_and_gradients(heads, head_dim, n, bias):
    torch.manual_seed(heads * 1000 + head_dim * 100 + n)
    dim = heads * head_dim
    m = LinearInfSAAttention(dim, num_heads=heads, qkv_bias=bias)
    with torch.no_grad():
        m.theta.uniform_(-2, 2)
        if bias:
            m.qkv.bias.normal_()
    x = torch.randn(2, n, dim)
    results = []
    for fold in (True, False):
        m.fold_kv = fold
        xi = x.clone().requires_grad_()
        out = m(xi)
        loss = (out * torch.arange(dim, dtype=out.dtype)).sum()
        grads = torch.autograd.grad(loss, [xi, *m.parameters()])
        results.append((out, grads))
    (o1, g1), (o2, g2) = results
    assert rel_err(o1, o2) <= 1e-5
    for a, b in zip(g1, g2, strict=True):
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("cls", MODULES)
def test_gamma_is_learnable_per_head(cls):
    m = cls(32, num_heads=4)
    torch.testing.assert_close(m.gamma, torch.full((4,), 0.9))
    m(torch.randn(2, 10, 32)).square().sum().backward()
    assert m.theta.grad is not None and m.theta.grad.shape == (4,) and (m.theta.grad != 0).all()
    before = m.theta.detach().clone()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    opt.step()
    assert not torch.equal(before, m.theta.detach())


@pytest.mark.parametrize("cls", MODULES)
def test_usable_as_timm_attn_layer(cls):
    vit = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5, attn_layer=cls
    )
    assert isinstance(vit.blocks[0].attn, cls)
    torch.testing.assert_close(vit.blocks[1].attn.gamma, torch.full((4,), 0.9))  # timm's init keeps gamma_init
    out = vit(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 5) and vit.blocks[0].attn.theta.grad is not None


def test_qk_norm_falls_back_to_unfolded_and_runs():
    m = LinearInfSAAttention(32, num_heads=4, qk_norm=True, norm_layer=torch.nn.LayerNorm)
    x = torch.randn(2, 9, 32)
    out = m(x)
    m.fold_kv = False
    torch.testing.assert_close(out, m(x))


def test_linear_rejects_masks_and_pure_supports_causal():
    x = torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match="mask"):
        LinearInfSAAttention(16, num_heads=2)(x, attn_mask=torch.ones(6, 6, dtype=torch.bool))
    pure = PureInfSAAttention(16, num_heads=2)
    causal = pure(x, is_causal=True)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(1, 3, 16)  # the future of token 2 changes; tokens 0..2 must not notice
    torch.testing.assert_close(pure(x2, is_causal=True)[:, :3], causal[:, :3], rtol=0, atol=1e-6)
    assert not torch.allclose(pure(x2)[:, 0], pure(x)[:, 0])  # without the mask token 0 does see the others


def test_katz_rejects_masks_and_attention_dropout():
    with pytest.raises(ValueError, match="attn_drop"):
        KatzInfSAAttention(16, num_heads=2, attn_drop=0.1)
    with pytest.raises(ValueError, match="mask"):
        KatzInfSAAttention(16, num_heads=2)(torch.randn(1, 4, 16), is_causal=True)


def test_bad_construction_raises():
    with pytest.raises(ValueError, match="divisible"):
        PureInfSAAttention(30, num_heads=4)
    with pytest.raises(ValueError, match="gamma_init"):
        LinearInfSAAttention(32, num_heads=4, gamma_init=1.0)


def test_folded_linear_under_bf16_autocast_with_many_tokens_stays_finite():
    m = LinearInfSAAttention(16, num_heads=2, qkv_bias=True)
    x = torch.randn(1, 300_000, 16) + 1.0
    with torch.no_grad():
        expected = m(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
    assert torch.isfinite(out).all()
    assert out.dtype == torch.bfloat16  # the autocast dtype, as every mixer returns (issue 39 item 6)
    floor = rel_err(expected[:, :1].bfloat16(), expected[:, :1])  # the output's own rounding
    assert rel_err(out[:, :1].float(), expected[:, :1]) <= floor + 1e-3  # beyond it, only the bf16 projections


def test_importance_equals_op_on_projected_queries_and_keys():
    from linvit.ops import linear_infsa_importance

    m = LinearInfSAAttention(24, num_heads=3, qkv_bias=True)
    with torch.no_grad():
        m.qkv.bias.normal_()
    x = torch.randn(2, 19, 24)
    q, k, _ = m.project_qkv(x)
    assert rel_err(m.importance(x), linear_infsa_importance(q, k)) <= 1e-5


def test_streaming_pooled_output_equals_one_chunk():
    m = LinearInfSAAttention(24, num_heads=3, qkv_bias=True).eval()
    x = torch.randn(2, 23, 24)
    with torch.no_grad():
        whole = m.pooled_output([x])
        parts = m.pooled_output([x[:, :5], x[:, 5:6], x[:, 6:]])
    assert rel_err(parts, whole) <= 1e-6


@pytest.mark.parametrize("proj_bias", [True, False])
@pytest.mark.parametrize("feature_map", ["relu", "elu+1"])
def test_katz_folded_output_projection_equals_the_op_then_proj(proj_bias, feature_map):
    """Katz-InfSA's layer folds proj into the d x D mixing; outputs and gradients equal merge_heads(op)."""
    from linvit.layers import KatzInfSAAttention
    from linvit.ops import katz_infsa

    m = KatzInfSAAttention(24, num_heads=3, qkv_bias=True, proj_bias=proj_bias, feature_map=feature_map).double()
    x = torch.randn(2, 19, 24, dtype=torch.float64, requires_grad=True)
    q, k, v = m.project_qkv(x)
    expected = m.merge_heads(katz_infsa(q, k, v, m.gamma, m.eps, feature_map=feature_map))
    out = m(x)
    assert rel_err(out, expected) <= 1e-12
    grads = torch.autograd.grad(out.square().sum(), [x, m.qkv.weight, m.proj.weight, m.theta])
    reference = torch.autograd.grad(expected.square().sum(), [x, m.qkv.weight, m.proj.weight, m.theta])
    for a, b in zip(grads, reference, strict=True):
        assert rel_err(a, b) <= 1e-10


def test_linear_infsa_projects_the_soft_query_in_views_only_in_eager_inference(monkeypatch):
    """Above QUERY_CHUNK_MIN_TOKENS eager inference sums the soft query over views of x (no N x C Q tensor);
    the output equals the one-chunk path up to summation order, and autograd keeps one chunk."""
    from linvit.layers import infsa_attention as ia

    monkeypatch.setattr(ia, "QUERY_CHUNK_MIN_TOKENS", 64)
    monkeypatch.setattr(ia, "QUERY_CHUNK", 24)
    x = torch.randn(2, 100, 32)
    with torch.no_grad():
        views = ia.token_views(x)
        assert len(ia.token_views(x[:, :63])) == 1  # below the threshold: one chunk
    assert [v.shape[1] for v in views] == [24, 24, 24, 24, 4] and all(v._base is x for v in views)  # views
    assert len(ia.token_views(x)) == 1  # autograd on: one chunk
    torch.manual_seed(0)
    layer = ia.LinearInfSAAttention(32, 4).eval()
    with torch.no_grad():
        chunked = layer(x)
        monkeypatch.setattr(ia, "QUERY_CHUNK_MIN_TOKENS", 10**9)
        whole = layer(x)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [PureInfSAAttention, LinearInfSAAttention, KatzInfSAAttention])
def test_a_bfloat16_input_under_autocast_runs_at_inference(cls):
    """A mixer fed bfloat16 activations (a DiT block modulates with a bfloat16 adaLN output) under CPU autocast:
    Linear-InfSA's folded inference path ran its float32 output projection on them and raised."""
    torch.manual_seed(0)
    layer = cls(64, num_heads=4).eval()
    x = torch.randn(2, 50, 64)
    with torch.no_grad():
        expected = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x.bfloat16())
    assert out.dtype == torch.bfloat16 and rel_err(out.float(), expected) < 2e-2


@pytest.mark.parametrize("cls", [LinearInfSAAttention, KatzInfSAAttention])
def test_streamed_passes_normalise_every_chunk_under_the_callers_autocast(cls):
    """residual_streamed iterates its chunks inside no_autocast; the block's norm must still run under the
    caller's autocast (a CUDA layer norm given a bfloat16 chunk and float32 weights fails outside it)."""
    torch.manual_seed(0)
    m = cls(32, num_heads=4).eval()
    norm = torch.nn.LayerNorm(32)
    seen = []

    def spy(x):
        seen.append(torch.is_autocast_enabled("cpu"))
        return norm(x)

    x = torch.randn(2, 40, 32)
    spans = [(0, 16), (16, 32), (32, 40)]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        streamed = m.residual_streamed(x.clone(), spans, spy, torch.nn.Identity())
        whole = x + m(norm(x))
    assert seen and all(seen)
    torch.testing.assert_close(streamed, whole.float(), rtol=0.05, atol=0.05)
