"""`linvit distill`: a pretrained softmax model (the teacher) linearized into a student with an InfSA mixer, as
Tasks on the one trainer (linvit.engine.fit).

Two stages, each a run of its own (resumable, torchrun DDP, progress bars):
1. attention transfer (OUT/attention): every converted layer learns, by relative MSE, to give its teacher
   layer's output on the teacher layer's input; only the converted layers train (distillation.transfer);
2. end to end (OUT): the student's logits learn the teacher's (KL at --temperature), optionally the labels
   (--hard-weight) and each layer's output (--feature-weight); every parameter trains, or LoRA adapters
   (--lora-rank, peft), merged into the final model.
OUT ends as a model folder like every run's; `linvit.load_run(OUT)` gives the student back.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..classify import evaluate_classification
from ..config import TrainConfig
from ..conversion.core import canonical_form
from ..data import collate_images
from ..data.splits import open_split
from ..distributed import all_reduce_sum, barrier, distributed_session
from ..engine import Metric, Parts, Run, Task, eval_loader, fit, run_evaluation, sharding
from ..engine.resume import find_resume
from ..engine.sharding import is_sharded
from ..errors import UsageError
from ..layers.feature_maps import HedgehogFeatureMap
from ..layers.infsa_attention import InfSABase
from ..mixers import conversion_forms, get_mixer
from ..models import check_model_name, split_name
from ..utils.artifacts import WEIGHTS
from ..utils.runtime import autocast
from ..weights import load_weights
from ..weights.run_folder import run_args
from .attention_weights import check_transfer_loss
from .recipe import AUTO, chosen_mixer, chosen_stages, chosen_window, stored_recipe
from .student import make_student, merged, train_only_converted_layers, train_only_feature_maps, with_lora
from .teacher import Logits, Teacher, absolute_teacher, causal_language_teacher, load_teacher, logits_of
from .text import text_splits
from .transfer import LayerTaps, layer_pairs

STAGES = ("auto", "both", "attention", "end-to-end")  # auto: distillation.recipe.chosen_stages


# the best measured form for the teacher's kind, chosen once the teacher is read (distillation.recipe.chosen_mixer)
DEFAULT_MIXER = AUTO


def default_gamma(mixer: str) -> float:
    """The converted layers' first discount, the mixer's registered distill_gamma: 0.5 for Katz-InfSA, whose
    series then weighs its hops gamma / (1 - gamma) = 1 in all, softmax's weighted average's scale (0.9 starts
    every layer at about 9 times its teacher's output); linvit.convert's 0.9 for the one-hop mixers (and 0.9
    for a name no mixer has: the config's check then names it). Measured: docs/results.md."""
    try:
        return get_mixer(mixer.partition(":")[0], warn=False).distill_gamma
    except UsageError:
        return 0.9


@dataclasses.dataclass
class DistillConfig(TrainConfig):
    """`linvit distill`: the teacher, the student's mixer, the two stages' lengths and the losses' weights."""

    # runs from before each option: the value they ran with, as stored (a resume asking another is refused)
    ABSENT_MEANS: ClassVar[dict[str, str]] = {"transfer_loss": "mse", "map_lr": "None", "gamma_lr": "None"}

    teacher: str | None = None
    teacher_file: str | None = None
    pretrained: bool = False
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    mixer: str = DEFAULT_MIXER
    gamma_init: float | None = None  # None: 0.5 for Katz-InfSA, else linvit.convert's 0.9 (default_gamma)
    feature_dim: int | None = None  # a learned map's size f (katz_infsa:hedgehog; None: the head dim)
    # causal LMs: exact softmax over the last W tokens (linvit.convert's window=); None: the measured default
    # (distillation.recipe.chosen_window: 64 for causal LM teachers under Katz or linear attention), 0: none
    window: int | None = None
    stages: str = "auto"
    transfer_epochs: int = 1
    transfer_lr: float = 1e-3
    transfer_loss: str = "mse"  # mse | xent | mse+xent: output MSE, Hedgehog's attention-weight CE (attention_weights)
    map_lr: float | None = None  # attention transfer's rate for the learned maps (:hedgehog); None: transfer_lr
    gamma_lr: float | None = None  # attention transfer's rate for the discounts' logits theta; None: transfer_lr
    lora_rank: int = 0
    temperature: float = 1.0
    hard_weight: float = 0.0
    feature_weight: float = 0.0
    img_size: list[int] | None = None
    train_split: str = "train"
    val_split: str = "val"
    context: int = 128
    train_windows: int | None = None
    epochs: int = 10
    lr: float | None = 1e-4
    warmup_epochs: int = 0

    def __post_init__(self) -> None:
        if self.mixer != AUTO:  # "auto": the form and its first discount wait for the teacher (with_recipe)
            self._check_mixer()
        check_transfer_loss(self.transfer_loss, None if self.mixer == AUTO else self.mixer)
        self._check_map_lr()
        self._check_gamma_lr()
        if self.stages not in STAGES:
            raise UsageError(f"stages must be one of {', '.join(STAGES)}, got {self.stages!r}")
        if not 0.0 <= self.hard_weight <= 1.0:
            raise UsageError(f"hard_weight is the labels' share of the loss, in [0, 1]; got {self.hard_weight}")
        if not 0.0 < self.temperature < math.inf:  # nan too
            raise UsageError(f"temperature must be a finite number > 0, got {self.temperature}")
        if not 0.0 <= self.feature_weight < math.inf:  # a negative weight would reward the layers' error
            raise UsageError(
                f"feature_weight weighs the layers' output MSE: a finite number >= 0, got {self.feature_weight}"
            )

    def _check_map_lr(self) -> None:
        if self.map_lr is None:
            return
        if isinstance(self.map_lr, bool) or not isinstance(self.map_lr, numbers.Real) or not 0 < self.map_lr < math.inf:
            raise UsageError(f"map_lr must be a finite learning rate > 0, got {self.map_lr!r}")
        if self.mixer != AUTO and not self.mixer.endswith(":hedgehog"):
            raise UsageError(f"map_lr: {self.mixer} has no learned feature map (the :hedgehog forms have one)")
        if self.transfer_loss == "xent" and self.stages != "end-to-end":  # the maps alone train: one rate, its flag
            raise UsageError(
                "map_lr: with transfer_loss xent only the learned maps train; give their rate as transfer_lr"
            )

    def _check_gamma_lr(self) -> None:
        if self.gamma_lr is None:
            return
        rate = not isinstance(self.gamma_lr, bool) and isinstance(self.gamma_lr, numbers.Real)
        if not rate or not 0 < self.gamma_lr < math.inf:  # nan too
            raise UsageError(f"gamma_lr must be a finite learning rate > 0, got {self.gamma_lr!r}")
        if self.mixer != AUTO and not get_mixer(self.mixer.partition(":")[0], warn=False).discount:
            raise UsageError(f"gamma_lr: {self.mixer} has no discount (the InfSA forms learn one a head)")
        if self.transfer_loss == "xent" and self.stages != "end-to-end":  # the maps alone train there
            raise UsageError("gamma_lr: with transfer_loss xent only the learned maps train, not the discount")

    def _check_mixer(self) -> None:
        if self.gamma_init is None:
            self.gamma_init = default_gamma(self.mixer)
        elif isinstance(self.gamma_init, bool) or not isinstance(self.gamma_init, numbers.Real):
            raise UsageError(f"gamma_init must be a number in (0, 1), got {self.gamma_init!r}")
        try:
            self.mixer = canonical_form(self.mixer)  # one spelling per form ("katz_infsa:relu" -> "katz_infsa")
        except UsageError:
            raise UsageError(
                f"mixer must be one of {AUTO}, {', '.join(conversion_forms())} (linvit.convert's), got {self.mixer!r}"
            ) from None


class Distiller(nn.Module):
    """The student and the loss of one stage. The teacher rides along unregistered: it is not saved, not
    wrapped by DDP, not in the optimizer."""

    def __init__(self, student: nn.Module, teacher: nn.Module, taps: LayerTaps, stage: str, config, language: bool):
        super().__init__()
        self.student = student
        self._teacher = (teacher,)
        self.taps, self.stage, self.config, self.language = taps, stage, config, language

    def _call(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=inputs, use_cache=False) if self.language else model(inputs)
        return logits_of(out)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        teacher = self._teacher[0]
        if self.stage == "attention":
            with self.taps.active(substitute=True):
                with torch.no_grad():
                    self._call(teacher, inputs)
                self._call(self.student, inputs)
                return self.taps.transfer_loss(self.config.transfer_loss, self.config.strategy == "fsdp")
        c = self.config
        with self.taps.active(substitute=False) if c.feature_weight else nullcontext():
            with torch.no_grad():
                teacher_logits = self._call(teacher, inputs)
            logits = self._call(self.student, inputs)
            features = c.feature_weight * self.taps.loss() if c.feature_weight else 0.0
        loss = (1 - c.hard_weight) * soft_target_loss(logits, teacher_logits, c.temperature)
        if c.hard_weight:
            loss = loss + c.hard_weight * F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
        return loss + features


def soft_target_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) of the softened distributions, times T^2 (Hinton et al.), mean over positions."""
    t = temperature
    student = F.log_softmax(logits.flatten(0, -2).float() / t, dim=-1)
    teacher = F.log_softmax(teacher_logits.flatten(0, -2).float() / t, dim=-1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * t * t


class Distillation(Task):
    """One stage of `linvit distill` on images (class folders or the digits) or text (a causal LM)."""

    name = "distillation"
    command = "distill"

    def __init__(self, stage: str, start_weights: Path | None = None) -> None:
        self.stage, self.start_weights = stage, start_weights
        self.teacher_numbers: dict | None = None

    def build(self, config: DistillConfig, device, rank: int, world: int) -> Parts:
        self.teacher = teacher = load_teacher(
            config.teacher, config.teacher_file, config.pretrained, config.model_kwargs, config.img_size
        )
        student = make_student(teacher.model, config.mixer, config.gamma_init, config.feature_dim, config.window)
        if self.start_weights is not None:
            load_weights(student, self.start_weights)
        pairs = layer_pairs(teacher.model, student)
        taps = LayerTaps(pairs, weights=self.stage == "attention" and "xent" in config.transfer_loss)
        if self.stage == "attention":
            trains = train_only_feature_maps if config.transfer_loss == "xent" else train_only_converted_layers
            trains(teacher.model, student)
            for _, _, layer in pairs:  # the loss reads each layer's output: under fsdp each is a unit of its own
                sharding.mark_unit(layer)
        elif config.lora_rank:
            student = with_lora(student, config.lora_rank, [layer for _, _, layer in pairs])
        teacher.model.to(device)
        build = _text_parts if teacher.language else _image_parts
        train_set, val_loader, collate, labels = build(self, config, rank, world)
        model = Distiller(student, teacher.model, taps, self.stage, config, teacher.language)
        return Parts(model, train_set, val_loader, collate, labels)

    def flag_names(self) -> dict[str, str]:
        return {"epochs": "--transfer-epochs", "lr": "--transfer-lr"} if self.stage == "attention" else {}

    def unused_settings(self, config: DistillConfig) -> frozenset[str]:
        """What --resume does not hold against this stage: the other stage's settings. Attention transfer's length
        and rate arrive as its epochs and lr (stage_configs), which follow a new plan as the trainer's do."""
        if self.stage == "attention":
            return frozenset(END_TO_END_FIELDS) - {"epochs", "lr"} | {"transfer_epochs", "transfer_lr"}
        return frozenset(TRANSFER_FIELDS)

    def frozen_models(self) -> list[nn.Module]:
        return [self.teacher.model]  # sharded under --strategy fsdp like the student

    def lr_scales(self, model: nn.Module, config: DistillConfig) -> dict[nn.Parameter, float]:
        """Attention transfer with --map-lr / --gamma-lr: the learned maps (LoLCATs trains its maps at 1e-2) and
        the discounts' logits at their own rates, the rest of the converted layers at --transfer-lr (this
        stage's lr). Adam moves theta = logit(gamma) by about the rate a step: at 2e-3 the discount cannot
        leave its start in a short run (docs/results.md)."""
        if self.stage != "attention":
            return {}
        scales = {}
        if config.map_lr is not None:
            maps = [m for m in model.modules() if isinstance(m, HedgehogFeatureMap)]
            found = {p: config.map_lr / config.lr for m in maps for p in m.parameters() if p.requires_grad}
            scales.update(_found_or_refused(found, "--map-lr", "learned feature map", config.mixer))
        if config.gamma_lr is not None:
            found = {p: config.gamma_lr / config.lr for p in discount_logits(model) if p.requires_grad}
            scales.update(_found_or_refused(found, "--gamma-lr", "discount (theta)", config.mixer))
        return scales

    @property
    def samples(self) -> str:
        """A language model's batches are token windows: its record says sequences_per_second."""
        return "sequences" if self.teacher.language else "images"

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        if self.teacher.language:
            batch = batch.to(run.device, non_blocking=True)
            inputs, targets = batch[:, :-1], batch[:, 1:]
        else:
            inputs, targets, _ = batch
            inputs, targets = inputs.to(run.device, non_blocking=True), targets.to(run.device, non_blocking=True)
        with autocast(run.device, run.config.amp):
            return run.train_net(inputs, targets), len(inputs)

    def evaluate(self, run: Run, epoch: int) -> dict:
        """The student's val numbers beside the teacher's (measured once): top-1 and its share of the teacher's
        (retention, %) for images; loss per token and its excess over the teacher's (loss_gap, %) for text."""
        student, teacher = run.model.student, self.teacher.model
        measure = _text_numbers if self.teacher.language else _image_numbers
        if self.teacher_numbers is None:
            self.teacher_numbers = {f"teacher_{k}": v for k, v in measure(teacher, run).items()}
        numbers = {**measure(student, run), **self.teacher_numbers}
        if self.teacher.language:
            numbers["loss_gap"] = 100 * (numbers["val_loss"] / numbers["teacher_val_loss"] - 1)
        else:
            numbers["retention"] = 100 * numbers["val_top1"] / max(numbers["teacher_val_top1"], 1e-9)
        return numbers

    def final_model(self, run: Run) -> nn.Module:
        return merged(run.model.student)

    def run_info(self, run: Run) -> dict:
        c = run.config
        info = {"stage": self.stage, "teacher": c.teacher, "model": c.teacher, "mixer": c.mixer}
        info["language"] = self.teacher.language
        info.update(world_size=run.world, lr=c.lr, device=str(run.device))
        if not self.teacher.language:
            info.update(num_classes=self.num_classes, data_config=self.data_config)
        return info

    def summary(self, run: Run) -> str:
        trainable = sum(p.numel() for p in run.model.student.parameters() if p.requires_grad)
        total = sum(p.numel() for p in run.model.student.parameters())
        c = run.config
        what = "attention transfer" if self.stage == "attention" else "end-to-end distillation"
        return (
            f"{what}: {c.teacher} -> {c.mixer}, {trainable:,} of {total:,} parameters train, "
            f"{len(run.parts.train_set)} train samples, lr {c.lr:.3g}{self._map_rate(c)}, world {run.world}"
        )

    def _map_rate(self, config: DistillConfig) -> str:
        if self.stage != "attention":
            return ""
        rates = [f"learned maps {config.map_lr:.3g}"] if config.map_lr else []
        rates += [f"discounts {config.gamma_lr:.3g}"] if config.gamma_lr else []
        return f" ({', '.join(rates)})" if rates else ""


def _found_or_refused(scales: dict, flag: str, what: str, mixer: str) -> dict:
    """A rate for parameters the student does not have (a registered mixer keeping them elsewhere) would train
    nothing at it while the run's summary line says it does."""
    if not scales:
        raise UsageError(f"{flag}: the {mixer} student has no trainable {what} for it to set the rate of")
    return scales


def discount_logits(model: nn.Module) -> list[nn.Parameter]:
    """Every converted layer's per-head theta = logit(gamma): the InfSA layers' and a converted language model's
    (conversion.language adds infsa_theta to its attention modules)."""
    found = []
    for module in model.modules():
        theta = module.theta if isinstance(module, InfSABase) else getattr(module, "infsa_theta", None)
        if isinstance(theta, nn.Parameter):
            found.append(theta)
    return found


def _image_parts(task: Distillation, config: DistillConfig, rank: int, world: int):
    """Both splits through the teacher's eval transform: the student learns the teacher on the data as it is."""
    from timm.data import create_transform

    teacher: Teacher = task.teacher
    data_config = dict(teacher.data_config)
    if config.img_size:
        side = config.img_size
        data_config["input_size"] = (3, side[0], side[-1])
    task.data_config = data_config  # the student's model folder records the size it learned at, not the teacher's
    transform = create_transform(**data_config, is_training=False)
    train = open_split(config.data, config.train_split, transform, unreadable="replace")
    val = open_split(config.data, config.val_split, transform)
    task.num_classes = len(train.classes)
    head = getattr(teacher.model, "num_classes", None) or getattr(
        getattr(teacher.model, "config", None), "num_labels", 0
    )
    if head and head != task.num_classes:
        raise UsageError(
            f"the teacher predicts {head} classes but {config.data} has {task.num_classes}: distil on the data "
            "the teacher was trained for (the student keeps the teacher's head)"
        )
    check_class_names(teacher.label_names, named_classes(train), config.data)
    val_loader = eval_loader(val, config.batch_size, config.workers, rank, world)
    return train, val_loader, collate_images, list(train.classes)


def named_classes(split) -> list[str] | None:
    """A split's class names, or None where its reader only numbers them (wds: without classes.txt, an hfds:
    label column without names)."""
    return list(split.classes) if getattr(split, "names_classes", True) else None


def check_class_names(teacher: list[str] | None, data: list[str] | None, spec) -> None:
    """Where the teacher and the data both name their classes, the same names in the same order, or one line."""
    if not teacher or not data or teacher == data:
        return
    ours, theirs = described(teacher), described(data)  # ImageNet's WordNet ids read as descriptions
    if ours == theirs:
        return
    at = next(i for i in range(max(len(ours), len(theirs))) if ours[i : i + 1] != theirs[i : i + 1])
    raise UsageError(
        f"the teacher's classes are not {spec}'s from class {at} on (teacher: {_listed(teacher)}; data: "
        f"{_listed(data)}): distil on the data the teacher was trained for, its classes in its order"
    )


def described(names: list[str]) -> list[str]:
    """ImageNet's WordNet ids (class folders n01440764, ...) as the descriptions that Hugging Face id2label and
    ImageNet DatasetDicts name the same classes by ("tench, Tinca tinca"); other names as they are."""
    if not all(re.fullmatch(r"n\d{8}", name) for name in names):
        return names
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    try:
        return [info.label_name_to_description(name) for name in names]
    except KeyError:  # not an ImageNet synset
        return names


def _listed(names: list[str], most: int = 12) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} classes)" if len(names) > most else "")


