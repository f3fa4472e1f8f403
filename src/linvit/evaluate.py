"""Evaluation: top-1/top-5/loss on an ImageNet-layout split, and loading weights from a file safely."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import create_transform, resolve_data_config
from timm.models import load_state_dict
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

from .conversion import convert_if_asked
from .data import SafeImageFolder, collate_skip_none
from .distributed import all_reduce_sum, cleanup, init_distributed
from .models import WeightFormer, create_variant, weightformer
from .utils import compile_model

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str):
    dtype = AMP_DTYPES[amp]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module, loader, device: torch.device, amp: str = "none", progress: bool = False, desc: str = "eval"
) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy (%) over the loader, summed across ranks.

    Each rank sees a disjoint shard (no padding duplicates), so every rank returns the same numbers.
    """
    model.eval()
    loss_sum = top1 = top5 = count = skipped = 0.0
    for batch in tqdm(loader, desc=desc, leave=False, disable=not progress):
        if batch is None:
            continue
        images, targets, bad = batch
        skipped += bad
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, targets, reduction="sum").item()
        k = min(5, logits.shape[1])
        hits = logits.topk(k, dim=1).indices == targets[:, None]
        top1 += hits[:, 0].sum().item()
        top5 += hits.any(dim=1).sum().item()
        count += targets.numel()
    loss_sum, top1, top5, count, skipped = all_reduce_sum([loss_sum, top1, top5, count, skipped], device)
    if count == 0:
        raise ValueError("evaluation saw no readable images")
    return {
        "loss": loss_sum / count,
        "top1": 100.0 * top1 / count,
        "top5": 100.0 * top5 / count,
        "images": int(count),
        "skipped": int(skipped),
    }


def unwrap_state_dict(checkpoint: dict) -> dict:
    """The model weights inside a training checkpoint ({'model': ...}) or a bare state dict, 'module.' stripped."""
    for key in ("model", "state_dict"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    return {k.removeprefix("module."): v for k, v in checkpoint.items()}


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load weights from .pth/.pt (weights_only: no code runs) or .safetensors, strictly, with clear errors."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: checkpoint not found")
    try:
        state = load_state_dict(str(path), weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refusals, corrupt files
        raise ValueError(f"{path}: cannot read checkpoint safely ({type(err).__name__}: {err})") from err
    state = unwrap_state_dict(state)
    if isinstance(model, WeightFormer):
        state = weightformer.checkpoint_filter_fn(state, model)  # official layouts, with clear errors
    check_num_classes(model, state, path)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{path}: checkpoint does not fit {type(model).__name__}: missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}"
        )


def check_num_classes(model: nn.Module, state: dict, path) -> None:
    """Raise a one-line error when the checkpoint's classifier has another number of classes."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    name = next((n for n, m in model.named_modules() if m is head), None)
    key = f"{name}.weight" if name else None
    if key and key in state and isinstance(head, nn.Linear) and state[key].shape[0] != head.out_features:
        raise ValueError(f"{path}: checkpoint has {state[key].shape[0]} classes, the data has {head.out_features}")


def eval_loader(dataset, batch_size: int, workers: int, rank: int, world: int, collate_fn=collate_skip_none):
    """Disjoint rank shards (rank::world) in order; unequal shards are fine since results are summed."""
    shard = Subset(dataset, list(range(rank, len(dataset), world)))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate_fn)


def write_json(path: str | Path, record: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2))


def run_eval(args) -> dict:
    """`linvit eval`: evaluate a checkpoint on one split and print / save the metrics."""
    rank, world, device = init_distributed(args.device)
    try:
        root = Path(args.data) / args.split
        probe = SafeImageFolder(root)
        model = create_variant(args.model, img_size=args.img_size, num_classes=len(probe.classes), **args.model_kwargs)
        convert_if_asked(model, getattr(args, "convert", None))
        if args.checkpoint:
            load_weights(model, args.checkpoint)
        config = resolve_data_config({"img_size": args.img_size, "crop_pct": args.crop_pct}, model=model)
        dataset = SafeImageFolder(root, transform=create_transform(**config, is_training=False))
        model.to(device)
        loader = eval_loader(dataset, args.batch_size, args.workers, rank, world)
        metrics = evaluate(compile_model(model, args.compile), loader, device, args.amp, progress=rank == 0)
        metrics.update(model=args.model, checkpoint=args.checkpoint, split=args.split, data=str(args.data))
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
