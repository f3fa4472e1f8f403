"""Class-conditional image generation with diffusion transformers (linvit.models.DiT): DDPM training on
linvit's engine (engine.py), DDIM sampling with classifier-free guidance (diffusion.py, sample.py)."""
