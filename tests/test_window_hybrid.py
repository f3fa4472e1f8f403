"""The sliding-window hybrid (issue 44.2): exact softmax over the last W tokens, causal Katz-InfSA or linear
attention over the older ones, one normaliser. The op against a float64 dense N x N reference written from the
definition; causality, padding, packed documents, a decode state that does not grow; and through
linvit.convert(window=) in GPT-2 and Llama: cached decoding, generate() greedy and beam, refusals, distill."""

from __future__ import annotations

import functools

import pytest
import torch

import linvit
from linvit.layers.feature_maps import HedgehogFeatureMap
from linvit.ops.window_causal import window_causal_chunked, window_causal_recurrent

VOCAB = 61


def _elu1(t: torch.Tensor) -> torch.Tensor:
    """ELU + 1 of t / sqrt(d) in float64, as exp below 0 (no 1 + (exp - 1) cancellation)."""
    t = t.double() / t.shape[-1] ** 0.5
    return torch.where(t > 0, t + 1, torch.exp(t.clamp(max=0)))


def _dense_reference(q, k, v, window, gamma=None, keep=None, resets=None, features=None, eps=1e-6, log_weight=None):
    """docs/spec/infsa.md 4.2 written out in float64 from its formula, with nothing of the library: query t weighs
    window keys j in (t - W, t] by exp(q.k / sqrt(d)) and older keys j <= t - W by phi(q_t).phi(k_j) (over kept
    keys of t's document), one normaliser. Older keys bring v (linear attention, gamma None) or X = v + O, O
    the causal Katz output of 4.1: X solves (I - gamma A) X = v, A_ij = phi(q_i).phi(k_j) / n_i (j <= i),
    n_i = sum_{j <= i} phi(q_i).phi(k_j) + eps. All weights are taken in log space (log of the feature products
    beside the scores) and normalised by a softmax, so heads with scores of any size are covered. features:
    (phi(q), phi(k)), else ELU + 1. log_weight ((H,) or None): the log of a per-head factor on the window's
    terms. A row without any key gives 0."""
    B, H, N, d = q.shape
    q, k, v = q.double(), k.double(), v.double()
    fq, fk = (_elu1(q), _elu1(k)) if features is None else (features[0].double(), features[1].double())
    keep = torch.ones(B, N, dtype=torch.bool) if keep is None else keep
    documents = torch.cumsum(resets.long(), -1) if resets is not None else torch.zeros(B, N, dtype=torch.long)
    t, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    causal = ((documents[:, :, None] == documents[:, None, :]) & keep[:, None, :])[:, None] & (j <= t)
    in_window, older = causal & (j > t - window), causal & (j <= t - window)
    kernel = fq @ fk.transpose(-2, -1)  # phi(q_t) . phi(k_j) > 0
    x = v
    if gamma is not None:
        g = torch.as_tensor(gamma, dtype=torch.float64).reshape(1, -1, 1, 1)
        a = torch.where(causal, kernel, 0.0)
        a = a / (a.sum(-1, keepdim=True) + eps)
        x = torch.linalg.solve(torch.eye(N, dtype=torch.float64) - g * a, v)  # X = v + O
    scores = q @ k.transpose(-2, -1) / d**0.5
    if log_weight is not None:
        scores = scores + torch.as_tensor(log_weight, dtype=torch.float64).reshape(1, -1, 1, 1)
    logits = torch.where(in_window, scores, torch.log(kernel))
    logits = logits.masked_fill(~(in_window | older), float("-inf"))
    top = logits.amax(-1, keepdim=True)
    weights = torch.exp(logits - torch.where(torch.isfinite(top), top, 0.0))
    total = weights.sum(-1, keepdim=True)
    out = (torch.where(in_window, weights, 0.0) @ v + torch.where(older, weights, 0.0) @ x) / total.clamp_min(1e-300)
    return torch.where(total > 0, out, 0.0)


def _qkv(B=2, H=3, N=23, d=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, d, generator=g, dtype=dtype) for _ in range(3)]


