"""COCO results files and the 12 COCO numbers, computed by pycocotools' COCOeval (never by hand)."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import torch
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval

STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def to_coco_results(output: dict, image_id: int, category_ids: list[int]) -> list[dict]:
    """One image's detector output as COCO result entries (bbox [x, y, w, h]; an RLE segmentation for masks)."""
    boxes = output["boxes"].detach().float().cpu()
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
    scores = output["scores"].detach().float().cpu().tolist()
    labels = output["labels"].detach().cpu().tolist()
    results = [
        {"image_id": int(image_id), "category_id": category_ids[label - 1], "bbox": box, "score": score}
        for box, score, label in zip(xywh, scores, labels, strict=True)
    ]
    if "masks" in output:
        binary = (output["masks"][:, 0] > 0.5).cpu().numpy().astype(np.uint8)
        for result, mask in zip(results, binary, strict=True):
            rle = mask_utils.encode(np.asfortranarray(mask))
            result["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
    return results


def coco_stats(coco_gt, results: list[dict], iou_type: str = "bbox", image_ids: list[int] | None = None):
    """(the 12 COCO numbers in percent, COCOeval's printed summary) for results against coco_gt."""
    if not results:  # loadRes refuses an empty list; no detection scores 0 everywhere
        return dict.fromkeys(STAT_NAMES, 0.0), "no detections"
    with contextlib.redirect_stdout(io.StringIO()) as text:
        coco_dt = coco_gt.loadRes(copy.deepcopy(results))  # loadRes adds area, id, iscrowd and a box polygon
        evaluator = COCOeval(coco_gt, coco_dt, iou_type)
        if image_ids is not None:
            evaluator.params.imgIds = list(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    # -1 (COCO's "no ground truth of this size") stays -1
    stats = {name: float(v) * 100 if v >= 0 else -1.0 for name, v in zip(STAT_NAMES, evaluator.stats, strict=True)}
    return stats, text.getvalue()
