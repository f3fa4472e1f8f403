"""Evaluation: top-1/top-5/loss on an ImageNet-layout split, and loading weights from a file safely."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file as load_safetensors
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from .conversion import convert_if_asked
from .data import SafeImageFolder, collate_images
from .data.digit_tasks import digits_split, is_digits_spec
from .distributed import all_reduce_sum, cleanup, init_distributed
from .errors import UsageError
from .models import WeightFormer, create_any_size, create_variant, weightformer
from .utils import compile_model
from .utils.artifacts import run_model_args, saved_weights_kind, use_run_folder

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str):
    dtype = AMP_DTYPES[amp]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module, loader, device: torch.device, amp: str = "none", progress: bool = False, desc: str = "eval"
) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the loader, summed across ranks.

    Each rank sees a disjoint shard (no padding duplicates), so every rank returns the same numbers. The sums
    stay on the device until the end (no host synchronisation per batch).
    """
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits
    count = skipped = 0
    for batch in tqdm(loader, desc=desc, leave=False, disable=not progress):
        if batch is None:
            continue
        images, targets, bad = batch
        skipped += bad
        count += targets.numel()
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)
        logits = logits.float()
        hits = logits.topk(min(5, logits.shape[1]), dim=1).indices == targets[:, None]
        loss = F.cross_entropy(logits, targets, reduction="sum")
        sums += torch.stack([loss, hits[:, 0].sum(), hits.any(dim=1).sum()]).double()
    loss_sum, top1, top5 = sums.tolist()
    loss_sum, top1, top5, count, skipped = all_reduce_sum([loss_sum, top1, top5, count, skipped], device)
    if count == 0:
        raise UsageError("evaluation saw no readable images")
    return {
        "loss": loss_sum / count,
        "top1": 100.0 * top1 / count,
        "top5": 100.0 * top5 / count,
        "images": int(count),
        "skipped": int(skipped),
    }


def create_for_checkpoint(
    spec: str, checkpoint: str | Path | None, img_size=None, any_size: bool = False, **kwargs
) -> nn.Module:
    """spec, built so that checkpoint's weights fit, for inputs of img_size (or of any size with any_size).

    A run's weights are built at the size the run trained at (its position table loads as saved, with the run's
    class count unless kwargs give one) and resampled per input to img_size, as `linvit predict` runs
    `linvit.load_run`; building at img_size instead would not load them. Without a run: at img_size.
    """
    run = run_model_args(checkpoint) if checkpoint else {}
    if run.get("num_classes") is not None:
        kwargs.setdefault("num_classes", run["num_classes"])
    wanted, trained = height_width(img_size), height_width(run.get("img_size"))
    size = trained or wanted
    resample = any_size or (trained is not None and wanted is not None and wanted != trained)
    create = create_any_size if resample else create_variant
    return create(spec, **{**({} if size is None else {"img_size": size}), **kwargs})


def height_width(size) -> tuple[int, int] | None:
    """An input size as (H, W): one side (an int, a run's args.yaml) or a sequence of one or two (the flags)."""
    if size is None:
        return None
    return (size, size) if isinstance(size, int) else tuple((list(size) * 2)[:2])


def unwrap_state_dict(checkpoint: dict) -> dict:
    """The model weights inside a training checkpoint ({'model': ...}) or a bare state dict, 'module.' stripped."""
    for key in ("model", "state_dict"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    return {k.removeprefix("module."): v for k, v in checkpoint.items()}


EMA_KEYS = ("ema", "model_ema", "state_dict_ema")  # linvit's training checkpoints, timm's and DeiT's


def read_weights(path: Path, ema: bool | None = None) -> tuple[dict, str]:
    """(state dict, which weights) from .pth/.pt (weights_only: no code runs) or .safetensors.

    A checkpoint holding an EMA gives the EMA weights unless ema is False (which is "ema" or "model"); a
    run's model.safetensors holds the weights its config.json names. ema=True on a file without an EMA
    is an error rather than a silent fallback.
    """
    if not path.is_file():
        raise UsageError(f"{path}: {'a folder, not a checkpoint file' if path.is_dir() else 'no such file'}")
    safetensors = path.suffix == ".safetensors"
    try:
        raw = load_safetensors(str(path)) if safetensors else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refusals, corrupt files
        kind = foreign_file_kind(path, safetensors)
        if kind is not None:
            expected = "a safetensors file" if safetensors else "a PyTorch checkpoint (torch.save)"
            raise UsageError(f"{path}: not {expected}: it is {kind}") from err
        raise UsageError(f"{path}: cannot read checkpoint safely ({type(err).__name__}: {err})") from err
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: not a state dict or checkpoint ({type(raw).__name__})")
    ema_key = next((k for k in EMA_KEYS if isinstance(raw.get(k), dict)), None)
    saved = saved_weights_kind(path)
    if ema_key is not None and ema is not False:
        return unwrap_state_dict(raw[ema_key]), "ema"
    if saved is not None:
        if ema is not None and (saved == "ema") != ema:
            other = "the raw weights are in last.pth" if saved == "ema" else "the run kept no EMA"
            raise UsageError(f"{path} holds the {saved} weights; {other}")
        return unwrap_state_dict(raw), saved
    if ema:
        raise UsageError(f"{path}: holds no EMA weights")
    return unwrap_state_dict(raw), "model"


FILE_SIGNATURES = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
    b"\x1f\x8b": "a gzip archive",
    b"PK\x03\x04": "a zip archive",
}


