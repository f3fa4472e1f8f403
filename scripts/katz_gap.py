"""Why Katz-InfSA students keep less of a vision teacher than the anchor form (issue 44): each distilled
student's converted layers, on their teacher layers' inputs, written as dense weight matrices and compared with
the teacher's softmax weights.

Every layer of the three students mixes values linearly, y_i = proj(sum_j M_ij v_j): softmax's M = P has rows
that sum to 1; the anchor (`linear_attention:hedgehog`, ViT-AdaLA's form) normalises its rows too; Katz-InfSA's
M = sum_t gamma^t A^^t (A^ Frobenius-normalised, docs/spec/infsa.md section 4) does not, so a query's total
weight r_i = sum_j M_ij moves with its features. Per student, over validation images and layers (float64):
- `rel_err`: the layer's output error relative to its teacher layer's (attention transfer's loss, per layer);
- `row_sum_cv`: the spread of r_i over queries (std / mean per head and image; 0 for a row-normalised form);
- `tv_distance`: where the normalised rows M_i / r_i put their weight against the teacher's P_i (total
  variation, 0 = the same tokens in the same shares, 1 = disjoint);
- `rel_err_equal_rows`: the error once every query's row is rescaled to its head's mean row sum (the same
  weights' directions, the magnitude spread removed), with the layer's own values and projection;
- `tv_distance_one_hop`, `multi_hop_share`, `gamma`: the same distance for Katz's first term gamma A^ alone, the
  share of its weight that comes through two hops or more, and its learned discounts (mean over heads).
If equalising the rows closes most of Katz's error, its unnormalised rows are what it lacks; if the normalised
rows' distance is already the anchor's or worse, it is where its weights go.

    python scripts/katz_gap.py --part runs/distill/vision64 --seeds 0 1 2 --publish docs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from timm.data import create_transform, resolve_data_config

from linvit import load_run
from linvit.data.splits import open_split
from linvit.distillation.transfer import layer_pairs
from linvit.explain.maps import projected_qk
from linvit.layers import KatzInfSAAttention, KatzRowsAttention
from linvit.layers.linear_attention import LinearAttention
from linvit.ops.katz import katz_kernel, katz_operator

STUDENTS = {  # the distill tables' students: name -> (mixer, its runs' folder under the part)
    "katz_infsa": ("katz_infsa", "distill_transfer"),
    "katz_infsa:hedgehog": ("katz_infsa:hedgehog", "distill_transfer"),
    "katz_infsa:hedgehog, gamma_init 0.1": ("katz_infsa:hedgehog", "distill_transfer_gamma0.1"),
    "katz_infsa:hedgehog, mse+xent": ("katz_infsa:hedgehog", "distill_transfer_xent"),
    "katz_rows:hedgehog": ("katz_rows:hedgehog", "distill_transfer"),
    "katz_rows:hedgehog, mse+xent": ("katz_rows:hedgehog", "distill_transfer_xent"),
    "linear_attention:hedgehog": ("linear_attention:hedgehog", "distill_transfer"),
    "linear_attention:hedgehog, mse+xent": ("linear_attention:hedgehog", "distill_transfer_xent"),
}
STAGES = {"after transfer": "attention", "final": "."}  # the student's two run folders: its first stage's, its own
BEGIN, END = "<!-- katz-gap:begin -->", "<!-- katz-gap:end -->"


def dense_weights(layer, x: torch.Tensor, hops: int | None = None) -> torch.Tensor:
    """M (B, H, N, N) with layer(x) = proj(M v) for a softmax, Katz-InfSA or linear-attention layer (float64);
    hops=1: a Katz-InfSA layer's first term gamma A^ alone (its other forms have one hop)."""
    if isinstance(layer, KatzInfSAAttention):
        q, k = projected_qk(layer, x)
        A, gamma = katz_operator(q, k, layer.eps, layer.kernel), layer.gamma.double()[:, None, None]
        M = katz_kernel(A, gamma[:, 0, 0])
        # katz_rows divides every query's row of the whole series by its sum (its first hop by the same sum)
        rows = M.sum(-1, keepdim=True) + layer.eps if isinstance(layer, KatzRowsAttention) else 1.0
        return (gamma * A if hops == 1 else M) / rows
    if isinstance(layer, LinearAttention):
        q, k = projected_qk(layer, x, features=False)
        fq, fk = layer.features(q, k)
        scores = fq @ fk.transpose(-2, -1)
        return scores / (scores.sum(-1, keepdim=True) + layer.eps)
    q, k = projected_qk(layer, x, features=False)
    return (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)


