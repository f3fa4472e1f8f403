"""The `linvit` command table: one row per command, its flags next to it, read by linvit_cli to build the parser.

A row names the command's config dataclass and run function (``"linvit.classify:ClassifyConfig:run_train"``),
imported only when the command runs, and lists its flags: add_argument's names and keywords, without defaults.
A flag's default is its config field's (linvit_cli fills what the command line and --config leave out), so a
default is written once, on the config. Torch-free, like linvit_cli: ``linvit --help`` imports neither torch nor
timm. A new command is a row; a new flag is a config field and a Flag in its command's row (or in a shared group).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One add_argument call; ``old``: its previous spelling, kept hidden for one release (noted on stderr);
    ``check``: value -> value, run before the config is built (a UsageError for bad input; it may normalise)."""

    names: tuple[str, ...]
    kwargs: dict[str, Any]
    old: str | None = None
    check: Callable | None = None

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.names[0].lstrip("-").replace("-", "_")

    def but(self, **changes) -> Flag:
        """The same flag with other add_argument keywords (a command's own help or required)."""
        return Flag(self.names, {**self.kwargs, **changes}, self.old, self.check)


def flag(*names: str, old: str | None = None, check: Callable | None = None, **kwargs) -> Flag:
    return Flag(names, kwargs, old, check)


@dataclass(frozen=True)
class Group:
    """Flags under a title in --help (``exclusive``: a mutually exclusive group, at most one given)."""

    title: str | None
    flags: tuple[Flag, ...]
    exclusive: bool = False


@dataclass(frozen=True)
class Command:
    """A leaf command: its words (``"segment train"``), its help, ``"module:Config:run"`` and its flags;
    ``execute``: the run function also takes the CLI's own command runner (reproduce runs commands)."""

    words: str
    help: str
    target: str
    flags: tuple = field(default=())
    execute: bool = False


def command(words: str, help: str, target: str, *flags, execute: bool = False) -> Command:
    return Command(words, help, target, _flat(flags), execute)


def _flat(items) -> tuple:
    """Flags and Groups, with the tuples of shared flag sets spliced in."""
    out = []
    for item in items:
        out.extend(_flat(item) if isinstance(item, (tuple, list)) else [item])
    return tuple(out)


def deprecated(old: str, new: str) -> None:
    print(f"linvit: {old} is deprecated, use {new} ({old} goes in the next release)", file=sys.stderr)


def usage(message: str) -> ValueError:
    """linvit.errors.UsageError(message): bad input, shown as one line (imported when a command runs)."""
    from linvit.errors import UsageError

    return UsageError(message)


# ---- argparse types and choices ----


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(item) for item in text.split(",") if item]
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}: {text!r}") from err

    return parse


def _count(minimum: int):
    """argparse type: an integer of at least ``minimum`` (epochs, batch sizes, workers, ...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = "count"
    return parse


POSITIVE, NON_NEGATIVE = _count(1), _count(0)


def _real(low: float, high: float | None = None, *, open_low: bool = False, open_high: bool = False):
    """argparse type: a number in [low, high] (an end excluded where open_*), so a rate or probability out of
    range is one line here instead of torch's traceback (or none at all) once the run starts."""
    left, right = "(" if open_low else "[", ")" if open_high or high is None else "]"
    wanted = f"a number in {left}{low}, {'inf' if high is None else high}{right}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        too_low = value is None or value < low or (open_low and value == low)
        unbounded = high is None and value == float("inf")  # "[low, inf)": a finite number (an infinite rate NaNs)
        too_high = value is not None and high is not None and (value > high or (open_high and value == high))
        too_high = too_high or unbounded
        if too_low or too_high or value != value:  # NaN compares false to every bound
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    parse.__name__ = "float"
    return parse


RATE = _real(0, open_low=True)  # learning rates, crop fractions
NON_NEGATIVE_REAL = _real(0)  # schedule ends, mixup/cutmix alphas
PROBABILITY = _real(0, 1)  # flips, random erasing
BELOW_ONE = _real(0, 1, open_high=True)  # label smoothing, stochastic depth


def _mixer(text: str) -> str:
    """argparse type of generate's --mixer: the old linear, pure, katz (with a note) -> linear_infsa, ..."""
    if text in ("linear", "pure", "katz"):
        deprecated(f"--mixer {text}", f"--mixer {text}_infsa")
        return f"{text}_infsa"
    return text


