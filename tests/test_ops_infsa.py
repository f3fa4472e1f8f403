"""linvit.ops pure/linear InfSA against float64 references, the release, and their invariances."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_err
from linvit.ops import linear_infsa, linear_infsa_importance, pure_infsa
from reference import linear_infsa_ref, pure_infsa_ref, pure_infsa_release

shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 70), st.integers(1, 32))
OPS = [(pure_infsa, pure_infsa_ref), (linear_infsa, linear_infsa_ref)]


def _qkv(B, H, N, D, dtype=torch.float32):
    return torch.randn(3, B, H, N, D, dtype=dtype).unbind(0)


@given(shape=shapes, gamma=st.floats(0.05, 0.99))
@pytest.mark.parametrize("op,ref", OPS, ids=["pure", "linear"])
def test_matches_float64_reference(op, ref, shape, gamma):
    q, k, v = _qkv(*shape)
    assert rel_err(op(q, k, v, gamma), ref(q, k, v, gamma)) <= 1e-5


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-14)])
def test_pure_equals_release_order_of_operations(dtype, tol):
    """Equal to the release up to rounding: ours scales the (N, D) product instead of the N x N matrix (three
    N x N tensors fewer), which moves float32 results by a few ulps (bit-identical before issue 22)."""
    q, k, v = _qkv(2, 3, 57, 16, dtype)
    ours = pure_infsa(q, k, v, 0.9, impl="dense")
    torch.testing.assert_close(ours, pure_infsa_release(q, k, v, 0.9), rtol=tol, atol=tol / 2)  # outputs ~0.5


@given(shape=shapes, block=st.integers(1, 80))
def test_pure_chunked_equals_dense(shape, block):
    q, k, v = _qkv(*shape)
    dense = pure_infsa(q, k, v, 0.8, impl="dense")
    assert rel_err(pure_infsa(q, k, v, 0.8, impl="chunked", block_size=block), dense) <= 1e-5


def test_pure_chunked_gradients_equal_dense():
    q, k, v = (t.requires_grad_() for t in _qkv(2, 2, 40, 8, torch.float64))
    g = torch.tensor([0.7, 0.9], dtype=torch.float64, requires_grad=True)
    grads = []
    for impl in ("dense", "chunked"):
        out = pure_infsa(q, k, v, g, impl=impl, block_size=7)
        grads.append(torch.autograd.grad((out * torch.linspace(-1, 1, 8, dtype=torch.float64)).sum(), (q, k, v, g)))
    for a, b in zip(*grads, strict=True):
        assert rel_err(a, b) <= 1e-10


def test_pure_auto_switches_to_chunked_above_threshold(monkeypatch):
    import linvit.ops.infsa as mod

    q, k, v = _qkv(1, 2, 30, 8)
    calls = []
    orig = mod._pure_infsa_chunked
    monkeypatch.setattr(mod, "_pure_infsa_chunked", lambda *a: calls.append(a[5]) or orig(*a))
    assert rel_err(pure_infsa(q, k, v, 0.9, max_dense_scores=2 * 30 * 30), pure_infsa_ref(q, k, v, 0.9)) <= 1e-5
    assert not calls, "auto chunked at the threshold"
    assert rel_err(pure_infsa(q, k, v, 0.9, max_dense_scores=2 * 30 * 30 - 1), pure_infsa_ref(q, k, v, 0.9)) <= 1e-5
    assert calls == [(2 * 30 * 30 - 1) // 2 // (2 * 30)], "auto did not pick the chunked form above max_dense_scores"


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_invariant_to_logit_scale(op):
    q, k, v = _qkv(2, 3, 33, 16)
    assert rel_err(op(q * 7.3, k, v, 0.9), op(q, k, v, 0.9)) <= 1e-5
    assert rel_err(op(q, k * 0.2, v, 0.9), op(q, k, v, 0.9)) <= 1e-5


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_batch_independence(op):
    q, k, v = _qkv(4, 2, 25, 8)
    full = op(q, k, v, 0.9)
    for i in range(4):
        alone = op(q[i : i + 1], k[i : i + 1], v[i : i + 1], 0.9)
        assert rel_err(alone, full[i : i + 1]) <= 1e-6


def test_pure_is_permutation_equivariant():
    q, k, v = _qkv(2, 2, 31, 8)
    perm = torch.randperm(31)
    out = pure_infsa(q, k, v, 0.9)
    assert rel_err(pure_infsa(q[:, :, perm], k[:, :, perm], v[:, :, perm], 0.9), out[:, :, perm]) <= 1e-5


def test_linear_is_permutation_invariant_and_broadcast():
    q, k, v = _qkv(2, 2, 31, 8)
    perm = torch.randperm(31)
    out = linear_infsa(q, k, v, 0.9)
    assert rel_err(linear_infsa(q[:, :, perm], k[:, :, perm], v[:, :, perm], 0.9), out) <= 1e-5
    assert torch.equal(out, out[:, :, :1].expand_as(out))


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_all_negative_logits_give_zero_not_nan(op):
    q = torch.rand(1, 2, 20, 8) + 0.1
    k = -(torch.rand(1, 2, 20, 8) + 0.1)
    out = op(q, k, torch.randn(1, 2, 20, 8), 0.9)
    assert torch.isfinite(out).all() and out.abs().max() == 0


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_a_masked_query_with_only_zero_rows_keeps_every_gradient_finite(impl):
    """Causal mask, first query's only logit <= 0: its norm is 0, where sqrt's gradient is infinite; the
    backward must stay finite (it was NaN everywhere) and the forward unchanged elsewhere."""
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 6, 4))
    with torch.no_grad():
        k[:, :, 0] = -q[:, :, 0].sign() * q[:, :, 0].abs().clamp(min=0.1)  # q_0 . k_0 < 0 in every head
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    out = pure_infsa(q, k, v, torch.tensor([0.5, 0.9]), impl=impl, block_size=2, attn_mask=causal)
    out.square().sum().backward()
    assert out[:, :, 0].abs().max() == 0 and all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_per_head_gamma_equals_per_head_float(op):
    q, k, v = _qkv(2, 3, 17, 8)
    gam = torch.tensor([0.2, 0.5, 0.9])
    out = op(q, k, v, gam)
    for h in range(3):
        single = op(q[:, h : h + 1], k[:, h : h + 1], v[:, h : h + 1], float(gam[h]))
        assert rel_err(out[:, h : h + 1], single) <= 1e-6


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_gamma_receives_gradient(op):
    q, k, v = _qkv(1, 2, 10, 4)
    g = torch.tensor([0.3, 0.6], requires_grad=True)
    op(q, k, v, g).square().sum().backward()
    assert g.grad is not None and (g.grad.abs() > 0).all()


@pytest.mark.parametrize("op", [pure_infsa, linear_infsa], ids=["pure", "linear"])
def test_bad_arguments_raise(op):
    q, k, v = _qkv(1, 2, 10, 4)
    with pytest.raises(ValueError, match="gamma"):
        op(q, k, v, torch.ones(3))
    with pytest.raises(ValueError, match="shape"):
        op(q[0], k[0], v[0], 0.9)
    with pytest.raises(ValueError, match="disagree"):
        op(q, k[:, :, :5], v, 0.9)


def test_pure_mask_removes_pairs_and_normalises_each_query_over_what_it_sees():
    q, k, v = _qkv(1, 1, 12, 4)
    mask = torch.rand(12, 12) > 0.3
    D = 4
    A = torch.relu(q.double() @ k.double().transpose(-2, -1) / D) * mask
    norms = (mask.double() @ A.square().sum(-1, keepdim=True).squeeze(0).squeeze(0)).sqrt()  # (N, 1)
    expected = 0.9 * A / (norms + 1e-6) @ v.double()
    for impl in ("dense", "chunked"):
        assert rel_err(pure_infsa(q, k, v, 0.9, impl=impl, block_size=5, attn_mask=mask), expected) <= 1e-5
    everything = torch.ones(12, 12, dtype=torch.bool)  # an all-True mask is the unmasked global norm
    assert rel_err(pure_infsa(q, k, v, 0.9, attn_mask=everything), pure_infsa(q, k, v, 0.9).double()) <= 1e-6
    with pytest.raises(ValueError, match="boolean"):
        pure_infsa(q, k, v, 0.9, attn_mask=mask.float())


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_pure_causal_mask_hides_the_future_completely(impl):
    """Perturbing tokens after t leaves outputs at positions <= t unchanged (the norm included)."""
    q, k, v = _qkv(2, 3, 10, 4)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    out = pure_infsa(q, k, v, 0.9, impl=impl, block_size=3, attn_mask=causal)
    t = 4
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :])
    out2 = pure_infsa(q2, k2, v2, 0.9, impl=impl, block_size=3, attn_mask=causal)
    torch.testing.assert_close(out2[:, :, : t + 1], out[:, :, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(out2[:, :, t + 1 :], out[:, :, t + 1 :])
    # position t sees exactly what a sequence truncated after t gives
    prefix = pure_infsa(q[:, :, : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], 0.9, attn_mask=causal[: t + 1, : t + 1])
    torch.testing.assert_close(out[:, :, : t + 1], prefix, rtol=1e-5, atol=1e-6)


def test_pure_padding_mask_matches_the_unpadded_sequence():
    q, k, v = _qkv(1, 2, 9, 4)
    valid = torch.tensor([True] * 6 + [False] * 3)
    keep = valid[None, :].expand(9, 9)  # key padding: nobody attends to the padded tokens
    out = pure_infsa(q, k, v, 0.9, attn_mask=keep)
    torch.testing.assert_close(out[:, :, :6], pure_infsa(q[:, :, :6], k[:, :, :6], v[:, :, :6], 0.9))


def test_linear_importance_is_a_distribution():
    q, k, _ = _qkv(2, 3, 40, 8)
    a = linear_infsa_importance(q, k)
    assert a.shape == (2, 3, 40) and (a >= 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 3), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_accumulates_in_float32_over_300k_tokens(dtype):
    """Half-precision inputs with ~300k tokens: sums of energies and of a_j v_j must not overflow."""
    N = 300_000
    q, k, v = (t * 4 + 2 for t in _qkv(1, 2, N, 8))
    expected = linear_infsa_ref(q.to(dtype), k.to(dtype), v.to(dtype), 0.9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_infsa(q.to(dtype), k.to(dtype), v.to(dtype), 0.9)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert rel_err(out[:, :, :1], expected[:, :, :1]) <= (4e-3 if dtype == torch.bfloat16 else 5e-4)  # output rounding


def test_pure_auto_decides_per_sample_not_per_batch(monkeypatch):
    """The same image gets the same form at any batch size (B*H*N^2 switched big batches to two passes)."""
    import linvit.ops.infsa as infsa_ops

    calls = []
    real = infsa_ops._pure_infsa_chunked
    monkeypatch.setattr(infsa_ops, "_pure_infsa_chunked", lambda *a: calls.append(1) or real(*a))
    H, N = 2, 16
    for B in (1, 64):
        q, k, v = _qkv(B, H, N, 4)
        pure_infsa(q, k, v, 0.9, max_dense_scores=H * N * N)
    assert calls == []
    pure_infsa(*_qkv(1, H, N, 4), 0.9, max_dense_scores=H * N * N - 1)
    assert calls == [1]


def test_dense_pure_allocates_one_n_by_n_tensor():
    """The scale acts on the (N, D) product: only the scores themselves are N x N (in place through ReLU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    N = 32
    q, k, v = _qkv(2, 3, N, 8)

    class SquareOutputs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.storages = set()  # views and in-place ops share their input's storage

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.shape[-2:] == (N, N):
                self.storages.add(out.untyped_storage().data_ptr())
            return out

    with torch.no_grad(), SquareOutputs() as mode:
        out = pure_infsa(q, k, v, 0.9, impl="dense")
    assert len(mode.storages) == 1
    assert rel_err(out, pure_infsa_ref(q.double(), k.double(), v.double(), 0.9)) <= 1e-5
