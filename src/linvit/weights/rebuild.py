"""A named model built at the size and class count a checkpoint's weights were trained at (any run folder back
as its trained model is linvit.runs.load_run)."""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from ..models import create_model
from .run_folder import run_model_args


def create_for_checkpoint(
    spec: str, checkpoint: str | Path | None, img_size=None, any_size: bool = False, **kwargs
) -> nn.Module:
    """spec, built so that checkpoint's weights fit, for inputs of img_size (or of any size with any_size).

    A run's weights are built at the size the run trained at (its position table loads as saved, with the run's
    class count unless kwargs give one) and resampled per input to img_size, as `linvit predict` runs
    `linvit.load_run`; building at img_size instead would not load them. Without a run: at img_size.
    """
    run = run_model_args(checkpoint) if checkpoint else {}
    if run.get("num_classes") is not None:
        kwargs.setdefault("num_classes", run["num_classes"])
    wanted, trained = height_width(img_size), height_width(run.get("img_size"))
    resample = any_size or (trained is not None and wanted is not None and wanted != trained)
    return create_model(spec, img_size=trained or wanted, any_size=resample, **kwargs)


def height_width(size) -> tuple[int, int] | None:
    """An input size as (H, W): one side (an int, a run's args.yaml) or a sequence of one or two (the flags)."""
    if size is None:
        return None
    return (size, size) if isinstance(size, int) else tuple((list(size) * 2)[:2])