DEVICES = ("auto", "cpu", "cuda")  # auto: cuda when torch sees one (linvit.distributed.resolve_device)
# linvit.conversion.FORMS and linvit.models.dit.dit_mixers() as linvit registers them, without importing torch
# (tests/test_cli_consistency.py checks they are the same): the variants, a stabilised Linear-InfSA
# (docs/spec/infsa.md 3.1), Katz-InfSA's other feature maps (the learned "hedgehog" one: layers.feature_maps) and
# the anchor form, plain linear attention (layers.linear_attention)
BUILTIN_FORMS = ("pure_infsa", "linear_infsa", "katz_infsa", "katz_rows", "linear_attention")
BUILTIN_FORMS += ("linear_infsa:floor", "linear_infsa:softplus", "linear_infsa:elu+1")
BUILTIN_FORMS += ("katz_infsa:elu+1", "katz_infsa:hedgehog", "katz_rows:elu+1", "katz_rows:hedgehog")
BUILTIN_FORMS += ("linear_attention:relu", "linear_attention:hedgehog")
BUILTIN_DIT_MIXERS = ("softmax", "pure_infsa", "linear_infsa", "katz_infsa", "katz_rows", "linear_attention")
BUILTIN_DIT_MIXERS += ("weightformer",)


class _Registered:
    """argparse choices read from linvit's mixer registry (linvit.mixers), so a mixer registered in this process
    is one: a value is checked against the registry (loading linvit, which the command runs anyway), and --help,
    which must not load torch, lists the built-in ones until linvit is loaded."""

    def __init__(self, builtin: tuple[str, ...], dit: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.builtin, self.dit, self.extra = builtin, dit, extra  # extra: words the command takes beside the forms

    def registered(self) -> tuple[str, ...]:
        from linvit.mixers import conversion_forms
        from linvit.models.dit import dit_mixers

        return dit_mixers() if self.dit else conversion_forms()

    def __contains__(self, value) -> bool:
        return value in self.extra or value in self.registered()

    def __iter__(self):
        return iter((*self.extra, *(self.registered() if "linvit.mixers" in sys.modules else self.builtin)))


CONVERT_VARIANTS = _Registered(BUILTIN_FORMS)
DIT_MIXERS = _Registered(BUILTIN_DIT_MIXERS, dit=True)


# ---- checks ----


def _one_or_two(name: str, minimum: int | None = None) -> Callable:
    def check(sides: list[int]) -> list[int]:
        if len(sides) not in (1, 2) or (minimum is not None and min(sides) < minimum):
            raise usage(f"{name} takes one side or H W, got {sides}")
        return sides

    return check


def _layer(value):
    """--layer: an index or 'mean'."""
    if value == "mean":
        return value
    try:
        return int(value)
    except ValueError:
        raise usage(f"--layer takes a layer index or 'mean', got {value!r}") from None


# ---- flags shared by several commands ----

MODEL_HELP = "registered model name, optionally with a :variant suffix"
KWARGS_HELP = "extra timm.create_model kwargs"
FROM_RUN = " (default: the run's, with --checkpoint RUN)"
CHECKPOINT_SOURCE = "--checkpoint (softmax weights; a converted run's weights load after it)"
METHODS_HELP = "linear|column|katz|perron|cls|rollout|grad (default: the model's own)"
BACKBONE = "backbone: any registered linvit or timm ViT name"
PRETRAINED_HELP = "the model's published weights through timm's Hub path (WeightFormer T/S/B: RuizeHe/weightformer-*)"

OUTPUT = flag("--output", old="--out", required=True)  # the one name of every command's output
MODEL_KWARGS = flag("--model-kwargs", nargs="*", metavar="K=V", help=KWARGS_HELP)
IMG_SIZE_HW = flag("--img-size", type=POSITIVE, nargs="+", metavar="PX", check=_one_or_two("--img-size"))
DEVICE = flag("--device", choices=DEVICES, help="auto: cuda when torch sees one, else cpu")
AMP = flag("--amp", choices=["none", "bf16", "fp16"], help="autocast precision")
PREDICT_AMP = AMP.but(
    choices=["auto", "none", "bf16", "fp16"],
    help="autocast precision; auto (default): bf16 on a CPU with native bf16 products, else none (float32)",
)
PROGRESS = flag("--progress", action=argparse.BooleanOptionalAction, help="a bar over the batches")
SEED = flag("--seed", type=int)
JSON = flag("--json", help="also write the metrics to this JSON file")
SPLITS = (flag("--train-split"), flag("--val-split"))
HFLIP = flag("--hflip", type=PROBABILITY, help="horizontal-flip probability")
COMPILE = flag(
    "--compile",
    choices=["off", "default", "reduce-overhead", "max-autotune"],
    help="torch.compile the model (one static graph per input size; reduce-overhead adds CUDA graphs)",
)


def output(help: str, required: bool = True) -> Flag:
    return OUTPUT.but(help=help, required=required)


def model(model_help: str, kwargs_help: str = KWARGS_HELP, required: bool = True) -> Group:
    """--model and --model-kwargs, one group for every command that builds a model."""
    pretrained = flag("--pretrained", action="store_true", help=PRETRAINED_HELP + "; a model without any says so")
    return Group(
        "model", (flag("--model", required=required, help=model_help), MODEL_KWARGS.but(help=kwargs_help), pretrained)
    )


def runtime() -> Group:
    """Batch, data loading and device flags shared by training and evaluation commands."""
    batch = flag("--batch-size", type=POSITIVE, help="images per process")
    return Group("runtime", (batch, flag("--workers", type=NON_NEGATIVE, help="data-loading processes"), AMP, DEVICE))


def convert(source: str = "--pretrained-file") -> Flag:
    help = f"convert the model's softmax attention to InfSA (linvit.convert) after loading {source}"
    return flag("--convert", choices=CONVERT_VARIANTS, help=help)


def checkpoint(help: str, required: bool = False) -> Flag:
    return flag("--checkpoint", required=required, help=help)


def fit(lr_help: str = "learning rate", epochs_help: str | None = None) -> Group:
    """The flags of the one trainer (linvit.config.TrainConfig), the same in every training command."""
    fsdp = "with torchrun: ddp (whole model per rank) or fsdp (parameters, gradients, optimizer sharded)"
    shard = "fsdp: shard within groups of this many ranks (say, one node), replicate across them (default: all)"
    log = "also write the per-epoch numbers to OUT/tensorboard (metrics.jsonl is always written)"
    flags = (
        flag("--output", required=True, help="run folder: metrics.jsonl, last.pth, model.safetensors"),
        flag("--epochs", type=POSITIVE, help=epochs_help),
        flag("--lr", type=RATE, help=lr_help),
        flag("--opt", help="timm optimizer name"),
        flag("--weight-decay", type=float),
        flag("--warmup-epochs", type=NON_NEGATIVE),
        flag("--warmup-lr", type=NON_NEGATIVE_REAL, help="warm-up start; none: lr / 1000"),
        flag("--min-lr", type=NON_NEGATIVE_REAL, help="cosine end; none: lr / 100"),
        flag("--clip-grad", type=float, help="max gradient norm"),
        SEED,
        flag("--resume", help="'auto' (OUT/last.pth or OUT/last/ if present) or a checkpoint"),
        flag("--deterministic", action="store_true", help="torch.use_deterministic_algorithms"),
        PROGRESS.but(help="tqdm bar per epoch"),
        flag("--strategy", choices=["ddp", "fsdp"], help=fsdp),
        flag("--shard-size", type=POSITIVE, help=shard),
        flag(
            "--grad-checkpointing",
            action="store_true",
            help="recompute each block in backward (less activation memory)",
        ),
        flag("--log", choices=["none", "tensorboard"], help=log),
        COMPILE,
    )
    return Group("training schedule (every training command)", flags)


def image_data(model_required: bool = True) -> tuple:
    """train and eval: an ImageNet-layout folder, the model, its input size, the runtime."""
    return (
        flag(
            "--data",
            required=True,
            help="an ImageNet-layout folder (DIR/<split>/<class>/*), digits:TASK[,...] (drawn digits), wds:SHARDS "
            "or hfds:SAVED (docs/classification.md, Data)",
        ),
        model(MODEL_HELP if model_required else MODEL_HELP + FROM_RUN, required=model_required),
        flag("--img-size", type=POSITIVE, help="input side (default: the model's)"),
        flag("--crop-pct", type=RATE, help="eval centre-crop fraction (default: the model's)"),
        runtime(),
    )


def analysis() -> tuple:
    """explain, spectral, erf: pictures, a model or run, how many images."""
    data = "ImageNet-layout folder (DIR/<split>/<class>/*), any folder of pictures, or digits:TASK,..., wds:, hfds:"
    seed = "seed of the model's initialisation (without --checkpoint) and of the figures' class-spread sample"
    return (
        flag("--data", required=True, help=data),
        flag("--split", help="DATA/SPLIT when it exists, else DATA itself"),
        model(MODEL_HELP + "; without it --checkpoint is a run folder", required=False),
        checkpoint("a run folder, or weights for --model (.pth/.safetensors); default: random"),
        IMG_SIZE_HW.but(help="input side, or H W"),
        flag("--crop-pct", type=RATE),
        flag("--limit", type=POSITIVE, help="images used (spread evenly over the split)"),
        SEED.but(help=seed),
    )


def resize(help: str) -> Flag:
    """--resize PX: the shorter side segmentation resizes pictures to (it was --img-size, which elsewhere is the
    model's input size); the config keeps the run folders' name, img_size."""
    return flag("--resize", old="--img-size", dest="img_size", type=POSITIVE, metavar="PX", help=help)


def dense_model(model_required: bool) -> Group:
    return model(BACKBONE + ("" if model_required else FROM_RUN), "extra backbone kwargs", required=model_required)


PYRAMID = flag("--pyramid-channels", type=POSITIVE)


def segment_data(model_required: bool = True) -> tuple:
    data = flag("--data", required=True, help="ADE20K folder (images/, annotations/) or a folder with masks/")
    resized = resize("evaluation: resize the shorter side to PX (default: each image as it is)")
    return data, dense_model(model_required), resized, runtime(), PYRAMID, flag("--head-channels", type=POSITIVE)


def detect_data(model_required: bool = True) -> tuple:
    return (
        flag("--data", required=True, help="COCO-layout folder: annotations/instances_<split>.json + <split>/"),
        dense_model(model_required),
        flag("--detector", choices=["fasterrcnn", "retinanet", "maskrcnn"]),
        flag("--min-size", type=POSITIVE, help="resize the shorter side to this (COCO: 800)"),
        flag("--max-size", type=POSITIVE, help="... keeping the longer side at most this"),
        flag("--anchor-base", type=POSITIVE, help="anchor size of the finest level (x2 per level)"),
        PYRAMID,
        runtime(),
    )


def dense_train() -> tuple:
    """The flags segment train and detect train share (AdamW, cosine per iteration, starting weights)."""
    start = "classification weights to start the backbone from (its head is dropped)"
    return (
        fit("AdamW learning rate (per-iteration cosine)"),
        SPLITS,
        HFLIP,
        flag("--backbone-checkpoint", "--pretrained-file", help=start),
        convert(),
    )


IMAGES = flag("images", nargs="+", help="image files, folders (searched recursively) or glob patterns")
MAX_PIXELS = flag("--max-pixels", type=POSITIVE, help="refuse larger images (default 2^28)")


def dense_predict(out_help: str) -> tuple:
    draw = "drawn pictures: DIR/<name>.png at each image's size"
    return (
        IMAGES,
        checkpoint("the run folder of a finished training run", required=True),
        output(out_help, required=False),
        flag("--draw", metavar="DIR", help=draw),
        MAX_PIXELS,
        AMP,
        DEVICE,
        PROGRESS.but(help="a bar over the images"),
    )


def sampling(num_help: str) -> tuple:
    """The flags of every command that samples a `generate train` run: which run, how many, how (DDIM)."""
    return (
        checkpoint("the run folder of a finished `linvit generate train`", required=True),
        flag("--num", type=POSITIVE, help=num_help),
        flag("--steps", type=POSITIVE, help="DDIM steps"),
        flag("--guidance", type=float, help="classifier-free guidance scale (1 = none)"),
        SEED,
        DEVICE,
        PROGRESS.but(help="a progress bar"),
    )


# ---- the commands, in the order `linvit --help` lists them ----

# a command with subcommands: its help and the dest of the subcommand's name
PARENTS = {
    "data": ("build the embedded datasets (offline)", "dataset"),
    "generate": ("class-conditional image generation: diffusion transformers (DiT)", "generate_command"),
    "segment": ("semantic segmentation: backbone + simple feature pyramid + semantic-FPN head", "segment_command"),
    "detect": ("object detection: Faster R-CNN / RetinaNet / Mask R-CNN on a backbone's pyramid", "detect_command"),
}

BENCH_TASK = (
    "the classifier; backbone + pyramid + semantic-FPN head (150 classes) as in `linvit segment`; the whole Faster "
    "R-CNN (81 classes) of `linvit detect` at res x res*1333/800, inference; or a DiT (--models are mixers, --res "
    "the latent side; default DiT-S/2, 4 channels): infer = one guided sampling step"
)
COMMANDS = (
    command(
        "models",
        "list registered models with parameter counts",
        "linvit.bench.command:ModelsConfig:run_models",
        flag("--filter", help="wildcard filter, e.g. '*linear*'"),
        flag("--macs", action="store_true", help="also count multiply-accumulates (torch flop counter)"),
        flag(
            "--ops", action="store_true", help="also count the ATen operators one inference forward launches (no_grad)"
        ),
        flag("--macs-at", old="--img-size", type=POSITIVE, metavar="PX", help="square input side of --macs, --ops"),
        flag("--json", action="store_true", help="print JSON instead of a table"),
    ),
    command(
        "bench",
        "speed / memory / FLOPs / energy sweep, one subprocess per point",
        "linvit.bench.command:BenchConfig:run_bench",
        flag("--models", type=_csv(str), help="comma list; 'name:variant', e.g. vit_4l_patch16_224:naive"),
        flag("--suite", help="a recorded table of docs/benchmarks.md by name, 'all' (CPU tables) or 'gpu'"),
        flag("--res", type=_csv(int), help="comma list of square input sides"),
        flag("--batch", type=_csv(int), help="comma list of batch sizes, e.g. 1,32 (latency and throughput)"),
        flag(
            "--compile",
            type=_csv(str),
            metavar="MODES",
            help="comma list of off|default|reduce-overhead|max-autotune (default off); compile time is recorded apart",
        ),
        flag("--min-time", type=float, help="time each point for at least this many seconds"),
        flag("--dry-run", action="store_true", help="with --suite: every point at 32 px, one iteration"),
        flag("--mode", choices=["infer", "train"], help="forward only, or forward+backward"),
        flag("--task", choices=["classify", "segment", "detect", "generate"], help=BENCH_TASK),
        DEVICE.but(help="default cpu (the recorded CPU tables); auto: cuda when torch sees one"),
        flag("--dtype", choices=["fp32", "bf16", "fp16"], help="non-fp32 runs under autocast"),
        flag(
            "--runtime",
            choices=["eager", "onnxruntime", "onnxruntime-int8"],
            help="onnxruntime: also each point's graph exported to ONNX at its size, timed in onnxruntime (fp32 CPU); "
            "onnxruntime-int8: that graph and its int8 quantization (export --quantize int8's)",
        ),
        flag(
            "--warmup", type=NON_NEGATIVE, help="untimed iterations (the first counts FLOPs; 0 = no warm-up, no FLOPs)"
        ),
        flag("--iters", type=POSITIVE, help="timed iterations"),
        flag("--timeout", type=float, help="seconds per point before it is recorded as timeout"),
        flag("--mem-limit", type=float, help="GB per point; above it the point is 'oom'"),
        flag("--ladder", action="store_true", help="per model, double the first --res until a point fails"),
        flag("--reference", type=_csv(str), help="models to report speed-ups against (comma list)"),
        MODEL_KWARGS,
        output("output folder"),
    ),
    command(
        "data cluttered-mnist",
        "MNIST digits on a cluttered canvas, with boxes.json",
        "linvit.data.cluttered_mnist:ClutteredMnistConfig:run_cluttered_mnist",
        output("the dataset folder"),
        flag("--canvas", type=int, help="canvas side in pixels (>= 28)"),
        flag("--per-class-train", type=POSITIVE),
        flag("--per-class-val", type=POSITIVE),
        flag("--clutter", type=int, help="clutter fragments per image"),
        SEED,
        flag(
            "--digits-per-image",
            type=NON_NEGATIVE,
            metavar="K",
            help="also write OUTPUT/detection: K digits per canvas with COCO boxes and masks (0 = no detection set)",
        ),
    ),
    command(
        "data digits",
        "the fixed val / test / shifted canvases of a drawn digit task (what --data digits:TASK draws), "
        "with boxes.json",
        "linvit.data.digit_tasks:DigitFolderConfig:run_digit_folder",
        output("the dataset folder"),
        flag("--task", choices=("digit", "max", "sum"), help="the label: the digit, max(a, b), (a + b) mod 10"),
        flag("--canvas", type=POSITIVE, help="canvas side in pixels (max, sum: >= 64)"),
        flag("--clutter", type=NON_NEGATIVE, help="clutter fragments (the shifted split: 2k + 2)"),
        SEED.but(help="the digit split and every canvas"),
    ),
    command(
        "train",
        "train with the DeiT recipe (torchrun for DDP)",
        "linvit.classify:ClassifyConfig:run_train",
        image_data(),
        fit("absolute learning rate (default: base-lr * batch / 512)"),
        SPLITS,
        flag("--base-lr", type=RATE, help="learning rate per 512 images of global batch"),
        flag("--drop-path", type=BELOW_ONE, help="stochastic depth rate"),
        flag("--scale", type=float, nargs=2, help="RandomResizedCrop area range"),
        flag("--ratio", type=float, nargs=2, help="RandomResizedCrop aspect range"),
        HFLIP,
        flag("--aa", help="RandAugment policy ('none' to disable)"),
        flag("--color-jitter", type=float, help="used only when --aa none"),
        flag("--reprob", type=PROBABILITY, help="random-erasing probability"),
        flag("--mixup", type=NON_NEGATIVE_REAL, help="mixup alpha (0 = off)"),
        flag("--cutmix", type=NON_NEGATIVE_REAL, help="cutmix alpha (0 = off)"),
        flag("--smoothing", type=BELOW_ONE, help="label smoothing"),
        flag("--interpolation"),
        flag("--model-ema", action=argparse.BooleanOptionalAction, help="keep an EMA of the weights"),
        flag("--model-ema-decay", type=float),
        flag("--pretrained-file", help="start from these weights (.pth/.safetensors; timm's path)"),
        convert(),
    ),
    command(
        "distill",
        "linearize a pretrained softmax model: attention transfer, then distillation (torchrun)",
        "linvit.distillation:DistillConfig:run_distill",
        flag(
            "--teacher",
            required=True,
            help="timm name, linvit run folder, torchvision:NAME or hf:PATH (image classifier or causal LM)",
        ),
        flag("--teacher-file", help="the teacher's weights (.pth/.safetensors) for a model name"),
        flag("--pretrained", action="store_true", help="the teacher's published weights (timm's Hub path)"),
        MODEL_KWARGS.but(help="extra kwargs of a timm teacher"),
        flag(
            "--data",
            required=True,
            help="images: DIR/<split>/<class>/* or digits:...; text (LM): a .txt file or folder",
        ),
        flag(
            "--mixer",
            choices=_Registered(BUILTIN_FORMS, extra=("auto",)),
            help="the student's attention (default auto: by teacher kind, from docs/distill.md's measurements)",
        ),
        flag(
            "--gamma-init",
            type=float,
            help="the converted layers' first discount (default: 0.5 for katz_infsa and katz_rows; else 0.9)",
        ),
        flag("--feature-dim", type=POSITIVE, help="a learned feature map's size f (hedgehog; default head dim)"),
        flag(
            "--window",
            type=NON_NEGATIVE,
            help="causal LMs: exact softmax over the last W tokens, the mixer over older ones "
            "(default: 64 for causal Katz and linear attention students, as measured; 0: no window)",
        ),
        flag(
            "--stages",
            choices=["auto", "both", "attention", "end-to-end"],
            help="both: attention transfer (OUT/attention), then end to end (OUT); one stage alone writes OUT; auto: "
            "attention transfer only for a windowed language student (as measured), both otherwise",
        ),
        flag("--transfer-epochs", type=POSITIVE, help="epochs of attention transfer (default: 1)"),
        flag("--transfer-lr", type=RATE, help="learning rate of attention transfer (default: 1e-3)"),
        flag(
            "--transfer-loss",
            choices=("mse", "xent", "mse+xent"),
            help="attention transfer's loss: each layer's relative output MSE, Hedgehog's attention-weight "
            "cross-entropy (the learned :hedgehog maps alone) or both (docs/distill.md; default: mse)",
        ),
        flag(
            "--map-lr",
            type=RATE,
            help="attention transfer: the learned feature maps' (:hedgehog) learning rate, the rest of each "
            "converted layer at --transfer-lr (default: --transfer-lr's)",
        ),
        flag(
            "--gamma-lr",
            type=RATE,
            help="attention transfer: the learning rate of the discounts (theta = logit(gamma), one a head), the rest "
            "at --transfer-lr (default: --transfer-lr's)",
        ),
        flag("--lora-rank", type=NON_NEGATIVE, help="end to end: LoRA of this rank (0, the default: every weight)"),
        flag("--temperature", type=float, help="softening of both models' logits (default: 1)"),
        flag("--hard-weight", type=float, help="share of the label loss (0, the default: the teacher only)"),
        flag("--feature-weight", type=float, help="end to end: weight of each layer's output MSE (default: 0)"),
        IMG_SIZE_HW.but(help="input side (teacher's)"),
        SPLITS,
        flag("--context", type=POSITIVE, help="language models: tokens per training window (default: 128)"),
        flag("--train-windows", type=POSITIVE, help="language models: random windows an epoch (default: all)"),
        fit("learning rate of the end-to-end stage (default: 1e-4)", "epochs of the end-to-end stage (default: 10)"),
        runtime(),
    ),
    command(
        "eval",
        "top-1 / top-5 / loss of a checkpoint on a split",
        "linvit.evaluate:EvalConfig:run_eval",
        image_data(model_required=False),
        flag("--split"),
        checkpoint(
            "a run folder (its model.safetensors; the model comes from its args.yaml unless --model is given), "
            ".pth (ours, timm's, official WeightFormer) / .safetensors, or a `linvit export` .onnx (run in onnxruntime)"
        ),
        flag(
            "--ema",
            action=argparse.BooleanOptionalAction,
            help="evaluate the EMA weights of a checkpoint that holds them (default: yes), "
            "or --no-ema for the raw ones",
        ),
        convert(CHECKPOINT_SOURCE),
        COMPILE,
        PROGRESS,
        JSON,
    ),
    command(
        "explain",
        "importance maps, MoRF/LeRF, box ROC/PR-AUC, pointing game",
        "linvit.explain.run:ExplainConfig:run_explain",
        analysis(),
        flag("--boxes", help="boxes.json or a folder of VOC XML files (default DATA/boxes.json)"),
        flag("--method", help=METHODS_HELP),
        flag("--layer", help="layer index or 'mean'", check=_layer),
        flag("--steps", type=POSITIVE, help="perturbation steps"),
        flag("--tolerance", type=float, help="pointing-game tolerance in pixels"),
        flag("--batch-size", type=POSITIVE),
        output("output folder"),
    ),
    command(
        "spectral",
        "Linear-InfSA importance vs the Perron vector, spectral radius, truncation gap",
        "linvit.explain.run:SpectralConfig:run_spectral",
        analysis(),
        flag("--depth", type=POSITIVE, help="series truncation depth (default: number of InfSA layers)"),
        output("JSON file"),
    ),
    command(
        "erf",
        "effective receptive field heat map (RepLKNet protocol)",
        "linvit.explain.run:ErfConfig:run_erf",
        analysis(),
        output("output folder"),
    ),
    command(
        "generate train",
        "DDPM training of a DiT with any mixer (torchrun for DDP)",
        "linvit.generate.engine:GenerateConfig:run_generate_train",
        flag(
            "--data", required=True, help="digits:TASK[,canvas=..] (drawn digits, grey) or a folder DATA/train/<class>"
        ),
        flag("--mixer", type=_mixer, choices=DIT_MIXERS, help="the token mixer of every block"),
        flag("--size", choices=("tiny", "S", "B", "L", "XL"), help="DiT size (tiny: CPU)"),
        flag("--patch-size", type=POSITIVE),
        flag(
            "--resize-crop",
            old="--img-size",
            dest="img_size",
            type=POSITIVE,
            metavar="PX",
            help="image folders: resize and centre-crop to PX x PX (digits: their canvas)",
        ),
        flag(
            "--vae",
            metavar="DIR",
            help="latent diffusion: a diffusers AutoencoderKL folder on disk (save_pretrained); default pixel space",
        ),
        fit("AdamW learning rate, per-iteration cosine schedule (default: 1e-3 for tiny, DiT's 1e-4 for S and up)"),
        flag("--class-dropout", type=float, help="label dropout for classifier-free guidance"),
        flag(
            "--prediction",
            choices=("epsilon", "v_prediction"),
            help="what the DiT predicts: the noise (DiT's) or v = sqrt(a) eps - sqrt(1-a) x0",
        ),
        flag("--ema-decay", type=float),
        flag("--val-images", type=POSITIVE, help="validation images for the per-epoch val_loss"),
        runtime(),
    ),
    command(
        "generate sample",
        "a grid of samples of chosen classes from a generate train run",
        "linvit.generate.sample:SampleConfig:run_generate_sample",
        sampling("samples, the classes taken in turn"),
        flag("--classes", help="class indices, e.g. 0,1,2 (default: every class)"),
        flag("--side", old="--img-size", type=POSITIVE, metavar="PX", help="sample side (default: the run's)"),
        output("grid PNG (the samples also go to the same name .npz)"),
    ),
    command(
        "generate score",
        "samples judged by a linvit classifier: class accuracy and Frechet distance",
        "linvit.generate.score:ScoreConfig:run_generate_score",
        sampling("samples (classes in turn) and real val images"),
        flag("--classifier", required=True, help="a `linvit train` run folder trained on the same digits"),
        flag("--batch-size", type=POSITIVE),
        JSON.but(help="also write the numbers to this JSON file"),
    ),
    command(
        "segment train",
        "per-pixel cross-entropy training (torchrun for DDP)",
        "linvit.segment.engine:SegmentConfig:run_segment_train",
        segment_data(),
        dense_train(),
        flag(
            "--crop-size",
            type=int,
            nargs="+",
            metavar="PX",
            help="training crop: S or H W",
            check=_one_or_two("--crop-size", 1),
        ),
        flag("--scale", type=float, nargs=2, help="random resize range (x the crop side)"),
    ),
    command(
        "segment eval",
        "mIoU, pixel accuracy and per-class IoU of a checkpoint",
        "linvit.segment.engine:SegmentEvalConfig:run_segment_eval",
        segment_data(model_required=False),
        flag("--split", help="default: the run folder's val split, else val"),
        checkpoint(
            "a segment train run folder (the model comes from its args.yaml unless --model is given) or weights"
        ),
        convert(CHECKPOINT_SOURCE),
        flag("--macs-at", old="--flops-at", dest="flops_at", type=POSITIVE, metavar="PX", help="also GMACs at PX"),
        PROGRESS,
        JSON,
    ),
    command(
        "segment predict",
        "class maps and colour overlays of your own images",
        "linvit.prediction.dense:SegmentPredictConfig:run_segment_predict",
        dense_predict("segs.jsonl: one JSON line per image (path, size, share of pixels per class)"),
        resize("resize the shorter side to PX (default: the run's)"),
    ),
    command(
        "detect train",
        "train a detector on COCO-format data (torchrun for DDP)",
        "linvit.detect.engine:DetectConfig:run_detect_train",
        detect_data(),
        dense_train(),
    ),
    command(
        "detect eval",
        "detections.json and the 12 COCO numbers (pycocotools COCOeval)",
        "linvit.detect.engine:DetectEvalConfig:run_detect_eval",
        detect_data(model_required=False),
        flag("--split", help="default: the run folder's val split, else val2017"),
        flag("--ann-file", help="any COCO instances json (instead of DATA/annotations/...)"),
        flag("--images", help="its image folder (default: the json's folder)"),
        checkpoint("a detect train run folder (the model comes from its args.yaml) or weights"),
        convert(CHECKPOINT_SOURCE),
        PROGRESS,
        output("folder for detections.json and metrics.json"),
    ),
    command(
        "detect predict",
        "boxes, labels and scores (masks for Mask R-CNN) on your own images",
        "linvit.prediction.dense:DetectPredictConfig:run_detect_predict",
        dense_predict("dets.jsonl: one JSON line per image (path, size, boxes, labels, scores)"),
        flag("--score-thresh", type=float, help="keep detections scoring at least this"),
    ),
    command(
        "predict",
        "top-k classes of your own images (files, folders, globs) at any size",
        "linvit.prediction.classify:PredictConfig:run_predict",
        IMAGES,
        model("model name (any timm form, :variant); without it --checkpoint is a run folder", required=False),
        checkpoint("a run folder, weights for --model (.pth / .safetensors), or a `linvit export` .onnx"),
        Group(
            None,
            (
                IMG_SIZE_HW.but(help="resize to H [W]"),
                flag("--native", action="store_true", help="each image at its own size, rounded to the patch grid"),
            ),
            exclusive=True,
        ),
        MAX_PIXELS,
        flag("--topk", type=POSITIVE),
        output("preds.jsonl: one JSON line per image (path, size, top-k, seconds: its read, batch share, map)", False),
        flag("--batch-size", type=POSITIVE, help="images read together; equal sizes run as a batch"),
        flag(
            "--maps",
            metavar="DIR",
            help="per image: its importance map over the picture (DIR/<name>.png, original size) and raw (.npy)",
        ),
        flag("--method", help=f"map method: {METHODS_HELP}"),
        PREDICT_AMP,
        DEVICE,
        COMPILE,
        PROGRESS.but(help="a bar over the images"),
    ),
    command(
        "demo",
        "a local web page: upload a picture, see top-k and maps of one or two runs",
        "linvit.demo:DemoConfig:run_demo",
        checkpoint("one or two run folders to compare").but(nargs="+", metavar="RUN"),
        flag("--model", help="without --checkpoint: this model with random weights"),
        flag("--topk", type=POSITIVE),
        PREDICT_AMP.but(help="the top-k's autocast precision, as predict's (maps stay float32)"),
        flag("--host", help="address to listen on (default: this machine only)"),
        flag("--port", type=POSITIVE),
    ),
    command(
        "export",
        "ONNX / torch.export (.pt2) / TorchScript file, checked against PyTorch",
        "linvit.export:ExportConfig:run_export",
        model("registered model name, or a `linvit train` run folder (its trained weights)"),
        flag(
            "--format",
            choices=["onnx", "pt2", "torchscript"],
            help="default: from --output's suffix (.onnx, .pt2, .pt / .ts = TorchScript)",
        ),
        IMG_SIZE_HW.but(help="input side, or H W (default: a run folder's own size, else the model's)"),
        flag(
            "--dynamic-batch",
            action="store_true",
            help="any batch size for onnx and pt2 (TorchScript always); checked at 1 and 3",
        ),
        flag(
            "--dynamic-size",
            action="store_true",
            help="any H and W on the model's grid for onnx and pt2 (TorchScript always); checked across the range",
        ),
        flag(
            "--quantize",
            choices=["int8"],
            help="onnx: also write OUT.int8.onnx, onnxruntime's dynamic quantization (int8 weights)",
        ),
        output("output file"),
    ),
    command(
        "reproduce",
        "every family trained on the digit tasks, evaluated, mapped, benchmarked -> OUT/report.md",
        "linvit.reproduce:ReproduceConfig:run_reproduce",
        Group(
            None,
            (
                flag(
                    "--quick", action="store_true", help="one seed of the digit task: about 11 minutes on 2 CPU cores"
                ),
                flag(
                    "--full", action="store_true", help="3 seeds of both tasks and a learning-rate sweep (the default)"
                ),
            ),
            exclusive=True,
        ),
        flag(
            "--report-only",
            action="store_true",
            help="run nothing: write the report from the stages already finished in --output (a run stopped part-way)",
        ),
        DEVICE.but(help="where training and benchmarks run: default cpu (the recorded reports); auto: cuda if seen"),
        output("output folder; re-running with it reuses finished stages"),
        execute=True,
    ),
)
