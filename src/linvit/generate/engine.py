"""`linvit generate train`: a class-conditional DiT trained with the DDPM objective on linvit's engine.

Resume (SIGKILL-safe checkpoints), torchrun DDP, EMA weights, run folders and metrics.jsonl are the same as
`linvit train`'s; only the model, the data and the loss differ. Data: the drawn digits (`--data digits:...`,
one grey channel, fresh canvases every epoch) or an image folder with class subfolders (RGB), scaled to
[-1, 1]. With --vae DIR (a diffusers AutoencoderKL on disk) the DiT models the VAE's latents instead
(linvit.generate.latent). The run folder's model.safetensors holds the EMA weights, what sampling uses.
"""

from __future__ import annotations

import dataclasses

import torch
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader

from ..config import TrainConfig
from ..data.digit_tasks import digits_split, is_digits_spec
from ..data.splits import open_split
from ..distributed import all_reduce_sum
from ..engine import Metric, Parts, Run, Task, fit, run_evaluation
from ..errors import UsageError
from ..models import create_dit
from ..utils.runtime import autocast
from .diffusion import ddpm_loss, noise_schedule
from .latent import LatentCodec

# DiT trained S-XL at 1e-4; the tiny CPU model learns much faster at 1e-3 (val loss 0.065 vs 0.085 after 20
# epochs on the digits, softmax mixer, seed 0)
DEFAULT_LR = {"tiny": 1e-3, "S": 1e-4, "B": 1e-4, "L": 1e-4, "XL": 1e-4}


@dataclasses.dataclass
class GenerateConfig(TrainConfig):
    """`linvit generate train`: a DiT of a size and mixer, DDPM noise prediction, EMA weights."""

    mixer: str = "softmax"
    size: str = "tiny"
    patch_size: int = 4
    img_size: int | None = None  # an image folder's images are resized and cropped to this side
    vae: str | None = None
    epochs: int = 30
    lr: float | None = None  # DEFAULT_LR of the size
    weight_decay: float = 0.0
    clip_grad: float | None = 1.0
    class_dropout: float = 0.1
    prediction: str = "epsilon"
    ema_decay: float = 0.999
    val_images: int = 500


class PixelImages(torch.utils.data.Dataset):
    """(image in [-1, 1], label) pairs: the digits' grey channel, or an RGB folder resized to size x size."""

    def __init__(self, data: str, split: str, size: int | None) -> None:
        if is_digits_spec(data):
            self.source, self.channels = digits_split(data, split), 1
            self.size = self.source.canvas
        else:
            from torchvision import transforms

            if size is None:
                open_split(data, split)  # a missing folder or split says so first
                raise UsageError("image folders need --resize-crop PX (the side they are resized and centre-cropped)")
            tf = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor()])
            self.source, self.channels, self.size = open_split(data, split, tf, unreadable="replace"), 3, size
        self.classes = list(self.source.classes)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        image, label = self.source[index][:2]
        return image[: self.channels] * 2 - 1, label


def build_generator(config: GenerateConfig, channels: int, num_classes: int, size: int):
    """The DiT of a run: size, mixer and patch from the config, noise prediction only (no learned variance)."""
    return create_dit(
        config.size,
        config.mixer,
        input_size=size,
        patch_size=config.patch_size,
        in_channels=channels,
        num_classes=num_classes,
        learn_sigma=False,
        class_dropout_prob=config.class_dropout,
    )


class DiffusionLoss(Metric):
    """The DDPM loss on the validation images (their latents with a VAE), with timesteps and noise drawn from
    the run's seed, so every epoch scores the same noisy images."""

    def __init__(self, schedule, device, seed: int, codec: LatentCodec | None = None) -> None:
        self.schedule, self.device, self.codec = schedule, device, codec
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.total, self.count = 0.0, 0

    def update(self, forward, batch) -> None:
        images, labels = (t.to(self.device) for t in batch)
        if self.codec is not None:
            images = self.codec.encode(images, self.generator)
        self.total += float(ddpm_loss(forward, images, labels, self.schedule, self.generator)) * len(images)
        self.count += len(images)

    def result(self) -> float:
        total, count = all_reduce_sum([self.total, self.count], self.device)
        return total / max(count, 1)


class Generation(Task):
    """Class-conditional diffusion: the DDPM loss on pixels (or a VAE's latents); EMA weights are the model."""

    name = "generation"
    command = "generate train"

    def build(self, config: GenerateConfig, device, rank: int, world: int) -> Parts:
        train_set = PixelImages(config.data, "train", config.img_size)
        val_set = PixelImages(config.data, "val", config.img_size)
        val_shard = torch.utils.data.Subset(val_set, list(range(rank, min(len(val_set), config.val_images), world)))
        val_loader = DataLoader(val_shard, batch_size=config.batch_size, num_workers=config.workers)
        self.codec = LatentCodec(config.vae).to(device) if config.vae else None
        self.channels = self.codec.latent_channels if self.codec else train_set.channels
        self.size = self.codec.latent_size(train_set.size) if self.codec else train_set.size
        model = build_generator(config, self.channels, len(train_set.classes), self.size).to(device)
        self.schedule = noise_schedule(config.prediction)
        return Parts(model, train_set, val_loader, label_names=train_set.classes, pin_memory=False)

    def build_ema(self, model, config: GenerateConfig):
        return ModelEmaV3(model, decay=config.ema_decay, use_warmup=True)

    def batch_loss(self, run: Run, batch) -> tuple[torch.Tensor, int]:
        images, labels = (t.to(run.device, non_blocking=True) for t in batch)
        if self.codec is not None:
            images = self.codec.encode(images)
        with autocast(run.device, run.config.amp):
            return ddpm_loss(run.train_net, images, labels, self.schedule), len(images)

    def evaluate(self, run: Run, epoch: int) -> dict:
        metric = DiffusionLoss(self.schedule, run.device, run.config.seed, self.codec)
        return {"val_loss": run_evaluation(run.ema.module, run.parts.val_loader, metric, run.device)}

    def run_info(self, run: Run) -> dict:
        config, train_set = run.config, run.parts.train_set
        return {
            "size": config.size,
            "mixer": config.mixer,
            "patch_size": config.patch_size,
            "channels": self.channels,  # what the DiT models: pixels, or the VAE's latents
            "image_size": self.size,
            "vae": self.codec.folder if self.codec else None,
            "pixel_channels": train_set.channels,
            "pixel_size": train_set.size,
            "num_classes": len(train_set.classes),
            "class_dropout": config.class_dropout,
            "prediction": config.prediction,
            "weights": "ema",
            "data": str(config.data),
            "world_size": run.world,
        }

    def summary(self, run: Run) -> str:
        params = sum(p.numel() for p in run.model.parameters())
        config, images = run.config, len(run.parts.train_set)
        return f"DiT-{config.size} ({config.mixer}): {params:,} params, {images} train images, world {run.world}"


def run_generate_train(config: GenerateConfig) -> list[dict]:
    """`linvit generate train`: the whole run; --lr defaults to DEFAULT_LR of the DiT size (recorded in args.yaml)."""
    if config.lr is None:
        config = config.replace(lr=DEFAULT_LR[config.size])
    return fit(Generation(), config)
