"""The GPU evidence in one short device call (issue 37): ``python scripts/gpu_plan.py run|table`` (gpu_bench.sh).

GPU time comes in windows of a few minutes, so the plan runs the most important rows first and stops at a wall-time
budget (7 minutes from a cold machine): one worker process per model family (imports and CUDA init once), each point
isolated inside it (out-of-memory caught, the cache emptied and the peak reset, a time cap), compiled points sharing
one inductor cache, and every row appended to a JSONL file and flushed the moment it is measured, so a call cut short
keeps what it measured and the next call resumes from it. ``--dry-run`` runs the same plan at tiny sizes on the CPU.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .report import markdown_table
from .suites import FOUR_LAYER_GPU, GPU_SETTINGS, SUITES

HEADLINE_4L = FOUR_LAYER_GPU  # Linear, Katz, fused and naive softmax ViT-4L: the tables' own models
WF_PAIR = SUITES["gpu_weightformer"]["models"]  # WeightFormer-T and DeiT-T
COMPILES = ("off", "reduce-overhead")  # eager and CUDA graphs (max-autotune's tuning would not fit a call)
REST_SUITES = ("gpu_family4l", "gpu_weightformer", "gpu_generate")  # today's tables, after the headline rows
FAMILY = {"family4l": "gpu_family4l", "weightformer": "gpu_weightformer"}  # headline group -> its table
FAMILY_OF = {  # group -> its worker process
    "family4l": "4l",
    "gpu_family4l": "4l",
    "weightformer": "wf",
    "gpu_weightformer": "wf",
    "gpu_generate": "dit",
}
# a worker process: serve(family, device, jsonl, born) from its command line (no parser in the library)
WORKER = "import sys, pathlib, linvit.bench.gpu_plan as g; "
WORKER += "sys.exit(g.serve(sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), float(sys.argv[4])))"
DONE = "@@gpu_plan-done"  # a worker's answer to a job, on stdout after its progress lines
REFERENCES = {suite: SUITES[suite]["reference"] for suite in REST_SUITES}
RECORDED = Path("docs/bench/gpu_h200/plan")  # the committed GPU rows (scripts/gpu_bench.sh resumes from them)
DRY_REFERENCE = Path("docs/bench/gpu_dry_run/points.jsonl")  # a committed CPU dry run: the estimate's fallback
BUDGET_S = 400.0  # 6 min 40 s of points and tests: the call ends inside 7 minutes with start-up and tables
TESTS = ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda", "tests/test_katz_amp.py"]
TESTS_CAP_S = 90.0
POINT_CAP_S = {"off": 45.0, "compiled": 90.0}  # per point on the GPU; a dry-run point gets 20 s
EXIT_RESTART = 3  # a worker asking for a fresh process (after a time-capped point: CUDA state unknown)
# the estimate without GPU history: a dry-run point's seconds (model build, graph capture, one step) scaled to a
# full-size model on the H200, plus what only the GPU run does (see estimate())
DRY_SCALE = 3.7  # today's one-process-per-point plan: 644 s as a CPU dry run, ~40 min on the H200 (issue 37)
GPU_COMPILE_S = 20.0  # one cold inductor compile + CUDA-graph capture of a full-size model (10-30 s, issue 37)
GPU_WORKER_S = 10.0  # a worker's imports and CUDA init
BEGIN, END = "<!-- gpu-plan:begin -->", "<!-- gpu-plan:end -->"


@dataclass
class Group:
    """One worker process: a model family's points, in the order they run."""

    name: str
    points: list[dict] = field(default_factory=list)


def point_key(task: str, model: str, res: int, batch: int, compile_mode: str) -> str:
    """A point's identity across runs (the GPU sizes, also in a dry run)."""
    return f"{task}:{model}@{res}/b{batch}/{compile_mode}"


def _point(group: str, model: str, res: int, batch: int, compile_mode: str, task: str = "classify") -> dict:
    settings = {k: GPU_SETTINGS[k] for k in ("device", "dtype", "iters", "warmup")}
    return dict(
        settings,
        key=point_key(task, model, res, batch, compile_mode),
        group=group,
        model=model,
        res=res,
        plan_res=res,
        batch=batch,
        compile=compile_mode,
        task=task,
        mode="infer",
        min_time_s=GPU_SETTINGS["min_time"],
        mem_limit_gb=GPU_SETTINGS["mem_limit"],
    )


