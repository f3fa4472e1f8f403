"""Run folders as timm / Hugging Face model folders: config.json, model.safetensors and a README.md model card.

A classification run's folder loads with ``timm.create_model("local-dir:RUN", pretrained=True)`` (after
``import linvit``) and ``linvit eval --checkpoint RUN``, and its pretrained_cfg carries the run's own data config
(input size, crop, mean/std, interpolation), so timm's resolve_model_data_config + create_transform feed the
model what it was trained on. Every run folder, segmentation and detection included, loads with
``linvit.load_run(RUN)``. The weights are written one tensor at a time (write_safetensors: no copy of the whole
state; a sharded model's gathered tensor by tensor), timm's own ``save_config_for_hf`` writes the
config (architecture, model_args, num_classes, label names, data config); linvit adds a ``linvit`` section
(task, model spec, conversion, which weights were saved, the final metrics) that its commands read back.
Models timm did not create (the segmenter) get the same files with the ``linvit`` section only. This module
writes run folders; linvit.weights reads them back.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import struct
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
from timm.models._hub import save_config_for_hf

from .checkpoint import atomic_write_text

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CARD = "README.md"
SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    path: Path | None, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]], fetch: Callable[[str], torch.Tensor]
) -> None:
    """safetensors' format written one tensor at a time, so no copy of the whole state is ever held (safetensors'
    save_file serialises it all first): the header from layout ({name: (dtype, shape)}), then fetch(name)'s bytes,
    larger elements first so that every tensor stays aligned. fetch is called for every name in the same order on
    every caller; path None writes nothing (a rank that only helps gather a sharded model's tensors)."""
    order = sorted(layout, key=lambda k: (-layout[k][0].itemsize, k))
    header, offset = {}, 0
    for key in order:
        dtype, shape = layout[key]
        size = math.prod(shape) * dtype.itemsize
        header[key] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape)}
        header[key]["data_offsets"] = [offset, offset + size]
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    tmp = None if path is None else Path(path).with_name(Path(path).name + ".tmp")
    with open(tmp, "wb") if tmp is not None else open(os.devnull, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for key in order:
            tensor = fetch(key)
            if tmp is not None:
                if (tensor.dtype, tuple(tensor.shape)) != layout[key]:
                    raise RuntimeError(f"{key}: {tensor.dtype} {tuple(tensor.shape)}, its header says {layout[key]}")
                out.write(memoryview(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
            del tensor
    if tmp is not None:
        os.replace(tmp, path)


def layout_of(state: dict) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """{name: (dtype, shape)} of a state dict (a sharded one's DTensors report their full shape)."""
    return {key: (value.dtype, tuple(value.shape)) for key, value in state.items()}


def save_model_folder(
    output: Path, model: nn.Module, info: dict, label_names: list[str] | None = None, weights_written: bool = False
) -> None:
    """model.safetensors + config.json (timm's layout when timm built the model, info under "linvit");
    weights_written: the caller wrote model.safetensors (a sharded model's, gathered tensor by tensor)."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    if not weights_written:
        state = model.state_dict()
        write_safetensors(output / WEIGHTS, layout_of(state), state.__getitem__)
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and cfg.get("architecture") and hasattr(model, "num_classes"):
        if info.get("data_config"):  # what the run trained and evaluated on, not the architecture's default
            model.pretrained_cfg = {**cfg, **pretrained_data_fields(info["data_config"])}
        model_config = {"linvit": info}
        if label_names:
            model_config["label_names"] = list(label_names)
        save_config_for_hf(model, output / CONFIG, model_config=model_config)  # save_for_hf's config, weights above
        return
    config = {"linvit": info, **({"label_names": list(label_names)} if label_names else {})}
    atomic_write_text(json.dumps(config, indent=2, default=str), output / CONFIG)


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
    if info.get("teacher"):  # distillation: the folder holds the student
        model_line = f"a `{info.get('mixer')}` student of `{info['teacher']}`"
    classes = config.get("num_classes", info.get("num_classes"))
    kwargs = json.dumps(args.get("model_kwargs", {}))
    card = f"""---
library_name: {"timm" if config.get("architecture") else "pytorch"}
tags: [linvit, {info.get("task", "image-classification")}]
license: mit
---
# {_card_title(info)} ({info.get("task")}), trained with linvit

- model: {model_line}; {info.get("parameters", 0):,} parameters; model kwargs `{kwargs}`
- data: `{args.get("data")}`{"" if classes is None else f", {classes} classes"}
- weights in model.safetensors: {info.get("weights", "model")}
- recipe: {args.get("epochs")} epochs, batch {args.get("batch_size")} per process x {info.get("world_size", 1)}, \
lr {info.get("lr", args.get("lr"))}, weight decay {args.get("weight_decay")}; the full arguments are in args.yaml
  ({_rerun_line(info, args, command)})

## Final metrics (epoch {last.get("epoch")})

| metric | value |
|---|---|
{metric_rows}

Per-epoch numbers: metrics.jsonl.

## Use

{_use_section(info, config, output)}"""
    atomic_write_text(card, Path(output) / CARD)


def _card_title(info: dict) -> str:
    return f"{info['mixer']} student of {info['teacher']}" if info.get("teacher") else str(info.get("model"))


def _rerun_line(info: dict, args: dict, command: str) -> str:
    """How to train the folder again, from where the run was started (args.yaml's relative paths, the data's and
    the output's, are that folder's): a stage of a two-stage distillation is rerun through its whole run."""
    out = Path(str(args.get("output") or "."))
    if info.get("stage") == "attention" and args.get("stages") != "attention":
        config = shlex.quote(str(out.parent / "args.yaml"))
        return (
            f"the first stage of the run in the folder above: `{command} --config {config} --output NEW`, from the "
            "folder the run was started in, reruns it"
        )
    config = shlex.quote(str(out / "args.yaml"))
    return f"`{command} --config {config} --output NEW`, from the folder the run was started in, reruns it"


def _use_section(info: dict, config: dict, output: Path) -> str:
    """Loading code: timm's for a timm model, linvit.load_run for a language student; then the eval command."""
    if info.get("language"):
        return f'```python\nimport linvit\n\nmodel = linvit.load_run("{output}")  # a transformers model\n```\n'
    loading = ""
    if config.get("architecture"):
        loading = "```python\nimport timm\nimport linvit  # registers the models\n\n"
        loading += f'model = timm.create_model("local-dir:{output}", pretrained=True)\n```\n\n'
    evaluate = EVAL_COMMANDS.get(info.get("task"), "eval --checkpoint {output} --data DATA").format(output=output)
    return f"{loading}```bash\nlinvit {evaluate}\n```\n"


# the command that scores or uses a task's run folder (classification and distilled image students: linvit eval)
EVAL_COMMANDS = {
    "segmentation": "segment eval --checkpoint {output} --data DATA",
    "detection": "detect eval --checkpoint {output} --data DATA --output EVAL",
    "generation": "generate sample --checkpoint {output} --output SAMPLES",
}
