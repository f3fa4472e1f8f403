"""The `linvit` command line: one subcommand per task, each with --help and a one-line error on bad input.

A top-level module rather than part of the ``linvit`` package: ``import linvit`` imports torch and timm (it
registers the models), which takes seconds, and printing ``--help`` should not. Each command is a small function
below (``_train``, ``_predict``, ...) that imports its handler and config only when it runs, builds the config
from the parsed flags (``XConfig.from_mapping(vars(args))``) and calls the handler with it: argparse stops here.

Renamed flags keep their old spelling for one release, hidden from --help, with a one-line note on stderr
(``_add_renamed``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


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


def _parse_kwargs(pairs: list[str]) -> dict:
    """['k=v', ...] -> {k: v} with v parsed as JSON when possible (numbers, true/false), else a string.
    A dict (from --config or a run's args.yaml) is taken as it is (copied: the parser's default stays {})."""
    if isinstance(pairs, dict):
        return dict(pairs)
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _usage(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _usage(message: str) -> ValueError:
    """linvit.errors.UsageError(message): bad input, shown as one line (imported when a command runs)."""
    from linvit.errors import UsageError

    return UsageError(message)


def _set_threads(args: argparse.Namespace) -> None:
    """--threads N: torch's intra-op CPU threads for this command (on a machine busy with other work, fewer
    threads than cores avoid oversubscription)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _prepare(args: argparse.Namespace, *checks) -> argparse.Namespace:
    """--threads applied, --model-kwargs parsed, --pretrained folded into them, each check run (a check may
    normalise its flag)."""
    _set_threads(args)
    if hasattr(args, "model_kwargs"):
        args.model_kwargs = _parse_kwargs(args.model_kwargs)
        if getattr(args, "pretrained", False):
            args.model_kwargs["pretrained"] = True
    for check in checks:
        check(args)
    return args


def _config(config_class, args: argparse.Namespace, *checks):
    """The command's config (a linvit.config.Config) from its parsed flags, after _prepare."""
    return config_class.from_mapping(vars(_prepare(args, *checks)))


def _deprecated(old: str, new: str) -> None:
    print(f"linvit: {old} is deprecated, use {new} ({old} goes in the next release)", file=sys.stderr)


class _OldSpelling(argparse.Action):
    """A renamed flag's old spelling: hidden from --help, it stores into the new flag's dest and says so."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.update(help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string, self.new)
        setattr(namespace, self.dest, values)


def _add_renamed(p, new: str, old: str, **kwargs) -> argparse.Action:
    """The flag ``new`` (as add_argument takes it) and ``old``, its previous spelling, kept for one release:
    either satisfies required=True, both at once is an error."""
    group = p.add_mutually_exclusive_group(required=kwargs.pop("required", False))
    action = group.add_argument(new, **kwargs)
    same = {k: getattr(action, k) for k in ("dest", "type", "nargs", "choices", "metavar")}
    group.add_argument(old, action=_OldSpelling, new=new, **same)
    return action


def _add_output_arg(p, help: str, required: bool = True) -> None:
    """--output, the one name of every command's output (a file or a folder); --out is its old spelling."""
    _add_renamed(p, "--output", "--out", required=required, default=None, help=help)


def _layer_arg(args: argparse.Namespace) -> None:
    args.layer = args.layer if args.layer == "mean" else int(args.layer)


def _add_model_args(p: argparse.ArgumentParser, model_help: str, kwargs_help: str, required: bool = True) -> None:
    """--model and --model-kwargs, one group for every command that builds a model."""
    group = p.add_argument_group("model")
    group.add_argument("--model", required=required, default=None, help=model_help)
    group.add_argument("--model-kwargs", nargs="*", default={}, metavar="K=V", help=kwargs_help)
    group.add_argument(
        "--pretrained",
        action="store_true",
        help="the model's published weights through timm's Hub path (WeightFormer T/S/B: RuizeHe/weightformer-*); "
        "a model without any says so",
    )


def _add_runtime_args(p: argparse.ArgumentParser, batch_size: int) -> None:
    """Batch, data loading and device flags shared by training and evaluation commands."""
    group = p.add_argument_group("runtime")
    group.add_argument("--batch-size", type=POSITIVE, default=batch_size, help="images per process")
    group.add_argument(
        "--workers", type=NON_NEGATIVE, default=min(4, os.cpu_count() or 1), help="data-loading processes"
    )
    _add_device_args(group)


def _add_device_args(p) -> None:
    """--amp and --device, for every command that runs a model."""
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none", help="autocast precision")
    _add_device_arg(p)


DEVICES = ("auto", "cpu", "cuda")  # auto: cuda when torch sees one (linvit.distributed.resolve_device)


def _add_device_arg(p, default: str = "auto", help: str = "auto: cuda when torch sees one, else cpu") -> None:
    """--device, the same choices in every command (bench and reproduce default to cpu, and say so)."""
    p.add_argument("--device", choices=DEVICES, default=default, help=help)


MODEL_HELP = "registered model name, optionally with a :variant suffix"
# linvit.conversion.FORMS and linvit.models.dit.dit_mixers() as linvit registers them, without importing torch
# (tests/test_cli_consistency.py checks they are the same): the variants, a stabilised Linear-InfSA
# (docs/spec/infsa.md 3.1), Katz-InfSA's other feature maps (the learned "hedgehog" one: layers.feature_maps) and
# the anchor form, plain linear attention (layers.linear_attention)
BUILTIN_FORMS = ("pure_infsa", "linear_infsa", "katz_infsa", "linear_attention")
BUILTIN_FORMS += ("linear_infsa:floor", "linear_infsa:softplus", "linear_infsa:elu+1")
BUILTIN_FORMS += ("katz_infsa:elu+1", "katz_infsa:hedgehog", "linear_attention:relu", "linear_attention:hedgehog")
BUILTIN_DIT_MIXERS = ("softmax", "pure_infsa", "linear_infsa", "katz_infsa", "linear_attention", "weightformer")


