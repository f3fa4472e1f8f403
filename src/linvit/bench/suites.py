"""The benchmark tables of docs/benchmarks.md as named suites: ``linvit bench --suite NAME|all|gpu --output DIR``.

Each suite is one sweep (or ladder) with fixed settings, so every recorded table is reproduced by one
command and lands in DIR/<suite>/bench.{json,csv,md} + scaling.png. ``all`` runs the CPU tables, ``gpu``
the ``gpu_*`` ones (bf16 on CUDA, batch 1 and 32, eager and CUDA-graph compiled; scripts/gpu_bench.sh).
"""

from __future__ import annotations

from ..errors import UsageError
from ..models.dit import dit_mixers

FOUR_LAYER = [
    "vit_4l_patch16_224",
    "vit_4l_patch16_224:naive",
    "infvit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
]

# every GPU table: bf16, batch 1 and 32, eager and CUDA graphs, each point timed >= 1 s (NVML energy)
GPU_SETTINGS = dict(
    batch=[1, 32],
    compile=["off", "reduce-overhead"],
    device="cuda",
    dtype="bf16",
    iters=20,
    warmup=3,
    min_time=1.0,
    timeout=120,
    mem_limit=120.0,
)

# the GPU 4-layer table: both linear InfSA forms against fused and naive softmax (pure InfSA is quadratic)
FOUR_LAYER_GPU = [
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
    "vit_4l_patch16_224",
    "vit_4l_patch16_224:naive",
]

