"""`linvit generate train`: a class-conditional DiT trained with the DDPM objective on linvit's engine.

Resume (SIGKILL-safe checkpoints), torchrun DDP, EMA weights, run folders and metrics.jsonl are the same as
`linvit train`'s; only the model, the data and the loss differ. Data: the drawn digits (`--data digits:...`,
one grey channel, fresh canvases every epoch) or an image folder with class subfolders (RGB), scaled to
[-1, 1]. With --vae DIR (a diffusers AutoencoderKL on disk) the DiT models the VAE's latents instead
(linvit.generate.latent). The run folder's model.safetensors holds the EMA weights, what sampling uses.
"""

from __future__ import annotations

from pathlib import Path

import torch
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader

from ..data.digit_tasks import digits_split, is_digits_spec
from ..distributed import all_reduce_sum, cleanup, init_distributed
from ..engine import (
    resume_run,
    run_epochs,
    train_loader,
    train_pass,
    training_recipe,
    training_state,
    wrap_ddp,
    write_run_config,
)
from ..errors import UsageError
from ..evaluate import autocast
from ..models import create_dit
from ..utils.paths import output_dir
from ..utils.runtime import seed_everything
from .diffusion import ddpm_loss, noise_schedule
from .latent import LatentCodec


class PixelImages(torch.utils.data.Dataset):
    """(image in [-1, 1], label) pairs: the digits' grey channel, or an RGB folder resized to size x size."""

    def __init__(self, data: str, split: str, size: int | None) -> None:
        if is_digits_spec(data):
            self.source, self.channels = digits_split(data, split), 1
            self.size = self.source.canvas
        else:
            from torchvision import datasets, transforms

            if size is None:
                raise UsageError("an image folder needs --img-size (the side images are resized and cropped to)")
            folder = Path(data) / split
            if not folder.is_dir():
                raise UsageError(f"{folder}: no such folder (expected DATA/{split}/<class>/*.png)")
            tf = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor()])
            self.source, self.channels, self.size = datasets.ImageFolder(str(folder), tf), 3, size
        self.classes = list(self.source.classes)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.source, "set_epoch"):
            self.source.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        image, label = self.source[index][:2]
        return image[: self.channels] * 2 - 1, label


def build_generator(args, channels: int, num_classes: int, size: int):
    """The DiT of a run: size, mixer and patch from the command, noise prediction only (no learned variance)."""
    return create_dit(
        args.size,
        args.mixer,
        input_size=size,
        patch_size=args.patch_size,
        in_channels=channels,
        num_classes=num_classes,
        learn_sigma=False,
        class_dropout_prob=args.class_dropout,
    )


@torch.no_grad()
def validation_loss(model, loader, schedule, device, seed: int, codec: LatentCodec | None = None) -> float:
    """The DDPM loss on the validation images (their latents with a VAE) with fixed timesteps and noise."""
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    total, count = 0.0, 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        if codec is not None:
            images = codec.encode(images, gen)
        total += float(ddpm_loss(model, images, labels, schedule, gen)) * len(images)
        count += len(images)
    total, count = all_reduce_sum([total, count], device)
    return total / max(count, 1)


# DiT trained S-XL at 1e-4; the tiny CPU model learns much faster at 1e-3 (val loss 0.065 vs 0.085 after 20
# epochs on the digits, softmax mixer, seed 0)
DEFAULT_LR = {"tiny": 1e-3, "S": 1e-4, "B": 1e-4, "L": 1e-4, "XL": 1e-4}


def run_generate_train(args) -> list[dict]:
    if args.lr is None:
        args.lr = DEFAULT_LR[args.size]
    rank, world, device = init_distributed(args.device)
    try:
        return _train(args, rank, world, device)
    finally:
        cleanup()


def _train(args, rank: int, world: int, device) -> list[dict]:
    output = Path(args.output)
    if rank == 0:
        output_dir(output)
    seed_everything(args.seed)
    train_set = PixelImages(args.data, "train", args.img_size)
    val_set = PixelImages(args.data, "val", args.img_size)
    sampler, loader = train_loader(train_set, args, rank, world)
    val_shard = torch.utils.data.Subset(val_set, list(range(rank, min(len(val_set), args.val_images), world)))
    val_loader = DataLoader(val_shard, batch_size=args.batch_size, num_workers=args.workers)
    codec = LatentCodec(args.vae).to(device) if args.vae else None
    channels = codec.latent_channels if codec else train_set.channels
    size = codec.latent_size(train_set.size) if codec else train_set.size
    model = build_generator(args, channels, len(train_set.classes), size).to(device)
    ema = ModelEmaV3(model, decay=args.ema_decay, use_warmup=True)
    optimizer, scheduler, scaler = training_recipe(model, args, len(loader), device)
    start_epoch, history = resume_run(output, args, model, optimizer, scheduler, ema, scaler, rank)
    net = wrap_ddp(model, world, device)
    schedule = noise_schedule(args.prediction)
    run_info = {
        "task": "generation",
        "command": "generate train",
        "size": args.size,
        "mixer": args.mixer,
        "patch_size": args.patch_size,
        "channels": channels,  # what the DiT models: pixels, or the VAE's latents
        "image_size": size,
        "vae": codec.folder if codec else None,
        "pixel_channels": train_set.channels,
        "pixel_size": train_set.size,
        "num_classes": len(train_set.classes),
        "class_dropout": args.class_dropout,
        "prediction": args.prediction,
        "weights": "ema",
        "data": str(args.data),
        "world_size": world,
    }
    if rank == 0:
        write_run_config(output, args)
        params = sum(p.numel() for p in model.parameters())
        print(f"DiT-{args.size} ({args.mixer}): {params:,} params, {len(train_set)} train images, world {world}")

    def batch_loss(batch) -> tuple[torch.Tensor, int]:
        images, labels = (t.to(device, non_blocking=True) for t in batch)
        if codec is not None:
            images = codec.encode(images)
        with autocast(device, args.amp):
            return ddpm_loss(net, images, labels, schedule), len(images)

    def train_epoch(epoch: int) -> dict:
        train_set.set_epoch(epoch)
        after = lambda step: ema.update(model, step=step)  # noqa: E731
        return train_pass(net, loader, batch_loss, optimizer, scheduler, scaler, epoch, args, device, rank, after)

    def evaluate_epoch(epoch: int) -> dict:
        return {"val_loss": validation_loss(ema.module, val_loader, schedule, device, args.seed, codec)}

    def state(epoch: int, rngs: list, hist: list) -> dict:
        return training_state(model, optimizer, scheduler, ema, scaler, epoch, rngs, hist, args)

    return run_epochs(
        args,
        output,
        rank,
        world,
        start_epoch,
        history,
        sampler,
        train_epoch,
        evaluate_epoch,
        state,
        lambda: ema.module,
        run_info=run_info,
        label_names=train_set.classes,
    )
