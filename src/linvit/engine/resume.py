"""Resume: a training checkpoint's state back into a run, and the rule for which flags may change meanwhile.

A run resumed with other schedule flags (SCHEDULE_FLAGS) follows the new plan's learning rates from its step
on; a change to any other planned flag (model, data, batch, recipe, seed) is refused with one line, since the
checkpoint's weights and optimizer were trained under the old values. Flags that only say how a run executes
(RUNTIME_FLAGS), the starting weights (which the checkpoint replaces) and the settings a task never reads
(Task.unused_settings: distillation's attention stage and its temperature) are free.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from ..distributed import on_every_rank, rank0_decides
from ..errors import UsageError
from ..utils.checkpoint import atomic_write_text
from ..utils.runtime import set_rng_states
from . import sharded_checkpoint as sharded
from .recipe import restore_lr_scales

CHECKPOINT = "last.pth"
METRICS = "metrics.jsonl"

RUNTIME_FLAGS = frozenset(
    {"output", "resume", "progress", "workers", "device", "threads", "debug", "log", "compile", "amp", "deterministic"}
    | {"strategy", "shard_size"}
    | {"grad_checkpointing", "pretrained", "pretrained_file", "backbone_checkpoint"}
)
SCHEDULE_FLAGS = frozenset({"epochs", "lr", "base_lr", "min_lr", "warmup_lr", "warmup_epochs"})
REQUIRED = frozenset({"model", "optimizer", "scheduler", "epoch", "rng"})


def find_resume(output: Path, resume: str | None, sharded_first: bool = False) -> Path | None:
    """No --resume: None (a usage error when OUT already holds a checkpoint); --resume auto: the newer by epoch
    of OUT/last.pth and OUT/last/ (fsdp's sharded folder), the strategy's own kind on a tie (a run that changed
    --strategy leaves the other kind's older checkpoint beside its own), or None; --resume PATH: that file or
    sharded folder (a missing one is a usage error)."""
    if not resume:
        held = [p.name for p in _candidates(output) if _is_checkpoint(p)]
        if held:  # a second run into the folder would overwrite the first one's model and mix their metrics
            raise UsageError(
                f"{output} already holds a run ({held[0]}): --resume auto continues it, or give another --output"
            )
        return None
    if resume == "auto":
        found = [p for p in _candidates(output) if _is_checkpoint(p)]
        return max(found, key=lambda p: (checkpoint_epoch(p), p.is_dir() == sharded_first), default=None)
    path = Path(resume)
    if not _is_checkpoint(path):
        raise UsageError(f"--resume {resume}: checkpoint not found (a last.pth file or an fsdp run's last/ folder)")
    return path


def _candidates(output: Path) -> tuple[Path, Path]:
    """last.pth, and last/ or, when a kill came between the sharded save's two renames, last.old/ (never both: a
    kill while last.old/ is being removed leaves part of it beside a whole last/)."""
    folder = output / sharded.FOLDER
    return output / CHECKPOINT, folder if _is_checkpoint(folder) else output / (sharded.FOLDER + ".old")


def _is_checkpoint(path: Path) -> bool:
    return path.is_file() or sharded.is_sharded_checkpoint(path)


def checkpoint_epoch(path: Path) -> int:
    """A checkpoint's last finished epoch, read without loading its tensors (last.pth is memory-mapped)."""
    return read_checkpoint(path, mmap=True)["epoch"]


def agreed_checkpoint(output: Path, resume: str | None, strategy: str) -> tuple[Path, int, bool] | None:
    """(path, epoch, sharded) of the checkpoint to resume, or None: chosen by rank 0 alone and broadcast, so no
    rank resumes from another checkpoint than the rest because its view of the folder differs."""

    def decide():
        path = find_resume(output, resume, strategy == "fsdp")
        return None if path is None else (path, checkpoint_epoch(path), path.is_dir())

    return rank0_decides(decide)


def read_agreed(path: Path, epoch: int, is_sharded: bool, rank: int) -> dict:
    """The checkpoint rank 0 chose, read on this rank; one line if this rank reads another epoch there."""
    ckpt = read_checkpoint(path, is_sharded)
    if ckpt["epoch"] != epoch:
        raise UsageError(
            f"cannot resume from {path}: rank {rank} reads epoch {ckpt['epoch'] + 1}'s checkpoint there, rank 0 "
            f"epoch {epoch + 1}'s; every rank must see the same --output folder (a shared file system)"
        )
    return ckpt


def stored_value(text: str):
    """A flag's value back from the string a checkpoint stores (dicts and lists compare by content, so a
    rerun from args.yaml, whose --model-kwargs come back sorted, is the same plan); words stay strings."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return list(value) if isinstance(value, tuple) else value


def same_value(saved: str, now: str) -> bool:
    """Whether a stored flag value and this command's are the same: equal values, or one path spelled two ways
    (digits, ./digits, digits/, an absolute path). Decided from the strings alone, never the file system, so
    every rank of a distributed run decides the same."""
    a, b = stored_value(saved), stored_value(now)
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str):
        return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))
    return False


def plan_changes(saved: Mapping[str, str], now: Mapping) -> dict[str, tuple[str, str]]:
    """{flag: (checkpoint's value, this run's)} for the planned flags that differ, in the config's field order (a
    choice before what follows from it: --mixer, then --gamma-init); a flag only one side knows (another linvit
    version) is no change."""
    current = {k: str(v) for k, v in now.items()}
    shared = (saved.keys() & current.keys()) - RUNTIME_FLAGS
    return {k: (saved[k], current[k]) for k in current if k in shared and not same_value(saved[k], current[k])}


def flag_of(field: str, names: Mapping[str, str] | None = None) -> str:
    """The command-line flag of a config field: names' spelling (Task.flag_names), else --field-name."""
    return (names or {}).get(field, f"--{field.replace('_', '-')}")


