"""`linvit export`: a model (registered name or run folder) as ONNX, a torch.export program (.pt2) or TorchScript.

ONNX and .pt2 graphs fix size-dependent eager choices at export time, one way: token chunking is off
(exported graphs take the whole-tensor path), pure InfSA's "auto" form becomes the form it picks for one
image of the export size (dense up to ops.infsa.DENSE_MAX_SCORES scores, else the two-pass form), Katz-InfSA
sums its series by repeated squaring (ONNX has no linear solve; ops.katz.neumann_by_squaring) and
WeightFormer's per-sample depthwise convolution runs as shifted multiply-adds (a dynamic batch cannot set conv
groups). TorchScript files are scripted (torch.jit.script), so they keep the control flow: any batch, any
input size, pure InfSA's "auto" choice made per input; token chunking stays eager-only.
ONNX files are checked against PyTorch with onnxruntime before the command succeeds, and carry what `linvit
eval` needs to run them (class count, the run's preprocessing: linvit.onnx_runtime). --quantize int8 also
writes OUT.int8.onnx, onnxruntime's dynamic quantization of the checked float32 graph.

--dynamic-size makes H and W symbolic (multiples of the patch, from two patches up) for the InfSA / softmax
InfViT families in ONNX and pt2, and for WeightFormer in pt2 only (multiples of two patches: its predictors
pool 2x2 token windows; its adaptive 3x3 pooling of a symbolic size does not run in onnxruntime at other sizes).
Models with a fixed-size position embedding (timm's default) need dynamic_img_size=True. Every dynamic file is
checked across the range it claims (check_sizes: the export size, the smallest, a non-square one below and one
above it), where the choices above flip (pure InfSA's form is fixed; WeightFormer's association order stays
per input, layers.dynamic). A dynamic ONNX graph carries its own size check (SizeGuard): onnxruntime has
no shape constraints, so without it H, W off the step or under two steps would run and return numbers.

Files are checked against the model the user named, as PyTorch runs it: a run folder as linvit.load_run loads
it (at its own size, resampling its own position table elsewhere; the default --img-size is the run's own).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn as nn
from timm.data import resolve_data_config

from .config import Config
from .errors import UsageError
from .evaluate import other_size_note
from .layers import PureInfSAAttention
from .models import WeightFormer, create_variant, patch_size
from .onnx_runtime import classifier_metadata, quantize_int8, require_onnxruntime, write_metadata
from .ops.infsa import DENSE_MAX_SCORES
from .weights import read_run_config

FORMATS = ("onnx", "pt2", "torchscript")
ONNX_TOLERANCE = 1e-4  # max abs difference to PyTorch in float32
SUFFIX_FORMATS = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript", ".ts": "torchscript"}
MAX_SIDE = 16384  # the largest side a --dynamic-size graph declares


def resolve_format(fmt: str | None, out: Path) -> str:
    """--format, or the one --output's suffix names; a suffix that names another format is an error."""
    implied = SUFFIX_FORMATS.get(out.suffix.lower())
    if fmt is None and implied is None:
        raise UsageError(f"--output {out}: give --format or a suffix among {', '.join(SUFFIX_FORMATS)}")
    if fmt is not None and implied is not None and fmt != implied:
        raise UsageError(f"--output {out} names a {implied} file but --format is {fmt}")
    return fmt or implied


def load_export_model(spec: str, model_kwargs: dict, img_size: tuple[int, int] | None) -> tuple[nn.Module, str, bool]:
    """(model, name, is_run): a registered model name (random init, at img_size when given) or a run folder
    as linvit.load_run loads it: built at its own size, so the file is the trained model and not one with its
    position table resampled at load."""
    run = read_run_config(spec) if Path(spec).is_dir() else None
    if run is not None:
        folder, config = run
        if not config.get("architecture"):
            task = config["linvit"].get("task")
            what = "a student of a torchvision or Hugging Face teacher" if task == "distillation" else f"a {task} run"
            raise UsageError(
                f"{folder}: {what}; export takes timm classifiers (classification runs and timm students); "
                "load it with linvit.load_run and torch.onnx.export it"
            )
        try:
            model = timm.create_model(f"local-dir:{folder}", pretrained=True, **model_kwargs)  # = linvit.load_run
        except RuntimeError as err:  # load_state_dict: the kwargs built another model than the run's
            if not model_kwargs or "loading state_dict" not in str(err):
                raise
            detail = " ".join(str(err).split())[:200]
            raise UsageError(
                f"{folder}: its weights do not fit the model --model-kwargs {model_kwargs} builds ({detail}...); a run "
                "folder builds its own model: leave --model-kwargs out"
            ) from err
        model.label_names = config.get("label_names")  # an .onnx file stores them (predict's labels)
        return model, config["architecture"], True
    if Path(spec).exists():
        raise UsageError(f"{spec}: not a linvit run folder (no config.json from `linvit train`)")
    size = {} if img_size is None else {"img_size": img_size}
    return create_variant(spec, **size, **model_kwargs), spec, False