class _Registered:
    """argparse choices read from linvit's mixer registry (linvit.mixers), so a mixer registered in this process
    is one: a value is checked against the registry (loading linvit, which the command runs anyway), and --help,
    which must not load torch, lists the built-in ones until linvit is loaded."""

    def __init__(self, builtin: tuple[str, ...], dit: bool = False) -> None:
        self.builtin, self.dit = builtin, dit

    def registered(self) -> tuple[str, ...]:
        from linvit.mixers import conversion_forms
        from linvit.models.dit import dit_mixers

        return dit_mixers() if self.dit else conversion_forms()

    def __contains__(self, value) -> bool:
        return value in self.registered()

    def __iter__(self):
        return iter(self.registered() if "linvit.mixers" in sys.modules else self.builtin)


CONVERT_VARIANTS = _Registered(BUILTIN_FORMS)
DIT_MIXERS = _Registered(BUILTIN_DIT_MIXERS, dit=True)


def _add_convert_arg(p: argparse.ArgumentParser, source: str = "--pretrained-file") -> None:
    p.add_argument(
        "--convert",
        choices=CONVERT_VARIANTS,
        default=None,
        help=f"convert the model's softmax attention to InfSA (linvit.convert) after loading {source}",
    )


KWARGS_HELP = "extra timm.create_model kwargs"
CHECKPOINT_SOURCE = "--checkpoint (softmax weights; a converted run's weights load after it)"
METHODS_HELP = "linear|column|katz|perron|cls|rollout|grad (default: the model's own)"


def _add_analysis_args(p: argparse.ArgumentParser, limit: int) -> None:
    p.add_argument(
        "--data",
        required=True,
        help="ImageNet-layout folder (DIR/<split>/<class>/*), any folder of pictures, or digits:TASK,..., wds:, hfds:",
    )
    p.add_argument("--split", default="val", help="DATA/SPLIT when it exists, else DATA itself")
    _add_model_args(p, MODEL_HELP + "; without it --checkpoint is a run folder", KWARGS_HELP, False)
    p.add_argument(
        "--checkpoint", default=None, help="a run folder, or weights for --model (.pth/.safetensors); default: random"
    )
    p.add_argument("--img-size", type=POSITIVE, nargs="+", default=None, metavar="PX", help="input side, or H W")
    p.add_argument("--crop-pct", type=float, default=None)
    p.add_argument("--limit", type=POSITIVE, default=limit, help="images used (spread evenly over the split)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the model's initialisation (without --checkpoint) and of the figures' class-spread sample",
    )


def _add_common_data_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument("--data", required=True, help="root of an ImageNet-layout folder (DIR/<split>/<class>/*)")
    model_help = MODEL_HELP if model_required else MODEL_HELP + " (default: the run's, with --checkpoint RUN)"
    _add_model_args(p, model_help, KWARGS_HELP, required=model_required)
    p.add_argument("--img-size", type=POSITIVE, default=None, help="input side (default: the model's)")
    p.add_argument("--crop-pct", type=float, default=None, help="eval centre-crop fraction (default: the model's)")
    _add_runtime_args(p, batch_size=64)


def _add_compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        choices=["off", "default", "reduce-overhead", "max-autotune"],
        default="off",
        help="torch.compile the model (one static graph per input size; reduce-overhead adds CUDA graphs)",
    )


def _add_segment_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument("--data", required=True, help="ADE20K folder (images/, annotations/) or a folder with masks/")
    backbone = "backbone: any registered linvit or timm ViT name"
    if not model_required:
        backbone += " (default: the run's, with --checkpoint RUN)"
    _add_model_args(p, backbone, "extra backbone kwargs", required=model_required)
    _add_resize_arg(p, "evaluation: resize the shorter side to PX (default: each image as it is)")
    _add_runtime_args(p, batch_size=8)
    p.add_argument("--pyramid-channels", type=POSITIVE, default=256)
    p.add_argument("--head-channels", type=POSITIVE, default=128)


def _add_resize_arg(p: argparse.ArgumentParser, help: str) -> None:
    """--resize PX: the shorter side segmentation resizes pictures to (it was --img-size, which elsewhere is the
    model's input size); the config keeps the run folders' name, img_size."""
    _add_renamed(p, "--resize", "--img-size", dest="img_size", type=POSITIVE, default=None, metavar="PX", help=help)


def _add_detect_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument("--data", required=True, help="COCO-layout folder: annotations/instances_<split>.json + <split>/")
    backbone = "backbone: any registered linvit or timm ViT name"
    if not model_required:
        backbone += " (default: the run's, with --checkpoint RUN)"
    _add_model_args(p, backbone, "extra backbone kwargs", required=model_required)
    p.add_argument("--detector", choices=["fasterrcnn", "retinanet", "maskrcnn"], default="fasterrcnn")
    p.add_argument("--min-size", type=POSITIVE, default=800, help="resize the shorter side to this (COCO: 800)")
    p.add_argument("--max-size", type=POSITIVE, default=1333, help="... keeping the longer side at most this")
    p.add_argument("--anchor-base", type=POSITIVE, default=32, help="anchor size of the finest level (x2 per level)")
    p.add_argument("--pyramid-channels", type=POSITIVE, default=256)
    _add_runtime_args(p, batch_size=2)


