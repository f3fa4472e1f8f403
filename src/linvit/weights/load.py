"""Weights into a model: strictly, with one-line errors naming the file; a classifier's weights into a
backbone; the WeightFormer release's checkpoints; and a local file as timm's starting weights (the
pretrained path, which resamples position embeddings and re-heads a classifier of another class count)."""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from ..conversion import convert_if_asked
from ..errors import UsageError
from ..models import WeightFormer, weightformer
from .files import read_file, read_weights


def load_weights(model: nn.Module, path: str | Path, ema: bool | None = None) -> str:
    """Load weights strictly, with clear errors; returns which weights were loaded ("ema" or "model")."""
    path = Path(path)
    state, which = read_weights(path, ema)
    apply_weights(model, state, path)
    return which


def load_and_convert(model: nn.Module, path: str | Path | None, convert: str | None, ema: bool | None = None) -> str:
    """--checkpoint with --convert: weights of a converted model (they hold InfSA discounts) load after the
    conversion; softmax weights load before it, so a pretrained source is evaluated as converted, untrained."""
    if path is None:
        convert_if_asked(model, convert)
        return "random init"
    path = Path(path)
    state, which = read_weights(path, ema)
    converted_weights = any(k.endswith(".theta") for k in state)
    if converted_weights:
        convert_if_asked(model, convert)
    apply_weights(model, state, path)
    if not converted_weights:
        convert_if_asked(model, convert)
    return which


def apply_weights(model: nn.Module, state: dict, path: Path) -> None:
    """load_state_dict, strictly, with one-line errors naming the file."""
    if isinstance(model, WeightFormer):
        state = weightformer.checkpoint_filter_fn(state, model)  # official layouts, with clear errors
    check_num_classes(model, state, path)
    check_shapes(model, state, path)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise UsageError(
            f"{path}: checkpoint does not fit {type(model).__name__}: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )


def check_num_classes(model: nn.Module, state: dict, path) -> None:
    """Raise a one-line error when the checkpoint's classifier has another number of classes."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    name = next((n for n, m in model.named_modules() if m is head), None)
    key = f"{name}.weight" if name else None
    if key and key in state and isinstance(head, nn.Linear) and state[key].shape[0] != head.out_features:
        raise UsageError(f"{path}: checkpoint has {state[key].shape[0]} classes, the data has {head.out_features}")


def check_shapes(model: nn.Module, state: dict, path) -> None:
    """Raise a one-line error when a tensor of the checkpoint has another shape than the model's (a model built
    with another patch size, image size or width: load_state_dict's error is a traceback)."""
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and hasattr(v, "shape") and v.shape != own[k].shape]
    if wrong:
        first = wrong[0]
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise UsageError(
            f"{path}: checkpoint does not fit {type(model).__name__}: {first} is {tuple(state[first].shape)} there, "
            f"{tuple(own[first].shape)} in the model{more}: it was built with other settings (patch, image size, "
            "width, number of classes); build the model as it was trained, on data with its classes (a run folder "
            "rebuilds its own: give the folder, no --model)"
        )


def load_backbone(backbone: nn.Module, path: str | Path) -> None:
    """Initialise the backbone from a classification checkpoint (its head and unknown keys are dropped)."""
    state, _ = read_weights(path)
    own = backbone.state_dict()
    state = {k: v for k, v in state.items() if k in own}
    missing = [k for k in own if k not in state]
    mis_shaped = [k for k in state if state[k].shape != own[k].shape]
    if missing or mis_shaped:
        raise UsageError(f"{path}: does not fit the backbone: missing {missing[:3]}, mis-shaped {mis_shaped[:3]}")
    backbone.load_state_dict(state)


def load_checkpoint(model: WeightFormer, path: str | Path, strict: bool = True) -> WeightFormer:
    """An official or linvit WeightFormer checkpoint (.pth/.pt or .safetensors) into model, as the release's
    own loader reads it (its "model" weights; see weightformer.checkpoint_filter_fn), without executing code."""
    model.load_state_dict(weightformer.checkpoint_filter_fn(read_file(path), model), strict=strict)
    return model
