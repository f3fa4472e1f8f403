"""A patch-grid importance map drawn over the original picture, at the picture's own size.

The model may have seen only part of the picture (timm's eval transform resizes the shorter side and centre
crops): ``seen_box`` gives that region in original pixels, the map is stretched over it, and what the model never
saw is dimmed. Colours come from a 256-entry lookup table, so an 8192 x 8192 overlay costs a few uint8 images,
not float RGBA arrays.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

OUTSIDE_DIM = 0.35  # brightness kept where the model saw nothing


def seen_box(size: tuple[int, int], config: dict | None) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in original pixels of the region timm's eval transform keeps.

    size is the picture's (width, height); config a timm data config, or None when the whole picture was
    resized (native size or an exact --img-size), which keeps everything.
    """
    width, height = size
    if config is None:
        return (0.0, 0.0, float(width), float(height))
    out_h, out_w = config["input_size"][-2:]
    crop_pct = config.get("crop_pct") or 1.0
    scale_h, scale_w = math.floor(out_h / crop_pct), math.floor(out_w / crop_pct)
    mode = config.get("crop_mode") or "center"
    if mode == "squash":  # both sides resized to the scale size, then centre crop
        keep_w, keep_h = width * out_w / scale_w, height * out_h / scale_h
    elif scale_h == scale_w and mode == "center":  # shorter side to the scale size, then centre crop
        ratio = min(width, height) / scale_h
        keep_w, keep_h = min(width, out_w * ratio), min(height, out_h * ratio)
    else:  # ResizeKeepRatio variants: the whole picture fits
        return (0.0, 0.0, float(width), float(height))
    left, top = (width - keep_w) / 2, (height - keep_h) / 2
    return (left, top, left + keep_w, top + keep_h)


def colour_table(cmap: str = "jet") -> np.ndarray:
    """(256, 3) uint8 RGB lookup table of a matplotlib colormap."""
    from matplotlib import colormaps

    return (colormaps[cmap](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)


def normalise(patch_map: np.ndarray) -> np.ndarray:
    """Map values scaled to [0, 1] between their 1st and 99th percentiles (a constant map becomes 0)."""
    values = np.asarray(patch_map, dtype=np.float64)
    low, high = np.percentile(values, [1, 99])
    if not high > low:
        return np.zeros_like(values, dtype=np.float32)
    return np.clip((values - low) / (high - low), 0, 1).astype(np.float32)


def overlay(
    picture: Image.Image,
    patch_map: np.ndarray,
    box: tuple[float, float, float, float] | None = None,
    alpha: float = 0.5,
    cmap: str = "jet",
) -> Image.Image:
    """picture (RGB, any size) with patch_map (h, w) stretched bilinearly over box and blended at alpha."""
    width, height = picture.size
    left, top, right, bottom = box or (0.0, 0.0, float(width), float(height))
    x0, y0 = max(0, round(left)), max(0, round(top))
    x1, y1 = min(width, max(x0 + 1, round(right))), min(height, max(y0 + 1, round(bottom)))
    scaled = Image.fromarray(normalise(patch_map), mode="F").resize((x1 - x0, y1 - y0), Image.BILINEAR)
    levels = np.clip(np.asarray(scaled) * 255 + 0.5, 0, 255).astype(np.uint8)
    heat = Image.fromarray(colour_table(cmap)[levels], mode="RGB")
    region = picture.crop((x0, y0, x1, y1))
    whole = (x0, y0, x1, y1) == (0, 0, width, height)
    out = picture.copy() if whole else Image.eval(picture, lambda v: int(v * OUTSIDE_DIM))
    out.paste(Image.blend(region, heat, alpha), (x0, y0))
    return out