def _text_parts(task: Distillation, config: DistillConfig, rank: int, world: int):
    vocab = task.teacher.model.get_output_embeddings().weight.shape[0]
    model_config = task.teacher.model.config
    positions = getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "n_positions", None)
    if positions and config.context > positions:
        raise UsageError(f"--context {config.context} is longer than the teacher's {positions} positions")
    train, val = text_splits(
        config.data, task.teacher.tokenizer, vocab, config.context, config.train_windows, config.seed
    )
    if int(max(train.ids.max(), val.ids.max())) >= vocab:
        raise UsageError(f"{config.data}: token ids reach {int(train.ids.max())} but the teacher has {vocab}")
    val_loader = eval_loader(val, config.batch_size, config.workers, rank, world, collate_fn=None)
    return train, val_loader, None, None


def _image_numbers(model: nn.Module, run: Run) -> dict:
    val = evaluate_classification(Logits(model), run.parts.val_loader, run.device, run.config.amp)
    return {"val_top1": val["top1"], "val_loss": val["loss"]}


def _text_numbers(model: nn.Module, run: Run) -> dict:
    return {
        "val_loss": run_evaluation(model, run.parts.val_loader, NextTokenLoss(run.device), run.device, run.config.amp)
    }


class NextTokenLoss(Metric):
    """Mean next-token cross-entropy (nats per token) over the validation windows, summed across ranks; the
    cache off, as a window is scored whole."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.count = 0

    def update(self, forward, batch) -> None:
        batch = batch.to(self.device)
        logits = logits_of(forward(input_ids=batch[:, :-1], use_cache=False))
        self.total += F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten(), reduction="sum").double()
        self.count += batch[:, 1:].numel()

    def result(self) -> float:
        loss, count = all_reduce_sum([self.total.item(), self.count], self.device)
        return loss / max(count, 1)


def stage_configs(config: DistillConfig) -> list[tuple[str, DistillConfig]]:
    """(stage, its config): the last stage writes OUT, attention transfer before it OUT/attention.

    Attention transfer never checkpoints blocks: it runs each converted layer on its teacher layer's input (a
    forward hook), and a block recomputed in backward would run it on its own input (CheckpointError)."""
    transfer = {"epochs": config.transfer_epochs, "lr": config.transfer_lr, "grad_checkpointing": False}
    if config.stages == "attention":
        return [("attention", config.replace(**transfer))]
    if config.stages == "end-to-end":
        return [("end-to-end", config)]
    first = config.replace(output=str(Path(config.output) / "attention"), **transfer)
    return [("attention", first), ("end-to-end", _end_to_end_config(config))]


def _end_to_end_started(out: Path) -> bool:
    """The end-to-end stage of OUT has a model or a checkpoint: it resumes its own state, whatever the transfer."""
    return (out / "model.safetensors").is_file() or find_resume(out, "auto") is not None


def _end_to_end_config(config: DistillConfig) -> DistillConfig:
    """The end-to-end stage's config: once that stage has started, with the attention-transfer settings of the
    run it was made from (its args.yaml), so that what the folder records is what its model was trained with (a
    longer transfer asked for on resume changes OUT/attention only: stale_end_to_end_warning)."""
    out = Path(config.output)
    if not config.resume or not (out / "args.yaml").is_file() or not _end_to_end_started(out):
        return config
    absent = {name: None if value == "None" else value for name, value in config.ABSENT_MEANS.items()}  # as stored
    stored = {**absent, **run_args(out)}
    return config.replace(**{name: stored[name] for name in TRANSFER_FIELDS if name in stored})


END_TO_END_FIELDS = ("epochs", "lr", "lora_rank", "temperature", "hard_weight", "feature_weight")
TRANSFER_FIELDS = ("transfer_epochs", "transfer_lr", "transfer_loss", "map_lr", "gamma_lr")
SKIPPED_STAGE_FIELDS = {"attention": END_TO_END_FIELDS, "end-to-end": TRANSFER_FIELDS}
STAGE_HINTS = {
    "attention": "runs attention transfer only (its length and rate are --transfer-epochs, --transfer-lr)",
    "end-to-end": "runs the end-to-end stage only (its length and rate are --epochs, --lr)",
}


def stale_end_to_end_warning(config: DistillConfig) -> str | None:
    """A line where a resume lengthens attention transfer under an end-to-end stage that has started (finished,
    or a checkpoint): the transfer trains on, but the end-to-end stage resumes from its own state, made from the
    shorter transfer."""
    if not config.resume or config.stages != "both":
        return None
    out = Path(config.output)
    transfer = out / "attention" / "metrics.jsonl"
    if not _end_to_end_started(out) or not transfer.is_file():
        return None
    done = len(transfer.read_text().splitlines())
    if done >= config.transfer_epochs:
        return None
    return (
        f"linvit distill: warning: attention transfer goes on ({done} -> {config.transfer_epochs} epochs) but the "
        f"end-to-end stage in {out} started from the shorter transfer and resumes from its own state; distil into "
        "a new --output to use the longer one"
    )


def checkpointing_notice(config: DistillConfig) -> str | None:
    """A line where --grad-checkpointing meets attention transfer, which runs without it (stage_configs)."""
    if not config.grad_checkpointing or config.stages == "end-to-end":
        return None
    where = "ignored: --stages attention" if config.stages == "attention" else "applies to the end-to-end stage only"
    return (
        f"linvit distill: --grad-checkpointing {where} (attention transfer runs each converted layer on its teacher "
        "layer's input, which a recomputed block would not see)"
    )


def skipped_stage_settings(config: DistillConfig) -> str | None:
    """A notice naming the settings of the stage --stages leaves out, where they differ from the defaults
    (they would otherwise be dropped without a word); None when there are none."""
    defaults = {f.name: f.default for f in dataclasses.fields(DistillConfig)}
    changed = [n for n in SKIPPED_STAGE_FIELDS.get(config.stages, ()) if getattr(config, n) != defaults[n]]
    if not changed:
        return None
    flags = ", ".join(f"--{n.replace('_', '-')} {getattr(config, n)}" for n in changed)
    return f"linvit distill: warning: {flags} ignored: --stages {config.stages} {STAGE_HINTS[config.stages]}"


def refuse_other_stages(config: DistillConfig, stored: str | None) -> None:
    """A resumed folder asked for other stages than it ran is refused before anything trains (the resume check
    would refuse it too, but only after the new plan's first stage had trained into OUT/attention)."""
    if stored in (None, AUTO) or config.stages in (AUTO, stored):
        return
    raise UsageError(
        f"{config.output} holds a --stages {stored} run: it cannot go on as --stages {config.stages}; resume it "
        f"with --stages {stored} (or leave --stages out), or distil into a new --output"
    )


def refuse_a_stage_folder(out: Path) -> None:
    """OUT/attention of a two-stage run is not a run of its own: its args.yaml holds the stage's settings (its lr is
    --transfer-lr), and a distill into it would nest a new OUT/attention/attention (found with --config
    OUT/attention/args.yaml --resume auto). One line naming the run it belongs to."""
    if out.name != "attention" or not (out / "args.yaml").is_file():
        return
    # a two-stage run of its own called attention wrote its args.yaml after its own OUT/attention
    if run_args(out).get("stages") == "both" and not (out / "attention").is_dir():
        whole = out.parent / "args.yaml"  # written when the end-to-end stage starts
        flags = (
            f"--config {whole}" if whole.is_file() else f"the flags it was started with ({whole} is not written yet)"
        )
        raise UsageError(
            f"{out} is the attention-transfer stage of the run in {out.parent}: give the run's distill command "
            f"({flags}; not this stage's args.yaml) --output {out.parent}; with --resume auto it goes on from this "
            "stage"
        )


def check_teacher_name(spec: str) -> None:
    """A teacher name timm does not know, or a path that is not there, is one line before any notice about the
    teacher's kind or weights (they would speak of a teacher that does not exist)."""
    if spec.startswith("torchvision:"):
        import torchvision

        name = spec.split(":", 1)[1]
        if name not in torchvision.models.list_models():
            raise UsageError(f"--teacher {spec}: torchvision has no model {name!r} (torchvision.models.list_models())")
        return
    if spec.startswith("hf:") or Path(spec).exists():
        return
    check_model_name(split_name(spec)[0])


def refuse_one_checkpoint_for_two_stages(config: DistillConfig) -> None:
    """--resume PATH is one stage's checkpoint: with both stages the other would load it too (a traceback from the
    optimizer's groups after the first stage trained)."""
    if config.stages == "both" and config.resume not in (None, "", "auto"):
        raise UsageError(
            f"--resume {config.resume}: one checkpoint, but this run has two stages (attention transfer into "
            f"{Path(config.output) / 'attention'}, then end to end into {config.output}): resume the run with "
            "--resume auto (each stage finds its own last.pth), or give the checkpoint's stage alone (--stages "
            "attention or --stages end-to-end)"
        )


def with_recipe(config: DistillConfig) -> tuple[DistillConfig, str | None]:
    """config with the mixer, window and stages its flags left open chosen (distillation.recipe; every rank reads the
    same teacher configuration, and one that cannot read it stops), and a line saying what was chosen, if anything.
    The run stores the choice (None for no window, as runs before the default stored it)."""
    language = causal_language_teacher(config.teacher)
    chosen = []
    stored = stored_recipe(config.output, config.resume)  # what a resumed run started with, for flags left open
    if config.mixer == AUTO:
        if stored:  # the form the resumed run started with
            config = config.replace(mixer=stored["mixer"])
        else:
            mixer = chosen_mixer(config.mixer, language)
            try:
                config = config.replace(mixer=mixer)
            except UsageError as err:  # an option the chosen form does not take (--gamma-lr on the anchor)
                kind = "a causal language model" if language else "an image"
                raise UsageError(f"{err} (--mixer auto chose {mixer} for {kind} teacher: name a --mixer)") from err
            chosen.append(f"--mixer {config.mixer}")
    if config.gamma_init is None and stored.get("mixer") == config.mixer:  # auto's first discount, if left open
        config = config.replace(gamma_init=stored["gamma_init"])  # (an explicit --mixer fills in its default)
    refuse_other_stages(config, stored.get("stages"))
    if config.stages == AUTO and stored.get("stages") not in (None, AUTO):
        config = config.replace(stages=stored["stages"])
    if config.window is None and stored:  # a stored None is no window (--window 0, or a folder from before)
        config = config.replace(window=stored.get("window") or 0)
    window = chosen_window(config.window, config.mixer, language)
    stages = chosen_stages(config.stages, window if language else None)  # transfer only: measured on LMs only
    if config.window is None and window is not None:
        chosen.append(f"--window {window}")
    if config.stages == "auto" and stages != "both":
        chosen.append(f"--stages {stages}")
    config = config.replace(window=window, stages=stages)  # None stored as before: old folders resume
    if not chosen:
        return config, None
    kind = "a causal language model" if language else "an image"
    return config, f"linvit distill: {kind} teacher: {' '.join(chosen)} (docs/distill.md#defaults)"


def window_covers_context_warning(config: DistillConfig) -> str | None:
    """A line where the sliding window (exact softmax) spans every training window: the student's linear part
    never mixes a token, so attention transfer trains nothing of it (found with --context 32 and the default 64)."""
    if config.window and config.window >= config.context:
        return (
            f"linvit distill: warning: --window {config.window} covers the whole --context {config.context}: the "
            "student is exact softmax on every training window and its linear part learns nothing; use a longer "
            "--context or a shorter --window"
        )
    return None


def unused_discount_warning(config: DistillConfig) -> str | None:
    """A line for a first discount given to a form without one (plain linear attention, the anchor): it is
    stored with the run but trains nothing. Its default (default_gamma) stays silent, as resumed runs store it."""
    mixer = get_mixer(config.mixer.partition(":")[0], warn=False)
    if mixer.discount or config.gamma_init == default_gamma(config.mixer):
        return None
    return f"linvit distill: warning: --gamma-init {config.gamma_init} ignored: {config.mixer} has no discount"


def random_teacher_warning(config: DistillConfig) -> str | None:
    """A line for a timm or torchvision name given without weights: its student would learn a random model (and
    keep "100%" of it)."""
    spec = config.teacher
    named = not spec.startswith("hf:") and not Path(spec).exists()
    kwargs = config.model_kwargs  # timm's pretrained=True, torchvision's weights=DEFAULT
    if not named or config.pretrained or config.teacher_file or kwargs.get("pretrained") or kwargs.get("weights"):
        return None
    return (
        f"linvit distill: warning: --teacher {spec} has random weights (no --pretrained, no --teacher-file): "
        "its student learns a random model"
    )


def run_distill(config: DistillConfig) -> nn.Module:
    """`linvit distill`: every stage in turn (each resumes with --resume); returns the final student."""
    if config.teacher is None or config.data is None or config.output is None:
        raise UsageError("distill needs a teacher, data and an output folder")
    config = config.replace(teacher=absolute_teacher(config.teacher))  # the run folder rebuilds from it anywhere
    refuse_a_stage_folder(Path(config.output))
    check_teacher_name(config.teacher)
    config, chosen = with_recipe(config)
    refuse_one_checkpoint_for_two_stages(config)
    notices = (chosen, skipped_stage_settings(config), checkpointing_notice(config), random_teacher_warning(config))
    notices += (
        stale_end_to_end_warning(config),
        window_covers_context_warning(config),
        unused_discount_warning(config),
    )
    for notice in notices:
        if notice and int(os.environ.get("RANK", "0")) == 0:  # once under torchrun (before the process group exists)
            print(notice, file=sys.stderr)
    start = None
    with distributed_session(config.device):  # one process group for both stages
        for stage, stage_config in stage_configs(config):
            task = Distillation(stage, start)
            fit(task, stage_config)
            barrier()  # rank 0 has written the stage's model folder, which the next stage starts from
            start = Path(stage_config.output) / WEIGHTS
    teacher = task.teacher.model
    if is_sharded(teacher):  # FSDP modules cannot be copied: the student's shape from a fresh teacher
        spec = (config.teacher, config.teacher_file, config.pretrained, config.model_kwargs, config.img_size)
        teacher = load_teacher(*spec).model
    student = make_student(teacher.cpu(), config.mixer, config.gamma_init, config.feature_dim, config.window)
    load_weights(student, start)
    return student.eval()
