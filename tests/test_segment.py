"""Dense prediction: pyramid shapes for every family, mIoU against a hand count, data readers, training."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image

from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist
from linvit.models.pyramid import create_pyramid
from linvit.segment import confusion_matrix, create_segmenter, scores
from linvit.segment.data import IGNORE, EvalTransform, SegmentationDataset, find_split

FAMILIES = [
    ("deit_tiny_patch16_224", ["depth=2"]),
    ("infvit_tiny_patch16_224", ["depth=2"]),
    ("linear_infvit_tiny_patch16_224", ["depth=2"]),
    ("katz_infvit_tiny_patch16_224", ["depth=2"]),
    ("weightformer_tiny_patch16_224", ["depth=2"]),
]


def _kwargs(pairs: list[str]) -> dict:
    return {k: int(v) for k, v in (p.split("=") for p in pairs)}


@pytest.mark.parametrize("model,kwargs", FAMILIES)
@pytest.mark.parametrize("size", [(64, 64), (64, 96)])
def test_pyramid_has_strides_4_8_16_32_for_every_family(model, kwargs, size):
    pyramid = create_pyramid(model, out_channels=32, **_kwargs(kwargs)).eval()
    with torch.no_grad():
        maps = pyramid(torch.randn(2, 3, *size))
    H, W = size
    assert [tuple(m.shape) for m in maps] == [(2, 32, H // s, W // s) for s in (4, 8, 16, 32)]
    assert [f["reduction"] for f in pyramid.feature_info] == [4, 8, 16, 32]
    assert all(torch.isfinite(m).all() for m in maps)


@pytest.mark.parametrize("model,kwargs", [FAMILIES[0], FAMILIES[2], FAMILIES[4]])
def test_segmenter_takes_any_size_and_each_image_independently(model, kwargs):
    net = create_segmenter(model, num_classes=5, pyramid_channels=32, head_channels=16, **_kwargs(kwargs)).eval()
    x = torch.randn(2, 3, 50, 70)  # not a multiple of the patch: padded, then cropped back
    with torch.no_grad():
        logits = net(x)
        alone = net(x[1:])
    assert logits.shape == (2, 5, 50, 70)
    torch.testing.assert_close(logits[1:], alone, rtol=1e-4, atol=1e-5)


def test_pyramid_also_wraps_timm_deit_with_patch_16():
    pyramid = create_pyramid("deit_small_patch16_224", out_channels=16, depth=1)
    assert [tuple(m.shape[-2:]) for m in pyramid(torch.randn(1, 3, 224, 160))] == [(56, 40), (28, 20), (14, 10), (7, 5)]


def test_segmenter_rejects_bad_input():
    net = create_segmenter("deit_tiny_patch16_224", num_classes=3, pyramid_channels=16, head_channels=8, depth=1)
    with pytest.raises(ValueError, match="3, H, W"):
        net(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="num_classes"):
        create_segmenter("deit_tiny_patch16_224", num_classes=0)


def test_miou_matches_a_hand_computed_confusion_matrix():
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 1, IGNORE]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 0, 1, 2]])
    # rows = truth, columns = prediction, the ignored pixel not counted
    hand = torch.tensor([[1, 1, 0], [0, 3, 0], [1, 0, 1]])
    matrix = confusion_matrix(pred, target, num_classes=3)
    assert torch.equal(matrix, hand)
    s = scores(matrix)
    iou = [1 / (2 + 2 - 1), 3 / (3 + 4 - 3), 1 / (2 + 1 - 1)]  # tp / (truth + predicted - tp)
    assert s["per_class_iou"] == pytest.approx([100 * v for v in iou])
    assert s["miou"] == pytest.approx(100 * sum(iou) / 3)
    assert s["pixel_acc"] == pytest.approx(100 * 5 / 7)
    assert s["pixels"] == 7


def test_a_class_absent_everywhere_is_left_out_of_the_mean():
    target = torch.tensor([0, 0, 1, 1])
    s = scores(confusion_matrix(target.clone(), target, num_classes=4))
    assert s["miou"] == pytest.approx(100.0) and np.isnan(s["per_class_iou"][3])


def test_confusion_matrix_rejects_bad_labels():
    with pytest.raises(ValueError, match="differ in shape"):
        confusion_matrix(torch.zeros(2, 2), torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        confusion_matrix(torch.zeros(4), torch.tensor([0, 1, 5, 2]), 3)


def test_one_training_step_lowers_the_loss():
    torch.manual_seed(0)
    net = create_segmenter(
        "linear_infvit_tiny_patch16_224", num_classes=3, pyramid_channels=32, head_channels=16, depth=2, patch_size=8
    )
    x = torch.randn(4, 3, 32, 32)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()  # a learnable per-pixel rule
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(2):
        loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[1] < losses[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("segdata")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=2, progress=False)
    return root


def test_builder_masks_label_the_digit_ink_with_class_plus_one(data):
    meta = json.loads((data / "meta.json").read_text())
    assert meta["mask_classes"][0] == "background" and len(meta["mask_classes"]) == 11
    boxes = json.loads((data / "boxes.json").read_text())
    for rel, [(x0, y0, x1, y1)] in boxes.items():
        cls = int(rel.split("/")[1])
        mask = np.asarray(Image.open(data / "masks" / rel))
        image = np.asarray(Image.open(data / rel))[..., 0]
        assert mask.shape == image.shape and set(np.unique(mask)) == {0, cls + 1}
        ys, xs = np.nonzero(mask)
        assert x0 <= xs.min() and xs.max() < x1 and y0 <= ys.min() and ys.max() < y1  # ink inside the box
        assert (image[mask > 0] >= 64).all()  # labelled pixels are bright digit ink


def test_cluttered_mnist_split_reads_pairs(data):
    split = find_split(data, "train")
    assert split.num_classes == 11 and len(split.pairs) == 20 and split.layout == "masks"
    image, labels = SegmentationDataset(split, EvalTransform())[0]
    assert image.shape == (3, 32, 32) and labels.shape == (32, 32) and labels.dtype == torch.int64


def _fake_ade(root, n=2, size=(24, 40)):
    for sub in ("training", "validation"):
        (root / "images" / sub).mkdir(parents=True)
        (root / "annotations" / sub).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((*size, 3), 100, np.uint8)).save(root / "images" / sub / f"ADE_{sub}_{i}.jpg")
            labels = np.zeros(size, np.uint8)
            labels[:, size[1] // 2 :] = 150
            labels[0, 0] = 1
            Image.fromarray(labels).save(root / "annotations" / sub / f"ADE_{sub}_{i}.png")


def test_ade20k_layout_ignores_label_zero_and_shifts_the_rest(tmp_path):
    _fake_ade(tmp_path)
    split = find_split(tmp_path, "val")
    assert split.layout == "ade20k" and split.num_classes == 150 and len(split.pairs) == 2
    _, labels = SegmentationDataset(split, EvalTransform(16))[0]
    assert labels.shape == (24, 40)  # scored at the annotation's resolution
    assert labels[0, 0] == 0 and labels[5, 0] == IGNORE and labels[5, -1] == 149


def test_readers_fail_with_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no segmentation data"):
        find_split(tmp_path, "train")
    _fake_ade(tmp_path)
    (tmp_path / "annotations" / "training" / "ADE_training_0.png").unlink()
    with pytest.raises(ValueError, match="no label map"):
        find_split(tmp_path, "train")


SEG = [
    "--model-kwargs",
    "patch_size=8",
    "depth=2",
    "--pyramid-channels",
    "32",
    "--head-channels",
    "16",
    "--workers",
    "0",
    "--device",
    "cpu",
]


def test_segment_train_resume_and_eval_end_to_end(data, tmp_path, capsys):
    out = tmp_path / "run"
    train = [
        "segment",
        "train",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--output",
        str(out),
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
        "--crop-size",
        "32",
        "--scale",
        "1",
        "1",
        "--hflip",
        "0",
        "--warmup-epochs",
        "0",
        "--no-progress",
        *SEG,
    ]
    assert cli_main([*train, "--epochs", "1"]) == 0
    assert cli_main([*train, "--epochs", "2", "--resume", "auto"]) == 0  # continues at epoch 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1]
    assert {"train_loss", "val_miou", "val_pixel_acc", "epoch_seconds"} <= rows[-1].keys()
    result = tmp_path / "eval.json"
    assert (
        cli_main(
            [
                "segment",
                "eval",
                "--data",
                str(data),
                "--model",
                "linear_infvit_tiny_patch16_224",
                "--checkpoint",
                str(out / "model.safetensors"),
                "--json",
                str(result),
                "--flops-at",
                "64",
                *SEG,
            ]
        )
        == 0
    )
    metrics = json.loads(result.read_text())
    assert metrics["miou"] == pytest.approx(rows[-1]["val_miou"])  # the saved weights are the logged ones
    assert f"GMACs at 64 x 64: backbone {metrics['backbone_gmacs@64']:.3g}" in capsys.readouterr().out  # --macs-at
    config = json.loads((out / "config.json").read_text())
    assert config["linvit"]["task"] == "segmentation" and config["label_names"][1] == "digit 0"
    assert "segment eval --checkpoint" in (out / "README.md").read_text()
    # the run folder alone: backbone, kwargs and head widths from its args.yaml
    again = tmp_path / "again.json"
    by_folder = ["segment", "eval", "--data", str(data), "--checkpoint", str(out), "--json", str(again)]
    assert cli_main([*by_folder, "--workers", "0", "--device", "cpu"]) == 0
    assert json.loads(again.read_text())["miou"] == pytest.approx(rows[-1]["val_miou"])
    assert len(metrics["per_class_iou"]) == 11 and metrics["class_names"][1] == "digit 0"
    _eval_refuses_data_with_other_classes(data, out, tmp_path, capsys)
    assert 0 < metrics["backbone_gmacs@64"] < metrics["segmenter_gmacs@64"]
    # ... and in Python, one call (timm's local-dir: cannot build a segmenter)
    from safetensors.torch import load_file

    import linvit

    segmenter = linvit.load_run(out)
    assert segmenter.label_names[1] == "digit 0" and not segmenter.training
    saved = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(segmenter.state_dict()[k], v) for k, v in saved.items())


def _eval_refuses_data_with_other_classes(data, run, tmp_path, capsys):
    """The same pictures under a meta.json of 12 classes: one line naming both counts (it was the checkpoint's
    shape error, which blamed patch, image size and width)."""
    other = tmp_path / "twelve"
    other.mkdir()
    for name in ("train", "val", "masks"):
        (other / name).symlink_to(data / name)
    meta = json.loads((data / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "mask_classes": meta["mask_classes"] + ["extra"]}))
    capsys.readouterr()
    argv = ["segment", "eval", "--data", str(other), "--checkpoint", str(run), "--workers", "0", "--device", "cpu"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "number of classes 12, the run's 11" in err and len(err.splitlines()) == 1
    names = list(meta["mask_classes"])
    names[1], names[2] = names[2], names[1]  # the same count, two classes swapped: scored against the wrong ones
    (other / "meta.json").write_text(json.dumps({**meta, "mask_classes": names}))
    assert cli_main(argv) == 2
    assert "label names at 1 'digit 1', the run's 'digit 0'" in capsys.readouterr().err


def test_segment_torchrun_two_processes_agree(data, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "linvit",
        "segment",
        "train",
        "--data",
        str(data),
        "--model",
        "deit_tiny_patch16_224",
        "--output",
        str(tmp_path),
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--crop-size",
        "32",
        "--scale",
        "1",
        "1",
        "--no-progress",
        *SEG,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "world 2" in result.stdout
    # evaluation is sharded over ranks and summed: the logged mIoU equals one single-process evaluation
    single = cli_main(
        [
            "segment",
            "eval",
            "--data",
            str(data),
            "--model",
            "deit_tiny_patch16_224",
            "--checkpoint",
            str(tmp_path / "model.safetensors"),
            "--json",
            str(tmp_path / "e.json"),
            *SEG,
        ]
    )
    assert single == 0
    assert json.loads((tmp_path / "e.json").read_text())["miou"] == pytest.approx(rows[0]["val_miou"])


def test_segment_cli_errors_are_one_line(data, tmp_path, capsys):
    code = cli_main(
        [
            "segment",
            "train",
            "--data",
            str(tmp_path),
            "--model",
            "deit_tiny_patch16_224",
            "--output",
            str(tmp_path / "o"),
            *SEG,
        ]
    )
    assert code == 2 and "no segmentation data" in capsys.readouterr().err


def test_bench_measures_the_segmentation_model():
    from linvit.bench import run_point

    spec = {"model": "deit_tiny_patch16_224", "res": 64, "iters": 1, "warmup": 1, "model_kwargs": {"depth": 1}}
    classify = run_point(spec, timeout=300)
    segment = run_point({**spec, "task": "segment"}, timeout=300)
    assert classify["status"] == segment["status"] == "ok", (classify.get("reason"), segment.get("reason"))
    assert segment["task"] == "segment" and segment["tokens"] == classify["tokens"] == 16
    assert segment["gflops"] > classify["gflops"] and segment["params"] > classify["params"]  # pyramid + head


def test_segmenter_backbone_loads_softmax_weights_then_converts(tmp_path):
    """segment train --pretrained-file W --convert V: the backbone starts from W's values, as InfSA layers."""
    from safetensors.torch import save_file

    from linvit.layers import KatzInfSAAttention
    from linvit.segment.engine import SegmentConfig, build_model

    classifier = timm.create_model("deit_tiny_patch16_224", patch_size=8, depth=2, num_classes=10)
    save_file(classifier.state_dict(), tmp_path / "w.safetensors")
    args = SegmentConfig(
        model="deit_tiny_patch16_224",
        model_kwargs={"patch_size": 8, "depth": 2},
        pyramid_channels=32,
        head_channels=16,
        backbone_checkpoint=str(tmp_path / "w.safetensors"),
        convert="katz_infsa",
    )
    model = build_model(args, num_classes=11)
    attn = model.backbone.blocks[1].attn
    assert isinstance(attn, KatzInfSAAttention)
    assert torch.equal(attn.qkv.weight, classifier.blocks[1].attn.qkv.weight)
    assert model(torch.randn(1, 3, 64, 64)).shape[1] == 11