FORMS = {"linear": None, "katz": 0.7}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("window", [1, 3, 8, 23, 40])
def test_the_op_equals_the_dense_float64_reference_in_every_form(window, form):
    """Chunked (chunks of 5: windows cross chunks; chunks of 1: 23 chunks, more than one vectorised block),
    recurrent, and a prompt continued token by token."""
    q, k, v = _qkv()
    gamma = FORMS[form]
    expected = _dense_reference(q, k, v, window, gamma)
    chunked, _ = window_causal_chunked(q, k, v, window, gamma=gamma, chunk_size=5)
    blocks, _ = window_causal_chunked(q, k, v, window, gamma=gamma, chunk_size=1)
    recurrent, _ = window_causal_recurrent(q, k, v, window, gamma=gamma)
    head, state = window_causal_chunked(q[:, :, :10], k[:, :, :10], v[:, :, :10], window, gamma=gamma, chunk_size=4)
    tail, _ = window_causal_recurrent(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], window, gamma=gamma, state=state)
    for out in (chunked, blocks, recurrent, torch.cat([head, tail], dim=2)):
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_prompt_continued_after_decoding_reads_the_ring_in_order_of_age(form):
    """Decoding writes each token over the ring's oldest slot (the ring then starts mid-way); a later prompt, a
    later decoding and packed documents across the calls still follow the reference."""
    q, k, v = _qkv(N=40)
    resets = torch.zeros(2, 40, dtype=torch.bool)
    resets[1, 21] = resets[0, 33] = True
    gamma, window = FORMS[form], 8
    expected = _dense_reference(q, k, v, window, gamma, resets=resets)
    outs, state, a = [], None, 0
    for b, run in ((10, window_causal_chunked), (23, window_causal_recurrent), (31, window_causal_chunked)):
        out, state = run(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], window, gamma=gamma, state=state, resets=resets[:, a:b]
        )
        outs.append(out)
        a = b
        if run is window_causal_recurrent:
            assert int(state.position[0]) == 13 % window  # the ring was left mid-way
    out, _ = window_causal_recurrent(
        q[:, :, a:], k[:, :, a:], v[:, :, a:], window, gamma=gamma, state=state, resets=resets[:, a:]
    )
    torch.testing.assert_close(torch.cat([*outs, out], dim=2), expected, rtol=1e-10, atol=1e-12)


def test_decoding_writes_into_the_ring_in_place_unless_gradients_flow():
    """O(1) per token: the returned state's ring is the given one's storage (no copy); with gradients the given
    state is left as it was, and the gradient of two steps reaches the inputs."""
    q, k, v = _qkv(N=12)
    _, state = window_causal_chunked(q[:, :, :10], k[:, :, :10], v[:, :, :10], 4, gamma=0.7)
    with torch.no_grad():
        _, after = window_causal_recurrent(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], 4, gamma=0.7, state=state)
    assert all(getattr(after, n).data_ptr() == getattr(state, n).data_ptr() for n in ("keys", "values", "carried"))
    _, state = window_causal_chunked(q[:, :, :10], k[:, :, :10], v[:, :, :10], 4, gamma=0.7)
    before = [t.clone() for t in state if t is not None]
    tail = [t[:, :, 10:].clone().requires_grad_(True) for t in (q, k, v)]
    out, _ = window_causal_recurrent(*tail, 4, gamma=0.7, state=state)
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, [t for t in state if t is not None], strict=True))
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in tail)


def _spiky(dtype, seed=3):
    """q, k, v with head 1's queries x 300: scores of several hundred (exp overflows even float64), features of
    e^-100 to 400; rows where the window dominates and rows where the older tokens do."""
    q, k, v = _qkv(N=41, d=8, dtype=torch.float64, seed=seed)
    q[:, 1] *= 300
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _hedgehog_features(q, k):
    maps = [HedgehogFeatureMap(3, q.shape[-1]).double() for _ in range(2)]
    with torch.no_grad():
        for m in maps:
            m.weight.normal_(generator=torch.Generator().manual_seed(7))
        return maps[0](q.double()).to(q.dtype), maps[1](k.double()).to(k.dtype)


@pytest.mark.parametrize("maps", ["elu+1", "hedgehog"])
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunked_and_recurrent_equal_the_reference_on_a_head_of_huge_scores(dtype, form, maps):
    """Float64 to 1e-10, float32 to 1e-5 (against the reference of the same float32 inputs); per-head gamma."""
    q, k, v = _spiky(dtype)
    gamma = None if FORMS[form] is None else torch.tensor([0.7, 0.9, 0.4], dtype=dtype)
    features = _hedgehog_features(q, k) if maps == "hedgehog" else None
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    for window in (1, 6, 17):
        expected = _dense_reference(q, k, v, window, gamma, features=features)
        assert torch.isfinite(expected).all()
        chunked, _ = window_causal_chunked(q, k, v, window, gamma=gamma, features=features, chunk_size=8)
        recurrent, _ = window_causal_recurrent(q, k, v, window, gamma=gamma, features=features)
        for out in (chunked, recurrent):
            assert out.dtype == dtype
            torch.testing.assert_close(out.double(), expected, **tol)