def plan(dry_run: bool = False) -> list[Group]:
    """The headline groups (4-layer family at 1024/2048/4096, WeightFormer-T vs DeiT-T at 1248), then the rest of
    today's GPU suites; resolution-major, so a call cut short still has whole comparisons at the smaller sizes."""
    head = Group(
        "family4l", [_point("family4l", m, r, 1, c) for r in (1024, 2048, 4096) for m in HEADLINE_4L for c in COMPILES]
    )
    wf = Group(
        "weightformer", [_point("weightformer", m, 1248, b, c) for b in (1, 32) for m in WF_PAIR for c in COMPILES]
    )
    groups, seen = [head, wf], {p["key"] for p in head.points + wf.points}
    for suite in REST_SUITES:
        s, rest = SUITES[suite], Group(suite)
        task = s.get("task", "classify")
        for m in s["models"]:
            for c in s["compile"]:
                for b in s["batch"]:
                    for r in s["res"]:
                        if point_key(task, m, r, b, c) not in seen:
                            rest.points.append(_point(suite, m, r, b, c, task))
        groups.append(rest)
    if dry_run:
        groups = [Group(g.name, [dry(p) for p in g.points]) for g in groups]
    return groups


def dry(point: dict) -> dict:
    """The same point, tiny, on the CPU: one size per task (64 px, depth 1; DiT-tiny on 8 x 8 latents), batch <= 2,
    one step, FLOPs counted in the headline groups only, compiled points traced by dynamo's eager backend (graph
    capture without code generation) and, at one size, traced once per model and batch: under a minute on 2 cores."""
    if point["task"] == "generate":
        res, kwargs = 8, {"size": "tiny", "depth": 1}
    else:
        res = 64
        kwargs = {"depth": 1, "embed_dim": 64, "num_heads": 2} if "_4l_" in point["model"] else {"depth": 1}
    return dict(
        point,
        res=res,
        batch=min(point["batch"], 2),
        device="cpu",
        iters=1,
        warmup=int(point["group"] in FAMILY),
        min_time_s=0.0,
        mem_limit_gb=None,
        model_kwargs=kwargs,
        compile_backend="eager",
    )


# --- rows: appended and flushed one at a time, read back whatever was cut off ---


def append_row(path: Path, row: dict) -> None:
    """One JSON line, written in one call and synced to disk before the next point starts."""
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> tuple[list[dict], int]:
    """Every readable row of a JSONL file and the number of unreadable lines (a half-written last line)."""
    if not path.exists():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def points_of(rows: list[dict]) -> dict[str, dict]:
    """The last row per point key (a resumed or repeated point keeps its newest measurement)."""
    return {r["key"]: r for r in rows if r.get("kind") == "point" and "key" in r}


def settled(rows: list[dict], started: float) -> dict[str, dict]:
    """The points a call that started at ``started`` does not measure again: every recorded point except one whose
    only error came in an earlier call (retried once: a fix or a fresh machine may have cured it)."""
    errors = Counter(r["key"] for r in rows if r.get("kind") == "point" and r.get("status") == "error")
    return {
        key: row
        for key, row in points_of(rows).items()
        if not (row.get("status") == "error" and errors[key] == 1 and row.get("finished", 0.0) < started)
    }


# --- the estimate, printed before anything runs ---


@dataclass
class Estimate:
    per_point: dict[str, float]
    worker_s: float
    tests_s: float
    source: str

    def total(self, groups: list[Group]) -> float:
        points = sum(self.per_point[p["key"]] for g in groups for p in g.points)
        return points + self.worker_s * len({FAMILY_OF[g.name] for g in groups if g.points}) + self.tests_s


def estimate_line(est: Estimate, todo: list[Group]) -> str:
    """The estimate as the plan prints it before it starts: total, then headline, tests and the rest."""
    head_s, rest_s = est.total(todo[:2]) - est.tests_s, est.total(todo[2:]) - est.tests_s
    return (f"estimated device time: {est.total(todo) / 60:.1f} min = headline {head_s:.0f} s + tests "
            f"{est.tests_s:.0f} s + rest {rest_s:.0f} s; per point from {est.source}")  # fmt: skip


