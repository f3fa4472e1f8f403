"""`linvit export`: a model (registered name or run folder) as ONNX, a torch.export program (.pt2) or TorchScript.

ONNX and .pt2 graphs fix size-dependent eager choices at export time, one way: token chunking is off
(exported graphs take the whole-tensor path), pure InfSA's "auto" form becomes the form it picks for one
image of the export size (dense up to ops.infsa.DENSE_MAX_SCORES scores, else the two-pass form), Katz-InfSA
sums its series by repeated squaring (ONNX has no linear solve; ops.katz.neumann_by_squaring) and
WeightFormer's per-sample depthwise convolution runs as shifted multiply-adds (a dynamic batch cannot set conv
groups). TorchScript files are scripted (torch.jit.script), so they keep the control flow: any batch, any
input size, pure InfSA's "auto" choice made per input; token chunking stays eager-only.
ONNX files are checked against PyTorch with onnxruntime before the command succeeds.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn as nn

from .errors import UsageError
from .layers import PureInfSAAttention
from .models import create_variant
from .ops.infsa import DENSE_MAX_SCORES
from .utils.artifacts import read_run_config

FORMATS = ("onnx", "pt2", "torchscript")
ONNX_TOLERANCE = 1e-4  # max abs difference to PyTorch in float32
SUFFIX_FORMATS = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript", ".ts": "torchscript"}


def resolve_format(fmt: str | None, out: Path) -> str:
    """--format, or the one --out's suffix names; a suffix that names another format is an error."""
    implied = SUFFIX_FORMATS.get(out.suffix.lower())
    if fmt is None and implied is None:
        raise UsageError(f"--out {out}: give --format or a suffix among {', '.join(SUFFIX_FORMATS)}")
    if fmt is not None and implied is not None and fmt != implied:
        raise UsageError(f"--out {out} names a {implied} file but --format is {fmt}")
    return fmt or implied


def load_export_model(spec: str, model_kwargs: dict, img_size: tuple[int, int]) -> tuple[nn.Module, str]:
    """A registered model name (random init unless --checkpoint) or a run folder (its trained weights)."""
    run = read_run_config(spec) if Path(spec).is_dir() else None
    if run is not None:
        folder, config = run
        if not config.get("architecture"):
            raise UsageError(f"{folder}: a {config['linvit'].get('task')} run; export takes classification runs")
        model = timm.create_model(f"local-dir:{folder}", pretrained=True, img_size=img_size, **model_kwargs)
        return model, config["architecture"]
    if Path(spec).exists():
        raise UsageError(f"{spec}: not a linvit run folder (no config.json from `linvit train`)")
    return create_variant(spec, img_size=img_size, **model_kwargs), spec


def fix_size_dependent_choices(model: nn.Module, img_size: tuple[int, int]) -> list[str]:
    """Resolve "auto" pure InfSA forms for one image of img_size; returns what was chosen, for the log."""
    chosen = []
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", (16, 16))
    tokens = (img_size[0] // patch[0]) * (img_size[1] // patch[1]) + int(getattr(model, "num_prefix_tokens", 0))
    for name, m in model.named_modules():
        if isinstance(m, PureInfSAAttention) and m.impl == "auto":
            m.impl = "dense" if m.num_heads * tokens * tokens <= DENSE_MAX_SCORES else "chunked"
            chosen.append(f"{name}: {m.impl}")
    if hasattr(model, "set_token_chunk"):
        model.set_token_chunk(None)
    return chosen


def export_model(model: nn.Module, fmt: str, out: Path, example: torch.Tensor, dynamic_batch: bool) -> None:
    """Write model to out in fmt for inputs shaped like example (batch dimension dynamic if asked)."""
    dims = ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic_batch else None
    if fmt == "pt2":
        torch.export.save(torch.export.export(model, (example,), dynamic_shapes=dims), str(out))
    elif fmt == "onnx":
        program = torch.onnx.export(model, (example,), dynamo=True, dynamic_shapes=dims, verbose=False)
        program.save(str(out))
    elif fmt == "torchscript":  # scripted, not traced: every batch and input size runs
        torch.jit.save(torch.jit.script(model), str(out))
    else:
        raise UsageError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def check_onnx(model: nn.Module, path: Path, example: torch.Tensor, batches: list[int]) -> float:
    """Max abs difference between onnxruntime and PyTorch on random inputs of each batch size."""
    try:
        import onnxruntime
    except ImportError as err:
        raise UsageError('checking ONNX files needs onnxruntime: pip install -e ".[export]"') from err
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    worst = 0.0
    for batch in batches:
        x = torch.randn(batch, *example.shape[1:])
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run(None, {name: x.numpy()})[0]
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def run_export(args) -> dict:
    """`linvit export`: write the file, check it (ONNX: onnxruntime; pt2/TorchScript: reloaded), print a summary."""
    img_size = tuple(args.img_size) if len(args.img_size) == 2 else (args.img_size[0],) * 2
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; give the file to write, e.g. {out / 'model.onnx'}")
    args.format = resolve_format(args.format, out)
    model, name = load_export_model(args.model, args.model_kwargs, img_size)
    model.eval()
    scripted = args.format == "torchscript"
    chosen = [] if scripted else fix_size_dependent_choices(model, img_size)
    example = torch.randn(2 if args.dynamic_batch else 1, 3, *img_size)
    with torch.no_grad():
        model(example)  # the model's own input checks (patch divisibility, channels) before anything is written
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")  # renamed to out once checked: nothing half-written at out
    batches = [1, 3] if args.dynamic_batch or scripted else [example.shape[0]]
    try:
        diff = _write_and_check(model, args, partial, example, batches)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    summary = {"model": name, "format": args.format, "file": str(out), "img_size": list(img_size)}
    if diff > ONNX_TOLERANCE:
        partial.unlink(missing_ok=True)
        raise UsageError(f"exported model differs from PyTorch by {diff:.2e} (> {ONNX_TOLERANCE:g}); nothing written")
    partial.replace(out)
    summary.update(dynamic_batch=args.dynamic_batch, max_abs_diff=diff, batches_checked=batches, choices=chosen)
    print(f"{name} -> {out} ({args.format}, {out.stat().st_size / 2**20:.1f} MiB); max abs diff {diff:.2e}")
    if scripted:
        print("scripted: runs at any batch and input size (PyTorch deprecates TorchScript; pt2 and onnx are kept up)")
    if chosen:
        print("pure InfSA forms fixed for export: " + ", ".join(sorted(set(c.split(": ")[1] for c in chosen))))
    return summary


def _write_and_check(model: nn.Module, args, path: Path, example: torch.Tensor, batches: list[int]) -> float:
    """Export to path and return the max abs difference of the file's outputs to PyTorch's."""
    with warnings.catch_warnings():  # torch warns on every torch.jit call; one note in run_export says it once
        warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
        with torch.no_grad():
            export_model(model, args.format, path, example, args.dynamic_batch)
        if args.format == "onnx":
            return check_onnx(model, path, example, batches)
        reloaded = torch.export.load(str(path)).module() if args.format == "pt2" else torch.jit.load(str(path))
        diff = 0.0
        for batch in batches:
            x = torch.randn(batch, *example.shape[1:])
            with torch.no_grad():
                diff = max(diff, float((reloaded(x) - model(x)).abs().max()))
        return diff
