"""`linvit reproduce`: stage reuse and restart, and the whole pipeline end to end on a tiny recipe."""

from __future__ import annotations

import json

import pytest

from linvit.cli import run_command
from linvit.reproduce import RECIPES, Recipe, ReproduceConfig, Stage, build_plan, run_reproduce, run_stages
from linvit.reproduce.plan import FAMILIES, SHARED, TASKS, Task
from linvit.reproduce.stages import TimeLeft
from linvit.reproduce.stats import VERDICTS


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


def test_a_stage_whose_input_was_rewritten_runs_again_with_the_same_command(tmp_path):
    """An evaluation of retrained weights is stale although its command line is the same: the train stage
    ran again (new epochs), so every stage reading its output must run again too."""
    train = _stage(tmp_path, "train", "weights-v1")
    score = Stage(
        "score", ["write", "--out", str(tmp_path / "score.json"), "s"], ["score.json"], 1.0, inputs=["train.json"]
    )
    calls: list = []
    run_stages(tmp_path, [train, score], _writer(calls))
    run_stages(tmp_path, [train, score], _writer(calls))
    assert calls == ["weights-v1", "s"]  # the second run reused both
    retrained = _stage(tmp_path, "train", "weights-v2")
    calls.clear()
    run_stages(tmp_path, [retrained, score], _writer(calls))
    assert calls == ["weights-v2", "s"]  # the score's command did not change, its input did


def test_analysis_stages_name_the_weights_they_read(tmp_path):
    stages = {s.name: s for s in build_plan(str(tmp_path), "quick", "cpu")}
    assert stages["eval/digit/softmax/s0/test"].inputs[0] == "runs/digit/softmax/s0/model.safetensors"
    assert all(s.inputs for name, s in stages.items() if name.split("/")[0] in ("eval", "explain", "spectral", "erf"))


def test_time_left_ignores_a_stage_that_resumed_near_its_end():
    """A training stage resumed after its last epoch takes ~0 s against a 200 s estimate: the machine is not
    infinitely fast, so the pace measured so far (here 2x slower than estimated) must stand."""
    left = TimeLeft(1000.0)
    left.ran(200.0, 100.0)
    assert left.seconds() == pytest.approx(2 * 900)
    left.ran(0.5, 200.0)  # resumed: had nothing left to do
    assert left.seconds() == pytest.approx(2 * 700)
    left.ran(5.0, 100.0, counted=False)  # a stage the estimate had already left out
    assert left.seconds() == pytest.approx(2 * 700)


def test_a_stage_that_leaves_no_output_fails_loudly(tmp_path):
    with pytest.raises(RuntimeError, match="without writing"):
        run_stages(tmp_path, [_stage(tmp_path, "a", "1")], lambda argv: None)


def test_plans_are_valid_linvit_commands(tmp_path):
    from linvit.cli import build_parser

    parser = build_parser()
    for mode, recipe in RECIPES.items():
        for device in ("cpu", "cuda"):
            stages = build_plan(str(tmp_path), mode, device)
            assert len({s.name for s in stages}) == len(stages)
            for stage in stages:
                parser.parse_args(stage.argv)  # every stage is a command a user could type
            trained = {
                (s.info["task"], s.info["family"], s.info["seed"]) for s in stages if s.name.startswith("train/")
            }
            expected = {(t, f, seed) for t in recipe.tasks for f in FAMILIES for seed in recipe.seeds}
            assert expected <= trained  # every family, task and seed (plus the lr sweep's seed-0 runs)
            evaluated = {
                (s.info["task"], s.info["family"], s.info["seed"], s.info["split"])
                for s in stages
                if s.name.startswith("eval/")
            }
            assert evaluated == {(*key, split) for key in expected for split in ("test", "shifted")}
    quick, full = RECIPES["quick"], RECIPES["full"]
    assert (quick.tasks, quick.seeds) == (("digit",), (0,)) and len(full.seeds) == 3 and len(full.tasks) == 2
    assert {k: getattr(quick, k) for k in SHARED} == {k: getattr(full, k) for k in SHARED} == SHARED  # one recipe


