"""Reading one weights file safely: .pth / .pt without running code (weights_only), or .safetensors; the
state dict unwrapped from a training checkpoint; the EMA weights chosen when there are some; and a file of
another kind (a picture, a text file) named as what it is rather than reported as a corrupt checkpoint."""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file as load_safetensors

from ..errors import UsageError
from .run_folder import saved_weights_kind

EMA_KEYS = ("ema", "model_ema", "state_dict_ema")  # linvit's training checkpoints, timm's and DeiT's

FILE_SIGNATURES = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
    b"\x1f\x8b": "a gzip archive",
    b"PK\x03\x04": "a zip archive",
}


def read_file(path: str | Path) -> dict:
    """The file's contents as saved (a state dict or a checkpoint dict around one), never running code."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: {'a folder, not a checkpoint file' if path.is_dir() else 'no such file'}")
    safetensors = path.suffix == ".safetensors"
    try:
        raw = load_safetensors(str(path)) if safetensors else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - unpickling refusals, corrupt files
        refuse_exported_graph(path)
        kind = foreign_file_kind(path, safetensors)
        if kind is not None:
            expected = "a safetensors file" if safetensors else "a PyTorch checkpoint (torch.save)"
            raise UsageError(f"{path}: not {expected}: it is {kind}") from err
        raise UsageError(f"{path}: cannot read checkpoint safely ({type(err).__name__}: {err})") from err
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: not a state dict or checkpoint ({type(raw).__name__})")
    return raw


def read_weights(path: str | Path, ema: bool | None = None) -> tuple[dict, str]:
    """(state dict, which weights: "ema" or "model") of a weights file.

    A checkpoint holding an EMA gives the EMA weights unless ema is False; a run's model.safetensors holds
    the weights its config.json names. ema=True on a file without an EMA is an error rather than a silent
    fallback.
    """
    path = Path(path)
    raw = read_file(path)
    ema_key = next((k for k in EMA_KEYS if isinstance(raw.get(k), dict)), None)
    if ema_key is not None and ema is not False:
        return unwrap_state_dict(raw[ema_key]), "ema"
    saved = saved_weights_kind(path)
    if saved is not None:
        if ema is not None and (saved == "ema") != ema:
            other = "the raw weights are in last.pth" if saved == "ema" else "the run kept no EMA"
            raise UsageError(f"{path} holds the {saved} weights; {other}")
        return unwrap_state_dict(raw), saved
    if ema:
        raise UsageError(f"{path}: holds no EMA weights")
    return unwrap_state_dict(raw), "model"


def unwrap_state_dict(checkpoint: dict) -> dict:
    """The model weights inside a training checkpoint ({'model': ...}) or a bare state dict, 'module.' stripped."""
    for key in ("model", "state_dict"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    return {k.removeprefix("module."): v for k, v in checkpoint.items()}


def refuse_exported_graph(path: str | Path | None) -> None:
    """A one-line error for a graph `linvit export` wrote for PyTorch (.pt2 from torch.export, TorchScript .pt /
    .ts) where weights are read: torch.load of TorchScript asks for weights_only=False, and a .pt2 is not a run
    folder, both misleading."""
    if path is None or not Path(path).is_file():
        return
    path = Path(path)
    kind = "a torch.export graph (.pt2)" if path.suffix.lower() == ".pt2" else None
    if kind is None and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if any("/code/" in name or name.endswith("/constants.pkl") for name in archive.namelist()):
                kind = "a TorchScript graph"
    if kind is not None:
        raise UsageError(
            f"{path}: {kind}, not weights: give a run folder or a weights file (eval and predict also take an .onnx "
            "export); load this one with torch.export.load or torch.jit.load"
        )


def foreign_file_kind(path: Path, safetensors: bool) -> str | None:
    """What a file that failed to load as weights is instead ("a text file", "a PNG image", ...), or None when
    it looks like the expected format (a checkpoint that is damaged or refused: its own error says more).
    torch.save writes a zip archive (or, before torch 1.6, a pickle: byte 0x80); safetensors begins with an
    8-byte header length and then "{"."""
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        return "an empty file"
    looks_right = head[8:9] == b"{" if safetensors else head.startswith((b"PK\x03\x04", b"\x80"))
    if looks_right:
        return None
    kind = next((k for sig, k in FILE_SIGNATURES.items() if head.startswith(sig)), None)
    if kind is not None:
        return kind
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data of another format"
    return "a text file"