def mixed_output(layer, x: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """proj(merge_heads(M v)) with the layer's own values, (optional) scale norm and projection."""
    B, N, C = x.shape
    v = layer.qkv(x).reshape(B, N, 3, layer.num_heads, -1).permute(2, 0, 3, 1, 4)[2]
    out = (M @ v).transpose(1, 2).reshape(B, N, C)
    return layer.proj(layer.norm(out) if hasattr(layer, "norm") else out)


def relative_error(y: torch.Tensor, target: torch.Tensor) -> float:
    return float((y - target).pow(2).mean() / target.pow(2).mean())


def tv_distance(M: torch.Tensor, P: torch.Tensor) -> float:
    """Mean over rows of the total variation between M's rows, normalised, and P's (row-stochastic)."""
    return float(0.5 * (M / M.sum(-1, keepdim=True) - P).abs().sum(-1).mean())


def layer_measures(teacher_layer, student_layer, x: torch.Tensor, target: torch.Tensor) -> dict:
    """The four measures of one layer on its teacher's input x, checking first that M reproduces the layer."""
    M, P = dense_weights(student_layer, x), dense_weights(teacher_layer, x)
    own = student_layer(x)
    check = relative_error(mixed_output(student_layer, x, M), own)
    if check > 1e-10:
        raise SystemExit(f"the dense weights do not reproduce {type(student_layer).__name__} (rel. error {check:.1e})")
    rows = M.sum(-1, keepdim=True)  # (B, H, N, 1)
    equal = M * rows.mean(-2, keepdim=True) / rows
    one_hop = dense_weights(student_layer, x, hops=1)
    return {
        "gamma": float(student_layer.gamma.mean()) if isinstance(student_layer, KatzInfSAAttention) else None,
        "multi_hop_share": float(1 - one_hop.sum() / M.sum()),
        "tv_distance_one_hop": tv_distance(one_hop, P),
        "rel_err": relative_error(own, target),
        "row_sum_cv": float((rows.std(-2) / rows.mean(-2).abs()).mean()),
        "row_sum_mean": float(rows.mean()),
        "tv_distance": tv_distance(M, P),
        "rel_err_equal_rows": relative_error(mixed_output(student_layer, x, equal), target),
    }


def teacher_io(teacher, pairs, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every paired teacher layer on the images."""
    found, handles = {}, []
    for i, (_, layer, _) in enumerate(pairs):
        handles.append(layer.register_forward_hook(lambda m, a, out, i=i: found.__setitem__(i, (a[0], out))))
    try:
        teacher(images)
    finally:
        for h in handles:
            h.remove()
    return [found[i] for i in range(len(pairs))]


@torch.no_grad()
def student_measures(teacher_run: Path, student_run: Path, images: int) -> dict:
    """Means over layers of layer_measures, on `images` validation images of the teacher's data, evenly spaced."""
    import yaml

    teacher, student = load_run(teacher_run).double(), load_run(student_run).double()
    args = yaml.safe_load((teacher_run / "args.yaml").read_text())
    data_config = resolve_data_config({"img_size": args["img_size"], "crop_pct": args["crop_pct"]}, model=teacher)
    split = open_split(args["data"], "val", create_transform(**data_config, is_training=False))
    # spread over the split: it is sorted by class, so its first images would be two digits' only
    picks = torch.linspace(0, len(split) - 1, min(images, len(split))).round().long().tolist()
    batch = torch.stack([split[i][0] for i in picks]).double()
    pairs = layer_pairs(teacher, student)
    rows = [
        layer_measures(t, s, x, y) for (_, t, s), (x, y) in zip(pairs, teacher_io(teacher, pairs, batch), strict=True)
    ]
    means = {key: None if rows[0][key] is None else sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    return means | {"layers": rows}


def summary(part: Path, seeds: list[int], images: int) -> dict:
    from distill_experiment import PARTS, VISION_TASKS  # scripts/

    task = next(VISION_TASKS[t] for t, p in PARTS.items() if p == part.name)
    out = {"part": part.name, "tokens": (task.canvas // task.patch) ** 2, "images": images, "students": {}}
    out["teachers"] = {}  # seed -> the teacher's final val top-1: keep_published merges only the same teachers
    for seed in seeds:
        metrics = part / f"runs/{task.name}/softmax/s{seed}/metrics.jsonl"
        if metrics.is_file():
            out["teachers"][seed] = json.loads(metrics.read_text().splitlines()[-1])["val_top1"]
    for name, (mixer, folder) in STUDENTS.items():
        per_seed = {}
        for seed in seeds:
            run = part / f"{folder}/{mixer}/b0.1/s{seed}"
            if (run / "model.safetensors").is_file():
                teacher = part / f"runs/{task.name}/softmax/s{seed}"
                per_seed[seed] = {stage: student_measures(teacher, run / sub, images) for stage, sub in STAGES.items()}
        if per_seed:
            out["students"][name] = per_seed
    return out


def table(result: dict) -> str:
    from linvit.reproduce.stats import mean_interval

    def cell(values: list[float | None]) -> str:
        if None in values:
            return "-"
        m = mean_interval(values)
        if m["n"] < 2:
            return f"{m['mean']:.3f} (n=1)"
        return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"

    keys = ("rel_err", "rel_err_equal_rows", "row_sum_cv", "tv_distance", "tv_distance_one_hop", "multi_hop_share")
    keys += ("gamma",)
    lines = [
        f"Students of the table above (10% of the teacher's steps, `digit` at {result['tokens']} tokens): their "
        f"converted layers on the teacher layers' inputs ({result['images']} validation images spread evenly over the "
        "class-sorted split, float64; means over "
        "layers, then over seeds with 95% intervals), at the end of attention transfer and at the end. Generated by "
        "`python scripts/katz_gap.py` from docs/distill/katz_gap.json.",
        "",
        "| student | stage | seeds | output error | output error, rows equalised | row-sum spread (CV) | TV distance "
        "| TV distance, first hop only | weight in hops >= 2 | discount |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per_seed in result["students"].items():
        for stage in STAGES:
            cells = [cell([measures[stage][k] for measures in per_seed.values()]) for k in keys]
            lines.append(f"| `{name}` | {stage} | {len(per_seed)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def keep_published(result: dict, published: Path) -> dict:
    """The published students that have no runs here, where the published part is this one and its teachers are
    these (seed -> val top-1; a file from before teachers were recorded is taken as the part's), in STUDENTS'
    order."""
    earlier = json.loads(published.read_text()) if published.is_file() else {}
    if earlier.get("part") != result["part"] or earlier.get("images") != result["images"]:
        return result
    teachers = {int(s): v for s, v in earlier.get("teachers", {}).items()}
    if earlier.get("teachers") is not None and teachers != {int(s): v for s, v in result["teachers"].items()}:
        print(f"{published}: other teachers ({earlier['teachers']}) than {result['part']}'s; its students not kept")
        return result
    students = earlier["students"] | result["students"]
    return result | {"students": {name: students[name] for name in STUDENTS if name in students}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="runs/distill/vision64", help="a vision part of scripts/distill_experiment.py")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--report-only", action="store_true", help="the table from DOCS/distill/katz_gap.json")
    p.add_argument("--publish", default=None, metavar="DOCS", help="write DOCS/distill/katz_gap.json and results.md")
    args = p.parse_args()
    docs = Path(args.publish or "docs")
    if args.report_only:
        result = json.loads((docs / "distill/katz_gap.json").read_text())
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        torch.set_num_threads(1)
        result = summary(Path(args.part), args.seeds, args.images)
        result = keep_published(result, docs / "distill/katz_gap.json")
    print(table(result))
    if args.publish:
        from linvit.reproduce.report import replace_between

        if not args.report_only:
            (docs / "distill/katz_gap.json").write_text(json.dumps(result, indent=2))
        replace_between(docs / "results.md", BEGIN, END, f"{BEGIN}\n{table(result)}\n{END}")


if __name__ == "__main__":
    main()
