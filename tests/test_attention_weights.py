"""Attention transfer's attention-weight loss (distillation.attention_weights, Hedgehog's CE): both weight
matrices against float64 references written out here, its minimum, gradients, causality, the sampled query
blocks' unbiasedness, refusals, and runs through DistillConfig + run_distill."""

from __future__ import annotations

import json

import pytest
import torch

from linvit.distillation import DistillConfig, load_teacher, make_student, run_distill
from linvit.distillation.attention_weights import (
    FULL_MAX_TOKENS,
    QUERY_BLOCK,
    Recorded,
    cross_entropy,
    layer_weight_loss,
    query_rows,
    student_log_weights,
    teacher_log_weights,
)
from linvit.distillation.transfer import LayerTaps, layer_pairs
from linvit.errors import UsageError

TINY_VIT = {"patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}
RUNTIME = {"workers": 0, "device": "cpu", "progress": False, "batch_size": 8}


def _softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    e = torch.exp(scores - scores.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def _recorded_step(teacher, student, inputs, **call):
    """One substituted attention-transfer step; returns the taps and each layer's Recorded (not yet consumed)."""
    taps = LayerTaps(layer_pairs(teacher, student), weights=True)
    with taps.active(substitute=True):
        with torch.no_grad():
            teacher(inputs, **call)
        student(inputs, **call)
        recorded = [layer.recorded() for layer in taps.weights.layers]
    return taps, recorded


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_vision_weights_match_float64_references_and_the_layers_output(eps):
    """Teacher: softmax of the timm layer's own q k^T * scale; student (linear attention, learned map): the
    Hedgehog features' products normalised with the layer's own eps, and those weights applied to v give the
    layer's output."""
    torch.manual_seed(0)
    teacher = load_teacher("vit_4l_patch16_224", model_kwargs=TINY_VIT, img_size=[32]).model.double()
    student = make_student(teacher, "linear_attention:hedgehog")
    with torch.no_grad():  # a trained-looking map: not the identity it starts as
        for name, p in student.named_parameters():
            if "feature_" in name:
                p.add_(torch.randn_like(p))
    for m in student.modules():
        if hasattr(m, "feature_q"):
            m.eps = eps
    taps, recorded = _recorded_step(teacher, student, torch.randn(2, 3, 32, 32, dtype=torch.float64))
    for i, (_, t_layer, s_layer) in enumerate(taps.pairs):
        x, r = taps.teacher_in[i], recorded[i]
        B, N, C = x.shape
        H, d = t_layer.num_heads, C // t_layer.num_heads
        q, k, v = t_layer.qkv(x).reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
        expected_soft = _softmax_rows(q @ k.transpose(-2, -1) * t_layer.scale)
        torch.testing.assert_close(teacher_log_weights(r.teacher_q, r.teacher_k, r.teacher_scale, False).exp(),
                                   expected_soft, rtol=1e-12, atol=1e-14)  # fmt: skip
        sq, sk, sv = s_layer.qkv(x).reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4)

        def hedgehog(t, w):
            z = torch.einsum("bhnd,hdf->bhnf", t, w)
            return torch.cat([_softmax_rows(z), _softmax_rows(-z)], -1)

        a = hedgehog(sq, s_layer.feature_q.weight) @ hedgehog(sk, s_layer.feature_k.weight).transpose(-2, -1)
        expected_lin = a / (a.sum(-1, keepdim=True) + eps)
        lin = student_log_weights(r.fq, r.fk, False, eps=r.eps).exp()
        torch.testing.assert_close(lin, expected_lin, rtol=1e-12, atol=1e-14)
        out = s_layer.proj((lin @ sv).transpose(1, 2).reshape(B, N, C))
        torch.testing.assert_close(out, taps.student_out[i], rtol=1e-10, atol=1e-12)
        assert not torch.allclose(lin, expected_soft, atol=1e-3)  # the two matrices differ: the test can fail


def test_language_teacher_weights_are_its_attention_and_it_computes_as_before():
    """GPT-2 (eager, so it returns its weights): the recorded queries and keys give exactly its attention
    probabilities; the teacher's logits are unchanged under the tap and its implementation is restored."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0)
    cfg.eos_token_id = 0
    teacher = transformers.GPT2LMHeadModel(cfg).eval().double()
    teacher.set_attn_implementation("eager")
    student = make_student(teacher, "katz_infsa:hedgehog", 0.5, None, 4)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        before = teacher(ids)
    taps = LayerTaps(layer_pairs(teacher, student), weights=True)
    with taps.active(substitute=True):
        with torch.no_grad():
            out = teacher(ids, output_attentions=True)
        student(ids)
        recorded = [layer.recorded() for layer in taps.weights.layers]
    assert teacher.config._attn_implementation == "eager"
    torch.testing.assert_close(out.logits, before.logits, rtol=0, atol=0)
    for r, probabilities in zip(recorded, out.attentions, strict=True):
        weights = teacher_log_weights(r.teacher_q, r.teacher_k, r.teacher_scale, causal=True).exp()
        torch.testing.assert_close(weights, probabilities, rtol=1e-10, atol=1e-12)
        assert r.window == 4 and r.causal


@pytest.mark.parametrize("window", [None, 3])
def test_causal_student_weights_give_the_ops_output(window):
    """Causal linear attention and the sliding-window hybrid: the weights applied to v are ops' outputs (float64)."""
    from linvit.ops.linear_causal import causal_linear_dense
    from linvit.ops.window_causal import window_causal_chunked

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 11, 4, dtype=torch.float64, generator=g) for _ in range(3))
    fq, fk = (torch.softmax(torch.randn(2, 2, 11, 6, dtype=torch.float64, generator=g), -1) for _ in range(2))
    weights = student_log_weights(fq, fk, True, None, window, q, k, 0.5).exp()
    if window is None:
        expected = causal_linear_dense(fq, fk, v, 1e-6, "identity")
    else:
        expected = window_causal_chunked(q, k, v, window, scale=0.5, features=(fq, fk))[0]
    torch.testing.assert_close(weights @ v, expected, rtol=1e-10, atol=1e-12)
    assert (weights.triu(1) == 0).all() and torch.allclose(weights.sum(-1), torch.ones(2, 2, 11, dtype=torch.float64))


