"""Latent diffusion: a diffusers AutoencoderKL the user has on disk maps images to the latents a DiT models.

As in DiT (Peebles & Xie 2023): images in [-1, 1] are encoded to a sample of the VAE's posterior times its
scaling factor (0.18215 for Stable Diffusion's VAE); samples are decoded after dividing by it. The VAE stays
frozen and is never saved in the run: the run folder records its path, and sampling loads it from there.
Nothing is downloaded: DIR is a folder written by `AutoencoderKL.save_pretrained` (for example a local copy
of stabilityai/sd-vae-ft-ema).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UsageError


class LatentCodec(torch.nn.Module):
    """A frozen AutoencoderKL as encode (images -> scaled latents) and decode (scaled latents -> images)."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__()
        try:
            from diffusers import AutoencoderKL
        except ImportError as err:
            raise UsageError('latent diffusion needs diffusers: pip install -e ".[generate]"') from err
        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise UsageError(f"--vae {folder}: not a folder written by diffusers' AutoencoderKL.save_pretrained")
        try:
            self.vae = AutoencoderKL.from_pretrained(str(folder)).eval().requires_grad_(False)
        except (OSError, ValueError, TypeError) as err:
            raise UsageError(f"--vae {folder}: cannot load an AutoencoderKL from it ({err})") from err
        config = self.vae.config
        self.folder = str(folder)
        self.scale = float(config.scaling_factor)
        self.latent_channels = int(config.latent_channels)
        self.image_channels = int(config.in_channels)
        self.downsample = 2 ** (len(config.block_out_channels) - 1)

    def latent_size(self, image_size: int) -> int:
        if image_size % self.downsample:
            raise UsageError(f"image side {image_size} is not a multiple of the VAE's downsampling {self.downsample}")
        return image_size // self.downsample

    @torch.no_grad()
    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Images (B, C, H, W) in [-1, 1] (grey images are repeated to the VAE's channels) -> scaled latents."""
        if images.shape[1] == 1 and self.image_channels != 1:
            images = images.expand(-1, self.image_channels, -1, -1)
        return self.vae.encode(images).latent_dist.sample(generator) * self.scale

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents -> images in about [-1, 1] with the VAE's channels."""
        return self.vae.decode(latents / self.scale).sample
