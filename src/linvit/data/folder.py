"""ImageNet-layout folders (root/<split>/<class>/<image>) where an image that cannot be decoded never stops a run.

Training replaces such an image with the next decodable one of the split (``unreadable="replace"``), so every
batch keeps its size and every rank takes the same steps (skipping a batch on one rank desynchronises DDP's
gradient all-reduce); evaluation leaves it out (``"skip"``), so no image is scored twice. Both count it. Only
decoding errors count as unreadable: an error in a transform is a bug and keeps its traceback.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder

from ..errors import UsageError
from .images import load_rgb

# what PIL raises for truncated, corrupt or foreign files (UnidentifiedImageError is an OSError)
DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
MAX_REPLACEMENTS = 100  # consecutive undecodable files before the split is declared broken


class UnreadableItems:
    """Items (image, target, unreadable) over a split's ``decode(index)`` and ``target(index)``, an undecodable
    item replaced by the next decodable one (``unreadable="replace"``, training) or given as None ("skip")."""

    unreadable: str = "skip"
    transform = None

    def __getitem__(self, index: int):
        passed_over = 0
        image = self.decode(index)
        while image is None and self.unreadable == "replace":
            passed_over += 1
            if passed_over > min(MAX_REPLACEMENTS, len(self) - 1):
                raise UsageError(f"{self.root}: {passed_over} undecodable images in a row; is the split corrupt?")
            index = (index + 1) % len(self)
            image = self.decode(index)
        if image is None:
            return None
        if self.transform is not None:
            image = self.transform(image)
        return image, self.target(index), passed_over


def check_unreadable(unreadable: str) -> str:
    if unreadable not in ("skip", "replace"):
        raise UsageError(f"unreadable must be 'skip' or 'replace', got {unreadable!r}")
    return unreadable


class SafeImageFolder(UnreadableItems, ImageFolder):
    """torchvision ImageFolder that replaces (training) or skips (evaluation) images it cannot decode.

    Items are (image, target, unreadable): with "replace", unreadable is how many files were passed over to
    find a decodable one; with "skip", an undecodable file gives None (see ``collate_images``).
    """

    def __init__(self, root: str | Path, transform=None, unreadable: str = "skip") -> None:
        check_unreadable(unreadable)
        root = Path(root)
        if not root.is_dir():
            raise UsageError(f"{root}: split folder not found{_split_hint(root)}")
        try:
            super().__init__(str(root), transform=transform, loader=load_rgb, allow_empty=False)
        except FileNotFoundError as err:
            raise UsageError(f"{root}: empty split ({err})") from err
        self.unreadable = unreadable

    def decode(self, index: int):
        """The decoded image at index, or None (with a warning) when its file cannot be decoded."""
        path = self.samples[index][0]
        try:
            return self.loader(path)
        except DECODE_ERRORS as err:
            warnings.warn(f"unreadable image {path}: {type(err).__name__}: {err}", stacklevel=2)
            return None

    def target(self, index: int) -> int:
        return self.samples[index][1]


def _split_hint(missing: Path) -> str:
    """What the data folder probably meant: --data named a split itself (DATA/train/train), or holds the classes
    directly (no split folders)."""
    data = missing.parent
    if data.name == missing.name or (data.parent / missing.name).is_dir():
        return f"; --data names a split: give the folder that holds it, {data.parent}"
    if data.is_dir() and any(child.is_dir() for child in data.iterdir()):
        splits = ", ".join(sorted(child.name for child in data.iterdir() if child.is_dir())[:4])
        return f" (the folder holds {splits}: DATA/<split>/<class>/*, or --train-split / --val-split)"
    return ""


def collate_images(batch: list) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(images, targets, unreadable) over the decodable samples, None if there are none; unreadable counts the
    files passed over (replaced) or left out (skipped)."""
    good = [item for item in batch if item is not None]
    if not good:
        return None
    images, targets = default_collate([(image, target) for image, target, _ in good])
    return images, targets, len(batch) - len(good) + sum(passed for _, _, passed in good)
