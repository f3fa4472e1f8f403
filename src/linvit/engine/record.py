"""What a run leaves in its output folder: args.yaml (its config), metrics.jsonl vouched for by last.pth, an
optional TensorBoard log, and at the end a model folder (model.safetensors, config.json, README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import torch.nn as nn

from ..config import Config
from ..errors import UsageError
from ..utils.artifacts import CONFIG, save_model_folder, write_model_card
from ..utils.checkpoint import atomic_save, atomic_write_text
from .resume import CHECKPOINT, METRICS

ARGS = "args.yaml"


def write_run_config(output: Path, config: Config) -> None:
    """OUT/args.yaml: the run's config; `linvit <command> --config OUT/args.yaml --output NEW` reruns it
    (into OUT itself it is refused: OUT holds the run)."""
    atomic_write_text(config.to_yaml(), output / ARGS)


def save_epoch(output: Path, state: dict | None, record: dict) -> None:
    """Checkpoint first (None: every rank has just written fsdp's sharded one), then the log line it vouches for."""
    if state is not None:
        atomic_save(state, output / CHECKPOINT)
    with open(output / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def format_record(record: dict) -> str:
    return " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())


def save_final_model(
    output: Path, model: nn.Module, run_info: dict, config: Config, history: list, labels, weights_written=False
) -> None:
    """OUT becomes a model folder: the final weights (unless weights_written: a sharded model's), timm's config.json
    with run_info, the config and the last epoch's metrics under "linvit", and a README.md model card."""
    info = {**run_info, "parameters": sum(p.numel() for p in model.parameters()), "final": history[-1]}
    info["args"] = config.to_dict()
    save_model_folder(output, model, info, labels, weights_written)
    card = json.loads((output / CONFIG).read_text())
    write_model_card(output, card, history, f"linvit {run_info.get('command', 'train')}")


class TensorBoardLog:
    """--log tensorboard: an event file in OUT/tensorboard beside metrics.jsonl (which stays the record)."""

    def __init__(self, output: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise UsageError('--log tensorboard needs tensorboard: pip install -e ".[tensorboard]"') from err
        self.writer = SummaryWriter(log_dir=str(output / "tensorboard"))

    def add(self, record: dict) -> None:
        """The epoch's numbers (the metrics.jsonl line) as scalars at step = epoch."""
        for key, value in record.items():
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, record["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
