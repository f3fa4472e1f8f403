"""`linvit distill` (issue 36 part 1) on tiny random teachers of every kind (timm name, run folder, torchvision,
Hugging Face image classifier and causal LM; nothing is downloaded): attention transfer trains only the converted
layers, each on its teacher layer's input; the end-to-end loss is the softened KL; the final folder loads back
as the student; LoRA merges; mismatched teachers and data fail in one line."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import sklearn.datasets
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file as safetensors_load

import linvit
from linvit.distillation import DistillConfig, load_teacher, make_student, run_distill
from linvit.distillation.recipe import IMAGE_MIXER
from linvit.distillation.task import soft_target_loss, stage_configs
from linvit.distillation.text import TokenWindows
from linvit.distillation.transfer import LayerTaps, layer_pairs
from linvit.errors import UsageError
from linvit_cli import main as cli_main

PHOTO = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"  # a real photograph scikit-learn ships
TINY_VIT = {"patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}
RUNTIME = {"workers": 0, "device": "cpu", "progress": False, "batch_size": 8}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from linvit.data import build_cluttered_mnist

    root = tmp_path_factory.mktemp("distilldata")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=1, progress=False)
    return root


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    import ast
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "" for p in sorted(root.glob("a*.py"))]
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n\n".join(docs)[:6000], encoding="utf-8")
    return path


def _vit_teacher():
    return load_teacher("vit_4l_patch16_224", model_kwargs=TINY_VIT, img_size=[32])


def _gpt2_model(tmp_path):
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(_gpt2_folder(tmp_path))


def _gpt2_folder(tmp_path, layers: int = 2):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=layers, n_head=4)
    cfg.bos_token_id = cfg.eos_token_id = 0
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_soft_target_loss_is_the_softened_kl_times_t_squared():
    torch.manual_seed(0)
    s, t = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    p, q = F.softmax(t / 2, -1), F.softmax(s / 2, -1)
    expected = (p * (p.log() - q.log())).sum(-1).mean() * 4
    assert torch.allclose(soft_target_loss(s, t, 2.0).double(), expected, rtol=1e-6)
    assert soft_target_loss(t, t, 3.0).abs() < 1e-6
    tokens = torch.randn(2, 3, 5)  # language: (B, T, V) is flattened over positions
    assert torch.allclose(
        soft_target_loss(tokens, tokens.flip(0), 1.0),
        soft_target_loss(tokens.flatten(0, 1), tokens.flip(0).flatten(0, 1), 1.0),
    )


def test_each_student_layer_sees_its_teacher_layers_input():
    """With substitution every converted layer's recorded output is that layer applied to the teacher layer's
    input; the transfer loss is the mean relative MSE over layers, and zero for an unconverted copy."""
    teacher = _vit_teacher().model
    student = make_student(teacher, "katz_infsa")
    pairs = layer_pairs(teacher, student)
    assert [name for name, _, _ in pairs] == ["blocks.0.attn", "blocks.1.attn"]
    taps = LayerTaps(pairs)
    x = torch.randn(3, 3, 32, 32)
    with taps.active(substitute=True):
        with torch.no_grad():
            teacher(x)
        student(x)
        inputs = dict(taps.teacher_in)
        outputs, targets = dict(taps.student_out), dict(taps.teacher_out)
        loss = taps.loss()
    for i, (_, _, layer) in enumerate(pairs):
        torch.testing.assert_close(outputs[i], layer(inputs[i]), rtol=0, atol=0)
    expected = sum(((outputs[i] - targets[i]) ** 2).mean() / (targets[i] ** 2).mean() for i in range(2)) / 2
    torch.testing.assert_close(loss, expected)
    assert not [h for _, t, s in pairs for h in (*t._forward_hooks, *s._forward_pre_hooks)]  # hooks removed


def test_attention_transfer_trains_only_the_converted_layers_and_lowers_its_loss(digits, tmp_path):
    config = DistillConfig(
        teacher="vit_4l_patch16_224",
        model_kwargs=TINY_VIT,
        data=str(digits),
        output=str(tmp_path / "run"),
        stages="attention",
        transfer_epochs=4,
        transfer_lr=3e-3,
        img_size=[32],
        **RUNTIME,
    )
    student = run_distill(config)
    torch.manual_seed(0)  # the run's seed: the same random teacher
    teacher = _vit_teacher().model
    before = make_student(teacher, IMAGE_MIXER).state_dict()  # the default ("auto") for an image teacher
    changed = {k for k, v in student.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(".attn." in k for k in changed)  # only converted layers moved
    assert any("attn.qkv" in k for k in changed)
    assert any("attn.feature_q" in k for k in changed) and any("attn.feature_k" in k for k in changed)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    # the size it learned at (--img-size), not the timm teacher's 224: eval and predict preprocess as it trained
    assert tuple(linvit.load_run(tmp_path / "run").pretrained_cfg["input_size"]) == (3, 32, 32)
    assert {"val_top1", "teacher_val_top1", "retention", "images_per_second"} <= set(rows[-1])


def test_map_lr_gives_the_learned_maps_their_own_rate_and_resumes_bit_exactly(digits, tmp_path):
    """--map-lr: attention transfer trains the :hedgehog maps in param groups of their own at map_lr / transfer_lr
    times every lr of the schedule; a resumed run rebuilds the same groups and continues bit for bit."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "katz_rows:hedgehog", "--stages", "attention"]
    argv += ["--transfer-lr", "1e-3", "--map-lr", "1e-2", "--warmup-epochs", "1", "--workers", "0"]
    argv += ["--device", "cpu", "--no-progress", "--batch-size", "8"]
    assert cli_main([*argv, "--transfer-epochs", "2", "--output", str(tmp_path / "full")]) == 0
    assert cli_main([*argv, "--transfer-epochs", "1", "--output", str(tmp_path / "cut")]) == 0
    assert cli_main([*argv, "--transfer-epochs", "2", "--output", str(tmp_path / "cut"), "--resume", "auto"]) == 0
    state = torch.load(tmp_path / "full" / "last.pth", weights_only=False)
    groups = state["optimizer"]["param_groups"]
    maps = [k for k in state["model"] if ".feature_q." in k or ".feature_k." in k]
    assert maps and sum(len(g["params"]) for g in groups if g.get("lr_scale") == 10) == len(maps)
    assert all(g.get("lr_scale") in (None, 10) for g in groups)
    rest, scaled = ([g["lr"] for g in groups if g.get("lr_scale") == s] for s in (None, 10))
    assert len(set(rest)) == 1 and scaled == pytest.approx([10 * rest[0]] * len(scaled), rel=1e-12)
    full, cut = (safetensors_load(tmp_path / run / "model.safetensors") for run in ("full", "cut"))
    assert full.keys() == cut.keys() and all(torch.equal(full[k], cut[k]) for k in full)


