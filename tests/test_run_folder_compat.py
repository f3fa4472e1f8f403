"""Run folders written before the typed configs (tests/fixtures/run_v0_*, made by make_run_v0.py at 6a5d596)
still load: linvit.load_run, `linvit eval` / `linvit segment eval` on the folder, and timm's local-dir:, each
giving the outputs and metrics the old code recorded in the folder's expected.json."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import timm
import torch

import linvit
from linvit.cli import main as cli_main

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_run_v0 import fixed_input, fixture_data, segment_summary  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return fixture_data(tmp_path_factory.mktemp("cmnist"))


@pytest.fixture
def runs(tmp_path):
    """A copy of the fixtures, so that nothing a command writes lands in the source tree."""
    for name in ("run_v0_classify", "run_v0_segment"):
        shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path


def _expected(folder: Path) -> dict:
    return json.loads((folder / "expected.json").read_text())


def _outputs(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(fixed_input())


def test_an_old_classification_run_loads_with_load_run_and_local_dir(runs):
    run = runs / "run_v0_classify"
    expected = torch.tensor(_expected(run)["logits"])
    model = linvit.load_run(run)
    assert model.label_names == [str(i) for i in range(10)] and not model.training
    torch.testing.assert_close(_outputs(model), expected, **TOL)
    by_timm = timm.create_model(f"local-dir:{run}", pretrained=True)
    torch.testing.assert_close(_outputs(by_timm), expected, **TOL)


def test_an_old_classification_run_evaluates_from_its_folder(runs, data, tmp_path):
    run, out = runs / "run_v0_classify", tmp_path / "e.json"
    argv = ["eval", "--data", str(data), "--checkpoint", str(run), "--workers", "0", "--device", "cpu"]
    assert cli_main([*argv, "--json", str(out)]) == 0  # no --model: the run's args.yaml defines it
    got, expected = json.loads(out.read_text()), _expected(run)["eval"]
    assert got["weights"] == expected["weights"] == "ema" and got["images"] == expected["images"]
    assert got["model"] == expected["model"]
    for key in ("top1", "top5", "loss"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5)


def test_an_old_segmentation_run_loads_and_evaluates(runs, data, tmp_path):
    run, out = runs / "run_v0_segment", tmp_path / "s.json"
    expected = _expected(run)
    model = linvit.load_run(run)
    assert model.label_names[1] == "digit 0" and not model.training
    got = segment_summary(_outputs(model))
    for key in ("class_means", "pixels"):
        torch.testing.assert_close(torch.tensor(got[key]), torch.tensor(expected["summary"][key]), **TOL)
    argv = ["segment", "eval", "--data", str(data), "--checkpoint", str(run), "--workers", "0", "--device", "cpu"]
    assert cli_main([*argv, "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    for key in ("miou", "pixel_acc", "mean_acc"):
        assert metrics[key] == pytest.approx(expected["eval"][key], rel=1e-5)
    assert metrics["per_class_iou"] == pytest.approx(expected["eval"]["per_class_iou"], rel=1e-5)