def _add_dense_predict_args(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("images", nargs="+", help="image files, folders (searched recursively) or glob patterns")
    p.add_argument("--checkpoint", required=True, help="the run folder of a finished training run")
    _add_output_arg(p, out_help, required=False)
    p.add_argument("--draw", default=None, metavar="DIR", help="drawn pictures: DIR/<name>.png at each image's size")
    p.add_argument("--max-pixels", type=POSITIVE, default=None, help="refuse larger images (default 2^28)")
    _add_device_args(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar over the images")


def _add_fit_args(p: argparse.ArgumentParser, *, epochs: int, lr, warmup_epochs: int, **defaults) -> None:
    """The flags of the one trainer (linvit.config.TrainConfig), the same in every training command; defaults
    (weight_decay, clip_grad, min_lr, warmup_lr, lr_help) are the task's."""
    group = p.add_argument_group("training schedule (every training command)")
    group.add_argument("--output", required=True, help="run folder: metrics.jsonl, last.pth, model.safetensors")
    group.add_argument("--epochs", type=POSITIVE, default=epochs)
    group.add_argument("--lr", type=float, default=lr, help=defaults.get("lr_help", "learning rate"))
    group.add_argument("--opt", default="adamw", help="timm optimizer name")
    group.add_argument("--weight-decay", type=float, default=defaults.get("weight_decay", 0.05))
    group.add_argument("--warmup-epochs", type=NON_NEGATIVE, default=warmup_epochs)
    group.add_argument(
        "--warmup-lr", type=float, default=defaults.get("warmup_lr"), help="warm-up start (default lr / 1000)"
    )
    group.add_argument("--min-lr", type=float, default=defaults.get("min_lr"), help="cosine end (default lr / 100)")
    group.add_argument("--clip-grad", type=float, default=defaults.get("clip_grad"), help="max gradient norm")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--resume", default=None, help="'auto' (OUT/last.pth or OUT/last/ if present) or a checkpoint")
    group.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms")
    group.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bar per epoch")
    group.add_argument(
        "--strategy",
        choices=["ddp", "fsdp"],
        default="ddp",
        help="with torchrun: ddp (whole model per rank) or fsdp (parameters, gradients, optimizer sharded)",
    )
    group.add_argument(
        "--shard-size",
        type=POSITIVE,
        default=None,
        help="fsdp: shard within groups of this many ranks (say, one node), replicate across them (default: all)",
    )
    group.add_argument(
        "--grad-checkpointing", action="store_true", help="recompute each block in backward (less activation memory)"
    )
    _add_log_arg(group)
    _add_compile_arg(group)


def _add_dense_train_args(p: argparse.ArgumentParser, splits: tuple[str, str], epochs: int) -> None:
    """The flags segment train and detect train share (AdamW at 1e-4, cosine per iteration, starting weights)."""
    _add_fit_args(p, epochs=epochs, lr=1e-4, warmup_epochs=1, lr_help="AdamW learning rate (per-iteration cosine)")
    p.add_argument("--train-split", default=splits[0])
    p.add_argument("--val-split", default=splits[1])
    p.add_argument("--hflip", type=float, default=0.5, help="horizontal-flip probability")
    p.add_argument(
        "--backbone-checkpoint",
        "--pretrained-file",
        default=None,
        help="classification weights to start the backbone from (its head is dropped)",
    )
    _add_convert_arg(p)


def _mixer(text: str) -> str:
    """argparse type of generate's --mixer: the old linear, pure, katz (with a note) -> linear_infsa, ..."""
    if text in ("linear", "pure", "katz"):
        _deprecated(f"--mixer {text}", f"--mixer {text}_infsa")
        return f"{text}_infsa"
    return text


def _check_crop(args: argparse.Namespace) -> None:
    if len(args.crop_size) not in (1, 2) or min(args.crop_size) < 1:
        raise _usage(f"--crop-size takes one side or H W, got {args.crop_size}")


def _check_optional_img_size(args: argparse.Namespace) -> None:
    if args.img_size is not None:
        _check_img_size(args)


def _check_img_size(args: argparse.Namespace) -> None:
    if len(args.img_size) not in (1, 2):
        raise _usage(f"--img-size takes one side or H W, got {args.img_size}")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    _add_common_data_args(p)
    _add_fit_args(
        p,
        epochs=300,
        lr=None,
        warmup_epochs=5,
        min_lr=1e-5,
        warmup_lr=1e-6,
        lr_help="absolute learning rate (default: base-lr * batch / 512)",
    )
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--base-lr", type=float, default=5e-4, help="learning rate per 512 images of global batch")
    p.add_argument("--drop-path", type=float, default=0.1, help="stochastic depth rate")
    p.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], help="RandomResizedCrop area range")
    p.add_argument("--ratio", type=float, nargs=2, default=[3 / 4, 4 / 3], help="RandomResizedCrop aspect range")
    p.add_argument("--hflip", type=float, default=0.5, help="horizontal-flip probability")
    p.add_argument("--aa", default="rand-m9-mstd0.5-inc1", help="RandAugment policy ('none' to disable)")
    p.add_argument("--color-jitter", type=float, default=0.3, help="used only when --aa none")
    p.add_argument("--reprob", type=float, default=0.25, help="random-erasing probability")
    p.add_argument("--mixup", type=float, default=0.8, help="mixup alpha (0 = off)")
    p.add_argument("--cutmix", type=float, default=1.0, help="cutmix alpha (0 = off)")
    p.add_argument("--smoothing", type=float, default=0.1, help="label smoothing")
    p.add_argument("--interpolation", default="bicubic")
    p.add_argument(
        "--model-ema", action=argparse.BooleanOptionalAction, default=False, help="keep an EMA of the weights"
    )
    p.add_argument("--model-ema-decay", type=float, default=0.99996)


def _add_sampling_args(p: argparse.ArgumentParser, num: int, num_help: str) -> None:
    """The flags of every command that samples a `generate train` run: which run, how many, how (DDIM)."""
    p.add_argument("--checkpoint", required=True, help="the run folder of a finished `linvit generate train`")
    p.add_argument("--num", type=POSITIVE, default=num, help=num_help)
    p.add_argument("--steps", type=POSITIVE, default=50, help="DDIM steps")
    p.add_argument("--guidance", type=float, default=2.0, help="classifier-free guidance scale (1 = none)")
    p.add_argument("--seed", type=int, default=0)
    _add_device_arg(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a progress bar")


def _add_log_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log",
        choices=["none", "tensorboard"],
        default="none",
        help="also write the per-epoch numbers to OUT/tensorboard (metrics.jsonl is always written)",
    )


