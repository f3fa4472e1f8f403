"""The training skeleton the tasks share: resume, the epoch loop, checkpoints, the final weights.

Each task (classification in train.py, segmentation and detection in their engines) builds its model, data, loss
and evaluation; train_pass runs the steps of an epoch for all of them, and run_epochs takes one function that
trains an epoch and one that evaluates; everything around them (replayable seeds, DDP, the metrics line, atomic
checkpoints, resume) lives here once.
"""

from __future__ import annotations

import ast
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import yaml
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from .distributed import all_reduce_sum, all_reduce_tensor, barrier
from .errors import UsageError
from .evaluate import check_num_classes
from .utils.artifacts import CONFIG, save_model_folder, write_model_card
from .utils.checkpoint import atomic_save, atomic_write_text
from .utils.runtime import rng_states, seed_everything, set_rng_states

CHECKPOINT = "last.pth"
METRICS = "metrics.jsonl"
ARGS = "args.yaml"


def find_resume(output: Path, resume: str | None) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        path = output / CHECKPOINT
        return path if path.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise UsageError(f"--resume {resume}: checkpoint not found")
    return path


# flags that say how a run executes, not what it trains, and flags for the starting weights, which the checkpoint
# replaces: free to differ when it resumes
RUNTIME_FLAGS = frozenset(
    {"output", "resume", "progress", "workers", "device", "threads", "debug", "log", "compile", "amp", "deterministic"}
    | {"grad_checkpointing", "pretrained", "pretrained_file", "backbone_checkpoint"}
)
# the learning-rate plan: a run resumed with other values follows the schedule they give from its step on
SCHEDULE_FLAGS = frozenset({"epochs", "lr", "base_lr", "min_lr", "warmup_lr", "warmup_epochs"})
# the parser's dispatch fields and --config: not part of any plan
DISPATCH_FIELDS = frozenset({"func", "command", "segment_command", "detect_command", "generate_command", "config"})


def stored_value(text: str):
    """A flag's value back from the string a checkpoint stores (dicts and lists compare by content, so a
    rerun from args.yaml, whose --model-kwargs come back sorted, is the same plan); words stay strings."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return list(value) if isinstance(value, tuple) else value


def plan_changes(saved: dict, args) -> dict[str, tuple[str, str]]:
    """{flag: (checkpoint's value, this command's)} for the planned flags that differ; a flag only one side
    knows (another linvit version) is no change."""
    now = {k: str(v) for k, v in vars(args).items()}
    shared = (saved.keys() & now.keys()) - RUNTIME_FLAGS - DISPATCH_FIELDS
    return {k: (saved[k], now[k]) for k in sorted(shared) if not same_value(saved[k], now[k])}


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


def describe_changes(changes: dict[str, tuple[str, str]]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {old} -> {new}" for k, (old, new) in changes.items())


def check_plan(path: Path, saved: dict, args) -> dict[str, tuple[str, str]]:
    """The schedule flags that changed since the checkpoint; any other planned flag that changed (model, data,
    batch, recipe, seed) is a usage error, since the checkpoint's weights and optimizer were trained under it."""
    changes = plan_changes(saved, args)
    fixed = {k: v for k, v in changes.items() if k not in SCHEDULE_FLAGS}
    if fixed:
        raise UsageError(
            f"cannot resume from {path} with {describe_changes(fixed)}: its state was trained with the old "
            "values; resume with them (its args.yaml), or train into a new --output"
        )
    return changes


