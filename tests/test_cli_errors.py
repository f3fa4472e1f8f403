"""Bad input a new user types gets one line naming the problem (exit code 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import linvit
from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist, load_boxes
from linvit.errors import UsageError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmnist")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=0, progress=False)
    return root


def _fails_cleanly(argv: list[str], capsys, *phrases: str) -> None:
    try:
        code = cli_main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("linvit ") and ": error: " in last, err
    assert "usage:" not in err, err  # one line, not argparse's usage block above it
    for phrase in phrases:
        assert phrase in last, err


def _train(data, out, *extra: str) -> list[str]:
    return [
        "train",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--output",
        str(out),
        "--img-size",
        "32",
        "--workers",
        "0",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--no-progress",
        *extra,
    ]


def test_model_kwargs_of_the_wrong_kind(data, tmp_path, capsys):
    _fails_cleanly(_train(data, tmp_path, "--model-kwargs", "patch_size=banana"), capsys, "patch_size", "banana")


@pytest.mark.parametrize("flag,value", [("--epochs", "0"), ("--batch-size", "-3"), ("--workers", "-1")])
def test_counts_must_be_positive(data, tmp_path, capsys, flag, value):
    _fails_cleanly([*_train(data, tmp_path), flag, value], capsys, flag, ">=")


def test_resume_from_a_damaged_checkpoint_names_it(data, tmp_path, capsys):
    (tmp_path / "last.pth").write_bytes(b"not a checkpoint")
    _fails_cleanly(_train(data, tmp_path, "--resume", "auto"), capsys, str(tmp_path / "last.pth"), "delete it")


def test_a_second_run_into_a_run_folder_is_refused(data, tmp_path, capsys):
    """Without --resume, a folder that holds a checkpoint is not written over (its model and metrics kept)."""
    assert cli_main(_train(data, tmp_path / "run")) == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    _fails_cleanly(_train(data, tmp_path / "run"), capsys, "already holds a run", "--resume auto")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_output_paths_that_are_files(tmp_path, capsys):
    blocker = tmp_path / "taken.txt"
    blocker.write_text("x")
    _fails_cleanly(["data", "cluttered-mnist", "--output", str(blocker)], capsys, "is a file, not a folder")
    _fails_cleanly(["reproduce", "--quick", "--output", str(blocker / "sub")], capsys, "is a file, not a folder")


def test_malformed_boxes_name_the_file_and_the_entry(data, tmp_path, capsys):
    bad = tmp_path / "boxes.json"
    bad.write_text('{"val/0/00000.png": [["a", 1, 2, 3]]}')
    with pytest.raises(ValueError, match="val/0/00000.png"):
        load_boxes(bad)
    argv = [
        "explain",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--img-size",
        "32",
        "--boxes",
        str(bad),
        "--output",
        str(tmp_path / "ex"),
        "--limit",
        "2",
    ]
    _fails_cleanly(argv, capsys, str(bad), "val/0/00000.png")
    bad.write_text("[1, 2")
    _fails_cleanly(argv, capsys, str(bad), "not a JSON file")


def test_newer_commands_reject_bad_inputs_in_one_line(tmp_path, capsys):
    """The four inputs that still gave tracebacks (issue 22 item 14); nothing may be written half-way."""
    binary = tmp_path / "run.yaml"
    binary.write_bytes(bytes(range(128, 256)))
    _fails_cleanly(["train", "--config", str(binary)], capsys, "--config", "cannot read it as YAML text")
    export = ["export", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    _fails_cleanly([*export, "--img-size", "50", "--output", str(tmp_path / "m.onnx")], capsys, "not divisible")
    _fails_cleanly([*export, "--img-size", "32", "--output", str(tmp_path)], capsys, "is a folder")
    _fails_cleanly(
        [*export, "--img-size", "32", "--output", str(tmp_path / "m.onnx"), "--format", "pt2"], capsys, "onnx"
    )
    _fails_cleanly([*export, "--img-size", "32", "--output", str(tmp_path / "m.bin")], capsys, "suffix")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


@pytest.mark.parametrize(
    "line, said",
    [
        ("scale: 0.5", "expected a list of 2 values"),
        ("scale: [0.5]", "expected a list of 2 values"),
        ("scale: [0.1, 0.5, 1.0]", "expected a list of 2 values"),
        ("lr: [0.1, 0.2]", "expected one value"),
        ("epochs: {a: 1}", "expected one value"),
    ],
)
def test_a_config_value_of_the_wrong_shape_is_one_line(tmp_path, capsys, line, said):
    """`scale: 0.5` in --config ended in an IndexError inside timm's transform once the run had started, and
    `lr: [0.1, 0.2]` in a TypeError."""
    config = tmp_path / "run.yaml"
    config.write_text(line + "\n")
    argv = ["train", "--model", "vit_4l_patch16_224", "--data", "digits:digit", "--config", str(config)]
    _fails_cleanly([*argv, "--output", str(tmp_path / "run")], capsys, line.split(":")[0], said)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "distill"])
def test_a_run_that_cannot_start_leaves_no_folder_behind(tmp_path, capsys, command):
    """Missing data is found when the run builds its parts, after the trainer made the output folder (and its
    parents, and distill's stage folder): the folders it made are removed again; one it found is kept."""
    kept = tmp_path / "kept"
    kept.mkdir()
    model = ["--model", "vit_4l_patch16_224"] if command == "train" else ["--teacher", "vit_4l_patch16_224"]
    for output in (tmp_path / "new" / "deeper", kept):
        argv = [command, *model, "--data", str(tmp_path / "nowhere"), "--output", str(output), "--workers", "0"]
        _fails_cleanly(argv, capsys, "split folder not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and not any(kept.iterdir())


def test_a_config_of_switches_and_a_runs_args_yaml_still_parse(tmp_path):
    """Switches (store_true, --x/--no-x) take no values: `progress: false` beside a refused `scale: 0.5` is not
    itself refused, and a run's args.yaml (every switch stored) reruns."""
    import linvit_cli

    fixture = Path(__file__).parent / "fixtures" / "run_v0_classify" / "args.yaml"
    args = linvit_cli.parse_args(["train", "--config", str(fixture), "--output", str(tmp_path / "rerun")])
    assert args.progress is not None and args.data
    config = tmp_path / "run.yaml"
    config.write_text("progress: false\ndeterministic: true\nscale: [0.5, 1.0]\n")
    args = linvit_cli.parse_args(["train", "--config", str(config), "--model", "m", "--data", "d", "--output", "o"])
    assert (args.progress, args.deterministic, args.scale) == (False, True, [0.5, 1.0])


def test_model_kwargs_train_leaves_open_are_theirs_to_give():
    """And a timm teacher's --model-kwargs meet distill's --img-size the same way (a duplicate-keyword TypeError
    before)."""
    from linvit.classify import with_model_kwargs
    from linvit.distillation import load_teacher

    built = {"img_size": None, "num_classes": 10, "drop_path_rate": 0.1, "pretrained_file": None}
    with pytest.raises(UsageError, match="give it as --img-size"):  # alone it would size the model, not the data
        with_model_kwargs(built, {"img_size": 64})
    assert with_model_kwargs(built, {"pretrained_file": "w.pth"})["pretrained_file"] == "w.pth"  # left open
    assert with_model_kwargs({**built, "img_size": [32]}, {"img_size": [32, 32]})["img_size"] == [32, 32]  # one size
    with pytest.raises(UsageError, match="drop_path_rate is set by --drop-path"):
        with_model_kwargs(built, {"drop_path_rate": 0.2})
    tiny = {"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_size": 8}
    with pytest.raises(UsageError, match="img_size is set by --img-size"):
        load_teacher("vit_4l_patch16_224", model_kwargs={**tiny, "img_size": 64}, img_size=[32])
    assert load_teacher("vit_4l_patch16_224", model_kwargs={**tiny, "img_size": 32}, img_size=[32]).model is not None


def test_a_resume_asking_fewer_epochs_than_trained_is_refused_unless_finished(tmp_path, capsys):
    """A checkpoint of 2 epochs whose final model was not yet written, resumed as a 1-epoch plan, said "nothing left
    to train" and recorded the folder as a 1-epoch run (args.yaml, the card) holding the 2-epoch model: refused in
    one line, folder kept. A finished run is left as it was, whatever the plan."""
    argv = ["train", "--model", "vit_4l_patch16_224", "--data", "digits:digit,length=20", "--workers", "0"]
    argv += ["--batch-size", "10", "--no-progress", "--img-size", "32", "--model-kwargs", "depth=1"]
    argv += ["--output", str(tmp_path / "run")]
    assert cli_main([*argv, "--epochs", "2"]) == 0
    before = (tmp_path / "run" / "args.yaml").read_bytes()
    capsys.readouterr()
    assert cli_main([*argv, "--epochs", "1", "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert "left as it was" in out and "the run has its 1 epoch" not in out  # it has 2
    (tmp_path / "run" / "model.safetensors").unlink()  # stopped after its last checkpoint, before its model folder
    assert cli_main([*argv, "--epochs", "1", "--resume", "auto"]) == 2
    captured = capsys.readouterr()
    assert "has trained 2 epochs, more than --epochs 1" in captured.err
    assert "nothing left to train" not in captured.out  # then refused: one message, not two that disagree
    assert (tmp_path / "run" / "args.yaml").read_bytes() == before


def test_model_kwargs_that_contradict_trains_own_settings_are_one_line(tmp_path, capsys):
    """`--model-kwargs num_classes=3` on 10-class data was a duplicate-keyword TypeError inside timm; the same
    value as train's own is harmless and runs."""
    argv = ["train", "--model", "vit_4l_patch16_224", "--data", "digits:digit,length=20", "--workers", "0"]
    argv += ["--epochs", "1", "--batch-size", "10", "--no-progress", "--img-size", "32", "--model-kwargs", "depth=1"]
    _fails_cleanly([*argv, "num_classes=3", "--output", str(tmp_path / "a")], capsys, "num_classes is set by --data")
    _fails_cleanly([*argv, "img_size=64", "--output", str(tmp_path / "b")], capsys, "img_size is set by --img-size")
    assert cli_main([*argv, "num_classes=10", "img_size=32", "--output", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    again = [*argv, "num_classes=10", "img_size=32", "--output", str(tmp_path / "c"), "--resume", "auto"]
    assert cli_main(again) == 0  # a finished run: says so
    assert "nothing left to train: the run has its 1 epoch (a longer --epochs" in capsys.readouterr().out
    folder = tmp_path / "c"
    before = {name: (folder / name).read_bytes() for name in ("args.yaml", "config.json", "README.md")}
    assert cli_main([*again, "--lr", "5e-4"]) == 0  # a new rate trains nothing: no "follows it from this epoch on"
    out = capsys.readouterr().out
    assert "nothing left to train" in out and "new schedule" not in out and "left as it was" in out
    # ... and the folder keeps the plan that trained it (args.yaml and the card said lr 5e-4 before)
    assert {name: (folder / name).read_bytes() for name in before} == before
    (folder / "config.json").unlink()  # stopped after its last epoch, before the model folder: written now
    assert cli_main(again) == 0
    assert (folder / "config.json").is_file() and "left as it was" not in capsys.readouterr().out


def test_a_run_stopped_before_its_model_folder_writes_it_over_an_earlier_epochs(tmp_path, capsys, monkeypatch):
    """A finished 1-epoch run continued to 2 epochs and stopped after epoch 2's checkpoint, before its model
    folder: the folder still holds epoch 1's model, so resuming writes epoch 2's (it was left as it was)."""
    import importlib

    fit = importlib.import_module("linvit.engine.fit")

    argv = ["train", "--model", "vit_4l_patch16_224", "--data", "digits:digit,length=20", "--workers", "0"]
    argv += ["--batch-size", "10", "--no-progress", "--img-size", "32", "--output", str(tmp_path), "--resume", "auto"]
    argv += ["--model-kwargs", "depth=1", "embed_dim=32", "num_heads=2", "patch_size=8", "--warmup-epochs", "0"]
    assert cli_main([*argv, "--epochs", "1"]) == 0

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fit, "finish", stopped)
    assert cli_main([*argv, "--epochs", "2"]) == 130
    monkeypatch.undo()
    assert fit.final_model_epoch(tmp_path) == 0  # epoch 1's model, epoch 2's checkpoint
    capsys.readouterr()
    assert cli_main([*argv, "--epochs", "2"]) == 0
    assert "left as it was" not in capsys.readouterr().out and fit.final_model_epoch(tmp_path) == 1


def test_a_coco_file_naming_missing_images(tmp_path, capsys):
    import json

    (tmp_path / "annotations").mkdir()
    (tmp_path / "val").mkdir()
    coco = {"images": [{"id": 1, "file_name": "gone.png", "width": 8, "height": 8}], "annotations": []}
    coco["categories"] = [{"id": 1, "name": "digit"}]
    (tmp_path / "annotations" / "instances_val.json").write_text(json.dumps(coco))
    argv = ["detect", "eval", "--data", str(tmp_path), "--split", "val", "--model", "linear_infvit_tiny_patch16_224"]
    _fails_cleanly([*argv, "--output", str(tmp_path / "out")], capsys, "1 image(s) not found", "gone.png")


def test_only_usage_errors_are_one_line(data, tmp_path, monkeypatch, capsys):
    """A ValueError from torch, timm or a bug keeps its traceback; --debug shows a usage error's too."""
    import linvit.classify
    from linvit.errors import UsageError

    with pytest.raises(UsageError, match="patch_size"):
        cli_main([*_train(data, tmp_path, "--model-kwargs", "patch_size=banana"), "--debug"])

    def internal_bug(args):
        raise ValueError("an internal ValueError")

    monkeypatch.setattr(linvit.classify, "run_train", internal_bug)
    with pytest.raises(ValueError, match="an internal ValueError"):
        cli_main(_train(data, tmp_path))


def test_threads_and_host_are_set_and_recorded(data, tmp_path):
    """A run records what besides its code decides its float rounding: threads, the CPU kind, torch."""
    import json

    import torch

    from linvit.utils.host import cpu_info

    before = torch.get_num_threads()
    try:
        argv = _train(data, tmp_path, "--img-size", "32", "--model-kwargs", "patch_size=8", "depth=1")
        assert cli_main([*argv, "--threads", "1"]) == 0
        info = json.loads((tmp_path / "config.json").read_text())["linvit"]
        assert info["threads"] == 1 and info["torch"] == torch.__version__
        assert {k: info[k] for k in ("cpu_model", "cpu_id", "cpu_extensions")} == cpu_info()
    finally:
        torch.set_num_threads(before)


def test_errors_name_the_real_problem(data, tmp_path, capsys):
    """Issue 39 item 14: a path that is not there says so; a file that is not a checkpoint says what it is."""
    photos = str(data / "val" / "0")
    missing = str(tmp_path / "nope")
    _fails_cleanly(["predict", photos, "--checkpoint", missing], capsys, missing, "no such file or folder")
    _fails_cleanly(["demo", "--checkpoint", missing], capsys, "no such file or folder")
    explain = ["explain", "--data", str(data), "--output", str(tmp_path / "ex")]
    _fails_cleanly([*explain, "--checkpoint", missing], capsys, missing, "no such file or folder")
    empty = tmp_path / "empty"
    empty.mkdir()  # the checkpoint's problem is named first, whatever the pictures' is
    explain_empty = ["explain", "--data", str(empty), "--output", str(tmp_path / "ex2"), "--checkpoint", missing]
    _fails_cleanly(explain_empty, capsys, missing, "no such file or folder")
    _fails_cleanly(["eval", "--data", str(data), "--checkpoint", missing], capsys, "no such file or folder")
    _fails_cleanly(["export", "--model", missing, "--output", str(tmp_path / "m.pt2")], capsys, missing, "no such file")
    text = tmp_path / "notes.pth"
    text.write_text("these are my notes\nnot weights\n")
    model = ["--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    _fails_cleanly(["predict", photos, *model, "--checkpoint", str(text)], capsys, str(text), "a text file")
    _fails_cleanly([*explain, "--checkpoint", str(text)], capsys, str(text), "give --model NAME")
    fake = tmp_path / "weights.safetensors"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    _fails_cleanly(["predict", photos, *model, "--checkpoint", str(fake)], capsys, "not a safetensors file", "PNG")


def test_bench_of_an_unknown_model_fails_before_running(tmp_path, capsys):
    out = tmp_path / "bench"
    _fails_cleanly(["bench", "--models", "not_a_model", "--res", "32", "--output", str(out)], capsys, "not_a_model")
    assert not out.exists()


def test_ctrl_c_is_one_line_and_exit_130(data, tmp_path, monkeypatch, capsys):
    import linvit.classify

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(linvit.classify, "run_train", interrupted)
    assert cli_main(_train(data, tmp_path)) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip() == "linvit train: interrupted"


def test_unreachable_hub_for_pretrained_weights_is_one_line(tmp_path, monkeypatch, capsys):
    """timm's download of --pretrained weights with no network and no cache: one line and exit 2, not the
    Hub's traceback."""
    errors = pytest.importorskip("huggingface_hub.errors")
    import linvit.prediction.classify as classify

    def offline(config):
        raise errors.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(classify, "run_predict", offline)
    (tmp_path / "a.png").write_bytes(b"")
    assert cli_main(["predict", str(tmp_path / "a.png"), "--model", "deit_tiny_patch16_224", "--pretrained"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Hugging Face Hub cannot be reached" in err[0] and "(--checkpoint)" in err[0]


def test_unreachable_hub_names_the_commands_own_weight_flag(tmp_path, monkeypatch, capsys):
    """distill takes its teacher's weights by --teacher-file: the offline error named train's flags."""
    errors = pytest.importorskip("huggingface_hub.errors")
    import linvit.distillation as distillation

    def offline(config):
        raise errors.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(distillation, "run_distill", offline)
    argv = ["distill", "--teacher", "deit_tiny_patch16_224", "--pretrained", "--data", str(tmp_path)]
    assert cli_main([*argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(--teacher-file)" in err[0] and "--pretrained-file" not in err[0]


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--lr", "-1"),
        ("--lr", "nan"),
        ("--lr", "inf"),
        ("--min-lr", "1e400"),
        ("--drop-path", "2"),
        ("--smoothing", "1.5"),
        ("--crop-pct", "0"),
    ]
    + [("--hflip", "5")],
)
def test_rates_and_probabilities_out_of_range(data, tmp_path, capsys, flag, value):
    _fails_cleanly([*_train(data, tmp_path), flag, value], capsys, flag, "expected a number in")


def test_a_missing_run_folder_is_named_missing_not_a_hub_id(tmp_path, monkeypatch):
    """runs/typo beside an existing runs/ is a missing folder; org/name with no such folder may be a Hub id."""
    from linvit.errors import UsageError
    from linvit.models.variants import check_model_name

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(UsageError, match="runs/typo: no such file or folder"):
        check_model_name("runs/typo")
    with pytest.raises(UsageError, match="looks like a Hub repo id"):
        check_model_name("facebook/deit")


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["bench", "--runtime", "onnx", "--output", "x"], "argument --runtime: invalid choice: 'onnx'"),
        (["predict", "x.jpg", "--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
        (["models", "--no-such-flag"], "linvit models: error: unrecognized arguments: --no-such-flag"),
        (["train", "--bogus-flag", *"--data d --model m --output o".split()], "linvit train: error: unrecognized"),
        (["data", "digits", "--bogus", "--output", "o"], "linvit data digits: error: unrecognized arguments: --bogus"),
        ([], "the following arguments are required: command"),
    ],
)
def test_a_bad_flag_is_one_line_that_names_it_and_the_help(argv, phrase, capsys):
    try:
        code = cli_main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert phrase in err and err.strip().endswith("--help)"), err


def test_a_checkpoint_of_another_shape_is_one_line_in_eval_and_export(data, tmp_path, capsys):
    """eval with --model naming the family but not the run's patch size, and export of a run folder with
    --model-kwargs that build another model, were load_state_dict tracebacks (new-user trial)."""
    run = tmp_path / "run"
    argv = ["train", "--model", "linear_infvit_tiny_patch16_224", "--data", str(data), "--img-size", "32"]
    argv += ["--model-kwargs", "patch_size=8", "depth=2", "--epochs", "1", "--batch-size", "10", "--workers", "0"]
    assert cli_main([*argv, "--no-progress", "--output", str(run)]) == 0
    capsys.readouterr()
    evaluate = ["eval", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--workers", "0"]
    for checkpoint in (run, run / "model.safetensors"):
        phrases = ("does not fit InfViT", "proj.weight is (192, 3, 8, 8) there", "give the folder, no --model")
        _fails_cleanly([*evaluate, "--checkpoint", str(checkpoint)], capsys, *phrases)
    export = ["export", "--model", str(run), "--model-kwargs", "depth=3", "--output", str(tmp_path / "m.onnx")]
    _fails_cleanly(export, capsys, "do not fit the model --model-kwargs", "leave --model-kwargs out")


def test_a_small_batch_schedule_decays_and_a_warm_up_as_long_as_the_run_is_said(tmp_path, capsys):
    """train's fixed --min-lr 1e-5 sat above the lr a batch of 8 scales to (5e-4 x 8 / 512 = 7.8e-6): the cosine
    "decay" rose epoch by epoch; and a run shorter than its warm-up never reached its lr, silently (new-user trial)."""
    argv = ["train", "--model", "vit_4l_patch16_224", "--data", "digits:digit,length=24", "--img-size", "32"]
    argv += ["--model-kwargs", "depth=1", "embed_dim=32", "num_heads=2", "patch_size=8", "--batch-size", "8"]
    argv += ["--workers", "0", "--no-progress", "--epochs", "3"]
    assert cli_main([*argv, "--warmup-epochs", "0", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "note: --min-lr 1e-05 is above the learning rate 7.81e-06: the schedule uses 1/100 of it" in out
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "a/metrics.jsonl").read_text().splitlines()]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < lrs[0] / 10, lrs  # it decays
    assert cli_main([*argv, "--output", str(tmp_path / "b")]) == 0  # train's default warm-up: 5 epochs
    assert "note: --warmup-epochs 5 >= --epochs 3: the run ends in warm-up" in capsys.readouterr().out


def test_train_and_val_classes_that_differ_are_named(tmp_path, capsys):
    """'train and val classes differ: 2 vs 2 classes' did not say which (a typo in one folder name)."""
    from PIL import Image

    for split, names in (("train", ("a", "single")), ("val", ("a", "sngl"))):
        for name in names:
            (tmp_path / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp_path / split / name / "x.png")
    argv = ["train", "--model", "vit_4l_patch16_224", "--data", str(tmp_path), "--output", str(tmp_path / "run")]
    _fails_cleanly(argv, capsys, "only in train ['single'], only in val ['sngl']")


def test_an_exported_pytorch_graph_given_to_eval_or_predict_is_one_line(tmp_path, capsys):
    """A TorchScript .pt gave torch.load's advice to retry with weights_only=False, a .pt2 'not a linvit run
    folder' (new-user trial); weights saved with torch.save still load as weights."""
    import torch
    from PIL import Image

    from linvit.weights import refuse_exported_graph

    module = torch.nn.Linear(2, 2)
    torch.jit.script(module).save(str(tmp_path / "m.pt"))
    torch.export.save(torch.export.export(module, (torch.zeros(1, 2),)), str(tmp_path / "m.pt2"))
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    refuse_exported_graph(tmp_path / "weights.pt")  # weights: no error
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    for name, kind in (("m.pt", "a TorchScript graph"), ("m.pt2", "a torch.export graph")):
        graph = str(tmp_path / name)
        _fails_cleanly(["eval", "--data", "digits:digit", "--checkpoint", graph], capsys, kind, "torch.jit.load")
        argv = ["eval", "--data", "digits:digit", "--checkpoint", graph, "--model", "vit_4l_patch16_224"]
        _fails_cleanly(argv, capsys, kind)
        _fails_cleanly(["predict", str(tmp_path), "--checkpoint", graph], capsys, kind)


def _no_dns(monkeypatch, calls: list):
    import socket

    def unresolvable(host, *args, **kwargs):
        calls.append(host)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    import os

    for name in [n for n in os.environ if n.lower().endswith("_proxy")] + ["HF_HUB_OFFLINE"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


def test_pretrained_weights_go_offline_at_once_where_the_hub_does_not_resolve(tmp_path, monkeypatch):
    """With no network, huggingface_hub's retries took about 50 s before the one-line error: a command that may
    download is put in offline mode first (cached files still load), and only such a command probes."""
    constants = pytest.importorskip("huggingface_hub.constants")
    import linvit.prediction.classify as classify

    calls, seen = [], []
    _no_dns(monkeypatch, calls)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(classify, "run_predict", lambda config: seen.append(constants.HF_HUB_OFFLINE))
    (tmp_path / "a.png").write_bytes(b"")
    assert cli_main(["predict", str(tmp_path / "a.png"), "--model", "deit_tiny_patch16_224"]) == 0
    assert calls == [] and seen == [False]  # no weights asked for: no probe
    assert cli_main(["predict", str(tmp_path / "a.png"), "--model", "deit_tiny_patch16_224", "--pretrained"]) == 0
    assert calls == ["huggingface.co"] and seen == [False, True]
    assert constants.HF_HUB_OFFLINE is False  # restored for a Python caller of main()
    assert cli_main(["predict", str(tmp_path / "a.png"), "--model=hf-hub:timm/deit_tiny_patch16_224"]) == 0
    assert len(calls) == 2 and seen[-1] is True  # a Hub model's config is a download too; --flag=value too
    monkeypatch.setenv("NO_PROXY", "localhost")  # exceptions to a proxy are no proxy
    assert cli_main(["predict", str(tmp_path / "a.png"), "--model", "deit_tiny_patch16_224", "--pretrained"]) == 0
    assert len(calls) == 3 and seen[-1] is True


def test_python_callers_of_create_model_go_offline_too(monkeypatch):
    """linvit.create_model(pretrained=True) or an hf-hub: name from Python (no CLI around it) is put offline for
    its download where the Hub does not resolve; no weights probe nothing, nor does a block already offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    import linvit.models.variants as variants

    calls, seen = [], []
    _no_dns(monkeypatch, calls)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(
        variants, "_create_taking", lambda *args: seen.append(constants.HF_HUB_OFFLINE) or nn.Linear(1, 1)
    )
    linvit.create_model("deit_tiny_patch16_224")
    assert calls == [] and seen == [False]  # no weights asked for: no probe
    linvit.create_model("deit_tiny_patch16_224", pretrained=True)
    assert calls == ["huggingface.co"] and seen == [False, True] and constants.HF_HUB_OFFLINE is False
    linvit.create_model("hf-hub:timm/deit_tiny_patch16_224")  # a Hub model's config is a download too
    assert len(calls) == 2 and seen[-1] is True and constants.HF_HUB_OFFLINE is False
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # already offline: no second probe
    linvit.create_model("deit_tiny_patch16_224", pretrained=True)
    assert len(calls) == 2 and seen[-1] is True


def test_an_hf_teacher_from_python_goes_offline_too(monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    pytest.importorskip("transformers")
    import linvit.distillation.teacher as teacher
    from linvit.distillation import load_teacher

    calls, seen = [], []
    _no_dns(monkeypatch, calls)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hf_teacher = teacher.Teacher(nn.Linear(1, 1), True)
    monkeypatch.setattr(
        teacher, "_huggingface_teacher", lambda name: seen.append(constants.HF_HUB_OFFLINE) or hf_teacher
    )
    load_teacher("hf:org/some-model")
    assert calls == ["huggingface.co"] and seen == [True] and constants.HF_HUB_OFFLINE is False


@pytest.mark.parametrize("env", [{"HTTPS_PROXY": "http://proxy:3128"}, {"all_proxy": "socks5://p:1080"},
                                 {"HF_HUB_OFFLINE": "0"}])  # fmt: skip
def test_behind_a_proxy_the_hub_is_not_probed(monkeypatch, env):
    """A proxy may resolve what the local resolver cannot; an explicit HF_HUB_OFFLINE is the user's choice."""
    from linvit.hub_offline import hub_host_unresolvable

    calls = []
    _no_dns(monkeypatch, calls)
    assert hub_host_unresolvable()  # the probe alone, no proxy: the name does not resolve
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert not hub_host_unresolvable() and calls == ["huggingface.co"]


def test_the_probe_asks_for_hf_endpoints_host(monkeypatch):
    import socket

    from linvit.hub_offline import hub_host_unresolvable

    calls = []
    _no_dns(monkeypatch, calls)
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example.org:8443")
    assert hub_host_unresolvable() and calls == ["hf-mirror.example.org"]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(socket.AF_INET, 0, 0, "", ("10.0.0.1", 443))])
    assert not hub_host_unresolvable()


class _Refusing(torch.utils.data.Dataset):
    def __init__(self, message: str) -> None:
        self.message = message

    def __len__(self):
        return 2

    def __getitem__(self, index):
        raise UsageError(self.message)


@pytest.mark.parametrize("message", ["data/0.png: label map (40, 40) does not match image 48x64",
                                     "data/0.png: two lines: x\nhint: do this"])  # fmt: skip
def test_an_error_raised_in_a_dataloader_worker_is_its_own_message(monkeypatch, capsys, message):
    """PyTorch re-raises a worker's UsageError with the worker's whole traceback as its message: the CLI prints
    the error's own message (it printed 14 lines with the default --workers 2)."""
    import linvit.prediction.classify as classify

    def load_in_a_worker(config):
        next(iter(torch.utils.data.DataLoader(_Refusing(message), num_workers=1)))

    monkeypatch.setattr(classify, "run_predict", load_in_a_worker)
    assert cli_main(["predict", "x.png", "--model", "deit_tiny_patch16_224"]) == 2
    assert capsys.readouterr().err.strip() == f"linvit predict: error: {message}"


def test_one_class_is_refused_before_training(tmp_path, capsys):
    """One class trains to loss 0 and 100% from the first step: a one-line error, nothing written."""
    from PIL import Image

    for split in ("train", "val"):
        (tmp_path / "data" / split / "cat").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (32, 32), (i * 90, 0, 0)).save(tmp_path / "data" / split / "cat" / f"{i}.png")
    assert cli_main(_train(tmp_path / "data", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("one class (cat); a classifier needs two or more to learn from") and "\n" not in err
    assert not (tmp_path / "run").exists()