def describe_changes(changes: dict[str, tuple[str, str]], names: Mapping[str, str] | None = None) -> str:
    return ", ".join(f"{flag_of(k, names)} {_shown(old)} -> {_shown(new)}" for k, (old, new) in changes.items())


def _shown(value: str) -> str:
    return "none" if value == "None" else value  # a field left at None (no --map-lr, --window 0): not Python's word


def check_plan(
    path: Path,
    saved: Mapping[str, str],
    now: Mapping,
    unused: frozenset[str] = frozenset(),
    names: Mapping[str, str] | None = None,
) -> dict[str, tuple[str, str]]:
    """The schedule flags that changed since the checkpoint; any other changed planned flag is a usage error,
    but for the ones the run never reads (unused)."""
    changes = {k: v for k, v in plan_changes(saved, now).items() if k not in unused}
    fixed = {k: v for k, v in changes.items() if k not in SCHEDULE_FLAGS}
    if fixed:
        raise UsageError(
            f"cannot resume from {path} with {describe_changes(fixed, names)}: its state was trained with the old "
            "values; resume with them (its args.yaml), or train into a new --output"
        )
    return changes


def read_checkpoint(path: Path, is_sharded: bool | None = None, mmap: bool = False) -> dict:
    """A training checkpoint's contents (a sharded folder's replicated part: no model or optimizer; mmap: a
    last.pth's tensors left on disk); a damaged or foreign file is a usage error that says what to do."""
    if path.is_dir() if is_sharded is None else is_sharded:
        ckpt = sharded.read_extra(path)
        missing = REQUIRED - {"model", "optimizer"} - set(ckpt)
        if missing:
            raise UsageError(f"cannot resume from {path}: not a linvit training checkpoint (no {sorted(missing)})")
        return ckpt
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        missing = REQUIRED - set(ckpt)
    except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign files all end here
        raise UsageError(
            f"cannot resume from {path}: the file is damaged or not a linvit checkpoint ({type(err).__name__}); "
            f"delete it to start the run over, or pass --resume with another checkpoint"
        ) from err
    if missing:
        raise UsageError(f"cannot resume from {path}: not a linvit training checkpoint (no {sorted(missing)})")
    return ckpt


def resume_run(
    run, unused: frozenset[str] = frozenset(), names: Mapping[str, str] | None = None
) -> tuple[int, list[dict]]:
    """Restore a Run's state from the checkpoint its --resume finds; returns (start epoch, history).

    A run whose schedule flags differ from the checkpoint's keeps the scheduler built from its own config, so
    it continues on the new plan's learning rates (train_pass sets each epoch's from its step count); timm's
    load_state_dict would bring back the old plan's length, warm-up and minimum. metrics.jsonl is rewritten
    from the checkpoint's history, so the log never holds an epoch the checkpoint does not.
    """
    choice = agreed_checkpoint(run.output, run.config.resume, run.config.strategy)
    if choice is None:
        return 0, []
    path, epoch, is_sharded = choice
    ckpt = on_every_rank(lambda: read_agreed(path, epoch, is_sharded, run.rank))
    saved = {**run.config.ABSENT_MEANS, **(ckpt.get("args") or {})}
    kept_global, world_line = world_change(saved, ckpt.get("world"), run.config.batch_size, run.world)
    new_schedule = check_plan(path, saved, run.config.to_dict(), unused | kept_global, names)
    scales = [group.get("lr_scale") for group in run.optimizer.param_groups]  # this config's (recipe.lr_scales)
    load_weights(run, path, ckpt, is_sharded)
    restore_lr_scales(run.optimizer, scales)  # the loaded groups bring the saved factors (another base lr: stale)
    if not new_schedule:
        run.scheduler.load_state_dict(ckpt["scheduler"])
    if run.scaler is not None and ckpt.get("scaler") is not None:
        run.scaler.load_state_dict(ckpt["scaler"])
    rngs = ckpt["rng"]
    set_rng_states(rngs[min(run.rank, len(rngs) - 1)] if isinstance(rngs, list) else rngs)
    history = list(ckpt.get("history", []))
    if run.rank == 0:
        atomic_write_text("".join(json.dumps(h) + "\n" for h in history), run.output / METRICS)
        print(f"resumed from {path} at epoch {ckpt['epoch'] + 1}")
        if ckpt["epoch"] + 1 == run.config.epochs:  # past the plan's end: left as it was, or refused (fit.build_run)
            epochs = run.config.epochs
            longer = flag_of("epochs", names)
            print(f"nothing left to train: the run has its {_epochs(epochs)} (a longer {longer} continues it)")
        for line in (world_line, strategy_change(saved, is_sharded, run.config.strategy)):
            if line:
                print(line)
        if new_schedule and ckpt["epoch"] + 1 < run.config.epochs:  # a finished run's new plan trains nothing
            changes = describe_changes(new_schedule, names)
            print(f"new schedule ({changes}): the learning rate follows it from this epoch on")
    return ckpt["epoch"] + 1, history


