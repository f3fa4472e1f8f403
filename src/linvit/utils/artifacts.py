"""Run folders as timm / Hugging Face model folders: config.json, model.safetensors and a README.md model card.

A classification run's folder loads with ``timm.create_model("local-dir:RUN", pretrained=True)`` (after
``import linvit``) and ``linvit eval --checkpoint RUN``, and its pretrained_cfg carries the run's own data config
(input size, crop, mean/std, interpolation), so timm's resolve_model_data_config + create_transform feed the
model what it was trained on. Every run folder, segmentation and detection included, loads with
``linvit.load_run(RUN)``. timm's own ``save_for_hf`` writes the weights and the
config (architecture, model_args, num_classes, label names, data config); linvit adds a ``linvit`` section
(task, model spec, conversion, which weights were saved, the final metrics) that its commands read back.
Models timm did not create (the segmenter) get the same files with the ``linvit`` section only. This module
writes run folders; linvit.weights reads them back.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch.nn as nn
from safetensors.torch import save_file
from timm.models import save_for_hf
from timm.models._hub import save_config_for_hf

from .checkpoint import atomic_write_text

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CARD = "README.md"


def save_model_folder(
    output: Path, model: nn.Module, info: dict, label_names: list[str] | None = None, state: dict | None = None
) -> None:
    """model.safetensors + config.json (timm's layout when timm built the model, info under "linvit"); state: the
    weights to write instead of model.state_dict() (a sharded model's, gathered by the caller)."""
    output = Path(output)
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and cfg.get("architecture") and hasattr(model, "num_classes"):
        if info.get("data_config"):  # what the run trained and evaluated on, not the architecture's default
            model.pretrained_cfg = {**cfg, **pretrained_data_fields(info["data_config"])}
        model_config = {"linvit": info}
        if label_names:
            model_config["label_names"] = list(label_names)
        if state is None:
            save_for_hf(model, output, model_config=model_config, safe_serialization=True)
        else:  # timm's two steps, with the gathered weights
            save_file(_unshared(state), str(output / WEIGHTS))
            save_config_for_hf(model, output / CONFIG, model_config=model_config)
        return
    save_file(_unshared(model.state_dict() if state is None else state), str(output / WEIGHTS))
    config = {"linvit": info, **({"label_names": list(label_names)} if label_names else {})}
    atomic_write_text(json.dumps(config, indent=2, default=str), output / CONFIG)


def _unshared(state: dict) -> dict:
    """Contiguous tensors, a copy of each that shares memory with an earlier one (tied weights, such as a
    language model's embeddings and output layer), which safetensors refuses to write twice."""
    seen, out = set(), {}
    for key, value in state.items():
        value = value.contiguous()
        pointer = value.untyped_storage().data_ptr()
        out[key] = value.clone() if pointer in seen else value
        seen.add(pointer)
    return out


def pretrained_data_fields(data_config: dict) -> dict:
    """timm's pretrained_cfg keys for a data config from timm.data.resolve_data_config (tuples kept as tuples)."""
    keys = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data_config.items() if k in keys}


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
