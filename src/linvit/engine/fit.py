"""`fit(task, config)`: the one training loop. A Task says what is trained (model, data, loss, evaluation,
the run record); a Run owns everything around it (output folder, rank/world/device, optimizer, schedule,
scaler, EMA, resume, DDP, checkpoints, the final model folder).

Every epoch reseeds from (seed, epoch, rank), so a resumed run replays the same data order and augmentations
and a same-config resume is bit-exact; each epoch's metrics.jsonl line is vouched for by an atomic last.pth.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import traceback
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from ..config import TrainConfig
from ..distributed import all_reduce_sum, barrier, distributed_session
from ..utils import compile_model, output_dir
from ..utils.artifacts import CONFIG, WEIGHTS
from ..utils.host import cpu_info
from ..utils.runtime import seed_everything
from . import record, sharded_checkpoint, sharding
from .recipe import schedule_notes, train_loader, training_recipe, wrap_ddp
from .resume import extra_state, refuse_a_shorter_plan, resume_run, training_state
from .steps import train_pass


@dataclasses.dataclass
class Parts:
    """What a task builds: the model (on the CPU; fit moves it), the training set and the validation loader."""

    model: nn.Module
    train_set: Dataset
    val_loader: object
    collate_fn: object = None
    label_names: list[str] | None = None
    pin_memory: bool = True  # pinned host batches when training on CUDA


@dataclasses.dataclass
class Run:
    """One training run in progress: where it writes, where it runs, and every piece of its state."""

    config: TrainConfig
    output: Path
    rank: int
    world: int
    device: torch.device
    parts: Parts
    model: nn.Module
    sampler: object
    loader: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: object
    ema: nn.Module | None
    train_net: nn.Module | None = None
    eval_net: nn.Module | None = None
    start_epoch: int = 0
    history: list = dataclasses.field(default_factory=list)
    finished: bool = False  # resumed with nothing left to train, its final model already written: left as it was

    def state(self, epoch: int, rngs: list) -> dict:
        return training_state(self, epoch, rngs, self.history)


class Task:
    """What one kind of training supplies to fit(); the defaults fit most tasks."""

    name = "task"  # config.json's linvit.task
    command = "train"  # the command that reruns it (model card)
    samples = "images"  # what batch_loss counts: the epoch record's <samples>_per_second

    def build(self, config: TrainConfig, device: torch.device, rank: int, world: int) -> Parts:
        raise NotImplementedError

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        """(mean loss of the batch, its count of `samples`), on run.train_net."""
        raise NotImplementedError

    def evaluate(self, run: Run, epoch: int) -> dict:
        """The numbers the epoch's record gets from validation."""
        raise NotImplementedError

    def run_info(self, run: Run) -> dict:
        """What config.json's "linvit" section says about the run, beside its config and final metrics."""
        return {}

    def summary(self, run: Run) -> str:
        """The one line printed when the run starts."""
        params = sum(p.numel() for p in run.model.parameters())
        return f"{self.name}: {params:,} params, {len(run.parts.train_set)} train images, world {run.world}"

    def unused_settings(self, config: TrainConfig) -> frozenset[str]:
        """Config fields this task's run never reads: a resume may change them (they touched no state)."""
        return frozenset()

    def flag_names(self) -> dict[str, str]:
        """Config fields this task's command sets under another flag than --field-name (what resume messages
        name: distill's attention transfer takes its epochs and lr from --transfer-epochs and --transfer-lr)."""
        return {}

    def frozen_models(self) -> list[nn.Module]:
        """Models the task runs but does not train (distillation's teacher): fsdp shards them as it does the
        model, with no gradients or optimizer state, so a teacher too large for one device still teaches."""
        return []

    def learning_rate(self, config: TrainConfig, world: int) -> float:
        return config.lr

    def lr_scales(self, model: nn.Module, config: TrainConfig) -> dict[nn.Parameter, float]:
        """Parameters that train at a multiple of the learning rate (their own param groups, timm's lr_scale,
        which the schedule keeps); none by default. Called on the model as it trains (after fsdp)."""
        return {}

    def build_ema(self, model: nn.Module, config: TrainConfig) -> nn.Module | None:
        """timm's ModelEmaV3 of the model, or None: updated after every step, what the final folder holds."""
        return None

    def start_epoch(self, run: Run, epoch: int) -> None:
        """Before an epoch's steps: drawn datasets (the digits) draw this epoch's canvases."""
        if hasattr(run.parts.train_set, "set_epoch"):
            run.parts.train_set.set_epoch(epoch)

    def end_epoch(self, run: Run, epoch: int, numbers: dict) -> None:
        """After an epoch's steps, before evaluation: add to the training numbers (collectives allowed)."""

    def final_model(self, run: Run) -> nn.Module:
        return run.ema.module if run.ema is not None else run.model


