"""The embedded cluttered-MNIST builder, box readers and the corrupt-image-tolerant folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.cli import main as cli_main
from linvit.data import SafeImageFolder, boxes_for, build_cluttered_mnist, collate_images, load_boxes, load_mnist_5k


def test_bundled_mnist_is_real_and_balanced():
    digits, labels = load_mnist_5k()
    assert digits.shape == (5000, 28, 28) and digits.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert digits.max() == 255 and (digits > 0).mean() > 0.1


def test_builder_writes_imagefolder_with_boxes_and_is_deterministic(tmp_path):
    a = build_cluttered_mnist(
        tmp_path / "a", canvas=48, per_class_train=3, per_class_val=2, clutter=3, seed=7, progress=False
    )
    build_cluttered_mnist(
        tmp_path / "b", canvas=48, per_class_train=3, per_class_val=2, clutter=3, seed=7, progress=False
    )
    assert a["images"] == {"train": 30, "val": 20}
    boxes = json.loads((tmp_path / "a" / "boxes.json").read_text())
    assert len(boxes) == 50 and (tmp_path / "a" / "train" / "3" / "00009.png").is_file()
    for rel, [box] in boxes.items():
        img = np.asarray(Image.open(tmp_path / "a" / rel))
        assert img.shape == (48, 48, 3)
        x0, y0, x1, y1 = box
        assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48 and x1 - x0 <= 28 and y1 - y0 <= 28
        assert img[y0:y1, x0:x1].max() > 0  # the digit's ink is inside its box
        assert np.array_equal(img, np.asarray(Image.open(tmp_path / "b" / rel)))
    assert boxes == json.loads((tmp_path / "b" / "boxes.json").read_text())


def test_builder_without_clutter_has_no_ink_outside_the_box(tmp_path):
    build_cluttered_mnist(tmp_path, canvas=40, per_class_train=1, per_class_val=1, clutter=0, progress=False)
    for rel, [(x0, y0, x1, y1)] in load_boxes(tmp_path / "boxes.json").items():
        img = np.asarray(Image.open(tmp_path / rel))[..., 0].copy()
        img[int(y0) : int(y1), int(x0) : int(x1)] = 0
        assert img.max() == 0


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(canvas=20), "canvas"),
        (dict(per_class_train=450, per_class_val=100), "disjoint"),
        (dict(clutter=-1), "clutter"),
    ],
)
def test_builder_rejects_bad_arguments(tmp_path, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        build_cluttered_mnist(tmp_path, progress=False, **kwargs)


def test_cli_data_command(tmp_path, capsys):
    assert (
        cli_main(
            [
                "data",
                "cluttered-mnist",
                "--output",
                str(tmp_path),
                "--canvas",
                "32",
                "--per-class-train",
                "1",
                "--per-class-val",
                "1",
            ]
        )
        == 0
    )
    assert "10 train and 10 val" in capsys.readouterr().out
    assert cli_main(["data", "cluttered-mnist", "--output", str(tmp_path), "--canvas", "8"]) == 2
    assert "canvas" in capsys.readouterr().err


VOC = """<annotation><folder>val</folder><filename>ILSVRC2012_val_00000001.JPEG</filename>
<size><width>500</width><height>375</height><depth>3</depth></size>
<object><name>n01751748</name><bndbox><xmin>111</xmin><ymin>108</ymin><xmax>441</xmax><ymax>375</ymax></bndbox></object>
<object><name>n01751748</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object>
</annotation>"""


def test_voc_reader_returns_the_boxes_json_structure(tmp_path):
    (tmp_path / "ILSVRC2012_val_00000001.xml").write_text(VOC)
    boxes = load_boxes(tmp_path)
    assert boxes == {"ILSVRC2012_val_00000001.JPEG": [[110.0, 107.0, 441.0, 375.0], [0.0, 1.0, 30.0, 40.0]]}
    assert (
        boxes_for(tmp_path / "val" / "n01751748" / "ILSVRC2012_val_00000001.JPEG", boxes)
        == boxes["ILSVRC2012_val_00000001.JPEG"]
    )
    (tmp_path / "bad.xml").write_text("<annotation>")
    with pytest.raises(ValueError, match="VOC"):
        load_boxes(tmp_path)
    with pytest.raises(ValueError, match="no such"):
        load_boxes(tmp_path / "missing.json")


def test_corrupt_images_are_skipped_and_counted(tmp_path):
    build_cluttered_mnist(tmp_path, canvas=32, per_class_train=2, per_class_val=1, progress=False)
    (tmp_path / "train" / "0" / "00000.png").write_bytes(b"not a png")
    from torchvision.transforms import ToTensor

    ds = SafeImageFolder(tmp_path / "train", transform=ToTensor())
    with pytest.warns(UserWarning, match="unreadable"):
        batch = collate_images([ds[i] for i in range(4)])
    images, targets, skipped = batch
    assert skipped == 1 and images.shape == (3, 3, 32, 32) and targets.dtype == torch.int64
    assert collate_images([None, None]) is None


def test_missing_or_empty_split_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        SafeImageFolder(tmp_path / "nope")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="empty"):
        SafeImageFolder(tmp_path / "empty")


def test_transform_errors_are_not_counted_as_unreadable_images(tmp_path):
    """Only decoding errors mark an image unreadable; a bug in a transform keeps its traceback."""
    build_cluttered_mnist(tmp_path, canvas=32, per_class_train=1, per_class_val=1, progress=False)

    def broken(image):
        raise ValueError("a bug in the transform")

    with pytest.raises(ValueError, match="a bug in the transform"):
        SafeImageFolder(tmp_path / "train", transform=broken)[0]


def test_training_folders_replace_undecodable_images(tmp_path):
    build_cluttered_mnist(tmp_path, canvas=32, per_class_train=2, per_class_val=1, progress=False)
    (tmp_path / "train" / "0" / "00000.png").write_bytes(b"not a png")
    from torchvision.transforms import ToTensor

    ds = SafeImageFolder(tmp_path / "train", transform=ToTensor(), unreadable="replace")
    with pytest.warns(UserWarning, match="unreadable"):
        image, target, passed_over = ds[0]
    assert passed_over == 1 and target == ds.samples[1][1] and image.shape == (3, 32, 32)
    images, targets, unreadable = collate_images([ds[i] for i in range(1, 4)])
    assert unreadable == 0 and len(images) == 3


def test_default_randaugment_survives_posterize_at_zero_bits():
    """timm's PosterizeIncreasing reaches 0 bits at magnitude 10; Pillow 13 raises there unless fixed."""
    from PIL import Image
    from timm.data import create_transform

    from linvit.data.augment import fix_posterize

    transform = create_transform(32, is_training=True, auto_augment="rand-m9-mstd0.5-inc1")
    rand_augment = next(t for t in transform.transforms if hasattr(t, "ops"))
    posterize = next(op for op in rand_augment.ops if op.name == "PosterizeIncreasing")
    posterize.prob, posterize.magnitude_std, posterize.magnitude = 1.0, 0.0, 10  # always 0 bits
    image = Image.new("RGB", (32, 32), (200, 120, 40))
    assert fix_posterize(transform) >= 1
    assert posterize(image).getextrema() == ((0, 0), (0, 0), (0, 0))  # old Pillow's answer: nothing kept
