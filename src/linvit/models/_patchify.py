"""The patch embedding's convolution as one matrix product under CPU bfloat16 autocast.

A patchify convolution (stride = kernel, no padding) is a matrix product over the image's non-overlapping
patches. Under bf16 autocast on CPU, oneDNN's convolution of an NCHW image ran 11x slower than that product
(Zen 5, 2 threads, 1024 px, 3 -> 1024 channels, patch 16: 103 vs 9 ms; a channels-last input closes most of the
gap, but the image arrives NCHW), a seventh of Linear-InfViT-4L's whole bf16 forward; in float32 the two cost the
same, so everything else keeps the convolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _bf16_autocast_on_cpu(x: torch.Tensor) -> bool:
    if isinstance(x, torch.fx.Proxy):  # symbolic tracing: the convolution, as written
        return False
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )


class PatchifyConv2d(nn.Conv2d):
    """nn.Conv2d (same parameters, same state dict) whose forward, for non-overlapping patches under CPU bf16
    autocast, is the equivalent matrix product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # a block of its own: TorchScript then never compiles it
            if _bf16_autocast_on_cpu(x) and self._tiles(x):
                return self._as_product(x)
        return self._conv_forward(x, self.weight, self.bias)

    @torch.jit.unused
    def _tiles(self, x: torch.Tensor) -> bool:
        """Whether the convolution is a product over whole, non-overlapping patches of x."""
        plain = self.padding == (0, 0) and self.dilation == (1, 1) and self.groups == 1
        ph, pw = self.kernel_size
        return (
            plain
            and self.stride == self.kernel_size
            and x.dim() == 4
            and x.shape[-2] % ph == 0
            and x.shape[-1] % pw == 0
        )

    @torch.jit.unused
    def _as_product(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, out, H / ph, W / pw), as the convolution returns it (an NHWC layout underneath)."""
        B, C, H, W = x.shape
        ph, pw = self.kernel_size
        patches = x.reshape(B, C, H // ph, ph, W // pw, pw).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(B, H // ph, W // pw, C * ph * pw)  # each patch's pixels in the weight's order
        return F.linear(patches, self.weight.reshape(self.out_channels, -1), self.bias).permute(0, 3, 1, 2)


def patchify(conv: nn.Conv2d) -> nn.Conv2d:
    """conv, now a PatchifyConv2d: its class is swapped in place, so no new parameters are drawn (a new module
    would consume the seeded generator and change every model initialised after it)."""
    if type(conv) is nn.Conv2d:
        conv.__class__ = PatchifyConv2d
    return conv