def foreign_file_kind(path: Path, safetensors: bool) -> str | None:
    """What a file that failed to load as weights is instead ("a text file", "a PNG image", ...), or None when
    it looks like the expected format (a checkpoint that is damaged or refused: its own error says more).
    torch.save writes a zip archive (or, before torch 1.6, a pickle: byte 0x80); safetensors begins with an
    8-byte header length and then "{"."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "an empty file"
    looks_right = head[8:9] == b"{" if safetensors else head.startswith((b"PK\x03\x04", b"\x80"))
    if looks_right:
        return None
    kind = next((k for sig, k in FILE_SIGNATURES.items() if head.startswith(sig)), None)
    if kind is not None:
        return kind
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data of another format"
    return "a text file"


def load_weights(model: nn.Module, path: str | Path, ema: bool | None = None) -> str:
    """Load weights strictly, with clear errors; returns which weights were loaded ("ema" or "model")."""
    path = Path(path)
    state, which = read_weights(path, ema)
    apply_weights(model, state, path)
    return which


def load_and_convert(model: nn.Module, path: str | Path | None, convert: str | None, ema: bool | None = None) -> str:
    """--checkpoint with --convert: weights of a converted model (they hold InfSA discounts) load after the
    conversion; softmax weights load before it, so a pretrained source is evaluated as converted, untrained."""
    if path is None:
        convert_if_asked(model, convert)
        return "random init"
    path = Path(path)
    state, which = read_weights(path, ema)
    converted_weights = any(k.endswith(".theta") for k in state)
    if converted_weights:
        convert_if_asked(model, convert)
    apply_weights(model, state, path)
    if not converted_weights:
        convert_if_asked(model, convert)
    return which


def apply_weights(model: nn.Module, state: dict, path: Path) -> None:
    """load_state_dict, strictly, with one-line errors naming the file."""
    if isinstance(model, WeightFormer):
        state = weightformer.checkpoint_filter_fn(state, model)  # official layouts, with clear errors
    check_num_classes(model, state, path)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise UsageError(
            f"{path}: checkpoint does not fit {type(model).__name__}: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )


def load_backbone(backbone: nn.Module, path: str) -> None:
    """Initialise the backbone from a classification checkpoint (its head and unknown keys are dropped)."""
    state, _ = read_weights(Path(path))
    own = backbone.state_dict()
    state = {k: v for k, v in state.items() if k in own}
    missing = [k for k in own if k not in state]
    mis_shaped = [k for k in state if state[k].shape != own[k].shape]
    if missing or mis_shaped:
        raise UsageError(f"{path}: does not fit the backbone: missing {missing[:3]}, mis-shaped {mis_shaped[:3]}")
    backbone.load_state_dict(state)


def check_num_classes(model: nn.Module, state: dict, path) -> None:
    """Raise a one-line error when the checkpoint's classifier has another number of classes."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    name = next((n for n, m in model.named_modules() if m is head), None)
    key = f"{name}.weight" if name else None
    if key and key in state and isinstance(head, nn.Linear) and state[key].shape[0] != head.out_features:
        raise UsageError(f"{path}: checkpoint has {state[key].shape[0]} classes, the data has {head.out_features}")


def eval_loader(dataset, batch_size: int, workers: int, rank: int, world: int, collate_fn=collate_images):
    """Disjoint rank shards (rank::world) in order; unequal shards are fine since results are summed."""
    shard = Subset(dataset, list(range(rank, len(dataset), world)))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate_fn)


def write_json(path: str | Path, record: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2))


def image_split(data, split: str, transform=None, unreadable: str = "skip"):
    """DATA/SPLIT as an image folder, or a split of the drawn digit tasks (`--data digits:TASK,...`)."""
    if is_digits_spec(data):
        return digits_split(data, split, transform)
    return SafeImageFolder(Path(data) / split, transform=transform, unreadable=unreadable)


def class_count(args, split: str | None = None) -> int:
    """Classes of --data (its class folders; 10 for the digit tasks)."""
    return len(image_split(args.data, split or args.split).classes)


def run_eval(args) -> dict:
    """`linvit eval`: evaluate a checkpoint on one split and print / save the metrics."""
    rank, world, device = init_distributed(args.device)
    try:
        run = use_run_folder(args)
        model = create_for_checkpoint(
            args.model, args.checkpoint, args.img_size, num_classes=class_count(args), **args.model_kwargs
        )
        weights = load_and_convert(model, args.checkpoint, getattr(args, "convert", None), args.ema)
        if rank == 0:
            source = f" from {run}/args.yaml" if run is not None else ""
            print(f"{args.model}{source}: {weights} weights of {args.checkpoint or 'no checkpoint'}")
        config = resolve_data_config({"img_size": args.img_size, "crop_pct": args.crop_pct}, model=model)
        dataset = image_split(args.data, args.split, create_transform(**config, is_training=False))
        model.to(device)
        loader = eval_loader(dataset, args.batch_size, args.workers, rank, world)
        metrics = evaluate(
            compile_model(model, args.compile),
            loader,
            device,
            args.amp,
            progress=rank == 0 and getattr(args, "progress", True),
        )
        metrics.update(
            model=args.model, checkpoint=args.checkpoint, weights=weights, split=args.split, data=str(args.data)
        )
        if rank == 0:
            print(
                f"top1 {metrics['top1']:.2f}  top5 {metrics['top5']:.2f}  loss {metrics['loss']:.4f}  "
                f"({metrics['images']} images, {metrics['skipped']} skipped)"
            )
            if args.json:
                write_json(args.json, metrics)
        return metrics
    finally:
        cleanup()
