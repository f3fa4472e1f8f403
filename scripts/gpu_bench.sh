#!/usr/bin/env bash
# The GPU tables of docs/benchmarks.md (CUDA, bf16; raw records in docs/bench/gpu_h200/gpu_*/):
#   bash scripts/gpu_bench.sh                  # every table: 116 points, 58 of them compiled
#   bash scripts/gpu_bench.sh gpu_family4l     # one table (48 points), gpu_weightformer (32) or gpu_generate (36)
#   bash scripts/gpu_bench.sh --dry-run        # every point at 32 px on the CPU: checks the plan anywhere
# Each point is a fresh process (~10 s to start on a GPU machine) and each compiled point compiles
# (~10-30 s), so the tables take longer than one 10-minute call: run them one per call there.
# Extra arguments go to `linvit bench` (e.g. --compile off to skip the compiled points). The first call also
# runs the CUDA-only tests into $out/cuda_tests.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
suite=gpu
if [[ "${1:-}" == gpu_* ]]; then
  suite=$1
  shift
fi
if [[ "${1:-}" == "--dry-run" ]]; then
  shift
  exec linvit bench --suite "$suite" --dry-run --device cpu --out "${OUT_DIR:-runs/gpu_dry_run}" "$@"
fi
out=${OUT_DIR:-docs/bench/gpu_h200}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt" || true
# the tests that need CUDA kernels (tests/test_katz_amp.py -k cuda: Katz-InfSA's half products with float32 sums,
# eager and compiled; about a minute), once per output folder, kept beside the tables
if [ ! -f "$out/cuda_tests.txt" ]; then
  timeout 300 python -m pytest -q -rs -k cuda tests/test_katz_amp.py 2>&1 | tee "$out/cuda_tests.txt" || true
fi
exec linvit bench --suite "$suite" --device cuda --dtype bf16 --out "$out" "$@"
