"""Input validation shared by every linvit model: clear ValueErrors instead of shape asserts deep inside."""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed

from ..errors import UsageError
from ..layers.graph_capture import parent_method
from ._patchify import patchify


def check_image_batch(
    x: torch.Tensor,
    in_chans: int,
    patch_size: tuple[int, int],
    fixed_size: tuple[int, int] | None = None,
    pad: bool = False,
    check_finite: bool = False,
) -> None:
    """Raise ValueError naming the problem if x is not a (B, in_chans, H, W) batch the model accepts.

    Args:
        x: input batch.
        in_chans: channels the patch embedding expects.
        patch_size: (ph, pw); H and W must be multiples unless ``pad`` is set.
        fixed_size: (H, W) the model was built for when it does not take dynamic sizes.
        pad: the model pads inputs up to a multiple of the patch.
        check_finite: also reject NaN/Inf values (costs one pass over the input).
    """
    if isinstance(x, torch.fx.Proxy):  # symbolic tracing: shapes are unknown until the graph runs
        return
    if not isinstance(x, torch.Tensor):
        raise UsageError(f"expected a torch.Tensor image batch, got {type(x).__name__}")
    if x.dim() != 4:
        raise UsageError(f"expected a 4-D (B, C, H, W) image batch, got a {x.dim()}-D tensor of shape {tuple(x.shape)}")
    _, C, H, W = x.shape
    if C != in_chans:
        raise UsageError(f"expected {in_chans} input channels, got {C} (input shape {tuple(x.shape)})")
    if fixed_size is not None and (H, W) != tuple(fixed_size):
        raise UsageError(
            f"input size {H}x{W} differs from the model's fixed size {fixed_size[0]}x{fixed_size[1]}; "
            "create the model with dynamic_img_size=True to accept other sizes"
        )
    ph, pw = patch_size
    if not pad and (H % ph or W % pw):
        raise UsageError(
            f"input size {H}x{W} is not divisible by the patch size {ph}x{pw}; "
            "resize the input or create the model with dynamic_img_pad=True"
        )
    if check_finite and not torch.isfinite(x).all():
        raise UsageError("input contains NaN or Inf values")


class CheckedPatchEmbed(PatchEmbed):
    """timm PatchEmbed that validates its input with check_image_batch before embedding (in eager mode; a
    scripted model embeds as timm's PatchEmbed does)."""

    check_finite = False  # unannotated: TorchScript cannot read postponed class annotations
    _timm_forward = parent_method(PatchEmbed.forward, "_timm_forward")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        patchify(self.proj)  # one matrix product under CPU bf16 autocast (models._patchify)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            fixed = self.img_size if (self.img_size is not None and self.strict_img_size) else None
            check_image_batch(x, self.proj.in_channels, self.patch_size, fixed, self.dynamic_img_pad, self.check_finite)
        return self._timm_forward(x)

    def rows_embed_apart(self) -> bool:
        """Whether patches do not overlap, so a band of patch rows embeds as that band of the whole embedding."""
        return self.proj.stride == self.proj.kernel_size

    def row_bands(self, images: torch.Tensor, rows: int) -> list:
        """(first row, end row, embed) for bands of ``rows`` token rows of images, each embed() giving that band's
        (B, rows, W, C) tokens (NHWC output, rows_embed_apart): token-chunked inference embeds band by band."""
        H = self.dynamic_feat_size(images.shape[-2:])[0]
        step = self.patch_size[0]
        spans = [(r0, min(H, r0 + rows)) for r0 in range(0, H, rows)]
        return [
            (r0, r1, partial(self._embed_rows, images, r0 * step, r1 * step if r1 < H else None)) for r0, r1 in spans
        ]

    def _embed_rows(self, images: torch.Tensor, top: int, bottom: int | None) -> torch.Tensor:
        return self(images[:, :, top:bottom])


def patch_size(model: torch.nn.Module) -> tuple[int, int]:
    """The model's patch (or total stride) in pixels, for rounding native sizes to its token grid."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is None:
        return (1, 1)
    return (patch, patch) if isinstance(patch, int) else tuple(patch)