def test_a_resume_with_a_new_transfer_lr_keeps_the_maps_at_map_lr(digits, tmp_path):
    """The saved groups carry the old map_lr / transfer_lr: a resume on a new --transfer-lr (a schedule change it
    allows) puts this run's factor back, so the maps train at --map-lr, not at new / old times it."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "katz_rows:hedgehog", "--stages", "attention"]
    argv += ["--map-lr", "1e-2", "--workers", "0", "--device", "cpu", "--no-progress", "--batch-size", "8"]
    argv += ["--output", str(tmp_path / "run")]
    assert cli_main([*argv, "--transfer-lr", "1e-3", "--transfer-epochs", "1"]) == 0
    assert cli_main([*argv, "--transfer-lr", "2e-3", "--transfer-epochs", "2", "--resume", "auto"]) == 0
    groups = torch.load(tmp_path / "run" / "last.pth", weights_only=False)["optimizer"]["param_groups"]
    assert sorted({g.get("lr_scale") for g in groups}, key=str) == [5.0, None]


@pytest.mark.parametrize("field, flag, value, shown", [("map_lr", "--map-lr", "1e-2", "0.01"),
                                                       ("gamma_lr", "--gamma-lr", "1e-1", "0.1")])  # fmt: skip
def test_a_run_from_before_a_rate_option_resumed_with_it_is_refused_in_one_line(
    digits, tmp_path, capsys, field, flag, value, shown
):
    """A checkpoint written before --map-lr / --gamma-lr existed ran without it (DistillConfig.ABSENT_MEANS):
    asking for it on resume is a changed setting, refused before the optimizer's groups disagree (a traceback);
    resumed without it, it goes on."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "katz_rows:hedgehog", "--stages", "attention"]
    argv += ["--workers", "0", "--device", "cpu", "--no-progress", "--batch-size", "8", "--output", str(tmp_path)]
    assert cli_main([*argv, "--transfer-epochs", "1"]) == 0
    state = torch.load(tmp_path / "last.pth", weights_only=False)
    del state["args"][field]  # as an older linvit wrote it
    torch.save(state, tmp_path / "last.pth")
    capsys.readouterr()
    assert cli_main([*argv, "--transfer-epochs", "2", flag, value, "--resume", "auto"]) == 2
    assert f"{flag} none -> {shown}" in capsys.readouterr().err
    assert cli_main([*argv, "--transfer-epochs", "2", "--resume", "auto"]) == 0


def test_map_lr_scales_the_maps_in_attention_transfer_only():
    """The end-to-end stage trains every weight at --lr: no group of its own for the maps there."""
    from linvit.distillation.task import Distillation
    from linvit.layers.feature_maps import HedgehogFeatureMap

    student = make_student(_vit_teacher().model, "katz_rows:hedgehog", 0.5)
    maps = {p for m in student.modules() if isinstance(m, HedgehogFeatureMap) for p in m.parameters()}
    config = DistillConfig(teacher="t", data="d", output="o", mixer="katz_rows:hedgehog", map_lr=1e-2)
    transfer = Distillation("attention").lr_scales(student, config.replace(lr=2e-3))
    assert maps and set(transfer) == maps and list(transfer.values()) == pytest.approx([5.0] * len(maps))
    assert Distillation("end-to-end").lr_scales(student, config) == {}


def test_gamma_lr_gives_every_discount_its_own_rate_in_attention_transfer_only():
    """--gamma-lr: each converted layer's theta = logit(gamma) at gamma_lr / transfer_lr, beside --map-lr's maps;
    nothing else is scaled, and the end-to-end stage trains everything at --lr."""
    from linvit.distillation.task import Distillation, discount_logits
    from linvit.layers.feature_maps import HedgehogFeatureMap

    student = make_student(_vit_teacher().model, "katz_rows:hedgehog", 0.5)
    thetas = {p for n, p in student.named_parameters() if n.endswith(".theta")}
    maps = {p for m in student.modules() if isinstance(m, HedgehogFeatureMap) for p in m.parameters()}
    assert len(thetas) == TINY_VIT["depth"] and set(discount_logits(student)) == thetas
    config = DistillConfig(teacher="t", data="d", output="o", mixer="katz_rows:hedgehog", gamma_lr=1e-1, lr=2e-3)
    scales = Distillation("attention").lr_scales(student, config)
    assert set(scales) == thetas and list(scales.values()) == pytest.approx([50.0] * len(thetas))
    both = Distillation("attention").lr_scales(student, config.replace(map_lr=1e-2))
    assert [both[p] for p in thetas] == pytest.approx([50.0] * len(thetas))
    assert [both[p] for p in maps] == pytest.approx([5.0] * len(maps))
    assert Distillation("end-to-end").lr_scales(student, config) == {}
    with pytest.raises(UsageError, match="--gamma-lr: the katz_rows:hedgehog student has no trainable discount"):
        Distillation("attention").lr_scales(nn.Linear(2, 2), config)  # a registered mixer keeping it elsewhere


def test_a_language_students_discounts_are_found(tmp_path):
    pytest.importorskip("transformers")
    from linvit.distillation.task import discount_logits

    lm = linvit.convert(_gpt2_model(tmp_path), "katz_infsa", gamma_init=0.5)  # conversion.language's infsa_theta
    assert [p.shape for p in discount_logits(lm)] == [torch.Size([4])] * 2