def fit(task: Task, config: TrainConfig) -> list[dict]:
    """Train task under config on this process or every torchrun process; returns the per-epoch metrics
    (rank 0 writes them to config.output, which becomes a model folder at the end)."""
    with distributed_session(config.device) as (rank, world, device), sharding.quiet_view_warnings():
        run = start_run(task, config, rank, world, device)
        try:
            return run_epochs(task, run)
        except BaseException as err:
            traceback.clear_frames(err.__traceback__)  # the frames hold the DDP wrapper (train_pass's net)
            raise
        finally:
            release_process_group_users(run)
            del run
            gc.collect()


def release_process_group_users(run: Run) -> None:
    """Free what holds the process group (the DDP wrapper, fsdp's sharded modules) before the session destroys
    it: a DDP reducer freed after it joins gloo's threads in its destructor and, on torch 2.9, one rank of a
    finished torchrun run hung there for good."""
    run.train_net = run.eval_net = run.model = run.ema = run.optimizer = run.parts = None


def start_run(task: Task, config: TrainConfig, rank: int, world: int, device: torch.device) -> Run:
    """Build the task's parts and the recipe around them, resume if asked, and record the config. A folder this
    call created is removed again when the run cannot start (bad data, a model that cannot be built): a failed
    command leaves no empty run folder behind."""
    output = Path(config.output)
    created = [f for f in (output, *output.parents) if not f.exists()] if rank == 0 else []  # deepest first
    if rank == 0:
        output_dir(output)
    try:
        return build_run(task, config, output, rank, world, device)
    except BaseException:
        for folder in created:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def build_run(task: Task, config: TrainConfig, output: Path, rank: int, world: int, device: torch.device) -> Run:
    """start_run's work, in its output folder."""
    if config.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    seed_everything(config.seed)
    parts = task.build(config, device, rank, world)
    model = parts.model.to(device)
    pin = parts.pin_memory and device.type == "cuda"
    sampler, loader = train_loader(parts.train_set, config, rank, world, parts.collate_fn, pin)
    ema = task.build_ema(model, config)
    companions = [ema.module] if ema is not None else []
    # before the optimizer: fsdp replaces the parameters
    model = sharding.prepare(model, config, world, device, companions, task.frozen_models())
    lr = task.learning_rate(config, world)
    scales = task.lr_scales(model, config)
    optimizer, scheduler, scaler = training_recipe(model, config, len(loader), device, lr, scales)
    run = Run(config, output, rank, world, device, parts, model, sampler, loader, optimizer, scheduler, scaler, ema)
    run.start_epoch, run.history = resume_run(run, task.unused_settings(config), task.flag_names())
    run.finished = already_finished(run)  # every rank's answer, as the refusal below is
    refuse_a_shorter_plan(output, run.start_epoch, config.epochs, run.finished, task.flag_names())
    if rank == 0:
        if run.finished:
            print(f"{output} already holds the run's final model: it is left as it was")
        else:
            record.write_run_config(output, config)
        print(task.summary(run))
        notes = [] if run.history else schedule_notes(config, lr, task.flag_names().get("epochs", "--epochs"))
        for note in notes:  # a resumed run's schedule was said when it started (or comes from its checkpoint)
            print(f"note: {note}")
    net = model if sharding.is_sharded(model) else wrap_ddp(model, world, device)
    run.train_net = compile_model(net, config.compile)
    run.eval_net = compile_model(model, config.compile)
    return run


def already_finished(run: Run) -> bool:
    """Whether a resumed run has nothing left to train and its folder holds its final model (weights and
    config.json). Such a run is left as it was: a new schedule flag trains nothing, so args.yaml and the model
    card keep the plan that trained it. Taken by every rank (rank 0 looks at the folder)."""
    if not run.history or run.start_epoch < run.config.epochs:
        return False
    written = run.rank == 0 and final_model_epoch(run.output) == run.history[-1]["epoch"]
    return all_reduce_sum([float(written)], run.device)[0] > 0


