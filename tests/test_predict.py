"""linvit.load_image / linvit.predict / `linvit predict` on real photographs and awkward image files."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import timm
import torch
from PIL import Image

import linvit
from linvit.cli import main as cli_main
from linvit.data.images import find_images, read_rgb
from linvit.prediction.classify import native_size

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
    (tmp_path / "a" / "b" / "y.JPG").unlink()
    with pytest.raises(ValueError, match=r"b: a folder with no image files in it \(\.jpg"):  # it was "no such"
        find_images([tmp_path / "a" / "b"])


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
    assert cli_main([*argv, "--native", "--topk", "2", "--output", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["path"]).name for r in rows] == ["china.jpg", "flower.jpg"]
    assert rows[0]["size"] == [432, 640] and len(rows[0]["topk"]) == 2 and rows[0]["seconds"] > 0
    assert "china.jpg: " in capsys.readouterr().out
    assert cli_main(["predict", str(PHOTOS)]) == 2
    assert "--checkpoint RUN" in capsys.readouterr().err


def test_predict_lines_are_not_written_into_the_progress_bar(monkeypatch):
    """On a terminal the bar (stderr) and the per-picture lines (stdout) share one screen: each line is written
    above the bar (tqdm.write), never after its text on the same line."""
    import io

    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    argv = ["predict", str(PHOTOS), "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*argv, "--native", "--batch-size", "1", "--progress"]) == 0
    shown = [line.rsplit("\r", 1)[-1] for line in screen.getvalue().split("\n")]  # what stays on each line
    picture_lines = [line for line in shown if ".jpg: " in line]
    assert len(picture_lines) == 2 and all(line.startswith(str(PHOTOS)) for line in picture_lines), shown
    assert re.search(r"2/2 \[[^]]*(image/s|s/image)", screen.getvalue())  # counts images, as --help says


def test_seen_box_is_the_region_timms_eval_transform_keeps():
    """A picture whose red channel is its x coordinate and green its y: the transformed corners read back the box."""
    from timm.data import create_transform

    from linvit.explain.overlay import seen_box

    width, height = 640, 400
    xs, ys = np.meshgrid(np.arange(width) * 255 / (width - 1), np.arange(height) * 255 / (height - 1))
    picture = Image.fromarray(np.stack([xs, ys, xs * 0], -1).round().astype(np.uint8))
    config = {"input_size": (3, 64, 64), "crop_pct": 0.8, "interpolation": "bilinear", "crop_mode": "center"}
    config.update(mean=(0, 0, 0), std=(1, 1, 1))
    seen = create_transform(**config, is_training=False)(picture) * 255
    left, top, right, bottom = seen_box((width, height), config)
    assert (right - left, bottom - top) == pytest.approx((320, 320))  # 400 / (64 / 0.8) * 64
    pixel = 320 / 64  # one output pixel in original pixels; its centre is half of one in from the box's edge
    for got, want, side in [
        (seen[0, 32, 0], left, width),
        (seen[0, 32, -1], right, width),
        (seen[1, 0, 32], top, height),
    ]:
        edge = want + (pixel / 2 if want in (left, top) else -pixel / 2)
        assert float(got) * (side - 1) / 255 == pytest.approx(edge, abs=2.5)
    assert seen_box((width, height), None) == (0, 0, width, height)


def test_overlay_keeps_the_size_and_dims_only_what_the_model_did_not_see():
    from linvit.explain.overlay import OUTSIDE_DIM, colour_table, overlay

    picture = Image.new("RGB", (50, 30), (200, 100, 40))
    ramp = np.arange(12, dtype=np.float32).reshape(3, 4)
    drawn = np.asarray(overlay(picture, ramp, box=(10, 0, 40, 30), alpha=0.5))
    assert drawn.shape == (30, 50, 3)
    assert tuple(drawn[5, 2]) == tuple(int(v * OUTSIDE_DIM) for v in (200, 100, 40))  # left of the box
    cold, hot = colour_table()[0].astype(int), colour_table()[255].astype(int)
    assert np.abs(drawn[0, 10].astype(int) - (np.array([200, 100, 40]) + cold) / 2).max() <= 1  # lowest value
    assert np.abs(drawn[29, 39].astype(int) - (np.array([200, 100, 40]) + hot) / 2).max() <= 1  # highest value
    flat = np.asarray(overlay(picture, np.ones((3, 4)), alpha=1.0))
    assert (flat == colour_table()[0]).all()  # a constant map is one colour, not noise stretched to full range


def test_predict_maps_are_overlays_at_the_original_size(tmp_path, capsys):
    (tmp_path / "in" / "sub").mkdir(parents=True)
    Image.open(PHOTOS / "china.jpg").save(tmp_path / "in" / "china.png")
    Image.open(PHOTOS / "flower.jpg").resize((200, 120)).save(tmp_path / "in" / "sub" / "flower.png")
    name = "linear_infvit_tiny_patch16_224"
    out, maps = tmp_path / "preds.jsonl", tmp_path / "maps"
    argv = ["predict", str(tmp_path / "in"), "--model", name, "--model-kwargs", "depth=1", "--img-size", "64", "96"]
    assert cli_main([*argv, "--maps", str(maps), "--output", str(out), "--no-progress", "--method", "column"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["map"]).relative_to(maps).as_posix() for r in rows] == ["china.png", "sub/flower.png"]
    assert {r["map_method"] for r in rows} == {"column"}
    assert Image.open(maps / "china.png").size == (640, 427) and Image.open(maps / "sub" / "flower.png").size == (
        200,
        120,
    )
    assert np.load(maps / "sub" / "flower.npy").shape == (4, 6)  # the 64 x 96 input's patch grid
    assert cli_main(["predict", str(tmp_path / "in"), "--model", name, "--maps", str(maps), "--method", "nope"]) == 2
    assert cli_main(["predict", str(tmp_path / "in"), "--model", name, "--method", "column"]) == 2  # no --maps
    assert "--method column chooses how --maps are computed: add --maps DIR" in capsys.readouterr().err


def test_predict_maps_match_importance_maps(tmp_path, model):
    from linvit.explain.maps import importance_maps
    from linvit.prediction.classify import MapWriter

    picture = read_rgb(PHOTOS / "flower.jpg")
    tensor = linvit.load_image(PHOTOS / "flower.jpg", model, native=True)
    writer = MapWriter(model, tmp_path, None, [PHOTOS / "flower.jpg"], crop=False)
    record = writer.write(PHOTOS / "flower.jpg", picture, tensor)
    expected = importance_maps(model, tensor[None]).patch[0].numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "flower.npy"), expected)
    assert record["map_method"] == "linear" and expected.shape == (27, 40)


def test_predict_with_a_run_folder_names_its_labels_and_draws_maps(tmp_path):
    """The issue's first 'done' line: a folder of real photographs, a run folder, preds.jsonl and overlays."""
    from linvit.data import build_cluttered_mnist

    data = tmp_path / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=1, per_class_val=1, clutter=1, progress=False)
    run = tmp_path / "run"
    argv = ["train", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--output", str(run)]
    argv += ["--img-size", "32", "--workers", "0", "--epochs", "1", "--batch-size", "4", "--no-progress"]
    assert cli_main([*argv, "--model-kwargs", "patch_size=8", "depth=1"]) == 0
    out, maps = tmp_path / "preds.jsonl", tmp_path / "maps"
    argv = ["predict", str(PHOTOS), "--checkpoint", str(run), "--output", str(out), "--maps", str(maps)]
    assert cli_main([*argv, "--no-progress", "--compile", "default", "--amp", "none"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["topk"][0]["label"] for r in rows} <= set("0123456789") and rows[0]["size"] == [32, 32]
    assert [Image.open(r["map"]).size for r in rows] == [(640, 427), (640, 427)]  # both photographs' own size
    model = linvit.load_run(run)
    expected = linvit.predict(model, [linvit.load_image(PHOTOS / "china.jpg", model)], topk=5)[0]["topk"]
    assert [t["class"] for t in rows[0]["topk"]] == [t["class"] for t in expected]  # compiled = eager ranking
    assert [t["prob"] for t in rows[0]["topk"]] == pytest.approx([t["prob"] for t in expected], abs=1e-5)


def test_predict_skips_unreadable_pictures_and_counts_them(tmp_path, capsys):
    """Issue 39 item 13: one broken file is skipped and reported, as explain does; the others are written."""
    folder = tmp_path / "in"
    folder.mkdir()
    Image.open(PHOTOS / "china.jpg").resize((64, 48)).save(folder / "a.png")
    (folder / "b.png").write_bytes((PHOTOS / "flower.jpg").read_bytes()[:2000])  # truncated
    (folder / "c.jpg").write_text("not a picture")
    Image.open(PHOTOS / "flower.jpg").resize((64, 48)).save(folder / "d.png")
    out = tmp_path / "preds.jsonl"
    argv = ["predict", str(folder), "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*argv, "--img-size", "32", "--batch-size", "2", "--output", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["path"]).name for r in rows] == ["a.png", "d.png"]
    err = capsys.readouterr().err
    assert "b.png" in err and "c.jpg" in err and "skipped 2 of 4 pictures" in err
    for name in ("a.png", "d.png"):
        (folder / name).unlink()
    assert cli_main([*argv, "--output", str(tmp_path / "none.jsonl"), "--no-progress"]) == 2
    assert "none of the 2 pictures could be read" in capsys.readouterr().err
    assert not (tmp_path / "none.jsonl").exists()


def test_map_files_of_pictures_with_the_same_stem_do_not_collide(tmp_path):
    """Issue 39 item 11: c/flower.jpg and c/flower.png get a map each, and each JSON line names its own."""
    folder = tmp_path / "in" / "c"
    folder.mkdir(parents=True)
    Image.open(PHOTOS / "flower.jpg").resize((64, 48)).save(folder / "flower.jpg")
    Image.open(PHOTOS / "china.jpg").resize((96, 32)).save(folder / "flower.png")
    Image.open(PHOTOS / "china.jpg").resize((32, 32)).save(folder / "china.png")
    out, maps = tmp_path / "preds.jsonl", tmp_path / "maps"
    argv = ["predict", str(tmp_path / "in"), "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*argv, "--native", "--maps", str(maps), "--output", str(out), "--no-progress"]) == 0
    rows = {Path(r["path"]).name: r for r in map(json.loads, out.read_text().splitlines())}
    names = {k: Path(r["map"]).relative_to(maps).as_posix() for k, r in rows.items()}
    assert names == {"china.png": "china.png", "flower.jpg": "flower.jpg.png", "flower.png": "flower.png.png"}
    for name, row in rows.items():
        grid = [side // 16 for side in row["size"]]
        assert np.load(Path(row["map"]).with_suffix(".npy")).shape == tuple(grid), name  # its own picture's map
        assert Image.open(row["map"]).size == Image.open(row["path"]).size


def test_predict_seconds_are_each_pictures_own(tmp_path, monkeypatch):
    """Issue 39 item 15: an image's seconds are its own reading, its share of its batch's forward and its map,
    not the batch's mean. A fake clock: reading a.png takes 1 s, b.png 3 s, a forward 4 s, a map 0.5 s."""
    import types

    import linvit.prediction.classify as classify
    import linvit.prediction.output as output

    clock = [0.0]
    monkeypatch.setattr(classify, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_read, real_predict, real_write = output.read_rgb, classify.predict, classify.MapWriter.write

    def read(path, *args):
        clock[0] += {"a.png": 1.0, "b.png": 3.0}[Path(path).name]
        return real_read(path, *args)

    def predict(*args, **kwargs):
        clock[0] += 4.0
        return real_predict(*args, **kwargs)

    def write(self, *args):
        clock[0] += 0.5
        return real_write(self, *args)

    monkeypatch.setattr(output, "read_rgb", read)  # predict reads each picture through output.read_or_skip
    monkeypatch.setattr(classify, "predict", predict)
    monkeypatch.setattr(classify.MapWriter, "write", write)
    for name in ("a.png", "b.png"):
        Image.new("RGB", (32, 32), (200, 30, 60)).save(tmp_path / name)
    out = tmp_path / "preds.jsonl"
    argv = ["predict", str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--model", "linear_infvit_tiny_patch16_224"]
    argv += ["--model-kwargs", "depth=1", "--img-size", "32", "--maps", str(tmp_path / "maps"), "--output", str(out)]
    assert cli_main([*argv, "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seconds"] for r in rows] == [1 + 2 + 0.5, 3 + 2 + 0.5]


def test_the_old_documented_path_still_finds_images(monkeypatch):
    """README once showed linvit.inference.find_images (before prediction became one package): after
    `import linvit` it still works, with a DeprecationWarning naming the new home."""
    import sys

    monkeypatch.delitem(sys.modules, "linvit.inference", raising=False)
    if "inference" in vars(linvit):  # hasattr would import it through linvit.__getattr__
        monkeypatch.delattr(linvit, "inference")
    with pytest.warns(DeprecationWarning, match="linvit.prediction"):
        old = linvit.inference
    assert old.find_images is linvit.prediction.find_images is find_images
    assert old.predict is linvit.predict and old.load_image is linvit.load_image


@pytest.mark.parametrize("native", [True, False])
def test_predict_runs_bf16_by_default_only_where_the_cpu_multiplies_bf16(native, model, tmp_path, monkeypatch, capsys):
    """--amp auto (predict's default): bf16 autocast on a CPU with native bf16 products (up to 3x faster there,
    docs/benchmarks.md), float32 elsewhere; --amp none always float32; a GPU is not switched."""
    from linvit.prediction import classify
    from linvit.utils import host, runtime

    monkeypatch.setattr(host, "native_bf16", lambda info=None: native)
    seen = []
    real = classify.autocast
    monkeypatch.setattr(classify, "autocast", lambda device, amp: seen.append(amp) or real(device, amp))
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(weights))
    argv = ["predict", str(PHOTOS / "flower.jpg"), "--model", "linear_infvit_tiny_patch16_224", "--no-progress"]
    argv += ["--checkpoint", str(weights), "--model-kwargs", "num_classes=7", "depth=1", "--img-size", "64"]
    assert cli_main([*argv, "--output", str(tmp_path / "p.jsonl")]) == 0
    assert seen == (["bf16"] if native else ["none"])
    assert json.loads((tmp_path / "p.jsonl").read_text())["amp"] == seen[0]  # each record says its precision
    assert (
        "bf16 autocast (--amp auto, the default: this CPU multiplies bf16 in hardware" in capsys.readouterr().err
    ) == native
    assert cli_main([*argv, "--amp", "none"]) == 0 and seen[-1] == "none"
    assert "autocast" not in capsys.readouterr().err
    assert runtime.resolve_amp(torch.device("cuda"), "auto") == "none"
    assert runtime.resolve_amp(torch.device("cpu"), "fp16") == "fp16"