def test_cross_entropy_is_the_teachers_entropy_when_the_student_is_the_teacher():
    """A window covering every key is exact causal softmax: CE = H, the loss 0; a linear student is above."""
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=g) for _ in range(2))
    fq, fk = (torch.softmax(torch.randn(1, 2, 9, 4, dtype=torch.float64, generator=g), -1) for _ in range(2))
    teacher = teacher_log_weights(q, k, 0.5, causal=True)
    ce, entropy = cross_entropy(teacher, student_log_weights(fq, fk, True, None, 9, q, k, 0.5))
    p = teacher.exp()
    expected = -(p * torch.where(p > 0, p.log(), 0.0)).sum(-1).mean()
    torch.testing.assert_close(ce, entropy, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(entropy, expected, rtol=1e-12, atol=0)
    ce, entropy = cross_entropy(teacher, student_log_weights(fq, fk, True))
    assert ce > entropy + 1e-3
    r = Recorded(q, k, 0.5, q, k, fq, fk, 0.5, window=9, causal=True)
    assert abs(float(layer_weight_loss(r))) < 1e-12


@pytest.mark.parametrize("mixer", ["katz_infsa:hedgehog", "katz_rows:hedgehog"])
def test_gradients_reach_the_feature_maps_and_not_the_teacher_copy(mixer):
    torch.manual_seed(0)
    teacher = load_teacher("vit_4l_patch16_224", model_kwargs=TINY_VIT, img_size=[32]).model
    student = make_student(teacher, mixer, 0.5)
    taps = LayerTaps(layer_pairs(teacher, student), weights=True)
    with taps.active(substitute=True):
        with torch.no_grad():
            teacher(torch.randn(2, 3, 32, 32))
        student(torch.randn(2, 3, 32, 32))
        taps.transfer_loss("xent").backward()
    for _, _, layer in taps.pairs:
        for m in (layer.feature_q, layer.feature_k):
            assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0
    assert all(p.grad is None for layer in taps.weights.layers for p in layer.frozen.parameters())
    assert student.patch_embed.proj.weight.grad is None  # the student's layers read the teacher's inputs


def test_a_future_token_does_not_change_earlier_queries_loss():
    """Causal LM student (Katz + window): changing the tokens after t leaves every query before t's CE and
    entropy bit-identical, and changes the later ones."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0)
    cfg.eos_token_id = 0
    teacher = transformers.GPT2LMHeadModel(cfg).eval()
    student = make_student(teacher, "katz_infsa:hedgehog", 0.5, None, 3)
    ids = torch.randint(0, 64, (1, 16))
    changed = ids.clone()
    changed[:, 9:] = (changed[:, 9:] + 7) % 64

    def per_query(tokens, rows):
        r = _recorded_step(teacher, student, tokens)[1][0]
        teacher_log = teacher_log_weights(r.teacher_q, r.teacher_k, r.teacher_scale, True, rows)
        student_log = student_log_weights(r.fq, r.fk, True, rows, r.window, r.q, r.k, r.scale)
        return torch.stack(cross_entropy(teacher_log, student_log))

    early, late = torch.arange(9), torch.arange(9, 16)
    assert torch.equal(per_query(ids, early), per_query(changed, early))
    assert not torch.equal(per_query(ids, late), per_query(changed, late))


def test_sampled_query_blocks_estimate_the_full_loss_without_bias():
    assert query_rows(FULL_MAX_TOKENS, "cpu") is None
    rows = query_rows(FULL_MAX_TOKENS + 1, "cpu")
    assert rows.shape == (QUERY_BLOCK,) and rows.unique().numel() == QUERY_BLOCK
    g = torch.Generator().manual_seed(3)
    N = FULL_MAX_TOKENS + 76
    q, k = (2 * torch.randn(1, 1, N, 4, generator=g) for _ in range(2))
    fq, fk = (torch.softmax(torch.randn(1, 1, N, 4, generator=g), -1) for _ in range(2))
    record = Recorded(q, k, 0.5, q, k, fq, fk, causal=True)
    ce, entropy = cross_entropy(teacher_log_weights(q, k, 0.5, True), student_log_weights(fq, fk, True))
    full = float(ce - entropy)
    torch.manual_seed(0)
    samples = torch.stack([layer_weight_loss(record) for _ in range(100)]).double()
    spread = float(samples.std()) / 100**0.5
    assert spread > 0  # the blocks do differ
    assert abs(float(samples.mean()) - full) < 4 * spread


@pytest.mark.parametrize("mixer", ["pure_infsa", "linear_infsa"])
def test_a_form_without_row_stochastic_weights_is_refused_in_one_line(mixer):
    with pytest.raises(UsageError) as err:
        DistillConfig(teacher="t", data="d", output="o", mixer=mixer, transfer_loss="mse+xent")
    assert "\n" not in str(err.value) and mixer in str(err.value)
    with pytest.raises(UsageError, match="use it with linear_attention:hedgehog or katz_infsa:hedgehog"):
        DistillConfig(teacher="t", data="d", output="o", mixer=mixer, transfer_loss="xent")  # forms xent takes
    with pytest.raises(UsageError, match="transfer_loss must be one of mse, xent, mse\\+xent"):
        DistillConfig(teacher="t", data="d", output="o", transfer_loss="kl")
    assert DistillConfig(teacher="t", data="d", output="o", mixer=mixer).transfer_loss == "mse"


def test_the_weight_loss_alone_needs_a_learned_map_and_trains_only_it():
    with pytest.raises(UsageError, match="learned feature maps alone.*katz_infsa:hedgehog"):
        DistillConfig(teacher="t", data="d", output="o", mixer="katz_infsa", transfer_loss="xent")
    DistillConfig(teacher="t", data="d", output="o", mixer="katz_infsa", transfer_loss="mse+xent")


def vision_transfer(tmp_path, **changes) -> DistillConfig:
    """Attention transfer alone into a tiny ViT's linear_attention:hedgehog student, on a tiny picture folder."""
    from linvit.data import build_cluttered_mnist

    build_cluttered_mnist(tmp_path / "d", canvas=32, per_class_train=2, per_class_val=1, clutter=1, progress=False)
    config = DistillConfig(
        teacher="vit_4l_patch16_224",
        model_kwargs=TINY_VIT,
        data=str(tmp_path / "d"),
        output=str(tmp_path / "run"),
        mixer="linear_attention:hedgehog",
        stages="attention",
        img_size=[32],
        **RUNTIME,
    )
    return config.replace(**changes)


def test_vision_transfer_with_the_weight_loss_runs_and_is_stored(tmp_path):
    config = vision_transfer(tmp_path, transfer_loss="mse+xent", transfer_epochs=2, transfer_lr=1e-2)
    run_distill(config)
    assert "transfer_loss: mse+xent" in (tmp_path / "run" / "args.yaml").read_text()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in rows)
    with pytest.raises(UsageError, match="transfer.loss"):  # attention transfer holds its loss against a resume
        run_distill(config.replace(transfer_loss="mse", transfer_epochs=3, resume="auto"))