def test_every_family_gets_the_same_width_depth_and_patch(tmp_path):
    stages = build_plan(str(tmp_path), "quick", "cpu")
    kwargs = {
        s.info["family"]: s.argv[s.argv.index("--model-kwargs") + 1 :] for s in stages if s.name.startswith("train/")
    }
    for family, values in kwargs.items():
        assert {"patch_size=8", "embed_dim=192", "depth=4"} <= set(values), family
    assert (
        len(
            {
                tuple(s.argv[s.argv.index("--lr") + 1 : s.argv.index("--lr") + 2])
                for s in stages
                if s.name.startswith("train/")
            }
        )
        == 1
    )


@pytest.fixture
def tiny_tasks(monkeypatch):
    """The two tasks with 16 training canvases per epoch, and two models per benchmark."""
    monkeypatch.setitem(TASKS, "digit", Task("digit", 32, 0, 8, length=16))
    monkeypatch.setitem(TASKS, "max", Task("max", 64, 0, 16, length=16))
    monkeypatch.setattr("linvit.reproduce.plan.FAMILY_4L", ["vit_4l_patch16_224", "linear_infvit_4l_patch16_224"])


TINY = Recipe(
    tasks=("digit", "max"),
    seeds=(0, 1),
    epochs=2,
    batch=8,
    lr=1e-3,
    lr_sweep=(2e-3,),
    width=32,
    heads=2,
    depth=1,
    explain_images=4,
    spectral_images=2,
    erf_images=2,
    family_res=(32, 64),
    wf_res=(32, 64),
    bench_iters=1,
)


def test_reproduce_end_to_end_writes_the_report_and_reuses_everything(tmp_path, tiny_tasks):
    args = ReproduceConfig(quick=False, device="cpu", output=str(tmp_path / "out"))
    report = run_reproduce(args, execute=run_command, recipe=TINY)
    out = tmp_path / "out"
    for name in ("report.md", "report.json", "commands.sh", "curves.png", "maps.png", "deletion.png", "erf.png"):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "report.json").read_text())
    assert data["stages_missing"] == []
    for task in TINY.tasks:
        assert set(data["runs"][task]) == set(FAMILIES)
        for family, entry in data["runs"][task].items():
            assert set(entry["seeds"]) == {"0", "1"}  # per-seed values, keyed by seed
            test = entry["summary"]["test"]
            assert test["values"] == [entry["seeds"][s]["test"] for s in ("0", "1")]
            assert test["low"] <= test["mean"] <= test["high"] and test["seeds"] == [0, 1]
            assert len(entry["seeds"]["0"]["val_curve"]) == TINY.epochs
            assert ("test" in entry["vs_baseline"]) == (family != "softmax")
    assert set(data["lr_sweep"]["softmax"]["val"]) == {"0.001", "0.002"}
    assert data["macs_224"]["weightformer_small_patch16_224"] == pytest.approx(4.43, abs=0.01)
    md = (out / "report.md").read_text()
    for title in ("## Infinite Self-Attention", "## WeightFormer", "## Beyond the papers", "task `max`"):
        assert title in md
    rows = [row for rows in report["claims"].values() for row in rows]
    assert all(row["verdict"] in VERDICTS for row in rows)
    assert all(row["command"].startswith("linvit ") for row in rows)
    assert all(f"`{row['command']}`" in md for row in rows)
    # a second run with the same --out reuses every stage
    again = run_reproduce(args, execute=run_command, recipe=TINY)
    assert all(t["reused"] for t in again["stages"].values())
    assert again["seconds_this_run"] == 0


