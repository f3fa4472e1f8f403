"""Each family's share of the machine's GEMM peak, per dtype, and docs/benchmarks.md's table from it.

`linvit bench` once per dtype writes docs/bench/share/<dtype>.json (its records carry the CPU, extensions,
threads, the GEMM peak measured in the same run and each point's share of it), and docs/benchmarks.md's share
table is generated from those files (measuring rewrites both, in this checkout).

    python scripts/share_table.py --res 224,1024 --threads 2 --note "quiet machine"   # measure, then the table
    python scripts/share_table.py --table-only                                    # the table from the JSON
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from linvit.bench.report import SHARE_BEGIN, SHARE_END, shares_section

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "docs" / "bench" / "share"
DOC = ROOT / "docs" / "benchmarks.md"
FAMILIES = (  # fused softmax, Linear-InfSA, Katz-InfSA, WeightFormer
    "vit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
    "weightformer_tiny_patch16_224",
)
DTYPES = ("fp32", "bf16")


def measure(dtype: str, args: argparse.Namespace) -> None:
    """One `linvit bench` run (all families, one dtype); its bench.json, with the note, kept as <dtype>.json."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["linvit", "bench", "--models", ",".join(FAMILIES), "--res", args.res, "--batch", "1"]
        argv += ["--iters", str(args.iters), "--threads", str(args.threads), "--dtype", dtype, "--output", tmp]
        subprocess.run(argv, check=True)
        data = json.loads((Path(tmp) / "bench.json").read_text())
    data["note"] = args.note
    data["script"] = f"python scripts/share_table.py --res {args.res} --threads {args.threads} --iters {args.iters}"
    FOLDER.mkdir(parents=True, exist_ok=True)
    (FOLDER / f"{dtype}.json").write_text(json.dumps(data, indent=2) + "\n")


def section() -> str:
    """The table from the committed JSON, dtypes in DTYPES order."""
    runs = {d: json.loads((FOLDER / f"{d}.json").read_text()) for d in DTYPES if (FOLDER / f"{d}.json").exists()}
    return shares_section(runs)


def write_table() -> None:
    """Replace docs/benchmarks.md's text between the share markers."""
    text = DOC.read_text()
    start, end = text.index(SHARE_BEGIN), text.index(SHARE_END) + len(SHARE_END)
    DOC.write_text(text[:start] + section() + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--res", default="224,1024", help="comma list: every family at each size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--note", default="", help="the machine's state, stored in the JSON and shown in the table")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    if not args.table_only:
        shutil.rmtree(FOLDER, ignore_errors=True)
        for dtype in DTYPES:
            measure(dtype, args)
    write_table()
    print(section())


if __name__ == "__main__":
    main()
