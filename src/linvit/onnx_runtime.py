"""ONNX Runtime as a runtime: the metadata `linvit export` writes into a classifier's .onnx file, its int8
dynamic quantization, and an nn.Module around an onnxruntime session, so that `linvit eval` (and the bench)
run an exported file through the same loops as a PyTorch model.

The metadata (one JSON string under the key "linvit" in the graph's metadata_props) holds what evaluating the
file needs and the file cannot say itself: the task, the class count, and the preprocessing of the run it came
from (timm's data config: input size, interpolation, crop, mean and std), so eval matches the run's own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from .errors import UsageError

METADATA_KEY = "linvit"
INSTALL = 'pip install -e ".[export]"'
DATA_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def require_onnxruntime(what: str):
    """The onnxruntime module, or a one-line error saying what needed it."""
    try:
        import onnxruntime
    except ImportError as err:
        raise UsageError(f"{what} needs onnxruntime: {INSTALL}") from err
    return onnxruntime


def classifier_metadata(name: str, model: nn.Module, data_config: dict, step: int | None) -> dict:
    """What eval needs of an exported classifier: its class count and the run's preprocessing."""
    record = {"task": "classification", "model": name, "num_classes": int(getattr(model, "num_classes", 0))}
    names = getattr(model, "label_names", None)  # a run folder's classes (linvit.load_run), for predict's labels
    if names:
        record["label_names"] = [str(n) for n in names]
    record.update({k: _plain(data_config[k]) for k in DATA_KEYS if k in data_config})
    record["size_step"] = step  # None: the graph takes input_size only
    return record


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def write_metadata(path: Path, record: dict) -> None:
    """Store record as JSON under METADATA_KEY in the file's metadata_props (other keys kept)."""
    import onnx

    graph = onnx.load(str(path))
    kept = [p for p in graph.metadata_props if p.key != METADATA_KEY]
    del graph.metadata_props[:]
    graph.metadata_props.extend(kept)
    graph.metadata_props.add(key=METADATA_KEY, value=json.dumps(record))
    onnx.save(graph, str(path))


def read_metadata(session, path: Path) -> dict:
    """The linvit record of a session's file, or a one-line error for a file linvit did not export."""
    found = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if found is None:
        raise UsageError(f"{path}: no linvit metadata: not a classifier written by `linvit export` (re-export it)")
    record = json.loads(found)
    if record.get("task") != "classification":
        raise UsageError(f"{path}: a {record.get('task')} graph; linvit eval takes classifiers")
    return record


# the operators quantized: the matrix products (onnxruntime's dynamic quantizer writes a Gemm as an int8 MatMul
# plus its bias when MatMul is listed; Gemm has no dynamic quantizer of its own). Convolutions stay float32:
# quantized too (ConvInteger: the patch embedding, WeightFormer's depthwise convolutions) they made WeightFormer-T
# slower than float32 and every family slower than products only (scripts/int8_ops_ab.py,
# docs/bench/onnxruntime/int8_ops.json; docs/benchmarks.md, onnxruntime and int8)
INT8_OPS = ("MatMul",)


def quantize_int8(src: Path, dst: Path) -> None:
    """src's matrix products with int8 weights (onnxruntime's dynamic quantization: QInt8 weights, activations
    quantized per call; INT8_OPS), with src's linvit metadata. No pre-processing pass: its shape inference fails on
    these graphs."""
    require_onnxruntime("--quantize int8")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    quiet = _DropPreprocessAdvice()
    root.addFilter(quiet)
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=list(INT8_OPS))
    finally:
        root.removeFilter(quiet)
    meta = _file_metadata(src)
    if meta is not None:
        write_metadata(dst, meta)


class _DropPreprocessAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _file_metadata(path: Path) -> dict | None:
    import onnx

    for prop in onnx.load(str(path), load_external_data=False).metadata_props:
        if prop.key == METADATA_KEY:
            return json.loads(prop.value)
    return None