def test_all_ignored_batch_contributes_zero_loss():
    """A batch whose every pixel is ignore_index gave NaN (0 / 0) and killed the run; now 0, with zero gradients."""
    from linvit.segment.engine import pixel_cross_entropy

    logits = torch.randn(2, 5, 4, 6, requires_grad=True)
    labels = torch.full((2, 4, 6), IGNORE)
    loss = pixel_cross_entropy(logits, labels, IGNORE)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))
    labels[0, 1, 2], labels[1, 3, 5] = 3, 0
    expected = F.cross_entropy(logits, labels, ignore_index=IGNORE)
    torch.testing.assert_close(pixel_cross_entropy(logits, labels, IGNORE), expected)


def _phone_photo(path, stored=(40, 24)):
    """A picture stored landscape whose EXIF orientation (6) turns it portrait: left half dark, right half light
    as stored, so upright its top half is dark."""
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    pixels = np.full((stored[1], stored[0], 3), 220, np.uint8)
    pixels[:, : stored[0] // 2] = 20
    Image.fromarray(pixels).save(path, exif=exif, quality=100)


def test_segmentation_reads_pictures_upright_as_predict_does(tmp_path):
    _fake_ade(tmp_path)
    image_path, mask_path = find_split(tmp_path, "val").pairs[0]
    _phone_photo(image_path)  # stored 40 x 24, upright 24 x 40
    Image.fromarray(np.zeros((40, 24), np.uint8)).save(mask_path)  # labelled upright
    image, labels = SegmentationDataset(find_split(tmp_path, "val"), EvalTransform())[0]
    assert image.shape[-2:] == labels.shape == (40, 24)
    assert image[:, :20, :].mean() < image[:, 20:, :].mean()  # upright: the dark half on top


def test_a_label_map_made_on_the_stored_pixels_of_a_rotated_picture_is_named(tmp_path):
    _fake_ade(tmp_path)
    image_path, mask_path = find_split(tmp_path, "val").pairs[0]
    _phone_photo(image_path, stored=(40, 24))  # its label map (24 rows, 40 columns) fits the stored pixels
    with pytest.raises(ValueError, match=r"fits the file's stored 40 x 24 pixels.*turns it to 24 x 40"):
        SegmentationDataset(find_split(tmp_path, "val"), EvalTransform())[0]


def _own_data(root, picture_suffix=".jpg", value=2, classes=("background", "road", "car")):
    """The documented layout for your own data: pictures under ROOT/<split>/, PNG label maps under
    ROOT/masks/<split>/ with the picture's name, classes in meta.json."""
    root.mkdir(exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"mask_classes": list(classes)}))
    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
        (root / "masks" / split / "a").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (20, 12), (100, 50, 0)).save(root / split / "a" / f"{i}{picture_suffix}")
            labels = np.zeros((12, 20), np.uint8)
            labels[:, 10:] = value if i == 1 else 1
            Image.fromarray(labels).save(root / "masks" / split / "a" / f"{i}.png")
    return root