def resume_run(output: Path, args, model, optimizer, scheduler, ema, scaler, rank: int):
    """Restore everything from a checkpoint (if args.resume finds one); returns (start epoch, history).

    A command whose schedule flags (SCHEDULE_FLAGS) differ from the checkpoint's keeps the scheduler built
    from its own arguments, so the run continues on the new plan's learning rates (train_pass sets each
    epoch's from its step count); timm's load_state_dict would bring back the old plan's length, warm-up
    and minimum. Other changed flags are refused (check_plan). metrics.jsonl is rewritten from the
    checkpoint's history, so the log never holds an epoch the checkpoint does not (an epoch interrupted after
    its log line but before its checkpoint).
    """
    path = find_resume(output, args.resume)
    if path is None:
        return 0, []
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        missing = {"model", "optimizer", "scheduler", "epoch", "rng"} - set(ckpt)
    except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign files all end here
        raise UsageError(
            f"cannot resume from {path}: the file is damaged or not a linvit checkpoint ({type(err).__name__}); "
            f"delete it to start the run over, or pass --resume with another checkpoint"
        ) from err
    if missing:
        raise UsageError(f"cannot resume from {path}: not a linvit training checkpoint (no {sorted(missing)})")
    new_schedule = check_plan(path, ckpt.get("args") or {}, args)
    check_num_classes(model, ckpt["model"], path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if not new_schedule:
        scheduler.load_state_dict(ckpt["scheduler"])
    if ema is not None and ckpt.get("ema") is not None:
        ema.load_state_dict(ckpt["ema"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    set_rng_states(ckpt["rng"][min(rank, len(ckpt["rng"]) - 1)] if isinstance(ckpt["rng"], list) else ckpt["rng"])
    history = list(ckpt.get("history", []))
    if rank == 0:
        atomic_write_text("".join(json.dumps(h) + "\n" for h in history), output / METRICS)
        print(f"resumed from {path} at epoch {ckpt['epoch'] + 1}")
        if new_schedule:
            print(f"new schedule ({describe_changes(new_schedule)}): the learning rate follows it from this epoch on")
    return ckpt["epoch"] + 1, history


def training_state(model, optimizer, scheduler, ema, scaler, epoch: int, rngs: list, history: list, args) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "epoch": epoch,
        "rng": rngs,
        "history": history,
        "args": {k: str(v) for k, v in vars(args).items()},
    }


def save_epoch(output: Path, state: dict, record: dict) -> None:
    """Checkpoint first, then the log line it vouches for."""
    atomic_save(state, output / CHECKPOINT)
    with open(output / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer, scaler, clip_grad: float | None) -> torch.Tensor:
    """Backward (scaled for fp16), optional gradient clipping, one optimizer step.

    Returns the global L2 norm of the (unscaled) gradients before clipping, on the device (no host sync): the
    training-health number the epoch records."""
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=loss.device)
    if clip_grad:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), clip_grad, norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm.detach()


def training_recipe(model: nn.Module, args, updates_per_epoch: int, device: torch.device, lr: float | None = None):
    """(optimizer, scheduler, scaler) of every task: args.opt (default AdamW) through timm (no decay on norms,
    biases, position embeddings, InfSA discounts), cosine per iteration to args.min_lr (default lr/100) after a
    warm-up from args.warmup_lr (default lr/1000), fp16 gradient scaling. lr defaults to args.lr."""
    lr = args.lr if lr is None else lr
    optimizer = create_optimizer_v2(model, opt=getattr(args, "opt", "adamw"), lr=lr, weight_decay=args.weight_decay)
    warmup_lr, min_lr = getattr(args, "warmup_lr", None), getattr(args, "min_lr", None)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=args.epochs,
        warmup_epochs=args.warmup_epochs,
        warmup_lr=lr * 1e-3 if warmup_lr is None else warmup_lr,
        min_lr=lr * 1e-2 if min_lr is None else min_lr,
        step_on_epochs=False,
        updates_per_epoch=updates_per_epoch,
    )
    scaler = torch.amp.GradScaler(device.type) if args.amp == "fp16" else None
    return optimizer, scheduler, scaler


# steps between the collective finiteness checks (and progress-bar updates): the only host syncs of an epoch
CHECK_EVERY = 50


