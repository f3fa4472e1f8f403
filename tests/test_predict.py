"""linvit.load_image / linvit.predict / `linvit predict` on real photographs and awkward image files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import timm
import torch
from PIL import Image

import linvit
from linvit.cli import main as cli_main
from linvit.inference import find_images, native_size, read_rgb

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"  # china.jpg, flower.jpg (640 x 427)


@pytest.fixture(scope="module")
def model():
    return timm.create_model("linear_infvit_tiny_patch16_224", depth=1, num_classes=7).eval()


def test_find_images_takes_files_folders_and_globs(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/x.png", "a/b/y.JPG", "a/notes.txt"):
        (tmp_path / name).write_bytes(b"")
    found = find_images([tmp_path / "a", str(tmp_path / "a" / "*.png"), PHOTOS / "china.jpg"])
    assert [p.name for p in found] == ["y.JPG", "x.png", "china.jpg"]  # by path, recursive, no duplicates or .txt
    with pytest.raises(ValueError, match="no such image"):
        find_images([tmp_path / "missing.png"])


def test_awkward_files_read_as_upright_8_bit_rgb(tmp_path):
    Image.fromarray(np.full((5, 9), 40000, dtype=np.uint16)).save(tmp_path / "deep.png")  # 16-bit greyscale
    Image.new("RGBA", (4, 4), (255, 0, 0, 0)).save(tmp_path / "clear.png")  # fully transparent red
    Image.new("L", (3, 2), 90).save(tmp_path / "grey.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    Image.new("RGB", (8, 4), (10, 20, 30)).save(tmp_path / "phone.jpg", exif=exif)
    deep = read_rgb(tmp_path / "deep.png")
    assert deep.mode == "RGB" and deep.getpixel((0, 0)) == (156, 156, 156)  # 40000 / 65535 * 255
    assert read_rgb(tmp_path / "clear.png").getpixel((0, 0)) == (255, 255, 255)  # over white
    assert read_rgb(tmp_path / "grey.png").getpixel((0, 0)) == (90, 90, 90)
    assert read_rgb(tmp_path / "phone.jpg").size == (4, 8)  # EXIF applied: portrait
    with pytest.raises(ValueError, match="above --max-pixels 31"):
        read_rgb(tmp_path / "phone.jpg", max_pixels=31)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(ValueError, match="cannot read it as an image"):
        read_rgb(tmp_path / "broken.png")


def test_max_pixels_replaces_pils_own_guard(tmp_path, monkeypatch):
    """PIL refuses images above 2 x Image.MAX_IMAGE_PIXELS (179 MP) whatever --max-pixels says; ours decides."""
    Image.new("RGB", (20, 20)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # PIL would refuse 400 pixels
    assert read_rgb(tmp_path / "big.png", max_pixels=1000).size == (20, 20)
    assert Image.MAX_IMAGE_PIXELS == 10  # restored
    with pytest.raises(ValueError, match="above --max-pixels 399"):
        read_rgb(tmp_path / "big.png", max_pixels=399)


def test_float_images_in_unit_range_keep_their_brightness(tmp_path):
    Image.fromarray(np.full((3, 3), 0.5, dtype=np.float32), mode="F").save(tmp_path / "f.tiff")
    assert read_rgb(tmp_path / "f.tiff").getpixel((0, 0)) == (128, 128, 128)


def test_broken_files_are_one_line_errors(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(ValueError, match="cannot read it as an image"):
        read_rgb(tmp_path / "broken.png")


def test_load_image_sizes(model):
    photo = PHOTOS / "china.jpg"
    assert linvit.load_image(photo, model).shape == (3, 224, 224)  # the model's data config
    assert linvit.load_image(photo, model, img_size=(96, 160)).shape == (3, 96, 160)
    assert linvit.load_image(photo, model, native=True).shape == (3, 432, 640)  # 427 x 640 on the 16 px grid
    assert native_size((5, 40), (16, 16)) == (16, 48)


def test_predict_batches_equal_sizes_and_matches_the_model(model):
    photo = PHOTOS / "flower.jpg"
    images = [linvit.load_image(photo, model, img_size=s) for s in (64, 96, 64)]
    out = linvit.predict(model, images, topk=3, label_names=list("abcdefg"), batch_size=2)
    with torch.no_grad():
        expected = model(images[1][None]).softmax(-1)[0]
    top = out[1]["topk"]
    assert [t["class"] for t in top] == expected.topk(3).indices.tolist()
    assert top[0]["label"] == "abcdefg"[top[0]["class"]] and top[0]["prob"] == pytest.approx(expected.max().item())
    same = [(t["class"], t["label"]) for t in out[0]["topk"]] == [(t["class"], t["label"]) for t in out[2]["topk"]]
    assert same  # the same picture at the same size, in one batch (probabilities equal up to GEMM rounding)
    assert [t["prob"] for t in out[0]["topk"]] == pytest.approx([t["prob"] for t in out[2]["topk"]], rel=1e-5)


def test_predict_command_writes_one_json_line_per_image(tmp_path, capsys):
    out = tmp_path / "preds.jsonl"
    argv = ["predict", str(PHOTOS), "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*argv, "--native", "--topk", "2", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["path"]).name for r in rows] == ["china.jpg", "flower.jpg"]
    assert rows[0]["size"] == [432, 640] and len(rows[0]["topk"]) == 2 and rows[0]["seconds"] > 0
    assert "china.jpg: " in capsys.readouterr().out
    assert cli_main(["predict", str(PHOTOS)]) == 2
    assert "--checkpoint RUN" in capsys.readouterr().err