def test_a_learned_discount_moves_at_gamma_lr(digits, tmp_path, capsys):
    """At --gamma-lr 0.1 the discount leaves its start in a few steps (Adam: about the rate a step on theta, so
    100 times the transfer rate's move)."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "katz_rows", "--stages", "attention"]
    argv += ["--transfer-lr", "1e-3", "--transfer-epochs", "3", "--workers", "0", "--device", "cpu"]
    argv += ["--no-progress", "--batch-size", "8"]
    moved = {}
    for name, extra in (("slow", []), ("fast", ["--gamma-lr", "1e-1"])):
        assert cli_main([*argv, *extra, "--output", str(tmp_path / name)]) == 0
        weights = safetensors_load(tmp_path / name / "model.safetensors")
        gammas = torch.cat([torch.sigmoid(v) for k, v in weights.items() if k.endswith(".theta")])
        moved[name] = (gammas - 0.5).abs().max().item()
    assert moved["fast"] > 0.05 and moved["fast"] > 30 * moved["slow"], moved
    capsys.readouterr()
    resumed = [*argv, "--gamma-lr", "3e-2", "--output", str(tmp_path / "fast"), "--resume", "auto"]
    assert cli_main(resumed) == 2  # a changed rate of a finished stage's discounts: refused, not silently kept
    assert "--gamma-lr 0.1 -> 0.03" in capsys.readouterr().err


def test_gamma_lr_is_refused_where_there_is_no_discount(digits, tmp_path, capsys):
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--data", str(digits), "--output", str(tmp_path / "run")]
    assert cli_main([*argv, "--mixer", "linear_attention:hedgehog", "--gamma-lr", "1e-1"]) == 2
    assert "linear_attention:hedgehog has no discount" in capsys.readouterr().err
    assert cli_main([*argv, "--mixer", "katz_rows:hedgehog", "--transfer-loss", "xent", "--gamma-lr", "1e-1"]) == 2
    assert "only the learned maps train, not the discount" in capsys.readouterr().err
    for bad in (0.0, math.inf, True):
        with pytest.raises(UsageError, match="gamma_lr must be a finite learning rate"):
            DistillConfig(teacher="t", data="d", output="o", mixer="katz_rows", gamma_lr=bad)


def test_distill_mistakes_are_one_line_before_any_notice(digits, tmp_path, capsys):
    """A teacher that does not exist is named before the lines about its kind or random weights; --gamma-lr on the
    form --mixer auto chose says so; one explicit checkpoint for two stages is refused before either trains (it
    was the optimizer's traceback after attention transfer)."""
    out = ["--output", str(tmp_path / "run")]
    typos = [(str(tmp_path / "teachr"), "no such file or folder"), ("vit_4l_patch16_22", "unknown model")]
    for typo, phrase in [*typos, ("torchvision:resnet_typo", "torchvision has no model 'resnet_typo'")]:
        assert cli_main(["distill", "--teacher", typo, "--data", str(digits), *out]) == 2
        err = capsys.readouterr().err
        assert phrase in err and "random weights" not in err and "an image teacher" not in err
    teacher = ["distill", "--teacher", "vit_4l_patch16_224", "--data", str(digits), *out]
    assert cli_main([*teacher, "--gamma-lr", "1e-1"]) == 2
    assert (
        "(--mixer auto chose linear_attention:hedgehog for an image teacher: name a --mixer)" in capsys.readouterr().err
    )
    assert cli_main([*teacher, "--mixer", "katz_rows", "--resume", str(tmp_path / "last.pth")]) == 2
    err = capsys.readouterr().err
    assert "one checkpoint, but this run has two stages" in err and "--resume auto" in err
    assert not (tmp_path / "run").exists()


def test_map_lr_is_refused_where_there_is_no_learned_map(digits, tmp_path, capsys):
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--data", str(digits), "--mixer", "katz_infsa"]
    assert cli_main([*argv, "--map-lr", "1e-2", "--output", str(tmp_path / "run")]) == 2
    assert "katz_infsa has no learned feature map" in capsys.readouterr().err
    xent = [*argv[:-1], "katz_rows:hedgehog", "--transfer-loss", "xent", "--map-lr", "1e-2"]
    assert cli_main([*xent, "--output", str(tmp_path / "run")]) == 2  # the maps alone train: one rate
    assert "give their rate as transfer_lr" in capsys.readouterr().err
    end_to_end = DistillConfig(teacher="t", data="d", output="o", mixer="katz_rows:hedgehog", stages="end-to-end")
    assert end_to_end.replace(transfer_loss="xent", map_lr=1e-2).map_lr == 1e-2  # a stage that reads neither


def test_both_stages_resume_bit_exactly_and_the_folder_is_the_student(digits, tmp_path):
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32", "depth=2"]
    argv += ["num_heads=2", "num_classes=10", "--data", str(digits), "--img-size", "32", "--mixer", "pure_infsa"]
    argv += ["--workers", "0"]
    argv += ["--device", "cpu", "--no-progress", "--batch-size", "8", "--hard-weight", "0.5", "--feature-weight", "1"]
    argv += ["--warmup-epochs", "1"]  # epoch 0 is warm-up in both plans (1 and 2 epochs), as in test_fit
    assert cli_main([*argv, "--epochs", "2", "--output", str(tmp_path / "full")]) == 0
    assert cli_main([*argv, "--epochs", "1", "--output", str(tmp_path / "cut")]) == 0
    assert cli_main([*argv, "--epochs", "2", "--output", str(tmp_path / "cut"), "--resume", "auto"]) == 0

    def numbers(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [
            {
                k: v
                for k, v in r.items()
                if k not in ("epoch_seconds", "images_per_second", "sequences_per_second", "lr")
            }
            for r in rows
        ]

    full, resumed = numbers(tmp_path / "full"), numbers(tmp_path / "cut")
    assert len(full) == 2 and full == resumed  # lr, the schedule's plan, is left out above
    assert numbers(tmp_path / "full" / "attention") == numbers(tmp_path / "cut" / "attention")
    info = json.loads((tmp_path / "full" / "config.json").read_text())
    assert info["architecture"] == "infsa_converted" and info["linvit"]["task"] == "distillation"
    reloaded = linvit.load_run(tmp_path / "full")
    assert linvit.convert_report(reloaded).variant == "pure_infsa"
    assert cli_main(["eval", "--checkpoint", str(tmp_path / "full"), "--data", str(digits), "--workers", "0"]) == 0
    card = (tmp_path / "full" / "README.md").read_text()
    assert "# pure_infsa student of vit_4l_patch16_224" in card and "10 classes" in card
    stage_card = (tmp_path / "full" / "attention" / "README.md").read_text()
    assert "first stage of the run in the folder above" in stage_card
    assert f"--config {tmp_path / 'full' / 'args.yaml'}" in stage_card  # as the run was given its --output


def test_eval_of_a_distill_runs_state_names_where_its_student_is(digits, tmp_path, capsys):
    """A distill run's last.pth is the distillation's state (student and teacher), not a model's weights: eval
    crashed on it (no model name in args.yaml) or, given --model, failed on every key; now one line says where the
    student is: the finished run's folder, or before the end its finished attention-transfer stage."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "pure_infsa", "--workers", "0", "--device", "cpu"]
    argv += ["--no-progress", "--batch-size", "8", "--epochs", "1", "--transfer-epochs", "1"]
    run = tmp_path / "run"
    assert cli_main([*argv, "--output", str(run)]) == 0
    capsys.readouterr()
    evaluate = ["eval", "--data", str(digits), "--workers", "0", "--checkpoint"]
    assert cli_main([*evaluate, str(run / "last.pth")]) == 2
    assert f"not a model's weights: evaluate the run ({run})" in capsys.readouterr().err
    for name in ("model.safetensors", "config.json"):  # the end-to-end stage not finished yet
        (run / name).unlink()
    for checkpoint in (run, run / "last.pth"):
        for model in ([], ["--model", "vit_4l_patch16_224"]):
            assert cli_main([*evaluate, str(checkpoint), *model]) == 2
            err = capsys.readouterr().err
            assert "has not finished" in err and f"attention-transfer stage ({run / 'attention'})" in err, err
            assert "Traceback" not in err
    assert cli_main([*evaluate, str(run / "attention")]) == 0  # where the message points
    (run / "attention" / "model.safetensors").unlink()  # the first stage unfinished too
    assert cli_main([*evaluate, str(run / "attention" / "last.pth")]) == 2
    assert f"resume the run it is the first stage of ({run})" in capsys.readouterr().err
    torch.save({"w": torch.zeros(1)}, run / "mine.pt")  # a file of one's own in the folder is not the run's state
    assert cli_main([*evaluate, str(run / "mine.pt"), "--model", "vit_4l_patch16_224"]) != 0
    assert "linvit distill" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "stages,inner,refused",
    [("both", False, True), ("both", True, False), ("attention", False, False), ("end-to-end", False, False)],
)
def test_only_a_two_stage_runs_first_stage_is_refused_as_a_run(tmp_path, stages, inner, refused):
    """A folder called attention is a stage folder only when its args.yaml is a two-stage run's and it holds no
    attention folder of its own; a run of its own called attention resumes (--stages attention / end-to-end, or
    both once its first stage ran in its own OUT/attention). The message names OUT/args.yaml only once it exists."""
    from linvit.distillation.task import refuse_a_stage_folder

    out = tmp_path / "run" / "attention"
    (out / "attention" if inner else out).mkdir(parents=True)
    (out / "args.yaml").write_text(yaml.safe_dump({"stages": stages, "output": str(out)}))
    if not refused:
        refuse_a_stage_folder(out)
        return
    with pytest.raises(UsageError, match=r"give the run's distill command \(the flags it was started with") as err:
        refuse_a_stage_folder(out)
    assert "--config" not in str(err.value) and "is not written yet" in str(err.value)  # at the end-to-end stage
    assert f"--output {tmp_path / 'run'}; with --resume auto it goes on from this stage" in str(err.value)
    (tmp_path / "run" / "args.yaml").write_text("stages: both\n")
    with pytest.raises(UsageError, match=r"\(--config .*run/args.yaml; not this stage's args.yaml\)"):
        refuse_a_stage_folder(out)


def test_an_end_to_end_stage_from_before_map_lr_resumes(tmp_path):
    """Its OUT/args.yaml has no map_lr: the end-to-end config takes ABSENT_MEANS' stored "None" as None (the string
    was refused as a rate)."""
    from linvit.distillation.task import _end_to_end_config

    (tmp_path / "args.yaml").write_text(yaml.safe_dump({"transfer_epochs": 2, "transfer_lr": 2e-3}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # the end-to-end stage has begun
    config = DistillConfig(teacher="t", data="d", output=str(tmp_path), mixer="katz_rows:hedgehog", resume="auto")
    resumed = _end_to_end_config(config)
    assert resumed.map_lr is None and resumed.transfer_epochs == 2 and resumed.transfer_loss == "mse"


def test_the_start_line_names_the_maps_rate_in_attention_transfer_only():
    from linvit.distillation.task import Distillation

    config = DistillConfig(teacher="t", data="d", output="o", mixer="katz_rows:hedgehog", map_lr=1e-2)
    assert Distillation("attention")._map_rate(config) == " (learned maps 0.01)"
    assert Distillation("end-to-end")._map_rate(config) == ""


def test_a_stage_folder_is_not_taken_for_a_run(digits, tmp_path, capsys):
    """OUT/attention's args.yaml is its stage's (lr = --transfer-lr): distilling into it as a run of its own
    nested OUT/attention/attention and died on the other stage's checkpoint; now one line names OUT. A run of its
    own called attention still resumes."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", *(f"{k}={v}" for k, v in TINY_VIT.items())]
    argv += ["--data", str(digits), "--img-size", "32", "--mixer", "pure_infsa", "--workers", "0", "--device", "cpu"]
    argv += ["--no-progress", "--batch-size", "8", "--epochs", "1", "--stages", "attention"]
    assert cli_main([*argv, "--output", str(tmp_path / "run")]) == 0
    stage = tmp_path / "run" / "attention"
    stage.mkdir()
    stored = yaml.safe_load((tmp_path / "run" / "args.yaml").read_text())  # as a two-stage run's first stage has it
    (stage / "args.yaml").write_text(yaml.safe_dump({**stored, "stages": "both", "output": str(stage)}))
    capsys.readouterr()
    assert cli_main(["distill", "--config", str(stage / "args.yaml"), "--resume", "auto"]) == 2
    assert f"is the attention-transfer stage of the run in {tmp_path / 'run'}" in capsys.readouterr().err
    assert not (stage / "attention").exists()
    own = [*argv[:-2], "--stages", "both", "--output", str(tmp_path / "own" / "attention")]
    assert cli_main(own) == 0 and cli_main([*own, "--resume", "auto"]) == 0  # a run named attention is a run


