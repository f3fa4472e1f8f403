"""ImageNet-layout folders (root/<split>/<class>/<image>) with unreadable images skipped and counted."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder


class SafeImageFolder(ImageFolder):
    """torchvision ImageFolder whose unreadable or corrupt images yield None (with a warning).

    Pair it with ``collate_skip_none``, which drops those samples from the batch and reports how many
    were skipped, so one bad file never stops a long run.
    """

    def __init__(self, root: str | Path, transform=None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"{root}: split folder not found")
        try:
            super().__init__(str(root), transform=transform, allow_empty=False)
        except FileNotFoundError as err:
            raise ValueError(f"{root}: empty split ({err})") from err

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        try:
            image = self.loader(path)
            if self.transform is not None:
                image = self.transform(image)
        except Exception as err:  # noqa: BLE001 - PIL raises many types for corrupt files
            warnings.warn(f"skipping unreadable image {path}: {type(err).__name__}: {err}", stacklevel=2)
            return None
        return image, target


def collate_skip_none(batch: list) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """default_collate over the readable samples; returns (images, targets, skipped) or None if all failed."""
    good = [item for item in batch if item is not None]
    if not good:
        return None
    images, targets = default_collate(good)
    return images, targets, len(batch) - len(good)
