"""Issue 46's memory benchmark: each rank's parameters + gradients + optimizer state under fsdp against ddp, two
CPU processes (gloo), random weights, a few steps of `linvit train` on the drawn digits.

    python scripts/fsdp_memory.py                       # infvit_24l (304M parameters); writes runs/fsdp_memory
    python scripts/fsdp_memory.py --publish docs        # ... and docs/bench/fsdp_memory.json, the benchmarks.md table

The numbers are what each run records (config.json: linvit.state_bytes_per_rank, the local shards under fsdp).
The whole model is 16 bytes a parameter under AdamW in float32 (weights, gradients, two moments); fsdp keeps
1/world of it per rank. Activations are not counted (they depend on the batch, not the strategy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from linvit.reproduce.report import replace_between

MODELS = {"infvit_24l_patch16_224": ["--img-size", "64"]}
BEGIN, END = "<!-- fsdp-memory:begin -->", "<!-- fsdp-memory:end -->"


def train(model: str, extra: list[str], strategy: str, out: Path) -> dict:
    """One two-process run of a few steps; its recorded state bytes per rank and the wall time."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517"]
    argv += ["-m", "linvit", "train", "--data", "digits:digit,canvas=64,length=16", "--model", model, *extra]
    argv += ["--strategy", strategy, "--epochs", "1", "--batch-size", "4", "--workers", "0", "--no-progress"]
    argv += ["--device", "cpu", "--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0"]
    argv += ["--output", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=env)
    seconds = time.perf_counter() - start
    info = json.loads((out / "config.json").read_text())["linvit"]
    return {"state_bytes_per_rank": info["state_bytes_per_rank"], "seconds": round(seconds, 1)}


def measure(out: Path) -> dict:
    rows = []
    for model, extra in MODELS.items():
        row = {"model": model}
        for strategy in ("ddp", "fsdp"):
            row[strategy] = train(model, extra, strategy, out / f"{model}_{strategy}")
        row["fsdp_over_ddp"] = max(row["fsdp"]["state_bytes_per_rank"]) / max(row["ddp"]["state_bytes_per_rank"])
        rows.append(row)
    return {"world_size": 2, "backend": "gloo (CPU)", "optimizer": "AdamW, float32", "rows": rows}


def table(record: dict) -> str:
    lines = [
        "| model | ddp state per rank (MiB) | fsdp state per rank (MiB) | fsdp / ddp |",
        "|---|---|---|---|",
    ]
    for row in record["rows"]:
        ddp, fsdp = (row[s]["state_bytes_per_rank"] for s in ("ddp", "fsdp"))
        cells = [" / ".join(f"{b / 2**20:,.0f}" for b in ranks) for ranks in (ddp, fsdp)]
        lines.append(f"| {row['model']} | {cells[0]} | {cells[1]} | {row['fsdp_over_ddp']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/fsdp_memory")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--publish", default=None, metavar="DOCS")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        (out / "summary.json").write_text(json.dumps(measure(out), indent=2))
    record = json.loads((out / "summary.json").read_text())
    print(table(record))
    if args.publish:
        docs = Path(args.publish)
        (docs / "bench/fsdp_memory.json").write_text(json.dumps(record, indent=2))
        replace_between(docs / "benchmarks.md", BEGIN, END, f"{BEGIN}\n{table(record)}\n{END}")


if __name__ == "__main__":
    main()
