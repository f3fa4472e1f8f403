"""ONNX Runtime as a runtime (issue 48): exported graphs equal PyTorch in onnxruntime for every family, the
int8 export runs and `linvit eval` scores it, and an .onnx file evaluates with its run's own preprocessing."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import timm  # noqa: E402
import torch  # noqa: E402

import linvit  # noqa: E402,F401  (registers the models)
from linvit.cli import main as cli_main  # noqa: E402
from linvit.errors import UsageError  # noqa: E402
from linvit.export import export_model, fix_size_dependent_choices  # noqa: E402
from linvit.onnx_runtime import OnnxClassifier, classifier_metadata, write_metadata  # noqa: E402

FAMILIES = {
    "vit_4l_patch16_224": dict(depth=2, embed_dim=64, num_heads=4),  # timm's fused softmax attention
    "linear_infvit_tiny_patch16_224": dict(depth=2),
    "katz_infvit_tiny_patch16_224": dict(depth=2),
    "weightformer_tiny_patch16_224": dict(depth=4, dynamic_interval=2),
}
DATA_CONFIG = {"input_size": (3, 64, 64), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3}


def _export(name: str, path, dynamic_batch: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, img_size=64, **FAMILIES[name]).eval()
    fix_size_dependent_choices(model, (64, 64))
    with torch.no_grad():
        export_model(model, "onnx", path, torch.randn(2 if dynamic_batch else 1, 3, 64, 64), dynamic_batch)
    write_metadata(path, classifier_metadata(name, model, DATA_CONFIG, None))
    return model


@pytest.mark.parametrize("dynamic_batch", [True, False], ids=["dynamic-batch", "batch-1"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_onnxruntime_equals_pytorch_in_float32(name, dynamic_batch, tmp_path):
    """The runner's logits equal PyTorch's within 1e-4 (a batch-1 graph runs the batch of 3 in slices)."""
    model = _export(name, tmp_path / "m.onnx", dynamic_batch)
    runner = OnnxClassifier(tmp_path / "m.onnx")
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(runner(x), expected, rtol=0, atol=1e-4)
    assert runner.meta["num_classes"] == 5 and runner.data_config()["input_size"] == (3, 64, 64)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-epoch classifier run on a small digit folder: a run folder as `linvit train` writes it."""
    from linvit.data import build_cluttered_mnist

    root = tmp_path_factory.mktemp("onnx_run")
    data = root / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=2, per_class_val=3, clutter=1, progress=False)
    argv = ["train", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--output", str(root / "run")]
    argv += ["--img-size", "32", "--crop-pct", "1.0", "--workers", "0", "--epochs", "1", "--batch-size", "4"]
    assert cli_main([*argv, "--no-progress", "--model-kwargs", "patch_size=8", "depth=1"]) == 0
    return data, root / "run"


def _eval(data, checkpoint, out, *extra: str) -> dict:
    argv = ["eval", "--data", str(data), "--checkpoint", str(checkpoint), "--workers", "0", "--no-progress"]
    assert cli_main([*argv, "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_int8_export_runs_and_eval_scores_both_files_as_pytorch_does(run, tmp_path):
    """`export --quantize int8` writes both graphs; eval of the float32 file equals eval of the run (same
    preprocessing, from the file's metadata); the int8 file reports a top-1 on the same images."""
    data, folder = run
    onnx_file = tmp_path / "m.onnx"
    assert cli_main(["export", "--model", str(folder), "--output", str(onnx_file), "--quantize", "int8"]) == 0
    int8 = tmp_path / "m.int8.onnx"
    assert int8.stat().st_size < onnx_file.stat().st_size
    eager = _eval(data, folder, tmp_path / "eager.json")
    fp32 = _eval(data, onnx_file, tmp_path / "fp32.json")
    q = _eval(data, int8, tmp_path / "int8.json")
    assert fp32["top1"] == eager["top1"] and fp32["loss"] == pytest.approx(eager["loss"], abs=1e-4)
    assert fp32["images"] == q["images"] == eager["images"] == 30
    assert 0 <= q["top1"] <= 100 and q["runtime"] == "onnxruntime" and q["input_size"] == [3, 32, 32]
    import onnx

    ops = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert "MatMulInteger" in ops and "Conv" in ops  # products in int8, the patch convolution left in float32
    assert "ConvInteger" not in ops  # onnxruntime's int8 convolution ran slower than float32 (INT8_OPS)
    assert "Gemm" not in ops  # the classifier's Gemm became an int8 product too (MatMul listed, Gemm not)


def test_eval_refuses_an_onnx_file_linvit_did_not_export(run, tmp_path, capsys):
    """A graph without linvit's metadata (here a bare linear layer) is named, not run with guessed settings."""
    data, _ = run
    path = tmp_path / "plain.onnx"
    torch.onnx.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),), str(path), dynamo=True).save(str(path))
    argv = ["eval", "--data", str(data), "--checkpoint", str(path), "--workers", "0"]
    assert cli_main(argv) != 0
    assert "no linvit metadata" in capsys.readouterr().err


