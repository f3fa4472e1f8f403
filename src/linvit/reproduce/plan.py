"""What `linvit reproduce` runs: every stage as the exact `linvit` command a user could type.

Two recipes share one shape. ``quick`` fits 15 minutes on 2 CPU cores: the tiny models cut to four
blocks (WeightFormer to six, the same multiply-accumulates), 36 tokens per image, five short epochs,
and benchmarks up to 1024 px (1248 for WeightFormer). ``full`` trains the registered tiny depths longer
on larger canvases and sweeps larger sizes (more on a GPU). Every stage's ``est_s`` is its measured
time on the 2-core development machine, used only for the time-left estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# model name, short family label, mixer description
FAMILIES = [
    ("deit_tiny_patch16_224", "softmax", "softmax attention (DeiT, timm fused)"),
    ("infvit_tiny_patch16_224", "pure", "pure InfSA (quadratic)"),
    ("linear_infvit_tiny_patch16_224", "linear", "Linear-InfSA"),
    ("katz_infvit_tiny_patch16_224", "katz", "Katz-InfSA (ours, exact series)"),
    ("weightformer_tiny_patch16_224", "weightformer", "WeightFormer (dynamic weights)"),
]
# the importance map each family is judged by (its own mechanism; gradients where it has none)
MAP_METHOD = {"softmax": "rollout", "pure": "column", "linear": "linear", "katz": "katz", "weightformer": "grad"}
SPECTRAL = ["pure", "linear"]
ERF = ["softmax", "linear", "weightformer"]
FAMILY_4L = [
    "vit_4l_patch16_224",
    "vit_4l_patch16_224:naive",
    "infvit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
]
WF_VS_DEIT = ["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"]


@dataclass(frozen=True)
class Recipe:
    canvas: int
    per_class_train: int
    per_class_val: int
    clutter: int
    patch: int
    depth: int | None  # blocks of the ViT-family models (None: the registered depth)
    wf_depth: int | None  # blocks of WeightFormer (None: the registered 17)
    epochs: int
    batch: int
    lr: float
    explain_images: int
    spectral_images: int
    erf_images: int
    family_res: tuple[int, ...]
    wf_res: tuple[int, ...]
    bench_iters: int


RECIPES = {
    "quick": Recipe(
        canvas=48,
        per_class_train=300,
        per_class_val=50,
        clutter=1,
        patch=8,
        depth=4,
        wf_depth=6,
        epochs=5,
        batch=16,
        lr=1e-3,
        explain_images=100,
        spectral_images=8,
        erf_images=16,
        family_res=(224, 512, 1024),
        wf_res=(224, 512, 1024, 1248),
        bench_iters=2,
    ),
    "full": Recipe(
        canvas=64,
        per_class_train=400,
        per_class_val=50,
        clutter=3,
        patch=8,
        depth=None,
        wf_depth=None,
        epochs=30,
        batch=32,
        lr=1e-3,
        explain_images=500,
        spectral_images=32,
        erf_images=50,
        family_res=(224, 512, 1024, 2048),
        wf_res=(224, 512, 1024, 1248, 2048),
        bench_iters=3,
    ),
}
GPU_RES = {"family_res": (224, 512, 1024, 2048, 4096), "wf_res": (224, 512, 1024, 1248, 2048, 4096)}


@dataclass
class Stage:
    """One step: a `linvit` command line (argv after 'linvit'), the files it must leave, its time estimate."""

    name: str
    argv: list[str]
    outputs: list[str]
    est_s: float
    info: dict = field(default_factory=dict)


def model_kwargs(family: str, recipe: Recipe) -> list[str]:
    kwargs = [f"patch_size={recipe.patch}"]
    depth = recipe.wf_depth if family == "weightformer" else recipe.depth
    if depth is not None:
        kwargs.append(f"depth={depth}")
    return kwargs


def build_plan(out: str, mode: str, device: str, recipe: Recipe | None = None) -> list[Stage]:
    """The ordered stages of one reproduce run into folder ``out`` (``recipe`` overrides the mode's)."""
    r = recipe or RECIPES[mode]
    data = f"{out}/data"
    scale = 1.0 if mode == "quick" else 4.0  # rough CPU cost ratio of the full recipe, for the estimate
    stages = [
        Stage(
            "data",
            [
                "data",
                "cluttered-mnist",
                "--out",
                data,
                "--canvas",
                str(r.canvas),
                "--per-class-train",
                str(r.per_class_train),
                "--per-class-val",
                str(r.per_class_val),
                "--clutter",
                str(r.clutter),
                "--seed",
                "0",
            ],
            outputs=["data/meta.json", "data/boxes.json"],
            est_s=5,
        )
    ]
    common = ["--data", data, "--img-size", str(r.canvas), "--crop-pct", "1.0"]
    run_device = "cuda" if device == "cuda" else "cpu"
    for model, family, _ in FAMILIES:
        kwargs = ["--model-kwargs", *model_kwargs(family, r)]
        run = f"{out}/runs/{family}"
        slow = 1.4 if family in ("katz", "weightformer") else 1.0
        stages.append(
            Stage(
                f"train/{family}",
                [
                    "train",
                    "--model",
                    model,
                    "--output",
                    run,
                    *common,
                    "--epochs",
                    str(r.epochs),
                    "--batch-size",
                    str(r.batch),
                    "--lr",
                    str(r.lr),
                    "--warmup-epochs",
                    "1",
                    "--drop-path",
                    "0",
                    "--aa",
                    "none",
                    "--mixup",
                    "0",
                    "--cutmix",
                    "0",
                    "--reprob",
                    "0",
                    "--smoothing",
                    "0",
                    "--scale",
                    "1",
                    "1",
                    "--ratio",
                    "1",
                    "1",
                    "--hflip",
                    "0",
                    "--workers",
                    "0",
                    "--device",
                    run_device,
                    "--resume",
                    "auto",
                    *kwargs,
                ],
                outputs=[f"runs/{family}/model.safetensors", f"runs/{family}/metrics.jsonl"],
                est_s=60 * slow * scale * (1 if mode == "quick" else r.epochs / 5),
                info={"family": family, "model": model},
            )
        )
        ckpt = ["--checkpoint", f"{run}/model.safetensors"]
        stages.append(
            Stage(
                f"eval/{family}",
                [
                    "eval",
                    "--model",
                    model,
                    *ckpt,
                    *common,
                    "--workers",
                    "0",
                    "--device",
                    run_device,
                    "--json",
                    f"{out}/eval/{family}.json",
                    *kwargs,
                ],
                outputs=[f"eval/{family}.json"],
                est_s=3 * scale,
                info={"family": family, "model": model},
            )
        )
        stages.append(
            Stage(
                f"explain/{family}",
                [
                    "explain",
                    "--model",
                    model,
                    *ckpt,
                    *common,
                    "--limit",
                    str(r.explain_images),
                    "--method",
                    MAP_METHOD[family],
                    "--out",
                    f"{out}/explain/{family}",
                    *kwargs,
                ],
                outputs=[f"explain/{family}/metrics.json", f"explain/{family}/maps.npz"],
                est_s=8 * slow * scale,
                info={"family": family, "model": model},
            )
        )
        if family in SPECTRAL:
            stages.append(
                Stage(
                    f"spectral/{family}",
                    [
                        "spectral",
                        "--model",
                        model,
                        *ckpt,
                        *common,
                        "--limit",
                        str(r.spectral_images),
                        "--out",
                        f"{out}/spectral/{family}.json",
                        *kwargs,
                    ],
                    outputs=[f"spectral/{family}.json"],
                    est_s=4 * scale,
                    info={"family": family, "model": model},
                )
            )
        if family in ERF:
            stages.append(
                Stage(
                    f"erf/{family}",
                    [
                        "erf",
                        "--model",
                        model,
                        *ckpt,
                        *common,
                        "--limit",
                        str(r.erf_images),
                        "--out",
                        f"{out}/erf/{family}",
                        *kwargs,
                    ],
                    outputs=[f"erf/{family}/erf.json", f"erf/{family}/erf.npy"],
                    est_s=3 * scale,
                    info={"family": family, "model": model},
                )
            )
    family_res = GPU_RES["family_res"] if device == "cuda" and mode == "full" else r.family_res
    wf_res = GPU_RES["wf_res"] if device == "cuda" and mode == "full" else r.wf_res
    bench = ["--device", device, "--iters", str(r.bench_iters), "--warmup", "1", "--timeout", "600"]
    stages.append(
        Stage(
            "bench/family4l",
            [
                "bench",
                "--models",
                ",".join(FAMILY_4L),
                "--res",
                ",".join(map(str, family_res)),
                *bench,
                "--mem-limit",
                "20",
                "--reference",
                "vit_4l_patch16_224,vit_4l_patch16_224:naive",
                "--out",
                f"{out}/bench/family4l",
            ],
            outputs=["bench/family4l/bench.json"],
            est_s=170 * scale,
        )
    )
    stages.append(
        Stage(
            "bench/weightformer",
            [
                "bench",
                "--models",
                ",".join(WF_VS_DEIT),
                "--res",
                ",".join(map(str, wf_res)),
                *bench,
                "--reference",
                "deit_tiny_patch16_224",
                "--out",
                f"{out}/bench/weightformer",
            ],
            outputs=["bench/weightformer/bench.json"],
            est_s=60 * scale,
        )
    )
    return stages
