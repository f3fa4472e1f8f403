"""The training engine end to end on the embedded dataset: families, resume after SIGKILL, torchrun, eval."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from PIL import Image

from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist

FAST = [
    "--img-size",
    "32",
    "--aa",
    "none",
    "--mixup",
    "0",
    "--cutmix",
    "0",
    "--reprob",
    "0",
    "--smoothing",
    "0",
    "--warmup-epochs",
    "0",
    "--drop-path",
    "0",
    "--workers",
    "0",
    "--no-progress",
    "--crop-pct",
    "1.0",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmnist")
    build_cluttered_mnist(root, canvas=32, per_class_train=6, per_class_val=2, clutter=1, progress=False)
    return root


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "model,kwargs",
    [
        ("linear_infvit_tiny_patch16_224", ["patch_size=8"]),
        ("infvit_tiny_patch16_224", ["patch_size=8"]),
        ("katz_infvit_tiny_patch16_224", ["patch_size=8"]),
        ("weightformer_tiny_patch16_224", ["patch_size=8"]),
        ("deit_tiny_patch16_224", ["patch_size=8"]),
    ],
)
def test_each_family_trains_and_the_loss_falls(data, tmp_path, model, kwargs):
    args = [
        "train",
        "--data",
        str(data),
        "--model",
        model,
        "--output",
        str(tmp_path),
        "--epochs",
        "3",
        "--batch-size",
        "10",
        "--lr",
        "1e-3",
        *FAST,
        "--model-kwargs",
        *kwargs,
    ]
    assert cli_main(args) == 0
    rows = _metrics(tmp_path)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    keys = {"epoch", "train_loss", "val_top1", "val_top5", "lr", "epoch_seconds", "images_per_second"}
    assert all(keys <= r.keys() for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert all(0 < r["grad_norm"] <= r["grad_norm_max"] < 1e3 and r["nonfinite_grad_steps"] == 0 for r in rows)
    assert (tmp_path / "last.pth").is_file() and (tmp_path / "model.safetensors").is_file()
    # the saved weights evaluate to the logged validation accuracy
    assert (
        cli_main(
            [
                "eval",
                "--data",
                str(data),
                "--model",
                model,
                "--checkpoint",
                str(tmp_path / "model.safetensors"),
                "--img-size",
                "32",
                "--crop-pct",
                "1.0",
                "--workers",
                "0",
                "--json",
                str(tmp_path / "e.json"),
                "--model-kwargs",
                *kwargs,
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "e.json").read_text())["top1"] == pytest.approx(rows[-1]["val_top1"])


def _train_cmd(data, out, epochs=3, extra=()):
    return [
        sys.executable,
        "-m",
        "linvit",
        "train",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--output",
        str(out),
        "--epochs",
        str(epochs),
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
        "--deterministic",
        *FAST,
        "--aa",
        "rand-m9-mstd0.5-inc1",
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--reprob",
        "0.25",
        "--model-kwargs",
        "patch_size=8",
        "depth=4",
        *extra,
    ]


def test_resume_after_sigkill_equals_uninterrupted_run(data, tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_train_cmd(data, full), check=True, env=ENV, capture_output=True)
    proc = subprocess.Popen(_train_cmd(data, killed), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ((killed / "metrics.jsonl").exists() and (killed / "metrics.jsonl").read_text().count("\n") >= 1):
        assert proc.poll() is None and time.time() < deadline, "training ended before it could be killed"
        time.sleep(0.05)
    time.sleep(0.5)  # into epoch 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(_metrics(killed))
    assert 1 <= done < 3, f"the kill should land mid-run, {done} epochs were complete"
    subprocess.run(_train_cmd(data, killed, extra=["--resume", "auto"]), check=True, env=ENV, capture_output=True)
    a = torch.load(full / "last.pth", weights_only=True)
    b = torch.load(killed / "last.pth", weights_only=True)
    assert a["epoch"] == b["epoch"] == 2
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert [r["epoch"] for r in _metrics(killed)] == [0, 1, 2]
    assert [r["train_loss"] for r in _metrics(killed)] == [r["train_loss"] for r in _metrics(full)]


def test_torchrun_two_processes_agree(data, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "linvit",
        *_train_cmd(data, tmp_path, epochs=1)[3:],
    ]
    result = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"final_val_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["val_top1"] == ranks[1]["val_top1"] and ranks[0]["val_loss"] == ranks[1]["val_loss"]
    assert json.loads((tmp_path / "config.json").read_text())["linvit"]["world_size"] == 2
    assert len(_metrics(tmp_path)) == 1


def test_corrupt_training_image_is_replaced_and_counted(tmp_path):
    root = tmp_path / "data"
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=0, progress=False)
    (root / "train" / "4" / "00001.png").write_bytes(b"\x89PNG broken")
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="unreadable"):
        assert (
            cli_main(
                [
                    "train",
                    "--data",
                    str(root),
                    "--model",
                    "linear_infvit_tiny_patch16_224",
                    "--output",
                    str(out),
                    "--epochs",
                    "1",
                    "--batch-size",
                    "4",
                    *FAST,
                    "--model-kwargs",
                    "patch_size=8",
                    "depth=1",
                ]
            )
            == 0
        )
    record = _metrics(out)[0]
    assert record["replaced_images"] == 1 and record["skipped_images"] == 0  # every batch kept its size


def test_torchrun_with_a_corrupt_image_on_one_rank_completes(tmp_path):
    """Batch 1 per rank: the rank holding the corrupt image used to skip that step while the other entered the
    gradient all-reduce (a hang). Replaced at the dataset level, both ranks take every step and agree."""
    root = tmp_path / "data"
    build_cluttered_mnist(root, canvas=32, per_class_train=1, per_class_val=1, clutter=0, progress=False)
    (root / "train" / "3" / "00000.png").write_bytes(b"\x89PNG broken")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "linvit"]
    cmd += ["train", "--data", str(root), "--model", "linear_infvit_tiny_patch16_224", "--output", str(out)]
    cmd += ["--epochs", "1", "--batch-size", "1", "--workers", "0", "--device", "cpu", *FAST, "--no-progress"]
    cmd += ["--model-kwargs", "patch_size=8", "depth=1"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    record = _metrics(out)[0]
    assert record["replaced_images"] == 1
    finals = [json.loads((out / f"final_val_rank{r}.json").read_text()) for r in (0, 1)]
    measured = [{k: v for k, v in f.items() if k.startswith(("val_", "train_"))} for f in finals]
    assert measured[0] == measured[1] and "val_top1" in measured[0]


def test_a_non_finite_loss_on_one_rank_stops_every_rank(tmp_path):
    """stop_if_not_finite is collective: rank 1 alone saw NaN, and both ranks raise at the same step."""
    script = tmp_path / "check.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from linvit.engine import stop_if_not_finite\n"
        "dist.init_process_group('gloo')\n"
        "flag = torch.tensor(float(dist.get_rank() == 1))\n"
        "try:\n"
        "    stop_if_not_finite(flag, 0, 49)\n"
        "    print('continued')\n"
        "except FloatingPointError as err:\n"
        "    print('stopped:', err)\n"
        "dist.destroy_process_group()\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout  # the two ranks' lines may interleave
    assert out.count("1 non-finite loss value(s) by epoch 0 step 49") == 2 and "continued" not in out, out


def test_bad_runs_stop_with_one_line_errors(data, tmp_path, capsys):
    assert (
        cli_main(
            [
                "train",
                "--data",
                str(tmp_path / "none"),
                "--model",
                "deit_tiny_patch16_224",
                "--output",
                str(tmp_path / "o"),
                *FAST,
            ]
        )
        == 2
    )
    assert "not found" in capsys.readouterr().err
    small = tmp_path / "three"
    for cls in "abc":
        (small / "val" / cls).mkdir(parents=True)
        (small / "val" / cls / "x.png").write_bytes((data / "val" / "1" / "00002.png").read_bytes())
    ckpt = tmp_path / "ten.pth"
    import timm

    torch.save(timm.create_model("linear_infvit_tiny_patch16_224", num_classes=10, patch_size=8).state_dict(), ckpt)
    args = [
        "eval",
        "--data",
        str(small),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--checkpoint",
        str(ckpt),
        "--img-size",
        "32",
        "--workers",
        "0",
        "--model-kwargs",
        "patch_size=8",
    ]
    assert cli_main(args) == 2
    assert "10 classes" in capsys.readouterr().err


def test_fine_tune_a_converted_softmax_model_and_eval_rebuilds_it(data, tmp_path, capsys):
    """train softmax -> --pretrained-file + --convert linear_infsa -> eval --convert gives the logged accuracy."""
    common = ["--data", str(data), "--model", "deit_tiny_patch16_224", "--batch-size", "10", "--lr", "1e-3", *FAST]
    kwargs = ["--model-kwargs", "patch_size=8", "depth=2"]
    source = tmp_path / "softmax"
    assert cli_main(["train", *common, "--output", str(source), "--epochs", "1", *kwargs]) == 0
    tuned = tmp_path / "tuned"
    weights = str(source / "model.safetensors")
    args = ["--output", str(tuned), "--epochs", "1", "--pretrained-file", weights, "--convert", "linear_infsa"]
    assert cli_main(["train", *common, *args, *kwargs]) == 0
    timm_config = json.loads((tuned / "config.json").read_text())
    assert timm_config["architecture"] == "infsa_converted"  # timm rebuilds it converted (local-dir:RUN)
    assert timm_config["model_args"]["source_model"] == "deit_tiny_patch16_224"
    config = timm_config["linvit"]
    assert config["model"] == "deit_tiny_patch16_224" and config["convert"] == "linear_infsa"
    assert config["pretrained_file"] == weights
    assert [c["name"] for c in config["conversion"]["converted"]] == ["blocks.0.attn", "blocks.1.attn"]
    row = _metrics(tuned)[-1]
    evaluation = ["eval", "--data", str(data), "--model", "deit_tiny_patch16_224", "--img-size", "32"]
    evaluation += ["--crop-pct", "1.0", "--workers", "0", "--checkpoint", str(tuned / "model.safetensors")]
    evaluation += ["--json", str(tmp_path / "e.json")]
    assert cli_main([*evaluation, "--convert", "linear_infsa", *kwargs]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["top1"] == pytest.approx(row["val_top1"])
    assert cli_main([*evaluation, *kwargs]) == 2  # without --convert the weights do not fit
    assert "does not fit" in capsys.readouterr().err
    # the source evaluated as converted, before fine-tuning: softmax weights load first, then convert
    source_eval = [*evaluation[:-4], "--checkpoint", weights, "--convert", "linear_infsa", *kwargs]
    assert cli_main(source_eval) == 0


def test_a_run_folder_reloads_with_timm_and_eval_alone_and_reruns_from_its_config(data, tmp_path, capsys):
    import importlib.util

    import timm
    import yaml

    run = tmp_path / "run"
    tensorboard = importlib.util.find_spec("tensorboard") is not None  # an optional extra
    train = ["train", "--data", str(data), "--model", "deit_tiny_patch16_224", "--output", str(run), "--epochs", "2"]
    train += ["--batch-size", "10", "--lr", "1e-3", "--model-ema", "--model-ema-decay", "0.5"]
    train += ["--log", "tensorboard"] if tensorboard else []
    assert cli_main([*train, *FAST, "--model-kwargs", "patch_size=8", "depth=2"]) == 0
    rows = _metrics(run)
    config = json.loads((run / "config.json").read_text())
    assert config["architecture"] == "deit_tiny_patch16_224" and config["num_classes"] == 10
    assert config["label_names"][:2] == ["0", "1"] and config["model_args"]["patch_size"] == 8
    assert config["linvit"]["weights"] == "ema" and config["linvit"]["final"] == rows[-1]
    card = (run / "README.md").read_text()
    assert "local-dir:" in card and f"{rows[-1]['val_top1_ema']:.4g}" in card
    assert not tensorboard or list((run / "tensorboard").iterdir())  # an event file

    # timm rebuilds the trained model from the folder alone
    model = timm.create_model(f"local-dir:{run}", pretrained=True).eval()
    from linvit.weights import read_weights

    state, which = read_weights(run / "last.pth")
    assert which == "ema" and all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    # ... and describes its own data config to timm: 32 px as trained, not the architecture's 224
    data_config = timm.data.resolve_model_data_config(model)
    trained_on = config["linvit"]["data_config"]
    assert data_config["input_size"] == (3, 32, 32) and data_config.keys() == trained_on.keys()
    assert all(
        list(data_config[k]) == list(v) if isinstance(v, list) else data_config[k] == v for k, v in trained_on.items()
    )
    image = timm.data.create_transform(**data_config)(Image.new("RGB", (70, 50)))
    assert image.shape == (3, 32, 32) and model(image[None]).shape == (1, 10)
    import linvit

    reloaded = linvit.load_run(run)
    assert reloaded.label_names[:2] == ["0", "1"]
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in model.state_dict().items())

    def evaluate(*extra):
        out = tmp_path / "e.json"
        common = ["eval", "--data", str(data), "--workers", "0", "--json", str(out)]
        code = cli_main([*common, *extra])
        return json.loads(out.read_text()) if code == 0 else code

    by_folder = evaluate("--checkpoint", str(run))  # no --model: the run's args.yaml defines it
    assert by_folder["top1"] == pytest.approx(rows[-1]["val_top1_ema"]) and by_folder["weights"] == "ema"
    assert evaluate("--checkpoint", str(run / "last.pth"))["top1"] == pytest.approx(rows[-1]["val_top1_ema"])
    raw = evaluate("--checkpoint", str(run / "last.pth"), "--no-ema")
    assert raw["top1"] == pytest.approx(rows[-1]["val_top1"]) and raw["weights"] == "model"
    capsys.readouterr()
    assert evaluate("--checkpoint", str(run), "--no-ema") == 2
    assert "raw weights are in last.pth" in capsys.readouterr().err
    assert evaluate("--checkpoint", str(tmp_path)) == 2  # a folder without model.safetensors

    # args.yaml reruns the command exactly (a new output folder given on the command line)
    saved = yaml.safe_load((run / "args.yaml").read_text())
    assert saved["model_kwargs"] == {"patch_size": 8, "depth": 2} and saved["epochs"] == 2
    again = tmp_path / "again"
    assert cli_main(["train", "--config", str(run / "args.yaml"), "--output", str(again), "--log", "none"]) == 0
    assert _metrics(again)[-1]["val_top1"] == rows[-1]["val_top1"]


def test_train_pass_waits_for_the_device_once_per_check_interval(monkeypatch):
    """No host synchronisation per step (issue 22 item 8): the loss is summed on the device and read every
    CHECK_EVERY steps; before, each step called .item() twice and bool(isfinite(loss)) once."""
    from types import SimpleNamespace

    from linvit import engine

    syncs = []
    for name in ("item", "__bool__", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, _f=original, _n=name: syncs.append(_n) or _f(self))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = SimpleNamespace(step_update=lambda num_updates: None, step=lambda epoch: None)
    batches = [torch.randn(2, 4) for _ in range(120)]
    run = _bare_run(model, batches, optimizer, scheduler, clip_grad=None)
    record = engine.train_pass(run, 0, lambda x: (model(x).square().mean(), 2))
    assert record["train_loss"] > 0
    assert len(syncs) <= 3 * 2 + 1, syncs  # checks at steps 50, 100, 120 (flag + bar), and the epoch's total


def _one_epoch(model, batches, optimizer, clip_grad):
    from types import SimpleNamespace

    from linvit import engine

    scheduler = SimpleNamespace(step_update=lambda num_updates: None, step=lambda epoch: None)
    loss = lambda x: (model(x).square().mean(), len(x))  # noqa: E731
    return engine.train_pass(_bare_run(model, batches, optimizer, scheduler, clip_grad), 0, loss)


def _bare_run(model, batches, optimizer, scheduler, clip_grad, config=None):
    """The pieces of a linvit.engine.Run that train_pass and resume_run read, on the CPU, rank 0 of 1."""
    from types import SimpleNamespace

    from linvit.config import TrainConfig

    config = config or TrainConfig(progress=False, clip_grad=clip_grad)
    return SimpleNamespace(
        config=config,
        train_net=model,
        model=model,
        loader=batches,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=None,
        ema=None,
        device=torch.device("cpu"),
        rank=0,
        world=1,
    )


def test_train_pass_records_the_gradient_norm_before_clipping():
    """metrics.jsonl's grad_norm / grad_norm_max are the global L2 norms of the gradients before clipping (a
    learning rate of 0 keeps the weights, so each step's norm can be recomputed), and clipping still applies."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    batches = [torch.randn(3, 4) * (i + 1) for i in range(5)]
    expected = []
    for x in batches:
        grads = torch.autograd.grad(model(x).square().mean(), list(model.parameters()))
        expected.append(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item())
    record = _one_epoch(model, batches, torch.optim.SGD(model.parameters(), lr=0.0), clip_grad=1e-3)
    assert record["grad_norm"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)
    assert record["grad_norm_max"] == pytest.approx(max(expected), rel=1e-6)
    assert record["nonfinite_grad_steps"] == 0 and max(expected) > 1e-3

    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    _one_epoch(model, batches[:1], torch.optim.SGD(model.parameters(), lr=1.0), clip_grad=1e-3)
    step = torch.cat([p.detach().flatten() for p in model.parameters()]) - before
    assert torch.linalg.vector_norm(step).item() == pytest.approx(1e-3, rel=1e-4)  # clipped to --clip-grad


