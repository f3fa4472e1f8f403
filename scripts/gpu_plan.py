"""The GPU plan's runner (linvit.bench.gpu_plan) on the command line; scripts/gpu_bench.sh calls it.

    python scripts/gpu_plan.py run [--dry-run] [--out DIR] ...   # estimate, then rows as they are measured
    python scripts/gpu_plan.py table [JSONL]                     # docs/benchmarks.md's GPU section

A script rather than part of the library (issue 47): linvit keeps no argument parser below linvit_cli.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linvit.bench.gpu_plan import BUDGET_S, DRY_REFERENCE, RECORDED, run, section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_plan.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="the plan: estimate, then rows as they are measured")
    p.add_argument("--out", type=Path, default=RECORDED)
    p.add_argument("--dry-run", action="store_true", help="the same plan at tiny sizes on the CPU")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall time for points and tests")
    p.add_argument("--fresh", action="store_true", help="measure every point again (else resume)")
    p.add_argument("--no-tests", action="store_true", help="skip the CUDA-only tests")
    p.add_argument("--reference", type=Path, default=DRY_REFERENCE, help="a CPU dry run's JSONL for the estimate")
    t = sub.add_parser("table", help="docs/benchmarks.md's GPU section (markers included) from a JSONL")
    t.add_argument("jsonl", type=Path, nargs="?", default=RECORDED / "points.jsonl")
    args = parser.parse_args(argv)
    if args.cmd == "table":
        print(section(args.jsonl))
        return 0
    return run(args.out, args.dry_run, args.budget_s, args.fresh, args.reference, not args.no_tests)


if __name__ == "__main__":
    sys.exit(main())
