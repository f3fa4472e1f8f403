"""The one trainer (linvit.engine.fit): every task resumes bit-exactly, a user's own Task trains, and the epoch
loop exists once in src/."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from linvit.config import TrainConfig
from linvit.engine import Parts, Task, fit
from linvit_cli import main as cli_main

SRC = Path(__file__).resolve().parents[1] / "src" / "linvit"
TIMINGS = {"epoch_seconds", "images_per_second"}
TINY = ["--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "patch_size=8", "depth=1"]
TINY += ["--workers", "0", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from linvit.data import build_cluttered_mnist

    root = tmp_path_factory.mktemp("fitdata")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=1, progress=False)
    return root


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    from linvit.data.cluttered_mnist import build_detection_set

    root = tmp_path_factory.mktemp("fitdet")
    build_detection_set(root, digits_per_image=2, canvas=48, per_class_train=1, per_class_val=1, clutter=1)
    return root / "detection"


def _commands(digits, coco) -> dict[str, list[str]]:
    return {
        "train": ["train", "--data", str(digits), *TINY, "--img-size", "32", "--aa", "none", "--reprob", "0"]
        + ["--crop-pct", "1.0", "--batch-size", "8", "--model-ema", "--model-ema-decay", "0.9", "--clip-grad", "1"],
        "segment": ["segment", "train", "--data", str(digits), *TINY, "--batch-size", "4", "--crop-size", "32"]
        + ["--pyramid-channels", "16", "--head-channels", "8"],
        "detect": ["detect", "train", "--data", str(coco), "--train-split", "train", "--val-split", "val", *TINY]
        + ["--min-size", "48", "--max-size", "64", "--anchor-base", "8", "--pyramid-channels", "16"],
        "generate": ["generate", "train", "--data", "digits:digit,canvas=32,clutter=0,length=32", "--mixer"]
        + ["linear_infsa", "--batch-size", "16", "--workers", "0", "--val-images", "8", "--no-progress"],
    }


def _numbers(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]


def _needs(module: str):
    """generate trains with diffusers' noise schedule, an extra the minimum-versions job does not install."""
    if importlib.util.find_spec(module) is None:
        return pytest.mark.skip(reason=f"needs {module} (an optional extra)")
    return ()


@pytest.mark.parametrize("command", ["train", "segment", "detect", pytest.param("generate", marks=_needs("diffusers"))])
def test_every_task_resumes_bit_exactly(command, digits, coco, tmp_path):
    """2 epochs in one go == 1 epoch, then --resume auto to 2: every number of every epoch (loss, lr, gradient
    norms, dead heads, validation) the same, for each Task on the one trainer."""
    argv = _commands(digits, coco)[command]
    assert cli_main([*argv, "--epochs", "2", "--output", str(tmp_path / "full")]) == 0
    assert cli_main([*argv, "--epochs", "1", "--output", str(tmp_path / "cut")]) == 0
    assert cli_main([*argv, "--epochs", "2", "--output", str(tmp_path / "cut"), "--resume", "auto"]) == 0
    full, resumed = _numbers(tmp_path / "full"), _numbers(tmp_path / "cut")
    assert len(full) == 2 and full[1] == resumed[1]
    assert {k: v for k, v in full[0].items() if k != "lr"} == {k: v for k, v in resumed[0].items() if k != "lr"}
    saved = json.loads((tmp_path / "full" / "config.json").read_text())["linvit"]
    assert saved["args"]["epochs"] == 2 and saved["final"] == json.loads(
        (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[-1]
    )


class LineFit(Task):
    """A user's own task in a few lines: fit y = 3x - 1 with a linear layer."""

    name = "line"

    def build(self, config, device, rank, world):
        x = torch.linspace(-1, 1, 64)[:, None]
        data = TensorDataset(x, 3 * x - 1)
        return Parts(nn.Linear(1, 1), data, [(x, 3 * x - 1)])

    def batch_loss(self, run, batch):
        x, y = (t.to(run.device) for t in batch)
        return nn.functional.mse_loss(run.train_net(x), y), len(x)

    def evaluate(self, run, epoch):
        x, y = run.parts.val_loader[0]
        with torch.no_grad():
            return {"val_mse": nn.functional.mse_loss(run.model(x), y).item()}


def test_a_task_of_your_own_trains_into_a_model_folder(tmp_path):
    config = TrainConfig(output=str(tmp_path), epochs=20, batch_size=8, lr=0.3, warmup_epochs=0, weight_decay=0.0)
    config = config.replace(workers=0, progress=False, device="cpu")
    history = fit(LineFit(), config)
    assert len(history) == 20 and history[-1]["val_mse"] < 1e-4 < history[0]["val_mse"]
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "last.pth").is_file()
    assert TrainConfig.from_yaml(tmp_path / "args.yaml") == config  # the run folder stores its config


def test_the_epoch_loop_and_the_optimizer_step_exist_once():
    """No module outside linvit/engine loops over epochs or steps an optimizer: every task is a Task on fit()."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.parent.name == "engine" and path.parent.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == "epoch":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} for epoch")
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("zero_grad", "backward")
                and "optimizer" in ast.dump(node.value)
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {node.attr}")
    assert offenders == []