def _add_models_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list registered models with parameter counts")
    p.add_argument("--filter", default="", help="wildcard filter, e.g. '*linear*'")
    p.add_argument("--macs", action="store_true", help="also count multiply-accumulates (torch flop counter)")
    p.add_argument(
        "--ops", action="store_true", help="also count the ATen operators one inference forward launches (no_grad)"
    )
    _add_renamed(
        p,
        "--macs-at",
        "--img-size",
        type=POSITIVE,
        default=224,
        metavar="PX",
        help="square input side of --macs, --ops",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_models)


def _add_bench_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="speed / memory / FLOPs / energy sweep, one subprocess per point")
    p.add_argument(
        "--models", type=_csv(str), default=None, help="comma list; 'name:variant', e.g. vit_4l_patch16_224:naive"
    )
    p.add_argument(
        "--suite", default=None, help="a recorded table of docs/benchmarks.md by name, 'all' (CPU tables) or 'gpu'"
    )
    p.add_argument("--res", type=_csv(int), default=[224, 512, 1024], help="comma list of square input sides")
    p.add_argument(
        "--batch", type=_csv(int), default=None, help="comma list of batch sizes, e.g. 1,32 (latency and throughput)"
    )
    p.add_argument(
        "--compile",
        type=_csv(str),
        default=None,
        metavar="MODES",
        help="comma list of off|default|reduce-overhead|max-autotune (default off); compile time is recorded apart",
    )
    p.add_argument("--min-time", type=float, default=0.0, help="time each point for at least this many seconds")
    p.add_argument("--dry-run", action="store_true", help="with --suite: every point at 32 px, one iteration")
    p.add_argument("--mode", choices=["infer", "train"], default="infer", help="forward only, or forward+backward")
    p.add_argument(
        "--task",
        choices=["classify", "segment", "detect", "generate"],
        default="classify",
        help="the classifier; backbone + pyramid + semantic-FPN head (150 classes) as in `linvit segment`; the "
        "whole Faster R-CNN (81 classes) of `linvit detect` at res x res*1333/800, inference; or a DiT (--models "
        "are mixers, --res the latent side; default DiT-S/2, 4 channels): infer = one guided sampling step",
    )
    _add_device_arg(p, "cpu", "default cpu (the recorded CPU tables); auto: cuda when torch sees one")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="non-fp32 runs under autocast")
    p.add_argument(
        "--runtime",
        choices=["eager", "onnxruntime"],
        default="eager",
        help="onnxruntime: also each point's graph exported to ONNX at its size, timed in onnxruntime (fp32 CPU)",
    )
    p.add_argument(
        "--warmup",
        type=NON_NEGATIVE,
        default=1,
        help="untimed iterations (the first counts FLOPs; 0 = no warm-up, no FLOPs)",
    )
    p.add_argument("--iters", type=POSITIVE, default=5, help="timed iterations")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per point before it is recorded as timeout")
    p.add_argument("--mem-limit", type=float, default=None, help="GB per point; above it the point is 'oom'")
    p.add_argument("--ladder", action="store_true", help="per model, double the first --res until a point fails")
    p.add_argument("--reference", type=_csv(str), default=[], help="models to report speed-ups against (comma list)")
    p.add_argument("--model-kwargs", nargs="*", default={}, metavar="K=V", help="extra timm.create_model kwargs")
    _add_output_arg(p, "output folder")
    p.set_defaults(func=_bench)


def _add_data_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="build the embedded datasets (offline)")
    data_sub = p.add_subparsers(dest="dataset", required=True)
    d = data_sub.add_parser("cluttered-mnist", help="MNIST digits on a cluttered canvas, with boxes.json")
    _add_output_arg(d, "the dataset folder")
    d.add_argument("--canvas", type=int, default=64, help="canvas side in pixels (>= 28)")
    d.add_argument("--per-class-train", type=POSITIVE, default=300)
    d.add_argument("--per-class-val", type=POSITIVE, default=100)
    d.add_argument("--clutter", type=int, default=4, help="clutter fragments per image")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument(
        "--digits-per-image",
        type=NON_NEGATIVE,
        default=0,
        metavar="K",
        help="also write OUTPUT/detection: K digits per canvas with COCO boxes and masks (0 = no detection set)",
    )
    d.set_defaults(func=_cluttered_mnist)
    d = data_sub.add_parser(
        "digits",
        help="the fixed val / test / shifted canvases of a drawn digit task (what --data digits:TASK draws), "
        "with boxes.json",
    )
    _add_output_arg(d, "the dataset folder")
    d.add_argument(
        "--task",
        choices=("digit", "max", "sum"),
        default="digit",
        help="the label: the digit, max(a, b), (a + b) mod 10",
    )
    d.add_argument("--canvas", type=POSITIVE, default=48, help="canvas side in pixels (max, sum: >= 64)")
    d.add_argument("--clutter", type=NON_NEGATIVE, default=2, help="clutter fragments (the shifted split: 2k + 2)")
    d.add_argument("--seed", type=int, default=0, help="the digit split and every canvas")
    d.set_defaults(func=_digit_folder)


def _add_train_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train with the DeiT recipe (torchrun for DDP)")
    _add_train_args(p)
    p.add_argument("--pretrained-file", default=None, help="start from these weights (.pth/.safetensors; timm's path)")
    _add_convert_arg(p)
    p.set_defaults(func=_train)


