"""Segmentation folders: the embedded cluttered-MNIST masks and the ADE20K release layout.

Layouts read:
    cluttered MNIST  DIR/<split>/<class>/<name>.png with label maps DIR/masks/<split>/<class>/<name>.png
                     (`linvit data cluttered-mnist`; 11 classes: background + digits, from DIR/meta.json)
    ADE20K           DIR/images/{training,validation}/*.jpg with DIR/annotations/{...}/*.png
                     (ADEChallengeData2016; 150 classes; label 0 "other" is ignored, k -> k-1, as in
                     mmsegmentation's reduce_zero_label). Splits "train"/"val" map to training/validation.
Joint image/mask transforms are torchvision's transforms.v2 (masks resized nearest, padded with ignore).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from ..data.images import exif_rotation_error, load_rgb_and_stored_size, unreadable_as_usage_error
from ..errors import UsageError

IGNORE = 255
ADE_SPLITS = {"train": "training", "val": "validation"}
ADE_CLASSES = 150
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass
class SegmentationSplit:
    """(image, label map) pairs of one split and what their labels mean."""

    pairs: list[tuple[Path, Path]]
    num_classes: int
    class_names: list[str]
    layout: str
    reduce_zero_label: bool = False
    ignore_index: int = IGNORE


def _ade_names(root: Path) -> list[str]:
    for name in ("objectInfo150.csv", "objectInfo150.txt"):
        path = root / name
        if path.is_file():  # columns: Idx, Ratio, Train, Val, Name (tab- or comma-separated)
            rows = [line.replace("\t", ",").split(",") for line in path.read_text().splitlines()[1:] if line.strip()]
            names = [row[-1].strip().strip('"').split(";")[0] for row in rows]
            if len(names) == ADE_CLASSES:
                return names
    return [f"class {i}" for i in range(ADE_CLASSES)]


def _label_map_of(root: Path, picture: Path) -> Path:
    """ROOT/masks/<split>/.../<name>.png for ROOT/<split>/.../<name>.<any suffix> (a label map must be lossless);
    a label map with the picture's own file name is taken where one exists (how linvit's builder names them)."""
    same = root / "masks" / picture.relative_to(root)
    return same if same.is_file() else same.with_suffix(".png")


def find_split(root: str | Path, split: str) -> SegmentationSplit:
    """The pairs of ``split`` under ``root`` in either supported layout, with a clear error otherwise."""
    root = Path(root)
    if (root / "images").is_dir() and (root / "annotations").is_dir():
        sub = ADE_SPLITS.get(split, split)
        images = sorted(p for p in (root / "images" / sub).glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        pairs = [(p, root / "annotations" / sub / f"{p.stem}.png") for p in images]
        layout, names, reduce_zero = "ade20k", _ade_names(root), True
    elif (root / "masks" / split).is_dir():
        images = sorted(p for p in (root / split).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        pairs = [(p, _label_map_of(root, p)) for p in images]
        meta = json.loads((root / "meta.json").read_text()) if (root / "meta.json").is_file() else {}
        layout, names, reduce_zero = "masks", meta.get("mask_classes"), False
        if not names:
            raise UsageError(f"{root}/meta.json must list mask_classes (the label of each mask value)")
    else:
        raise UsageError(
            f"{root}: no segmentation data for split {split!r} (expected images/ + annotations/ as in ADE20K, "
            f"or {split}/ + masks/{split}/ as written by `linvit data cluttered-mnist`)"
        )
    if not pairs:
        raise UsageError(f"{root}: split {split!r} has no images")
    missing = [str(m) for _, m in pairs if not m.is_file()]
    if missing:
        raise UsageError(f"{root}: {len(missing)} images have no label map, e.g. {missing[0]}")
    return SegmentationSplit(pairs, len(names), list(names), layout, reduce_zero)


def train_transform(crop: tuple[int, int], scale: tuple[float, float], hflip: float) -> v2.Compose:
    """Random resize (shorter side = scale x the crop's shorter side), random crop padded with ignore, flip."""
    short = min(crop)
    return v2.Compose(
        [
            v2.RandomResize(max(1, round(short * scale[0])), max(2, round(short * scale[1]) + 1)),
            v2.RandomCrop(crop, pad_if_needed=True, fill={tv_tensors.Image: 0, tv_tensors.Mask: IGNORE}),
            v2.RandomHorizontalFlip(hflip),
            v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
            v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
        ]
    )


class EvalTransform:
    """Image resized so its shorter side is ``size`` (None: kept), normalised; the label map is left as is,
    so scores are computed at the annotation's own resolution (logits are upsampled to it)."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size
        self.normalise = v2.Compose(
            [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)]
        )

    def __call__(self, image: tv_tensors.Image, mask: tv_tensors.Mask):
        if self.size is not None:
            image = v2.functional.resize(image, [self.size], antialias=True)
        return self.normalise(image), mask.as_subclass(torch.Tensor).long()


class SegmentationDataset(Dataset):
    """Items are (image (3, H, W) float, labels (H, W) int64 with IGNORE for unlabelled pixels)."""

    def __init__(self, split: SegmentationSplit, transform) -> None:
        self.split = split
        self.transform = transform

    def __len__(self) -> int:
        return len(self.split.pairs)

    def __getitem__(self, index: int):
        image_path, mask_path = self.split.pairs[index]
        image, stored = load_rgb_and_stored_size(image_path)  # upright, as predict reads it
        labels = read_label_map(mask_path)
        if labels.shape != (image.height, image.width):
            if labels.shape == stored[::-1]:
                raise UsageError(exif_rotation_error(f"its label map {mask_path.name}", image_path, stored, image.size))
            raise UsageError(f"{mask_path}: label map {labels.shape} does not match image {image.height}x{image.width}")
        labels = labels.astype(np.int64)
        if self.split.reduce_zero_label:
            labels = np.where((labels == 0) | (labels == IGNORE), IGNORE, labels - 1)  # 255 stays unscored
        check_label_values(labels, self.split.num_classes, mask_path)
        image_t = tv_tensors.Image(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1))
        return self.transform(image_t, tv_tensors.Mask(torch.from_numpy(labels)))


def read_label_map(path: Path) -> np.ndarray:
    """A single-channel label map (mode L or P: the values are class indices) as stored, its own EXIF orientation
    applied (detectron2's reading); one-line errors naming the file."""
    with unreadable_as_usage_error(path), Image.open(path) as mask:
        labels = np.array(ImageOps.exif_transpose(mask))
    if labels.ndim != 2:
        raise UsageError(f"{path}: label maps must be single-channel (mode L or P), got shape {labels.shape}")
    return labels


def check_label_values(labels: np.ndarray, num_classes: int, path: Path) -> None:
    """Every label is a class index or IGNORE: cross-entropy would fail on others with no file named (an index
    error on the CPU, a device-side assert on a GPU); a JPEG-compressed label map is the usual cause."""
    wrong = (labels != IGNORE) & ((labels < 0) | (labels >= num_classes))
    if wrong.any():
        values = np.unique(labels[wrong])
        shown = ", ".join(map(str, values[:5])) + (" ..." if len(values) > 5 else "")
        raise UsageError(
            f"{path}: label values {shown} are not classes 0..{num_classes - 1} nor {IGNORE} (ignored); label maps "
            "hold class indices, saved losslessly (PNG)"
        )


def collate_pairs(batch: list) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Lists, not stacks: evaluation images may differ in size."""
    return [b[0] for b in batch], [b[1] for b in batch]


def upsample_logits(logits: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    return logits if logits.shape[-2:] == tuple(size) else F.interpolate(logits, size=size, mode="bilinear")