def test_gradient_norm_stats_count_non_finite_steps_apart():
    """fp16 steps the scaler skips (inf gradients) are counted, not averaged into the norm."""
    from linvit.engine import GradNormStats

    stats = GradNormStats(torch.device("cpu"))
    for norm in (2.0, float("inf"), 4.0, float("nan")):
        stats.add(torch.tensor(norm))
    assert GradNormStats.record(stats.values().tolist()) == {
        "grad_norm": 3.0,
        "grad_norm_max": 4.0,
        "nonfinite_grad_steps": 2,
    }
    empty = GradNormStats(torch.device("cpu"))
    empty.add(torch.tensor(float("inf")))
    assert GradNormStats.record(empty.values().tolist())["grad_norm"] is None


def _plan(epochs: int, **changes):
    """The arguments training_recipe and resume_run read, as a parsed command would give them."""
    from linvit.config import TrainConfig

    values = dict(epochs=epochs, lr=1e-3, weight_decay=0.05, warmup_epochs=1, amp="none", progress=False)
    return TrainConfig(**{**values, "clip_grad": None, "seed": 0, "resume": "auto", **changes})


def _lr_per_step(out, args, epochs, resume: bool = False) -> list[float]:
    """The learning rate of every optimizer step of the given epochs (of a run resumed from out if asked)."""
    from linvit import engine
    from linvit.utils.checkpoint import atomic_save
    from linvit.utils.runtime import rng_states

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    batches = [torch.randn(2, 4) for _ in range(5)]
    optimizer, scheduler, _ = engine.training_recipe(model, args, len(batches), torch.device("cpu"))
    run = _bare_run(model, batches, optimizer, scheduler, None, config=args)
    run.output = out
    if resume:
        assert engine.resume_run(run)[0] == epochs[0]
    seen = []

    def loss(x):
        seen.append(optimizer.param_groups[0]["lr"])
        return model(x).square().mean(), len(x)

    for epoch in epochs:
        engine.train_pass(run, epoch, loss)
        state = engine.training_state(run, epoch, [rng_states()], [])
        atomic_save(state, out / engine.CHECKPOINT)
    return seen