def refuse_pytorch_flags(config, **more: bool) -> None:
    """One line naming the flags given that change how PyTorch builds or runs a model (config: an eval or predict
    config; more: the command's own, e.g. ``{"--maps": ...}``): an exported graph runs in onnxruntime as exported."""
    folded = {"pretrained"} if config.pretrained else set()  # the CLI folds --pretrained into the kwargs
    given = {
        "--model": config.model is not None,
        "--model-kwargs": any(k not in folded for k in config.model_kwargs),
        "--pretrained": config.pretrained or bool(config.model_kwargs.get("pretrained")),
        **more,
        "--amp": config.amp not in ("none", "auto"),  # auto: float32 for a graph
        "--compile": config.compile != "off",
        "--device": config.device not in ("auto", "cpu"),
    }
    bad = [flag for flag, on in given.items() if on]
    if bad:
        raise UsageError(f"{', '.join(bad)}: not for an .onnx file (it runs in onnxruntime on CPU as exported)")


def cpu_session(path: Path, threads: int | None = None, spinning: bool = True):
    """An onnxruntime CPU session for path (intra-op threads as given, else onnxruntime's default). spinning False:
    its worker threads sleep between runs instead of spinning on (onnxruntime's default), for sessions that take
    turns on few cores (scripts/int8_ops_ab.py)."""
    ort = require_onnxruntime("running ONNX files")
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own Fail / InvalidProtobuf types
        raise UsageError(f"{path}: onnxruntime cannot load it ({str(err).splitlines()[0]})") from err


class OnnxClassifier(nn.Module):
    """An exported classifier as a module: forward runs the onnxruntime session on CPU float32 tensors. A graph
    exported for a fixed batch runs in slices of that batch (the last one padded)."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.session = cpu_session(self.path, threads)
        self.meta = read_metadata(self.session, self.path)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1 or len(outputs[0].shape) != 2:
            raise UsageError(f"{self.path}: expected one image input and one (batch, classes) output")
        self.input_name = inputs[0].name
        batch = inputs[0].shape[0]
        self.fixed_batch = batch if isinstance(batch, int) else None
        self.num_classes = int(self.meta["num_classes"])
        self.label_names = self.meta.get("label_names")  # None for files exported before they were stored
        self.pretrained_cfg = self.data_config()  # what timm's resolve_model_data_config reads (predict)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().to("cpu", torch.float32).numpy()
        if self.fixed_batch is None:
            return torch.from_numpy(self._run(x))
        step, parts = self.fixed_batch, []
        for start in range(0, len(x), step):
            part = x[start : start + step]
            pad = np.zeros((step - len(part), *part.shape[1:]), dtype=part.dtype)
            parts.append(self._run(np.concatenate([part, pad]))[: len(part)])
        return torch.from_numpy(np.concatenate(parts))

    def _run(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: x})[0]

    def data_config(self, img_size: int | list[int] | None = None, crop_pct: float | None = None) -> dict:
        """timm's data config of the run the file came from; img_size only where the graph takes it."""
        config = {k: (tuple(v) if isinstance(v, list) else v) for k, v in self.meta.items() if k in DATA_KEYS}
        if crop_pct is not None:
            config["crop_pct"] = crop_pct
        if img_size is not None:
            size = tuple(img_size) if isinstance(img_size, (list, tuple)) else (img_size, img_size)
            size = size * 2 if len(size) == 1 else size
            if size != tuple(config["input_size"][-2:]):
                self._check_size(size)
                config["input_size"] = (3, *size)
        return config

    def _check_size(self, size: tuple[int, int]) -> None:
        step, own = self.meta.get("size_step"), tuple(self.meta["input_size"][-2:])
        if step is None:
            raise UsageError(f"{self.path} takes {own[0]} x {own[1]} only (exported without --dynamic-size)")
        if size[0] % step or size[1] % step or min(size) < 2 * step:
            raise UsageError(f"{self.path} takes H and W multiples of {step} px from {2 * step}: got {size}")
