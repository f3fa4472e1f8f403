"""ELU + 1 features (Katz-InfSA's and linear attention's fixed map, Linear-InfSA's "elu+1" scores) stay positive
where exp does: elu(x) + 1 = (exp(x) - 1) + 1 was exactly 0 in float32 below x = -17, a dead feature."""

from __future__ import annotations

import pytest
import torch

from linvit.ops.common import elu_plus_one
from linvit.ops.infsa import linear_scores
from linvit.ops.katz import feature_map


def _maps():
    """Each public path to the map, on x (feature_map scales by 1/sqrt(d): d = 1 keeps x as it is)."""
    return {
        "elu_plus_one": elu_plus_one,
        "katz.feature_map": lambda x: feature_map(x.unsqueeze(-1), "elu+1").squeeze(-1),
        "linear_scores": lambda x: linear_scores(x, "elu+1"),
    }


@pytest.mark.parametrize("path", sorted(_maps()))
def test_features_far_below_zero_are_exp_not_zero_in_float32(path):
    x = torch.tensor([-20.0, -17.5, -40.0, -87.0])
    out = _maps()[path](x)
    assert (out > 0).all()
    torch.testing.assert_close(out.double(), torch.exp(x.double()), rtol=1e-6, atol=0)


@pytest.mark.parametrize("path", sorted(_maps()))
def test_equals_elu_plus_one_in_float64_and_its_gradient_too(path):
    x = torch.linspace(-30, 30, 601, dtype=torch.float64, requires_grad=True)
    out = _maps()[path](x)
    expected = torch.where(x > 0, x + 1, torch.exp(x))  # elu(x) + 1 without the cancellation
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=0)
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, torch.where(x > 0, 1.0, torch.exp(x)).double(), rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gradients_are_finite_at_large_magnitudes_in_half_precision(dtype):
    """exp's unused branch reads min(x, 0): exp(60000) would be inf, and inf x 0 a NaN gradient."""
    big = 6e4 if dtype == torch.float16 else 1e30
    x = torch.tensor([-big, -100.0, -20.0, 0.0, 20.0, 100.0, big], dtype=dtype, requires_grad=True)
    out = elu_plus_one(x)
    assert out.dtype == dtype and torch.isfinite(out).all() and (out >= 0).all()
    (grad,) = torch.autograd.grad(out.float().sum(), x)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[x.detach() > 0], torch.ones_like(grad[x.detach() > 0]))


def test_scripted_linear_scores_take_the_same_path():
    scripted = torch.jit.script(elu_plus_one)
    x = torch.tensor([-20.0, -1.0, 0.0, 2.0])
    assert torch.equal(scripted(x), elu_plus_one(x))
