"""What `linvit reproduce` runs: every stage as the exact `linvit` command a user could type.

One protocol, fair by construction (issue 23): the InfSA paper's 4-layer family (softmax ViT-4L, pure,
Linear and Katz InfViT-4L) and WeightFormer, all at width 192 (DeiT-T's, so the softmax ViT-4L is also
the DeiT-T baseline of the WeightFormer paper, cut to 4 blocks like the others), trained from scratch on
the drawn digit tasks with one shared recipe chosen on the softmax baseline's validation curve only
(docs/sweeps/digits), for several seeds. Every model is evaluated on val, test and the shifted test set.

``quick`` takes about 11 minutes on 2 CPU cores (measured: docs/report-quick.md): one seed of the digit task,
maps, spectra and ERFs, and a short latency sweep. ``full`` runs 3 seeds of both tasks, maps and spectra on
every seed, a per-family learning-rate sweep (reported beside the shared recipe, never replacing it) and the
longer latency sweeps. Every stage's ``est_s`` is its measured time on the 2-core development machine, used
only for the time-left estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# family label -> (model name, mixer description)
FAMILIES = {
    "softmax": ("vit_4l_patch16_224", "softmax attention (ViT-4L = DeiT-T at 4 blocks, timm fused)"),
    "pure": ("infvit_4l_patch16_224", "pure InfSA (quadratic)"),
    "linear": ("linear_infvit_4l_patch16_224", "Linear-InfSA"),
    "katz": ("katz_infvit_4l_patch16_224", "Katz-InfSA (ours, exact series)"),
    "weightformer": ("weightformer_tiny_patch16_224", "WeightFormer (dynamic weights)"),
}
BASELINE = "softmax"
# the importance map each family is judged by (its own mechanism; gradients where it has none)
MAP_METHOD = {"softmax": "rollout", "pure": "column", "linear": "linear", "katz": "katz", "weightformer": "grad"}
SPECTRAL = ["pure", "linear"]
ERF = ["softmax", "linear", "weightformer"]
# training seconds per epoch of 4,000 canvases (16 tokens, batch 64) relative to softmax, measured on 2 cores
COST = {"softmax": 1.0, "pure": 1.0, "linear": 0.85, "katz": 1.7, "weightformer": 1.9}  # docs/report-quick's
FAMILY_4L = [
    "vit_4l_patch16_224",
    "vit_4l_patch16_224:naive",
    "infvit_4l_patch16_224",
    "linear_infvit_4l_patch16_224",
    "katz_infvit_4l_patch16_224",
]
WF_VS_DEIT = ["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"]


@dataclass(frozen=True)
class Task:
    """A drawn digit task (linvit.data.digit_tasks) at one canvas size, and the patch that gives 16 tokens."""

    name: str
    canvas: int
    clutter: int
    patch: int
    length: int | None = None  # training canvases per epoch (None: one per training digit, 4,000)

    @property
    def data(self) -> str:
        spec = f"digits:{self.name},canvas={self.canvas},clutter={self.clutter}"
        return spec if self.length is None else f"{spec},length={self.length}"


# max(a, b) of two digits half a canvas apart: the relation task (sum mod 10 does not leave chance in CPU minutes)
TASKS = {"digit": Task("digit", 32, 0, 8), "max": Task("max", 64, 0, 16)}


@dataclass(frozen=True)
class Recipe:
    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    epochs: int
    batch: int
    lr: float
    lr_sweep: tuple[float, ...]  # per-family learning rates tried on the first task, seed 0 (besides lr)
    width: int
    heads: int
    depth: int
    explain_images: int
    spectral_images: int
    erf_images: int
    family_res: tuple[int, ...]
    wf_res: tuple[int, ...]
    bench_iters: int


SHARED = dict(epochs=14, batch=64, lr=1e-3, width=192, heads=3, depth=4)
RECIPES = {
    "quick": Recipe(
        tasks=("digit",),
        seeds=(0,),
        lr_sweep=(),
        explain_images=100,
        spectral_images=8,
        erf_images=16,
        family_res=(224, 512),
        wf_res=(224, 512),
        bench_iters=1,
        **SHARED,
    ),
    "full": Recipe(
        tasks=("digit", "max"),
        seeds=(0, 1, 2),
        lr_sweep=(5e-4, 2e-3),
        explain_images=200,
        spectral_images=8,
        erf_images=16,
        family_res=(224, 512, 1024),
        wf_res=(224, 512, 1024, 1248),
        bench_iters=2,
        **SHARED,
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
    inputs: list[str] = field(default_factory=list)  # files of earlier stages it reads: a change reruns it


def model_kwargs(family: str, recipe: Recipe, task: Task) -> list[str]:
    """The same width, depth and patch for every family (WeightFormer sets its heads itself)."""
    kwargs = [f"patch_size={task.patch}", f"embed_dim={recipe.width}", f"depth={recipe.depth}"]
    if family != "weightformer":
        kwargs.append(f"num_heads={recipe.heads}")
    return ["--model-kwargs", *kwargs]


NO_AUGMENTATION = [
    *("--warmup-epochs", "1", "--drop-path", "0", "--aa", "none", "--mixup", "0", "--cutmix", "0"),
    *("--reprob", "0", "--smoothing", "0", "--scale", "1", "1", "--ratio", "1", "1", "--hflip", "0"),
]  # digits must not be mirrored or cropped; the fresh canvases of every epoch are the augmentation


def run_name(task: str, family: str, seed: int, lr: float | None = None) -> str:
    return f"{task}/{family}/s{seed}" + ("" if lr is None else f"/lr{lr:g}")


class Planner:
    """Builds the stages of one reproduce run into folder ``out``."""

    def __init__(self, out: str, device: str, recipe: Recipe) -> None:
        self.out, self.recipe = out, recipe
        self.device = "cuda" if device == "cuda" else "cpu"
        self.epoch_s = 6.5  # one epoch of the softmax baseline, validation included, on 2 cores (report-quick)

    def folder(self, task: Task) -> str:
        return f"{self.out}/data/{task.name}"

    def common(self, task: Task) -> list[str]:
        return ["--img-size", str(task.canvas), "--crop-pct", "1.0"]

    def data(self, task: Task) -> Stage:
        argv = ["data", "digits", "--output", self.folder(task), "--task", task.name]
        argv += ["--canvas", str(task.canvas), "--clutter", str(task.clutter), "--seed", "0"]
        return Stage(f"data/{task.name}", argv, [f"data/{task.name}/boxes.json", f"data/{task.name}/meta.json"], 5)

    def train(self, task: Task, family: str, seed: int, lr: float | None = None) -> Stage:
        r, name = self.recipe, run_name(task.name, family, seed, lr)
        argv = ["train", "--model", FAMILIES[family][0], "--data", task.data, *self.common(task)]
        argv += ["--output", f"{self.out}/runs/{name}", "--seed", str(seed), "--epochs", str(r.epochs)]
        argv += ["--batch-size", str(r.batch), "--lr", str(lr or r.lr), *NO_AUGMENTATION]
        argv += ["--workers", "0", "--device", self.device, "--resume", "auto", "--no-progress"]
        argv += model_kwargs(family, r, task)
        outputs = [f"runs/{name}/model.safetensors", f"runs/{name}/metrics.jsonl"]
        info = {"task": task.name, "family": family, "seed": seed, "lr": lr or r.lr}
        return Stage(f"train/{name}", argv, outputs, self.epoch_s * r.epochs * COST[family], info)

    def analysis_argv(self, command: str, task: Task, family: str, seed: int) -> list[str]:
        """The head of an eval/explain/spectral/erf command on a trained run and the task's image folder."""
        run = f"{self.out}/runs/{run_name(task.name, family, seed)}"
        argv = [command, "--model", FAMILIES[family][0], "--checkpoint", f"{run}/model.safetensors"]
        return argv + ["--data", self.folder(task), *self.common(task), *model_kwargs(family, self.recipe, task)]

    def analysis_inputs(self, task: Task, family: str, seed: int) -> list[str]:
        """What an analysis stage reads: the run's weights and the task's image folder."""
        return [f"runs/{run_name(task.name, family, seed)}/model.safetensors", f"data/{task.name}/meta.json"]

    def evaluate(self, task: Task, family: str, seed: int, split: str) -> Stage:
        name = f"{run_name(task.name, family, seed)}/{split}"
        argv = self.analysis_argv("eval", task, family, seed)
        argv += ["--split", split, "--workers", "0", "--device", self.device, "--no-progress"]
        argv += ["--json", f"{self.out}/eval/{name}.json"]
        info = {"task": task.name, "family": family, "seed": seed, "split": split}
        inputs = self.analysis_inputs(task, family, seed)
        return Stage(f"eval/{name}", argv, [f"eval/{name}.json"], 2 * COST[family], info, inputs)

    def explain(self, task: Task, family: str, seed: int) -> Stage:
        name = run_name(task.name, family, seed)
        argv = self.analysis_argv("explain", task, family, seed)
        argv += ["--split", "val", "--limit", str(self.recipe.explain_images), "--method", MAP_METHOD[family]]
        argv += ["--output", f"{self.out}/explain/{name}"]
        outputs = [f"explain/{name}/metrics.json", f"explain/{name}/maps.npz"]
        info = {"task": task.name, "family": family, "seed": seed}
        seconds = 0.02 * self.recipe.explain_images * COST[family]
        return Stage(f"explain/{name}", argv, outputs, seconds, info, self.analysis_inputs(task, family, seed))

    def spectral(self, task: Task, family: str, seed: int) -> Stage:
        name = run_name(task.name, family, seed)
        argv = self.analysis_argv("spectral", task, family, seed)
        argv += ["--split", "val", "--limit", str(self.recipe.spectral_images)]
        argv += ["--output", f"{self.out}/spectral/{name}.json"]
        info = {"task": task.name, "family": family, "seed": seed}
        inputs = self.analysis_inputs(task, family, seed)
        return Stage(f"spectral/{name}", argv, [f"spectral/{name}.json"], 4, info, inputs)

    def erf(self, task: Task, family: str, seed: int) -> Stage:
        name = run_name(task.name, family, seed)
        argv = self.analysis_argv("erf", task, family, seed)
        argv += ["--split", "val", "--limit", str(self.recipe.erf_images), "--output", f"{self.out}/erf/{name}"]
        info = {"task": task.name, "family": family, "seed": seed}
        outputs = [f"erf/{name}/erf.json", f"erf/{name}/erf.npy"]
        return Stage(f"erf/{name}", argv, outputs, 3, info, self.analysis_inputs(task, family, seed))

    def runs(self, task: Task, seed: int) -> list[Stage]:
        """Train every family on one task and seed, evaluate it, and (first task only) read its maps."""
        stages = []
        for family in FAMILIES:
            stages.append(self.train(task, family, seed))
            stages += [self.evaluate(task, family, seed, split) for split in ("test", "shifted")]
            if task.name == self.recipe.tasks[0]:
                stages.append(self.explain(task, family, seed))
                stages += [self.spectral(task, family, seed)] if family in SPECTRAL else []
                stages += [self.erf(task, family, seed)] if family in ERF else []
        return stages

    def lr_sweep(self, task: Task) -> list[Stage]:
        """Seed 0 of every family at each extra learning rate: each family's own best, reported separately."""
        return [self.train(task, family, 0, lr) for lr in self.recipe.lr_sweep for family in FAMILIES]

    def bench(self, mode: str) -> list[Stage]:
        r, gpu = self.recipe, self.device == "cuda" and mode == "full"
        family_res = GPU_RES["family_res"] if gpu else r.family_res
        wf_res = GPU_RES["wf_res"] if gpu else r.wf_res
        common = ["--device", self.device, "--iters", str(r.bench_iters), "--warmup", "1", "--timeout", "600"]
        family = ["bench", "--models", ",".join(FAMILY_4L), "--res", ",".join(map(str, family_res)), *common]
        family += ["--mem-limit", "20", "--reference", "vit_4l_patch16_224,vit_4l_patch16_224:naive"]
        family += ["--output", f"{self.out}/bench/family4l"]
        wf = ["bench", "--models", ",".join(WF_VS_DEIT), "--res", ",".join(map(str, wf_res)), *common]
        wf += ["--reference", "deit_tiny_patch16_224", "--output", f"{self.out}/bench/weightformer"]
        seconds = 0.03 * r.bench_iters * sum((res / 224) ** 2 for res in family_res)
        return [
            Stage("bench/family4l", family, ["bench/family4l/bench.json"], 20 + 5 * seconds * len(FAMILY_4L)),
            Stage("bench/weightformer", wf, ["bench/weightformer/bench.json"], 15 + 2 * seconds * len(WF_VS_DEIT)),
        ]


def build_plan(out: str, mode: str, device: str, recipe: Recipe | None = None) -> list[Stage]:
    """The ordered stages of one reproduce run into folder ``out`` (``recipe`` overrides the mode's).

    Seeds run in the outer loop, so an interrupted full run has whole seeds of every family to report.
    """
    r = recipe or RECIPES[mode]
    planner = Planner(out, device, r)
    tasks = [TASKS[name] for name in r.tasks]
    stages = [planner.data(task) for task in tasks]
    for seed in r.seeds:
        for task in tasks:
            stages += planner.runs(task, seed)
    stages += planner.lr_sweep(tasks[0])
    return stages + planner.bench(mode)