def estimate(groups: list[Group], history: list[dict], reference: list[dict], dry_run: bool) -> Estimate:
    """Seconds per point: the last measured wall time of that point on this kind of device (any earlier JSONL in
    the output folder), else the committed CPU dry run's, scaled to the GPU: x DRY_SCALE (model build and graph
    capture of full-size models, the ratio of today's plan's GPU time to its dry run) + min_time (the GPU times each
    point >= 1 s for NVML) + GPU_COMPILE_S per compiled point (a dry run traces without generating code)."""
    device = "cpu" if dry_run else "cuda"
    measured = points_of([r for r in history if r.get("device") == device])
    dry_rows = points_of([r for r in reference if r.get("device") == "cpu"])
    per_point, used = {}, {"measured": 0, "dry run": 0, "default": 0}
    for p in (p for g in groups for p in g.points):
        compiled = p["compile"] != "off"
        if p["key"] in measured and measured[p["key"]].get("wall_s") is not None:
            per_point[p["key"]], kind = measured[p["key"]]["wall_s"], "measured"
        elif p["key"] in dry_rows and dry_rows[p["key"]].get("wall_s") is not None:
            base = dry_rows[p["key"]]["wall_s"]
            per_point[p["key"]] = base if dry_run else DRY_SCALE * base + p["min_time_s"] + GPU_COMPILE_S * compiled
            kind = "dry run"
        else:
            per_point[p["key"]] = (0.5 + 0.5 * compiled) if dry_run else 3.0 + GPU_COMPILE_S * compiled
            kind = "default"
        used[kind] += 1
    workers = [r["startup_s"] for r in history if r.get("kind") == "worker" and r.get("device") == device]
    tests = [r["wall_s"] for r in history if r.get("kind") == "tests" and r.get("device") == device]
    worker_s = statistics.median(workers) if workers else (3.0 if dry_run else GPU_WORKER_S)
    tests_s = min(TESTS_CAP_S, tests[-1]) if tests else (10.0 if dry_run else TESTS_CAP_S)
    source = ", ".join(f"{n} {k}" for k, n in used.items() if n)
    if used["dry run"] and not dry_run:
        source += (
            f" (dry-run seconds x {DRY_SCALE} + {GPU_SETTINGS['min_time']:g} s timed per point + {GPU_COMPILE_S:g} s "
            f"per compiled point: x {DRY_SCALE} is today's per-process plan's ~40 min on the H200 over its 644 s "
            "CPU dry run, the same Python work on full-size models; the dry run times one step, the GPU >= 1 s for "
            "NVML; and it traces compiled points without generating code, a cold inductor compile with CUDA-graph "
            "capture takes 10-30 s)"
        )
    return Estimate(per_point, worker_s, tests_s, source)


# --- the worker: one process per group, each point isolated inside it ---


class PointTimeout(Exception):
    """A point ran past its time cap."""


@contextmanager
def time_cap(seconds: float):
    """Raise PointTimeout in this (main) thread after ``seconds``; a long kernel is interrupted when it returns."""

    def _raise(signum, frame):
        raise PointTimeout(f"exceeded the point's {seconds:.0f} s cap")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _release(compiled: bool, failed: bool) -> None:
    """Free what a point left on the GPU: its compiled graphs and their CUDA-graph pools, reference cycles (a
    failure's traceback, or anything still allocated), cached blocks, the peak. A CPU point needs none of it: there
    the dry run keeps dynamo's traces, so a plan's compiled points at one size are traced once per model."""
    import torch

    if not torch.cuda.is_available():
        if failed:
            gc.collect()
        return
    if compiled:
        torch._dynamo.reset()
    if failed or torch.cuda.memory_allocated():
        gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def measure_isolated(spec: dict, cap: float) -> dict:
    """spec's record (point.measure) with its status on failure (oom, timeout, error) and its wall time."""
    from .point import classify_error, error_reason, measure

    start, record = time.perf_counter(), {"status": "error"}
    try:
        with time_cap(cap):
            record = measure(spec)
    except PointTimeout as err:
        record = {"status": "timeout", "reason": str(err)}
    except Exception as err:  # noqa: BLE001 - every failure becomes this point's status
        record = {"status": classify_error(err), "reason": error_reason(err)}
    finally:
        _release(spec["compile"] != "off", record["status"] != "ok")
    return {**spec, **record, "kind": "point", "wall_s": time.perf_counter() - start}


def _progress(i: int, n: int, row: dict) -> str:
    what = f"[{row['group']} {i}/{n}] {row['model']} @{row['res']} b{row['batch']} {row['compile']}"
    if row["status"] != "ok":
        return f"{what}: {row['status']} ({row.get('reason')}) [{row['wall_s']:.1f} s]"
    compile_s = f", compile {row['compile_s']:.1f} s" if row.get("compile_s") else ""
    latency = f"{row['latency_ms']:.2f} ms (IQR {row['latency_iqr_ms']:.2f})"
    return f"{what}: {latency}, {row['peak_mem_mb']:.0f} MB{compile_s} [{row['wall_s']:.1f} s]"