def own_size(model: nn.Module) -> tuple[int, int]:
    """The input size the model was built for (its position table's, a run's training size)."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is None:
        size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))[-2:]
    return tuple(int(s) for s in size)


def takes_other_sizes(model: nn.Module) -> bool:
    """Whether the model runs at sizes other than own_size (WeightFormer has no position table)."""
    return isinstance(model, WeightFormer) or bool(getattr(model, "dynamic_img_size", False))


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


def size_step(model: nn.Module, fmt: str) -> int:
    """The pixel step of the sizes a --dynamic-size graph accepts (H and W multiples of it, at least two steps),
    or a one-line error where the family's graph cannot take a symbolic size."""
    if fmt == "torchscript":
        raise UsageError("TorchScript files take any input size already; --dynamic-size is for onnx and pt2")
    patch = patch_size(model)[0]
    if isinstance(model, WeightFormer):  # always takes any size; its predictors pool 2x2 token windows
        if fmt == "onnx":  # adaptive 3x3 pooling of a symbolic size: onnxruntime indexes out of range elsewhere
            raise UsageError("WeightFormer takes --dynamic-size in pt2 only (ONNX: a fixed size); use --format pt2")
        return 2 * patch  # an even token grid
    if not getattr(model, "dynamic_img_size", False):
        raise UsageError(
            f"{type(model).__name__} has a fixed-size position embedding; create it with dynamic_img_size=True "
            "(--model-kwargs dynamic_img_size=True) to export it for any size"
        )
    return patch


