"""Attention-quality metrics for importance maps: MoRF/LeRF perturbation curves, box ROC/PR-AUC, pointing game.

Definitions (per image; reported values are means over images):
- MoRF (LeRF): patches are removed in order of decreasing (increasing) map value, a fraction k/steps
  of all patches at step k = 0..steps, each removed patch filled with the dataset mean; p_k is the
  softmax probability of the target class after step k. MoRF-AOC = mean_{k=1..steps} (p_0 - p_k)
  (AOPC; higher = the map finds what the model relies on); LeRF-AOC is the same on the LeRF curve (lower = better).
- Box ROC-AUC / PR-AUC: the image-resolution map scores every pixel as a detector of "inside a ground-truth
  box" (sklearn roc_auc_score / average_precision_score); images whose pixels are all inside or all
  outside the boxes are skipped (the AUC is undefined there).
- Pointing game: a hit when the map's maximum lies within ``tolerance`` pixels of a box.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import average_precision_score, roc_auc_score

from ..errors import UsageError


def box_mask(boxes: list[list[float]], height: int, width: int) -> np.ndarray:
    """Boolean (H, W) mask of pixels inside any box ([xmin, ymin, xmax, ymax], max exclusive)."""
    mask = np.zeros((height, width), dtype=bool)
    for x0, y0, x1, y1 in boxes:
        mask[max(0, int(np.floor(y0))) : int(np.ceil(y1)), max(0, int(np.floor(x0))) : int(np.ceil(x1))] = True
    return mask


def box_auc(maps: torch.Tensor | np.ndarray, boxes: list[list[list[float]]]) -> dict:
    """Mean box ROC-AUC and PR-AUC of image-resolution maps (B, H, W) against each image's boxes."""
    maps = np.asarray(maps.detach().cpu() if isinstance(maps, torch.Tensor) else maps, dtype=np.float64)
    roc, pr = [], []
    for m, b in zip(maps, boxes, strict=True):
        mask = box_mask(b, *m.shape)
        if mask.all() or not mask.any():
            continue
        roc.append(roc_auc_score(mask.ravel(), m.ravel()))
        pr.append(average_precision_score(mask.ravel(), m.ravel()))
    return {
        "box_roc_auc": float(np.mean(roc)) if roc else None,
        "box_pr_auc": float(np.mean(pr)) if pr else None,
        "box_images": len(roc),
        "roc_per_image": roc,
        "pr_per_image": pr,
    }


def pointing_game(maps: torch.Tensor | np.ndarray, boxes: list[list[list[float]]], tolerance: float = 15.0) -> dict:
    """Share of images whose map maximum lies within ``tolerance`` pixels of a ground-truth box."""
    maps = np.asarray(maps.detach().cpu() if isinstance(maps, torch.Tensor) else maps)
    hits = []
    for m, b in zip(maps, boxes, strict=True):
        y, x = np.unravel_index(np.argmax(m), m.shape)
        px, py = x + 0.5, y + 0.5  # pixel centre
        dist = [np.hypot(max(x0 - px, 0, px - x1), max(y0 - py, 0, py - y1)) for x0, y0, x1, y1 in b]
        hits.append(bool(dist) and min(dist) <= tolerance)
    return {"pointing_game": float(np.mean(hits)) if hits else None, "pointing_hits": hits}


@torch.no_grad()
def perturbation_curves(
    model: nn.Module,
    images: torch.Tensor,
    targets: torch.Tensor,
    patch_maps: torch.Tensor,
    patch_size: int | tuple[int, int],
    steps: int = 10,
    fill: torch.Tensor | None = None,
    order: str = "morf",
) -> torch.Tensor:
    """Target-class probability (B, steps + 1) as patches are removed most- (or least-) relevant first.

    Args:
        patch_maps: (B, h, w) scores on the patch grid of ``patch_size`` pixels.
        fill: per-channel fill value (C,), default the mean of ``images`` (the dataset mean of the batch).
        order: "morf" or "lerf".
    """
    if order not in ("morf", "lerf"):
        raise UsageError(f"order must be 'morf' or 'lerf', got {order!r}")
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    B, C, H, W = images.shape
    h, w = patch_maps.shape[-2:]
    if (h * ph, w * pw) != (H, W):
        raise UsageError(f"a {h}x{w} map of {ph}x{pw} patches does not tile a {H}x{W} image")
    fill = images.mean(dim=(0, 2, 3)) if fill is None else fill
    ranking = patch_maps.reshape(B, -1).argsort(dim=1, descending=order == "morf")
    total = h * w
    probs = []
    was_training = model.training
    model.eval()
    for k in range(steps + 1):
        keep = torch.ones(B, total, dtype=torch.bool, device=images.device)
        n_remove = round(total * k / steps)
        keep.scatter_(1, ranking[:, :n_remove], False)
        pixel_keep = keep.reshape(B, 1, h, 1, w, 1).expand(B, 1, h, ph, w, pw).reshape(B, 1, H, W)
        x = torch.where(pixel_keep, images, fill.reshape(1, C, 1, 1).to(images.dtype))
        probs.append(model(x).float().softmax(-1).gather(1, targets[:, None])[:, 0])
    model.train(was_training)
    return torch.stack(probs, dim=1)


def area_over_curve(curves: torch.Tensor) -> torch.Tensor:
    """Per-image mean over k >= 1 of p_0 - p_k, in probability units (AOPC, Samek et al. 2017).

    Not divided by p_0: on an image the model barely believes (p_0 = 0.01) a ratio would turn a
    small rise of p into a huge negative score and swamp the average over images.
    """
    return (curves[:, :1] - curves[:, 1:]).mean(dim=1)
