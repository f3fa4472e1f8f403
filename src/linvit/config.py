"""Typed configuration: one dataclass per command, built by the CLI from its flags and stored in run folders.

argparse stops at the command line (linvit_cli.py): it parses the flags, then builds the command's config with
``XConfig.from_mapping(vars(args))``, and the library sees only the dataclass. A run folder's args.yaml is a
config's ``to_dict()``; ``from_mapping`` reads every args.yaml written so far, since it ignores the keys a
config does not know (the parser's dispatch fields, another linvit version's flags) and takes the defaults for
the ones it lacks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

C = TypeVar("C", bound="Config")


@dataclasses.dataclass
class Config:
    """Base of every command's configuration."""

    # fields added after run folders were written, -> the value (as stored) a run without them ran with, so
    # resuming such a run compares like with like (engine.resume)
    ABSENT_MEANS: ClassVar[dict[str, str]] = {}

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls: type[C], values: Mapping[str, Any]) -> C:
        """The config of a parsed command line or a stored args.yaml: known keys only, defaults for the rest."""
        names = cls.field_names()
        return cls(**{k: _plain(v) for k, v in values.items() if k in names})

    @classmethod
    def from_yaml(cls: type[C], path: str | Path) -> C:
        return cls.from_mapping(yaml.safe_load(Path(path).read_text()) or {})

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe values (lists, not tuples; strings, not paths), in field order."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0 and hasattr(value, "dtype"):  # NumPy or 0-d torch
        return value.item()  # np.float64(1e-4) -> 1e-4: YAML cannot represent the scalar types
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def default_workers() -> int:
    """Data-loading processes when none are asked for: one per core, at most 4 (the CLI's --workers default)."""
    return min(4, os.cpu_count() or 1)


@dataclasses.dataclass
class TrainConfig(Config):
    """What every training task shares: where the run goes, the optimisation recipe, the runtime.

    The recipe (linvit.engine.recipe.training_recipe): AdamW (``opt``) through timm, cosine per iteration to
    ``min_lr`` (default lr / 100) after ``warmup_epochs`` from ``warmup_lr`` (default lr / 1000). ``strategy``
    ddp or fsdp and ``grad_checkpointing``: linvit.engine.sharding."""

    data: str | None = None
    output: str | None = None
    epochs: int = 1
    batch_size: int = 64
    lr: float | None = None
    opt: str = "adamw"
    weight_decay: float = 0.05
    warmup_epochs: int = 1
    warmup_lr: float | None = None
    min_lr: float | None = None
    clip_grad: float | None = None
    seed: int = 0
    resume: str | None = None
    workers: int = dataclasses.field(default_factory=default_workers)
    amp: str = "none"
    device: str = "auto"
    compile: str = "off"
    deterministic: bool = False
    progress: bool = True
    log: str = "none"
    strategy: str = "ddp"  # ddp: the whole model on every rank; fsdp: sharded (linvit.engine.sharding)
    grad_checkpointing: bool = False
    shard_size: int | None = None  # fsdp: ranks per shard group (None: all); more groups replicate (HSDP)