def train_pass(
    net: nn.Module,
    loader,
    batch_loss: Callable[[object], tuple[torch.Tensor, int]],
    optimizer,
    scheduler,
    scaler,
    epoch: int,
    args,
    device: torch.device,
    rank: int,
    after_step: Callable[[int], None] | None = None,
) -> dict:
    """One epoch of any task: batch_loss(batch) -> (loss, images); the optimizer step, the per-iteration
    schedule, after_step(global step) (EMA), a progress bar and the epoch's numbers (summed over ranks), with
    the mean and largest gradient norm before clipping (equal on every rank: DDP's gradients are all-reduced)
    and the steps whose gradients were not finite (fp16 steps the scaler skipped).

    The running loss stays on the device: the host waits only every CHECK_EVERY steps, where every rank
    takes part in one all-reduce of the non-finite count and all of them stop together (a loss that is NaN on
    one rank only no longer leaves the others waiting in the next gradient all-reduce).
    """
    net.train()
    updates = len(loader)
    loss_sum = torch.zeros((), device=device)
    nonfinite = torch.zeros((), device=device)
    grad_norms = GradNormStats(device)
    dead = DeadHeadStats(net)
    seen = 0
    start = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", disable=rank != 0 or not args.progress)
    if epoch:  # the lr of the step count, not the optimizer's: a resumed run's plan may have changed since
        scheduler.step_update(num_updates=epoch * updates)
    for step, batch in enumerate(bar):
        loss, images = batch_loss(batch)
        grad_norms.add(optimizer_step(loss, net, optimizer, scaler, args.clip_grad))
        scheduler.step_update(num_updates=epoch * updates + step + 1)
        if after_step is not None:
            after_step(epoch * updates + step)
        loss = loss.detach().float()
        nonfinite += ~torch.isfinite(loss)
        loss_sum += loss * images
        seen += images
        if (step + 1) % CHECK_EVERY == 0 or step + 1 == updates:
            stop_if_not_finite(nonfinite, epoch, step)
            bar.set_postfix(loss=f"{loss_sum.item() / max(seen, 1):.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
    seconds = time.perf_counter() - start
    norms = grad_norms.values()
    dead_counts = dead.values(device)  # per head: images with all-zero scores (and the layers' image counts)
    local_loss, *values = torch.cat([loss_sum.reshape(1), norms, dead_counts]).tolist()  # one host sync
    norm_values, dead_values = values[: norms.numel()], values[norms.numel() :]
    loss_total, seen, *dead_values = all_reduce_sum([local_loss, seen, *dead_values], device)  # one collective
    scheduler.step(epoch + 1)
    return {
        "train_loss": loss_total / max(seen, 1),
        "lr": optimizer.param_groups[0]["lr"],
        "epoch_seconds": seconds,
        "images_per_second": seen / seconds if seconds > 0 else None,
        **GradNormStats.record(norm_values),
        **dead.record(dead_values),
    }


DEAD_HEAD = 0.99  # a head counts as dead in an epoch when its scores are all zero for at least this share of images


class DeadHeadStats:
    """The InfSA layers' dead-head counts over one training epoch, kept on the device by the layers themselves.

    Every InfSA layer (an attribute ``record_dead``) adds, per head, the images whose scores were all zero
    (Linear-InfSA: importance; pure: the ReLU scores; Katz with ReLU features: either side's features) to a
    device tensor in its forward (layers.infsa_attention._InfSABase.note_dead); the epoch's single host sync
    reads them with the loss. metrics.jsonl gets ``dead_share`` (dead (image, head) pairs over all layers) and
    ``dead_heads`` (heads dead for >= DEAD_HEAD of the epoch's images); families without InfSA get neither.
    """

    def __init__(self, net: nn.Module):
        self.layers = [m for m in net.modules() if hasattr(m, "record_dead")]
        for layer in self.layers:
            device = layer.theta.device
            if layer.dead_counts is None or layer.dead_counts.device != device:
                layer.dead_counts = torch.zeros(layer.num_heads + 1, device=device)
            layer.dead_counts.zero_()  # in place: the tensor a compiled graph holds stays the same
            layer.record_dead = True

    def values(self, device: torch.device) -> torch.Tensor:
        """Per layer: its H dead counts then its image count, concatenated (empty without InfSA); recording off."""
        for layer in self.layers:
            layer.record_dead = False
        parts = [layer.dead_counts.to(device) for layer in self.layers]
        return torch.cat(parts) if parts else torch.zeros(0, device=device)

    def record(self, values: list[float]) -> dict:
        if not self.layers:
            return {}
        pairs = dead_pairs = dead_heads = 0.0
        offset = 0
        for layer in self.layers:
            counts, images = values[offset : offset + layer.num_heads], values[offset + layer.num_heads]
            offset += layer.num_heads + 1
            pairs += images * layer.num_heads
            dead_pairs += sum(counts)
            dead_heads += sum(images > 0 and c >= DEAD_HEAD * images for c in counts)
        return {"dead_share": dead_pairs / pairs if pairs else None, "dead_heads": int(dead_heads)}


class GradNormStats:
    """Per-step gradient norms summed on the device: mean and max over the finite ones, count of the others."""

    def __init__(self, device: torch.device):
        self.total = torch.zeros((), device=device)
        self.largest = torch.zeros((), device=device)
        self.finite = torch.zeros((), device=device)
        self.nonfinite = torch.zeros((), device=device)

    def add(self, norm: torch.Tensor) -> None:
        norm = norm.float()
        finite = torch.isfinite(norm)
        kept = torch.where(finite, norm, torch.zeros_like(norm))
        self.total += kept
        self.largest = torch.maximum(self.largest, kept)
        self.finite += finite
        self.nonfinite += ~finite

    def values(self) -> torch.Tensor:
        return torch.stack([self.total, self.largest, self.finite, self.nonfinite])

    @staticmethod
    def record(values: list[float]) -> dict:
        total, largest, finite, nonfinite = values
        return {
            "grad_norm": total / finite if finite else None,
            "grad_norm_max": largest if finite else None,
            "nonfinite_grad_steps": int(nonfinite),
        }


def stop_if_not_finite(nonfinite: torch.Tensor, epoch: int, step: int) -> None:
    """Collective: every rank calls it at the same step and raises if any rank saw a non-finite loss."""
    count = int(all_reduce_tensor(nonfinite.clone()).item())
    if count:
        raise FloatingPointError(
            f"{count} non-finite loss value(s) by epoch {epoch} step {step} (checked every {CHECK_EVERY} steps "
            "on all ranks); stopping. Try a lower --lr, --clip-grad, or --amp none"
        )


def gather_rng(world: int) -> list[dict]:
    """Every rank's RNG states (rank order) for the checkpoint; a single process has one entry."""
    states = rng_states()
    if world == 1:
        return [states]
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, states)
    return gathered


