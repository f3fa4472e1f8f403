"""A recipe sweep on the drawn digit tasks (issue 23): which canvas, clutter, learning rate and length let a
4-layer softmax ViT reach a plateau in CPU minutes.

Every point is one `linvit train --data digits:...` process (softmax ViT-4L cut to width 192, 3 heads, patch 8,
batch 64, AdamW with a cosine schedule, no mixup / RandAugment / erasing / flips: digits must not be mirrored).
Writes OUT/sweep.json (every point's config, per-epoch val top-1, wall seconds) and OUT/sweep.md; re-running
with the same OUT skips finished points.

    python scripts/digits_sweep.py --out docs/sweeps/digits --grid canvas=32,40 clutter=0,1 lr=1e-3 epochs=20
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULTS = {"task": "digit", "canvas": 40, "clutter": 1, "lr": 1e-3, "epochs": 20, "width": 192, "heads": 3}


def train_command(point: dict, output: Path) -> list[str]:
    data = f"digits:{point['task']},canvas={point['canvas']},clutter={point['clutter']}"
    kwargs = ["patch_size=8", f"embed_dim={point['width']}", f"num_heads={point['heads']}"]
    return [
        *("linvit", "train", "--data", data, "--model", "vit_4l_patch16_224", "--img-size", str(point["canvas"])),
        *("--crop-pct", "1", "--model-kwargs", *kwargs, "--batch-size", "64", "--lr", str(point["lr"])),
        *("--epochs", str(point["epochs"]), "--warmup-epochs", "1", "--aa", "none", "--mixup", "0", "--cutmix", "0"),
        *("--reprob", "0", "--smoothing", "0", "--hflip", "0", "--scale", "1", "1", "--ratio", "1", "1"),
        *("--drop-path", "0", "--workers", "0", "--no-progress", "--threads", "2", "--output", str(output)),
    ]


def grid_points(pairs: list[str]) -> list[dict]:
    """key=v1,v2 ... -> every combination, on top of DEFAULTS."""
    axes = {}
    for pair in pairs:
        key, _, values = pair.partition("=")
        if key not in DEFAULTS:
            raise SystemExit(f"unknown key {key!r}; keys: {', '.join(DEFAULTS)}")
        kind = type(DEFAULTS[key])
        axes[key] = [kind(v) for v in values.split(",")]
    keys = list(axes)
    return [{**DEFAULTS, **dict(zip(keys, combo, strict=True))} for combo in itertools.product(*axes.values())]


def run_point(point: dict, folder: Path) -> dict:
    tick = time.perf_counter()
    result = subprocess.run(train_command(point, folder), capture_output=True, text=True)
    seconds = time.perf_counter() - tick
    metrics = folder / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if result.returncode == 0 else []
    curve = [r["val_top1"] for r in rows]
    record = {**point, "exit": result.returncode, "seconds": round(seconds, 1), "val_top1": curve}
    record.update(best=max(curve, default=None), error=result.stderr[-500:] if result.returncode else None)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--grid", nargs="*", default=[], metavar="KEY=V1,V2")
    parser.add_argument("--work", default="runs/digits_sweep", help="the training runs (checkpoints; not committed)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    found = json.loads((out / "sweep.json").read_text())["points"] if (out / "sweep.json").exists() else []
    for point in grid_points(args.grid):
        if any({k: p[k] for k in DEFAULTS} == point for p in found):
            continue  # resumable: a finished point is kept
        name = "_".join(f"{k}{v}" for k, v in point.items())
        found.append(run_point(point, Path(args.work) / name))
        (out / "sweep.json").write_text(json.dumps({"command": " ".join(sys.argv), "points": found}, indent=1))
        print(json.dumps({k: found[-1][k] for k in (*DEFAULTS, "seconds", "best")}), flush=True)
    lines = ["| task | canvas | clutter | lr | epochs | width | val top-1 last | best | minutes |", "|" + "---|" * 9]
    for p in found:
        last = p["val_top1"][-1] if p["val_top1"] else "failed"
        cells = [p["task"], p["canvas"], p["clutter"], p["lr"], p["epochs"], p["width"], last, p["best"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + f" | {p['seconds'] / 60:.1f} |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
