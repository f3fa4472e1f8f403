"""--strategy fsdp's `last/`: a torch.distributed.checkpoint folder that every rank writes its shards into, and
that loads at any world size (DCP reshards on load; one process reads it into the plain model).

The model, optimizer and EMA go through torch.distributed.checkpoint.state_dict's get/set_state_dict (keys are
parameter names, so sharded and plain models read each other's); what is the same on every rank (epoch,
scheduler, every rank's RNG, history, args, world size) is one small torch file beside them, written by rank 0.
A new checkpoint is written to `last.tmp/` and renamed over `last/`, so a kill leaves the previous one whole
(as `last.old/` when it comes between the two renames; --resume auto reads it there).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ..distributed import barrier, is_distributed
from ..errors import UsageError

FOLDER = "last"
EXTRA = "linvit.pth"  # the replicated state: epoch, scheduler, rng, history, args, world


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def tensor_state(run) -> dict:
    """The sharded part of a run's state, keyed by parameter names (loaded in place by dcp.load)."""
    model, optimizer = get_state_dict(run.model, run.optimizer)
    state = {"model": model, "optimizer": optimizer}
    if run.ema is not None:
        state["ema"] = get_model_state_dict(run.ema.module)
    return state


def save(run, extra: dict) -> None:
    """Collective: every rank writes its shards to OUT/last.tmp, rank 0 the replicated state, then rank 0 swaps
    it in for OUT/last."""
    folder, tmp = run.output / FOLDER, run.output / (FOLDER + ".tmp")
    if run.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    with _quiet():
        dcp.save(tensor_state(run), checkpoint_id=str(tmp), no_dist=not is_distributed())
    if run.rank == 0:
        torch.save(extra, tmp / EXTRA)
        old = run.output / (FOLDER + ".old")
        shutil.rmtree(old, ignore_errors=True)  # left by a kill between the renames
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    barrier()


def read_extra(path: Path) -> dict:
    """The replicated state of a sharded checkpoint (every rank reads the same file)."""
    try:
        return torch.load(path / EXTRA, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - missing or damaged: one line either way
        raise UsageError(
            f"cannot resume from {path}: not a whole linvit sharded checkpoint (its {EXTRA}: {type(err).__name__}); "
            "delete it to start the run over, or pass --resume with another checkpoint"
        ) from err


def load(run, path: Path) -> None:
    """Every rank reads its shards of the model, optimizer and EMA, resharded to this run's world size; a
    checkpoint of another model (other names or shapes) is one line."""
    state = tensor_state(run)
    try:
        with _quiet():
            dcp.load(state, checkpoint_id=str(path), no_dist=not is_distributed())
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP wraps every rank's error (a BaseException)
        reason = str(err).strip().splitlines()
        raise UsageError(
            f"cannot resume from {path}: its tensors do not fit this model ({_first_cause(reason)}); "
            "resume with the run's own flags (its args.yaml), or train into a new --output"
        ) from err
    set_state_dict(run.model, run.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if run.ema is not None and "ema" in state:
        set_model_state_dict(run.ema.module, state["ema"])


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns on every single-process save and load that it assumes one process: that is what one means."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _first_cause(lines: list[str]) -> str:
    """The line of a DCP error that names the problem (missing key, size mismatch), not its traceback."""
    for line in lines:
        if any(word in line for word in ("Missing key", "Size mismatch", "size mismatch", "Unexpected key")):
            return line.strip()[:200]
    return (lines[-1].strip() if lines else "unreadable")[:200]