def test_a_stage_record_given_as_config_is_named_before_it_trains_both_stages(tmp_path, capsys, monkeypatch):
    """--config OUT/attention/args.yaml --output NEW reran both stages with the transfer's lr and epochs (the
    stage's record holds them under lr and epochs): a warning names the run's own file. Silent: --stages attention
    (that stage alone reads --transfer-lr), both lr and epochs given anew, the run's own args.yaml, a run of its
    own named attention, and other commands."""
    from linvit_cli import parse_args

    stage = tmp_path / "run" / "attention"
    stage.mkdir(parents=True)
    record = {"teacher": "t", "data": "d", "output": str(stage), "stages": "both", "lr": 0.002, "epochs": 2}
    (stage / "args.yaml").write_text(yaml.safe_dump({**record, "transfer_lr": 0.002, "transfer_epochs": 2}))
    new = ["--output", str(tmp_path / "new")]
    args = parse_args(["distill", "--config", str(stage / "args.yaml"), *new])
    err = capsys.readouterr().err
    assert f"is the attention-transfer stage of the run in {tmp_path / 'run'}" in err and "lr 0.002, epochs 2" in err
    assert "the run's own flags" in err  # OUT/args.yaml is written when the end-to-end stage starts
    assert args.lr == 0.002  # what it warns about: the stage's rate would be the end-to-end stage's
    (tmp_path / "run" / "args.yaml").write_text(yaml.safe_dump({**record, "output": str(stage.parent), "lr": 1e-4}))
    monkeypatch.chdir(stage)  # a relative path to the same record
    parse_args(["distill", "--config=args.yaml", "--lr", "1e-4", *new])  # lr given anew, epochs not
    assert f"--config {tmp_path / 'run' / 'args.yaml'}" in capsys.readouterr().err
    parse_args(["distill", "--config", str(stage / "args.yaml"), "--stages", "attention", *new])
    parse_args(["distill", "--config", str(stage / "args.yaml"), "--lr", "1e-4", "--epochs", "1", *new])
    parse_args(["distill", "--config", str(tmp_path / "run" / "args.yaml"), *new])
    (stage / "attention").mkdir()  # OUT/attention is then a run of its own (with its own first stage)
    parse_args(["distill", "--config", str(stage / "args.yaml"), *new])
    assert capsys.readouterr().err == ""


