"""`linvit predict --native` on one 8192 x 8192 photograph: wall time and peak memory of the whole command.

The picture is scikit-learn's china.jpg upscaled to 8192 x 8192 (a JPEG written to a temporary folder, nothing
committed). Each row is one `linvit predict` process, measured from outside: wall seconds, and the peak resident
set size of that process (getrusage of a parent whose only child it is). Writes OUT/bench.json and OUT/bench.md.

    python scripts/bench_predict_native.py --out docs/bench/predict_native
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEASURE = """
import resource, subprocess, sys, time
tick = time.perf_counter()
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)
print(code, time.perf_counter() - tick, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def make_picture(folder: Path, side: int) -> Path:
    import sklearn.datasets
    from PIL import Image

    photo = Path(sklearn.datasets.__file__).parent / "images" / "china.jpg"
    path = folder / f"china_{side}.jpg"
    Image.open(photo).resize((side, side), Image.BICUBIC).save(path, quality=90)
    return path


def measure(argv: list[str]) -> dict:
    """Exit code, wall seconds and peak RSS (MB) of one command, in its own process tree."""
    line = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, check=True)
    code, seconds, kilobytes = line.stdout.split()
    return {"exit": int(code), "seconds": round(float(seconds), 1), "peak_mb": round(int(kilobytes) / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--side", type=int, default=8192)
    parser.add_argument("--models", default="linear_infvit_tiny_patch16_224,linear_infvit_4l_patch16_224")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        picture = make_picture(Path(tmp), args.side)
        for model in args.models.split(","):
            for maps in (False, True):
                argv = ["linvit", "predict", str(picture), "--model", model, "--native", "--no-progress"]
                argv += ["--threads", str(args.threads), "--output", f"{tmp}/preds.jsonl"]
                argv += ["--maps", f"{tmp}/maps"] if maps else []
                record = measure(argv)
                rows.append({"model": model, "maps": maps, "command": " ".join(argv[:1] + argv[1:]), **record})
                print(json.dumps(rows[-1]), flush=True)
    meta = {"side": args.side, "tokens": (args.side // 16) ** 2, "machine": platform.machine()}
    meta["date"] = time.strftime("%Y-%m-%d")
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "| model | --maps | exit | seconds | peak MB |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        maps = "yes" if r["maps"] else "no"
        lines.append(f"| `{r['model']}` | {maps} | {r['exit']} | {r['seconds']:,} | {r['peak_mb']:,} |")
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