SUITES: dict[str, dict] = {
    # issue: the folded Linear-InfSA fast path against the release's per-token K/V projections
    "fold": dict(
        models=["linear_infvit_4l_patch16_224", "linear_infvit_4l_patch16_224:unfolded"],
        res=[224, 512, 1024],
        iters=7,
        warmup=2,
        reference=["linear_infvit_4l_patch16_224:unfolded"],
    ),
    # issue 22: Katz-InfSA's lean path against Linear-InfSA (the FLOP floor of the ratio is 12/9 = 1.33)
    "katz_lean": dict(
        models=["linear_infvit_4l_patch16_224", "katz_infvit_4l_patch16_224"],
        res=[1024],
        iters=7,
        warmup=2,
        reference=["linear_infvit_4l_patch16_224"],
    ),
    # issue 22 item 11: a bf16-autocast training step at batch 8, where the token sums read Q, K, V laid out
    # once (each 4-D product used to copy its operands again; batch 1 has nothing to copy)
    "katz_batched": dict(
        models=["linear_infvit_4l_patch16_224", "katz_infvit_4l_patch16_224"],
        res=[512],
        batch=[8],
        mode="train",
        dtype="bf16",
        iters=5,
        warmup=2,
        reference=["linear_infvit_4l_patch16_224"],
    ),
    # the reproduce protocol's scale (32 px, patch 8: 17 tokens, width 192): a training step (forward + backward)
    # of batch 64 per 4-layer model, where Katz-InfSA solves the N x N system (N <= d = 64)
    "few_tokens": dict(
        models=[m for m in FOUR_LAYER if not m.endswith(":naive")],
        res=[32],
        batch=[64],
        mode="train",
        model_kwargs=dict(patch_size=8, embed_dim=192, depth=4, num_heads=3),
        iters=5,
        warmup=2,
        reference=["vit_4l_patch16_224"],
    ),
    # the 4-layer family, inference, batch 1, fp32, against both softmax baselines
    "family4l": dict(
        models=FOUR_LAYER,
        res=[224, 512, 1024, 2048],
        iters=3,
        warmup=1,
        mem_limit=20.0,
        timeout=1200,
        reference=["vit_4l_patch16_224", "vit_4l_patch16_224:naive"],
    ),
    # largest resolution per model: doubling from 2048 (family4l covers below) until a point fails,
    # i.e. needs more than 20 GB or more than 90 s for one image (no warm-up; see "highres" beyond that)
    "ladder4l": dict(models=FOUR_LAYER, res=[2048], ladder=True, iters=1, warmup=0, mem_limit=20.0, timeout=90),
    # WeightFormer-T against DeiT-T (timm's fused attention)
    "weightformer": dict(
        models=["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"],
        res=[224, 512, 1024, 1248],
        iters=5,
        warmup=2,
        reference=["deit_tiny_patch16_224"],
    ),
    # the segmentation model (backbone + simple feature pyramid + semantic-FPN head) at high resolution
    "segment": dict(
        models=[
            "deit_tiny_patch16_224",
            "deit_tiny_patch16_224:naive",
            "linear_infvit_tiny_patch16_224",
            "weightformer_tiny_patch16_224",
        ],
        res=[512, 1024, 2048],
        iters=1,
        warmup=1,
        task="segment",
        mem_limit=20.0,
        timeout=1200,
        reference=["deit_tiny_patch16_224"],
    ),
    # the whole detector (Faster R-CNN on the simple feature pyramid), COCO's 800 x 1333 and 1200 x 2000
    "detect": dict(
        models=[
            "deit_tiny_patch16_224",
            "deit_tiny_patch16_224:naive",
            "infvit_tiny_patch16_224",
            "linear_infvit_tiny_patch16_224",
            "katz_infvit_tiny_patch16_224",
            "weightformer_tiny_patch16_224",
        ],
        res=[800, 1200],
        iters=1,
        warmup=1,
        task="detect",
        mem_limit=20.0,
        timeout=900,
        reference=["deit_tiny_patch16_224"],
    ),
    # very high resolution with no flags (token chunking is chosen automatically at this size)
    "highres": dict(models=["linear_infvit_4l_patch16_224"], res=[9216, 16384], iters=1, warmup=0, timeout=3000),
    # CPU: eager against compiled (inductor), batch 1
    "compile4l": dict(
        models=["vit_4l_patch16_224", "linear_infvit_4l_patch16_224", "katz_infvit_4l_patch16_224"],
        res=[224, 512],
        compile=["off", "default"],
        iters=5,
        warmup=2,
        reference=["vit_4l_patch16_224"],
    ),
    "compile_wf": dict(
        models=["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"],
        res=[224, 512],
        compile=["off", "default"],
        iters=5,
        warmup=2,
        reference=["deit_tiny_patch16_224"],
    ),
    # issue 26: DiT-S/2 on 4-channel latents of 16 to 128 (128-1024 px images through an 8x VAE), one guided
    # sampling step (the network on 2 x batch) and one DDPM training step, per mixer
    "generate": dict(
        models=list(dit_mixers()),
        res=[16, 32, 64, 128],
        iters=2,
        warmup=1,
        task="generate",
        timeout=600,
        reference=["softmax"],
    ),
    "generate_train": dict(
        models=list(dit_mixers()),
        res=[16, 32, 64],
        iters=3,
        warmup=1,
        task="generate",
        mode="train",
        timeout=600,
        reference=["softmax"],
    ),
    # GPU (scripts/gpu_bench.sh): bf16, batch 1 (latency) and 32 (throughput), eager and CUDA graphs
    "gpu_family4l": dict(
        models=FOUR_LAYER_GPU,
        res=[512, 1024, 2048, 4096],
        reference=["vit_4l_patch16_224", "vit_4l_patch16_224:naive"],
        **GPU_SETTINGS,
    ),
    "gpu_weightformer": dict(
        models=["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"],
        res=[224, 512, 1024, 1248],
        reference=["deit_tiny_patch16_224"],
        **GPU_SETTINGS,
    ),
    "gpu_generate": dict(
        models=["softmax", "linear_infsa", "weightformer"],
        res=[32, 64, 128],  # DiT-S/2 latents: 256 to 4,096 tokens (256 to 1024 px images)
        task="generate",
        reference=["softmax"],
        **GPU_SETTINGS,
    ),
}


def suite_names(choice: str) -> list[str]:
    """'all' -> the CPU suites, 'gpu' -> the gpu_* suites, else the one named (ValueError if unknown)."""
    if choice == "all":
        return [n for n in SUITES if not n.startswith("gpu_")]
    if choice == "gpu":
        return [n for n in SUITES if n.startswith("gpu_")]
    if choice not in SUITES:
        raise UsageError(f"unknown suite {choice!r}; choose from all, gpu, {', '.join(SUITES)}")
    return [choice]
