"""Model names with an optional variant suffix, e.g. ``vit_4l_patch16_224:naive``.

Every form timm accepts works wherever linvit takes a model name: registered names, pretrained tags
(``vit_tiny_patch16_224.augreg_in21k``), ``hf-hub:org/repo`` and ``local-dir:PATH``, each with an optional
``:variant`` at the end (``local-dir:runs/deit:fused``). The suffix is read as a variant only when it is one of
VARIANTS and what precedes it is itself a model name (registered, or with a source prefix): timm's names have
no ':', and a source keeps everything after its first ':', so ``local-dir:naive`` is the folder ``naive``.

The suffix selects an implementation of the same weights, so a benchmark compares like with like:
    naive     softmax attention with the N x N matrix materialised (the paper's baseline setting)
    fused     softmax attention through torch's scaled_dot_product_attention (timm default)
    unfolded  Linear-InfSA projecting K and V for every token (the reference release's cost)
    folded    Linear-InfSA with K/V folded into the soft query (linvit default)
    dense / chunked   pure InfSA with the N x N scores materialised, or in two passes over query blocks
"""

from __future__ import annotations

import contextlib
import difflib
from pathlib import Path

import timm
import torch.nn as nn
from timm.layers import Attention
from timm.models import is_model, parse_model_name, split_model_name_tag

from ..errors import UsageError
from ..hub_offline import offline_while_hub_unresolvable
from ..layers import LinearInfSAAttention, PureInfSAAttention

VARIANTS = ("naive", "fused", "unfolded", "folded", "dense", "chunked")


class ModelArgumentError(UsageError, TypeError):
    """A model argument of the wrong kind or value (e.g. --model-kwargs patch_size=banana): a ValueError for
    the command line's one-line errors, and still a TypeError for callers that retry without an argument."""


def split_name(spec: str) -> tuple[str, str | None]:
    """'name[:variant]' -> (name, variant), name in any form timm accepts; ValueError for an unknown variant
    after a registered name (``vit_4l_patch16_224:navie``)."""
    base, sep, suffix = spec.rpartition(":")
    if not sep:
        return spec, None
    if ":" in base or _is_registered(base):  # a source prefix, or a registered name, before the suffix
        if suffix in VARIANTS:
            return base, suffix
        if _is_registered(base):
            raise UsageError(f"unknown variant {suffix!r} in {spec!r}; choose from {', '.join(VARIANTS)}")
    return spec, None


def _is_registered(name: str) -> bool:
    return ":" not in name and "/" not in name and is_model(split_model_name_tag(name)[0])


def check_model_name(name: str) -> None:
    """ValueError (one line) unless timm can resolve name: a registered name (with or without a pretrained tag),
    hf-hub:REPO or local-dir:PATH (the folder must exist)."""
    if ":" not in name and "/" in name:  # timm 1.0.31 says so too; 1.0.26 dropped the org silently
        path = Path(name).expanduser()
        if (name.startswith(("/", ".", "~")) or path.parent.is_dir()) and not path.exists():  # runs/typo
            raise UsageError(f"{name}: no such file or folder")
        raise UsageError(f"{name!r} looks like a Hub repo id or a path: use 'hf-hub:{name}' or 'local-dir:{name}'")
    source, model = parse_model_name(name)
    if source == "local-dir" and not Path(model).is_dir():
        raise UsageError(f"{name}: folder {model!r} not found")
    if source is None and not is_model(split_model_name_tag(model)[0]):
        hint = ", ".join(similar_models(split_model_name_tag(model)[0]))
        hint = f"; did you mean {hint}?" if hint else ""
        raise UsageError(f"unknown model {name!r} (see `linvit models` or timm.list_models()){hint}")


def similar_models(name: str, count: int = 3) -> list[str]:
    """Registered names a typo probably meant: the ones that start with it (a name without its patch and size
    suffix), else the closest spellings."""
    names = timm.list_models()
    started = [m for m in names if m.startswith(name)]
    return started[:count] if started else difflib.get_close_matches(name, names, n=count, cutoff=0.75)


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
        raise UsageError(f"variant {variant!r} needs {wanted.__name__} layers, which this model does not have")
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
        raise UsageError(f"{path}: pretrained file not found")
    try:
        state = timm.models.load_state_dict(str(path), weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refusals, corrupt files
        raise UsageError(f"{path}: cannot read checkpoint safely ({type(err).__name__}: {err})") from err
    classifier = timm.models.get_pretrained_cfg(name).classifier if timm.models.get_pretrained_cfg(name) else None
    heads = [classifier] if isinstance(classifier, str) else list(classifier or [])
    weight = state.get(f"{heads[0]}.weight") if heads else None
    return dict(file=str(path), num_classes=0 if weight is None else int(weight.shape[0]))


def create_model(
    spec: str,
    img_size: int | tuple[int, int] | None = None,
    pretrained_file: str | Path | None = None,
    any_size: bool = False,
    **kwargs,
) -> nn.Module:
    """The one model builder: timm.create_model for any timm name plus linvit's ':variant' suffix (see the
    module docstring); kwargs (num_classes, model kwargs, pretrained=True for published or Hub weights) go to
    timm.

    img_size builds the model for that input where it takes the argument; any_size resamples the position
    embeddings per input where it has them. pretrained_file loads starting weights from a local file through
    timm's pretrained path (the model's checkpoint filter resamples position embeddings and fills InfSA
    discounts missing from a softmax checkpoint; see pretrained_overlay).
    """
    name, variant = split_name(spec)
    check_model_name(name)
    if pretrained_file is not None:
        kwargs.update(pretrained=True, pretrained_cfg_overlay=pretrained_overlay(name, pretrained_file))
    optional = {"img_size": img_size} if img_size is not None else {}
    optional.update({"dynamic_img_size": True} if any_size else {})
    hub = pretrained_file is None and (kwargs.get("pretrained") or name.startswith("hf-hub:"))
    try:
        with offline_while_hub_unresolvable() if hub else contextlib.nullcontext():  # no 50 s of retries offline
            model = _create_taking(name, optional, kwargs)
    except TypeError as err:
        raise ModelArgumentError(f"cannot build {name} with arguments {kwargs}: {err}") from err
    except RuntimeError as err:  # load_state_dict: the pretrained file does not fit the model
        if pretrained_file is None:
            raise
        detail = " ".join(line.strip() for line in str(err).splitlines()[1:3])
        raise UsageError(f"{pretrained_file}: does not fit {name}: {detail[:300]}") from err
    return apply_variant(model, variant)


def _create_taking(name: str, optional: dict, kwargs: dict) -> nn.Module:
    """timm.create_model(name, **optional, **kwargs) without each optional argument the model does not take
    (img_size on a model without a fixed input size, dynamic_img_size on one without position embeddings);
    any other TypeError is the caller's."""
    while True:
        try:
            return timm.create_model(name, **optional, **kwargs)
        except TypeError as err:
            rejected = next((k for k in optional if _rejects_argument(err, k)), None)
            if rejected is None:
                raise
            optional = {k: v for k, v in optional.items() if k != rejected}


def _rejects_argument(err: TypeError, name: str) -> bool:
    """err is Python's "unexpected keyword argument 'name'" (and not some other TypeError inside the model)."""
    return f"unexpected keyword argument '{name}'" in str(err)


create_variant = create_model  # linvit.models' earlier name for the builder, kept for its callers


def create_any_size(spec: str, **kwargs) -> nn.Module:
    """create_model for inputs of any size: position embeddings resampled per input where the model has them."""
    return create_model(spec, any_size=True, **kwargs)
