"""Converted timm models as timm models: ``infsa_converted`` rebuilds one from its source name and conversion.

``convert`` records, on a timm model, the architecture ``infsa_converted`` and the arguments that rebuild it
(source_model, convert_variant, gamma_init, include, exclude, plus the source's own arguments). So
``timm.models.save_for_hf(model, DIR)`` writes a config.json that ``timm.create_model("local-dir:DIR",
pretrained=True)`` (after ``import linvit``) turns back into the converted model with its weights.
"""

from __future__ import annotations

import timm
import torch.nn as nn
from timm.models import generate_default_cfgs, load_pretrained, register_model

from .core import convert
from .records import ARCHITECTURE

CONVERSION_ARGS = ("source_model", "convert_variant", "gamma_init", "include", "exclude")

default_cfgs = generate_default_cfgs({ARCHITECTURE: dict(url="", license="mit", paper_ids="arXiv:2603.00175")})


@register_model
def infsa_converted(
    pretrained: bool = False,
    *,
    source_model: str,
    convert_variant: str = "linear_infsa",
    gamma_init: float = 0.9,
    include=None,
    exclude=None,
    linear_variant: str = "release",
    feature_dim: int | None = None,
    pretrained_cfg=None,
    pretrained_cfg_overlay=None,
    cache_dir=None,
    **kwargs,
) -> nn.Module:
    """timm's ``source_model`` with its attention converted to InfSA (linvit.convert), weights from a saved
    converted model when pretrained (e.g. ``timm.create_model("local-dir:RUN", pretrained=True)``)."""
    kwargs.pop("pretrained_model_args", None)
    model = timm.create_model(source_model, **kwargs)
    convert(
        model,
        convert_variant,
        gamma_init=gamma_init,
        include=include,
        exclude=exclude,
        linear_variant=linear_variant,
        feature_dim=feature_dim,
    )
    if pretrained_cfg is not None:
        cfg = pretrained_cfg if isinstance(pretrained_cfg, dict) else pretrained_cfg.to_dict()
        model.pretrained_cfg = {**model.pretrained_cfg, **cfg, **(pretrained_cfg_overlay or {})}
        model.pretrained_cfg["architecture"] = ARCHITECTURE
    if pretrained:
        load_pretrained(model, model.pretrained_cfg, num_classes=model.num_classes, cache_dir=cache_dir)
    return model
