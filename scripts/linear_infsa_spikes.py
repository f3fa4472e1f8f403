"""Where Linear-InfSA's gradient spikes come from: reproduce's training run, instrumented step by step.

Linear-InfSA normalises its importance as a_j = r_j / (sum_l r_l + eps), r_j = ReLU(q_bar . k~_j), eps = 1e-6
(the release's). Where only one or two tokens of a (sample, head) pass the ReLU and barely, sum_l r_l is
near eps, and the derivative of r_j / (sum_l r_l + eps) grows like eps / (sum_l r_l + eps)^2. This script
runs `linvit reproduce --full`'s seed-0 training of Linear-InfSA on the digit task unchanged (the same
`linvit train` command, in this process) and records, with PyTorch's global module and optimizer hooks only
(nothing in the training path is replaced):
  - per optimizer step: the global gradient norm (the recipe does not clip) and the parameter that holds most
    of it;
  - per step and Linear-InfSA layer: the smallest positive sum_l r_l over the batch's (sample, head) pairs,
    and the share of pairs with no positive r_l at all (their importance is all zero: the head adds nothing).

    python scripts/linear_infsa_spikes.py --out runs/linear-spikes --publish docs   # ~4 min on 1 CPU thread

Writes OUT/steps.json, OUT/summary.json and OUT/spikes.png; --publish DOCS copies the last two to DOCS/sweeps/spikes/.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
import torch.optim.optimizer as optim_hooks

from linvit.layers.infsa_attention import LinearInfSAAttention
from linvit.ops.infsa import linear_infsa_importance, soft_query
from linvit.reproduce.plan import RECIPES, TASKS, Planner
from linvit.reproduce.report import replace_between
from linvit_cli import run_command

BEGIN, END = "<!-- spikes:begin -->", "<!-- spikes:end -->"
SPIKE = 20.0  # a step whose gradient norm exceeds this is a spike (typical steps: 2-10)


class Recorder:
    """Collects per-layer normaliser statistics during each training forward and closes a step at each
    optimizer step."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.layers: list[dict] = []
        self.names: dict[int, str] = {}
        self.checked = False

    def forward_hook(self, module, inputs, output) -> None:
        if not isinstance(module, LinearInfSAAttention) or not module.training or not torch.is_grad_enabled():
            return
        with torch.no_grad():
            q, k, _ = module.project_qkv(inputs[0])
            q_bar = soft_query(q, module.eps)  # (B, H, D)
            r = torch.relu(torch.einsum("bhd,bhnd->bhn", q_bar, k.to(q_bar.dtype) / math.sqrt(k.shape[-1])))
            if not self.checked:  # the statistics describe the layer's own importance, or the script is wrong
                a = r / (r.sum(-1, keepdim=True) + module.eps)
                torch.testing.assert_close(a, linear_infsa_importance(q, k, module.eps).to(a.dtype))
                self.checked = True
            total = r.sum(-1)  # (B, H)
            positive = total[total > 0]
            self.layers.append(
                {
                    "smallest_positive_sum": positive.min().item() if positive.numel() else None,
                    "dead_share": (total == 0).float().mean().item(),
                    "dead_by_head": (total == 0).float().mean(0).tolist(),  # share of the batch, per head
                }
            )

    def model_hook(self, module, inputs) -> None:
        if not self.names and hasattr(module, "blocks"):  # the model itself: name its parameters once
            self.names = {id(p): n for n, p in module.named_parameters()}

    def step_hook(self, optimizer, args, kwargs) -> None:
        grads = {id(p): p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None}
        norms = {key: torch.linalg.vector_norm(g.float()).item() for key, g in grads.items()}
        largest = max(norms, key=norms.get)
        self.steps.append(
            {
                "step": len(self.steps),
                "grad_norm": math.sqrt(sum(v * v for v in norms.values())),
                "largest_parameter": self.names.get(largest, "?"),
                "layers": self.layers,
            }
        )
        self.layers = []