def test_eval_of_an_onnx_file_refuses_pytorch_only_flags(run, tmp_path, capsys):
    data, folder = run
    onnx_file = tmp_path / "m.onnx"
    assert cli_main(["export", "--model", str(folder), "--output", str(onnx_file)]) == 0
    argv = ["eval", "--data", str(data), "--checkpoint", str(onnx_file), "--workers", "0", "--amp", "bf16"]
    assert cli_main(argv) != 0
    assert "--amp: not for an .onnx file" in capsys.readouterr().err
    with pytest.raises(UsageError, match="takes 32 x 32 only"):
        OnnxClassifier(onnx_file).data_config(img_size=64)


def test_predict_on_an_onnx_file_gives_the_runs_labels_and_probabilities(run, tmp_path, capsys):
    """`linvit predict --checkpoint FILE.onnx`: the run's preprocessing and class names, stored in the file, give
    the same top-k as predicting with the run folder; what needs the PyTorch model is refused in one line."""
    data, folder = run
    onnx_file = tmp_path / "m.onnx"
    assert cli_main(["export", "--model", str(folder), "--output", str(onnx_file)]) == 0
    images = sorted((data / "val").rglob("*.png"))[:6]
    common = ["predict", *map(str, images), "--topk", "3", "--no-progress"]
    torch_fp32 = ["--amp", "none"]  # predict's default (auto) is bf16 on a CPU with native bf16 products
    assert cli_main([*common, "--checkpoint", str(folder), "--output", str(tmp_path / "torch.jsonl"), *torch_fp32]) == 0
    assert cli_main([*common, "--checkpoint", str(onnx_file), "--output", str(tmp_path / "onnx.jsonl")]) == 0  # auto
    torch_rows, onnx_rows = ([json.loads(line) for line in (tmp_path / f).read_text().splitlines()]
                             for f in ("torch.jsonl", "onnx.jsonl"))  # fmt: skip
    assert len(onnx_rows) == len(images)
    assert OnnxClassifier(onnx_file).label_names == [str(d) for d in range(10)]  # the run's class folders' names
    for a, b in zip(torch_rows, onnx_rows, strict=True):
        assert a["size"] == b["size"] and [t["label"] for t in a["topk"]] == [t["label"] for t in b["topk"]]
        for ta, tb in zip(a["topk"], b["topk"], strict=True):
            assert tb["prob"] == pytest.approx(ta["prob"], abs=1e-5)
    capsys.readouterr()
    refused = (["--maps", str(tmp_path / "maps")], ["--native"], ["--amp", "bf16"], ["--pretrained"], ["--model", "m"])
    for flag in refused:
        assert cli_main([*common, "--checkpoint", str(onnx_file), *flag]) == 2
        assert f"{flag[0]}: not for an .onnx file" in capsys.readouterr().err
    assert cli_main([*common, "--checkpoint", str(onnx_file), "--img-size", "64"]) == 2
    assert "takes 32 x 32 only" in capsys.readouterr().err