class SizeGuard(nn.Module):
    """model behind an in-graph size check for dynamic ONNX files: onnxruntime has no shape constraints, so
    the check reads H and W as a tensor (not folded away as symbolic shapes are) and indexes out of range,
    an onnxruntime error (INVALID_ARGUMENT in a Gather node), at sizes the graph does not accept. Adds 0."""

    def __init__(self, model: nn.Module, step: int) -> None:
        super().__init__()
        self.model, self.step = model, step
        self.train(model.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = torch.tensor(x.shape[-2:], device=x.device)
        bad = ((size % self.step) != 0).any() | (size < 2 * self.step).any()
        return self.model(x + torch.zeros(1, dtype=x.dtype, device=x.device)[bad.long()])


def export_model(
    model: nn.Module, fmt: str, out: Path, example: torch.Tensor, dynamic_batch: bool, step: int | None = None
) -> None:
    """Write model to out in fmt for inputs shaped like example: batch dynamic if asked, H and W symbolic
    multiples of step when step is given (ONNX: behind SizeGuard; pt2 programs check their inputs themselves)."""
    axes = {0: torch.export.Dim("batch", min=1, max=4096)} if dynamic_batch else {}
    if step is not None:
        axes[2] = step * torch.export.Dim("height_steps", min=2, max=MAX_SIDE // step)
        axes[3] = step * torch.export.Dim("width_steps", min=2, max=MAX_SIDE // step)
    dims = (axes,) if axes else None
    if fmt == "pt2":
        torch.export.save(torch.export.export(model, (example,), dynamic_shapes=dims), str(out))
    elif fmt == "onnx":
        require_onnx()
        graph = model if step is None else SizeGuard(model, step)
        program = torch.onnx.export(graph, (example,), dynamo=True, dynamic_shapes=dims, verbose=False)
        program.save(str(out))
    elif fmt == "torchscript":  # scripted, not traced: every batch and input size runs
        torch.jit.save(torch.jit.script(model), str(out))
    else:
        raise UsageError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def require_onnx() -> None:
    """A one-line error, not a traceback from inside torch.onnx, when the export extra is missing."""
    import importlib.util

    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f'writing ONNX files needs {", ".join(missing)}: pip install -e ".[export]"')


def onnx_session(path: Path):
    """An onnxruntime CPU session for path, or a one-line error when onnxruntime is missing."""
    try:
        import onnxruntime
    except ImportError as err:
        raise UsageError('checking ONNX files needs onnxruntime: pip install -e ".[export]"') from err
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def check_onnx(model: nn.Module, path: Path, shape: tuple[int, ...], batches: list[int]) -> float:
    """Max abs difference between onnxruntime and PyTorch on random inputs of shape (batch, *shape) per batch."""
    session = onnx_session(path)
    name = session.get_inputs()[0].name
    worst = 0.0
    for batch in batches:
        x = torch.randn(batch, *shape)
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run(None, {name: x.numpy()})[0]
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def check_sizes(img_size: tuple[int, int], step: int | None, run_size: tuple[int, int] | None) -> list[tuple]:
    """The input sizes a file is checked at: the export size; for a dynamic one also the smallest it claims, a
    non-square one below the export size (or beside it when that is the smallest) and one above, so a choice
    that flips with the token count is checked on both sides; a run folder's own size wherever it is accepted."""
    sizes = [img_size]
    if step is not None:
        h, w = img_size
        below = (h - step, w) if h - step >= 2 * step else (h, w + step)
        sizes += [(2 * step, 2 * step), below, (h + step, w + 3 * step)]
        if run_size is not None and run_size[0] % step == 0 and run_size[1] % step == 0 and min(run_size) >= 2 * step:
            sizes.append(run_size)
    return list(dict.fromkeys(sizes))


@dataclasses.dataclass
class ExportConfig(Config):
    """`linvit export`: the model (a registered name or a run folder), the file and what it must accept."""

    model: str | None = None
    model_kwargs: dict = dataclasses.field(default_factory=dict)
    pretrained: bool = False  # the CLI folds it into model_kwargs
    format: str | None = None  # None: from output's suffix
    img_size: list[int] | None = None  # one side or H W; None: a run folder's own size, else the model's
    dynamic_batch: bool = False
    dynamic_size: bool = False
    quantize: str | None = None  # "int8": also an onnxruntime dynamically quantized copy, OUT.int8.onnx
    output: str | None = None


def run_export(config: ExportConfig) -> dict:
    """`linvit export`: write the file, check it (ONNX: onnxruntime; pt2/TorchScript: reloaded), print a summary."""
    size_arg = config.img_size
    img_size = None if size_arg is None else (tuple(size_arg) if len(size_arg) == 2 else (size_arg[0],) * 2)
    if not config.output:
        raise UsageError("give --output FILE (its suffix names the format: .onnx, .pt2, .pt)")
    out = Path(config.output)
    if out.is_dir():
        raise UsageError(f"--output {out} is a folder; give the file to write, e.g. {out / 'model.onnx'}")
    fmt = resolve_format(config.format, out)
    check_quantize(config.quantize, fmt, out)
    model, name, is_run = load_export_model(config.model, config.model_kwargs, img_size)
    model.eval()
    run_size = own_size(model) if is_run else None
    img_size = img_size or own_size(model)
    if is_run and img_size != run_size and not takes_other_sizes(model):
        raise UsageError(
            f"{config.model} takes {run_size[0]} x {run_size[1]} only (a fixed-size position table): export at "
            "that size, or add --model-kwargs dynamic_img_size=True to resample it per input"
        )
    if is_run and (note := other_size_note(config.model, img_size, "export", "exported")):
        print(note, file=sys.stderr)
    reference = copy.deepcopy(model)  # the model as named: the export's fixed choices below do not touch it
    scripted = fmt == "torchscript"
    step = size_step(model, fmt) if config.dynamic_size else None
    chosen = [] if scripted else fix_size_dependent_choices(model, img_size)
    example = torch.randn(2 if config.dynamic_batch else 1, 3, *img_size)
    with torch.no_grad():
        model(example)  # the model's own input checks (patch divisibility, channels) before anything is written
    if step is not None and (img_size[0] % step or img_size[1] % step or min(img_size) < 2 * step):
        raise UsageError(
            f"--dynamic-size exports at multiples of {step} px, at least {2 * step}: --img-size {img_size}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.stem}.partial{out.suffix}")  # renamed to out once checked: never half-written
    batches = [1, 3] if config.dynamic_batch or scripted else [example.shape[0]]
    sizes = check_sizes(img_size, step, run_size)
    try:
        diff = _write_and_check(model, reference, (fmt, config.dynamic_batch), partial, example, batches, sizes, step)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    summary = {"model": name, "format": fmt, "file": str(out), "img_size": list(img_size)}
    if diff > ONNX_TOLERANCE:
        partial.unlink(missing_ok=True)
        raise UsageError(f"exported model differs from PyTorch by {diff:.2e} (> {ONNX_TOLERANCE:g}); nothing written")
    if fmt == "onnx":
        write_metadata(partial, classifier_metadata(name, reference, _data_config(reference, img_size), step))
    partial.replace(out)
    summary.update(dynamic_batch=config.dynamic_batch, max_abs_diff=diff, batches_checked=batches, choices=chosen)
    summary.update(accepted_sizes=accepted_sizes(img_size, step, scripted), sizes_checked=[list(s) for s in sizes])
    _print_summary(summary, fmt, step, out)
    if config.quantize:
        summary["int8"] = write_int8(out, reference, example)
    return summary


def check_quantize(quantize: str | None, fmt: str, out: Path) -> None:
    """A one-line error before anything is exported: --quantize is onnxruntime's, for ONNX files, and --output
    names the float32 graph (the int8 one goes beside it)."""
    if quantize is None:
        return
    if quantize != "int8":
        raise UsageError(f"--quantize {quantize}: only int8 (onnxruntime dynamic quantization)")
    if fmt != "onnx":
        raise UsageError(f"--quantize int8 quantizes ONNX graphs (onnxruntime); --format is {fmt}")
    if out.name.endswith(".int8.onnx"):  # it would hold the float32 graph, and the int8 one X.int8.int8.onnx
        float32 = out.name[: -len(".int8.onnx")] + ".onnx"
        raise UsageError(
            f"--output {out} would hold the float32 graph: give --output {out.with_name(float32)}, and the int8 "
            f"graph is written beside it as {out.name}"
        )
    require_onnxruntime("--quantize int8")


def _data_config(model: nn.Module, img_size: tuple[int, int]) -> dict:
    """The preprocessing eval gives the model (a run's: its pretrained_cfg), at the export size."""
    return resolve_data_config({"input_size": (3, *img_size)}, model=model)


def write_int8(out: Path, reference: nn.Module, example: torch.Tensor) -> dict:
    """OUT.int8.onnx beside out: out's graph with int8 weights; its max abs logit difference to the model on
    the example is reported, not checked (quantization moves logits; top-1 is what `linvit eval` measures)."""
    int8 = out.with_name(f"{out.stem}.int8.onnx")
    quantize_int8(out, int8)
    session = onnx_session(int8)
    got = session.run(None, {session.get_inputs()[0].name: example.numpy()})[0]
    with torch.no_grad():
        diff = float(np.abs(got - reference(example).numpy()).max())
    print(f"int8 -> {int8} ({int8.stat().st_size / 2**20:.1f} MiB); max abs logit diff {diff:.2e} on one input")
    return {"file": str(int8), "max_abs_logit_diff": diff}


def _print_summary(summary: dict, fmt: str, step: int | None, out: Path) -> None:
    diff, sizes = summary["max_abs_diff"], summary["sizes_checked"]
    print(f"{summary['model']} -> {out} ({fmt}, {out.stat().st_size / 2**20:.1f} MiB); max abs diff {diff:.2e}")
    batches = " and ".join(map(str, summary["batches_checked"]))
    checked = ", ".join(f"{h} x {w}" for h, w in sizes)
    print(f"accepts {summary['accepted_sizes']}; checked at {checked}, batch {batches}")
    if step is not None:
        print(f"other sizes: {REFUSAL[fmt]}")
    if fmt == "torchscript":
        print("scripted: runs at any batch and input size (PyTorch deprecates TorchScript; pt2 and onnx are kept up)")
    if summary["choices"]:
        print(
            "pure InfSA forms fixed for export: " + ", ".join(sorted(set(c.split(": ")[1] for c in summary["choices"])))
        )


REFUSAL = {  # what a dynamic file does at a size it does not accept
    "onnx": "onnxruntime fails (INVALID_ARGUMENT in a Gather node: the graph's size check)",
    "pt2": "the program raises (its input shape check)",
}


def accepted_sizes(img_size: tuple[int, int], step: int | None, scripted: bool) -> str:
    """The input sizes the written graph takes, in words."""
    if scripted:
        return "any size the model takes"
    if step is None:
        return f"{img_size[0]} x {img_size[1]} only"
    return f"H and W multiples of {step} px from {2 * step} to {MAX_SIDE}"


def _write_and_check(
    model: nn.Module, reference: nn.Module, form: tuple[str, bool], path: Path, example, batches, sizes, step
) -> float:
    """Export model to path as form (format, dynamic batch) and return the max abs difference of the file's
    outputs to the reference's, at every batch size and input size checked; a size the file fails at is a
    one-line error."""
    fmt, dynamic_batch = form
    with warnings.catch_warnings():  # torch warns on every torch.jit call; one note in run_export says it once
        warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
        with torch.no_grad():
            export_model(model, fmt, path, example, dynamic_batch, step)
        run = _loaded(path, fmt)
        diff = 0.0
        for size in sizes:
            for batch in batches:
                x = torch.randn(batch, 3, *size)
                with torch.no_grad():
                    expected = reference(x)
                    try:
                        got = run(x)
                    except Exception as err:  # a guard of the exported graph, or an op that cannot take the size
                        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        raise UsageError(f"the exported file fails at {size[0]} x {size[1]}: {first}") from err
                diff = max(diff, float((got - expected).abs().max()))
        return diff


def _loaded(path: Path, fmt: str):
    """The written file as a callable on tensors (onnxruntime for ONNX)."""
    if fmt == "pt2":
        return torch.export.load(str(path)).module()
    if fmt == "torchscript":
        return torch.jit.load(str(path))
    session = onnx_session(path)
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run(None, {name: x.numpy()})[0])
