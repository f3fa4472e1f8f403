"""`linvit reproduce`: stage reuse and restart, and the whole pipeline end to end on a tiny recipe."""

from __future__ import annotations

import argparse
import json

import pytest

from linvit.cli import run_command
from linvit.reproduce import RECIPES, Recipe, Stage, build_plan, run_reproduce, run_stages
from linvit.reproduce.plan import FAMILIES


def _stage(tmp_path, name: str, value: str) -> Stage:
    path = tmp_path / f"{name}.json"
    return Stage(name, ["write", "--out", str(path), value], outputs=[f"{name}.json"], est_s=1.0)


def _writer(calls: list, fail_on: str | None = None):
    def execute(argv):
        calls.append(argv[-1])
        if argv[-1] == fail_on:
            raise RuntimeError("interrupted")
        with open(argv[2], "w") as f:
            json.dump({"value": argv[-1]}, f)

    return execute


def test_finished_stages_are_reused_and_an_interrupted_run_continues(tmp_path):
    stages = [_stage(tmp_path, "a", "1"), _stage(tmp_path, "b", "2"), _stage(tmp_path, "c", "3")]
    calls: list = []
    with pytest.raises(RuntimeError):
        run_stages(tmp_path, stages, _writer(calls, fail_on="2"))
    assert calls == ["1", "2"]
    calls.clear()
    timings = run_stages(tmp_path, stages, _writer(calls))
    assert calls == ["2", "3"]  # a was finished: reused; b failed: run again
    assert timings["a"]["reused"] and not timings["b"]["reused"]
    calls.clear()
    run_stages(tmp_path, stages, _writer(calls))
    assert calls == []


def test_a_corrupt_output_or_changed_command_reruns_the_stage(tmp_path):
    stages = [_stage(tmp_path, "a", "1"), _stage(tmp_path, "b", "2")]
    run_stages(tmp_path, stages, _writer([]))
    (tmp_path / "a.json").write_text("{truncated")
    changed = [stages[0], _stage(tmp_path, "b", "2-new")]
    calls: list = []
    run_stages(tmp_path, changed, _writer(calls))
    assert calls == ["1", "2-new"]
    assert json.loads((tmp_path / "b.json").read_text()) == {"value": "2-new"}


def test_a_stage_that_leaves_no_output_fails_loudly(tmp_path):
    with pytest.raises(RuntimeError, match="without writing"):
        run_stages(tmp_path, [_stage(tmp_path, "a", "1")], lambda argv: None)


def test_plans_are_valid_linvit_commands(tmp_path):
    from linvit.cli import build_parser

    parser = build_parser()
    for mode in RECIPES:
        for device in ("cpu", "cuda"):
            stages = build_plan(str(tmp_path), mode, device)
            assert len({s.name for s in stages}) == len(stages)
            for stage in stages:
                parser.parse_args(stage.argv)  # every stage is a command a user could type
            assert {s.info.get("family") for s in stages if s.name.startswith("train/")} == {f for _, f, _ in FAMILIES}


TINY = Recipe(
    canvas=32,
    per_class_train=2,
    per_class_val=1,
    clutter=1,
    patch=8,
    depth=1,
    wf_depth=2,
    epochs=1,
    batch=5,
    lr=1e-3,
    explain_images=4,
    spectral_images=2,
    erf_images=2,
    family_res=(32, 64),
    wf_res=(32, 64),
    bench_iters=1,
)


def test_reproduce_end_to_end_writes_the_report_and_reuses_everything(tmp_path, monkeypatch):
    monkeypatch.setattr("linvit.reproduce.plan.FAMILY_4L", ["vit_4l_patch16_224", "linear_infvit_4l_patch16_224"])
    monkeypatch.setattr("linvit.reproduce.plan.WF_VS_DEIT", ["weightformer_tiny_patch16_224", "deit_tiny_patch16_224"])
    args = argparse.Namespace(quick=True, device="cpu", out=str(tmp_path / "out"))
    report = run_reproduce(args, execute=run_command, recipe=TINY)
    out = tmp_path / "out"
    for name in ("report.md", "report.json", "commands.sh", "scaling.png", "maps.png", "curves.png", "erf.png"):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "report.json").read_text())
    assert set(data["families"]) == {f for _, f, _ in FAMILIES}
    assert all(0 <= e["eval"]["top1"] <= 100 for e in data["families"].values())
    assert data["macs_224"]["weightformer_small_patch16_224"] == pytest.approx(4.43, abs=0.01)
    assert data["macs_224"]["deit_small_patch16_224"] == pytest.approx(4.6, abs=0.01)
    md = (out / "report.md").read_text()
    for title in ("## Infinite Self-Attention", "## WeightFormer", "## Beyond the papers"):
        assert title in md
    rows = [row for rows in report["claims"].values() for row in rows]
    assert all(row["command"].startswith("linvit ") for row in rows)
    assert all(f"`{row['command']}`" in md for row in rows)
    # a second run with the same --out reuses every stage
    again = run_reproduce(args, execute=run_command, recipe=TINY)
    assert all(t["reused"] for t in again["stages"].values())
    assert again["seconds_this_run"] == 0