def test_quantize_needs_onnx_format_and_onnxruntime(tmp_path, capsys, monkeypatch):
    export = ["export", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1", "--img-size", "32"]
    assert cli_main([*export, "--output", str(tmp_path / "m.pt2"), "--quantize", "int8"]) != 0
    assert "--quantize int8 quantizes ONNX graphs" in capsys.readouterr().err
    assert cli_main([*export, "--output", str(tmp_path / "m.int8.onnx"), "--quantize", "int8"]) != 0
    assert f"give --output {tmp_path / 'm.onnx'}, and the int8 graph" in capsys.readouterr().err  # not m.int8.int8
    assert not list(tmp_path.iterdir())
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    assert cli_main([*export, "--output", str(tmp_path / "m.onnx"), "--quantize", "int8"]) != 0
    assert "--quantize int8 needs onnxruntime: pip install" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_onnxruntime_bench_point_times_the_exported_graph():
    """`linvit bench --runtime onnxruntime`'s point: the record says its runtime, beside the eager fields."""
    from linvit.bench import onnx_point
    from linvit.bench.point import measure as eager_measure

    spec = dict(model="linear_infvit_tiny_patch16_224", model_kwargs={"depth": 1}, res=32, iters=1)
    record, eager = onnx_point.measure(spec), eager_measure(spec)
    assert record["status"] == "ok" and record["runtime"] == "onnxruntime" and record["latency_ms"] > 0
    assert record["export_s"] > 0 and record["tokens"] == eager["tokens"] and record["gflops"] == eager["gflops"]
    assert set(eager) <= set(record)  # every field of an eager point, so the tables take both


def test_int8_bench_point_times_the_quantized_graph(monkeypatch):
    """`--runtime onnxruntime-int8`'s point quantizes the exported graph (export --quantize int8's function) and
    times that file; FLOPs stay the float model's, so FLOP/s compare the same work."""
    from linvit.bench import onnx_point

    quantized, sessions = [], []
    real_quantize, real_session = onnx_point.quantize_int8, onnx_point.cpu_session
    monkeypatch.setattr(onnx_point, "quantize_int8", lambda a, b: quantized.append(b) or real_quantize(a, b))
    monkeypatch.setattr(onnx_point, "cpu_session", lambda path, n: sessions.append(path) or real_session(path, n))
    spec = dict(model="linear_infvit_tiny_patch16_224", model_kwargs={"depth": 1}, res=32, iters=1)
    fp32 = onnx_point.measure({**spec, "runtime": "onnxruntime"})
    assert quantized == [] and fp32["runtime"] == "onnxruntime"
    int8 = onnx_point.measure({**spec, "runtime": "onnxruntime-int8"})
    assert sessions[-1] == quantized[0] and quantized[0].name.endswith(".int8.onnx")
    assert int8["runtime"] == "onnxruntime-int8" and int8["gflops"] == fp32["gflops"] and int8["latency_ms"] > 0


def test_bench_int8_runtime_sweeps_eager_float_and_int8_graphs(tmp_path, monkeypatch):
    from linvit.bench import command

    runtimes = []
    monkeypatch.setattr(command, "measure_machine", lambda *a: {"status": "skipped"})
    monkeypatch.setattr(command, "machine_line", lambda machine: "machine")
    monkeypatch.setattr(command, "sweep", lambda m, r, common, *a, **k: runtimes.append(common.get("runtime")) or [])
    monkeypatch.setattr(command, "write_outputs", lambda records, out, *a, **k: (out / "bench.md").write_text("") or {})
    bench = ["bench", "--models", "linear_infvit_tiny_patch16_224", "--res", "32", "--output", str(tmp_path)]
    assert cli_main([*bench, "--runtime", "onnxruntime-int8"]) == 0
    assert runtimes == [None, "onnxruntime", "onnxruntime-int8"]


def test_bench_routes_onnxruntime_points_and_names_the_runtime(monkeypatch):
    from linvit.bench import runner
    from linvit.bench.report import markdown_table, series_label

    seen = []
    monkeypatch.setattr(runner, "run_worker", lambda module, spec, *a: seen.append(module) or {**spec, "status": "ok"})
    runtimes = ("eager", "onnxruntime", "onnxruntime-int8")
    records = [runner.run_point({"model": "m", "res": 32, "runtime": r}) for r in runtimes]
    assert seen == ["linvit.bench.point", "linvit.bench.onnx_point", "linvit.bench.onnx_point"]
    assert [r["runtime"] for r in records] == list(runtimes)
    assert series_label(records[1]) == "m (onnxruntime)" and series_label(records[0]) == "m"
    rows = [dict(r, latency_ms=1.0, latency_iqr_ms=0.0, tokens=4) for r in records]
    assert "| runtime |" in markdown_table(rows)


def test_bench_onnxruntime_refuses_what_it_does_not_time(tmp_path, capsys):
    bench = ["bench", "--models", "linear_infvit_tiny_patch16_224", "--res", "32", "--output", str(tmp_path)]
    assert cli_main([*bench, "--runtime", "onnxruntime", "--dtype", "bf16"]) != 0
    assert "float32 classifier inference on CPU; not --dtype bf16" in capsys.readouterr().err
    assert cli_main([*bench, "--runtime", "onnxruntime-int8", "--dtype", "bf16"]) != 0
    assert "--runtime onnxruntime-int8 times float32" in capsys.readouterr().err
    assert cli_main([*bench, "--runtime", "onnxruntime", "--ladder"]) != 0
    assert "not --suite, not --ladder" in capsys.readouterr().err


def test_a_session_asked_not_to_spin_lets_its_threads_sleep(tmp_path):
    """cpu_session(spinning=False) (the int8 A/B's interleaved sessions) sets onnxruntime's allow_spinning off; the
    default leaves onnxruntime's own setting."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from linvit.onnx_runtime import cpu_session

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    key = "session.intra_op.allow_spinning"
    quiet = cpu_session(tmp_path / "m.onnx", 2, spinning=False).get_session_options()
    assert quiet.get_session_config_entry(key) == "0"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # left to onnxruntime
        cpu_session(tmp_path / "m.onnx", 2).get_session_options().get_session_config_entry(key)
