"""`linvit detect predict` and `linvit segment predict`: runs on any picture, outputs in its pixels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import torch
from PIL import Image

import linvit
from linvit.cli import main as cli_main
from linvit.data.cluttered_mnist import build_cluttered_mnist, build_detection_set
from linvit.data.images import read_rgb

PHOTO = Path(sklearn.datasets.__file__).parent / "images" / "flower.jpg"  # 640 x 427
BACKBONE = ["--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "patch_size=8", "depth=1"]
COMMON = ["--workers", "0", "--device", "cpu", "--no-progress", "--warmup-epochs", "0", "--epochs", "1"]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """A real photograph and a digit canvas in a nested folder."""
    root = tmp_path_factory.mktemp("pictures")
    (root / "sub").mkdir()
    Image.open(PHOTO).save(root / "flower.png")
    Image.new("RGB", (72, 40), (30, 30, 30)).save(root / "sub" / "dark.png")
    return root


@pytest.fixture(scope="module")
def mask_rcnn_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    build_detection_set(root, digits_per_image=2, canvas=48, per_class_train=2, per_class_val=1, clutter=1)
    run = root / "run"
    argv = ["detect", "train", "--data", str(root / "detection"), "--output", str(run), "--detector", "maskrcnn"]
    argv += ["--min-size", "48", "--max-size", "64", "--anchor-base", "8", "--pyramid-channels", "16"]
    argv += ["--batch-size", "2", "--lr", "1e-3", "--train-split", "train", "--val-split", "val"]
    assert cli_main([*argv, *BACKBONE, *COMMON]) == 0
    return run


@pytest.fixture(scope="module")
def segment_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=2, progress=False)
    run = root / "run"
    argv = ["segment", "train", "--data", str(root), "--output", str(run), "--batch-size", "4", "--lr", "1e-3"]
    argv += ["--crop-size", "32", "--scale", "1", "1", "--hflip", "0", "--resize", "32"]
    assert cli_main([*argv, *BACKBONE, *COMMON]) == 0
    return run


def test_detect_predict_boxes_are_the_models_in_picture_pixels(mask_rcnn_run, pictures, tmp_path):
    out, drawn = tmp_path / "dets.jsonl", tmp_path / "drawn"
    argv = ["detect", "predict", str(pictures), "--checkpoint", str(mask_rcnn_run), "--output", str(out)]
    assert cli_main([*argv, "--draw", str(drawn), "--score-thresh", "0", "--no-progress"]) == 0
    rows = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows.keys() == {"flower.png", "dark.png"} and rows["flower.png"]["size"] == [427, 640]
    model = linvit.load_run(mask_rcnn_run)
    model.roi_heads.score_thresh = 0.0  # what --score-thresh 0 asks of torchvision's own floor (0.05)
    with torch.no_grad():
        picture = torch.from_numpy(np.array(read_rgb(pictures / "flower.png"))).permute(2, 0, 1).float() / 255
        expected = model([picture])[0]
    got = rows["flower.png"]["detections"]
    assert len(got) == len(expected["scores"]) > 0  # threshold 0 keeps everything the detector returned
    np.testing.assert_allclose([d["box"] for d in got], expected["boxes"].numpy(), atol=0.051)  # rounded to 0.1 px
    assert all(0 <= d["box"][0] <= d["box"][2] <= 640 and 0 <= d["box"][1] <= d["box"][3] <= 427 for d in got)
    assert {d["label"] for d in got} <= set(model.label_names) and all("mask_pixels" in d for d in got)
    assert Image.open(drawn / "flower.png").size == (640, 427) and Image.open(drawn / "sub" / "dark.png").size == (
        72,
        40,
    )

    assert cli_main([*argv, "--score-thresh", "1.01"]) == 2
    high = max(d["score"] for d in got)
    assert cli_main([*argv, "--score-thresh", str(min(1.0, high + 1e-3)), "--no-progress"]) == 0
    assert all(not json.loads(line)["detections"] for line in out.read_text().splitlines())


def test_segment_predict_class_maps_line_up_with_the_picture(segment_run, pictures, tmp_path):
    out, drawn = tmp_path / "segs.jsonl", tmp_path / "drawn"
    argv = ["segment", "predict", str(pictures), "--checkpoint", str(segment_run), "--output", str(out)]
    assert cli_main([*argv, "--draw", str(drawn), "--no-progress"]) == 0
    rows = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    classes = np.asarray(Image.open(drawn / "flower_classes.png"))
    assert classes.shape == (427, 640) and Image.open(drawn / "flower.png").size == (640, 427)
    assert sum(rows["flower.png"]["classes"].values()) == pytest.approx(1, abs=1e-3)
    model = linvit.load_run(segment_run)
    from linvit.prediction.segment import segment

    expected = segment(model, read_rgb(pictures / "flower.png"), torch.device("cpu"), 32)  # the run's --img-size
    np.testing.assert_array_equal(classes, expected.numpy())
    names = model.label_names
    share = {names[c]: float((expected == c).float().mean()) for c in expected.unique().tolist()}
    assert rows["flower.png"]["classes"] == pytest.approx(share, abs=1e-4)


def test_predict_commands_refuse_the_wrong_kind_of_run(mask_rcnn_run, segment_run, pictures, capsys):
    assert cli_main(["segment", "predict", str(pictures), "--checkpoint", str(mask_rcnn_run)]) == 2
    assert "not a `linvit segment train` run" in capsys.readouterr().err
    assert cli_main(["detect", "predict", str(pictures), "--checkpoint", str(segment_run)]) == 2
    assert "not a `linvit detect train` run" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["segment", "detect"])
def test_unreadable_pictures_are_skipped_as_predict_skips_them(command, mask_rcnn_run, segment_run, tmp_path, capsys):
    """One broken file among the pictures: reported and skipped, the others written (it stopped the whole run,
    writing nothing); none readable is one line."""
    folder = tmp_path / "pictures"
    folder.mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(folder / "red.png")
    (folder / "broken.jpg").write_bytes(b"not a picture")
    run, out = {"segment": segment_run, "detect": mask_rcnn_run}[command], tmp_path / "out.jsonl"
    argv = [command, "predict", str(folder), "--checkpoint", str(run), "--output", str(out), "--no-progress"]
    assert cli_main(argv) == 0
    assert [Path(json.loads(line)["path"]).name for line in out.read_text().splitlines()] == ["red.png"]
    err = capsys.readouterr().err
    assert "skipped" in err and "broken.jpg: cannot read it as an image" in err and "skipped 1 of 2 pictures" in err
    assert cli_main([command, "predict", str(folder / "broken.jpg"), "--checkpoint", str(run)]) == 2
    assert "none of the 1 pictures could be read" in capsys.readouterr().err