def _add_distill_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distill", help="linearize a pretrained softmax model: attention transfer, then distillation (torchrun)"
    )
    p.add_argument(
        "--teacher",
        required=True,
        help="timm name, linvit run folder, torchvision:NAME or hf:PATH (image classifier or causal LM)",
    )
    p.add_argument("--teacher-file", default=None, help="the teacher's weights (.pth/.safetensors) for a model name")
    p.add_argument("--pretrained", action="store_true", help="the teacher's published weights (timm's Hub path)")
    p.add_argument("--model-kwargs", nargs="*", default={}, metavar="K=V", help="extra kwargs of a timm teacher")
    p.add_argument(
        "--data", required=True, help="images: DIR/<split>/<class>/* or digits:...; text (LM): a .txt file or folder"
    )
    p.add_argument(
        "--mixer",
        choices=CONVERT_VARIANTS,
        default="katz_infsa:hedgehog",
        help="the student's attention (docs/distill.md)",
    )
    p.add_argument(
        "--gamma-init",
        type=float,
        default=None,
        help="the converted layers' first discount (default: 0.5 for katz_infsa, at softmax's scale; else 0.9)",
    )
    p.add_argument(
        "--feature-dim", type=POSITIVE, default=None, help="a learned feature map's size f (hedgehog; default head dim)"
    )
    p.add_argument(
        "--window",
        type=NON_NEGATIVE,
        default=None,
        help="causal LMs: exact softmax over the last W tokens, the mixer over older ones "
        "(default: 64 for causal Katz and linear attention students, as measured; 0: no window)",
    )
    p.add_argument(
        "--stages",
        choices=["auto", "both", "attention", "end-to-end"],
        default="auto",
        help="attention transfer (OUT/attention), then end to end (OUT); auto: attention transfer only for a "
        "windowed language student (as measured), both otherwise",
    )
    p.add_argument("--transfer-epochs", type=POSITIVE, default=1, help="epochs of attention transfer")
    p.add_argument("--transfer-lr", type=float, default=1e-3, help="learning rate of attention transfer")
    p.add_argument("--lora-rank", type=NON_NEGATIVE, default=0, help="end to end: LoRA of this rank (0: every weight)")
    p.add_argument("--temperature", type=float, default=1.0, help="softening of both models' logits")
    p.add_argument("--hard-weight", type=float, default=0.0, help="share of the label loss (0: the teacher only)")
    p.add_argument("--feature-weight", type=float, default=0.0, help="weight of each layer's output MSE")
    p.add_argument("--img-size", type=POSITIVE, nargs="+", default=None, metavar="PX", help="input side (teacher's)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--context", type=POSITIVE, default=128, help="language models: tokens per training window")
    p.add_argument(
        "--train-windows", type=POSITIVE, default=None, help="language models: random windows an epoch (default: all)"
    )
    _add_fit_args(p, epochs=10, lr=1e-4, warmup_epochs=0, lr_help="learning rate of the end-to-end stage")
    _add_runtime_args(p, batch_size=64)
    p.set_defaults(func=_distill)


def _add_eval_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="top-1 / top-5 / loss of a checkpoint on a split")
    _add_common_data_args(p, model_required=False)
    p.add_argument("--split", default="val")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="a run folder (its model.safetensors; the model comes from its args.yaml unless --model is given), "
        ".pth (ours, timm's, official WeightFormer) / .safetensors, or a `linvit export` .onnx (run in onnxruntime)",
    )
    p.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="evaluate the EMA weights of a checkpoint that holds them (default: yes), or --no-ema for the raw ones",
    )
    _add_convert_arg(p, CHECKPOINT_SOURCE)
    _add_compile_arg(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar over the batches")
    p.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    p.set_defaults(func=_eval)


def _add_explain_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="importance maps, MoRF/LeRF, box ROC/PR-AUC, pointing game")
    _add_analysis_args(p, limit=64)
    p.add_argument("--boxes", default=None, help="boxes.json or a folder of VOC XML files (default DATA/boxes.json)")
    p.add_argument("--method", default=None, help=METHODS_HELP)
    p.add_argument("--layer", default="mean", help="layer index or 'mean'")
    p.add_argument("--steps", type=POSITIVE, default=10, help="perturbation steps")
    p.add_argument("--tolerance", type=float, default=15.0, help="pointing-game tolerance in pixels")
    p.add_argument("--batch-size", type=POSITIVE, default=16)
    _add_output_arg(p, "output folder")
    p.set_defaults(func=_explain)


def _add_spectral_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spectral", help="Linear-InfSA importance vs the Perron vector, spectral radius, truncation gap")
    _add_analysis_args(p, limit=8)
    p.add_argument(
        "--depth", type=POSITIVE, default=None, help="series truncation depth (default: number of InfSA layers)"
    )
    _add_output_arg(p, "JSON file")
    p.set_defaults(func=_spectral)


def _add_erf_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("erf", help="effective receptive field heat map (RepLKNet protocol)")
    _add_analysis_args(p, limit=16)
    _add_output_arg(p, "output folder")
    p.set_defaults(func=_erf)


def _add_generate_train_command(gen: argparse._SubParsersAction) -> None:
    t = gen.add_parser("train", help="DDPM training of a DiT with any mixer (torchrun for DDP)")
    t.add_argument(
        "--data", required=True, help="digits:TASK[,canvas=..] (drawn digits, grey) or a folder DATA/train/<class>"
    )
    t.add_argument(
        "--mixer",
        type=_mixer,
        choices=DIT_MIXERS,
        default="softmax",
        help="the token mixer of every block",
    )
    t.add_argument("--size", choices=("tiny", "S", "B", "L", "XL"), default="tiny", help="DiT size (tiny: CPU)")
    t.add_argument("--patch-size", type=POSITIVE, default=4)
    _add_renamed(
        t,
        "--resize-crop",
        "--img-size",
        dest="img_size",
        type=POSITIVE,
        default=None,
        metavar="PX",
        help="image folders: resize and centre-crop to PX x PX (digits: their canvas)",
    )
    t.add_argument(
        "--vae",
        default=None,
        metavar="DIR",
        help="latent diffusion: a diffusers AutoencoderKL folder on disk (save_pretrained); default pixel space",
    )
    _add_fit_args(
        t,
        epochs=30,
        lr=None,
        warmup_epochs=1,
        weight_decay=0.0,
        clip_grad=1.0,
        lr_help="AdamW learning rate, per-iteration cosine schedule (default: 1e-3 for tiny, DiT's 1e-4 for S and up)",
    )
    t.add_argument("--class-dropout", type=float, default=0.1, help="label dropout for classifier-free guidance")
    t.add_argument(
        "--prediction",
        choices=("epsilon", "v_prediction"),
        default="epsilon",
        help="what the DiT predicts: the noise (DiT's) or v = sqrt(a) eps - sqrt(1-a) x0",
    )
    t.add_argument("--ema-decay", type=float, default=0.999)
    t.add_argument("--val-images", type=POSITIVE, default=500, help="validation images for the per-epoch val_loss")
    _add_runtime_args(t, batch_size=64)
    t.set_defaults(func=_generate_train)