def test_the_huge_head_mixes_both_parts_so_the_reference_is_not_trivial():
    """On the spiky head some rows put most weight on the window, others on the older tokens."""
    q, k, v = _spiky(torch.float64)
    window = 6
    scores = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5)[:, 1]
    kernel = (_elu1(q) @ _elu1(k).transpose(-2, -1))[:, 1]
    t, j = torch.arange(41)[:, None], torch.arange(41)[None, :]
    top_window = scores.masked_fill(~((j <= t) & (j > t - window)), float("-inf")).amax(-1)
    older = torch.logsumexp(torch.log(kernel).masked_fill(~(j <= t - window), float("-inf")), -1)
    assert (top_window.abs() > 100).any()
    assert (older > top_window + 5).any() and (top_window > older + 5).any()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_per_head_window_factor_follows_the_reference(form):
    """The opt-in LoLCATs-style factor: c_h exp(s) on the window's terms, given as log c_h (here ln 0.1, 0, ln 30
    and, on the spiky head, factors that move rows between the parts); prompt then decoding."""
    q, k, v = _spiky(torch.float64)
    log_weight = torch.tensor([-2.3, 40.0, 3.4], dtype=torch.float64)
    gamma = FORMS[form]
    expected = _dense_reference(q, k, v, 6, gamma, log_weight=log_weight)
    assert (expected - _dense_reference(q, k, v, 6, gamma)).abs().amax() > 0.1  # the factor matters here
    kw = dict(gamma=gamma, window_log_weight=log_weight)
    chunked, _ = window_causal_chunked(q, k, v, 6, chunk_size=8, **kw)
    head, state = window_causal_chunked(q[:, :, :20], k[:, :, :20], v[:, :, :20], 6, **kw)
    tail, _ = window_causal_recurrent(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], 6, state=state, **kw)
    for out in (chunked, torch.cat([head, tail], dim=2)):
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_no_window_factor_is_the_default_and_a_zero_log_factor_changes_no_bit():
    q, k, v = _qkv(dtype=torch.float32)
    default, _ = window_causal_chunked(q, k, v, 5, gamma=0.7)
    zero, _ = window_causal_chunked(q, k, v, 5, gamma=0.7, window_log_weight=torch.zeros(3))
    assert torch.equal(default, zero)


def test_the_window_factor_gets_its_exact_gradient():
    q, k, v = _qkv(N=12, d=3)
    log_weight = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)

    def run(w):
        return window_causal_chunked(q, k, v, 3, gamma=0.6, chunk_size=5, window_log_weight=w)[0]

    assert torch.autograd.gradcheck(run, (log_weight,))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_window_as_long_as_the_sequence_is_exact_causal_softmax(form):
    q, k, v = _qkv()
    N, d = q.shape[2], q.shape[3]
    scores = (q @ k.transpose(-2, -1)) / d**0.5
    softmax = scores.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v
    for window in (N, N + 7):
        out, _ = window_causal_chunked(q, k, v, window, gamma=FORMS[form], chunk_size=6)
        torch.testing.assert_close(out, softmax, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_padding_and_packed_documents_follow_the_reference(form):
    """Left padding removes keys from both parts; a document start empties the state and bounds the window."""
    q, k, v = _qkv()
    B, H, N, _ = q.shape
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0, :3] = False
    resets = torch.zeros(B, N, dtype=torch.bool)
    resets[0, 7], resets[1, 15], resets[1, 16] = True, True, True
    rows = keep[:, None, :].expand(B, H, N)
    for window in (1, 4, 9):
        expected = _dense_reference(q, k, v, window, FORMS[form], keep, resets)
        chunks_of_1 = functools.partial(window_causal_chunked, chunk_size=1)  # 23 chunks: two blocks
        for run in (window_causal_chunked, chunks_of_1, window_causal_recurrent):
            out, _ = run(q, k, v, window, gamma=FORMS[form], key_mask=keep, resets=resets)
            torch.testing.assert_close(out[rows], expected[rows], rtol=1e-10, atol=1e-12)
            assert torch.equal(out[~rows], torch.zeros_like(out[~rows]))  # a padded query sees no key: 0


