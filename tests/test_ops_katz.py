"""Katz-InfSA: exact infinite-hop series, Katz centrality and Perron vector against dense float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_err
from linvit.ops import katz_centrality, katz_infsa, perron_vector
from linvit.ops.katz import katz_features, katz_mixing, katz_mixing_by_tokens, katz_token_sums
from reference import _katz_a_hat, katz_centrality_dense_ref, katz_dense_ref, left_perron_numpy

shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 48), st.integers(1, 16))


@given(shape=shapes, gamma=st.floats(0.05, 0.99), kind=st.sampled_from(["relu", "elu+1"]))
def test_katz_matches_dense_neumann_series(shape, gamma, kind):
    q, k, v = torch.randn(3, *shape).unbind(0)
    out = katz_infsa(q, k, v, gamma, feature_map=kind)
    assert out.dtype == torch.float32
    assert rel_err(out, katz_dense_ref(q, k, v, gamma, kind=kind)) <= 1e-5


def test_katz_per_head_gamma_and_batch_independence():
    q, k, v = torch.randn(3, 3, 2, 30, 8).unbind(0)
    g = torch.tensor([0.3, 0.95])
    out = katz_infsa(q, k, v, g)
    assert rel_err(out, katz_dense_ref(q, k, v, g)) <= 1e-5
    for i in range(3):
        assert rel_err(katz_infsa(q[i : i + 1], k[i : i + 1], v[i : i + 1], g), out[i : i + 1]) <= 1e-6


def test_katz_is_permutation_equivariant_and_token_dependent():
    q, k, v = torch.randn(3, 1, 2, 25, 8).unbind(0)
    perm = torch.randperm(25)
    out = katz_infsa(q, k, v, 0.9)
    assert rel_err(katz_infsa(q[:, :, perm], k[:, :, perm], v[:, :, perm], 0.9), out[:, :, perm]) <= 1e-5
    assert not torch.allclose(out[:, :, 0], out[:, :, 1])


@pytest.mark.parametrize("n,d", [(9, 4), (3, 6)])  # the d x d system and, for N <= d, the N x N one
def test_katz_gradients_gradcheck_float64(n, d):
    q, k, v = (t.requires_grad_() for t in torch.randn(3, 1, 2, n, d, dtype=torch.float64).unbind(0))
    g = torch.tensor([0.6, 0.9], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: katz_infsa(*a), (q, k, v, g))
    assert torch.autograd.gradcheck(lambda *a: katz_infsa(*a, feature_map="elu+1"), (q, k, v, g))


@pytest.mark.parametrize("n,d", [(20, 6), (6, 20)])
def test_katz_gradients_match_dense_reference(n, d):
    q, k, v = (t.requires_grad_() for t in torch.randn(3, 2, 2, n, d, dtype=torch.float64).unbind(0))
    w = torch.randn(2, 2, n, d, dtype=torch.float64)
    ours = torch.autograd.grad((katz_infsa(q, k, v, 0.8) * w).sum(), (q, k, v))
    dense = torch.autograd.grad((katz_dense_ref(q, k, v, 0.8) * w).sum(), (q, k, v))
    for a, b in zip(ours, dense, strict=True):
        assert rel_err(a, b) <= 1e-8


@pytest.mark.parametrize("n,d", [(1, 4), (5, 16), (16, 16), (17, 64)])
def test_token_system_equals_the_d_by_d_system(n, d):
    """For N <= d Katz-InfSA solves the N x N system (push-through identity); both give the same mixing."""
    q, k, v = torch.randn(3, 2, 3, n, d, dtype=torch.float64).unbind(0)
    g = torch.tensor([0.3, 0.9, 0.999], dtype=torch.float64)
    (fq, c2), (fk, _) = katz_features(q), katz_features(k)
    by_tokens = katz_mixing_by_tokens(fq, fk, v, g, 1e-6, c2)
    # 1e-9: where fq fk^T = 0 (one token, disjoint supports) the d x d form's norm is the clamp's 1e-15, not 0
    assert rel_err(by_tokens, katz_mixing(katz_token_sums(fq, fk, v), g, 1e-6, c2)) <= 1e-9
    assert rel_err(katz_infsa(q, k, v, g), katz_dense_ref(q, k, v, g)) <= 1e-12


@given(shape=shapes, gamma=st.floats(0.05, 0.999))
def test_spectral_radius_of_discounted_operator_below_one(shape, gamma):
    q, k = (torch.randn(2, *shape) * 5).unbind(0)
    radius = torch.linalg.eigvals(gamma * _katz_a_hat(q, k, 1e-6, "relu")).abs().amax(-1)
    assert (radius < 1).all()


@pytest.mark.parametrize("n", [10, 3])
def test_degenerate_inputs_give_zero_not_nan(n):
    q = -torch.rand(1, 2, n, 4)  # phi(Q) = 0
    k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
    for args in ((q, k, v), (k, q, v)):
        out = katz_infsa(*args, 0.9)
        assert torch.isfinite(out).all() and out.abs().max() == 0
        grads = torch.autograd.grad(katz_infsa(*(t.requires_grad_() for t in args), 0.9).sum(), args)
        assert all(torch.isfinite(g).all() for g in grads)
    assert torch.isfinite(perron_vector(q, k)).all() and torch.isfinite(katz_centrality(q, k, 0.9)).all()


def test_katz_centrality_matches_dense():
    q, k = torch.randn(2, 2, 3, 40, 8).unbind(0)
    g = torch.tensor([0.5, 0.9, 0.99])
    assert rel_err(katz_centrality(q, k, g), katz_centrality_dense_ref(q, k, g)) <= 1e-5


@pytest.mark.parametrize("n,d", [(30, 4), (64, 8), (7, 16)])
def test_perron_vector_matches_numpy_eigendecomposition(n, d):
    q, k = torch.randn(2, 1, 1, n, d, dtype=torch.float64).unbind(0)
    ours = perron_vector(q, k)[0, 0]
    expected = left_perron_numpy(_katz_a_hat(q, k, 1e-6, "relu")[0, 0].numpy())
    assert rel_err(ours, torch.from_numpy(expected)) <= 1e-6


def test_katz_under_autocast_solves_in_float32():
    q, k, v = (torch.randn(1, 2, 5000, 16) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = katz_infsa(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.9)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (
        rel_err(out.float(), katz_infsa(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), 0.9)) <= 4e-3
    )


def test_bad_feature_map_raises():
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="feature_map"):
        katz_infsa(q, q, q, 0.9, feature_map="softplus")