def _setup_worker(device: str) -> None:
    """Imports and CUDA init, once per family; no dynamo recompile limit (a silent eager fallback)."""
    import torch

    import linvit  # noqa: F401  (registers the models)

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 512))
    if device == "cuda":
        torch.zeros(1, device="cuda")  # the context


def work(points: list[dict], jsonl: Path, deadline: float) -> int:
    """Measure points in order until done or out of time; EXIT_RESTART after a timeout (CUDA state unknown)."""
    oomed = set()
    for i, spec in enumerate(points, 1):
        left = deadline - time.time()
        if left < spec.get("est_s", 0.0):
            print(f"[{spec['group']}] budget reached: {len(points) - i + 1} points left for a later call", flush=True)
            return 0
        eager_key = point_key(spec["task"], spec["model"], spec["plan_res"], spec["batch"], "off")
        if spec["compile"] != "off" and eager_key in oomed:  # no graph fits where the eager model did not
            row = {**spec, "kind": "point", "status": "skipped", "reason": "out of memory eagerly", "wall_s": 0.0}
        else:
            cap = POINT_CAP_S["off" if spec["compile"] == "off" else "compiled"] if spec["device"] == "cuda" else 20.0
            row = measure_isolated(spec, min(cap, left))
        if row["status"] == "oom" and spec["compile"] == "off":
            oomed.add(spec["key"])
        append_row(jsonl, {**row, "finished": time.time()})
        print(_progress(i, len(points), row), flush=True)
        if row["status"] == "timeout":
            return EXIT_RESTART
    return 0


def serve(family: str, device: str, jsonl: Path, born: float) -> int:
    """A family's worker: set up once, then run each job (a JSON line on stdin) and answer DONE <code>."""
    _setup_worker(device)
    append_row(jsonl, {"kind": "worker", "family": family, "device": device, "startup_s": time.time() - born})
    for line in sys.stdin:
        job = json.loads(line)
        code = work(job["points"], jsonl, job["deadline"])
        print(f"{DONE} {code}", flush=True)
        if code:
            return code
    return 0


# --- the parent: estimate, workers, tests, tables ---


def _env(out: Path) -> dict:
    """One inductor cache for every worker and the tests (FX graphs and kernels reused across processes and calls)."""
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path("runs/inductor_cache").resolve()))
    env.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Workers:
    """One long-lived process per model family, so a family's headline and remaining points share its start-up."""

    def __init__(self, out: Path, jsonl: Path) -> None:
        self.out, self.jsonl, self.procs = out, jsonl, {}
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def _spawn(self, family: str, device: str) -> subprocess.Popen:
        cmd = [sys.executable, "-c", WORKER, family, device, str(self.jsonl), f"{time.time()}"]
        log = open(self.out / "logs" / f"{family}.log", "a")  # noqa: SIM115 - the worker's stderr while it lives
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=_env(self.out))
        log.close()
        return proc

    def run(self, family: str, points: list[dict], deadline: float) -> int | None:
        """The job's exit code (0 done or out of budget, EXIT_RESTART), or None when the worker died or hung."""
        proc = self.procs.get(family)
        if proc is None or proc.poll() is not None:
            proc = self.procs[family] = self._spawn(family, points[0]["device"])
        proc.stdin.write((json.dumps({"points": points, "deadline": deadline}) + "\n").encode())
        proc.stdin.flush()
        for line in _lines(proc, deadline + 20):
            if line.startswith(DONE):
                code = int(line.split()[1])
                if code:
                    self.stop(family)
                return code
            print(line, flush=True)
        self.stop(family)
        return None

    def stop(self, family: str) -> None:
        proc = self.procs.pop(family, None)
        if proc is None:
            return
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        for family in list(self.procs):
            self.stop(family)