@pytest.mark.parametrize("form", sorted(FORMS))
def test_no_future_token_reaches_an_earlier_output(form):
    q, k, v = _qkv(dtype=torch.float32, N=40)
    before, _ = window_causal_chunked(q, k, v, 6, gamma=FORMS[form], chunk_size=16)
    for t in (39, 20):
        q2, k2, v2 = (x.clone() for x in (q, k, v))
        for x in (q2, k2, v2):
            x[:, :, t] += 3.0
        after, _ = window_causal_chunked(q2, k2, v2, 6, gamma=FORMS[form], chunk_size=16)
        assert torch.equal(after[:, :, :t], before[:, :, :t])
        assert not torch.equal(after[:, :, t], before[:, :, t])


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_decode_state_does_not_grow_with_the_context(form):
    sizes = []
    for n in (256, 1024):
        q, k, v = _qkv(B=1, H=2, N=n, d=8, dtype=torch.float32)
        _, state = window_causal_chunked(q, k, v, 16, gamma=FORMS[form])
        sizes.append(sum(t.untyped_storage().nbytes() for t in state if t is not None))  # no view of the prompt
    assert sizes[0] == sizes[1]


def test_learned_feature_maps_get_gradients_through_both_parts():
    q, k, v = (t.float().requires_grad_(True) for t in _qkv(N=30))
    maps = HedgehogFeatureMap(3, 4), HedgehogFeatureMap(3, 4)
    out, _ = window_causal_chunked(q, k, v, 5, gamma=torch.full((3,), 0.6), features=(maps[0](q), maps[1](k)))
    out.square().sum().backward()
    for t in (maps[0].weight.grad, maps[1].weight.grad, q.grad, k.grad, v.grad):
        assert t is not None and torch.isfinite(t).all() and t.abs().sum() > 0


@pytest.mark.parametrize("form", sorted(FORMS))
def test_float16_stays_finite_on_a_head_whose_scores_are_all_zero(form):
    q, k, v = (t.half() for t in _qkv(dtype=torch.float32, N=50))
    q[:, 0] = 0  # head 0: every score 0, every feature ELU + 1 (0) = 1
    k[:, 1] = -60  # head 1: scores of +-150 (exp(-f) of a frame far below 0 overflowed: 0 x inf = NaN)
    out, _ = window_causal_chunked(q, k, v, 8, gamma=FORMS[form], chunk_size=16)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    expected = _dense_reference(q.double(), k.double(), v.double(), 8, FORMS[form])
    # every head: head 1's ELU + 1 features of -30 are exp(-30) = 9e-14 in float32 too (they were 1 - 1 = 0)
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1e-2)


def test_a_state_of_another_shape_is_refused_in_one_line():
    q, k, v = _qkv()
    _, state = window_causal_chunked(q, k, v, 4)
    with pytest.raises(ValueError, match="does not fit window 5"):
        window_causal_chunked(q, k, v, 5, state=state)
    with pytest.raises(ValueError, match="window must be a positive"):
        window_causal_chunked(q, k, v, 0)


# ---- causal language models (transformers) ----


def _model(family: str, form: str, window: int | None, positions: int = 512):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=positions)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            max_position_embeddings=positions,
        )
        model = transformers.LlamaForCausalLM(config)
    model.eval().generation_config.pad_token_id = 0
    return model if form is None else linvit.convert(model, form, gamma_init=0.8, window=window)


LM_FORMS = ["katz_infsa", "katz_infsa:hedgehog", "linear_attention:hedgehog"]


