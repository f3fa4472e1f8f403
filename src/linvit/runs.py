"""linvit.load_run(RUN): any run folder (classifier, segmenter, detector, generator) back as its trained model.

Classification runs are timm model folders (``timm.create_model("local-dir:RUN", pretrained=True)`` works too);
segmentation and detection runs are not timm models (a segmenter or a torchvision detector around a timm
backbone), so they are rebuilt from the run's recorded arguments (through the task's own config class) and
loaded strictly from model.safetensors. Above the tasks in the import tiers, since it builds any of them.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from .errors import UsageError
from .utils.artifacts import WEIGHTS, pretrained_data_fields
from .weights import load_weights, read_run_config


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
    if task == "classification" or (task == "distillation" and "architecture" in config):
        import timm

        model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    elif task == "distillation":  # a torchvision or Hugging Face student: rebuilt from its teacher's spec
        from .distillation import rebuild_student

        model = rebuild_student(info.get("args") or {})
        load_weights(model, folder / WEIGHTS)
        if info.get("data_config"):  # the size and normalisation it learned at, where timm's tools look for them
            fields = pretrained_data_fields(info["data_config"])
            model.pretrained_cfg = {**(getattr(model, "pretrained_cfg", None) or {}), **fields}
    elif task == "generation":
        from .generate.sample import load_generator

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
        from .segment.engine import SegmenterSpec, build_model

        return build_model(SegmenterSpec.from_mapping(args).replace(backbone_checkpoint=None), num_classes)
    if task == "detection":
        from .detect.engine import DetectorSpec, build_detector

        return build_detector(DetectorSpec.from_mapping(args).replace(backbone_checkpoint=None), num_classes)
    raise UsageError(f"unknown task {task!r} in the run's config.json")
