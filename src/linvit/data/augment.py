"""timm's augmentation policies made to work with the installed Pillow.

Pillow 13 refuses ``ImageOps.posterize(img, 0)`` (ValueError: bits must be between 1 and 8); older Pillow
returned a black image (0 bits kept). timm's "Posterize" ops reach 0 bits at high magnitudes (PosterizeIncreasing,
in the DeiT default ``rand-m9-mstd0.5-inc1``, whenever the sampled magnitude reaches 10), so some training images
raised in the transform: until linvit let transform errors through, each was counted as an unreadable image and
silently left out of training. ``fix_posterize`` gives those ops the old Pillow's result.
"""

from __future__ import annotations

from PIL import Image, ImageOps


def posterize_any_bits(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize with 0 bits kept meaning a black image, as older Pillow gave it."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def fix_posterize(transform) -> int:
    """Point every timm Posterize op inside transform (a Compose, RandAugment or AutoAugment) at
    posterize_any_bits; returns how many ops were changed."""
    changed = 0
    for t in getattr(transform, "transforms", [transform]):
        ops = list(getattr(t, "ops", []))
        for sub_policy in getattr(t, "policy", []):
            ops.extend(sub_policy)
        for op in ops:
            if getattr(op, "name", "").startswith("Posterize"):
                op.aug_fn = posterize_any_bits
                changed += 1
    return changed