def test_own_data_pairs_jpeg_pictures_with_png_label_maps(tmp_path):
    split = find_split(_own_data(tmp_path), "train")
    assert [(p.name, m.name) for p, m in split.pairs] == [("0.jpg", "0.png"), ("1.jpg", "1.png")]
    _, labels = SegmentationDataset(split, EvalTransform())[1]
    assert labels[0, 0] == 0 and labels[0, -1] == 2


@pytest.mark.parametrize("value", [3, 254])  # not a class of 3 (a JPEG-saved label map's stray values), not 255
def test_a_label_value_that_is_no_class_is_one_line_naming_the_file(tmp_path, value):
    split = find_split(_own_data(tmp_path, value=value), "train")
    with pytest.raises(ValueError, match=rf"1\.png: label values {value} are not classes 0\.\.2 nor 255"):
        SegmentationDataset(split, EvalTransform())[1]
    split = find_split(_own_data(tmp_path / "ok", value=255), "train")  # 255: not scored
    assert SegmentationDataset(split, EvalTransform())[1][1][0, -1] == IGNORE


def test_ade20k_keeps_255_unscored(tmp_path):
    _fake_ade(tmp_path)
    _, mask_path = find_split(tmp_path, "val").pairs[0]
    labels = np.array(Image.open(mask_path))
    labels[1, 1] = 255
    Image.fromarray(labels).save(mask_path)
    _, read = SegmentationDataset(find_split(tmp_path, "val"), EvalTransform())[0]
    assert read[1, 1] == IGNORE and read[0, 0] == 0


def test_a_file_that_is_no_picture_is_one_line_naming_it(tmp_path):
    root = _own_data(tmp_path)
    (root / "train" / "a" / "0.jpg").write_bytes(b"not a picture")
    with pytest.raises(ValueError, match=r"0\.jpg: cannot read it as an image"):
        SegmentationDataset(find_split(root, "train"), EvalTransform())[0]


def test_one_class_segmentation_is_refused_before_training(tmp_path, capsys):
    root = _own_data(tmp_path / "data", value=0, classes=("only",))
    argv = ["segment", "train", "--data", str(root), "--model", "linear_infvit_tiny_patch16_224", *SEG]
    assert cli_main([*argv, "--output", str(tmp_path / "run")]) == 2
    assert "one class (only); segmentation needs two or more" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
