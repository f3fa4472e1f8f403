"""Model names with an optional variant suffix, e.g. ``vit_4l_patch16_224:naive``.

The suffix selects an implementation of the same weights, so a benchmark compares like with like:
    naive     softmax attention with the N x N matrix materialised (the paper's baseline setting)
    fused     softmax attention through torch's scaled_dot_product_attention (timm default)
    unfolded  Linear-InfSA projecting K and V for every token (the reference release's cost)
    folded    Linear-InfSA with K/V folded into the soft query (linvit default)
    dense / chunked   pure InfSA with the N x N scores materialised, or in two passes over query blocks
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch.nn as nn
from timm.layers import Attention

from ..layers import LinearInfSAAttention, PureInfSAAttention

VARIANTS = ("naive", "fused", "unfolded", "folded", "dense", "chunked")


class ModelArgumentError(ValueError, TypeError):
    """A model argument of the wrong kind or value (e.g. --model-kwargs patch_size=banana): a ValueError for
    the command line's one-line errors, and still a TypeError for callers that retry without an argument."""


def split_name(spec: str) -> tuple[str, str | None]:
    """'name:variant' -> (name, variant); raises ValueError for an unknown variant."""
    name, _, variant = spec.partition(":")
    if variant and variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} in {spec!r}; choose from {', '.join(VARIANTS)}")
    return name, variant or None


def apply_variant(model: nn.Module, variant: str | None) -> nn.Module:
    """Switch every matching attention module of model to the variant; error if none matches."""
    if variant is None:
        return model
    wanted = {
        "naive": Attention,
        "fused": Attention,
        "unfolded": LinearInfSAAttention,
        "folded": LinearInfSAAttention,
        "dense": PureInfSAAttention,
        "chunked": PureInfSAAttention,
    }[variant]
    hits = [m for m in model.modules() if isinstance(m, wanted)]
    if not hits:
        raise ValueError(f"variant {variant!r} needs {wanted.__name__} layers, which this model does not have")
    for m in hits:
        if wanted is Attention:
            m.fused_attn = variant == "fused"
        elif wanted is LinearInfSAAttention:
            m.fold_kv = variant == "folded"
        else:
            m.impl = variant
    return model


def pretrained_overlay(name: str, path: str | Path) -> dict:
    """timm's pretrained_cfg_overlay that loads weights from a local file (.pth/.pt/.safetensors).

    The overlay states how many classes the file's classifier has, so timm keeps that classifier when the
    model has as many and replaces it (a new head) when it has another number, as with any timm checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: pretrained file not found")
    try:
        state = timm.models.load_state_dict(str(path), weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refusals, corrupt files
        raise ValueError(f"{path}: cannot read checkpoint safely ({type(err).__name__}: {err})") from err
    classifier = timm.models.get_pretrained_cfg(name).classifier if timm.models.get_pretrained_cfg(name) else None
    heads = [classifier] if isinstance(classifier, str) else list(classifier or [])
    weight = state.get(f"{heads[0]}.weight") if heads else None
    return dict(file=str(path), num_classes=0 if weight is None else int(weight.shape[0]))


def create_variant(
    spec: str, img_size: int | tuple[int, int] | None = None, pretrained_file: str | Path | None = None, **kwargs
) -> nn.Module:
    """timm.create_model for 'name[:variant]', built for img_size when the model takes that argument.

    pretrained_file loads weights through timm's pretrained path (the model's checkpoint filter resamples
    position embeddings and fills InfSA discounts missing from a softmax checkpoint; see pretrained_overlay).
    """
    name, variant = split_name(spec)
    if name not in timm.list_models():
        raise ValueError(f"unknown model {name!r} (see `linvit models` or timm.list_models())")
    if pretrained_file is not None:
        kwargs.update(pretrained=True, pretrained_cfg_overlay=pretrained_overlay(name, pretrained_file))
    try:
        if img_size is not None:
            try:
                model = timm.create_model(name, img_size=img_size, **kwargs)
            except TypeError:  # models without a fixed input size (no img_size argument)
                model = timm.create_model(name, **kwargs)
        else:
            model = timm.create_model(name, **kwargs)
    except TypeError as err:
        raise ModelArgumentError(f"cannot build {name} with arguments {kwargs}: {err}") from err
    except RuntimeError as err:  # load_state_dict: the pretrained file does not fit the model
        if pretrained_file is None:
            raise
        detail = " ".join(line.strip() for line in str(err).splitlines()[1:3])
        raise ValueError(f"{pretrained_file}: does not fit {name}: {detail[:300]}") from err
    return apply_variant(model, variant)


def create_any_size(spec: str, **kwargs) -> nn.Module:
    """create_variant for inputs of any size: position embeddings resampled per input where the model has them."""
    try:
        return create_variant(spec, dynamic_img_size=True, **kwargs)
    except TypeError:  # models without position embeddings (WeightFormer) take any size as they are
        return create_variant(spec, **kwargs)
