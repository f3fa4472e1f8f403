"""The benchmark runner: record schema, failure statuses, exponent fit, variants, outputs."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import linvit  # noqa: F401
from linvit.bench import create_variant, fit_exponent, run_point, split_name, sweep, write_outputs
from linvit.cli import main as cli_main

TINY = dict(batch=1, mode="infer", device="cpu", dtype="fp32", warmup=1, iters=2)
OK_KEYS = {
    "model",
    "res",
    "tokens",
    "status",
    "latency_ms",
    "latency_iqr_ms",
    "images_per_s",
    "peak_mem_mb",
    "peak_total_mb",
    "gflops",
    "gflops_per_s",
    "energy_j_per_img",
    "energy_reason",
    "params",
}


@pytest.fixture(scope="module")
def two_points():
    return sweep(["linear_infvit_tiny_patch16_224"], [32, 64], dict(TINY, mode="train"), timeout=300, progress=False)


def test_point_record_schema(two_points):
    for record, res in zip(two_points, (32, 64), strict=True):
        assert record["status"] == "ok", record
        assert OK_KEYS <= record.keys()
        assert record["res"] == res and record["tokens"] == (res // 16) ** 2 and record["mode"] == "train"
        assert record["latency_ms"] > 0 and record["gflops"] > 0 and record["peak_total_mb"] > 0
        assert record["energy_j_per_img"] is None and "CUDA" in record["energy_reason"]
    assert two_points[1]["gflops"] > two_points[0]["gflops"]


def test_memory_limit_is_recorded_as_oom():
    record = run_point(dict(TINY, model="linear_infvit_tiny_patch16_224", res=32), timeout=300, mem_limit_gb=0.05)
    assert record["status"] == "oom" and "mem-limit" in record["reason"]


def test_timeout_is_recorded():
    record = run_point(dict(TINY, model="linear_infvit_tiny_patch16_224", res=32), timeout=0.2)
    assert record["status"] == "timeout" and "0.2" in record["reason"]


def test_crash_is_recorded_as_error_with_reason():
    record = run_point(dict(TINY, model="no_such_model_patch16_224", res=32), timeout=300)
    assert record["status"] == "error" and "no_such_model" in record["reason"]


def test_exponent_fit_on_synthetic_numbers():
    tokens = [196, 1024, 4096, 16384]
    assert fit_exponent(tokens, [3e-3 * t**1.0 for t in tokens]) == pytest.approx(1.0)
    assert fit_exponent(tokens, [1e-6 * t**2 + 0 for t in tokens]) == pytest.approx(2.0)
    assert fit_exponent([196], [1.0]) is None


def test_naive_and_fused_softmax_give_the_same_logits():
    fused = create_variant("vit_4l_patch16_224", num_classes=3, depth=1).eval()
    naive = create_variant("vit_4l_patch16_224:naive", num_classes=3, depth=1).eval()
    assert fused.blocks[0].attn.fused_attn and not naive.blocks[0].attn.fused_attn
    naive.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 64, 48)
    torch.testing.assert_close(naive(x), fused(x), rtol=1e-4, atol=1e-5)


def test_variants_validate():
    with pytest.raises(ValueError, match="unknown variant"):
        split_name("vit_4l_patch16_224:flash9")
    with pytest.raises(ValueError, match="LinearInfSAAttention"):
        create_variant("vit_4l_patch16_224:unfolded", depth=1)
    assert not create_variant("linear_infvit_tiny_patch16_224:unfolded").blocks[0].attn.fold_kv
    assert create_variant("deit_tiny_patch16_224", img_size=96).pos_embed.shape[1] == 1 + 36
    assert timm.create_model("infvit_tiny_patch16_224").blocks[0].attn.impl == "auto"
    assert create_variant("infvit_tiny_patch16_224:chunked").blocks[0].attn.impl == "chunked"


def test_outputs_written(tmp_path, two_points):
    failed = dict(TINY, model="vit_4l_patch16_224", res=64, status="oom", reason="x")
    slopes = write_outputs(two_points + [failed], tmp_path, references=["linear_infvit_tiny_patch16_224"])
    data = json.loads((tmp_path / "bench.json").read_text())
    assert len(data["points"]) == 3 and slopes["vit_4l_patch16_224"] is None
    assert (tmp_path / "scaling.png").stat().st_size > 1000
    assert "oom: x" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.csv").read_text().count("\n") == 4


def test_cli_bench_ladder_stops_at_the_memory_limit(tmp_path, capsys):
    code = cli_main(
        [
            "bench",
            "--models",
            "linear_infvit_tiny_patch16_224",
            "--res",
            "32",
            "--ladder",
            "--iters",
            "1",
            "--mem-limit",
            "0.05",
            "--output",
            str(tmp_path),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["ladder_max_res"] == {"linear_infvit_tiny_patch16_224": None}
    assert "largest resolution that ran" in capsys.readouterr().out


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert cli_main(["bench", "--models", "vit_4l_patch16_224:bogus", "--output", str(tmp_path)]) == 2
    assert "unknown variant" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["bench", "--models", "x", "--res", "a,b", "--output", str(tmp_path)])


def test_flop_count_includes_fused_attention_on_cpu():
    from functools import partial

    from linvit.utils.flops import count_flops

    x = torch.randn(1, 3, 224, 224)
    fused, naive = (create_variant(f"deit_tiny_patch16_224{v}", depth=1).eval() for v in ("", ":naive"))
    with torch.no_grad():
        # the same attention, run by torch's CPU flash kernel or as explicit matmuls, costs the same FLOPs
        assert count_flops(partial(fused, x)) == count_flops(partial(naive, x)) > 0


def test_compiled_point_records_compile_time_apart():
    spec = dict(TINY, model="linear_infvit_tiny_patch16_224", res=32, compile="default", model_kwargs={"depth": 1})
    record = run_point(spec, timeout=600)
    assert record["status"] == "ok", record
    assert record["compile"] == "default" and record["compile_s"] > 0 and record["latency_ms"] > 0
    assert record["gflops"] > 0  # counted on the eager model


def test_batch_and_compile_are_sweep_dimensions(tmp_path):
    from linvit.bench.report import exponents, markdown_table

    records = [
        dict(
            model=m,
            res=r,
            batch=b,
            compile=c,
            tokens=r * r // 256,
            status="ok",
            latency_ms=ms,
            latency_iqr_ms=0.0,
            images_per_s=b / ms,
            peak_mem_mb=1.0,
            compile_s=2.0 if c != "off" else None,
        )
        for m, ms in (("a", 1.0), ("ref", 4.0))
        for c in ("off", "default")
        for b in (1, 32)
        for r in (64, 128)
    ]
    table = markdown_table(records, references=["ref"])
    assert table.startswith("| model | batch | compile | res |") and "compile s" in table
    assert table.count("4.00x") == 8  # every point against the reference with the same batch and compile mode
    series = {f"{m}{b}{c}" for m in ("a", "ref") for b in ("", " b32") for c in ("", " [default]")}
    assert set(exponents(records)) == series


def test_gpu_suite_dry_run_on_cpu(tmp_path):
    from linvit.bench import SUITES, suite_names

    code = cli_main(["bench", "--suite", "gpu", "--dry-run", "--compile", "off", "--output", str(tmp_path)])
    assert code == 0
    for name in suite_names("gpu"):
        points = json.loads((tmp_path / name / "bench.json").read_text())["points"]
        assert [p["status"] for p in points] == ["ok"] * len(SUITES[name]["models"])
        assert SUITES[name]["device"] == "cuda" and SUITES[name]["batch"] == [1, 32]
    assert "gpu_family4l" not in suite_names("all")


def test_dry_run_without_a_suite_is_refused_before_measuring(tmp_path, capsys):
    """--dry-run shrinks a suite's points; with --models it was ignored and the full sizes ran."""
    argv = ["bench", "--models", "linear_infvit_tiny_patch16_224", "--res", "1024", "--dry-run"]
    assert cli_main([*argv, "--output", str(tmp_path / "b")]) == 2
    assert "--dry-run checks a --suite's plan at 32 px" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_cli_compile_choices_are_the_library_modes():
    from linvit.cli import build_parser
    from linvit.utils import COMPILE_MODES

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    choices = next(a.choices for a in train._actions if a.dest == "compile")
    assert tuple(choices) == COMPILE_MODES


