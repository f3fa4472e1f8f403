"""`linvit explain | spectral | erf`: load a model and pictures (explain/inputs.py), compute, write JSON + figures."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

from ..data import boxes_for, load_boxes
from ..data.splits import is_reader_spec
from ..errors import UsageError
from ..utils.paths import output_dir, write_json
from ..weights import check_exists, read_run_config
from .erf import effective_receptive_field
from .inputs import AnalysisConfig, AnalysisInputs, load_inputs
from .maps import importance_maps
from .metrics import area_over_curve, box_auc, perturbation_curves, pointing_game
from .spectral import spectral_report


def _matplotlib():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def transform_boxes(boxes: list[list[float]], size: tuple[int, int], config: dict) -> list[list[float]]:
    """Map boxes from original pixels (w, h) through timm's eval transform (resize shorter side, centre crop)."""
    w0, h0 = size
    out_h, out_w = config["input_size"][-2:]
    crop_pct = config.get("crop_pct") or 1.0
    scale_short = int(out_h / crop_pct) if out_h == out_w else None
    if scale_short is None:
        sx, sy = out_w / crop_pct / w0, out_h / crop_pct / h0
    else:
        s = scale_short / min(w0, h0)
        sx = sy = s
    new_w, new_h = w0 * sx, h0 * sy
    left, top = round((new_w - out_w) / 2), round((new_h - out_h) / 2)
    mapped = []
    for x0, y0, x1, y1 in boxes:
        b = [x0 * sx - left, y0 * sy - top, x1 * sx - left, y1 * sy - top]
        b = [min(max(b[0], 0), out_w), min(max(b[1], 0), out_h), min(max(b[2], 0), out_w), min(max(b[3], 0), out_h)]
        if b[2] > b[0] and b[3] > b[1]:
            mapped.append(b)
    return mapped


def _denormalise(images: torch.Tensor, config: dict) -> np.ndarray:
    mean = torch.tensor(config["mean"]).reshape(1, 3, 1, 1)
    std = torch.tensor(config["std"]).reshape(1, 3, 1, 1)
    return (images * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def plot_maps(images, maps, boxes, config, path: Path, title: str, max_images: int = 8) -> None:
    """A grid of the first images (class-spread: explain.inputs.spread_order), each with its map overlaid and its
    ground-truth boxes outlined."""
    plt = _matplotlib()
    from matplotlib.patches import Rectangle

    n = min(max_images, len(images))
    rgb = _denormalise(images[:n], config)
    fig, axes = plt.subplots(2, n, figsize=(2.1 * n, 4.4), squeeze=False)
    for i in range(n):
        axes[0, i].imshow(rgb[i])
        axes[1, i].imshow(rgb[i])
        axes[1, i].imshow(maps[i].numpy(), cmap="jet", alpha=0.5)
        for ax in axes[:, i]:
            for x0, y0, x1, y1 in boxes[i] or []:
                ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, ec="lime", lw=1.2))
            ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_examples(images, maps, boxes, config, path: Path, count: int = 8, paths: list[str] | None = None) -> None:
    """The first images (uint8 RGB; class-spread: explain.inputs.spread_order), their maps, boxes (NaN-padded)
    and paths, for figures made later."""
    n = min(count, len(images))
    most = max([len(b or []) for b in boxes[:n]] + [1])
    padded = np.full((n, most, 4), np.nan, dtype=np.float32)
    for i, b in enumerate(boxes[:n]):
        if b:
            padded[i, : len(b)] = b
    rgb = (_denormalise(images[:n], config) * 255).round().astype(np.uint8)
    named = np.array((paths or [""] * n)[:n])
    np.savez_compressed(path, images=rgb, maps=maps[:n].numpy().astype(np.float32), boxes=padded, paths=named)


