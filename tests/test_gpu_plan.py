"""The GPU plan (issue 37) without a GPU: its order, its CPU dry run writing each row as it is measured, and tables
from a JSONL cut short (scripts/gpu_bench.sh --dry-run, as CI runs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from linvit.bench import gpu_plan
from linvit.bench.gpu_plan import plan, point_key, read_rows, section

ROOT = Path(__file__).resolve().parents[1]


def _keys(groups) -> list[str]:
    return [p["key"] for g in groups for p in g.points]


def test_plan_puts_the_headline_rows_first_in_the_issues_order():
    groups = plan()
    four = ["linear_infvit_4l_patch16_224", "katz_infvit_4l_patch16_224", "vit_4l_patch16_224"]
    compiles, pair = ("off", "reduce-overhead"), ("weightformer_tiny_patch16_224", "deit_tiny_patch16_224")
    models = [*four, "vit_4l_patch16_224:naive"]
    head = [point_key("classify", m, r, 1, c) for r in (1024, 2048, 4096) for m in models for c in compiles]
    wf = [point_key("classify", m, 1248, b, c) for b in (1, 32) for m in pair for c in compiles]
    keys = _keys(groups)
    assert keys[: len(head) + len(wf)] == head + wf
    assert len(keys) == len(set(keys)) == 132  # the rest of today's gpu_* tables, nothing measured twice
    assert {p["compile"] for g in groups for p in g.points} == {"off", "reduce-overhead"}  # no max-autotune
    assert all(p["device"] == "cuda" and p["dtype"] == "bf16" for g in groups for p in g.points)
    assert _keys(plan(dry_run=True)) == keys  # the dry run is the same plan


def test_dry_run_writes_each_row_as_it_is_measured_in_plan_order(tmp_path):
    env = {**os.environ, "OUT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    proc = subprocess.Popen(["bash", "scripts/gpu_bench.sh", "--dry-run"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    jsonl, seen_running = tmp_path / "points.jsonl", None
    start = time.time()
    while proc.poll() is None and time.time() - start < 120:
        points = [r for r in read_rows(jsonl)[0] if r.get("kind") == "point"]
        if points:
            seen_running = len(points)  # a measured row is on disk while the plan still runs
            break
        time.sleep(0.1)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out[-3000:]
    assert seen_running and seen_running < 132
    assert out.index("estimated device time") < out.index("[family4l 1/24]")  # printed before anything runs
    rows, bad = read_rows(jsonl)
    assert bad == 0
    points = [r for r in rows if r.get("kind") == "point"]
    assert [r["key"] for r in points] == _keys(plan(dry_run=True))
    assert {r["status"] for r in points} == {"ok"}
    assert all(a["finished"] <= b["finished"] for a, b in zip(points, points[1:], strict=False))
    kinds = [r["kind"] for r in rows]
    tests_at = kinds.index("tests")  # the CUDA-only tests run after the headline rows, before the rest
    assert [r["group"] for r in rows[:tests_at] if r["kind"] == "point"] == ["family4l"] * 24 + ["weightformer"] * 8
    assert sum(k == "worker" for k in kinds) == 3  # one process per family
    assert rows[tests_at]["status"] == "passed"
    # the next call's estimate comes from these per-point times
    assert (
        "132 measured"
        in subprocess.run(
            [sys.executable, "-c", _ESTIMATE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    )
    # a JSONL cut short (after k rows, inside the next line) still gives the tables, the rest pending
    lines = jsonl.read_text().splitlines(keepends=True)
    cut = _after_points(lines, 5)
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(lines[:cut]) + lines[cut][: len(lines[cut]) // 2])
    rows, bad = read_rows(partial)
    assert bad == 1 and sum(r.get("kind") == "point" for r in rows) == 5
    text = section(partial)
    assert text.startswith(gpu_plan.BEGIN) and text.endswith(gpu_plan.END)
    assert "Measured 5 of 132" in text and text.count("| pending: not measured yet |") == 127
    assert "1 unreadable line(s) skipped" in text


def _after_points(lines: list[str], k: int) -> int:
    """The index of the line after the k-th point row."""
    seen = 0
    for i, line in enumerate(lines):
        seen += json.loads(line).get("kind") == "point"
        if seen == k:
            return i + 1
    raise AssertionError("fewer rows than asked")


_ESTIMATE = """import sys
from pathlib import Path
from linvit.bench.gpu_plan import estimate, plan, read_rows
print(estimate(plan(True), read_rows(Path(sys.argv[1]) / "points.jsonl")[0], [], True).source)
"""


def test_estimate_scales_the_dry_run_without_gpu_history():
    groups = plan()
    dry_rows = [
        {"kind": "point", "key": p["key"], "device": "cpu", "wall_s": 0.5} for g in plan(True) for p in g.points
    ]
    est = estimate = gpu_plan.estimate(groups, [], dry_rows, dry_run=False)
    compiled = [p for g in groups for p in g.points if p["compile"] != "off"]
    eager = gpu_plan.DRY_SCALE * 0.5 + 1.0
    assert est.per_point[compiled[0]["key"]] == eager + gpu_plan.GPU_COMPILE_S
    assert f"x {gpu_plan.DRY_SCALE}" in est.source and "132 dry run" in est.source
    gpu_rows = [{"kind": "point", "key": compiled[0]["key"], "device": "cuda", "wall_s": 7.0}]
    estimate = gpu_plan.estimate(groups, gpu_rows, dry_rows, dry_run=False)
    assert estimate.per_point[compiled[0]["key"]] == 7.0 and "1 measured" in estimate.source


def test_pending_section_names_the_one_command(tmp_path):
    text = section(tmp_path / "absent.jsonl")
    assert "Pending" in text and "`bash scripts/gpu_bench.sh`" in text


def test_the_committed_gpu_section_is_what_the_table_command_writes():
    """docs/benchmarks.md's GPU section (its plan size and first estimate included) is generated, never typed."""
    root = Path(__file__).resolve().parents[1]
    assert section(root / gpu_plan.RECORDED / "points.jsonl") in (root / "docs" / "benchmarks.md").read_text()