def test_a_config_rerun_as_another_form_leaves_the_old_forms_settings_open(tmp_path, capsys):
    """A recorded Katz config rerun with --mixer linear_attention:hedgehog was refused for its gamma_lr, and a
    linear-attention one rerun as Katz started at its stored 0.9 (9x its teacher's output): the file's settings the
    new form refuses, and a first discount that was the old form's default, are left to the new form's defaults,
    said in one line; typed as flags (argparse's prefixes too), kept; what the new form takes, kept."""
    from linvit_cli import parse_args

    record = {"teacher": "t", "data": "d", "output": str(tmp_path / "run"), "stages": "both"}
    katz = {**record, "mixer": "katz_rows:hedgehog", "gamma_init": 0.5, "gamma-lr": 0.1, "map_lr": 0.01}
    (tmp_path / "katz.yaml").write_text(yaml.safe_dump({**katz, "feature_dim": 128}))
    plain = {**record, "mixer": "linear_attention:hedgehog", "gamma_init": 0.9, "gamma_lr": None}
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(plain))
    new = ["--output", str(tmp_path / "new")]

    def settings(config, *flags):
        args = parse_args(["distill", "--config", str(tmp_path / config), *flags, *new])
        return (args.gamma_init, args.gamma_lr, args.map_lr, args.feature_dim), capsys.readouterr().err

    found, err = settings("katz.yaml", "--mixer", "linear_attention:hedgehog")
    assert found == (None, None, 0.01, 128)  # the same learned map: its size and rate kept
    assert "replaces the config's katz_rows:hedgehog: its gamma_lr 0.1, gamma_init 0.5 are left to" in err
    found, err = settings("plain.yaml", "--mixer", "katz_infsa")
    assert found[0] is None and "its gamma_init 0.9 is left to katz_infsa's defaults" in err
    assert settings("katz.yaml", "--mixer", "pure_infsa", "--gamma-l=0.2", "--feature-dim", "64")[0] == (
        None, 0.2, None, 64)  # fmt: skip
    assert settings("katz.yaml", "--mixer", "katz_infsa:hedgehog") == ((0.5, 0.1, 0.01, 128), "")  # takes them all
    assert settings("katz.yaml", "--mixer", "auto") == ((0.5, 0.1, 0.01, 128), "")  # auto decides later
    assert settings("katz.yaml", "--mixer", "katz_rows:hedgehog") == ((0.5, 0.1, 0.01, 128), "")