def _add_generate_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="class-conditional image generation: diffusion transformers (DiT)")
    gen = p.add_subparsers(dest="generate_command", required=True)
    _add_generate_train_command(gen)
    s = gen.add_parser("sample", help="a grid of samples of chosen classes from a generate train run")
    _add_sampling_args(s, num=64, num_help="samples, the classes taken in turn")
    s.add_argument("--classes", default=None, help="class indices, e.g. 0,1,2 (default: every class)")
    _add_renamed(
        s, "--side", "--img-size", type=POSITIVE, default=None, metavar="PX", help="sample side (default: the run's)"
    )
    _add_output_arg(s, "grid PNG (the samples also go to the same name .npz)")
    s.set_defaults(func=_generate_sample)
    s = gen.add_parser("score", help="samples judged by a linvit classifier: class accuracy and Frechet distance")
    _add_sampling_args(s, num=500, num_help="samples (classes in turn) and real val images")
    s.add_argument("--classifier", required=True, help="a `linvit train` run folder trained on the same digits")
    s.add_argument("--batch-size", type=POSITIVE, default=100)
    s.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    s.set_defaults(func=_generate_score)


def _add_segment_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("segment", help="semantic segmentation: backbone + simple feature pyramid + semantic-FPN head")
    seg = p.add_subparsers(dest="segment_command", required=True)
    t = seg.add_parser("train", help="per-pixel cross-entropy training (torchrun for DDP)")
    _add_segment_args(t)
    _add_dense_train_args(t, splits=("train", "val"), epochs=50)
    t.add_argument("--crop-size", type=int, nargs="+", default=[512], metavar="PX", help="training crop: S or H W")
    t.add_argument("--scale", type=float, nargs=2, default=[0.5, 2.0], help="random resize range (x the crop side)")
    t.set_defaults(func=_segment_train)
    e = seg.add_parser("eval", help="mIoU, pixel accuracy and per-class IoU of a checkpoint")
    _add_segment_args(e, model_required=False)
    e.add_argument("--split", default="val")
    e.add_argument(
        "--checkpoint",
        default=None,
        help="a segment train run folder (the model comes from its args.yaml unless --model is given) or weights",
    )
    _add_convert_arg(e, CHECKPOINT_SOURCE)
    _add_renamed(
        e,
        "--macs-at",
        "--flops-at",
        dest="flops_at",
        type=POSITIVE,
        default=None,
        metavar="PX",
        help="also GMACs at PX",
    )
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar over the batches")
    e.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    e.set_defaults(func=_segment_eval)

    e = seg.add_parser("predict", help="class maps and colour overlays of your own images")
    _add_dense_predict_args(e, "segs.jsonl: one JSON line per image (path, size, share of pixels per class)")
    _add_resize_arg(e, "resize the shorter side to PX (default: the run's)")
    e.set_defaults(func=_segment_predict)


def _add_detect_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("detect", help="object detection: Faster R-CNN / RetinaNet / Mask R-CNN on a backbone's pyramid")
    det = p.add_subparsers(dest="detect_command", required=True)
    t = det.add_parser("train", help="train a detector on COCO-format data (torchrun for DDP)")
    _add_detect_args(t)
    _add_dense_train_args(t, splits=("train2017", "val2017"), epochs=12)
    t.set_defaults(func=_detect_train)
    e = det.add_parser("eval", help="detections.json and the 12 COCO numbers (pycocotools COCOeval)")
    _add_detect_args(e, model_required=False)
    e.add_argument("--split", default="val2017")
    e.add_argument("--ann-file", default=None, help="any COCO instances json (instead of DATA/annotations/...)")
    e.add_argument("--images", default=None, help="its image folder (default: the json's folder)")
    e.add_argument(
        "--checkpoint", default=None, help="a detect train run folder (the model comes from its args.yaml) or weights"
    )
    _add_convert_arg(e, CHECKPOINT_SOURCE)
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar over the batches")
    _add_output_arg(e, "folder for detections.json and metrics.json")
    e.set_defaults(func=_detect_eval)

    e = det.add_parser("predict", help="boxes, labels and scores (masks for Mask R-CNN) on your own images")
    _add_dense_predict_args(e, "dets.jsonl: one JSON line per image (path, size, boxes, labels, scores)")
    e.add_argument("--score-thresh", type=float, default=0.5, help="keep detections scoring at least this")
    e.set_defaults(func=_detect_predict)


def _add_predict_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="top-k classes of your own images (files, folders, globs) at any size")
    p.add_argument("images", nargs="+", help="image files, folders (searched recursively) or glob patterns")
    _add_model_args(
        p, "model name (any timm form, :variant); without it --checkpoint is a run folder", KWARGS_HELP, False
    )
    p.add_argument("--checkpoint", default=None, help="a run folder, or weights for --model (.pth / .safetensors)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--img-size", type=POSITIVE, nargs="+", default=None, metavar="PX", help="resize to H [W]")
    size.add_argument("--native", action="store_true", help="each image at its own size, rounded to the patch grid")
    p.add_argument("--max-pixels", type=POSITIVE, default=None, help="refuse larger images (default 2^28)")
    p.add_argument("--topk", type=POSITIVE, default=5)
    _add_output_arg(
        p, "preds.jsonl: one JSON line per image (path, size, top-k, seconds: its read, batch share, map)", False
    )
    p.add_argument("--batch-size", type=POSITIVE, default=8, help="images read together; equal sizes run as a batch")
    p.add_argument(
        "--maps",
        default=None,
        metavar="DIR",
        help="per image: its importance map over the picture (DIR/<name>.png, original size) and raw (.npy)",
    )
    p.add_argument("--method", default=None, help=f"map method: {METHODS_HELP}")
    _add_device_args(p)
    _add_compile_arg(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar over the images")
    p.set_defaults(func=_predict)


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="a local web page: upload a picture, see top-k and maps of one or two runs")
    p.add_argument("--checkpoint", nargs="+", default=None, metavar="RUN", help="one or two run folders to compare")
    p.add_argument("--model", default=None, help="without --checkpoint: this model with random weights")
    p.add_argument("--topk", type=POSITIVE, default=5)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=POSITIVE, default=7860)
    p.set_defaults(func=_demo)