class _FakeWorkers:
    """Workers whose 'process' writes each job's rows from a script (key -> status), as a real worker would."""

    def __init__(self, jsonl: Path, statuses: dict[str, str]) -> None:
        self.jsonl, self.statuses, self.jobs = jsonl, statuses, []

    def run(self, family: str, points: list[dict], deadline: float) -> int:
        self.jobs.append([p["key"] for p in points])
        for p in points:
            gpu_plan.append_row(self.jsonl, {**p, "kind": "point", "status": self.statuses[p["key"]],
                                             "finished": time.time()})  # fmt: skip
        return 0


def test_a_point_that_errored_in_an_earlier_call_is_retried_once(tmp_path):
    group = plan()[0]
    a, b, c, d = (p["key"] for p in group.points[:4])
    group = gpu_plan.Group(group.name, group.points[:4])
    jsonl, earlier = tmp_path / "points.jsonl", time.time() - 100
    for key, status in ((a, "error"), (b, "ok"), (c, "error"), (c, "error")):
        gpu_plan.append_row(jsonl, {"kind": "point", "key": key, "status": status, "finished": earlier})
    est = gpu_plan.Estimate({p["key"]: 0.0 for p in group.points}, 0.0, 0.0, "test")
    workers = _FakeWorkers(jsonl, {a: "error", d: "ok"})
    started = time.time()
    gpu_plan.run_group(group, workers, jsonl, started + 60, est, started)
    assert workers.jobs == [[a, d]]  # a's one earlier error retried; c failed twice already; the error in this call
    gpu_plan.run_group(group, workers, jsonl, time.time() + 60, est, time.time())  # ... is a's second: settled
    assert workers.jobs == [[a, d]]
    assert set(gpu_plan.settled(read_rows(jsonl)[0], time.time())) == {a, b, c, d}


def test_an_error_row_names_where_it_was_raised():
    spec = gpu_plan.dry(dict(plan()[0].points[0], model="no_such_model_patch16_224"))
    row = gpu_plan.measure_isolated(spec, 60.0)
    assert row["status"] == "error"
    assert re.search(r"\(at \S+\.py:\d+", row["reason"]) and "linvit/" in row["reason"], row["reason"]
