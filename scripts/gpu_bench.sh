#!/usr/bin/env bash
# The GPU evidence of docs/benchmarks.md in one short device call (issue 37; scripts/gpu_plan.py runs the plan of
# src/linvit/bench/gpu_plan.py):
#   bash scripts/gpu_bench.sh              # the plan on CUDA, bf16, most important rows first, <= 7 minutes from a
#                                          # cold machine; prints its estimated device time first; each row is appended
#                                          # to $OUT_DIR/points.jsonl as it is measured; a later call resumes (--fresh:
#                                          # measure everything again); the CUDA-only tests run inside it (<= 90 s)
#   bash scripts/gpu_bench.sh --dry-run    # the same plan at tiny sizes on the CPU (well under a minute; CI runs it)
#   bash scripts/gpu_bench.sh --table      # docs/benchmarks.md's GPU section from docs/bench/gpu_h200/plan/points.jsonl
#   bash scripts/gpu_bench.sh gpu_family4l # one of the old per-suite tables (a process per point: longer than a call)
# OUT_DIR defaults to docs/bench/gpu_h200/plan; a different OUT_DIR (a device call's $OUT) starts from the rows
# recorded there, so it resumes too. Extra arguments go to `python scripts/gpu_plan.py run`.
set -euo pipefail
cd "$(dirname "$0")/.."
recorded=docs/bench/gpu_h200/plan
if [[ "${1:-}" == gpu_* ]]; then
  suite=$1
  shift
  exec linvit bench --suite "$suite" --device cuda --dtype bf16 --output "${OUT_DIR:-docs/bench/gpu_h200}" "$@"
fi
docs_section() {
  local tmp
  tmp=$(mktemp)
  python scripts/gpu_plan.py table "$1" >"$tmp"
  python -c 'import sys; from pathlib import Path; from linvit.bench.gpu_plan import BEGIN, END
from linvit.reproduce.report import replace_between
replace_between(Path("docs/benchmarks.md"), BEGIN, END, Path(sys.argv[1]).read_text().rstrip("\n"))' "$tmp"
  rm -f "$tmp"
  echo "updated docs/benchmarks.md's GPU section from $1"
}
case "${1:-}" in
  --dry-run)
    shift
    exec python scripts/gpu_plan.py run --dry-run --fresh --out "${OUT_DIR:-runs/gpu_dry_run}" "$@"
    ;;
  --table)
    docs_section "$recorded/points.jsonl"
    exit 0
    ;;
esac
out=${OUT_DIR:-$recorded}
mkdir -p "$out"
if [ "$out" != "$recorded" ] && [ -f "$recorded/points.jsonl" ] && [ ! -f "$out/points.jsonl" ]; then
  cp "$recorded/points.jsonl" "$out/points.jsonl"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt" || true
python scripts/gpu_plan.py run --out "$out" "$@"
if [ "$out" == "$recorded" ]; then
  docs_section "$recorded/points.jsonl"
fi
