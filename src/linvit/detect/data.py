"""COCO-format detection data, read with pycocotools: instances json + an image folder.

What COCO does, done here: category ids map to contiguous labels 1..K (0 is the background) and back for
results; images without annotations are kept; crowd regions are left out of training targets; boxes are
[x, y, w, h] in the json and [x0, y0, x1, y1] in targets. Bad annotations are handled once, when the file is
read: boxes are clipped to their image, and a box with no area left (degenerate, or outside the image) is
skipped and counted; an unknown category id or a file without images is a ValueError.
"""

from __future__ import annotations

import contextlib
import io
import random
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pycocotools.coco import COCO
from torch.utils.data import Dataset
from torchvision.transforms.functional import pil_to_tensor

from ..data.images import exif_rotation_error, load_rgb_and_stored_size
from ..errors import UsageError


def open_coco(ann_file: str | Path):
    """pycocotools' COCO index of an instances json, quietly, with one-line errors."""
    path = Path(ann_file)
    if not path.is_file():
        raise UsageError(f"{path}: annotation file not found")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return COCO(str(path))
    except Exception as err:  # noqa: BLE001 - malformed json, missing keys
        raise UsageError(f"{path}: not a COCO instances file ({type(err).__name__}: {err})") from err


def find_coco_split(root: str | Path, split: str) -> tuple[Path, Path]:
    """(images folder, annotation file) of a COCO-layout folder: ROOT/<split>/ and
    ROOT/annotations/instances_<split>.json (COCO 2017: split = train2017 / val2017)."""
    root = Path(root)
    ann, images = root / "annotations" / f"instances_{split}.json", root / split
    for path in (ann, images):
        if not path.exists():
            raise UsageError(f"{path} not found: expected ROOT/annotations/instances_{split}.json and ROOT/{split}/")
    return images, ann


class CocoDetection(Dataset):
    """(image tensor in [0, 1], target) pairs in torchvision's detection format.

    target: boxes (n, 4) float [x0, y0, x1, y1], labels (n,) int64 in 1..K, image_id, area, iscrowd, and
    masks (n, H, W) uint8 when ``masks`` is set.
    """

    def __init__(
        self, images: str | Path, ann_file: str | Path, train: bool = False, masks: bool = False, hflip: float = 0.5
    ) -> None:
        self.images, self.train, self.masks, self.hflip = Path(images), train, masks, hflip
        self.coco = open_coco(ann_file)
        if not self.coco.dataset.get("images"):
            raise UsageError(f"{ann_file}: holds no images")
        self.category_ids = sorted(self.coco.getCatIds())
        if not self.category_ids:
            raise UsageError(f"{ann_file}: holds no categories")
        self.label_of = {c: i + 1 for i, c in enumerate(self.category_ids)}
        self.class_names = [self.coco.cats[c]["name"] for c in self.category_ids]
        self.ids = sorted(self.coco.getImgIds())
        missing = [
            self.coco.imgs[i]["file_name"]
            for i in self.ids
            if not (self.images / self.coco.imgs[i]["file_name"]).is_file()
        ]
        if missing:
            raise UsageError(f"{ann_file}: {len(missing)} image(s) not found in {self.images}, e.g. {missing[0]!r}")
        self.skipped = Counter()
        self.kept = {i: self._valid_annotations(i, ann_file) for i in self.ids}

    @property
    def num_classes(self) -> int:
        """Categories plus the background."""
        return len(self.category_ids) + 1

    def _valid_annotations(self, image_id: int, ann_file) -> list[tuple[dict, list[float]]]:
        info = self.coco.imgs[image_id]
        W, H = info["width"], info["height"]
        kept = []
        for ann in self.coco.imgToAnns.get(image_id, []):
            if ann["category_id"] not in self.label_of:
                raise UsageError(
                    f"{ann_file}: annotation {ann.get('id')} has category id {ann['category_id']}, "
                    f"not one of the file's categories {self.category_ids}"
                )
            if ann.get("iscrowd", 0) and self.train:
                self.skipped["crowd"] += 1  # COCO ignores crowd regions in training
                continue
            x, y, w, h = ann["bbox"]
            if w <= 0 or h <= 0:
                self.skipped["degenerate"] += 1
                continue
            box = [max(0.0, x), max(0.0, y), min(float(W), x + w), min(float(H), y + h)]
            if box[2] <= box[0] or box[3] <= box[1]:
                self.skipped["outside the image"] += 1
                continue
            kept.append((ann, box))
        return kept

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int):
        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        image = pil_to_tensor(self._upright(info)).float() / 255
        anns = self.kept[image_id]
        target = {
            "boxes": torch.tensor([box for _, box in anns], dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor([self.label_of[a["category_id"]] for a, _ in anns], dtype=torch.int64),
            "image_id": image_id,
            "area": torch.tensor([float(a.get("area", 0.0)) for a, _ in anns], dtype=torch.float32),
            "iscrowd": torch.tensor([int(a.get("iscrowd", 0)) for a, _ in anns], dtype=torch.int64),
        }
        if self.masks:
            h, w = image.shape[-2:]
            stack = [self.coco.annToMask(a) for a, _ in anns] or [np.zeros((0, h, w), np.uint8)]
            target["masks"] = torch.from_numpy(np.stack(stack) if anns else stack[0])
        if self.train and self.hflip > 0 and random.random() < self.hflip:
            image, target = _hflip(image, target)
        return image, target

    def _upright(self, info: dict) -> Image.Image:
        """The picture upright (EXIF), as predict reads it, where its annotated size is the upright one."""
        path = self.images / info["file_name"]
        image, stored = load_rgb_and_stored_size(path)
        annotated = (info["width"], info["height"])
        if image.size != annotated:
            if stored == annotated:
                error = exif_rotation_error("its annotation (width, height)", path, stored, image.size)
                raise UsageError(f"{error} (or, where the boxes were drawn upright, give the json the upright size)")
            raise UsageError(
                f"{path}: the annotations say {annotated[0]} x {annotated[1]} pixels, the file holds "
                f"{image.size[0]} x {image.size[1]}: boxes would land in the wrong place"
            )
        return image


def _hflip(image: torch.Tensor, target: dict) -> tuple[torch.Tensor, dict]:
    width = image.shape[-1]
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    target = {**target, "boxes": boxes}
    if "masks" in target:
        target["masks"] = target["masks"].flip(-1)
    return image.flip(-1), target


def collate_detection(batch):
    """Lists of images and targets: detection images keep their own sizes."""
    return [b[0] for b in batch], [b[1] for b in batch]
