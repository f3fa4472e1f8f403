"""DDPM training objective and DDIM sampling with classifier-free guidance, on diffusers' schedulers.

linvit keeps only the model (linvit.models.DiT) and the loop; the noise schedule, q(x_t | x_0) and the
sampler's update come from diffusers (the optional extra "generate"), so they are the library's, not ours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UsageError

TRAIN_STEPS = 1000  # DDPM's T
SCHEDULE = "squaredcos_cap_v2"  # the cosine schedule (Nichol & Dhariwal 2021): better at small image sizes


def _diffusers():
    try:
        import diffusers
    except ImportError as err:
        raise UsageError('image generation needs diffusers: pip install -e ".[generate]"') from err
    return diffusers


def noise_schedule(prediction: str = "epsilon"):
    """The training scheduler: q(x_t | x_0) for t in [0, TRAIN_STEPS), and what the network's output means."""
    return _diffusers().DDPMScheduler(
        num_train_timesteps=TRAIN_STEPS, beta_schedule=SCHEDULE, clip_sample=False, prediction_type=prediction
    )


def ddpm_loss(model, x0: torch.Tensor, labels: torch.Tensor, schedule, generator: torch.Generator | None = None):
    """L_simple: E_t,eps || target - f_theta(x_t, t, y) ||^2 with t uniform, x_t = sqrt(a_t) x0 + sqrt(1-a_t) eps
    and target eps, or v = sqrt(a_t) eps - sqrt(1-a_t) x0 (the schedule's prediction type)."""
    t = torch.randint(0, TRAIN_STEPS, (x0.shape[0],), device=x0.device, generator=generator)
    noise = torch.randn(x0.shape, device=x0.device, generator=generator, dtype=x0.dtype)
    noisy = schedule.add_noise(x0, noise, t)
    target = noise if schedule.config.prediction_type == "epsilon" else schedule.get_velocity(x0, noise, t)
    predicted = model(noisy, t, labels)[:, : x0.shape[1]]  # with learn_sigma the variance half is not trained here
    return F.mse_loss(predicted.float(), target.float())


def has_null_label(model) -> bool:
    """Whether the DiT learnt a "no class" embedding (trained with --class-dropout > 0), which guidance needs.

    A stand-in without an embedding table is taken to have one."""
    embedder = model.y_embedder
    table = getattr(embedder, "embedding_table", None)
    return table is None or table.num_embeddings > embedder.num_classes


def check_guidance(model, guidance: float) -> None:
    if guidance != 1 and not has_null_label(model):
        raise UsageError(
            f'guidance {guidance:g} needs a model trained with --class-dropout > 0 (a "no class" embedding); '
            "this one was trained with --class-dropout 0: sample it with --guidance 1"
        )


def guided_noise(model, x: torch.Tensor, t, labels: torch.Tensor, guidance: float, channels: int) -> torch.Tensor:
    """The noise prediction for x at step t: at guidance 1 the conditional model alone (half the work, and no
    "no class" row needed); otherwise the conditional and "no class" halves as one batch
    (DiT.forward_with_cfg)."""
    if guidance == 1:
        return model(x, torch.full((x.shape[0],), int(t), device=x.device), labels)[:, :channels]
    both = torch.cat([labels, torch.full_like(labels, model.y_embedder.num_classes)])
    batch_t = torch.full((2 * x.shape[0],), int(t), device=x.device)
    return model.forward_with_cfg(torch.cat([x, x]), batch_t, both, guidance)[: x.shape[0], :channels]


@torch.no_grad()
def ddim_sample(
    model,
    labels: torch.Tensor,
    shape: tuple[int, int, int],
    steps: int = 50,
    guidance: float = 2.0,
    generator: torch.Generator | None = None,
    progress=None,
    clip: bool = True,
    prediction: str = "epsilon",
) -> torch.Tensor:
    """Images for labels (B,) of shape (C, H, W), in the model's value range, by DDIM (eta 0) with guidance.

    Guidance 1 is the conditional model alone; above it, each step also runs the "no class" half, which a
    model trained with --class-dropout 0 does not have (a UsageError). clip: each step's estimate of x_0 is
    clipped to [-1, 1], the range of pixel data (as in DDPM and improved DDPM); without it the first steps of
    the cosine schedule, where alpha_bar is near 0, blow a small noise error up into x_0 (patchy samples);
    latents are not clipped.
    """
    check_guidance(model, guidance)
    scheduler = _diffusers().DDIMScheduler.from_config(noise_schedule(prediction).config, clip_sample=clip)
    scheduler.set_timesteps(steps)
    x = torch.randn((labels.shape[0], *shape), generator=generator, device=labels.device)
    timesteps = scheduler.timesteps if progress is None else progress(scheduler.timesteps)
    for t in timesteps:
        x = scheduler.step(guided_noise(model, x, t, labels, guidance, shape[0]), t, x).prev_sample
    return x
