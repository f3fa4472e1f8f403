"""Causal Katz-InfSA (docs/spec/infsa.md 4.1): dense, chunked and recurrent forms against a term-by-term float64
series, against each other, no future leak, state continuation, bounded outputs, float16 on degenerate heads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import rel_err
from linvit.ops.katz_causal import (
    causal_katz_chunked,
    causal_katz_dense,
    causal_katz_recurrent,
    empty_state,
)
from reference import causal_katz_series_ref

shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 40), st.integers(1, 12))


def _qkv(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, *shape, generator=g, dtype=dtype).unbind(0)


@settings(deadline=None, max_examples=40)
@given(shape=shapes, gamma=st.floats(0.05, 0.98), kind=st.sampled_from(["relu", "elu+1"]), chunk=st.integers(1, 17))
def test_every_form_matches_the_float64_series(shape, gamma, kind, chunk):
    q, k, v = _qkv(shape)
    ref = causal_katz_series_ref(q, k, v, gamma, kind=kind)
    assert rel_err(causal_katz_dense(q, k, v, gamma, feature_map=kind), ref) <= 1e-9
    assert rel_err(causal_katz_chunked(q, k, v, gamma, feature_map=kind, chunk_size=chunk)[0], ref) <= 1e-9
    assert rel_err(causal_katz_recurrent(q, k, v, gamma, feature_map=kind)[0], ref) <= 1e-9


def test_chunked_equals_recurrent_in_float32_with_per_head_gamma():
    q, k, v = _qkv((2, 3, 200, 16), torch.float32)
    g = torch.tensor([0.2, 0.9, 0.99])
    chunked, s1 = causal_katz_chunked(q, k, v, g, chunk_size=32)
    recurrent, s2 = causal_katz_recurrent(q, k, v, g)
    assert chunked.dtype == torch.float32
    assert rel_err(chunked, recurrent) <= 1e-5 and rel_err(s1.S, s2.S) <= 1e-5 and rel_err(s1.z, s2.z) <= 1e-6
    ref = causal_katz_series_ref(q, k, v, g)
    assert rel_err(chunked, ref) <= 1e-5


def test_a_prompt_then_one_token_at_a_time_equals_one_call():
    q, k, v = _qkv((1, 2, 45, 8))
    whole, final = causal_katz_chunked(q, k, v, 0.9, chunk_size=16)
    head, state = causal_katz_chunked(q[:, :, :30], k[:, :, :30], v[:, :, :30], 0.9, chunk_size=16)
    steps = [head]
    for i in range(30, 45):
        out, state = causal_katz_recurrent(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], 0.9, state=state)
        steps.append(out)
    assert rel_err(torch.cat(steps, dim=2), whole) <= 1e-12 and rel_err(state.S, final.S) <= 1e-12


@pytest.mark.parametrize("form", ["chunked", "recurrent", "dense"])
def test_no_future_leak_bit_identical_prefix(form):
    """Changing every token after t leaves outputs 0..t bit-identical (chunk boundaries inside and outside)."""
    q, k, v = _qkv((2, 2, 50, 8), torch.float32)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[:, :, 21:] = torch.randn_like(t[:, :, 21:]) * 5
    run = {
        "chunked": lambda *a: causal_katz_chunked(*a, 0.9, chunk_size=16)[0],
        "recurrent": lambda *a: causal_katz_recurrent(*a, 0.9)[0],
        "dense": lambda *a: causal_katz_dense(*a, 0.9),
    }[form]
    a, b = run(q, k, v), run(q2, k2, v2)
    assert torch.equal(a[:, :, :21], b[:, :, :21]) and not torch.equal(a[:, :, 21:], b[:, :, 21:])


def test_outputs_are_bounded_at_any_length():
    """A is row-(sub)stochastic, so |O_i| <= gamma / (1 - gamma) max |V| however long the sequence: a long
    context does not inflate the output (a prefix-Frobenius normaliser grows ~i^0.3 here, see the spec)."""
    q, k, v = _qkv((1, 2, 3000, 16), torch.float32)
    out, _ = causal_katz_chunked(q.abs(), k.abs(), v, 0.9)  # all-positive scores: the dense, uniform case
    assert out.abs().max() <= 0.9 / 0.1 * v.abs().max() * (1 + 1e-5)
    late, early = out[0, :, 2000:].norm(dim=-1).mean(), out[0, :, 100:200].norm(dim=-1).mean()
    assert late <= 1.5 * early


def test_batch_independence_and_gradients_match_the_dense_form():
    q, k, v = (t.requires_grad_() for t in _qkv((3, 2, 20, 6)))
    out, _ = causal_katz_chunked(q, k, v, 0.8, chunk_size=8)
    for i in range(3):
        alone, _ = causal_katz_chunked(q[i : i + 1], k[i : i + 1], v[i : i + 1], 0.8, chunk_size=8)
        assert rel_err(alone, out[i : i + 1]) <= 1e-12
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    dense = torch.autograd.grad((causal_katz_dense(q, k, v, 0.8) * w).sum(), (q, k, v))
    assert all(rel_err(a, b) <= 1e-9 for a, b in zip(grads, dense, strict=True))


@pytest.mark.parametrize("kind", ["relu", "elu+1"])
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_stays_finite_on_degenerate_heads(form, dtype, kind):
    """Head 0 has q = 0, head 1 all-negative scores: with ReLU features both are dead (a zero output), with
    ELU + 1 (the default) none is; finite gradients either way, and a half input returns its own dtype,
    computed in float32."""
    q, k, v = (t.to(dtype) for t in _qkv((2, 3, 70, 8), torch.float32))
    q[:, 0] = 0
    q[:, 1] = -q[:, 1].abs()
    k[:, 1] = k[:, 1].abs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    run = causal_katz_chunked if form == "chunked" else causal_katz_recurrent
    out, state = run(q, k, v, 0.9, feature_map=kind)
    assert out.dtype == dtype and state.S.dtype == torch.float32
    assert torch.equal(out[:, :2] == 0, torch.full_like(out[:, :2], kind == "relu", dtype=torch.bool))
    out.float().pow(2).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    ref = causal_katz_series_ref(q.detach().float(), k.detach().float(), v.detach().float(), 0.9, kind=kind)
    assert rel_err(out, ref) <= (1e-2 if dtype == torch.bfloat16 else 2e-3)


def test_a_state_from_another_shape_is_refused():
    q, k, v = _qkv((1, 2, 5, 8))
    state = empty_state(q[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="belongs to another batch, layer or model"):
        causal_katz_recurrent(q, k, v, 0.9, state=state)
    with pytest.raises(ValueError, match="chunk_size"):
        causal_katz_chunked(q, k, v, 0.9, chunk_size=0)


@settings(deadline=None, max_examples=25)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    chunk=st.integers(1, 17),
    split=st.integers(0, 100),
)
def test_packed_documents_each_equal_their_own_series(lengths, chunk, split):
    """Issue 45.2: resets make the operator block-diagonal; each packed document equals the float64 series of it
    alone, in every form, and a call cut anywhere then continued from its state gives the same."""
    shape = (1, 2, sum(lengths), 6)
    q, k, v = _qkv(shape, seed=len(lengths))
    resets = torch.zeros(1, shape[2], dtype=torch.bool)
    starts = torch.tensor([0, *lengths]).cumsum(0)[:-1]
    resets[0, starts[1:]] = True
    ref = torch.cat(
        [
            causal_katz_series_ref(*(t[:, :, s : s + n] for t in (q, k, v)), 0.8)
            for s, n in zip(starts.tolist(), lengths, strict=True)
        ],
        dim=2,
    )
    assert rel_err(causal_katz_dense(q, k, v, 0.8, resets=resets), ref) <= 1e-9
    assert rel_err(causal_katz_chunked(q, k, v, 0.8, chunk_size=chunk, resets=resets)[0], ref) <= 1e-9
    assert rel_err(causal_katz_recurrent(q, k, v, 0.8, resets=resets)[0], ref) <= 1e-9
    cut = split % (shape[2] + 1)
    head, state = causal_katz_chunked(
        *(t[:, :, :cut] for t in (q, k, v)), 0.8, chunk_size=chunk, resets=resets[:, :cut]
    )
    tail, _ = causal_katz_recurrent(*(t[:, :, cut:] for t in (q, k, v)), 0.8, state=state, resets=resets[:, cut:])
    assert rel_err(torch.cat([head, tail], dim=2), ref) <= 1e-9
