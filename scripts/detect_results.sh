#!/usr/bin/env bash
# docs/results.md, "Object detection": Faster R-CNN on the simple feature pyramid of each tiny family, one recipe,
# on the embedded detection set (3 digits per 64 px canvas). Prints the Markdown table.
# Usage: bash scripts/detect_results.sh [OUT]   (about 20 CPU minutes on 2 cores)
set -euo pipefail
OUT=${1:-runs/detect}
DATA=data/cmnist64det
[ -d $DATA/detection ] || linvit data cluttered-mnist --output $DATA --canvas 64 --per-class-train 60 \
    --per-class-val 15 --clutter 2 --digits-per-image 3
MODELS="deit_tiny_patch16_224 infvit_tiny_patch16_224 linear_infvit_tiny_patch16_224 katz_infvit_tiny_patch16_224 weightformer_tiny_patch16_224"
for m in $MODELS; do
    [ -f "$OUT/$m/model.safetensors" ] || linvit detect train --data $DATA/detection --train-split train \
        --val-split val --model $m --output $OUT/$m --epochs 3 --batch-size 4 --lr 3e-4 --warmup-epochs 1 \
        --min-size 64 --max-size 64 --anchor-base 8 --pyramid-channels 64 --workers 0 --no-progress \
        --resume auto --model-kwargs patch_size=8
done
python - "$OUT" $MODELS <<'PY'
import json, sys
from pathlib import Path

import torch

import linvit  # noqa: F401
from linvit.models import create_variant
from linvit.utils.flops import count_flops

out, models = Path(sys.argv[1]), sys.argv[2:]
print("| backbone | AP | AP50 | AP75 | train s (3 epochs) | backbone GMACs @64 |")
print("|---|---|---|---|---|---|")
for m in models:
    rows = [json.loads(line) for line in (out / m / "metrics.jsonl").read_text().splitlines()]
    backbone = create_variant(m, num_classes=0, patch_size=8, img_size=64).eval()
    with torch.no_grad():
        gmacs = count_flops(lambda: backbone(torch.zeros(1, 3, 64, 64))) / 2e9
    seconds = sum(r["epoch_seconds"] for r in rows)
    last = rows[-1]
    print(f"| `{m}` | {last['val_AP']:.1f} | {last['val_AP50']:.1f} | {last['val_AP75']:.1f} | {seconds:.0f} | {gmacs:.3f} |")
PY
