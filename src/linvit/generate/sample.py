"""`linvit generate sample`: images of chosen classes from a `linvit generate train` run, as one grid PNG."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tqdm import tqdm

from ..config import Config
from ..distributed import resolve_device
from ..errors import UsageError
from ..models import create_dit
from ..utils.checkpoint import atomic_write
from .diffusion import ddim_sample
from .latent import LatentCodec


def load_generator(run: str | Path) -> tuple[torch.nn.Module, dict]:
    """The run's DiT with its (EMA) weights, and the run's record (config.json "linvit")."""
    run = Path(run)
    try:
        info = json.loads((run / "config.json").read_text())["linvit"]
    except (OSError, KeyError, json.JSONDecodeError) as err:
        raise UsageError(f"{run}: not a finished `linvit generate train` run folder (no config.json)") from err
    if info.get("task") != "generation":
        raise UsageError(f"{run}: a {info.get('task', 'classification')} run, not a generation run")
    model = create_dit(
        info["size"],
        info["mixer"],
        input_size=info["image_size"],
        patch_size=info["patch_size"],
        in_channels=info["channels"],
        num_classes=info["num_classes"],
        learn_sigma=False,
        class_dropout_prob=info["class_dropout"],
    )
    model.load_state_dict(load_file(str(run / "model.safetensors")), strict=True)
    return model.eval(), info


def run_codec(info: dict, device) -> LatentCodec | None:
    """The run's VAE (latent runs), or None (pixel runs)."""
    return LatentCodec(info["vae"]).to(device) if info.get("vae") else None


def sample_images(model, info: dict, labels: torch.Tensor, steps: int, guidance: float, generator, **options):
    """Samples of labels in [0, 1] at the run's image side (or options["img_size"]): DDIM in the model's space,
    then, for a latent run, decoded by the run's VAE. options: img_size, progress (a wrapper of the steps),
    codec (run_codec's result, to load the VAE once for many calls; loaded here when not given)."""
    codec = options["codec"] if "codec" in options else run_codec(info, labels.device)
    size = options.get("img_size") or info.get("pixel_size", info["image_size"])
    side = codec.latent_size(size) if codec is not None else size
    shape = (info["channels"], side, side)
    prediction = info.get("prediction", "epsilon")
    progress = options.get("progress")
    images = ddim_sample(
        model, labels, shape, steps, guidance, generator, progress, clip=codec is None, prediction=prediction
    )
    if codec is not None:
        images = codec.decode(images)
    return ((images.clamp(-1, 1) + 1) / 2).cpu()


def class_list(text: str, num_classes: int) -> list[int]:
    """ "0,1,2" -> [0, 1, 2], each checked against the run's classes."""
    try:
        classes = [int(c) for c in text.split(",") if c.strip()]
    except ValueError as err:
        raise UsageError(f"--classes takes class indices like 0,1,2; got {text!r}") from err
    bad = [c for c in classes if not 0 <= c < num_classes]
    if not classes or bad:
        raise UsageError(f"--classes must name classes 0..{num_classes - 1}; got {text!r}")
    return classes


@dataclasses.dataclass
class SamplingConfig(Config):
    """What every command sampling a `generate train` run shares: the run, how many samples, DDIM's settings."""

    checkpoint: str | None = None  # the run folder
    num: int = 64
    steps: int = 50  # DDIM steps
    guidance: float = 2.0  # classifier-free guidance scale (1 = none)
    seed: int = 0
    device: str = "auto"
    progress: bool = True


@dataclasses.dataclass
class SampleConfig(SamplingConfig):
    """`linvit generate sample`: a grid PNG (and .npz) of chosen classes, at the run's side or another."""

    classes: str | None = None  # "0,1,2"; None: every class
    side: int | None = None  # the samples' square side; None: the run's
    output: str | None = None  # the grid PNG


def run_generate_sample(config: SampleConfig) -> torch.Tensor:
    """Sample, then write the grid and the samples with their labels (.npz next to it)."""
    from torchvision.utils import save_image

    if not config.output:
        raise UsageError("give --output GRID.png")
    model, info = load_generator(config.checkpoint)
    device = resolve_device(config.device)
    model.to(device)
    classes = class_list(config.classes, info["num_classes"]) if config.classes else list(range(info["num_classes"]))
    labels = torch.tensor([classes[i % len(classes)] for i in range(config.num)], device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    bar = (lambda steps: tqdm(steps, desc="sampling", unit="step")) if config.progress else None
    images = sample_images(
        model, info, labels, config.steps, config.guidance, generator, img_size=config.side, progress=bar
    )
    out = Path(config.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a kill leaves the old files or none, never a torn one; re-running reproduces them (seeded)
    arrays = dict(images=images.numpy(), labels=labels.cpu().numpy())
    atomic_write(out.with_suffix(".npz"), lambda tmp: np.savez_compressed(tmp, **arrays))
    nrow = max(1, min(len(classes), config.num)) if len(classes) > 1 else 8
    atomic_write(out, lambda tmp: save_image(images, tmp, nrow=nrow, padding=1))
    steps = f"{config.steps} DDIM steps, guidance {config.guidance}"
    print(f"wrote {out} ({config.num} samples of classes {classes}, {steps})")
    return images
