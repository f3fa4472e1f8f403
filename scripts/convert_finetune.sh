#!/usr/bin/env bash
# docs/results.md, "Fine-tuning a converted softmax model": for each seed, a softmax DeiT-Tiny trained 8 epochs
# (the source), the source converted to Linear-InfSA and evaluated as is (0 epochs) and fine-tuned for 1 epoch,
# and a Linear-InfSA model trained from scratch for the same 9 epochs in total. Prints the Markdown table.
# Usage: bash scripts/convert_finetune.sh [OUT]   (SEEDS="0 1 2" by default; about 11 CPU minutes per seed)
set -euo pipefail
OUT=${1:-runs/convert}
SEEDS=${SEEDS:-"0 1 2"}
DATA=data/cmnist48
[ -d $DATA ] || linvit data cluttered-mnist --output $DATA --canvas 48 --per-class-train 200 --per-class-val 50 \
    --clutter 3 --seed 0
RECIPE=(--data $DATA --img-size 48 --crop-pct 1.0 --batch-size 16 --lr 5e-4 --drop-path 0 --aa none --mixup 0
    --cutmix 0 --reprob 0 --scale 1 1 --ratio 1 1 --hflip 0 --workers 0 --no-progress)
KW=(--model-kwargs patch_size=6)
train() {  # train OUTPUT ARGS...: skipped when OUTPUT holds finished weights, resumed when it holds a checkpoint
    local out=$1; shift
    [ -f "$out/model.safetensors" ] || linvit train "${RECIPE[@]}" --output "$out" --resume auto "$@" "${KW[@]}"
}
for s in $SEEDS; do
    train $OUT/softmax_s$s --seed $s --model deit_tiny_patch16_224 --epochs 8 --warmup-epochs 1
    linvit eval --data $DATA --img-size 48 --crop-pct 1.0 --workers 0 --model deit_tiny_patch16_224 \
        --convert linear_infsa --checkpoint $OUT/softmax_s$s/model.safetensors --json $OUT/converted0_s$s.json "${KW[@]}"
    train $OUT/converted_s$s --seed $s --model deit_tiny_patch16_224 --epochs 1 --warmup-epochs 0 \
        --pretrained-file $OUT/softmax_s$s/model.safetensors --convert linear_infsa
    train $OUT/scratch_s$s --seed $s --model linear_infvit_tiny_patch16_224 --epochs 9 --warmup-epochs 1
done
python - "$OUT" $SEEDS <<'PY'
import json, statistics, sys
from pathlib import Path

out, seeds = Path(sys.argv[1]), sys.argv[2:]
last = lambda run: json.loads((out / run / "metrics.jsonl").read_text().splitlines()[-1])["val_top1"]
arms = {
    "softmax DeiT-Tiny (source), 8 epochs": [last(f"softmax_s{s}") for s in seeds],
    "source converted to Linear-InfSA, no fine-tuning": [
        json.loads((out / f"converted0_s{s}.json").read_text())["top1"] for s in seeds
    ],
    "source converted to Linear-InfSA + 1 epoch fine-tuning (9 in total)": [last(f"converted_s{s}") for s in seeds],
    "Linear-InfSA from scratch, 9 epochs": [last(f"scratch_s{s}") for s in seeds],
}
print("| model | val top-1, seeds " + ", ".join(seeds) + " | mean | std |")
print("|---|---|---|---|")
for name, values in arms.items():
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    print(f"| {name} | {' / '.join(f'{v:.1f}' for v in values)} | {statistics.mean(values):.1f} | {std:.1f} |")
PY
