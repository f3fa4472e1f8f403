"""The pretrained-config dict every linvit model registers (timm's default_cfg fields)."""

from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..errors import UsageError

# models whose authors published weights, and where (Hugging Face Hub, saved with PyTorchModelHubMixin)
PUBLISHED = {
    "weightformer_tiny_patch16_224": "RuizeHe/weightformer-t",
    "weightformer_small_patch16_224": "RuizeHe/weightformer-s",
    "weightformer_base_patch16_448": "RuizeHe/weightformer-b",
}


def model_cfg(**kwargs) -> dict:
    """ImageNet normalisation, bicubic, 224 input, any size accepted; weights from the Hub where PUBLISHED says
    so (pass hf_hub_id), else from a local file only."""
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


def hub_weights(variant: str) -> dict:
    """The pretrained_cfg fields that make timm fetch a PUBLISHED model's weights from the Hub."""
    return {"hf_hub_id": PUBLISHED[variant], "hf_hub_filename": "model.safetensors"}


def require_weights(variant: str, pretrained: bool, kwargs: dict) -> None:
    """pretrained=True where no weights exist is an error (timm would warn and hand back random weights).

    Weights exist when the resolved pretrained_cfg names a source: a URL, a file (run folders, --pretrained-file),
    a Hub id or a state dict.
    """
    if not pretrained:
        return
    from timm.models import resolve_pretrained_cfg

    cfg = resolve_pretrained_cfg(
        variant,
        pretrained_cfg=kwargs.get("pretrained_cfg"),
        pretrained_cfg_overlay=kwargs.get("pretrained_cfg_overlay"),
    ).to_dict()
    if any(cfg.get(k) for k in ("url", "file", "hf_hub_id", "state_dict")):
        return
    raise UsageError(
        f"{variant} has no published weights; published: {', '.join(PUBLISHED)} "
        "(or give a file: --pretrained-file / pretrained_cfg_overlay=dict(file=...))"
    )