def test_a_run_from_before_the_option_resumes_as_the_mse_it_ran(tmp_path):
    """A checkpoint whose args have no transfer_loss (written before the option) ran with MSE: resuming it with
    another loss is refused in one line, with MSE it continues."""
    config = vision_transfer(tmp_path, transfer_epochs=1)
    run_distill(config)
    last = tmp_path / "run" / "last.pth"
    checkpoint = torch.load(last, weights_only=False)
    del checkpoint["args"]["transfer_loss"]
    torch.save(checkpoint, last)
    with pytest.raises(UsageError, match="transfer.loss mse -> mse.xent"):
        run_distill(config.replace(transfer_loss="mse+xent", transfer_epochs=2, resume="auto"))
    run_distill(config.replace(transfer_epochs=2, resume="auto"))
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in rows] == [0, 1]


def test_language_transfer_with_the_weight_loss_lowers_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    cfg.bos_token_id = cfg.eos_token_id = 0
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "text.txt").write_text(" ".join(f"token{i % 37} word{i % 11}" for i in range(600)), encoding="utf-8")
    config = DistillConfig(
        teacher=f"hf:{tmp_path / 'gpt2'}",
        data=str(tmp_path / "text.txt"),
        output=str(tmp_path / "run"),
        mixer="katz_infsa:hedgehog",
        window=4,
        stages="attention",
        transfer_loss="xent",
        transfer_epochs=2,
        transfer_lr=1e-2,
        context=32,
        train_windows=16,
        **RUNTIME,
    )
    student = run_distill(config)
    assert "transfer_loss: xent" in (tmp_path / "run" / "args.yaml").read_text()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    torch.manual_seed(0)
    before = make_student(transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2"), config.mixer, 0.5, None, 4)
    before = before.state_dict()
    changed = {k for k, v in student.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(".infsa_feature_" in k for k in changed)  # the maps alone: Hedgehog's stage


def test_gradients_are_finite_where_keys_are_masked_or_features_zero():
    """Future keys (-inf log weights) and exact zero products (ReLU features) send no NaN into the gradient."""
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(1, 2, 10, 4, generator=g) for _ in range(2))
    raw = torch.randn(1, 2, 10, 4, generator=g).requires_grad_(True)
    teacher = teacher_log_weights(q, k, 0.5, True)
    for window in (None, 2):
        features = torch.relu(raw)
        assert (features == 0).any()
        ce, _ = cross_entropy(teacher, student_log_weights(features, features, True, None, window, q, k, 0.5))
        (grad,) = torch.autograd.grad(ce, raw)
        assert torch.isfinite(ce) and torch.isfinite(grad).all() and grad.abs().sum() > 0
