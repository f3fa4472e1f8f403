"""Where a learned feature map starts (issue 44): Katz-InfSA students of trained softmax teachers, converted with
the fixed maps (relu, elu+1) and with Hedgehog's map at several initial scales of W = s / sqrt(d) I, before any
training: each converted layer's relative output error against its teacher layer on the teacher's own input
(attention transfer's starting loss, distillation.transfer.LayerTaps) and the converted model's val top-1.

    python scripts/feature_map_init.py --teachers runs/distill/vision/runs/digit/softmax/s0 ... \
        --out docs/distill/feature_map_init.json

The chosen default (layers.feature_maps.INIT_SCALE) is the scale whose starting loss is lowest.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from linvit.data.splits import open_split
from linvit.distillation import make_student
from linvit.distillation.task import default_gamma
from linvit.distillation.teacher import load_teacher, logits_of
from linvit.distillation.transfer import LayerTaps, layer_pairs
from linvit.layers import feature_maps
from linvit.reproduce.stats import mean_interval
from linvit.weights.run_folder import run_args


def val_batch(teacher, data: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    from timm.data import create_transform

    split = open_split(data, "val", create_transform(**teacher.data_config, is_training=False))
    items = [split[i] for i in range(min(count, len(split)))]
    return torch.stack([item[0] for item in items]), torch.tensor([item[1] for item in items])


@torch.no_grad()
def measure(teacher_model, form: str, scale: float | None, images, labels) -> dict:
    if scale is not None:
        feature_maps.INIT_SCALE = scale
    student = make_student(teacher_model, form, default_gamma(form)).eval()
    taps = LayerTaps(layer_pairs(teacher_model, student))
    with taps.active(substitute=True):
        teacher_model(images), student(images)
        loss = taps.loss().item()
    top1 = (logits_of(student(images)).argmax(-1) == labels).float().mean().item() * 100
    return {"form": form, "scale": scale, "transfer_loss": loss, "val_top1": top1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teachers", nargs="+", required=True, help="softmax run folders")
    p.add_argument("--scales", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0])
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--out", default="docs/distill/feature_map_init.json")
    args = p.parse_args()
    default_scale = feature_maps.INIT_SCALE
    rows = []
    for folder in args.teachers:
        teacher = load_teacher(folder)
        images, labels = val_batch(teacher, run_args(Path(folder))["data"], args.images)
        forms = [("katz_infsa", None), ("katz_infsa:elu+1", None)]
        forms += [("katz_infsa:hedgehog", s) for s in args.scales]
        for form, scale in forms:
            row = {"teacher": folder, **measure(teacher.model, form, scale, images, labels)}
            print(json.dumps(row))
            rows.append(row)
    feature_maps.INIT_SCALE = default_scale
    summary = []
    for form, scale in sorted({(r["form"], r["scale"]) for r in rows}, key=lambda f: (f[0], f[1] or 0)):
        mine = [r for r in rows if (r["form"], r["scale"]) == (form, scale)]
        summary.append(
            {
                "form": form,
                "scale": scale,
                "transfer_loss": mean_interval([r["transfer_loss"] for r in mine]),
                "val_top1": mean_interval([r["val_top1"] for r in mine]),
            }
        )
    out = {"teachers": args.teachers, "images": args.images, "default_scale": default_scale, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**out, "summary": summary}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
