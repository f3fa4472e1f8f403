"""A simple feature pyramid for isotropic backbones (ViTDet, Li et al. 2022), for every linvit family.

An isotropic backbone has one stride (its patch size p). ViTDet builds a pyramid from its last block
alone: two 2x deconvolutions to stride p/4, one to p/2, identity at p, max-pooling to 2p; then a 1x1
and a 3x3 convolution (each with channel LayerNorm) per level. With p = 16 the strides are 4/8/16/32.
The backbone is read through timm's ``forward_intermediates``, so linvit's InfViT/Linear/Katz models,
WeightFormer and timm's own ViT/DeiT all fit, at any input size the backbone accepts.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from timm.layers import LayerNorm2d

from ..errors import UsageError
from .variants import create_any_size

SCALES = (4.0, 2.0, 1.0, 0.5)


def _patch(backbone: nn.Module) -> int:
    size = backbone.patch_embed.patch_size
    size = size if isinstance(size, int) else size[0]
    return int(size)


def _level(scale: float, dim: int) -> nn.Sequential:
    if scale == 4.0:
        return nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
            LayerNorm2d(dim // 2),
            nn.GELU(),
            nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2),
        )
    if scale == 2.0:
        return nn.Sequential(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2))
    if scale == 1.0:
        return nn.Sequential()
    if scale == 0.5:
        return nn.Sequential(nn.MaxPool2d(2, stride=2))
    raise UsageError(f"unsupported pyramid scale {scale}; choose from {SCALES}")


class SimpleFeaturePyramid(nn.Module):
    """Wraps an isotropic backbone; ``forward(x)`` returns four NCHW maps at strides p/4, p/2, p, 2p.

    Args:
        backbone: a model with ``patch_embed.patch_size``, ``num_features`` and ``forward_intermediates``.
        out_channels: channels of every pyramid level.
        scales: resampling factors of the last block's map (ViTDet: 4, 2, 1, 0.5).
    """

    def __init__(self, backbone: nn.Module, out_channels: int = 256, scales: tuple[float, ...] = SCALES) -> None:
        super().__init__()
        if not hasattr(backbone, "forward_intermediates"):
            raise UsageError(f"{type(backbone).__name__} has no forward_intermediates; it cannot feed a pyramid")
        if hasattr(backbone, "prune_intermediate_layers"):  # drop the final norm and head: no unused parameters
            backbone.prune_intermediate_layers(1, prune_norm=True, prune_head=True)
        self.backbone = backbone
        dim = int(backbone.num_features)
        patch = _patch(backbone)
        self.up = nn.ModuleList(_level(s, dim) for s in scales)
        self.out = nn.ModuleList()
        for s in scales:
            channels = {4.0: dim // 4, 2.0: dim // 2}.get(s, dim)
            self.out.append(
                nn.Sequential(
                    nn.Conv2d(channels, out_channels, 1, bias=False),
                    LayerNorm2d(out_channels),
                    nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                    LayerNorm2d(out_channels),
                )
            )
        self.strides = [patch / s for s in scales]
        self.feature_info = [
            dict(num_chs=out_channels, reduction=stride, module=f"out.{i}") for i, stride in enumerate(self.strides)
        ]
        # the input must split into whole patches and the coarsest level must halve the grid exactly
        self.size_divisor = int(max(self.strides))

    def last_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone.forward_intermediates(x, indices=1, intermediates_only=True, output_fmt="NCHW")[-1]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feature = self.last_map(x)
        return [out(up(feature)) for up, out in zip(self.up, self.out, strict=True)]


def create_pyramid(model_name: str, out_channels: int = 256, **model_kwargs) -> SimpleFeaturePyramid:
    """A pyramid over a registered backbone (linvit or timm, ':variant' allowed), without its classifier head."""
    backbone = create_any_size(model_name, num_classes=0, **model_kwargs)
    return SimpleFeaturePyramid(backbone, out_channels=out_channels)
