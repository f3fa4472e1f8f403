"""Detectors on every backbone: torchvision's Faster R-CNN, RetinaNet and Mask R-CNN on the simple feature pyramid.

The pyramid (linvit.models.pyramid, ViTDet) gives four maps at strides p/4..2p from the backbone's last block;
a fifth, max-pooled level is added as torchvision's FPN does ("pool"), so the detectors' default five-level
anchor layout applies. torchvision's transform resizes (shorter side min_size, longer at most max_size),
normalises with the backbone's mean/std and pads to the pyramid's divisor, so any input size works.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator

from ..conversion import convert_if_asked
from ..errors import UsageError
from ..models.pyramid import create_pyramid
from ..weights import load_backbone

KINDS = ("fasterrcnn", "retinanet", "maskrcnn")


class PyramidBackbone(nn.Module):
    """The simple feature pyramid as a torchvision detection backbone: ordered maps "0".."3" and "pool",
    all with ``out_channels`` channels."""

    def __init__(self, pyramid: nn.Module) -> None:
        super().__init__()
        self.pyramid = pyramid
        self.out_channels = pyramid.out[0][0].out_channels
        self.size_divisor = pyramid.size_divisor

    @property
    def body(self) -> nn.Module:
        """The classification backbone inside (timm model)."""
        return self.pyramid.backbone

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        maps = self.pyramid(x)
        out = OrderedDict((str(i), m) for i, m in enumerate(maps))
        out["pool"] = F.max_pool2d(maps[-1], kernel_size=1, stride=2)
        return out


def anchor_sizes(base: int, scales_per_level: int = 1) -> tuple[tuple[int, ...], ...]:
    """Anchor sizes of the five levels: base * 2^level, with octave scales for RetinaNet."""
    return tuple(
        tuple(int(base * 2**level * 2 ** (s / scales_per_level)) for s in range(scales_per_level)) for level in range(5)
    )


def create_detector(
    backbone_name: str,
    num_classes: int,
    kind: str = "fasterrcnn",
    *,
    min_size: int = 800,
    max_size: int = 1333,
    anchor_base: int = 32,
    pyramid_channels: int = 256,
    backbone_checkpoint: str | None = None,
    convert: str | None = None,
    grad_checkpointing: bool = False,
    **backbone_kwargs,
) -> nn.Module:
    """A torchvision detector (num_classes includes the background) on a linvit or timm ViT/DeiT backbone.

    Args:
        backbone_name: any registered linvit family or timm ViT/DeiT name (':variant' allowed).
        kind: "fasterrcnn", "retinanet" or "maskrcnn".
        min_size, max_size: torchvision's resize rule (COCO: 800 / 1333).
        anchor_base: anchor size of the finest level (32 at COCO scale; doubled per level).
        backbone_checkpoint: classification weights to start the backbone from (its head is dropped).
        convert: convert the backbone's softmax attention to this InfSA variant after loading.
        grad_checkpointing: recompute backbone blocks in backward (timm's set_grad_checkpointing).
    """
    if kind not in KINDS:
        raise UsageError(f"unknown detector {kind!r}; choose from {', '.join(KINDS)}")
    if num_classes < 2:
        raise UsageError(f"num_classes counts the background too and must be >= 2, got {num_classes}")
    pyramid = create_pyramid(backbone_name, out_channels=pyramid_channels, **backbone_kwargs)
    if backbone_checkpoint:
        load_backbone(pyramid.backbone, backbone_checkpoint)
    convert_if_asked(pyramid.backbone, convert)
    if grad_checkpointing:
        pyramid.backbone.set_grad_checkpointing(True)
    backbone = PyramidBackbone(pyramid)
    cfg = getattr(pyramid.backbone, "pretrained_cfg", {}) or {}
    common = dict(
        min_size=min_size,
        max_size=max_size,
        image_mean=list(cfg.get("mean", (0.485, 0.456, 0.406))),
        image_std=list(cfg.get("std", (0.229, 0.224, 0.225))),
        size_divisible=backbone.size_divisor,
    )
    if kind == "retinanet":
        sizes = anchor_sizes(anchor_base, scales_per_level=3)
        anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
        return RetinaNet(backbone, num_classes, anchor_generator=anchors, **common)
    sizes = anchor_sizes(anchor_base)
    anchors = AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * len(sizes))
    detector = MaskRCNN if kind == "maskrcnn" else FasterRCNN
    return detector(backbone, num_classes, rpn_anchor_generator=anchors, **common)
