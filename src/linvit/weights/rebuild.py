"""Models rebuilt so that saved weights fit them: any run folder back as its trained model
(``linvit.load_run``), and a named model built at the size and class count a run's weights were trained at.

Classification runs are timm model folders (``timm.create_model("local-dir:RUN", pretrained=True)`` works too);
segmentation and detection runs are not timm models (a segmenter or a torchvision detector around a timm
backbone), so they are rebuilt from the run's recorded arguments (through the task's own config class) and
loaded strictly from model.safetensors.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from ..errors import UsageError
from ..models import create_model
from ..utils.artifacts import WEIGHTS
from .load import load_weights
from .run_folder import read_run_config, run_model_args


def load_run(path: str | Path) -> nn.Module:
    """The trained model of a run folder (or of a file inside one), in eval mode, with ``label_names`` set:
    a classifier, segmenter, detector, or a generation run's DiT (its EMA weights)."""
    found = read_run_config(path)
    if found is None:
        raise UsageError(f"{path}: not a linvit run folder (no config.json with a 'linvit' section)")
    folder, config = found
    if not (folder / WEIGHTS).is_file():
        raise UsageError(f"{folder}: no {WEIGHTS} (a run that has not finished?)")
    info = config["linvit"]
    task = info.get("task", "classification")
    if task == "classification":
        import timm

        model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    elif task == "generation":
        from ..generate.sample import load_generator

        model, _ = load_generator(folder)
    else:
        model = _build_dense(task, info.get("args") or {}, info["num_classes"])
        load_weights(model, folder / WEIGHTS)
    model.label_names = config.get("label_names")
    return model.eval()


def _build_dense(task: str, args: dict, num_classes: int) -> nn.Module:
    """A segmenter or detector from the run's stored arguments; the run's weights replace the backbone's
    starting point, so backbone_checkpoint is not read."""
    if task == "segmentation":
        from ..segment.engine import SegmenterSpec, build_model

        return build_model(SegmenterSpec.from_mapping(args).replace(backbone_checkpoint=None), num_classes)
    if task == "detection":
        from ..detect.engine import DetectorSpec, build_detector

        return build_detector(DetectorSpec.from_mapping(args).replace(backbone_checkpoint=None), num_classes)
    raise UsageError(f"unknown task {task!r} in the run's config.json")


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