def train_loader(train_set, args, rank: int, world: int, collate_fn=None, pin_memory: bool = False):
    """(sampler, loader): this rank's shuffled shard of the training set (seeded by args.seed; the sampler's
    set_epoch reshuffles) in full batches, since DDP needs the same step count on every rank. A set smaller
    than one global batch is a usage error."""
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        drop_last=True,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
    )
    if len(loader) == 0:
        raise UsageError(f"{len(train_set)} training images are fewer than one batch of {args.batch_size} x {world}")
    return sampler, loader


def wrap_ddp(model: nn.Module, world: int, device: torch.device) -> nn.Module:
    """DistributedDataParallel around model when torchrun started more than one process."""
    if world == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def write_run_config(output: Path, args) -> None:
    """OUT/args.yaml: the command's effective arguments; `linvit <command> --config OUT/args.yaml` reruns it."""
    atomic_write_text(args_yaml(args), output / ARGS)


def run_epochs(
    args,
    output: Path,
    rank: int,
    world: int,
    start_epoch: int,
    history: list[dict],
    sampler,
    train_epoch: Callable[[int], dict],
    evaluate_epoch: Callable[[int], dict],
    state: Callable[[int, list, list], dict],
    final_model: Callable[[], nn.Module],
    run_info: dict,
    label_names: list[str] | None = None,
) -> list[dict]:
    """The epoch loop: per epoch a replayable seed, the task's training pass and evaluation (each returns
    the numbers it adds to the epoch's record), one metrics line vouched for by an atomic checkpoint
    (state(epoch, rngs, history)); after the last epoch, OUT becomes a model folder: final_model()'s weights
    (model.safetensors), config.json (timm's, with run_info and the final metrics under "linvit") and a
    README.md model card (linvit.utils.artifacts)."""
    run_info = {**run_info, "threads": torch.get_num_threads()}  # --threads, or torch's default
    writer = tensorboard_writer(output) if getattr(args, "log", "none") == "tensorboard" and rank == 0 else None
    for epoch in range(start_epoch, args.epochs):
        seed_everything(args.seed + 1000 * epoch + rank)  # replayable on resume
        sampler.set_epoch(epoch)
        record = {"epoch": epoch, **train_epoch(epoch)}
        record.update(evaluate_epoch(epoch))
        history.append(record)
        rngs = gather_rng(world)
        if rank == 0:
            save_epoch(output, state(epoch, rngs, history), record)
            print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
            if writer is not None:
                log_scalars(writer, record)
        barrier()
    if writer is not None:
        writer.close()
    if rank == 0 and history:
        model = final_model()
        info = {**run_info, "parameters": sum(p.numel() for p in model.parameters()), "final": history[-1]}
        info["args"] = yaml.safe_load(args_yaml(args))
        save_model_folder(output, model, info, label_names)
        config = json.loads((output / CONFIG).read_text())
        write_model_card(output, config, history, f"linvit {run_info.get('command', 'train')}")
    return history


def tensorboard_writer(output: Path):
    """--log tensorboard: an event file in OUT/tensorboard beside metrics.jsonl (which stays the record)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise UsageError('--log tensorboard needs tensorboard: pip install -e ".[tensorboard]"') from err
    return SummaryWriter(log_dir=str(output / "tensorboard"))


def log_scalars(writer, record: dict) -> None:
    """The epoch's numbers (the metrics.jsonl line) as scalars at step = epoch."""
    for key, value in record.items():
        if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(key, value, record["epoch"])
    writer.flush()


def args_yaml(args) -> str:
    """The parsed arguments as YAML (the dispatch fields left out), loadable again with --config."""
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items() if k not in DISPATCH_FIELDS}
    values = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    return yaml.safe_dump(values, sort_keys=True)