def final_model_epoch(output: Path) -> int | None:
    """The epoch whose model the folder's final model is (config.json's linvit.final), None without one: a run
    stopped after a later epoch's checkpoint, before its model folder, still holds an earlier final model."""
    if not (output / WEIGHTS).is_file() or not (output / CONFIG).is_file():
        return None
    try:
        return json.loads((output / CONFIG).read_text())["linvit"]["final"]["epoch"]
    except (ValueError, KeyError, TypeError):
        return None


def run_epochs(task: Task, run: Run) -> list[dict]:
    """The epoch loop: a replayable seed, the task's steps and evaluation, one metrics line vouched for by an
    atomic checkpoint; after the last epoch the output folder becomes a model folder."""
    run_info = {"task": task.name, "command": task.command, **task.run_info(run), "threads": torch.get_num_threads()}
    run_info.update(cpu_info(), torch=torch.__version__)  # what else decides the run's float rounding (utils.host)
    board = record.TensorBoardLog(run.output) if run.config.log == "tensorboard" and run.rank == 0 else None
    after_step = (lambda step: run.ema.update(run.model, step=step)) if run.ema is not None else None
    for epoch in range(run.start_epoch, run.config.epochs):
        seed_everything(run.config.seed + 1000 * epoch + run.rank)  # replayable on resume
        run.sampler.set_epoch(epoch)
        task.start_epoch(run, epoch)
        numbers = {
            "epoch": epoch,
            **train_pass(run, epoch, lambda batch: task.batch_loss(run, batch), after_step, task.samples),
        }
        task.end_epoch(run, epoch, numbers)
        with sharding.gathered(run.model, run.ema.module if run.ema is not None else None, frozen=task.frozen_models()):
            numbers.update(task.evaluate(run, epoch))
        run.history.append(numbers)
        rngs = gather_rng(run.world)
        sharded = run.config.strategy == "fsdp"
        if sharded:  # every rank writes its shards
            sharded_checkpoint.save(run, extra_state(run, epoch, rngs, run.history))
        if run.rank == 0:
            record.save_epoch(run.output, None if sharded else run.state(epoch, rngs), numbers)
            print(record.format_record(numbers))
            if board is not None:
                board.add(numbers)
        barrier()
    if board is not None:
        board.close()
    if not run.finished:
        finish(task, run, run_info)
    return run.history


def finish(task: Task, run: Run, run_info: dict) -> None:
    """Rank 0 turns the output folder into a model folder (config.json's state_bytes_per_rank: each rank's
    parameters, gradients and optimizer state); with torchrun every rank also records its final numbers
    (final_val_rank<r>.json), so a run can show that all ranks agree."""
    if not run.history:
        return
    mine = sharding.state_bytes(run.model, run.optimizer)
    per_rank = all_reduce_sum([mine if r == run.rank else 0 for r in range(run.world)], run.device)
    run_info = {**run_info, "state_bytes_per_rank": [int(b) for b in per_rank]}
    model = task.final_model(run)
    written = sharding.is_sharded(model)
    if written:  # collective: every rank gathers tensor by tensor, rank 0 writes each
        sharding.save_full_weights(model, run.output / WEIGHTS if run.rank == 0 else None)
    if run.rank == 0:
        record.save_final_model(run.output, model, run_info, run.config, run.history, run.parts.label_names, written)
        drop_stale_rank_records(run.output, run.world)
    if run.world > 1:
        (run.output / f"final_val_rank{run.rank}.json").write_text(json.dumps(run.history[-1]))


def drop_stale_rank_records(output: Path, world: int) -> None:
    """Remove final_val_rank<r>.json that no rank of this run writes (all of them for one process): a run resumed
    at a smaller world size would otherwise keep an earlier epoch's numbers beside its own."""
    for path in output.glob("final_val_rank*.json"):
        rank = path.stem.removeprefix("final_val_rank")
        if world == 1 or (rank.isdigit() and int(rank) >= world):
            path.unlink(missing_ok=True)


def gather_rng(world: int) -> list[dict]:
    """Every rank's RNG states (rank order) for the checkpoint; a single process has one entry."""
    from ..utils.runtime import rng_states

    states = rng_states()
    if world == 1:
        return [states]
    import torch.distributed as dist

    gathered: list = [None] * world
    dist.all_gather_object(gathered, states)
    return gathered
