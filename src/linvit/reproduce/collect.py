"""Every number of a reproduce run gathered from the stages' own outputs into report.json's shape.

Per task, family and seed: the validation curve (and whether it reached a plateau), val / test / shifted top-1,
the maps' scores, the spectral cosine and the ERF share. Then per task and family the mean with a 95% interval
over seeds, and the paired difference to the softmax baseline (same seeds). Only finished stages are read, so
a run stopped part-way reports the seeds it has.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np

from .plan import BASELINE, FAMILIES, TASKS, Recipe, Stage
from .stages import command, finished
from .stats import mean_interval, paired_difference

ACCURACY = ("val", "test", "shifted")
MAP_SCORES = ("box_roc_auc", "box_pr_auc", "morf_aoc", "lerf_aoc", "pointing_game")
PLATEAU_POINTS = 2.0  # a curve is flat when its fitted rise over the last quarter of training is below this


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def params(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return int(sum(np.prod(f.get_slice(k).get_shape()) for k in f.keys()))


def last_quarter_rise(curve: list[float]) -> float:
    """Least-squares rise of a curve over its last quarter (at least 2 points), in its own units."""
    tail = np.asarray(curve[-max(2, len(curve) // 4) :], dtype=float)
    slope = np.polyfit(np.arange(len(tail)), tail, 1)[0]
    return float(slope * (len(tail) - 1))


def environment(device: str) -> dict:
    import timm
    import torch

    from linvit import __version__

    env = {
        "linvit": __version__,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def count_macs(model_name: str, img_size: int = 224) -> float:
    """GMACs of one img_size x img_size image (FLOPs / 2, attention included)."""
    import timm
    import torch

    from ..utils.flops import count_flops

    model = timm.create_model(model_name).eval()
    with torch.no_grad():
        return count_flops(partial(model, torch.zeros(1, 3, img_size, img_size))) / 2e9


class Collector:
    """Reads the outputs of the finished stages of one run folder."""

    def __init__(self, out: Path, stages: list[Stage]) -> None:
        self.out = out
        self.done = {s.name: s for s in stages if finished(out, s)}
        self.stages = stages

    def stage(self, kind: str, info: dict) -> Stage | None:
        """The finished stage of this kind whose info matches (None if it has not run)."""
        for name, s in self.done.items():
            if name.startswith(kind + "/") and all(s.info.get(k) == v for k, v in info.items()):
                return s
        return None

    def run(self, task: str, family: str, seed: int, lr: float) -> dict | None:
        """One trained model: its curve, plateau, accuracies, and the analyses that ran on it."""
        key = {"task": task, "family": family, "seed": seed, "lr": lr}
        train = self.stage("train", key)
        if train is None:
            return None
        history = read_jsonl(self.out / train.outputs[1])
        curve = [h["val_top1"] for h in history]
        entry = {
            "val_curve": curve,
            "val": curve[-1],
            "last_quarter_rise": last_quarter_rise(curve),
            "train_seconds": sum(h["epoch_seconds"] for h in history),
            "params": params(self.out / train.outputs[0]),
        }
        entry["plateau"] = entry["last_quarter_rise"] < PLATEAU_POINTS
        del key["lr"]
        for split in ("test", "shifted"):
            s = self.stage("eval", {**key, "split": split})
            entry[split] = None if s is None else read_json(self.out / s.outputs[0])["top1"]
        if (s := self.stage("explain", key)) is not None:
            metrics = read_json(self.out / s.outputs[0])
            entry["maps"] = {k: metrics[k] for k in (*MAP_SCORES, "method", "morf_curve", "lerf_curve")}
        if (s := self.stage("spectral", key)) is not None:
            spectral = read_json(self.out / s.outputs[0])
            entry["spectral_cosine"] = spectral["mean"]["cosine"]
            entry["spectral_cosine_per_layer"] = [float(np.mean(layer["cosine"])) for layer in spectral["layers"]]
        if (s := self.stage("erf", key)) is not None:
            entry["erf_outside_centre"] = read_json(self.out / s.outputs[0])["outside_center_share"]
        return entry

    def lr_sweep(self, recipe: Recipe, runs: dict) -> dict:
        """{family: {lr: final val top-1 of seed 0}} on the first task, the shared lr included."""
        task = recipe.tasks[0]
        sweep: dict = {}
        for family in FAMILIES:
            seed0 = runs.get(task, {}).get(family, {}).get("seeds", {}).get(0)
            found = {recipe.lr: seed0["val"]} if seed0 else {}
            for lr in recipe.lr_sweep:
                entry = self.run(task, family, 0, lr)
                if entry is not None:
                    found[lr] = entry["val"]
            if found:
                best = max(found, key=found.get)
                sweep[family] = {"val": found, "best_lr": best, "best_val": found[best]}
        return sweep

    def bench(self, name: str) -> dict | None:
        s = self.done.get(f"bench/{name}")
        return None if s is None else read_json(self.out / s.outputs[0])


def metric_values(seeds: dict, metric: str) -> dict[int, float]:
    """{seed: value} of one metric (a top-level number, or a map score under "maps")."""
    values = {}
    for seed, entry in seeds.items():
        value = entry.get("maps", {}).get(metric) if metric in MAP_SCORES else entry.get(metric)
        if value is not None:
            values[seed] = float(value)
    return values


SUMMARISED = (*ACCURACY, *MAP_SCORES, "spectral_cosine", "erf_outside_centre")


def summarise(runs: dict) -> None:
    """Add "summary" (mean and interval over seeds) and "vs_baseline" (paired differences) to every family."""
    for families in runs.values():
        base = families.get(BASELINE, {}).get("seeds", {})
        for family, entry in families.items():
            entry["summary"], entry["vs_baseline"] = {}, {}
            for metric in SUMMARISED:
                values = metric_values(entry["seeds"], metric)
                if values:
                    entry["summary"][metric] = mean_interval([values[s] for s in sorted(values)])
                    entry["summary"][metric]["seeds"] = sorted(values)
                base_values = metric_values(base, metric)
                if family != BASELINE and set(values) & set(base_values):
                    entry["vs_baseline"][metric] = paired_difference(values, base_values)
            entry["plateaus"] = sum(e["plateau"] for e in entry["seeds"].values())


def collect(out: Path, stages: list[Stage], timings: dict, mode: str, device: str, recipe: Recipe) -> dict:
    """Every number of the run (report.json), from the stages that finished."""
    c = Collector(out, stages)
    runs: dict = {}
    for task in recipe.tasks:
        for family, (model, mixer) in FAMILIES.items():
            seeds = {s: e for s in recipe.seeds if (e := c.run(task, family, s, recipe.lr)) is not None}
            if seeds:
                entry = {"model": model, "mixer": mixer, "params": next(iter(seeds.values()))["params"]}
                runs.setdefault(task, {})[family] = {**entry, "seeds": seeds}
    summarise(runs)
    return {
        "mode": mode,
        "environment": environment(device),
        "recipe": asdict(recipe),
        "tasks": {name: asdict(TASKS[name]) for name in recipe.tasks},
        "stages": timings,
        "stages_missing": [s.name for s in stages if s.name not in c.done],
        "seconds_this_run": sum(t["seconds"] or 0 for t in timings.values() if not t["reused"]),
        "seconds_all_stages": sum(t["seconds"] or 0 for t in timings.values()),
        "runs": runs,
        "lr_sweep": c.lr_sweep(recipe, runs),
        "bench": {name: c.bench(name) for name in ("family4l", "weightformer")},
        "macs_224": {m: count_macs(m) for m in ("weightformer_small_patch16_224", "deit_small_patch16_224")},
        "commands": {s.name: command(s) for s in stages},
    }
