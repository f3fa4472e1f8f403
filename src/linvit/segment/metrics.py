"""Segmentation metrics from one confusion matrix: mIoU, pixel accuracy, per-class IoU.

Rows are ground truth, columns predictions; pixels labelled ``ignore_index`` are not counted. A class
that appears in neither ground truth nor predictions has no IoU (NaN) and is left out of the mean, as in
mmsegmentation. Summing matrices across ranks before the metrics gives exact DDP results.
"""

from __future__ import annotations

import torch

from ..errors import UsageError


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, num_classes: int, ignore_index: int = 255):
    """(C, C) int64 counts of (target, prediction) pairs over all pixels not labelled ignore_index."""
    if pred.shape != target.shape:
        raise UsageError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    keep = target != ignore_index
    t, p = target[keep].long(), pred[keep].long()
    if t.numel() and (t.min() < 0 or t.max() >= num_classes):
        raise UsageError(f"target labels must lie in [0, {num_classes}) or be {ignore_index}, found {int(t.max())}")
    return torch.bincount(t * num_classes + p, minlength=num_classes**2).reshape(num_classes, num_classes)


def scores(matrix: torch.Tensor) -> dict:
    """mIoU (%), pixel accuracy (%), mean class accuracy (%) and per-class IoU (%, NaN where undefined)."""
    m = matrix.double()
    tp = m.diag()
    gt, pred = m.sum(1), m.sum(0)
    union = gt + pred - tp
    iou = torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, float("nan")))
    acc = torch.where(gt > 0, tp / gt.clamp_min(1), torch.full_like(tp, float("nan")))
    total = m.sum()
    return {
        "miou": float(iou.nanmean() * 100),
        "pixel_acc": float(tp.sum() / total * 100) if total > 0 else float("nan"),
        "mean_acc": float(acc.nanmean() * 100),
        "per_class_iou": [float(v * 100) for v in iou],
        "pixels": int(total),
    }