def _lines(proc: subprocess.Popen, until: float):
    """The worker's stdout line by line until EOF or the time ``until`` (select on the raw pipe: no buffered lines
    hidden from it)."""
    fd, buf = proc.stdout.fileno(), b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode(errors="replace")
        ready, _, _ = select.select([fd], [], [], max(0.0, until - time.time()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            return
        buf += chunk


def run_group(
    group: Group, workers: Workers, jsonl: Path, deadline: float, est: Estimate, started: float = 0.0
) -> None:
    """A group's pending points (settled() since ``started``) in its family's worker; a point that kills the worker
    gets an error row and a fresh worker goes on from the next one."""
    family = FAMILY_OF[group.name]
    while True:
        done = settled(read_rows(jsonl)[0], started)
        pending = [dict(p, est_s=est.per_point[p["key"]]) for p in group.points if p["key"] not in done]
        if not pending or time.time() + pending[0]["est_s"] > deadline:
            return
        code = workers.run(family, pending, deadline)
        if code in (0, EXIT_RESTART):
            if code == 0:
                return
            continue
        if time.time() > deadline:
            return
        crashed = next(p for p in pending if p["key"] not in settled(read_rows(jsonl)[0], started))
        reason = f"the worker died (see logs/{family}.log)"
        row = {**crashed, "kind": "point", "status": "error", "reason": reason, "wall_s": None, "finished": time.time()}
        append_row(jsonl, row)


def run_tests(out: Path, jsonl: Path, deadline: float, device: str) -> None:
    """The CUDA-only tests (Katz-InfSA's half products with float32 sums, eager and compiled), capped."""
    cap = max(1.0, min(TESTS_CAP_S, deadline - time.time()))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *TESTS], capture_output=True, text=True, timeout=cap, env=_env(out))
        text, status = proc.stdout + proc.stderr, "passed" if proc.returncode == 0 else f"failed ({proc.returncode})"
    except subprocess.TimeoutExpired as err:
        text, status = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or ""), "timeout"
    (out / "cuda_tests.txt").write_text(text)
    summary = (text.strip().splitlines() or [""])[-1]
    wall = time.perf_counter() - start
    append_row(jsonl, {"kind": "tests", "device": device, "status": status, "summary": summary, "wall_s": wall})
    print(f"[tests] python {' '.join(TESTS)}: {status}: {summary} [{wall:.1f} s]", flush=True)


def _device_name(dry_run: bool) -> str:
    if dry_run:
        return f"CPU ({os.cpu_count()} cores), dry run"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"


def run(out: Path, dry_run: bool, budget_s: float, fresh: bool, reference: Path, tests: bool = True) -> int:
    """The whole plan: estimate, headline groups, the CUDA tests, the rest as time allows, then the tables."""
    start = time.time()
    deadline = start + budget_s
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "points.jsonl"
    if fresh and jsonl.exists():  # kept beside for the next estimate
        jsonl.rename(out / f"points.{time.strftime('%Y%m%d-%H%M%S', time.localtime(jsonl.stat().st_mtime))}.jsonl")
    history = [r for f in sorted(out.glob("points*.jsonl")) for r in read_rows(f)[0]]
    groups = plan(dry_run)
    if not dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_plan: torch sees no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
            return 2
    est = estimate(groups, history, read_rows(reference)[0], dry_run)
    done = settled(read_rows(jsonl)[0], start)
    todo = [Group(g.name, [p for p in g.points if p["key"] not in done]) for g in groups]
    n_all, n_todo = sum(len(g.points) for g in groups), sum(len(g.points) for g in todo)
    print(f"GPU plan{' (dry run on the CPU)' if dry_run else ''}: {n_all} points in {len(groups)} worker processes; "
          f"{n_all - n_todo} already in {jsonl}, {n_todo} to measure, budget {budget_s:.0f} s")  # fmt: skip
    print(estimate_line(est, todo))
    if est.total(todo) > budget_s:
        print(f"  over the budget: the points past {budget_s:.0f} s are left for a later call (it resumes)")
    run_row = {"kind": "run", "device": "cpu" if dry_run else "cuda", "device_name": _device_name(dry_run)}
    run_row.update(started=start, estimate_s=est.total(todo), budget_s=budget_s, command=" ".join(sys.argv))
    append_row(jsonl, run_row)
    reserve, workers = (est.tests_s if tests else 0.0), Workers(out, jsonl)
    try:
        for g in todo[:2]:
            run_group(g, workers, jsonl, deadline - reserve, est, start)
        if tests:
            run_tests(out, jsonl, deadline, run_row["device"])
        for g in todo[2:]:
            run_group(g, workers, jsonl, deadline, est, start)
            if FAMILY_OF[g.name] != "dit":
                workers.stop(FAMILY_OF[g.name])  # its family is done: free its GPU memory for the next
    finally:
        workers.close()
    rows, bad = read_rows(jsonl)
    (out / "tables.md").write_text(tables(rows, dry_run) + "\n")
    measured = len(points_of(rows))
    print(f"done in {time.time() - start:.0f} s: {measured} of {n_all} points in {jsonl} ({bad} unreadable lines); "
          f"tables in {out / 'tables.md'}")  # fmt: skip
    return 0


