"""Would a local window close the vision students' gap? A dense probe (issue 44).

On language, exact softmax over the last 64 tokens plus Katz (or linear attention) over the older ones, one
shared normaliser, took the Katz student from 12.3% to 1.8% above its teacher's loss (docs/results.md). Images
have no "last W tokens"; their analogue is a spatial window. This probe asks whether that analogue would lift the
vision students to the 99% goal before the form is built in linear time: each student layer here weighs

    key j of query i by exp(q_i . k_j / sqrt(d))   where j is in i's window,
                    by phi(q_i) . phi(k_j)          elsewhere, carrying v_j (+ O_j under Katz),

with one normaliser over both: docs/spec/infsa.md 4.2's hybrid made bidirectional, O the bidirectional form of
4.1's Katz output, sum_{t>=1} (gamma A^)^t v with A^ = phi(Q) phi(K)^T normalised per query (row sums 1). A
patch's window is its w x w neighbourhood on the token grid plus the class token; the class token's row is exact
over all tokens (it is one row: O(N), so a linear-time form can afford it). The layers compute this densely
(N x N, quadratic): the probe measures what the form would keep, not its speed, and its mixers live only here.

Students: `katz_infsa:hedgehog` and the anchor `linear_attention:hedgehog` with a 3 x 3 window (`+w3`) and a
1 x 1 one (`+w1`: each patch's own key and the class token exact), on the 64-token teachers
(scripts/distill_experiment.py --part vision --task digit64) with the tables' `distill` recipe (Katz's: 2 epochs
of attention transfer at lr 2e-3 on the output MSE, 1 end to end) at 10% of the teachers' steps, 3 seeds.
Paired seed by seed with the same form's run without a window (the 64-token table's `distill` rows).

    python scripts/window_probe.py                   # resumable; writes docs/distill/window_probe.json + table
    python scripts/window_probe.py --report-only     # the table from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import distill_experiment as experiment  # scripts/: its task, budget and recipe
import torch
from distill_report import distill_runs_arguments, rounded, write_section

from linvit.layers import KatzInfSAAttention
from linvit.layers.infsa_attention import FEATURE_MAPS
from linvit.layers.linear_attention import LinearAttention
from linvit.mixers import Option, register_mixer
from linvit.ops.common import gamma_as_tensor
from linvit.reproduce.stages import run_stages
from linvit.reproduce.stats import mean_interval, paired_difference
from linvit_cli import run_command

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "docs" / "distill" / "window_probe.json"
DOC = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- window-probe:begin -->", "<!-- window-probe:end -->"
TASK, BUDGET = "digit64", 0.10
WINDOWS = {"w3": 3, "w1": 1}  # probe -> the side of a patch's window (the class token is exact in every one)
# probe form -> (the mixer it extends, its name in the table); `katz_rows` (no window: its rows are normalised, as the
# hybrid's shared normaliser normalises Katz's) is shown beside them for reference
BASES = {
    "katz": ("katz_infsa:hedgehog", "Katz-InfSA, `hedgehog` maps"),
    "katz_rows": ("katz_rows:hedgehog", "Katz-InfSA, rows normalised (`katz_rows`), `hedgehog` maps"),
    "linear": ("linear_attention:hedgehog", "`adala` (linear attention, `hedgehog` maps)"),
}
WINDOWED = ("katz", "linear")
WHAT = {"w3": "3 x 3 window + class token", "w1": "1 x 1 window (a patch's own key) + class token"}


def window_mask(n: int, side: int, device) -> torch.Tensor:
    """(N, N) bool, True where query i weighs key j by exact softmax: the class (prefix) tokens' rows and columns,
    and each patch's side x side neighbourhood on the square grid (N = prefix + g^2)."""
    g = math.isqrt(n)
    prefix = n - g * g
    rows = torch.arange(g * g, device=device) // g
    cols = torch.arange(g * g, device=device) % g
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    near = ((rows[:, None] - rows[None]).abs() <= side // 2) & ((cols[:, None] - cols[None]).abs() <= side // 2)
    mask[prefix:, prefix:] = near
    return mask


def hybrid(q, k, fq, fk, v, older, side: int) -> torch.Tensor:
    """The dense hybrid in float32: softmax over [window scores, log phi(q).phi(k) elsewhere] applied to v, the
    non-window weights also to `older` (Katz's output; None under linear attention)."""
    q, k, fq, fk, v = (t.float() for t in (q, k, fq, fk, v))
    win = window_mask(q.shape[-2], side, q.device)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    kernel = (fq @ fk.transpose(-2, -1)).clamp_min(1e-30)  # hedgehog features are positive: never 0 in practice
    weights = torch.where(win, scores, kernel.log()).softmax(-1)
    out = weights @ v
    if older is not None:
        out = out + weights.masked_fill(win, 0.0) @ older.float()
    return out


def row_katz(fq, fk, v, gamma, eps: float) -> torch.Tensor:
    """sum_{t>=1} (gamma A^)^t v with A^ = phi(Q) phi(K)^T divided by its row sums (float32, dense): the Katz output
    the hybrid carries, the bidirectional form of docs/spec/infsa.md 4.1's per-query normalised causal series."""
    fq, fk, v = fq.float(), fk.float(), v.float()
    a = fq @ fk.transpose(-2, -1)
    a = a / (a.sum(-1, keepdim=True) + eps)
    ga = gamma_as_tensor(gamma, a.shape[1], a) * a
    return torch.linalg.solve(torch.eye(a.shape[-1], dtype=a.dtype, device=a.device) - ga, ga @ v)


def probe_mixers(side: int, name: str):
    """The two probe layers for one window side, registered as katz_<name> and linear_<name>."""

    class KatzWindow(KatzInfSAAttention):
        def mix(self, x, attn_mask=None, is_causal=False):
            q, k, v = self.project_qkv(x)
            fq, fk = self.feature_q(q), self.feature_k(k)
            older = row_katz(fq, fk, v, self.gamma, self.eps)
            return self.merge_heads(hybrid(q, k, fq, fk, v, older, side).to(v.dtype))

    class LinearWindow(LinearAttention):
        def forward(self, x, attn_mask=None, is_causal=False):
            B, N, C = x.shape
            q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            fq, fk = self.features(q, k)
            out = hybrid(q, k, fq, fk, v, None, side).to(v.dtype)
            return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(B, N, C))))

    option = Option("feature_map", FEATURE_MAPS, "relu")
    register_mixer(f"katz_{name}", KatzWindow, option=option, cannot=("attn_drop", "attn_mask"), distill_gamma=0.5)
    register_mixer(f"linear_{name}", LinearWindow, option=option, cannot=("attn_drop", "attn_mask"))


