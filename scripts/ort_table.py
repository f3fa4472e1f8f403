"""onnxruntime float32 and int8 against PyTorch eager, every family, and docs/benchmarks.md's table from it.

One `linvit bench --runtime onnxruntime-int8` run times each point three ways (eager, the exported graph, its
int8 quantization) and is kept as docs/bench/onnxruntime/bench.json; beside it, one float32 matrix product's rate
in each library (PyTorch's BLAS and onnxruntime's MLAS, same size and threads) goes to gemm.json, since that is
where the two runtimes differ most. docs/benchmarks.md's onnxruntime table is generated from those files
(measuring rewrites both, in this checkout).

    python scripts/ort_table.py --res 224,512,1024 --threads 2 --note "quiet machine"   # measure, then the table
    python scripts/ort_table.py --gemm-only --threads 2 --note "quiet machine"          # the GEMM rates alone
    python scripts/ort_table.py --table-only                                             # the table from the JSON
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from linvit.bench.report import machine_line

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "docs" / "bench" / "onnxruntime" / "bench.json"
GEMM_FILE = FILE.with_name("gemm.json")
GEMM_N, GEMM_REPS, GEMM_BEST_OF = 2048, 10, 5
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- onnxruntime:begin -->", "<!-- onnxruntime:end -->"
FAMILIES = (  # fused softmax, pure InfSA, Linear-InfSA, Katz-InfSA, WeightFormer
    "vit_4l_patch16_224",
    "infvit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
    "weightformer_tiny_patch16_224",
)
RUNTIMES = ("eager", "onnxruntime", "onnxruntime-int8")


def measure(args: argparse.Namespace) -> None:
    """One `linvit bench` run over every family and size; its bench.json, with the note, kept."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["linvit", "bench", "--models", ",".join(FAMILIES), "--res", args.res, "--batch", "1"]
        argv += ["--iters", str(args.iters), "--threads", str(args.threads), "--runtime", "onnxruntime-int8"]
        subprocess.run([*argv, "--output", tmp], check=True)
        data = json.loads((Path(tmp) / "bench.json").read_text())
    data["note"] = args.note
    data["script"] = f"python scripts/ort_table.py --res {args.res} --threads {args.threads} --iters {args.iters}"
    FILE.parent.mkdir(parents=True, exist_ok=True)
    FILE.write_text(json.dumps(data, indent=2) + "\n")


def _best_rate(run, n: int) -> float:
    """GFLOP/s of an n x n float32 product, the best of GEMM_BEST_OF windows of GEMM_REPS products."""
    run()  # the library's kernel choice and first touch
    seconds = []
    for _ in range(GEMM_BEST_OF):
        start = time.perf_counter()
        for _ in range(GEMM_REPS):
            run()
        seconds.append(time.perf_counter() - start)
    return 2 * n**3 * GEMM_REPS / min(seconds) / 1e9


def measure_gemm(args: argparse.Namespace) -> None:
    """One float32 product in PyTorch (its BLAS) and in an onnxruntime session (MLAS), same size and threads."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper

    torch.set_num_threads(args.threads)
    n = GEMM_N
    a, b = torch.randn(n, n), torch.randn(n, n)
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, n]) for name in "ABC"]
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm", io[:2], io[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"A": a.numpy(), "B": b.numpy()}
    blas = torch.__config__.show().split("BLAS_INFO=")[1].split(",")[0]
    rates = {
        f"pytorch ({blas})": _best_rate(lambda: a @ b, n),
        "onnxruntime (MLAS)": _best_rate(lambda: session.run(None, feed), n),
    }
    record = {
        "n": n,
        "threads": args.threads,
        "gflops_per_s": rates,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
    }
    record["note"] = args.note
    GEMM_FILE.write_text(json.dumps(record, indent=2) + "\n")


def _cell(point: dict | None, eager: dict | None) -> list[str]:
    """A runtime's latency and its speed against eager (eager ms / this ms: above 1 is faster)."""
    if not point or point["status"] != "ok":
        return [point["status"] if point else "-", "-"]
    ratio = eager["latency_ms"] / point["latency_ms"] if eager and eager["status"] == "ok" else None
    return [f"{point['latency_ms']:,.1f}", "-" if ratio is None else f"{ratio:.2f}x"]


def section(data: dict, gemm: dict | None = None) -> str:
    """Per model and size: eager ms, then each graph's ms and its speed against eager; gemm: each library's
    float32 product rate (measure_gemm), in the notes."""
    points = {(p["model"], p["res"], p.get("runtime", "eager")): p for p in data["points"]}
    head = ["model", "res", "eager ms", "onnxruntime fp32 ms", "vs eager", "onnxruntime int8 ms", "vs eager"]
    head.append("int8 vs fp32 graph")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, res in dict.fromkeys((m, r) for m, r, _ in points):
        eager, fp32, int8 = (points.get((model, res, r)) for r in RUNTIMES)
        cells = [f"`{model}`", str(res), *_cell(eager, eager)[:1], *_cell(fp32, eager), *_cell(int8, eager)]
        both = fp32 and int8 and fp32["status"] == int8["status"] == "ok"
        cells.append(f"{fp32['latency_ms'] / int8['latency_ms']:.2f}x" if both else "-")
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", f"- {machine_line(data.get('machine') or {})}; `{data.get('script') or data.get('command')}`"]
    if data.get("note"):
        notes.append(f"  {data['note']}")
    if gemm is not None:
        rates = ", ".join(f"{lib} {rate:,.0f}" for lib, rate in gemm["gflops_per_s"].items())
        notes.append(
            f"- One {gemm['n']} x {gemm['n']} float32 product on {gemm['threads']} threads, GFLOP/s: {rates} "
            f"(`python scripts/ort_table.py --gemm-only`). {gemm.get('note') or ''}".rstrip()
        )
    return "\n".join([BEGIN, *lines, *notes, END])


def write_table(text: str) -> None:
    doc = DOC.read_text()
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    DOC.write_text(doc[:start] + text + doc[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--res", default="224,512,1024")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--note", default="", help="the machine's state, stored in the JSON and shown in the table")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--gemm-only", action="store_true", help="measure the GEMM rates alone, then the table")
    args = parser.parse_args()
    if not args.table_only:
        if not args.gemm_only:
            measure(args)
        measure_gemm(args)
    gemm = json.loads(GEMM_FILE.read_text()) if GEMM_FILE.is_file() else None
    text = section(json.loads(FILE.read_text()), gemm)
    write_table(text)
    print(text)


if __name__ == "__main__":
    main()