def refuse_a_shorter_plan(output: Path, trained: int, epochs: int, finished: bool, names=None) -> None:
    """A checkpoint past the plan's end, whose folder does not yet hold its final model, cannot become that
    plan's run: it would be recorded as an `epochs`-epoch run (args.yaml, the card) holding a longer one's model.
    A finished run is left as it was whatever the plan (engine.fit.already_finished): a two-stage distill's
    args.yaml keeps the shorter transfer its end-to-end model came from."""
    if trained > epochs and not finished:
        flag = flag_of("epochs", names)
        raise UsageError(
            f"{output} has trained {_epochs(trained)}, more than {flag} {epochs}: a run cannot be shortened below "
            f"what it trained; give {flag} {trained} or more to go on, or a new --output for a shorter run"
        )


def _epochs(count: int) -> str:
    return f"{count} epoch" + ("" if count == 1 else "s")


def load_weights(run, path: Path, ckpt: dict, is_sharded: bool) -> None:
    """Model, optimizer and EMA from last.pth, or from a sharded folder at any world size; a model sharded over
    several processes takes only the latter."""
    from ..weights import check_num_classes
    from .sharding import is_sharded as sharded_model

    if is_sharded:
        sharded.load(run, path)
        return
    if sharded_model(run.model):
        raise UsageError(
            f"cannot resume from {path} with --strategy fsdp on {run.world} processes: the newest checkpoint "
            f"(epoch {ckpt['epoch'] + 1}) is ddp's; resume it with --strategy ddp, or with fsdp on one process"
        )
    check_num_classes(run.model, ckpt["model"], path)
    run.model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    if run.ema is not None and ckpt.get("ema") is not None:
        run.ema.load_state_dict(ckpt["ema"])


def strategy_change(saved: Mapping[str, str], is_sharded: bool, strategy: str) -> str | None:
    """The one line a resume under another --strategy prints: the checkpoint it wrote beside the old one."""
    old = saved.get("strategy", "fsdp" if is_sharded else "ddp")
    if old == strategy:
        return None
    kind = f"{sharded.FOLDER}/" if strategy == "fsdp" else CHECKPOINT
    return f"strategy {old} -> {strategy}: checkpoints from now on are {kind} (--resume auto takes the newer by epoch)"


def world_change(saved: Mapping[str, str], saved_world, batch_size: int, world: int) -> tuple[frozenset, str | None]:
    """(the flags a new world size may change, the one line that says it): a resume at another world size keeps
    the global batch if --batch-size changes with it (then --batch-size may change), else says what changes."""
    if saved_world is None or saved_world == world:
        return frozenset(), None
    old_batch = stored_value(saved.get("batch_size", str(batch_size)))
    old, new = old_batch * saved_world, batch_size * world
    head = f"world size {saved_world} -> {world}: global batch {old}"
    if old == new:
        return frozenset({"batch_size"}), f"{head} kept ({old_batch} -> {batch_size} per process)"
    return frozenset(), f"{head} -> {new} (steps per epoch and any batch-scaled learning rate follow it)"


def extra_state(run, epoch: int, rngs: list, history: list) -> dict:
    """The part of the training state that is the same on every rank (all of it but the tensors)."""
    return {
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler is not None else None,
        "epoch": epoch,
        "rng": rngs,
        "history": history,
        "args": {k: str(v) for k, v in run.config.to_dict().items()},
        "world": run.world,
    }


def training_state(run, epoch: int, rngs: list, history: list) -> dict:
    """What last.pth holds: every piece of state resume_run restores, and the config it was trained under."""
    return {
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else None,
        **extra_state(run, epoch, rngs, history),
    }
