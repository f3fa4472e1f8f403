"""Which operators `linvit export --quantize int8` should quantize: every one onnxruntime supports (its default)
against the matrix products only (onnx_runtime.INT8_OPS), each family at one size, in one process.

    python scripts/int8_ops_ab.py --models weightformer_tiny_patch16_224,vit_4l_patch16_224 --res 224 --threads 2

Prints the median of 5 runs (ms) of the float32 graph and of both quantizations, interleaved, batch 1.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import timm
import torch

import linvit  # noqa: F401 - registers the models
from linvit.export import export_model, fix_size_dependent_choices
from linvit.onnx_runtime import INT8_OPS, cpu_session


def graphs(name: str, res: int, folder: Path) -> dict[str, Path]:
    """The float32 graph of name at res, and its two int8 quantizations."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    fix_size_dependent_choices(model, (res, res))
    path = folder / "fp32.onnx"
    with torch.no_grad():
        export_model(model, "onnx", path, torch.randn(1, 3, res, res), dynamic_batch=False)
    found = {"float32": path}
    for label, ops in (("int8, every operator", None), ("int8, products only", list(INT8_OPS))):
        found[label] = folder / f"{len(found)}.onnx"
        quantize_dynamic(str(path), str(found[label]), weight_type=QuantType.QInt8, op_types_to_quantize=ops)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="weightformer_tiny_patch16_224")
    p.add_argument("--res", type=int, default=224)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(1, 3, args.res, args.res).numpy()
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            sessions = {k: cpu_session(v, args.threads) for k, v in graphs(name, args.res, Path(tmp)).items()}
            feed = {next(iter(sessions.values())).get_inputs()[0].name: x}
            times = {k: [] for k in sessions}
            for session in sessions.values():
                session.run(None, feed)  # warm-up
            for _ in range(5):
                for label, session in sessions.items():
                    start = time.perf_counter()
                    session.run(None, feed)
                    times[label].append(1000 * (time.perf_counter() - start))
        medians = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in times.items())
        print(f"{name} @ {args.res}: {medians} ms", flush=True)


if __name__ == "__main__":
    main()