def _add_export_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="ONNX / torch.export (.pt2) / TorchScript file, checked against PyTorch")
    _add_model_args(p, "registered model name, or a `linvit train` run folder (its trained weights)", KWARGS_HELP)
    p.add_argument(
        "--format",
        choices=["onnx", "pt2", "torchscript"],
        default=None,
        help="default: from --output's suffix (.onnx, .pt2, .pt / .ts = TorchScript)",
    )
    p.add_argument(
        "--img-size",
        type=POSITIVE,
        nargs="+",
        default=None,
        metavar="PX",
        help="input side, or H W (default: a run folder's own size, else the model's)",
    )
    p.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="any batch size for onnx and pt2 (TorchScript always); checked at 1 and 3",
    )
    p.add_argument(
        "--dynamic-size",
        action="store_true",
        help="any H and W on the model's grid for onnx and pt2 (TorchScript always); checked across the range",
    )
    p.add_argument(
        "--quantize",
        choices=["int8"],
        default=None,
        help="onnx: also write OUT.int8.onnx, onnxruntime's dynamic quantization (int8 weights)",
    )
    _add_output_arg(p, "output file")
    p.set_defaults(func=_export)


def _add_reproduce_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce", help="every family trained on the digit tasks, evaluated, mapped, benchmarked -> OUT/report.md"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="one seed of the digit task: about 11 minutes on 2 CPU cores"
    )
    mode.add_argument(
        "--full", action="store_true", help="3 seeds of both tasks and a learning-rate sweep (the default)"
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the report from the stages already finished in --output (a run stopped part-way)",
    )
    _add_device_arg(
        p, "cpu", "where training and benchmarks run: default cpu (the recorded reports); auto: cuda if seen"
    )
    _add_output_arg(p, "output folder; re-running with it reuses finished stages")
    p.set_defaults(func=_reproduce)


# The commands: each imports its handler when it runs, builds its config and calls it.


def _models(args: argparse.Namespace) -> None:
    from linvit.bench.command import ModelsConfig, run_models

    run_models(_config(ModelsConfig, args))


def _bench(args: argparse.Namespace) -> None:
    from linvit.bench.command import BenchConfig, run_bench

    run_bench(_config(BenchConfig, args))


def _cluttered_mnist(args: argparse.Namespace) -> None:
    from linvit.data.cluttered_mnist import ClutteredMnistConfig, run_cluttered_mnist

    run_cluttered_mnist(_config(ClutteredMnistConfig, args))


def _digit_folder(args: argparse.Namespace) -> None:
    from linvit.data.digit_tasks import DigitFolderConfig, run_digit_folder

    run_digit_folder(_config(DigitFolderConfig, args))


def _train(args: argparse.Namespace) -> None:
    from linvit.train import ClassifyConfig, run_train

    run_train(_config(ClassifyConfig, args))


def _distill(args: argparse.Namespace) -> None:
    from linvit.distillation import DistillConfig, run_distill

    run_distill(_config(DistillConfig, args, _check_optional_img_size))


def _eval(args: argparse.Namespace) -> None:
    from linvit.evaluate import EvalConfig, run_eval

    run_eval(_config(EvalConfig, args))


def _explain(args: argparse.Namespace) -> None:
    from linvit.explain.run import ExplainConfig, run_explain

    run_explain(_config(ExplainConfig, args, _layer_arg, _check_optional_img_size))


def _spectral(args: argparse.Namespace) -> None:
    from linvit.explain.run import SpectralConfig, run_spectral

    run_spectral(_config(SpectralConfig, args, _check_optional_img_size))


def _erf(args: argparse.Namespace) -> None:
    from linvit.explain.run import ErfConfig, run_erf

    run_erf(_config(ErfConfig, args, _check_optional_img_size))


def _generate_train(args: argparse.Namespace) -> None:
    from linvit.generate.engine import GenerateConfig, run_generate_train

    run_generate_train(_config(GenerateConfig, args))


def _generate_sample(args: argparse.Namespace) -> None:
    from linvit.generate.sample import SampleConfig, run_generate_sample

    run_generate_sample(_config(SampleConfig, args))


def _generate_score(args: argparse.Namespace) -> None:
    from linvit.generate.score import ScoreConfig, run_generate_score

    run_generate_score(_config(ScoreConfig, args))


def _segment_train(args: argparse.Namespace) -> None:
    from linvit.segment.engine import SegmentConfig, run_segment_train

    run_segment_train(_config(SegmentConfig, args, _check_crop))


def _segment_eval(args: argparse.Namespace) -> None:
    from linvit.segment.engine import SegmentEvalConfig, run_segment_eval

    run_segment_eval(_config(SegmentEvalConfig, args))


def _segment_predict(args: argparse.Namespace) -> None:
    from linvit.dense_inference import SegmentPredictConfig, run_segment_predict

    run_segment_predict(_config(SegmentPredictConfig, args))


def _detect_train(args: argparse.Namespace) -> None:
    from linvit.detect.engine import DetectConfig, run_detect_train

    run_detect_train(_config(DetectConfig, args))


def _detect_eval(args: argparse.Namespace) -> None:
    from linvit.detect.engine import DetectEvalConfig, run_detect_eval

    run_detect_eval(_config(DetectEvalConfig, args))


