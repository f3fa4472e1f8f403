"""A trained detector on one picture: boxes, labels, scores (and masks) in its pixels, and the drawing of them.

The detector's own transform resizes (min_size / max_size) and normalises, so each picture goes in as it is
(8-bit RGB scaled to [0, 1]) and boxes come back in the picture's own pixels. Mask R-CNN's masks are drawn
where their probability exceeds 0.5, the threshold COCO's evaluation uses.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from PIL import Image
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.transforms import functional as TF
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

from ..utils.runtime import autocast

MASK_THRESHOLD = 0.5


@torch.no_grad()
def detect(model: nn.Module, picture: Image.Image, device, amp: str = "none", score_thresh: float = 0.5) -> dict:
    """Boxes (n, 4) [x0, y0, x1, y1] in picture pixels, labels (n,), scores (n,) and, for Mask R-CNN, masks
    (n, H, W) bool; only detections scoring at least score_thresh."""
    image = TF.pil_to_tensor(picture).to(device).float().div_(255)
    lower_score_floor(model, score_thresh)
    with autocast(device, amp):
        out = model.eval()([image])[0]
    keep = out["scores"] >= score_thresh
    found = {k: v[keep].float().cpu() if k != "labels" else v[keep].cpu() for k, v in out.items()}
    if "masks" in found:
        found["masks"] = found["masks"][:, 0] > MASK_THRESHOLD
    return found


def lower_score_floor(model: nn.Module, score_thresh: float) -> None:
    """torchvision's detectors drop boxes below their own floor (0.05) before we see them: a lower
    --score-thresh lowers it, so the flag alone decides what is kept."""
    holder = model.roi_heads if isinstance(model, GeneralizedRCNN) else model
    holder.score_thresh = min(holder.score_thresh, score_thresh)


def label_name(names: list[str] | None, label: int) -> str:
    """Detector labels count from 1 (0 is the background); names are the run's category names in that order."""
    return names[label - 1] if names and 0 < label <= len(names) else str(label)


def draw(picture: Image.Image, found: dict, names: list[str] | None) -> Image.Image:
    """The picture with its detections: masks tinted, boxes outlined and captioned "name score"."""
    image = TF.pil_to_tensor(picture)
    if "masks" in found and len(found["masks"]):
        image = draw_segmentation_masks(image, found["masks"], alpha=0.45)
    captions = [f"{label_name(names, int(c))} {s:.2f}" for c, s in zip(found["labels"], found["scores"], strict=True)]
    if len(captions):
        width = max(2, round(max(picture.size) / 400))
        image = draw_bounding_boxes(image, found["boxes"], captions, colors="lime", width=width)
    return TF.to_pil_image(image)


def as_record(found: dict, names: list[str] | None) -> list[dict]:
    rows = []
    for i in range(len(found["scores"])):
        label = int(found["labels"][i])
        row = {"label": label_name(names, label), "class": label, "score": round(float(found["scores"][i]), 4)}
        row["box"] = [round(float(v), 1) for v in found["boxes"][i]]
        if "masks" in found:
            row["mask_pixels"] = int(found["masks"][i].sum())
        rows.append(row)
    return rows
