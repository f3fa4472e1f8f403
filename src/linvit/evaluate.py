"""`linvit eval`: top-1/top-5/loss of a checkpoint (a run folder, a weights file, an exported .onnx file) on one
split of any `--data`. The loop and the numbers are the classification task's (classify.evaluate_classification on
engine.run_evaluation); weights are read by linvit.weights."""

from __future__ import annotations

import dataclasses
import sys

import torch
from timm.data import create_transform, resolve_data_config

from .classify import evaluate_classification
from .config import Config, default_workers
from .data.splits import open_split
from .distributed import distributed_session
from .engine import eval_loader
from .errors import UsageError
from .utils import compile_model
from .utils.paths import write_json
from .weights import (
    create_for_checkpoint,
    height_width,
    load_and_convert,
    refuse_exported_graph,
    run_model_args,
    use_run_folder,
)


def class_count(data: str, split: str) -> int:
    """Classes of DATA/SPLIT (its class folders; 10 for the digit tasks)."""
    return len(open_split(data, split).classes)


def other_size_note(checkpoint, img_size, command: str = "eval", done: str = "evaluated") -> str | None:
    """One line when a run is evaluated (or exported: command, done) at another input size than it was trained
    at: it runs (the position table is resampled), but its accuracy there is not the run's, so it is said rather
    than left silent."""
    trained = height_width(run_model_args(checkpoint).get("img_size")) if checkpoint else None
    wanted = height_width(img_size)
    if trained is None or wanted is None or trained == wanted:
        return None

    def px(size: tuple[int, int]) -> str:
        return f"{size[0]}" if size[0] == size[1] else f"{size[0]} x {size[1]}"

    return (
        f"linvit {command}: note: {checkpoint} was trained at {px(trained)} px and is {done} at {px(wanted)} px "
        "(position embeddings resampled; accuracy at another size is not the run's)"
    )


@dataclasses.dataclass
class EvalConfig(Config):
    """`linvit eval`: a checkpoint (a run folder, or a weights file for ``model``) on one split of ``data``."""

    data: str | None = None
    split: str = "val"
    model: str | None = None
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False
    checkpoint: str | None = None
    ema: bool | None = None
    convert: str | None = None
    img_size: int | list[int] | None = None
    crop_pct: float | None = None
    batch_size: int = 64
    workers: int = dataclasses.field(default_factory=default_workers)
    amp: str = "none"
    device: str = "auto"
    compile: str = "off"
    progress: bool = True
    json: str | None = None


def run_eval(config: EvalConfig) -> dict:
    """`linvit eval`: evaluate a checkpoint on one split and print / save the metrics."""
    if str(config.checkpoint or "").lower().endswith(".onnx"):  # an exported graph: onnxruntime, not PyTorch
        return evaluate_onnx(config)
    refuse_exported_graph(config.checkpoint)  # else "--model is required", or torch.load's weights_only advice
    with distributed_session(config.device) as (rank, world, device):
        config, run = use_run_folder(config)
        num_classes = class_count(config.data, config.split)
        model = create_for_checkpoint(
            config.model, config.checkpoint, config.img_size, num_classes=num_classes, **config.model_kwargs
        )
        weights = load_and_convert(model, config.checkpoint, config.convert, config.ema)
        if rank == 0:
            source = f" from {run}/args.yaml" if run is not None else ""
            print(f"{config.model}{source}: {weights} weights of {config.checkpoint or 'no checkpoint'}")
            note = other_size_note(run or config.checkpoint, config.img_size)
            if note:
                print(note, file=sys.stderr)
        data_config = resolve_data_config({"img_size": config.img_size, "crop_pct": config.crop_pct}, model=model)
        dataset = open_split(config.data, config.split, create_transform(**data_config, is_training=False))
        model.to(device)
        loader = eval_loader(dataset, config.batch_size, config.workers, rank, world)
        progress = rank == 0 and config.progress
        metrics = evaluate_classification(
            compile_model(model, config.compile), loader, device, config.amp, progress=progress
        )
        metrics.update(
            model=config.model, checkpoint=config.checkpoint, weights=weights, split=config.split, data=str(config.data)
        )
        if rank == 0:
            _report(metrics, config.json)
        return metrics


def evaluate_onnx(config) -> dict:
    """`linvit eval --checkpoint FILE.onnx`: top-1 / top-5 / loss of the exported classifier in onnxruntime
    (CPU), with the preprocessing stored in the file; config is linvit.evaluate.EvalConfig."""
    from .onnx_runtime import OnnxClassifier, refuse_pytorch_flags

    refuse_pytorch_flags(config, **{"--convert": config.convert is not None, "--ema": config.ema is not None})
    model = OnnxClassifier(config.checkpoint)
    classes = class_count(config.data, config.split)
    if classes != model.num_classes:
        raise UsageError(f"{config.checkpoint} has {model.num_classes} classes; {config.data} has {classes}")
    data_config = model.data_config(config.img_size, config.crop_pct)
    dataset = open_split(config.data, config.split, create_transform(**data_config, is_training=False))
    loader = eval_loader(dataset, config.batch_size, config.workers, 0, 1)
    metrics = evaluate_classification(model, loader, torch.device("cpu"), progress=config.progress)
    metrics.update(
        model=model.meta.get("model"), checkpoint=str(config.checkpoint), runtime="onnxruntime", split=config.split
    )
    metrics.update(data=str(config.data), input_size=list(data_config["input_size"]))
    print(f"{config.checkpoint}: onnxruntime CPU, {model.meta.get('model')} at {data_config['input_size'][1:]}")
    _report(metrics, config.json)
    return metrics


def _report(metrics: dict, json_path: str | None) -> None:
    print(
        f"top1 {metrics['top1']:.2f}  top5 {metrics['top5']:.2f}  loss {metrics['loss']:.4f}  "
        f"({metrics['images']} images, {metrics['skipped']} skipped)"
    )
    if json_path:
        write_json(json_path, metrics)
