"""The pretrained-config dict every linvit model registers (timm's default_cfg fields)."""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD


def model_cfg(**kwargs) -> dict:
    """ImageNet normalisation, bicubic, 224 input, any size accepted; weights come from a local file only."""
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "mit",
        **kwargs,
    }
