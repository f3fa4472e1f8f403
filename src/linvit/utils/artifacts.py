"""Run folders as timm / Hugging Face model folders: config.json, model.safetensors and a README.md model card.

A classification run's folder loads with ``timm.create_model("local-dir:RUN", pretrained=True)`` (after
``import linvit``) and ``linvit eval --checkpoint RUN``, and its pretrained_cfg carries the run's own data config
(input size, crop, mean/std, interpolation), so timm's resolve_model_data_config + create_transform feed the
model what it was trained on. Every run folder, segmentation and detection included, loads with
``linvit.load_run(RUN)``. timm's own ``save_for_hf`` writes the weights and the
config (architecture, model_args, num_classes, label names, data config); linvit adds a ``linvit`` section
(task, model spec, conversion, which weights were saved, the final metrics) that its commands read back.
Models timm did not create (the segmenter) get the same files with the ``linvit`` section only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.nn as nn
from safetensors.torch import save_file
from timm.models import save_for_hf

from ..errors import UsageError
from .checkpoint import atomic_write_text

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CARD = "README.md"


def save_model_folder(output: Path, model: nn.Module, info: dict, label_names: list[str] | None = None) -> None:
    """model.safetensors + config.json (timm's layout when timm built the model, info under "linvit")."""
    output = Path(output)
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and cfg.get("architecture") and hasattr(model, "num_classes"):
        if info.get("data_config"):  # what the run trained and evaluated on, not the architecture's default
            model.pretrained_cfg = {**cfg, **pretrained_data_fields(info["data_config"])}
        model_config = {"linvit": info}
        if label_names:
            model_config["label_names"] = list(label_names)
        save_for_hf(model, output, model_config=model_config, safe_serialization=True)
        return
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(output / WEIGHTS))
    config = {"linvit": info, **({"label_names": list(label_names)} if label_names else {})}
    atomic_write_text(json.dumps(config, indent=2, default=str), output / CONFIG)


def pretrained_data_fields(data_config: dict) -> dict:
    """timm's pretrained_cfg keys for a data config from timm.data.resolve_data_config (tuples kept as tuples)."""
    keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data_config.items() if k in keys}


def read_run_config(path: str | Path) -> tuple[Path, dict] | None:
    """(run folder, its config.json) when path is a linvit run folder or a file inside one, else None; a path
    that does not exist is an error here, so that no caller reports it as "not a run folder"."""
    path = check_exists(path)
    folder = path if path.is_dir() else path.parent
    config = folder / CONFIG
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError as err:
        raise UsageError(f"{config}: not valid JSON ({err})") from err
    return (folder, data) if isinstance(data, dict) and "linvit" in data else None


def check_exists(path: str | Path) -> Path:
    """path as a Path; a one-line error naming it when nothing is there (a typo, or a run not trained yet)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder")
    return path


def run_model_args(path: str | Path) -> dict:
    """The timm model_args a classification run was built with (img_size, num_classes, ...), {} for a file
    outside a run folder or a run timm did not build (segmentation, detection, generation)."""
    found = read_run_config(path)
    return dict(found[1].get("model_args") or {}) if found else {}


def write_model_card(output: Path, config: dict, history: list[dict], command: str) -> None:
    """README.md: what the folder holds, how it was trained, what it scored, how to load it."""
    info = config.get("linvit", {})
    args = info.get("args", {})
    last = history[-1] if history else {}
    metric_rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in last.items() if isinstance(v, float))
    conversion = info.get("convert")
    model_line = f"`{info.get('model')}`" + (f", converted to {conversion} with `linvit.convert`" if conversion else "")
    architecture = config.get("architecture")
    loading = ""
    if architecture:
        loading = "```python\nimport timm\nimport linvit  # registers the models\n\n"
        loading += f'model = timm.create_model("local-dir:{output}", pretrained=True)\n```\n\n'
    kwargs = json.dumps(args.get("model_kwargs", {}))
    card = f"""---
library_name: {"timm" if architecture else "pytorch"}
tags: [linvit, {info.get("task", "image-classification")}]
license: mit
---
# {info.get("model")} ({info.get("task")}), trained with linvit

- model: {model_line}; {info.get("parameters", 0):,} parameters; model kwargs `{kwargs}`
- data: `{args.get("data")}`, {config.get("num_classes", info.get("num_classes"))} classes
- weights in model.safetensors: {info.get("weights", "model")}
- recipe: {args.get("epochs")} epochs, batch {args.get("batch_size")} per process x {info.get("world_size", 1)}, \
lr {info.get("lr", args.get("lr"))}, weight decay {args.get("weight_decay")}; the full arguments are in args.yaml
  (`{command} --config args.yaml` reruns it)

## Final metrics (epoch {last.get("epoch")})

| metric | value |
|---|---|
{metric_rows}

Per-epoch numbers: metrics.jsonl.

## Use

{loading}```bash
linvit {"segment eval" if info.get("task") == "segmentation" else "eval"} --checkpoint {output} --data DATA
```
"""
    atomic_write_text(card, Path(output) / CARD)


# what defines the model in a run's args.yaml: taken from the run when --model is not given
MODEL_ARGS = ("model", "model_kwargs", "convert", "pyramid_channels", "head_channels")
MODEL_ARGS += ("detector", "min_size", "max_size", "anchor_base")  # detection: the detector and its resize
# input settings taken from the run when not given
INPUT_ARGS = ("img_size", "crop_pct")


def use_run_folder(args) -> Path | None:
    """`eval --checkpoint RUN` (or a file in RUN): a folder means its model.safetensors, and without --model the
    model is rebuilt from the run's args.yaml (name, kwargs, conversion, and the input size unless given).
    Returns the run folder, or None when the checkpoint is not in one."""
    if not args.checkpoint:
        if args.model is None:
            raise UsageError("--model is required without --checkpoint")
        return None
    path = check_exists(args.checkpoint)
    if path.is_dir():
        if not (path / WEIGHTS).is_file():
            raise UsageError(f"{path}: no {WEIGHTS} in this folder (a run that has not finished? pass its last.pth)")
        args.checkpoint = str(path / WEIGHTS)
    folder = Path(args.checkpoint).parent
    saved = folder / "args.yaml"
    if not saved.is_file():
        if args.model is None:
            raise UsageError(f"--model is required: {args.checkpoint} is not in a linvit run folder (no args.yaml)")
        return None
    import yaml

    run = yaml.safe_load(saved.read_text()) or {}
    wanted = (MODEL_ARGS if args.model is None else ()) + INPUT_ARGS
    for key in wanted:
        if key in run and hasattr(args, key) and (key in MODEL_ARGS or getattr(args, key) is None):
            setattr(args, key, run[key])
    return folder


def saved_weights_kind(checkpoint: str | Path) -> str | None:
    """ "ema" or "model" for a run's model.safetensors (from its config.json), None when unknown."""
    found = read_run_config(checkpoint)
    if found is None or Path(checkpoint).name != WEIGHTS:
        return None
    return found[1]["linvit"].get("weights")