def summarise(steps: list[dict], updates_per_epoch: int) -> dict:
    """The spikes and, for comparison, every step: how small the normaliser was."""

    def smallest(step: dict) -> float | None:
        values = [x["smallest_positive_sum"] for x in step["layers"] if x["smallest_positive_sum"] is not None]
        return min(values, default=None)

    spikes = [s for s in steps if s["grad_norm"] > SPIKE]
    below = {t: [s for s in steps if smallest(s) and smallest(s) < t] for t in (1e-5, 3e-5)}
    pairs = [(math.log10(smallest(s)), math.log10(s["grad_norm"])) for s in steps if smallest(s)]
    corr = torch.corrcoef(torch.tensor(pairs, dtype=torch.float64).T)[0, 1].item() if len(pairs) > 2 else None
    ordinary = sorted(smallest(s) for s in steps if s["grad_norm"] <= SPIKE and smallest(s))
    dead = [sum(x["dead_share"] for x in s["layers"]) / len(s["layers"]) for s in steps if s["layers"]]
    return {
        "steps": len(steps),
        "spike_threshold": SPIKE,
        "spikes": [
            {
                "step": s["step"],
                "epoch": s["step"] // updates_per_epoch,
                "grad_norm": s["grad_norm"],
                "largest_parameter": s["largest_parameter"],
                "smallest_positive_sum": smallest(s),
            }
            for s in spikes
        ],
        # how specific a tiny normaliser is: of the steps where it fell below t, how many spiked
        "steps_below": {
            f"{t:g}": {"steps": len(v), "spikes": sum(x["grad_norm"] > SPIKE for x in v)} for t, v in below.items()
        },  # fmt: skip
        "median_smallest_positive_sum_other_steps": ordinary[len(ordinary) // 2] if ordinary else None,
        "corr_log_smallest_sum_log_grad_norm": corr,
        "mean_dead_share": sum(dead) / len(dead) if dead else None,
    }


def section(summary: dict) -> str:
    """docs/results.md's text and table, from summary.json."""
    below = summary["steps_below"]
    lines = [
        f"Gradient spikes (norm > {summary['spike_threshold']:g}; a typical step is 2-10) in the "
        f"{summary['steps']} steps of `{summary['command']}`, instrumented by `python scripts/linear_infsa_spikes.py "
        "--publish docs` (global module and optimizer hooks; the run is the reproduce run unchanged, on one "
        f"thread). Of the steps where some (sample, head) had a positive normaliser below 1e-5, "
        f"{below['1e-05']['spikes']} of {below['1e-05']['steps']} spiked; below 3e-5, {below['3e-05']['spikes']} "
        f"of {below['3e-05']['steps']}. The median smallest normaliser of the other steps is "
        f"{summary['median_smallest_positive_sum_other_steps']:.1e}; on average "
        f"{100 * summary['mean_dead_share']:.0f}% of (sample, head) pairs per layer had no positive score at all "
        "(an all-zero importance: that head adds nothing for that image). The run's val top-1 per epoch: "
        f"{', '.join(f'{v:g}' for v in summary['val_curve'])}.",
        "",
        "| step | epoch | gradient norm | parameter with the largest gradient | smallest positive sum_l ReLU(score) |",
        "|---|---|---|---|---|",
    ]
    for spike in summary["spikes"]:
        lines.append(
            f"| {spike['step']} | {spike['epoch']} | {spike['grad_norm']:,.0f} | `{spike['largest_parameter']}` "
            f"| {spike['smallest_positive_sum']:.1e} |"
        )
    return "\n".join(lines)


def figure(steps: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s["step"] for s in steps]
    smallest = [min((v["smallest_positive_sum"] or math.inf for v in s["layers"]), default=math.inf) for s in steps]
    fig, axes = plt.subplots(2, 1, figsize=(8, 4.8), sharex=True)
    axes[0].semilogy(x, [s["grad_norm"] for s in steps], lw=0.8)
    axes[0].axhline(SPIKE, color="grey", ls=":", lw=0.8)
    axes[0].set_ylabel("gradient norm")
    axes[1].semilogy(x, smallest, lw=0.8, color="C1")
    axes[1].axhline(1e-6, color="grey", ls=":", lw=0.8)
    axes[1].set_ylabel("smallest positive\nsum of ReLU scores")
    axes[1].set_xlabel("optimizer step (62 per epoch)")
    for spike in summary["spikes"]:
        for ax in axes:
            ax.axvline(spike["step"], color="C3", lw=0.6, alpha=0.6)
    axes[0].set_title("Linear-InfSA, reproduce's digit run, seed 0: spikes (red) vs its normaliser (eps = 1e-6)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record_training(argv: list[str]) -> list[dict]:
    """Run `linvit train` (argv) in this process with the Recorder's global hooks; its per-step records."""
    recorder = Recorder()
    handles = [
        torch.nn.modules.module.register_module_forward_hook(recorder.forward_hook),
        torch.nn.modules.module.register_module_forward_pre_hook(recorder.model_hook),
        optim_hooks.register_optimizer_step_post_hook(recorder.step_hook),
    ]
    try:
        run_command(argv)
    finally:
        for handle in handles:
            handle.remove()
    return recorder.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/linear-spikes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publish", default=None, help="docs folder: DOCS/sweeps/spikes/{summary.json, spikes.png}")
    parser.add_argument("--report-only", action="store_true", help="summarise OUT/steps.json of an earlier run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stage = Planner(str(out), "cpu", RECIPES["full"]).train(TASKS["digit"], "linear", args.seed)
    argv = [*stage.argv, "--threads", "1"]  # one thread: the float rounding, hence the run, is the same anywhere
    if not args.report_only:
        shutil.rmtree(out / "runs", ignore_errors=True)  # every step from the start, never a resume
        (out / "steps.json").write_text(json.dumps(record_training(argv)))
    steps = json.loads((out / "steps.json").read_text())
    summary = {"command": "linvit " + " ".join(argv), **summarise(steps, len(steps) // RECIPES["full"].epochs)}
    metrics = (out / stage.outputs[1]).read_text().splitlines()  # the run's metrics.jsonl
    summary["val_curve"] = [json.loads(line)["val_top1"] for line in metrics if line.strip()]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    figure(steps, summary, out / "spikes.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "command"}, indent=1))
    if args.publish:
        folder = Path(args.publish) / "sweeps" / "spikes"
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "spikes.png"):
            shutil.copy(out / name, folder / name)
        block = (
            f"{BEGIN}\n{section(summary)}\n\n![gradient norm and normaliser per step](sweeps/spikes/spikes.png)\n{END}"
        )
        replace_between(Path(args.publish) / "results.md", BEGIN, END, block)


if __name__ == "__main__":
    main()
