"""Semantic segmentation: any linvit (or timm ViT) backbone + a simple feature pyramid + a semantic-FPN head.

The head is the semantic branch of Panoptic FPN (Kirillov et al. 2019): each pyramid level goes through
3x3 conv + GroupNorm + ReLU blocks with 2x upsampling until it reaches the finest level, the levels are
summed, and a 1x1 convolution predicts per-class logits, upsampled to the input size. Inputs of any
size (non-square too) are zero-padded to the pyramid's size divisor and the logits cropped back.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UsageError
from ..models.pyramid import SimpleFeaturePyramid, create_pyramid


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.GroupNorm(min(32, cout), cout), nn.ReLU(inplace=True)
    )


class SemanticFPNHead(nn.Module):
    """Sum of upsampled pyramid levels -> 1x1 classifier at the finest level's stride."""

    def __init__(self, in_channels: int, strides: list[float], num_classes: int, channels: int = 128) -> None:
        super().__init__()
        finest = min(strides)
        self.branches = nn.ModuleList()
        for stride in strides:
            ups = int(round(math.log2(stride / finest)))
            layers: list[nn.Module] = [_conv_block(in_channels, channels)]
            for i in range(ups):
                if i > 0:
                    layers.append(_conv_block(channels, channels))
                layers.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False))
            self.branches.append(nn.Sequential(*layers))
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        fused = sum(branch(f) for branch, f in zip(self.branches, features, strict=True))
        return self.classifier(fused)


class Segmenter(nn.Module):
    """``forward(images)`` -> logits (B, num_classes, H, W) at the input resolution."""

    def __init__(self, pyramid: SimpleFeaturePyramid, num_classes: int, head_channels: int = 128) -> None:
        super().__init__()
        self.pyramid = pyramid
        self.num_classes = num_classes
        out_channels = pyramid.feature_info[0]["num_chs"]
        self.head = SemanticFPNHead(out_channels, pyramid.strides, num_classes, head_channels)

    @property
    def backbone(self) -> nn.Module:
        return self.pyramid.backbone

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3:
            raise UsageError(f"expected images of shape (B, 3, H, W), got {tuple(images.shape)}")
        H, W = images.shape[-2:]
        d = self.pyramid.size_divisor
        padded = F.pad(images, (0, (-W) % d, 0, (-H) % d))
        logits = self.head(self.pyramid(padded))
        logits = F.interpolate(logits, size=padded.shape[-2:], mode="bilinear", align_corners=False)
        return logits[..., :H, :W]


def create_segmenter(
    model_name: str, num_classes: int, pyramid_channels: int = 256, head_channels: int = 128, **model_kwargs
) -> Segmenter:
    """Backbone ``model_name`` (any registered linvit/timm ViT, ':variant' allowed) + pyramid + head."""
    if num_classes < 1:
        raise UsageError(f"num_classes must be >= 1, got {num_classes}")
    return Segmenter(create_pyramid(model_name, pyramid_channels, **model_kwargs), num_classes, head_channels)