def _left_padded(lengths, total, seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), total, dtype=torch.long)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, total - n :] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, total - n :] = 1
    return ids, mask


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("form", LM_FORMS)
def test_cached_decoding_equals_the_full_forward_over_300_tokens(form, family):
    """A left-padded batch of 2: a 300-token prompt in one call, then 6 tokens one by one from the cache (the
    ring and the states), each step's logits equal to one forward over everything, within 1e-5."""
    model = _model(family, form, window=16)
    ids, mask = _left_padded([306, 290], 306)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    transformers = pytest.importorskip("transformers")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        steps = [model(ids[:, :300], attention_mask=mask[:, :300], position_ids=positions[:, :300], cache=cache).logits]
        for t in range(300, 306):
            kw = dict(attention_mask=mask[:, : t + 1], position_ids=positions[:, t : t + 1], cache=cache)
            steps.append(model(ids[:, t : t + 1], **kw).logits)
    keep = mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[keep], full[keep], rtol=1e-5, atol=1e-5)
    assert type(cache.layers[0].state).__name__ == "WindowState"


@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_an_unpadded_prompt_builds_no_quadratic_mask_and_gives_what_the_explicit_causal_mask_gives(
    family, window, monkeypatch
):
    """The causal state forms take no mask where transformers' SDPA would skip one (causal, nothing padded): the
    layers receive None instead of a q x q mask to read and check, and the output is the one an explicit 4D causal
    mask gives; a padded batch still hands them its mask."""
    pytest.importorskip("transformers")
    from linvit.conversion import language_katz

    seen = []
    read_mask = language_katz.read_mask
    monkeypatch.setattr(language_katz, "read_mask", lambda mask, *a, **k: seen.append(mask) or read_mask(mask, *a, **k))
    model = _model(family, "katz_infsa:hedgehog", window)
    ids = torch.randint(1, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        skipped = model(ids).logits
        assert seen and all(m is None for m in seen)
        seen.clear()
        causal = torch.ones(40, 40, dtype=torch.bool).tril()[None, None].expand(2, 1, 40, 40)
        explicit = model(ids, attention_mask=causal).logits
        assert seen and all(m is not None for m in seen)
        torch.testing.assert_close(skipped, explicit, rtol=1e-6, atol=1e-6)
        seen.clear()
        padded, mask = _left_padded([40, 25], 40)
        model(padded, attention_mask=mask)
        assert seen and all(m is not None and not m.all() for m in seen)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_window_longer_than_the_text_gives_the_softmax_teacher(family):
    teacher = _model(family, None, None)
    ids = torch.randint(1, VOCAB, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = teacher(ids).logits
        student = linvit.convert(teacher, "katz_infsa:hedgehog", gamma_init=0.8, window=30)
        torch.testing.assert_close(student(ids, use_cache=False).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("form", ["katz_infsa", "linear_attention"])
def test_generate_greedy_and_beam_equal_the_run_without_a_cache(form, family):
    model = _model(family, form, window=4)
    ids, mask = _left_padded([12, 7], 12)
    for beams in (1, 3):
        kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, num_beams=beams)
        assert torch.equal(model.generate(ids, **kw), model.generate(ids, use_cache=False, **kw))


def test_the_ring_follows_beam_search_reorders():
    transformers = pytest.importorskip("transformers")
    model = _model("llama", "katz_infsa", window=3)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        cache.reorder_cache(torch.tensor([1, 1]))
        step = model(ids[:, :1], cache=cache, use_cache=True).logits[:, -1]
        full = model(torch.cat([ids[[1, 1]], ids[:, :1]], dim=1), use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_copies_and_reordered_rows_of_a_cache_decode_apart():
    """Decoding writes into the ring in place: the rows beam search's reorder duplicates and a deep copy of the
    cache must not share it. Each continuation equals one forward over its whole text."""
    import copy

    transformers = pytest.importorskip("transformers")
    model = _model("gpt2", "katz_infsa:hedgehog", window=3)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))
    new = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(6))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        cache.reorder_cache(torch.tensor([1, 1]))  # both rows now continue row 1, with different tokens
        twin = copy.deepcopy(cache)
        for run, tokens in ((cache, new), (twin, new.flip(0))):
            steps = [model(tokens[:, t : t + 1], cache=run, use_cache=True).logits for t in range(4)]
            full = model(torch.cat([ids[[1, 1]], tokens], dim=1), use_cache=False).logits[:, 9:]
            torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["katz_infsa", "linear_attention"])