def test_a_run_stopped_part_way_reports_what_it_has(tmp_path, tiny_tasks):
    out = tmp_path / "out"
    stages = build_plan(str(out), "full", "cpu", TINY)
    first_seed = [s for s in stages if s.name.startswith("data/") or s.info.get("seed") == 0 and "lr" not in s.name]
    run_stages(out, [s for s in first_seed if s.info.get("task", "digit") == "digit"], run_command)
    args = ReproduceConfig(quick=False, device="cpu", output=str(out), report_only=True)
    report = run_reproduce(args, execute=None, recipe=TINY)
    assert set(report["runs"]) == {"digit"} and set(report["runs"]["digit"]["softmax"]["seeds"]) == {0}
    assert "train/max/softmax/s0" in report["stages_missing"] and "bench/family4l" in report["stages_missing"]
    assert {row["verdict"] for row in report["claims"]["Infinite Self-Attention"]} == {"inconclusive"}
    assert "## Not run yet" in (out / "report.md").read_text()
    assert report["seconds_all_stages"] > 0 and report["seconds_this_run"] == 0  # the finished stages' own times


def _synthetic_report(linear_test: list[float]) -> dict:
    """runs of softmax (80, 81, 79) and linear on three seeds, as collect() leaves them."""
    from linvit.reproduce.collect import summarise

    def seeds(values):
        return {s: {"test": v, "plateau": True} for s, v in enumerate(values)}

    runs = {"digit": {"softmax": {"seeds": seeds([80, 81, 79])}, "linear": {"seeds": seeds(linear_test)}}}
    summarise(runs)
    return {"runs": runs, "recipe": {"tasks": ["digit"]}, "commands": {"eval/digit/linear/s0/test": "linvit eval"}}


@pytest.mark.parametrize(
    "linear, expected",
    [([83, 84, 82], "holds"), ([78, 79, 77], "does not hold"), ([81, 80, 80], "inconclusive")],
)
def test_a_claims_verdict_is_computed_from_the_paired_interval(linear, expected):
    from linvit.reproduce.claims import Claims

    row = Claims(_synthetic_report(linear)).beats("digit", "linear", "test", "Linear beats softmax", "84.7 vs 81.5")
    assert row["verdict"] == expected
    assert row["command"] == "linvit eval"
    assert "difference" in row["ours"] and "3 seed(s)" in row["ours"]


def test_generated_docs_sections_replace_only_their_own_markers(tmp_path):
    """The results tables in hand-written pages are rewritten between their markers, nothing else; a page
    that lost its markers stops the publishing script instead of being left stale."""
    from linvit.reproduce.report import replace_between

    page = tmp_path / "results.md"
    page.write_text("intro\n<!-- a:begin -->\nold a\n<!-- a:end -->\nmiddle\n<!-- b:begin -->\nold b\n<!-- b:end -->\n")
    replace_between(page, "<!-- a:begin -->", "<!-- a:end -->", "<!-- a:begin -->\nnew a\n<!-- a:end -->")
    assert page.read_text() == (
        "intro\n<!-- a:begin -->\nnew a\n<!-- a:end -->\nmiddle\n<!-- b:begin -->\nold b\n<!-- b:end -->\n"
    )
    with pytest.raises(SystemExit, match="no <!-- c:begin -->"):
        replace_between(page, "<!-- c:begin -->", "<!-- c:end -->", "x")


def test_the_quick_runs_time_is_one_number_everywhere():
    """Issue 39 item 15: README, --help and the progress bar's first estimate all say the minutes that
    docs/report-quick.md measured (they said 11, 14 and 17)."""
    from pathlib import Path

    from linvit_cli import build_parser

    root = Path(__file__).parents[1]
    measured = json.loads((root / "docs/report-quick/report.json").read_text())["seconds_all_stages"] / 60
    minutes = round(measured)
    readme = " ".join((root / "README.md").read_text().split())
    assert f"about {minutes} minutes on 2 CPU cores" in readme
    reproduce = build_parser().commands[("reproduce",)]
    quick = next(a for a in reproduce._actions if "--quick" in a.option_strings)
    assert f"about {minutes} minutes on 2 CPU cores" in quick.help
    assert round(sum(s.est_s for s in build_plan("o", "quick", "cpu")) / 60) == minutes