def _detect_predict(args: argparse.Namespace) -> None:
    from linvit.dense_inference import DetectPredictConfig, run_detect_predict

    run_detect_predict(_config(DetectPredictConfig, args))


def _predict(args: argparse.Namespace) -> None:
    from linvit.inference import PredictConfig, run_predict

    run_predict(_config(PredictConfig, args, _check_optional_img_size))


def _demo(args: argparse.Namespace) -> None:
    from linvit.demo import DemoConfig, run_demo

    run_demo(_config(DemoConfig, args))


def _export(args: argparse.Namespace) -> None:
    from linvit.export import ExportConfig, run_export

    run_export(_config(ExportConfig, args, _check_optional_img_size))


def _reproduce(args: argparse.Namespace) -> None:
    from linvit.reproduce import ReproduceConfig, run_reproduce

    run_reproduce(_config(ReproduceConfig, args), execute=run_command)


# every top-level command, in the order `linvit --help` lists them
_COMMANDS = (
    _add_models_command,
    _add_bench_command,
    _add_data_command,
    _add_train_command,
    _add_distill_command,
    _add_eval_command,
    _add_explain_command,
    _add_spectral_command,
    _add_erf_command,
    _add_generate_command,
    _add_segment_command,
    _add_detect_command,
    _add_predict_command,
    _add_demo_command,
    _add_export_command,
    _add_reproduce_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linvit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in _COMMANDS:
        add_command(sub)
    parser.commands = _leaf_parsers(sub)
    for leaf in parser.commands.values():
        leaf.add_argument(
            "--config",
            default=None,
            metavar="FILE.yaml",
            help="defaults for this command's flags (keys as the flag names); flags on the command line win",
        )
        leaf.add_argument("--threads", type=POSITIVE, default=None, help="CPU threads for torch (default: torch's)")
        leaf.add_argument("--debug", action="store_true", help="show the full traceback of a usage error too")
    return parser


def _leaf_parsers(sub: argparse._SubParsersAction, prefix: tuple = ()) -> dict[tuple, argparse.ArgumentParser]:
    """('train',) / ('segment', 'train') -> the parser of that command."""
    leaves = {}
    for name, p in sub.choices.items():
        nested = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        leaves.update(_leaf_parsers(nested[0], (*prefix, name)) if nested else {(*prefix, name): p})
    return leaves


def _config_file(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _apply_config(p: argparse.ArgumentParser, path: str) -> None:
    """Make the YAML file's values the command's defaults (timm's train.py convention), checked like flags."""
    import yaml

    try:
        values = yaml.safe_load(open(path)) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        p.error(f"--config {path}: cannot read it as YAML text ({type(err).__name__}: {err})")
    if not isinstance(values, dict):
        p.error(f"--config {path}: expected a mapping of flag names to values")
    actions = _config_keys(p)
    defaults = {}
    for key, value in values.items():
        action = actions.get(str(key).replace("-", "_"))
        if action is None:
            p.error(f"--config {path}: {key!r} is not an option of this command")
        if isinstance(action, _OldSpelling):
            _deprecated(f"--config key {key!r}", f"{action.new.lstrip('-')!r}")
        defaults[action.dest] = _config_value(p, action, value, path)
        action.required = False
    for group in p._mutually_exclusive_groups:  # a renamed flag's pair: the file gives it
        if any(a.dest in defaults for a in group._group_actions):
            group.required = False
    p.set_defaults(**defaults)


def _config_keys(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A --config file's keys: each flag's dest (what a run's args.yaml holds) and each of its spellings
    (output, resize; out, img_size for the old ones), underscores for dashes."""
    keys = {}
    for action in p._actions:
        if action.dest in ("help", "config"):
            continue
        spellings = [o.lstrip("-").replace("-", "_") for o in action.option_strings if o.startswith("--")]
        for key in (action.dest, *spellings):
            keys.setdefault(key, action)
    return keys


def _config_value(p: argparse.ArgumentParser, action: argparse.Action, value, path: str):
    """value as the flag would have parsed it: typed, and within its choices."""
    if value is None:
        return None
    takes_values = action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 0)
    many = takes_values and not isinstance(value, dict)
    items = value if isinstance(value, list) and action.nargs is not None else [value]
    parsed = []
    for item in items:
        if action.type is not None and item is not None and not isinstance(item, (bool, list, dict)):
            try:
                item = action.type(str(item))
            except (argparse.ArgumentTypeError, ValueError) as err:
                p.error(f"--config {path}: {action.dest}: {err}")
        if action.choices is not None and item is not None and item not in action.choices:
            p.error(f"--config {path}: {action.dest}: {item!r} is not one of {list(action.choices)}")
        parsed.append(item)
    return parsed if many or items is value else parsed[0]  # `crop_size: 48` for a nargs="+" flag is [48]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line, with --config FILE.yaml supplying defaults for the chosen command."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    config = _config_file(argv)
    if config is not None:
        leaf = parser.commands.get(tuple(argv[:2])) or parser.commands.get(tuple(argv[:1]))
        if leaf is None:
            parser.error("--config goes after the command, e.g. `linvit train --config run.yaml`")
        _apply_config(leaf, config)
    return parser.parse_args(argv)


def run_command(argv: list[str]) -> None:
    """Run one `linvit` command line in this process; errors propagate to the caller."""
    args = parse_args(argv)
    args.func(args)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("linvit")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Run a command: input the user can fix (linvit.errors.UsageError) is one line and exit 2 (its traceback
    with --debug); Ctrl-C is one line and exit 130 (the shell's code for SIGINT); any other exception, a
    ValueError from torch or a bug included, keeps its traceback."""
    args = parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"\nlinvit {args.command}: interrupted", file=sys.stderr)
        return 130
    except ValueError as err:
        from linvit.errors import UsageError

        if not isinstance(err, UsageError) or args.debug:
            raise
        print(f"linvit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