def test_packed_documents_each_equal_the_document_alone(form):
    """Padding-free packing (position ids restarting): the window does not reach into the document before."""
    model = _model("llama", form, window=8)
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(1, VOCAB, (1, n), generator=g) for n in (40, 50, 30)]
    ids = torch.cat(docs, dim=1)
    positions = torch.cat([torch.arange(d.shape[1]) for d in docs])[None]
    with torch.no_grad():
        packed = model(ids, position_ids=positions, use_cache=False).logits
        start = 0
        for doc in docs:
            alone = model(doc, use_cache=False).logits
            torch.testing.assert_close(packed[:, start : start + doc.shape[1]], alone, rtol=1e-5, atol=1e-5)
            start += doc.shape[1]


def test_the_decode_state_of_a_model_is_the_same_size_at_256_and_1024_tokens():
    transformers = pytest.importorskip("transformers")
    model = _model("llama", "katz_infsa:hedgehog", window=16, positions=1100)
    sizes = []
    for n in (256, 1024):
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.randint(1, VOCAB, (1, n)), cache=cache)
        sizes.append(sum(t.untyped_storage().nbytes() for layer in cache.layers for t in layer.state if t is not None))
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("window", [None, 4])
def test_a_cache_filled_with_gradients_on_keeps_no_graph(window):
    """Training with a cache detaches the state it keeps (no graph held across steps): the detach calls are
    skipped only where no state tensor requires grad (a decoding step under no_grad)."""
    transformers = pytest.importorskip("transformers")
    model = _model("gpt2", "katz_infsa:hedgehog", window=window).train()
    cache = transformers.DynamicCache(config=model.config)
    model(torch.randint(1, VOCAB, (2, 12)), cache=cache, use_cache=True).logits.sum().backward()
    states = [t for layer in cache.layers for t in layer.state if t is not None]
    assert states and not any(t.requires_grad or t.grad_fn is not None for t in states)


def test_gradients_reach_the_learned_maps_of_a_windowed_model():
    model = _model("gpt2", "katz_infsa:hedgehog", window=4)
    model(torch.randint(1, VOCAB, (2, 20)), use_cache=False).logits.square().mean().backward()
    layer = model.transformer.h[0].attn
    for p in (layer.infsa_feature_q.weight, layer.infsa_feature_k.weight, layer.infsa_theta):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_converting_again_with_another_window_applies_it():
    model = _model("gpt2", "katz_infsa", window=4)
    ids = torch.randint(1, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        linvit.convert(model, "katz_infsa", gamma_init=0.8, window=9)
        fresh = _model("gpt2", "katz_infsa", window=9)
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits)
    assert linvit.convert_report(model).window == 9
    assert {m.infsa_window for m in model.modules() if hasattr(m, "infsa_window")} == {9}


def test_a_window_on_a_vision_model_or_a_form_without_state_is_refused_in_one_line():
    import timm

    vit = timm.create_model("vit_4l_patch16_224", depth=1, embed_dim=32, num_heads=2, num_classes=3)
    with pytest.raises(ValueError, match="InfViT is not a causal language model") as err:
        linvit.convert(vit, "katz_infsa", window=8)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="positive whole number"):
        linvit.convert(vit, "katz_infsa", window=0)
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="under pure_infsa has no causal state"):
        _model("gpt2", "pure_infsa", window=8)
    # the ring holds W slots from the first token on: a window past the model's positions is refused, not allocated
    with pytest.raises(ValueError, match="window=10000 is longer than the model's 512 positions"):
        _model("llama", "katz_infsa:hedgehog", window=10_000)
    assert _model("gpt2", "katz_infsa:hedgehog", window=512) is not None  # as long as the context: allowed


def test_distill_keeps_the_window_and_feature_dim_and_load_run_rebuilds_them(tmp_path):
    transformers = pytest.importorskip("transformers")
    from linvit.distillation import DistillConfig, run_distill

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=1, n_head=4)
    config.bos_token_id = config.eos_token_id = 0
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    run = DistillConfig(
        teacher=f"hf:{tmp_path / 'gpt2'}",
        data=str(tmp_path / "text.txt"),
        output=str(tmp_path / "run"),
        mixer="katz_infsa:hedgehog",
        feature_dim=3,
        window=5,
        context=16,
        epochs=1,
        transfer_epochs=1,
        workers=0,
        device="cpu",
        progress=False,
        batch_size=4,
    )
    student = run_distill(run)
    reloaded = linvit.load_run(tmp_path / "run")
    layer = reloaded.transformer.h[0].attn
    assert layer.infsa_window == 5 and layer.infsa_feature_q.weight.shape[-1] == 3
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, student(ids).logits)
