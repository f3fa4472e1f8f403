"""Object detection on every backbone: torchvision's Faster R-CNN, RetinaNet and Mask R-CNN on the simple
feature pyramid, COCO-format data through pycocotools, COCO mAP from COCOeval (`linvit detect train|eval`)."""

from .coco_eval import STAT_NAMES, coco_stats, to_coco_results
from .data import CocoDetection, collate_detection, find_coco_split
from .model import KINDS, PyramidBackbone, create_detector

__all__ = [
    "create_detector",
    "PyramidBackbone",
    "KINDS",
    "CocoDetection",
    "collate_detection",
    "find_coco_split",
    "coco_stats",
    "to_coco_results",
    "STAT_NAMES",
]
