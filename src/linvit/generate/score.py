"""`linvit generate score`: how good a generator's samples are, offline, judged by a linvit classifier.

Two numbers (issue 26): the share of samples the classifier assigns to the class they were asked for, and
the Frechet distance between the classifier's penultimate features of the samples and of real images of the
same data (FID's formula on a digit classifier's features instead of Inception's, which cannot be
downloaded here). Both depend on the classifier: compare generators scored by the same one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import linalg
from tqdm import tqdm

from ..data.digit_tasks import digits_split, is_digits_spec
from ..distributed import resolve_device
from ..errors import UsageError
from ..utils.checkpoint import atomic_write_text
from .sample import SamplingConfig, load_generator, run_codec, sample_images


def load_classifier(run: str | Path) -> torch.nn.Module:
    """A `linvit train` run folder's classifier (timm's local-dir path), in eval mode."""
    import timm

    config = Path(run) / "config.json"
    try:
        task = json.loads(config.read_text()).get("linvit", {}).get("task", "classification")
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"{run}: not a finished `linvit train` run folder (no config.json)") from err
    if task != "classification":
        raise UsageError(f"--classifier {run}: a {task} run, not a classifier")
    return timm.create_model(f"local-dir:{Path(run).resolve()}", pretrained=True).eval()


@torch.no_grad()
def classifier_outputs(classifier, images: torch.Tensor, batch: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, penultimate features) of images in [0, 1] (grey images become RGB), as the classifier was
    trained to see them: its input size and normalisation."""
    cfg = classifier.pretrained_cfg
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    size = tuple(cfg["input_size"][-2:])
    logits, features = [], []
    for start in range(0, len(images), batch):
        x = images[start : start + batch].float()
        x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
        if tuple(x.shape[-2:]) != size:
            x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
        x = ((x - mean) / std).to(next(classifier.parameters()).device)
        pooled = classifier.forward_head(classifier.forward_features(x), pre_logits=True)
        features.append(pooled.double().cpu())
        logits.append(classifier.get_classifier()(pooled).cpu())
    return torch.cat(logits), torch.cat(features)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)) of two feature sets (rows are samples)."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = linalg.sqrtm(cov_a @ cov_b)
    if not np.isfinite(root).all():  # a singular product: the standard offset (as in pytorch-fid)
        offset = np.eye(len(cov_a)) * 1e-6
        root = linalg.sqrtm((cov_a + offset) @ (cov_b + offset))
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root.real))


def real_images(data: str, split: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first count images of a digits split, (N, 1, H, W) in [0, 1], and their labels (N,)."""
    if not is_digits_spec(data):
        raise UsageError("generate score compares with the drawn digits (runs trained on --data digits:...)")
    source = digits_split(data, split)
    items = [source[i] for i in range(min(count, len(source)))]
    return torch.stack([item[0][:1] for item in items]), torch.tensor([int(item[1]) for item in items])


@dataclasses.dataclass
class ScoreConfig(SamplingConfig):
    """`linvit generate score`: num samples (classes in turn) and as many real val images, judged by classifier."""

    num: int = 500
    classifier: str | None = None  # a `linvit train` run folder trained on the same digits
    batch_size: int = 100
    json: str | None = None  # also write the numbers to this file


def run_generate_score(config: ScoreConfig) -> dict:
    """Class accuracy and Frechet distance of the run's samples in the classifier's features, with the same two
    numbers for real images beside them (their scale)."""
    if not config.classifier:
        raise UsageError("give --classifier RUN (a `linvit train` run folder)")
    generator, info = load_generator(config.checkpoint)
    classifier = load_classifier(config.classifier)
    device = resolve_device(config.device)
    generator.to(device)
    classifier.to(device)
    num, batch = config.num, config.batch_size
    labels = torch.arange(num, device=device) % info["num_classes"]
    gen = torch.Generator(device=device).manual_seed(config.seed)
    codec = run_codec(info, device)
    samples, start_time = [], time.perf_counter()
    for start in tqdm(range(0, num, batch), desc="sampling", unit="batch", disable=not config.progress):
        chunk = labels[start : start + batch]
        samples.append(sample_images(generator, info, chunk, config.steps, config.guidance, gen, codec=codec))
    sampling_seconds = time.perf_counter() - start_time
    logits, fake = classifier_outputs(classifier, torch.cat(samples))
    val_images, val_labels = real_images(info["data"], "val", num)
    real_logits, real = classifier_outputs(classifier, val_images)
    _, other_real = classifier_outputs(classifier, real_images(info["data"], "test", num)[0])
    result = {
        "class_accuracy": float((logits.argmax(1) == labels.cpu()).float().mean()),
        "frechet_distance": frechet_distance(real.numpy(), fake.numpy()),
        # the scale of both numbers: the classifier on real val images, and two real sets (val vs test) apart
        "real_class_accuracy": float((real_logits.argmax(1) == val_labels).float().mean()),
        "real_frechet_distance": frechet_distance(real.numpy(), other_real.numpy()),
        "samples": num,
        "real_images": len(real),
        "sampling_seconds": sampling_seconds,
        "device": str(device),
        "steps": config.steps,
        "guidance": config.guidance,
        "seed": config.seed,
        "generator": str(config.checkpoint),
        "classifier": str(config.classifier),
        "mixer": info["mixer"],
    }
    print(
        f"class accuracy {100 * result['class_accuracy']:.1f}% (real images {100 * result['real_class_accuracy']:.1f}%)"
        f"  Frechet distance {result['frechet_distance']:.3f} (real val vs test {result['real_frechet_distance']:.3f})"
    )
    if config.json:
        Path(config.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(json.dumps(result, indent=2), Path(config.json))  # a kill never leaves half a JSON
    return result