def test_resume_judges_each_stage_by_its_own_settings_and_follows_a_longer_plan(digits, tmp_path, capsys):
    """Attention transfer never reads --temperature (it is not refused for it); a longer --transfer-epochs or
    --epochs continues that stage on the new plan; the end-to-end stage still refuses its own changed settings."""
    argv = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32", "depth=2"]
    argv += ["num_heads=2", "num_classes=10", "--data", str(digits), "--img-size", "32", "--mixer", "pure_infsa"]
    argv += ["--workers", "0", "--device", "cpu", "--no-progress", "--batch-size", "8", "--output", str(tmp_path)]
    assert cli_main([*argv, "--transfer-epochs", "1", "--epochs", "1"]) == 0
    longer = [*argv, "--transfer-epochs", "2", "--epochs", "2", "--resume", "auto"]
    assert cli_main([*longer, "--temperature", "1.0"]) == 0, capsys.readouterr().err

    def epochs(run):
        return [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert epochs(tmp_path / "attention") == [0, 1] and epochs(tmp_path) == [0, 1]
    stored = {run: yaml.safe_load((run / "args.yaml").read_text()) for run in (tmp_path, tmp_path / "attention")}
    assert stored[tmp_path / "attention"]["transfer_epochs"] == 2  # the transfer went on
    assert stored[tmp_path]["transfer_epochs"] == 1  # the end-to-end model was made from the first transfer
    assert stored[tmp_path]["epochs"] == 2
    capsys.readouterr()
    assert cli_main([*longer, "--temperature", "2.0"]) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {tmp_path / 'last.pth'} with --temperature 1.0 -> 2.0" in err  # end to end: its own
    assert "attention" not in err.split("cannot resume")[1]  # the attention stage let it through


def test_a_run_folder_teacher_with_lora_merges_into_a_plain_student(digits, tmp_path):
    pytest.importorskip("peft")
    train = ["train", "--model", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32", "depth=2"]
    train += ["num_heads=2", "--data", str(digits), "--img-size", "32", "--crop-pct", "1.0", "--epochs", "1"]
    train += ["--batch-size", "8", "--workers", "0", "--no-progress", "--output", str(tmp_path / "teacher")]
    assert cli_main(train) == 0
    config = DistillConfig(
        teacher=str(tmp_path / "teacher"), data=str(digits), output=str(tmp_path / "run"), lora_rank=2, **RUNTIME
    )
    student = run_distill(config)
    assert not any("lora" in k for k in student.state_dict())
    summary = json.loads((tmp_path / "run" / "config.json").read_text())["linvit"]
    assert summary["stage"] == "end-to-end" and summary["final"]["teacher_val_top1"] > 0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(linvit.load_run(tmp_path / "run")(x), student(x))


def test_data_whose_class_names_are_not_the_teachers_is_refused_in_one_line(digits, tmp_path):
    """Issue 45.7: a run folder teacher names its classes ("0".."9"); class folders with the same count but other
    names (or order) are refused naming both; a reader that only numbers its classes is checked by count alone."""
    import shutil

    from linvit.data.splits import open_split
    from linvit.distillation.task import check_class_names, named_classes

    train = ["train", "--model", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32", "depth=1"]
    train += ["num_heads=2", "--data", str(digits), "--img-size", "32", "--crop-pct", "1.0", "--epochs", "1"]
    train += ["--batch-size", "8", "--workers", "0", "--no-progress", "--output", str(tmp_path / "teacher")]
    assert cli_main(train) == 0
    assert load_teacher(str(tmp_path / "teacher")).label_names == [str(d) for d in range(10)]
    letters = tmp_path / "letters"
    for split in ("train", "val"):
        for d in range(10):
            shutil.copytree(digits / split / str(d), letters / split / "abcdefghij"[d])
    config = DistillConfig(teacher=str(tmp_path / "teacher"), data=str(letters), output=str(tmp_path / "x"), **RUNTIME)
    expected = r"^the teacher's classes are not \S+letters's from class 0 on \(teacher: 0, 1, 2, .*, 9; data: a, b, "
    with pytest.raises(ValueError, match=expected + r"c, .*, j\): distil on the data the teacher was trained for"):
        run_distill(config)
    with pytest.raises(ValueError, match=r"from class 1 on \(teacher: cat, dog; data: cat, emu\)"):
        check_class_names(["cat", "dog"], ["cat", "emu"], "d")
    with pytest.raises(ValueError, match="from class 0 on"):  # the same names in another order
        check_class_names(["cat", "dog"], ["dog", "cat"], "d")
    check_class_names(["cat", "dog"], None, "d")  # numbered classes: the count check decides

    class Numbered:
        classes, names_classes = ["0", "1"], False

    assert named_classes(Numbered()) is None
    assert named_classes(open_split("digits:digit", "val")) == [str(d) for d in range(10)]


def test_imagenet_class_folders_match_a_teacher_that_names_the_classes_by_description():
    """ImageNet class folders are WordNet ids (n01440764); a Hugging Face teacher's id2label, and ImageNet saved
    as a DatasetDict, name the same classes by description ("tench, Tinca tinca"): the same classes, not a
    mismatch (distilling google/vit-base-patch16-224 on ImageNet folders was refused)."""
    from timm.data import ImageNetInfo

    from linvit.distillation.task import check_class_names

    info = ImageNetInfo()
    synsets, descriptions = info.label_names(), [info.index_to_description(i) for i in range(1000)]
    check_class_names(descriptions, synsets, "imagenet")
    check_class_names(synsets, descriptions, "imagenet")
    with pytest.raises(ValueError, match="from class 0 on"):  # still the order
        check_class_names(descriptions[1::-1] + descriptions[2:], synsets, "imagenet")
    with pytest.raises(ValueError, match="from class 1 on"):
        check_class_names(["tench, Tinca tinca", "dog"], ["n01440764", "n01443537"], "d")


@pytest.mark.parametrize("mixer", ["katz_infsa", "linear_infsa", "pure_infsa"])
def test_lora_adapts_every_linear_layer_but_heads_and_mixers_and_every_trainable_parameter_learns(mixer):
    """The converted layers train whole (linvit's InfSA layers read their projections' weights, so a LoRA wrapper
    there would never run), the head is left alone, and no parameter marked trainable misses its gradient
    (DDP would stop on one)."""
    pytest.importorskip("peft")
    from linvit.distillation.student import with_lora

    teacher = _vit_teacher().model
    student = make_student(teacher, mixer)
    pairs = layer_pairs(teacher, student)
    model = with_lora(student, 2, [layer for _, _, layer in pairs])
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted and all(".mlp." in n for n in adapted)  # fc1, fc2 of every block; not attn, not head
    model(torch.randn(2, 3, 32, 32)).square().mean().backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert [n for n, p in trainable if p.grad is None] == []  # lora_A gets zeros at first: B starts at 0
    assert any(".attn." in n for n, _ in trainable) and not any("head" in n for n, _ in trainable)


def test_torchvision_and_hugging_face_vision_teachers(digits, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=10,
    )
    torch.manual_seed(0)
    transformers.ViTForImageClassification(cfg).save_pretrained(tmp_path / "hfvit")
    for teacher, kwargs in ((f"hf:{tmp_path / 'hfvit'}", {}), ("torchvision:vit_b_16", {"num_classes": 10})):
        config = DistillConfig(
            teacher=teacher,
            model_kwargs=kwargs,
            data=str(digits),
            output=str(tmp_path / teacher[:2]),
            stages="attention",
            **RUNTIME,
        )
        if teacher.startswith("torchvision"):  # an 86M-parameter teacher at 32 px: one short pass is the check
            config = config.replace(train_split="val", img_size=[32])
        student = run_distill(config)
        x = torch.randn(2, 3, 32, 32)
        reloaded = linvit.load_run(tmp_path / teacher[:2])
        with torch.no_grad():
            out = student(x)
            out = out if isinstance(out, torch.Tensor) else out.logits
            again = reloaded(x)
            again = again if isinstance(again, torch.Tensor) else again.logits
        torch.testing.assert_close(again, out)
        # predict: the size it learned at (not 224: an assertion or a size error) and a ModelOutput's logits
        picture = linvit.load_image(PHOTO, reloaded)
        assert picture.shape[-2:] == (32, 32)
        assert len(linvit.predict(reloaded, [picture], topk=3)[0]["topk"]) == 3
        with pytest.raises(ValueError, match="not a timm model: load it with linvit.load_run"):
            from linvit.evaluate import EvalConfig, run_eval

            run_eval(EvalConfig(data=str(digits), checkpoint=str(tmp_path / teacher[:2]), workers=0))


@pytest.mark.parametrize("mixer", ["katz_infsa", "pure_infsa"])
def test_a_causal_lm_distils_and_its_student_decodes(mixer, text_file, tmp_path):
    pytest.importorskip("transformers")
    teacher = _gpt2_folder(tmp_path)
    config = DistillConfig(
        teacher=f"hf:{teacher}",
        data=str(text_file),
        output=str(tmp_path / "run"),
        mixer=mixer,
        window=0,  # the one-hop forms themselves (a window of 64 covers the whole 32-token context)
        stages="both",
        context=32,
        epochs=2,
        lr=3e-3,
        **RUNTIME,
    )
    student = run_distill(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert math.isclose(rows[-1]["loss_gap"], 100 * (rows[-1]["val_loss"] / rows[-1]["teacher_val_loss"] - 1))
    assert "sequences_per_second" in rows[-1] and "images_per_second" not in rows[-1]  # token windows, not images
    card = (tmp_path / "run" / "README.md").read_text()  # the student's card: no classes, loaded by load_run
    assert "None classes" not in card and "linvit.load_run" in card and "linvit eval" not in card
    reloaded = linvit.load_run(tmp_path / "run")
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, student(ids).logits)
    out = reloaded.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        full = reloaded(out[:, :-1], use_cache=False).logits[:, -1].argmax(-1)
    assert out.shape == (1, 17) and torch.equal(full, out[:, -1])


def test_text_windows_are_in_order_or_drawn_per_epoch():
    ids = torch.arange(100)
    fixed = TokenWindows(ids, 10)
    assert len(fixed) == 9 and torch.equal(fixed[1], torch.arange(10, 21))
    drawn = TokenWindows(ids, 10, random=5, seed=1)
    first = [drawn[i] for i in range(5)]
    drawn.set_epoch(1)
    assert len(drawn) == 5 and any(not torch.equal(a, drawn[i]) for i, a in enumerate(first))
    drawn.set_epoch(0)
    assert all(torch.equal(a, drawn[i]) and len(a) == 11 for i, a in enumerate(first))  # replayable on resume


def test_stages_go_to_their_folders():
    config = DistillConfig(teacher="t", data="d", output="out", transfer_epochs=2, transfer_lr=0.01, epochs=5)
    (first, one), (second, two) = stage_configs(config)
    assert (first, one.output, one.epochs, one.lr) == ("attention", "out/attention", 2, 0.01)
    assert (second, two.output, two.epochs, two.lr) == ("end-to-end", "out", 5, 1e-4)
    assert [s for s, _ in stage_configs(config.replace(stages="end-to-end"))] == ["end-to-end"]


def test_grad_checkpointing_covers_end_to_end_only_and_a_finished_stage_names_its_flag(
    digits, tmp_path, capsys, monkeypatch
):
    from linvit.engine import sharding

    checkpointed = []
    original = sharding.set_grad_checkpointing
    monkeypatch.setattr(sharding, "set_grad_checkpointing", lambda m: (checkpointed.append(m), original(m))[1])
    config = DistillConfig(
        teacher="vit_4l_patch16_224",
        model_kwargs=TINY_VIT,
        data=str(digits),
        output=str(tmp_path / "run"),
        transfer_epochs=1,
        epochs=1,
        img_size=[32],
        grad_checkpointing=True,
        **RUNTIME,
    )
    run_distill(config)  # attention transfer with block checkpointing failed in backward (CheckpointError)
    assert len(checkpointed) == 1 and checkpointed[0].student.grad_checkpointing  # the end-to-end stage's
    assert "--grad-checkpointing applies to the end-to-end stage only" in capsys.readouterr().err
    assert [c.grad_checkpointing for _, c in stage_configs(config)] == [False, True]
    run_distill(config.replace(resume="auto"))  # finished: each stage names the flag that lengthens it
    out = capsys.readouterr().out
    assert "has its 1 epoch (a longer --transfer-epochs continues it)" in out
    assert "has its 1 epoch (a longer --epochs continues it)" in out
    run_distill(config.replace(resume="auto", transfer_epochs=2))  # a longer transfer under a finished end
    out, err = capsys.readouterr()
    assert "new schedule (--transfer-epochs 1 -> 2)" in out  # was "--epochs 1 -> 2", a flag the user never gave
    assert "attention transfer goes on (1 -> 2 epochs) but the end-to-end stage" in err
    run_distill(config.replace(resume="auto"))  # OUT/args.yaml's plan (transfer 1) again: both stages as they were
    assert capsys.readouterr().out.count("left as it was") == 2


def test_settings_of_a_stage_not_run_are_named_not_dropped(digits, tmp_path, capsys):
    from linvit.distillation.task import skipped_stage_settings

    config = DistillConfig(teacher="t", transfer_epochs=2, epochs=5, lora_rank=4, temperature=2.0)
    assert skipped_stage_settings(config) is None  # both stages run: everything is used
    assert skipped_stage_settings(DistillConfig(teacher="t", stages="attention")) is None  # defaults
    assert skipped_stage_settings(config.replace(stages="attention")) == (
        "linvit distill: warning: --epochs 5, --lora-rank 4, --temperature 2.0 ignored: --stages attention runs "
        "attention transfer only (its length and rate are --transfer-epochs, --transfer-lr)"
    )
    assert skipped_stage_settings(config.replace(stages="end-to-end")).startswith(
        "linvit distill: warning: --transfer-epochs 2 ignored: --stages end-to-end runs the end-to-end stage only"
    )
    with pytest.raises(ValueError, match="no such file or folder"):  # a missing teacher first, before any notice
        run_distill(config.replace(teacher=str(tmp_path / "none"), data=str(digits), output=str(tmp_path / "x"),
                                   stages="attention"))  # fmt: skip
    assert capsys.readouterr().err == ""
    tiny = dict(teacher="vit_4l_patch16_224", model_kwargs=TINY_VIT, img_size=[32], data=str(digits), **RUNTIME)
    run_distill(config.replace(**tiny, output=str(tmp_path / "y"), stages="attention", transfer_epochs=1))
    assert "\nlinvit distill: warning: --epochs 5" in capsys.readouterr().err  # after the mixer chosen (auto)


def test_mismatches_fail_in_one_line(digits, text_file, tmp_path, monkeypatch):
    base = dict(data=str(digits), output=str(tmp_path / "x"), **RUNTIME)
    with pytest.raises(ValueError, match="predicts 7 classes but .* has 10"):
        run_distill(DistillConfig(teacher="vit_4l_patch16_224", model_kwargs={**TINY_VIT, "num_classes": 7}, **base))
    with pytest.raises(ValueError, match="no such file or folder"):  # named before transformers is needed
        run_distill(DistillConfig(teacher="hf:/nope/nothing", **base))
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "transformers", None)  # an install without the [hf] extra
        with pytest.raises(ValueError, match="no such file or folder"):
            run_distill(DistillConfig(teacher="hf:/nope/nothing", **base))
        with pytest.raises(ValueError, match=r"needs transformers: pip install -e \"\.\[hf\]\""):
            run_distill(DistillConfig(teacher=f"hf:{digits}", **base))
    with pytest.raises(ValueError, match="stages must be one of"):
        DistillConfig(teacher="t", stages="all")
    with pytest.raises(ValueError, match="mixer must be one of"):
        DistillConfig(teacher="t", mixer="katz")
    with pytest.raises(ValueError, match="brings its own architecture and input size"):
        load_teacher(str(digits), img_size=[64])
    pytest.importorskip("transformers")
    gpt2 = _gpt2_folder(tmp_path)
    lm = dict(teacher=f"hf:{gpt2}", data=str(text_file), output=str(tmp_path / "y"), **RUNTIME)
    with pytest.raises(ValueError, match="linear_infsa pools every token"):
        run_distill(DistillConfig(mixer="linear_infsa", **lm))
    short = tmp_path / "short.txt"
    short.write_text("a few words " * 30)
    with pytest.raises(ValueError, match="too few for a validation window"):
        run_distill(DistillConfig(context=60, **{**lm, "data": str(short)}))
    with pytest.raises(ValueError, match="longer than the teacher's 64 positions"):
        run_distill(DistillConfig(context=4000, **lm))
    assert copy.deepcopy(load_teacher(f"hf:{gpt2}")).language


def test_torchrun_runs_both_stages_on_two_processes(digits, tmp_path):
    """DDP: stage 2 starts from the model folder rank 0 wrote in stage 1 (one process group for both), and every
    rank ends with the same validation numbers."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "linvit"]
    cmd += ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32"]
    cmd += ["depth=2", "num_heads=2", "num_classes=10", "--data", str(digits), "--img-size", "32", "--epochs", "1"]
    cmd += ["--batch-size", "4", "--workers", "0", "--device", "cpu", "--no-progress", "--output", str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for folder in (tmp_path / "attention", tmp_path):
        ranks = [json.loads((folder / f"final_val_rank{r}.json").read_text()) for r in (0, 1)]
        ranks = [
            {k: v for k, v in r.items() if k not in ("epoch_seconds", "images_per_second", "sequences_per_second")}
            for r in ranks
        ]
        assert ranks[0] == ranks[1] and "teacher_val_top1" in ranks[0] and (folder / "model.safetensors").is_file()
    assert linvit.load_run(tmp_path) is not None


def test_a_run_card_says_how_to_rerun_and_use_its_folder():
    """A two-stage run's first stage reruns through the run above it; a --stages attention run is its own run; each
    task's card names the command that takes its folder (detection and generation were told `linvit eval`)."""
    from pathlib import Path as P

    from linvit.utils.artifacts import _rerun_line, _use_section

    stage = _rerun_line({"stage": "attention"}, {"stages": "both", "output": "runs/d/attention"}, "linvit distill")
    assert "folder above: `linvit distill --config runs/d/args.yaml --output NEW`, from the folder the run" in stage
    own = _rerun_line({"stage": "attention"}, {"stages": "attention", "output": "runs/a"}, "linvit distill")
    assert (
        own
        == "`linvit distill --config runs/a/args.yaml --output NEW`, from the folder the run was started in, reruns it"
    )
    assert "linvit detect eval --checkpoint runs/d" in _use_section({"task": "detection"}, {}, P("runs/d"))
    assert "linvit generate sample --checkpoint runs/g" in _use_section({"task": "generation"}, {}, P("runs/g"))
    assert "linvit eval --checkpoint runs/c --data DATA" in _use_section({"task": "classification"}, {}, P("runs/c"))