def stages(out: Path, seeds: list[int]) -> list:
    task, part = experiment.VISION_TASKS[TASK], f"{out}/{experiment.PARTS[TASK]}"
    data = experiment.students_data(task, BUDGET)
    found = []
    for seed in seeds:
        teacher = f"{part}/runs/{task.name}/softmax/s{seed}"
        for name in WINDOWS:
            for base in WINDOWED:
                mixer = f"{base}_{name}:hedgehog"
                argv = experiment.transfer_heavy_argv(teacher, data, mixer, seed)
                found.append(
                    experiment.stage(f"window_probe/{base}_{name}/s{seed}", part, argv, {"mixer": mixer, "seed": seed})
                )
    for seed in seeds:  # the same forms without a window: the 64-token table's `distill` runs, made if missing
        teacher = f"{part}/runs/{task.name}/softmax/s{seed}"
        for mixer, _ in BASES.values():
            argv = experiment.transfer_heavy_argv(teacher, data, mixer, seed)
            found.append(
                experiment.stage(
                    f"{experiment.TRANSFER_HEAVY}/{mixer}/b{BUDGET:g}/s{seed}",
                    part,
                    argv,
                    {"mixer": mixer, "seed": seed},
                )
            )
    return found


def summary(out: Path) -> dict:
    part = out / experiment.PARTS[TASK]
    runs = {s: part / f"runs/{experiment.VISION_TASKS[TASK].name}/softmax/s{s}/metrics.jsonl" for s in range(3)}
    teachers = {s: experiment.last_metrics(path)["val_top1"] for s, path in runs.items() if path.is_file()}
    rows = []
    for base, (mixer, _) in BASES.items():
        plain = experiment.finished_top1s(part, f"{experiment.TRANSFER_HEAVY}/{mixer}/b{BUDGET:g}", teachers)
        for name in [None, *WINDOWS] if base in WINDOWED else [None]:
            val = plain if name is None else experiment.finished_top1s(part, f"window_probe/{base}_{name}", teachers)
            if not val:
                continue
            retention = [100 * v / teachers[s] for s, v in val.items()]
            shared = {s: plain[s] for s in val if s in plain}
            paired = paired_difference({s: val[s] for s in shared}, shared) if name and shared else None
            rows.append(
                {
                    "form": base,
                    "window": name,
                    "val_top1": val,
                    "retention": mean_interval(retention),
                    "vs_plain": paired,
                }
            )
    return {"task": TASK, "budget": BUDGET, "teachers": teachers, "rows": rows}


def _interval(stat: dict | None, signed: bool = False) -> str:
    if stat is None:
        return "-"
    fmt = "{:+.1f}" if signed else "{:.1f}"
    if stat["n"] < 2:  # one seed: no interval
        return fmt.format(rounded(stat["mean"]))
    return f"{fmt.format(rounded(stat['mean']))} [{rounded(stat['low']):.1f}, {rounded(stat['high']):.1f}]"


def table(data: dict) -> str:
    teachers = ", ".join(f"{v:g}" for v in data["teachers"].values())
    lines = [
        "Generated by `python scripts/window_probe.py` from docs/distill/window_probe.json: the 64-token teachers "
        f"(seeds {', '.join(map(str, data['teachers']))}: val top-1 {teachers}), {data['budget']:.0%} of their "
        "steps, the tables' `distill` recipe (output MSE). Dense probe layers (quadratic; the form's quality, not "
        "its speed). `vs no window`: val top-1 against the same form's `distill` run of each seed (points, paired).",
        "",
        "| student | exact softmax on | val top-1 | retention (%) | vs no window (points) |",
        "|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        where = "nothing (the table's `distill` row)" if row["window"] is None else WHAT[row["window"]]
        top1 = mean_interval(list(row["val_top1"].values()))
        lines.append(
            f"| {BASES[row['form']][1]} | {where} | {_interval(top1)} | {_interval(row['retention'])} "
            f"| {_interval(row['vs_plain'], signed=True)} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    distill_runs_arguments(p, [0, 1, 2])
    args = p.parse_args()
    if args.report_only:
        write_section(DOC, BEGIN, END, table(json.loads(FILE.read_text())), FILE)
        return
    for name, side in WINDOWS.items():
        probe_mixers(side, name)
    torch.set_num_threads(1)  # as distill_experiment runs its students
    out = Path(args.out)
    run_stages(out / experiment.PARTS[TASK], stages(out, sorted(args.seeds)), run_command)
    data = summary(out)
    FILE.write_text(json.dumps(data, indent=2) + "\n")
    write_section(DOC, BEGIN, END, table(data), FILE)


if __name__ == "__main__":
    main()
