"""The report's four figures, drawn from the stages' saved outputs (so a reused stage needs no recompute)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..bench.report import plot_lines


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int) -> None:
    """PNG with a 256-colour palette: a third of the bytes, so reports can be committed with their figures."""
    from PIL import Image

    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(256)
    small.save(path, optimize=True)


def scaling_figure(family: list[dict], weightformer: list[dict], path: Path) -> None:
    """Latency vs tokens: the 4-layer family (left) and WeightFormer-T vs DeiT-T (right)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    plot_lines([axes[0]], family)
    plot_lines([axes[1]], weightformer)
    axes[0].set_title("4-layer models (InfSA paper)", fontsize=9)
    axes[1].set_title("WeightFormer-T vs DeiT-T", fontsize=9)
    first = (family or weightformer or [{}])[0]
    fig.suptitle(f"inference latency, batch 1, {first.get('dtype')} on {first.get('device')}", fontsize=10)
    fig.tight_layout()
    _save(fig, path, dpi=90)


def maps_figure(examples: dict[str, dict], labels: dict[str, str], path: Path, columns: int = 6) -> None:
    """One row per family: its importance map over the same validation images, ground-truth boxes in green."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    rows = list(examples)
    n = min(columns, min(len(e["images"]) for e in examples.values()))
    fig, axes = plt.subplots(len(rows), n + 1, figsize=(1.5 * (n + 1), 1.55 * len(rows)), squeeze=False)
    for r, name in enumerate(rows):
        e = examples[name]
        axes[r, 0].text(0.5, 0.5, labels[name], ha="center", va="center", fontsize=7, wrap=True)
        axes[r, 0].axis("off")
        for c in range(n):
            ax = axes[r, c + 1]
            ax.imshow(e["images"][c])
            ax.imshow(e["maps"][c], cmap="jet", alpha=0.5)
            for box in e["boxes"][c]:
                if not np.isnan(box).any():
                    x0, y0, x1, y1 = box
                    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False, ec="lime", lw=1))
            ax.axis("off")
    fig.tight_layout()
    _save(fig, path, dpi=80)


def learning_curves_figure(runs: dict[str, dict], path: Path) -> None:
    """Validation top-1 per epoch, one panel per task, one line per family (mean over seeds, band min-max)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False)
    for ax, (task, families) in zip(axes[0], runs.items(), strict=True):
        for family, entry in families.items():
            curves = np.array([e["val_curve"] for e in entry["seeds"].values()], dtype=float)
            epochs = np.arange(1, curves.shape[1] + 1)
            line = ax.plot(epochs, curves.mean(0), marker=".", label=f"{family} ({len(curves)} seed(s))")
            if len(curves) > 1:
                ax.fill_between(epochs, curves.min(0), curves.max(0), color=line[0].get_color(), alpha=0.15)
        ax.set_title(f"task {task}: validation top-1", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("top-1 (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path, dpi=90)


# the curves are p(true class); the report's MoRF-AOC / LeRF-AOC are the mean drop from p_0 (the area over them)
MORF_TITLE = "MoRF: most relevant patches removed first\n(faithful maps drop fast: higher MoRF-AOC, the mean drop)"
LERF_TITLE = "LeRF: least relevant removed first\n(faithful maps stay up: lower LeRF-AOC, the mean drop)"


def curves_figure(curves: dict[str, dict], path: Path) -> None:
    """MoRF (left) and LeRF (right) deletion curves, one line per family."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for name, c in curves.items():
        for ax, key in zip(axes, ("morf_curve", "lerf_curve"), strict=True):
            ax.plot(np.linspace(0, 1, len(c[key])), c[key], marker=".", label=name)
    axes[0].set_title(MORF_TITLE, fontsize=8)
    axes[1].set_title(LERF_TITLE, fontsize=8)
    for ax in axes:
        ax.set_xlabel("fraction of patches removed")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("p(true class)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path, dpi=90)


def erf_figure(maps: dict[str, np.ndarray], shares: dict[str, float], path: Path) -> None:
    """Effective receptive fields side by side (x^0.2 / max); the dashed square is the central quarter."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(maps), figsize=(2.8 * len(maps), 3.2), squeeze=False, layout="constrained")
    for ax, (name, display) in zip(axes[0], maps.items(), strict=True):
        ax.imshow(display, cmap="RdYlGn", vmin=0, vmax=1)
        H, W = display.shape
        ax.add_patch(plt.Rectangle((W / 4 - 0.5, H / 4 - 0.5), W / 2, H / 2, fill=False, ec="black", ls="--"))
        ax.set_title(f"{name}\noutside centre {shares[name]:.2f}", fontsize=8)
        ax.axis("off")
    _save(fig, path, dpi=90)
