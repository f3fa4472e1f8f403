"""Gather every stage's numbers into OUT/report.json and write OUT/report.md: one table per paper's claims.

Each row reads "claim | paper value and setting | our value and setting | command"; the command is
the exact `linvit` line of the stage that produced our value (all of them are in OUT/commands.sh).
"""

from __future__ import annotations

import json
import os
import platform
from functools import partial
from pathlib import Path

import numpy as np

from .figures import curves_figure, erf_figure, maps_figure, scaling_figure
from .plan import ERF, FAMILIES, SPECTRAL, Recipe, Stage
from .stages import command


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def _params(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return int(sum(np.prod(f.get_slice(k).get_shape()) for k in f.keys()))


def _ok(points: list[dict], model: str) -> dict[int, dict]:
    return {p["res"]: p for p in points if p["model"] == model and p["status"] == "ok"}


def bench_summary(points: list[dict], exponents: dict, model: str, references: list[str]) -> dict:
    """Speed-ups of ``model`` over each reference per resolution, its exponent and largest size that ran."""
    mine = _ok(points, model)
    summary = {"exponent": exponents.get(model), "largest_res": max(mine, default=None), "speedup": {}}
    for ref in references:
        theirs = _ok(points, ref)
        summary["speedup"][ref] = {
            res: theirs[res]["latency_ms"] / p["latency_ms"] for res, p in mine.items() if res in theirs
        }
    return summary


def count_macs(model_name: str, img_size: int = 224) -> float:
    """GMACs of one img_size x img_size image (FLOPs / 2, attention included)."""
    import timm
    import torch

    from ..utils.flops import count_flops

    model = timm.create_model(model_name).eval()
    with torch.no_grad():
        return count_flops(partial(model, torch.zeros(1, 3, img_size, img_size))) / 2e9


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


def collect(out: Path, stages: list[Stage], timings: dict, mode: str, device: str, recipe: Recipe) -> dict:
    """Every number of the run (report.json)."""
    from dataclasses import asdict

    report = {
        "mode": mode,
        "environment": environment(device),
        "recipe": asdict(recipe),
        "stages": timings,
        "seconds_this_run": sum(t["seconds"] or 0 for t in timings.values() if not t["reused"]),
        "seconds_all_stages": sum(t["seconds"] or 0 for t in timings.values()),
        "families": {},
    }
    for model, family, mixer in FAMILIES:
        entry: dict = {"model": model, "mixer": mixer}
        run = out / "runs" / family
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        entry["params"] = _params(run / "model.safetensors")
        entry["epochs"] = len(history)
        entry["train_loss"] = history[-1]["train_loss"]
        entry["train_seconds"] = sum(h["epoch_seconds"] for h in history)
        entry["eval"] = {
            k: v
            for k, v in _read_json(out / "eval" / f"{family}.json").items()
            if k in ("top1", "top5", "loss", "images")
        }
        explain = _read_json(out / "explain" / family / "metrics.json")
        keys = (
            "method",
            "morf_aoc",
            "lerf_aoc",
            "box_roc_auc",
            "box_pr_auc",
            "pointing_game",
            "morf_curve",
            "lerf_curve",
            "images",
        )
        entry["explain"] = {k: explain[k] for k in keys}
        if family in SPECTRAL:
            spectral = _read_json(out / "spectral" / f"{family}.json")
            per_layer = [float(np.mean(layer["cosine"])) for layer in spectral["layers"]]
            entry["spectral"] = {**spectral["mean"], "cosine_per_layer": per_layer}
        if family in ERF:
            entry["erf_outside_centre"] = _read_json(out / "erf" / family / "erf.json")["outside_center_share"]
        report["families"][family] = entry
    family4l = _read_json(out / "bench" / "family4l" / "bench.json")
    wf = _read_json(out / "bench" / "weightformer" / "bench.json")
    report["bench"] = {
        "family4l": {
            "points": family4l["points"],
            "exponents": family4l["exponents"],
            "summary": {
                m: bench_summary(
                    family4l["points"],
                    family4l["exponents"],
                    m,
                    ["vit_4l_patch16_224", "vit_4l_patch16_224:naive", "linear_infvit_4l_patch16_224"],
                )
                for m in family4l["exponents"]
            },
        },
        "weightformer": {
            "points": wf["points"],
            "exponents": wf["exponents"],
            "summary": {
                m: bench_summary(wf["points"], wf["exponents"], m, ["deit_tiny_patch16_224"]) for m in wf["exponents"]
            },
        },
    }
    report["macs_224"] = {m: count_macs(m) for m in ("weightformer_small_patch16_224", "deit_small_patch16_224")}
    report["commands"] = {s.name: command(s) for s in stages}
    return report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _mb(mem: dict, model: str) -> str:
    return f"{mem[model]:.0f}" if model in mem else "-"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def claims(report: dict) -> dict[str, list[dict]]:
    """The rows of report.md's tables, grouped by paper."""
    f, cmd, r = report["families"], report["commands"], report["recipe"]
    soft, pure, lin, katz, wf = (f[k] for k in ("softmax", "pure", "linear", "katz", "weightformer"))
    depth = "registered depths" if r["depth"] is None else f"{r['depth']} blocks (WeightFormer {r['wf_depth']})"
    setting = (
        f"cluttered MNIST ({r['canvas']} px, 10 classes, chance 10%), width-192 tiny models at {depth}, "
        f"{r['epochs']} epochs, {r['per_class_train'] * 10} training images"
    )
    maps = f"{r['explain_images']} val images, digit boxes"
    fam = report["bench"]["family4l"]["summary"]
    lin4, katz4 = (fam.get(f"{m}_infvit_4l_patch16_224", {}) for m in ("linear", "katz"))
    naive_x, fused_x = (
        lin4.get("speedup", {}).get("vit_4l_patch16_224:naive", {}),
        lin4.get("speedup", {}).get("vit_4l_patch16_224", {}),
    )
    at = 1024 if 1024 in naive_x else max(naive_x, default=None)
    exps = report["bench"]["family4l"]["exponents"]
    env = report["environment"]
    where = f"{env.get('gpu', 'CPU, ' + str(env['cpu_cores']) + ' cores')}, fp32, batch 1"
    katz_vs_lin = {res: 1 / s for res, s in katz4.get("speedup", {}).get("linear_infvit_4l_patch16_224", {}).items()}
    largest = {m: s["largest_res"] for m, s in fam.items()}
    wfs = report["bench"]["weightformer"]
    wf_x = wfs["summary"]["weightformer_tiny_patch16_224"]["speedup"]["deit_tiny_patch16_224"]
    wf_res = max(wf_x, default=None)
    mem = {p["model"]: p["peak_mem_mb"] for p in wfs["points"] if p["res"] == wf_res and p["status"] == "ok"}
    mem_cut = 1 - mem["weightformer_tiny_patch16_224"] / mem["deit_tiny_patch16_224"] if len(mem) == 2 else None
    macs = report["macs_224"]

    def _k(model: str) -> str:
        return "-" if exps.get(model) is None else f"{exps[model]:.2f}"

    def trio(key: str) -> str:
        return " / ".join(_pct(x["explain"][key]) for x in (soft, pure, lin))

    infsa = [
        dict(
            claim="Linear-InfSA trains as well as softmax attention",
            paper="Linear-InfViT-4L 84.7% vs ViT-4L 81.5% top-1 (ImageNet-1k, 300 epochs)",
            ours=f"Linear-InfSA {lin['eval']['top1']:.1f}% vs softmax {soft['eval']['top1']:.1f}% top-1 ({setting})",
            command=cmd["eval/linear"],
        ),
        dict(
            claim="Pure (quadratic) InfSA trains as well",
            paper="Pure InfViT-4L 85.1% top-1 (ImageNet-1k)",
            ours=f"pure InfSA {pure['eval']['top1']:.1f}% top-1 (same setting)",
            command=cmd["eval/pure"],
        ),
        dict(
            claim="Object-centred maps: box ROC-AUC",
            paper="softmax 53.8 / pure 77.3 / Linear 75.9 (ImageNet val boxes)",
            ours=f"{trio('box_roc_auc')} (rollout / column centrality / importance vector; {maps})",
            command=cmd["explain/linear"],
        ),
        dict(
            claim="Object-centred maps: box PR-AUC",
            paper="56.2 / 72.4 / 76.1",
            ours=f"{trio('box_pr_auc')} (same maps)",
            command=cmd["explain/linear"],
        ),
        dict(
            claim="Faithful maps: MoRF-AOC (higher is better)",
            paper="42.6 / 71.7 / 76.0",
            ours=f"{trio('morf_aoc')} (x100, p(true class), {maps})",
            command=cmd["explain/linear"],
        ),
        dict(
            claim="Linear-InfSA's importance is the principal (Perron) eigenvector",
            paper="cosine 0.985 (protocol unpublished)",
            ours=(
                f"cosine {lin['spectral']['cosine']:.3f} (layers "
                f"{min(lin['spectral']['cosine_per_layer']):.2f}-{max(lin['spectral']['cosine_per_layer']):.2f}),"
                f" trained model, left Perron vector of each layer's A^"
            ),
            command=cmd["spectral/linear"],
        ),
        dict(
            claim="13x faster than a softmax ViT at 1024x1024",
            paper="13.4x: Linear-InfViT-4L 4.33 ms vs ViT-4L 58.16 ms (A100, batch 1, attention matrix materialised)",
            ours=(
                f"{_x(naive_x.get(at))} vs naive softmax, {_x(fused_x.get(at))} vs fused softmax at {at}x{at} ({where})"
            ),
            command=cmd["bench/family4l"],
        ),
        dict(
            claim="Linear time in the number of tokens",
            paper="inference at 9216x9216; other mechanisms out of memory beyond 1024x1024 (40 GB)",
            ours=(
                f"latency ~ tokens^k: Linear-InfSA k={_k('linear_infvit_4l_patch16_224')}, fused softmax "
                f"{_k('vit_4l_patch16_224')}, naive {_k('vit_4l_patch16_224:naive')}, pure InfSA "
                f"{_k('infvit_4l_patch16_224')}; sweep up to {max(r for r in largest.values() if r)} px "
                "(9216 px: `linvit bench --suite highres`)"
            ),
            command=cmd["bench/family4l"],
        ),
    ]
    katz_row = dict(
        claim="Exact infinite-hop InfSA (Katz series) in linear time",
        paper="- (beyond the papers; docs/spec/infsa.md section 4)",
        ours=(
            f"exponent {_k('katz_infvit_4l_patch16_224')}; latency "
            f"{', '.join(f'{v:.2f}x at {k}' for k, v in sorted(katz_vs_lin.items()))} of Linear-InfSA; "
            f"{katz['eval']['top1']:.1f}% top-1 (same setting as above)"
        ),
        command=cmd["bench/family4l"],
    )
    weightformer = [
        dict(
            claim="WeightFormer beats DeiT at similar cost",
            paper="WF-S 81.3% vs DeiT-S 79.8%; WF-T ~76.3% vs DeiT-T 72.2% (ImageNet-1k)",
            ours=f"WeightFormer {wf['eval']['top1']:.1f}% vs softmax {soft['eval']['top1']:.1f}% top-1 ({setting})",
            command=cmd["eval/weightformer"],
        ),
        dict(
            claim="WeightFormer-S costs 4.4 GFLOPs",
            paper="4.4G (DeiT-S 4.6G) at 224x224",
            ours=(
                f"{macs['weightformer_small_patch16_224']:.2f} GMACs (DeiT-S "
                f"{macs['deit_small_patch16_224']:.2f}) at 224x224, torch FLOP counter"
            ),
            command='linvit models --filter "weightformer_small*" --macs',
        ),
        dict(
            claim="7.7x DeiT's throughput at 1248x1248",
            paper="7.7x (GPU)",
            ours=(
                f"{_x(wf_x.get(wf_res))} WeightFormer-T vs DeiT-T at {wf_res}x{wf_res} ({where}; DeiT with "
                f"timm's fused attention); {', '.join(f'{v:.2f}x at {k}' for k, v in sorted(wf_x.items()))}"
            ),
            command=cmd["bench/weightformer"],
        ),
        dict(
            claim="91% less memory at 1248x1248",
            paper="91% less GPU memory",
            ours=(
                f"{_pct(mem_cut)}% less: peak memory above idle {_mb(mem, 'weightformer_tiny_patch16_224')} vs "
                f"{_mb(mem, 'deit_tiny_patch16_224')} MB (WeightFormer-T vs DeiT-T) at {wf_res}x{wf_res} ({where})"
            ),
            command=cmd["bench/weightformer"],
        ),
        dict(
            claim="Global effective receptive field after training",
            paper="qualitative (RepLKNet protocol)",
            ours=(
                f"share of gradient outside the central quarter: WeightFormer {wf['erf_outside_centre']:.2f}, "
                f"softmax {soft['erf_outside_centre']:.2f}, Linear-InfSA {lin['erf_outside_centre']:.2f}"
            ),
            command=cmd["erf/weightformer"],
        ),
    ]
    return {"Infinite Self-Attention": infsa, "Beyond the papers": [katz_row], "WeightFormer": weightformer}


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def markdown(report: dict) -> str:
    env, r = report["environment"], report["recipe"]
    where = env.get("gpu") or f"{env['cpu_cores']} CPU cores"
    lines = [
        f"# linvit reproduce ({report['mode']})",
        "",
        f"linvit {env['linvit']}, torch {env['torch']}, timm {env['timm']}, Python {env['python']}, {where} "
        f"({env['torch_threads']} torch threads). All stages: {report['seconds_all_stages'] / 60:.1f} min "
        f"(this invocation: {report['seconds_this_run'] / 60:.1f} min; reused stages count their first run).",
        "",
        "Small-scale checks of the papers' mechanisms on the embedded cluttered-MNIST data, not replications of "
        "their ImageNet numbers: the accuracy rows compare mixers under one short identical recipe.",
    ]
    for title, rows in report["claims"].items():
        lines += [
            "",
            f"## {title}",
            "",
            "| claim | paper (value, setting) | linvit (value, setting) | command |",
            "|---|---|---|---|",
        ]
        lines += [_row([c["claim"], c["paper"], c["ours"], f"`{c['command']}`"]) for c in rows]
    lines += [
        "",
        "## Every model",
        "",
        "| family | model | params | top-1 | top-5 | map | box ROC-AUC | box PR-AUC | MoRF-AOC | LeRF-AOC "
        "| pointing | ERF outside centre | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family, e in report["families"].items():
        x = e["explain"]
        erf = e.get("erf_outside_centre")
        lines.append(
            _row(
                [
                    family,
                    f"`{e['model']}`",
                    f"{e['params']:,}",
                    f"{e['eval']['top1']:.1f}",
                    f"{e['eval']['top5']:.1f}",
                    x["method"],
                    f"{x['box_roc_auc']:.3f}",
                    f"{x['box_pr_auc']:.3f}",
                    f"{x['morf_aoc']:.3f}",
                    f"{x['lerf_aoc']:.3f}",
                    f"{x['pointing_game']:.2f}",
                    "-" if erf is None else f"{erf:.3f}",
                    f"{e['train_seconds']:.0f}",
                ]
            )
        )
    lines += [
        "",
        "## Figures",
        "",
        "![scaling](scaling.png)",
        "",
        "![maps](maps.png)",
        "",
        "![curves](curves.png)",
        "",
        "![erf](erf.png)",
        "",
        "## Commands",
        "",
        f"Every stage, in order (also `commands.sh`); re-running `linvit reproduce` with the same --out reuses "
        f"finished stages. Recipe: `{json.dumps(r)}`.",
        "",
        "```bash",
    ]
    lines += list(report["commands"].values())
    lines += ["```", ""]
    return "\n".join(lines)


def write_report(out: Path, stages: list[Stage], timings: dict, mode: str, device: str, recipe: Recipe) -> dict:
    """report.json, report.md, commands.sh and the four figures into ``out``."""
    report = collect(out, stages, timings, mode, device, recipe)
    report["claims"] = claims(report)
    labels = {family: f"{family}\n({e['explain']['method']})" for family, e in report["families"].items()}
    examples = {family: dict(np.load(out / "explain" / family / "maps.npz")) for family in report["families"]}
    maps_figure(examples, labels, out / "maps.png")
    curves_figure({k: e["explain"] for k, e in report["families"].items()}, out / "curves.png")
    erf_figure(
        {k: np.load(out / "erf" / k / "erf.npy") for k in ERF},
        {k: report["families"][k]["erf_outside_centre"] for k in ERF},
        out / "erf.png",
    )
    scaling_figure(
        report["bench"]["family4l"]["points"], report["bench"]["weightformer"]["points"], out / "scaling.png"
    )
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(markdown(report))
    (out / "commands.sh").write_text("#!/usr/bin/env bash\nset -e\n" + "\n".join(report["commands"].values()) + "\n")
    return report
