#!/usr/bin/env bash
# The GPU tables of docs/benchmarks.md in one run (about 10 minutes on one H200):
#   bash scripts/gpu_bench.sh                 # CUDA, bf16: writes docs/bench/gpu_h200/gpu_*/bench.{json,csv,md}
#   bash scripts/gpu_bench.sh --dry-run       # every point at 32 px on the CPU: checks the plan anywhere
# Extra arguments go to `linvit bench` (e.g. --compile off to skip the compiled points).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT_DIR:-docs/bench/gpu_h200}
if [[ "${1:-}" == "--dry-run" ]]; then
  shift
  exec linvit bench --suite gpu --dry-run --device cpu --out "${OUT_DIR:-runs/gpu_dry_run}" "$@"
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt" || true
exec linvit bench --suite gpu --device cuda --dtype bf16 --out "$out" "$@"