# --- tables: from whatever rows were recorded, the missing points marked pending ---


def _family_records(groups: list[Group], points: dict[str, dict], suite: str) -> list[dict]:
    names = [g for g, s in FAMILY.items() if s == suite] + [suite]
    planned = [p for g in groups if g.name in names for p in g.points]
    return [points.get(p["key"]) or {**p, "status": "pending", "reason": "not measured yet"} for p in planned]


def _ratio(points: dict[str, dict], key: str, ref_key: str) -> float | None:
    a, b = points.get(key), points.get(ref_key)
    if not a or not b or a.get("status") != "ok" or b.get("status") != "ok":
        return None
    return b["latency_ms"] / a["latency_ms"]


def goals(points: dict[str, dict]) -> list[str]:
    """Issue 37's targets against the recorded rows: met, missed or pending."""
    c, lines = "reduce-overhead", []
    vit = point_key("classify", "vit_4l_patch16_224", 1024, 1, c)
    targets = [
        (f"`{m}` vs fused softmax, compiled, 1024 px, batch 1", point_key("classify", m, 1024, 1, c), vit, 1.8)
        for m in HEADLINE_4L[:2]
    ]
    for b, target in ((1, 1.5), (32, 3.5)):
        wf, deit = (point_key("classify", m, 1248, b, c) for m in WF_PAIR)
        targets.append((f"WeightFormer-T vs DeiT-T, compiled, 1248 px, batch {b}", wf, deit, target))
    for what, key, ref, target in targets:
        r = _ratio(points, key, ref)
        verdict = "pending" if r is None else f"{r:.2f}x: {'met' if r >= target else 'missed'}"
        lines.append(f"- {what} (target >= {target}x): {verdict}")
    return lines


def tables(rows: list[dict], dry_run: bool | None = None) -> str:
    """The GPU section's body: the machine, the targets, one table per family (pending points included)."""
    runs = [r for r in rows if r.get("kind") == "run"]
    dry_run = dry_run if dry_run is not None else bool(runs and runs[-1].get("device") == "cpu")
    groups, points = plan(dry_run), points_of(rows)
    machine = "; ".join(dict.fromkeys(r.get("device_name", "?") for r in runs)) or "unknown"
    n_all = sum(len(g.points) for g in groups)
    lines = [f"Measured {len(points)} of {n_all} planned points on {machine} (bf16 autocast, CUDA-event latency, "
             "median and IQR; peak = max allocated above the model and input; J/img from NVML where it updated).",
             "", *goals(points)]  # fmt: skip
    if dry_run:
        lines.insert(1, "\nA CPU dry run at tiny sizes: it checks the plan, its numbers are not GPU evidence.")
    test_rows = [r for r in rows if r.get("kind") == "tests"]
    if test_rows:
        lines += ["", f"CUDA-only tests (`python {' '.join(TESTS)}`): {test_rows[-1]['status']}, "
                  f"{test_rows[-1].get('summary', '')}"]  # fmt: skip
    for suite in REST_SUITES:
        lines += ["", f"`{suite}`:", "", markdown_table(_family_records(groups, points, suite), REFERENCES[suite])]
    return "\n".join(lines)


def section(jsonl: Path) -> str:
    """docs/benchmarks.md's GPU section between its markers: the tables when rows exist, else the pending line."""
    rows, bad = read_rows(jsonl)
    body = (
        tables(rows) + (f"\n\n({bad} unreadable line(s) skipped: a call cut short mid-write.)" if bad else "")
        if points_of(rows)
        else "Pending: no GPU run of the plan is recorded yet. On a GPU machine: `bash scripts/gpu_bench.sh` "
        f"(one call, <= 7 minutes from a cold machine; rows land in `{RECORDED}/points.jsonl` as they are measured, "
        "and `bash scripts/gpu_bench.sh --table` regenerates this section from them). With no GPU history the plan "
        f"has {sum(len(g.points) for g in plan())} points and prints: {_first_estimate()}."
    )
    return f"{BEGIN}\n{body}\n{END}"


def _first_estimate() -> str:
    """What a first GPU call prints as its estimate: no GPU history, the committed dry run scaled."""
    groups = plan()
    return estimate_line(estimate(groups, [], read_rows(DRY_REFERENCE)[0], dry_run=False), groups)