def plot_curves(morf: torch.Tensor, lerf: torch.Tensor, path: Path, title: str) -> None:
    plt = _matplotlib()
    steps = np.linspace(0, 1, morf.shape[1])
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(steps, morf.mean(0).numpy(), marker="o", label="MoRF (most relevant removed first)")
    ax.plot(steps, lerf.mean(0).numpy(), marker="s", label="LeRF (least relevant removed first)")
    ax.set_xlabel("fraction of patches removed")
    ax.set_ylabel("p(target class)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclasses.dataclass
class ExplainConfig(AnalysisConfig):
    """`linvit explain`: maps by method and layer, scored by deletion curves and boxes."""

    boxes: str | None = None  # None: DATA/boxes.json when present
    method: str | None = None  # None: the model's own
    layer: int | str = "mean"  # a layer index or "mean"
    steps: int = 10  # perturbation steps
    tolerance: float = 15.0  # pointing-game tolerance in pixels
    batch_size: int = 16
    output: str | None = None  # a folder


@dataclasses.dataclass
class SpectralConfig(AnalysisConfig):
    """`linvit spectral`: Linear-InfSA importance against the Perron vector, into one JSON file."""

    limit: int = 8
    depth: int | None = None  # series truncation depth; None: the number of InfSA layers
    output: str | None = None  # a JSON file


@dataclasses.dataclass
class ErfConfig(AnalysisConfig):
    """`linvit erf`: the effective receptive field heat map, into a folder."""

    limit: int = 16
    output: str | None = None


def _output(config: AnalysisConfig) -> Path:
    if not config.output:
        raise UsageError("give --output (where the results go)")
    return Path(config.output)


def run_explain(config: ExplainConfig) -> dict:
    """Maps of a run or model on a folder of pictures; with labels MoRF/LeRF and accuracy, with boxes box AUCs
    and the pointing game. Writes metrics.json, predictions.jsonl, maps.npz (with the pictures' paths) and PNGs."""
    if config.checkpoint:
        check_exists(config.checkpoint)  # the model's problem before the pictures' (a typo in --checkpoint)
    out = output_dir(_output(config))
    inputs = load_inputs(config)
    config = inputs.settings  # with a run folder's model and input size
    boxes = picture_boxes(config, inputs)
    maps, preds, probs = explain_batches(config, inputs)
    image_maps = torch.cat([m.image for m in maps])
    metrics = {
        "model": config.model,
        "checkpoint": config.checkpoint,
        "method": maps[0].method,
        "layer": config.layer,
        "images": len(inputs.images),
        "labelled": inputs.targets is not None,
        "unlabelled_because": inputs.why_unlabelled,
        "images_with_boxes": sum(1 for b in boxes if b),
        "tolerance_px": config.tolerance,
        "steps": config.steps,
    }
    metrics.update(box_metrics(image_maps, boxes, config.tolerance))
    if inputs.targets is not None:
        metrics.update(labelled_metrics(config, inputs, maps, torch.cat(preds)))
    write_outputs(out, config, inputs, image_maps, boxes, metrics, torch.cat(preds), torch.cat(probs))
    return metrics


def picture_boxes(config: ExplainConfig, inputs: AnalysisInputs) -> list[list | None]:
    """Ground-truth boxes per picture in model-input pixels (--boxes, or DATA/boxes.json when present; the
    digits' own ink boxes for `--data digits:...`)."""
    from PIL import Image

    if is_reader_spec(config.data):
        if config.boxes:
            raise UsageError(f"--boxes matches pictures by their files; --data {config.data} has none")
        drawn = inputs.drawn_boxes or [None] * len(inputs.paths)
        return [None if d is None else transform_boxes(d[0], d[1], inputs.config) for d in drawn]
    boxes_src = config.boxes or Path(config.data) / "boxes.json"
    all_boxes = load_boxes(boxes_src) if Path(boxes_src).exists() else None
    if config.boxes and all_boxes is None:
        raise UsageError(f"{config.boxes}: boxes not found")
    boxes = []
    for p in inputs.paths:
        raw = boxes_for(p, all_boxes, root=config.data) if all_boxes else None
        boxes.append(None if raw is None else transform_boxes(raw, Image.open(p).size, inputs.config))
    if all_boxes is not None:
        warn_unmatched(sum(b is not None for b in boxes), len(boxes), boxes_src, len(all_boxes))
    return boxes


def warn_unmatched(matched: int, pictures: int, source, entries: int) -> None:
    """A warning on stderr when pictures have no entry in the boxes file: box scores cover only the others,
    and are null when none matched (a file for another folder, or keys of another form)."""
    if matched == pictures:
        return
    scores = "box scores are null" if matched == 0 else f"box scores cover those {matched}"
    print(
        f"warning: {matched} of {pictures} pictures have boxes in {source} ({entries} entries, looked up by the "
        f"path below --data, the file name, then the stem); {scores}",
        file=sys.stderr,
    )


def explain_batches(config: ExplainConfig, inputs: AnalysisInputs):
    """Importance maps, predicted classes and their probabilities, batch by batch."""
    maps, preds, probs = [], [], []
    for start in range(0, len(inputs.images), config.batch_size):
        x = inputs.images[start : start + config.batch_size]
        maps.append(importance_maps(inputs.model, x, method=config.method, layer=config.layer))
        with torch.no_grad():
            p = inputs.model(x).softmax(-1)
        probs.append(p.max(1).values)
        preds.append(p.argmax(1))
    return maps, preds, probs


def box_metrics(image_maps: torch.Tensor, boxes: list, tolerance: float) -> dict:
    """Box ROC/PR-AUC and pointing game over the pictures that have boxes (None without any)."""
    with_boxes = [i for i, b in enumerate(boxes) if b]
    if not with_boxes:
        return {"box_roc_auc": None, "box_pr_auc": None, "pointing_game": None}
    chosen = [boxes[i] for i in with_boxes]
    auc = box_auc(image_maps[with_boxes], chosen)
    point = pointing_game(image_maps[with_boxes], chosen, tolerance)
    return {
        "box_roc_auc": auc.get("box_roc_auc"),
        "box_pr_auc": auc.get("box_pr_auc"),
        "pointing_game": point.get("pointing_game"),
    }


def labelled_metrics(config: ExplainConfig, inputs: AnalysisInputs, maps: list, preds: torch.Tensor) -> dict:
    """Accuracy and MoRF/LeRF (deleting patches by the map, p(true class) after each step)."""
    patch, batch, steps = inputs.model.patch_embed.patch_size, config.batch_size, config.steps
    morfs, lerfs = [], []
    for m, start in zip(maps, range(0, len(inputs.images), batch), strict=True):
        x, y = inputs.images[start : start + batch], inputs.targets[start : start + batch]
        morfs.append(perturbation_curves(inputs.model, x, y, m.patch, patch, steps=steps, order="morf"))
        lerfs.append(perturbation_curves(inputs.model, x, y, m.patch, patch, steps=steps, order="lerf"))
    morf, lerf = torch.cat(morfs), torch.cat(lerfs)
    return {
        "accuracy": float((preds == inputs.targets).float().mean() * 100),
        "morf_aoc": float(area_over_curve(morf).mean()),
        "lerf_aoc": float(area_over_curve(lerf).mean()),
        "morf_curve": morf.mean(0).tolist(),
        "lerf_curve": lerf.mean(0).tolist(),
    }


def write_outputs(
    out: Path, config: ExplainConfig, inputs: AnalysisInputs, image_maps, boxes, metrics, preds, probs
) -> None:
    """metrics.json, predictions.jsonl, maps.npz and the figures; a summary to stdout."""
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    names = getattr(inputs.model, "label_names", None) or read_label_names(config.checkpoint)
    with open(out / "predictions.jsonl", "w") as f:
        for i, path in enumerate(inputs.paths):
            c = int(preds[i])
            row = {"path": path, "class": c, "label": names[c] if names and c < len(names) else str(c)}
            row["prob"] = round(float(probs[i]), 4)
            if inputs.targets is not None:
                row["target"] = int(inputs.targets[i])
            f.write(json.dumps(row) + "\n")
    title = f"{config.model} ({metrics['method']})"
    if "morf_curve" in metrics:
        plot_curves(
            torch.tensor([metrics["morf_curve"]]), torch.tensor([metrics["lerf_curve"]]), out / "curves.png", title
        )
    plot_maps(inputs.images, image_maps, boxes, inputs.config, out / "maps.png", title)
    save_examples(inputs.images, image_maps, boxes, inputs.config, out / "maps.npz", paths=inputs.paths)
    keys = ("morf_aoc", "lerf_aoc", "box_roc_auc", "box_pr_auc", "pointing_game", "accuracy")
    summary = {k: metrics[k] for k in keys if metrics.get(k) is not None}
    print(" ".join(f"{k} {v:.4f}" for k, v in summary.items()) or f"maps only: {inputs.why_unlabelled}")
    written = "metrics.json, predictions.jsonl, " + ("curves.png, " if "morf_curve" in metrics else "")
    print(f"wrote {out}/{written}maps.png, maps.npz")


def read_label_names(checkpoint: str | None) -> list[str] | None:
    found = read_run_config(checkpoint) if checkpoint else None
    return found[1].get("label_names") if found else None


def run_spectral(config: SpectralConfig) -> dict:
    """The spectral report of every Linear-InfSA layer: per layer and mean, to stdout and a JSON file."""
    out = _output(config)
    inputs = load_inputs(config)
    config = inputs.settings
    model, images = inputs.model, inputs.images
    report = spectral_report(model, images, depth=config.depth)
    report.update(model=config.model, checkpoint=config.checkpoint)
    write_json(out, report)
    for layer in report["layers"]:
        cos = np.mean(layer["cosine"])
        radius, gap = np.mean(layer["spectral_radius"]), np.mean(layer["truncation_gap"])
        name = f"layer {layer['layer']:2d} {layer['mixer']:<22}"
        print(f"{name} cosine {cos:.4f}  radius {radius:.4f}  truncation gap {gap:.4f}")
    m = report["mean"]
    print(
        f"mean: cosine {m['cosine']:.4f}  radius {m['spectral_radius']:.4f}  truncation gap {m['truncation_gap']:.4f}"
    )
    print(f"wrote {out}")
    return report


def run_erf(config: ErfConfig) -> dict:
    """The effective receptive field: erf.png, erf.json and erf.npy in the output folder."""
    out = _output(config)
    inputs = load_inputs(config)
    config = inputs.settings
    model, images = inputs.model, inputs.images
    result = effective_receptive_field(model, images)
    out = output_dir(out)
    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(4, 4))
    im = ax.imshow(result["display"].numpy(), cmap="RdYlGn")
    H, W = result["display"].shape
    ax.add_patch(_matplotlib().Rectangle((W / 4, H / 4), W / 2, H / 2, fill=False, ec="black", ls="--"))
    ax.set_title(f"ERF {config.model}\noutside centre: {result['outside_center_share']:.3f}", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(out / "erf.png", dpi=110)
    plt.close(fig)
    record = {
        "model": config.model,
        "checkpoint": config.checkpoint,
        "images": len(images),
        "outside_center_share": result["outside_center_share"],
    }
    (out / "erf.json").write_text(json.dumps(record, indent=2))
    np.save(out / "erf.npy", result["display"].numpy().astype(np.float32))
    print(f"share of gradient mass outside the central quarter: {result['outside_center_share']:.4f}")
    print(f"wrote {out}/erf.png, erf.json, erf.npy")
    return record