def test_a_run_resumed_with_more_epochs_follows_the_new_schedule(tmp_path, capsys):
    """Issue 39 item 3: a finished 1-epoch run resumed with --epochs 3 steps at the 3-epoch schedule's
    learning rates from epoch 1 on (timm's load_state_dict brought back the 1-epoch schedule: min lr
    throughout), and says which flag changed."""
    (tmp_path / "fresh").mkdir()
    fresh = _lr_per_step(tmp_path / "fresh", _plan(3), range(3))
    _lr_per_step(tmp_path, _plan(1), range(1))
    capsys.readouterr()
    resumed = _lr_per_step(tmp_path, _plan(3), range(1, 3), resume=True)
    assert resumed == fresh[5:] and len(set(resumed)) == len(resumed)
    assert "--epochs 1 -> 3" in capsys.readouterr().out


def test_resume_refuses_a_changed_model_and_follows_a_longer_plan(data, tmp_path, capsys):
    """`linvit train --resume auto` of a finished 1-epoch run with --epochs 3 logs the 3-epoch run's lr per
    epoch (the issue's [1e-5] * 3 before), records the new plan for the next resume, and refuses flags that
    make the checkpoint another experiment's with one line naming them."""
    import yaml

    def train(out, epochs, *extra):
        argv = ["train", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--output", str(out)]
        argv += ["--epochs", str(epochs), "--batch-size", "10", "--lr", "1e-3", "--min-lr", "1e-5", *FAST]
        return cli_main([*argv, "--warmup-epochs", "0", "--model-kwargs", "patch_size=8", "depth=1", *extra])

    assert train(tmp_path / "fresh", 3) == 0 and train(tmp_path / "run", 1) == 0
    capsys.readouterr()
    for changed, flag in ((["--batch-size", "5"], "--batch-size 10 -> 5"), (["--seed", "1"], "--seed 0 -> 1")):
        assert train(tmp_path / "run", 3, "--resume", "auto", *changed) == 2
        err = capsys.readouterr().err.strip()
        assert flag in err and len(err.splitlines()) == 1, err
    assert train(tmp_path / "run", 3, "--resume", "auto", "--model-kwargs", "patch_size=8", "depth=2") == 2
    assert "--model-kwargs" in capsys.readouterr().err
    assert train(tmp_path / "run", 3, "--resume", "auto") == 0
    assert "new schedule (--epochs 1 -> 3)" in capsys.readouterr().out
    fresh = [r["lr"] for r in _metrics(tmp_path / "fresh")]
    assert fresh == pytest.approx([7.525e-4, 2.575e-4, 1e-5], rel=1e-6)  # the cosine's end of each epoch
    assert [r["lr"] for r in _metrics(tmp_path / "run")][1:] == fresh[1:]
    assert yaml.safe_load((tmp_path / "run" / "args.yaml").read_text())["epochs"] == 3
    # compared with the latest plan, rerun from its args.yaml (model_kwargs in another order): nothing new
    assert cli_main(["train", "--config", str(tmp_path / "run" / "args.yaml"), "--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "new schedule" not in out


def test_a_one_process_resume_drops_the_wider_runs_rank_records(data, tmp_path):
    """A 2-process run resumed at 1 process kept both final_val_rank<r>.json at the 2-process run's last epoch
    beside the resumed run's own numbers; the one-process finish removes them (they are written per rank only
    under torchrun). Planted here as the 2-process run leaves them."""
    argv = ["train", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--output", str(tmp_path)]
    argv += ["--batch-size", "10", *FAST, "--model-kwargs", "patch_size=8", "depth=1"]
    assert cli_main([*argv, "--epochs", "1"]) == 0
    for r in (0, 1):
        (tmp_path / f"final_val_rank{r}.json").write_text(json.dumps({"epoch": 0}))
    assert cli_main([*argv, "--epochs", "2", "--resume", "auto"]) == 0
    assert not list(tmp_path.glob("final_val_rank*.json"))
    assert [r["epoch"] for r in _metrics(tmp_path)] == [0, 1]


def test_one_folder_spelled_two_ways_is_the_same_plan(tmp_path, monkeypatch):
    """A resume with --data ./digits, digits/ or an absolute path is the run's own plan, not a changed one;
    another folder is still a change; so are flags that change nothing the checkpoint holds."""
    from linvit.engine import plan_changes

    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits").mkdir()
    (tmp_path / "other").mkdir()
    saved = {"data": "digits", "epochs": "3"}
    for spelling in ("./digits", "digits/", str(tmp_path / "digits"), str(tmp_path / ".." / tmp_path.name / "digits")):
        assert plan_changes(saved, dict(data=spelling, epochs=3)) == {}
    assert plan_changes(saved, dict(data="other", epochs=3)) == {"data": ("digits", "other")}
    # the starting weights and gradient checkpointing change nothing a checkpoint holds
    started = {**saved, "pretrained_file": "None", "grad_checkpointing": "False"}
    assert plan_changes(started, dict(data="digits", epochs=3, pretrained_file="w.pth", grad_checkpointing=True)) == {}


def test_changed_flags_are_named_in_the_configs_order():
    """A resume refused for --mixer named --gamma-init (which followed from it) first: alphabetical order."""
    from linvit.distillation import DistillConfig
    from linvit.engine import plan_changes

    saved = {"mixer": "katz_infsa", "gamma_init": "0.5"}
    now = DistillConfig(teacher="t", mixer="linear_attention:hedgehog", gamma_init=0.9).to_dict()
    assert list(plan_changes(saved, now)) == ["mixer", "gamma_init"]


def test_numpy_numbers_in_a_config_are_stored_as_plain_numbers():
    """linvit.distill(..., lr=np.float64(1e-4)) trained its first stage, then failed writing args.yaml (YAML has
    no NumPy scalars): configs store them as Python numbers; a gamma_init that is no number is refused at once."""
    import numpy as np
    import yaml

    from linvit.distillation import DistillConfig
    from linvit.errors import UsageError

    options = dict(lr=np.float64(1e-4), epochs=np.int64(2), gamma_init=np.float32(0.5), transfer_lr=torch.tensor(2e-3))
    config = DistillConfig(teacher="t", mixer="katz_rows:hedgehog", **options)
    stored = yaml.safe_load(config.to_yaml())
    assert (stored["lr"], stored["epochs"], stored["gamma_init"]) == (1e-4, 2, 0.5)
    assert stored["transfer_lr"] == pytest.approx(2e-3) and type(stored["transfer_lr"]) is float
    assert type(stored["epochs"]) is int
    with pytest.raises(UsageError, match="gamma_init must be a number"):
        DistillConfig(teacher="t", mixer="linear_attention:hedgehog", gamma_init="abc")


@pytest.mark.parametrize("warmup", [0, 1])
def test_lr_scales_train_their_parameters_at_that_multiple_of_every_step(warmup):
    """training_recipe's lr_scales: the named parameters get groups of their own (timm's decay / no-decay split
    kept) whose lr is the factor times the base lr at every step, the first one, the warm-up and the cosine
    included; the rest train exactly as without it."""
    from linvit import engine

    def lrs(scales):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
        args = _plan(2, warmup_epochs=warmup)
        batches = [torch.randn(2, 4) for _ in range(3)]
        optimizer, scheduler, _ = engine.training_recipe(
            model,
            args,
            len(batches),
            torch.device("cpu"),
            lr_scales={p: 5.0 for p in model[0].parameters()} if scales else None,
        )
        run, seen = _bare_run(model, batches, optimizer, scheduler, None, config=args), []

        def loss(x):
            seen.append([(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups])
            return model(x).square().mean(), len(x)

        for epoch in range(2):
            engine.train_pass(run, epoch, loss)
        return seen

    plain, scaled = lrs(False), lrs(True)
    assert [len(step) for step in plain] == [2] * 6 and [len(step) for step in scaled] == [4] * 6
    for before, after in zip(plain, scaled, strict=True):
        for (lr, decay, count), rest, moved in zip(before, after[0::2], after[1::2], strict=True):
            assert rest == (lr, decay, count - 1)  # one of model[0]'s two tensors left each of timm's groups
            assert moved[0] == pytest.approx(5 * lr, rel=1e-12) and moved[1:] == (decay, 1)
    assert {step[0][1] for step in plain} | {step[1][1] for step in plain} == {0.0, 0.05}  # no decay, decay
