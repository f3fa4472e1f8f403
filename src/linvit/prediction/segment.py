"""A trained segmenter on one picture: a class per pixel at its own size, a colour overlay and the class map.

Each picture is resized as evaluation does (shorter side --img-size, or the run's own; kept without one),
segmented, and the logits upsampled back to the picture's size, so the class map (an 8-bit PNG of class
indices, or 16-bit above 256 classes) and the overlay line up with the original pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from PIL import Image
from torchvision.transforms import functional as TF
from torchvision.utils import draw_segmentation_masks

from ..segment.data import EvalTransform, upsample_logits
from ..utils.runtime import autocast


@torch.no_grad()
def segment(model: nn.Module, picture: Image.Image, device, img_size: int | None, amp: str = "none") -> torch.Tensor:
    """(H, W) int64 class per pixel of the picture, at its own size."""
    image = TF.pil_to_tensor(picture)
    normalised, _ = EvalTransform(img_size)(image, torch.zeros(1, 1))
    with autocast(device, amp):
        logits = model.eval()(normalised[None].to(device))
    return upsample_logits(logits.float(), (picture.height, picture.width)).argmax(1)[0].cpu()


def palette(num_classes: int) -> list[tuple[int, int, int]]:
    """Distinct colours, one per class (matplotlib's tab20 repeated, then shifted)."""
    from matplotlib import colormaps

    table = colormaps["tab20"].colors
    return [tuple(int(255 * c) for c in table[i % 20]) for i in range(num_classes)]


def colour_overlay(picture: Image.Image, classes: torch.Tensor, num_classes: int) -> Image.Image:
    """The picture with each present class tinted in its colour."""
    present = classes.unique().tolist()
    masks = classes[None] == torch.tensor(present)[:, None, None]
    colours = [palette(num_classes)[c] for c in present]
    return TF.to_pil_image(draw_segmentation_masks(TF.pil_to_tensor(picture), masks, alpha=0.5, colors=colours))


def class_shares(classes: torch.Tensor, names: list[str] | None) -> dict[str, float]:
    """Fraction of the picture's pixels per class present, largest first."""
    counts = torch.bincount(classes.flatten())
    total = classes.numel()
    order = counts.argsort(descending=True).tolist()
    return {_name(names, c): round(counts[c].item() / total, 4) for c in order if counts[c] > 0}


def _name(names: list[str] | None, c: int) -> str:
    return names[c] if names and c < len(names) else str(c)


def save_class_map(classes: torch.Tensor, path: Path, num_classes: int) -> None:
    dtype = np.uint8 if num_classes <= 256 else np.uint16
    Image.fromarray(classes.numpy().astype(dtype)).save(path)