def test_readme_model_table_is_what_linvit_models_counts(capsys):
    """Issue 39 item 15: README's params and GMACs are the command's (scripts/models_table.py writes them; the
    Katz rows said 10.33 and 4.53 where `linvit models --macs` gives 10.546 and 4.587)."""
    from pathlib import Path

    assert cli_main(["models", "--filter", "katz_infvit", "--macs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for row in rows:
        line = next(x for x in readme.splitlines() if x.startswith(f"| `{row['model']}` |"))
        assert line.endswith(f"| {row['params']:,} | {row['gmacs@224']:.2f} |"), line


def test_worker_runs_with_the_threads_asked_for_and_records_them():
    """Issue 45 item 8: --threads reached the parent only; every point's worker now runs with it (its own
    torch.get_num_threads(), recorded), beside the CPU model and its matrix extensions."""
    spec = dict(TINY, model="linear_infvit_tiny_patch16_224", res=32, model_kwargs={"depth": 1}, threads=3)
    record = run_point(spec, timeout=300)
    assert record["status"] == "ok", record
    assert record["threads"] == 3  # not this 2-core machine's default: the worker's own count
    assert isinstance(record["cpu_model"], str) and record["cpu_model"]
    assert isinstance(record["cpu_extensions"], list)
    failed = run_point(dict(spec, model="no_such_model_patch16_224"), timeout=300)
    assert failed["status"] == "error" and failed["threads"] == 3 and "cpu_model" in failed


def test_thread_environment_and_the_cli_setting_reach_the_workers(tmp_path, monkeypatch):
    from linvit.bench import command, machine

    env = machine.thread_env(2, {"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2" and env["PATH"] == "/bin"
    assert "OMP_NUM_THREADS" not in machine.thread_env(None, {})
    seen = []
    monkeypatch.setattr(command, "sweep", lambda models, res, common, *a, **k: seen.append(common) or [])
    monkeypatch.setattr(command, "measure_machine", lambda device, threads, dtypes: seen.append(threads) or {})
    monkeypatch.setattr(command, "write_outputs", lambda *a, **k: (tmp_path / "bench.md").write_text("") or {})
    args = ["bench", "--models", "linear_infvit_tiny_patch16_224", "--threads", "1", "--output", str(tmp_path)]
    assert cli_main(args) == 0
    assert seen[0] == 1 and seen[1]["threads"] == 1  # the GEMM peak's worker and every point's


def test_cpu_info_reads_the_model_and_matrix_extensions(tmp_path):
    from linvit.bench.machine import cpu_info

    text = "processor\t: 0\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
    text += "stepping\t: 8\nflags\t\t: fpu avx2 fma avx512f amx_tile amx_bf16 amx_int8 avx512_bf16\n"
    (tmp_path / "cpuinfo").write_text(text + "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: other\n")
    info = cpu_info(str(tmp_path / "cpuinfo"))
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+" and info["cpu_id"] == "family 6 model 143 stepping 8"
    assert info["cpu_extensions"] == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    absent = cpu_info(str(tmp_path / "absent"))
    assert absent["cpu_extensions"] == [] and absent["cpu_id"] is None


def test_gemm_peak_record_has_its_fields():
    """Issue 48 item 1: the run's machine record, measured by a worker like the points' (no timing asserted)."""
    from linvit.bench.runner import measure_machine

    machine = measure_machine("cpu", 1, ["fp32", "bf16", "fp32"], window_s=0.01, best_of=1)
    assert machine["status"] == "ok", machine
    assert machine["threads"] == 1 and machine["device"] == "cpu" and isinstance(machine["cpu_extensions"], list)
    assert list(machine["gemm"]) == ["fp32", "bf16"]
    for dtype, peak in machine["gemm"].items():
        assert peak["dtype"] == dtype and peak["n"] % 128 == 0 and peak["reps"] >= 1 and peak["best_of"] == 1
        assert peak["gflops_per_s"] > 0


def test_each_point_gets_its_dtypes_peak_and_share():
    from linvit.bench.report import machine_line, markdown_table
    from linvit.bench.runner import with_shares

    gemm = {"fp32": {"gflops_per_s": 100.0}, "bf16": {"gflops_per_s": 400.0}}
    machine = dict(status="ok", device="cpu", device_name="cpu x", cpu_model="cpu x", threads=1, gemm=gemm)
    machine["cpu_extensions"] = ["avx512f"]
    base = dict(model="m", res=64, tokens=16, latency_ms=1.0, latency_iqr_ms=0.0, images_per_s=1.0, peak_mem_mb=1.0)
    records = [
        dict(base, dtype="fp32", status="ok", gflops_per_s=50.0),
        dict(base, dtype="bf16", status="ok", gflops_per_s=100.0),
        dict(base, dtype="fp16", status="ok", gflops_per_s=100.0),  # no fp16 peak measured
        dict(base, dtype="fp32", status="oom", reason="x"),
        dict(base, dtype="fp32", status="ok", gflops_per_s=250.0, runtime="onnxruntime-int8"),  # other kernels
    ]
    shared = with_shares(records, machine)
    assert [r["peak_share"] for r in shared] == [0.5, 0.25, None, None, None]
    assert [r["gemm_peak_gflops_per_s"] for r in shared] == [100.0, 400.0, None, 100.0, 100.0]
    assert "share of GEMM peak" in markdown_table(shared) and "| 50% |" in markdown_table(shared)
    assert "share of GEMM peak" not in markdown_table(records)  # older records keep their table
    line = machine_line(machine)
    assert "(family" not in line and "(family 26 model 2)" in machine_line({**machine, "cpu_id": "family 26 model 2"})
    assert "cpu x" in line and "avx512f" in line and "1 thread" in line and "fp32 100" in line
    assert "not measured" in machine_line({"status": "timeout", "reason": "r"})
    assert with_shares(records, None)[0]["peak_share"] is None


def test_the_committed_onnxruntime_table_is_generated_from_the_committed_json():
    """docs/benchmarks.md's onnxruntime table is scripts/ort_table.py's output from docs/bench/onnxruntime/*.json,
    and that run timed every family three ways (eager, the float32 graph, its int8 quantization)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("ort_table", root / "scripts" / "ort_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    data = json.loads(table.FILE.read_text())
    gemm = json.loads(table.GEMM_FILE.read_text())
    seen = {(p["model"], p.get("runtime", "eager")) for p in data["points"] if p["status"] == "ok"}
    assert seen == {(m, r) for m in table.FAMILIES for r in table.RUNTIMES}
    assert table.section(data, gemm) in (root / "docs" / "benchmarks.md").read_text()


def test_the_peak_is_the_better_of_the_measurements_before_and_after_the_points():
    """A peak measured while something else ran (2.4x low in one run here) is no limit: the better one is kept."""
    from linvit.bench.runner import best_peak, busy_machine

    def machine(fp32, bf16, status="ok"):
        gemm = {"fp32": {"gflops_per_s": fp32, "n": 1}, "bf16": {"gflops_per_s": bf16, "n": 2}}
        return dict(status=status, gemm=gemm)

    best = best_peak(machine(83.0, 800.0), machine(198.0, 790.0))
    assert {d: g["gflops_per_s"] for d, g in best["gemm"].items()} == {"fp32": 198.0, "bf16": 800.0}
    assert best["gemm_measured"] == [machine(83.0, 800.0)["gemm"], machine(198.0, 790.0)["gemm"]]
    assert best_peak(machine(1.0, 1.0), {"status": "timeout"}) == machine(1.0, 1.0)
    assert best_peak({"status": "error"}, machine(2.0, 2.0)) == machine(2.0, 2.0)
    assert busy_machine(best) and not busy_machine(best_peak(machine(190.0, 800.0), machine(198.0, 790.0)))
    assert not busy_machine(machine(1.0, 1.0))  # one reading: nothing to compare


def test_bmm_flops_are_our_count_with_and_without_out_dtype():
    """torch 2.9-2.11's bmm formula took out_dtype for the output shape and raised (Katz points failed on the H200);
    ours counts 2*b*m*n*k for both overloads (meta tensors: shapes only)."""
    from linvit.utils.flops import count_flops

    a = torch.empty(3, 5, 7, device="meta", dtype=torch.bfloat16)
    b = torch.empty(3, 7, 11, device="meta", dtype=torch.bfloat16)
    explicit = 2 * 3 * 5 * 11 * 7
    assert count_flops(lambda: torch.bmm(a, b)) == explicit
    assert count_flops(lambda: torch.bmm(a, b, out_dtype=torch.float32)) == explicit
    assert (
        count_flops(lambda: torch.bmm(a.float(), b.float()) @ torch.empty(11, 2, device="meta"))
        == explicit + 2 * 15 * 11 * 2
    )


def test_the_committed_share_table_is_generated_from_the_committed_json():
    """docs/benchmarks.md's GEMM-share table is scripts/share_table.py's output from docs/bench/share/*.json."""
    from pathlib import Path

    from linvit.bench.report import shares_section

    root = Path(__file__).resolve().parents[1]
    runs = {d: json.loads((root / "docs/bench/share" / f"{d}.json").read_text()) for d in ("fp32", "bf16")}
    families = {"vit_4l_patch16_224", "linear_infvit_4l_patch16_224", "katz_infvit_4l_patch16_224"}
    for run in runs.values():
        assert families | {"weightformer_tiny_patch16_224"} == {p["model"] for p in run["points"]}
        assert run["machine"]["status"] == "ok" and all("peak_share" in p for p in run["points"])
    assert shares_section(runs) in (root / "docs" / "benchmarks.md").read_text()


def test_the_committed_int8_operator_table_is_generated_from_the_committed_json(monkeypatch):
    """docs/benchmarks.md's int8-ops table is scripts/int8_ops_ab.py's output from its committed JSON, which timed
    the three graphs of every family at every size it names."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "scripts"))  # it reads ort_table's families
    spec = importlib.util.spec_from_file_location("int8_ops_ab", root / "scripts" / "int8_ops_ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    data = json.loads(ab.FILE.read_text())
    sizes = {p["res"] for p in data["points"]}
    assert {(p["model"], p["res"]) for p in data["points"]} == {(m, r) for m in ab.FAMILIES for r in sizes}
    assert all(len(p["ms"]) == 3 for p in data["points"])
    assert ab.table(data) in ab.DOC.read_text()
