"""The on-the-fly digit tasks of issue 23: disjoint digits, canvases reproducible from (seed, epoch), the shift."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linvit.data.cluttered_mnist import load_mnist_5k
from linvit.data.digit_tasks import DigitCanvases, drawing_for, item_rng, split_digits, task_label


def test_splits_use_disjoint_digits_and_every_class_evenly():
    _, labels = load_mnist_5k()
    parts = split_digits(labels, seed=3)
    sets = {name: set(parts[name].tolist()) for name in ("train", "val", "test")}
    assert not sets["train"] & sets["val"] and not sets["train"] & sets["test"] and not sets["val"] & sets["test"]
    assert [len(sets[n]) for n in ("train", "val", "test")] == [4000, 500, 500]  # all 5,000 digits used
    for name, count in (("train", 400), ("val", 50), ("test", 50)):
        assert np.bincount(labels[parts[name]]).tolist() == [count] * 10
    assert (parts["shifted"] == parts["test"]).all()
    assert (split_digits(labels, seed=3)["val"] == parts["val"]).all()  # the split is a function of the seed
    assert not (split_digits(labels, seed=4)["val"] == parts["val"]).all()


def test_canvases_are_a_function_of_seed_epoch_and_index():
    train = DigitCanvases("train", canvas=48, seed=1)
    first = [train[i][0] for i in range(4)]
    again = DigitCanvases("train", canvas=48, seed=1)
    assert all(torch.equal(a, again[i][0]) for i, a in enumerate(first))  # a resumed run draws the same
    assert torch.equal(train[2][0], first[2])  # order of access does not matter
    train.set_epoch(1)
    assert not any(torch.equal(train[i][0], first[i]) for i in range(4))  # fresh canvases each epoch
    assert [train[i][1] for i in range(4)] == [again[i][1] for i in range(4)]  # the same digits
    val = DigitCanvases("val", canvas=48, seed=1)
    fixed = val[0][0]
    val.set_epoch(5)
    assert torch.equal(val[0][0], fixed)  # evaluation splits never change
    other = DigitCanvases("train", canvas=48, seed=2)
    assert not torch.equal(other[0][0], first[0])
    assert first[0].shape == (3, 48, 48) and 0 <= first[0].min() and first[0].max() <= 1


@pytest.mark.parametrize("length", [64, 1024, 1856, 4608, 9000])
def test_any_length_draws_every_class_in_the_splits_proportion(length):
    """Issue 45.1: the split is sorted by label, and item i used to show digit i, so length=1024 trained on
    digits 0-2 only. Any length now draws a class-balanced permutation of the whole split."""
    data = DigitCanvases("train", task="digit", canvas=32, length=length, seed=0)
    counts = np.bincount([int(data.labels[data.digit_of(i)]) for i in range(length)], minlength=10)
    assert counts.max() - counts.min() <= 1 + length // 4000  # one digit per pass over the split
    assert [int(data[i][1]) for i in range(0, length, 97)] == [
        int(data.labels[data.digit_of(i)]) for i in range(0, length, 97)
    ]  # the label follows the digit drawn


def test_a_short_epoch_is_a_seeded_sample_fresh_each_epoch_and_reproducible():
    data = DigitCanvases("train", canvas=32, length=500, seed=0)
    first = [data.digit_of(i) for i in range(500)]
    assert len(set(first)) == 500  # no digit twice within a pass
    again = DigitCanvases("train", canvas=32, length=500, seed=0)
    assert [again.digit_of(i) for i in reversed(range(500))] == first[::-1]  # order of access does not matter
    data.set_epoch(1)
    second = [data.digit_of(i) for i in range(500)]
    assert len(set(first) & set(second)) < 150  # about 500 x 500 / 4000 = 62 by chance
    data.set_epoch(0)
    assert [data.digit_of(i) for i in range(500)] == first  # a resumed epoch draws the same digits
    assert [DigitCanvases("train", canvas=32, length=500, seed=1).digit_of(i) for i in range(500)] != first
    full = DigitCanvases("train", canvas=32, seed=0)
    assert [full.digit_of(i) for i in range(4000)] == list(range(4000))  # the split's own length: each digit once
    long = DigitCanvases("train", canvas=32, length=8000, seed=0)
    assert sorted(long.digit_of(i) for i in range(4000, 8000)) == list(range(4000))  # every lap covers the split


def test_item_streams_differ_between_splits_and_indices():
    draws = {(s, e, i): item_rng(0, s, e, i).random() for s in ("train", "val") for e in (0, 1) for i in (0, 1)}
    assert len(set(draws.values())) == len(draws)


def test_the_shifted_set_is_drawn_as_specified():
    assert drawing_for("test", 2).clutter == 2 and drawing_for("shifted", 2).clutter == 6
    assert drawing_for("shifted", 2).scale == (0.70, 0.85) and drawing_for("shifted", 2).contrast == (0.45, 0.70)
    test = DigitCanvases("test", canvas=48, clutter=2)
    shifted = DigitCanvases("shifted", canvas=48, clutter=2)
    assert test.labels.tolist() == shifted.labels.tolist()  # same digits, same classes
    brightest = [np.mean([float(d[i][0].max()) for i in range(200)]) for d in (test, shifted)]
    assert brightest[0] > 0.99 and brightest[1] < 0.71  # ink contrast at most 70% of full
    ink = [np.mean([float((d[i][0][0] > 0.05).float().mean()) for i in range(200)]) for d in (test, shifted)]
    assert ink[0] != pytest.approx(ink[1], rel=0.05)  # smaller digits, more clutter: a different picture


def test_task_labels():
    assert [task_label("digit", [4]), task_label("max", [3, 7]), task_label("max", [7, 3])] == [4, 7, 7]
    assert [task_label("sum", [3, 7]), task_label("sum", [9, 9]), task_label("sum", [0, 2])] == [0, 8, 2]


@pytest.mark.parametrize("task", ["max", "sum"])
def test_two_digit_tasks_draw_two_distant_digits_and_box_both(task):
    data = DigitCanvases("val", task=task, canvas=64, clutter=0)
    other = DigitCanvases("val", task="sum" if task == "max" else "max", canvas=64, clutter=0)
    for index in range(30):
        canvas, label, boxes = data.render(index, item_rng(data.seed, "val", 0, index))
        same, _, same_boxes = other.render(index, item_rng(data.seed, "val", 0, index))
        assert (canvas == same).all() and boxes == same_boxes  # the task changes the label, not the picture
        assert canvas.shape == (64, 64) and len(boxes) == 2 and 0 <= label <= 9
        for x0, y0, x1, y1 in boxes:  # tight around ink, no larger than a digit
            assert canvas[y0:y1, x0:x1].max() > 0 and x1 - x0 <= 28 and y1 - y0 <= 28
            assert canvas[y0, x0:x1].max() > 0 and canvas[y0:y1, x0].max() > 0  # the box's edges touch ink
    rng = np.random.default_rng(0)
    digit = np.ones((28, 28), dtype=np.uint8)
    for _ in range(50):
        (y0, x0), (y1, x1) = data.far_apart([digit, digit], rng)
        assert np.hypot(y1 - y0, x1 - x0) >= 32  # centres at least half the canvas apart
    with pytest.raises(ValueError, match="at least 64 px"):
        DigitCanvases("val", task=task, canvas=48)


def test_max_labels_follow_the_distribution_of_a_maximum():
    canvases = DigitCanvases("val", task="max", canvas=64, clutter=0)
    labels = np.array([canvases[i][1] for i in range(500)])
    counts = np.bincount(labels, minlength=10)
    assert counts[9] > 60 and counts[0] < 15  # P(max = k) = (2k + 1) / 100: 19% nines, 1% zeros


def test_the_fixed_splits_write_as_a_folder_of_the_same_canvases(tmp_path):
    from PIL import Image

    from linvit.cli import main as cli_main
    from linvit.data import load_boxes

    argv = ["data", "digits", "--output", str(tmp_path), "--task", "max", "--canvas", "64", "--clutter", "1"]
    assert cli_main(argv) == 0
    boxes = load_boxes(tmp_path / "boxes.json")
    assert len(boxes) == 1500 and all(len(b) == 2 for b in boxes.values())
    drawn = DigitCanvases("shifted", task="max", canvas=64, clutter=1)
    for index in (0, 7, 499):
        image, label, _ = drawn[index]
        saved = np.asarray(Image.open(tmp_path / "shifted" / str(label) / f"{index:05d}.png"))
        assert saved.shape == (64, 64, 3) and np.array_equal(saved[..., 0], (image[0] * 255).round().byte().numpy())


def test_digits_spec_parses_and_refuses_in_one_line():
    from linvit.data.digit_tasks import parse_digits_spec

    assert parse_digits_spec("digits:sum,canvas=64,clutter=3,seed=2") == dict(task="sum", canvas=64, clutter=3, seed=2)
    assert parse_digits_spec("digits:") == {"task": "digit"}
    for bad, message in [
        ("digits:add", "one of digit, max, sum"),
        ("digits:sum,size=3", "options are"),
        ("digits:digit,seed=x", "integer"),
        ("digits:digit,length=0", "at least 1"),  # 0 would silently mean the split's own length
        ("digits:digit,length=-5", "at least 1"),  # a negative one failed inside the sampler
    ]:
        with pytest.raises(ValueError, match=message):
            parse_digits_spec(bad)


def test_train_and_eval_on_drawn_digits(tmp_path):
    """`--data digits:...` trains on canvases drawn from (seed, epoch): two runs agree to the last bit of their
    losses (what an exact resume needs from the data; the engine's resume is tested in test_train.py)."""
    import json

    from linvit.cli import main as cli_main

    data = "digits:digit,canvas=32,clutter=1,length=64"
    base = ["train", "--data", data, "--model", "vit_4l_patch16_224", "--img-size", "32", "--crop-pct", "1"]
    base += ["--model-kwargs", "patch_size=8", "embed_dim=32", "num_heads=2", "--batch-size", "16", "--workers", "0"]
    base += ["--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--no-progress"]
    base += ["--warmup-epochs", "0", "--hflip", "0", "--scale", "1", "1", "--ratio", "1", "1"]
    assert cli_main([*base, "--epochs", "2", "--output", str(tmp_path / "whole")]) == 0
    assert cli_main([*base, "--epochs", "2", "--output", str(tmp_path / "again")]) == 0
    whole = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(x) for x in (tmp_path / "again" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_loss"] for r in again] == [r["train_loss"] for r in whole]
    assert whole[0]["train_loss"] != whole[1]["train_loss"]
    for split in ("test", "shifted"):
        out = tmp_path / f"{split}.json"
        argv = ["eval", "--data", data, "--split", split, "--checkpoint", str(tmp_path / "whole"), "--workers", "0"]
        assert cli_main([*argv, "--json", str(out), "--no-progress"]) == 0
        assert json.loads(out.read_text())["images"] == 500
