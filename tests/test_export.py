"""Every family through the ecosystem's tools: FX symbolic tracing, feature extraction, torch.export, ONNX."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import linvit  # registers the models
from linvit.cli import main as cli_main
from linvit.models import create_variant

FAMILIES = {
    "vit_4l_patch16_224": dict(depth=2, embed_dim=64, num_heads=4),
    "infvit_tiny_patch16_224": dict(depth=2),
    "linear_infvit_tiny_patch16_224": dict(depth=2),
    "katz_infvit_tiny_patch16_224": dict(depth=2),
    "weightformer_tiny_patch16_224": dict(depth=4, dynamic_interval=2),
}


def _model(name: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=5, **FAMILIES[name], **extra)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_fx_symbolic_trace_matches_eager_forward_and_backward(name):
    model = _model(name).eval()
    graph = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 3, 64, 96)  # not the default size: position tables are resampled inside the graph
    torch.testing.assert_close(graph(x), model(x), rtol=0, atol=0)
    graph(x).square().sum().backward()
    traced_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(x).square().sum().backward()
    assert traced_grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(traced_grads[n], p.grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="channels"):  # eager input checks are still there
        model(torch.randn(1, 4, 64, 64))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_feature_extractor_returns_block_outputs(name):
    model = _model(name).eval()
    _, nodes = get_graph_node_names(model)
    last = [n for n in nodes if n.startswith("blocks.1")][-1]  # the output of the second block
    extractor = create_feature_extractor(model, return_nodes={last: "block1"})
    x = torch.randn(1, 3, 64, 64)
    features = extractor(x)["block1"][:, getattr(model, "num_prefix_tokens", 0) :]
    expected = model.forward_intermediates(x, indices=[1], output_fmt="NLC", intermediates_only=True)[0]
    torch.testing.assert_close(features, expected)  # forward_intermediates returns the patch tokens only


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_onnx_export_matches_pytorch_in_onnxruntime(name, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from linvit.export import check_onnx, export_model, fix_size_dependent_choices

    model = _model(name).eval()
    fix_size_dependent_choices(model, (64, 64))
    example = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        export_model(model, "onnx", tmp_path / "m.onnx", example, dynamic_batch=True)
    assert check_onnx(model, tmp_path / "m.onnx", tuple(example.shape[1:]), batches=[1, 3]) <= 1e-4


def test_katz_series_by_squaring_equals_the_solve():
    from linvit.ops.katz import neumann_by_squaring

    m = torch.randn(3, 6, 6, dtype=torch.float64)
    m = 0.99 * m / torch.linalg.matrix_norm(m, 2)[:, None, None]
    torch.testing.assert_close(neumann_by_squaring(m), torch.linalg.inv(torch.eye(6, dtype=torch.float64) - m))


def test_weightformer_per_sample_conv_equals_the_grouped_conv():
    from linvit.layers.dynamic import per_sample_depthwise

    x, kernel, bias = torch.randn(3, 4, 7, 9), torch.randn(3, 4, 3, 3), torch.randn(4)
    grouped = torch.nn.functional.conv2d(
        x.reshape(1, 12, 7, 9), kernel.reshape(12, 1, 3, 3), bias.repeat(3), padding=1, groups=12
    )
    torch.testing.assert_close(per_sample_depthwise(x, kernel, bias), grouped.reshape(3, 4, 7, 9))


def test_export_command_writes_a_checked_program_from_a_run_folder(tmp_path, capsys):
    from linvit.utils.artifacts import save_model_folder

    model = _model("linear_infvit_tiny_patch16_224", img_size=32, patch_size=8)
    save_model_folder(tmp_path / "run", model, {"task": "classification", "model": "linear_infvit_tiny_patch16_224"})
    assert json.loads((tmp_path / "run" / "config.json").read_text())["architecture"]
    out = tmp_path / "m.pt2"
    assert (
        cli_main(
            ["export", "--model", str(tmp_path / "run"), "--format", "pt2", "--img-size", "32"]
            + ["--output", str(out), "--dynamic-batch"]
        )
        == 0
    )
    reloaded = torch.export.load(str(out)).module()
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(reloaded(x), model.eval()(x))
    assert "max abs diff" in capsys.readouterr().out
    script = tmp_path / "m.pt"
    assert (
        cli_main(
            ["export", "--model", str(tmp_path / "run"), "--format", "torchscript", "--img-size", "32"]
            + ["--output", str(script)]
        )
        == 0
    )
    summary_line = capsys.readouterr().out
    assert "torchscript" in summary_line and "max abs diff" in summary_line
    x = torch.randn(2, 3, 48, 64)  # a scripted model runs at any batch and size, not only the export's
    torch.testing.assert_close(torch.jit.load(str(script))(x), model(x))
    seg = tmp_path / "seg"
    seg.mkdir()
    (seg / "config.json").write_text(json.dumps({"linvit": {"task": "segmentation"}}))
    assert cli_main(["export", "--model", str(seg), "--output", str(tmp_path / "x.onnx")]) == 2
    assert "classification runs" in capsys.readouterr().err
    assert cli_main(["export", "--model", "deit_tiny_patch16_224", "--img-size", "1", "2", "3", "--output", "x"]) == 2


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_torchscript_script_matches_eager_forward_and_backward(name, tmp_path):
    model = _model(name)
    torch.jit.save(torch.jit.script(model), str(tmp_path / "m.pt"))
    scripted = torch.jit.load(str(tmp_path / "m.pt"))  # saved and reloaded: no Python left in it
    for shape in [(2, 3, 64, 96), (1, 3, 48, 32)]:  # any batch and size, position tables resampled in the graph
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(scripted.eval()(x), model.eval()(x), rtol=1e-5, atol=1e-6)
    x = torch.randn(2, 3, 64, 96)
    model.train()(x).square().sum().backward()
    scripted.train()(x).square().sum().backward()
    eager_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    scripted_grads = {n: p.grad for n, p in scripted.named_parameters() if p.grad is not None}
    assert eager_grads.keys() == scripted_grads.keys() and eager_grads
    for n, grad in eager_grads.items():
        torch.testing.assert_close(scripted_grads[n], grad, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="channels"):  # eager input checks are still there
        model(torch.randn(1, 4, 64, 64))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("infvit_tiny_patch16_224", dict(attn_impl="chunked", qk_norm=True, class_token=False, global_pool="avg")),
        ("linear_infvit_tiny_patch16_224", dict(fold_kv=False)),
        ("linear_infvit_tiny_patch16_224", dict(qkv_bias=False)),
        ("katz_infvit_tiny_patch16_224", dict(feature_map="elu+1")),
        ("katz_infvit_tiny_patch16_224", dict(feature_map="hedgehog", feature_dim=24)),
        ("weightformer_tiny_patch16_224", dict(dynamic_interval=1, linear_predictor="gap", conv_predictor="gap")),
        ("weightformer_tiny_patch16_224", dict(dynamic_interval=1, linear_predictor="deep")),
        ("weightformer_tiny_patch16_224", dict(dynamic_interval=1, linear_predictor="linear")),
        ("weightformer_tiny_patch16_224", dict(dynamic_interval=1, linear_predictor="nonlinear")),
        ("weightformer_tiny_patch16_224", dict(dynamic_interval=0)),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()),
)
def test_torchscript_script_covers_every_mixer_and_predictor_option(name, kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, depth=2, **kwargs).eval()
    x = torch.randn(2, 3, 32, 64)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "form", ["linear_infsa", "katz_infsa:hedgehog", "linear_attention", "linear_attention:hedgehog"]
)
def test_torchscript_script_of_a_converted_timm_model(form):
    torch.manual_seed(0)
    model = linvit.convert(timm.create_model("deit_tiny_patch16_224", depth=2, num_classes=5), form).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_torchscript_pure_infsa_layer_keeps_masks(impl):
    from linvit.layers import PureInfSAAttention

    torch.manual_seed(0)
    layer = PureInfSAAttention(16, 4, impl=impl, block_size=3).eval()
    scripted = torch.jit.script(layer)
    x, keep = torch.randn(2, 7, 16), torch.rand(2, 1, 1, 7) > 0.3
    torch.testing.assert_close(scripted(x, is_causal=True), layer(x, is_causal=True))
    torch.testing.assert_close(scripted(x, keep), layer(x, keep))


@pytest.mark.parametrize(
    "name, fmt, step, kwargs",
    [
        ("linear_infvit_tiny_patch16_224", "onnx", 16, {}),
        ("katz_infvit_tiny_patch16_224", "onnx", 16, {}),
        ("infvit_tiny_patch16_224", "onnx", 16, {}),
        ("vit_4l_patch16_224", "pt2", 16, {}),
        ("weightformer_tiny_patch16_224", "pt2", 32, {}),
        ("deit_tiny_patch16_224", "onnx", 16, {"dynamic_img_size": True}),
    ],
)
def test_dynamic_size_export_runs_at_sizes_it_was_not_exported_at(name, fmt, step, kwargs, tmp_path):
    from linvit.export import ExportConfig, run_export

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    out = tmp_path / f"m.{fmt}"
    args = ExportConfig(model=name, model_kwargs={"depth": 2, **kwargs}, img_size=[64], output=str(out), format=None)
    args.dynamic_batch, args.dynamic_size = False, True
    torch.manual_seed(0)
    summary = run_export(args)
    assert summary["accepted_sizes"] == f"H and W multiples of {step} px from {2 * step} to 16384"
    checked = summary["sizes_checked"]  # the export size, the smallest claimed, a non-square one, one above
    assert [64, 64] in checked and [2 * step, 2 * step] in checked and [64 + step, 64 + 3 * step] in checked
    assert any(h != w and h < 64 + step for h, w in checked) and summary["max_abs_diff"] < 1e-4
    torch.manual_seed(0)
    model = create_variant(name, img_size=(64, 64), depth=2, **kwargs).eval()  # the exported weights (same seed)
    x = torch.randn(1, 3, 3 * step, 5 * step)  # a third size, checked here rather than by the command
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    else:
        got = torch.export.load(str(out)).module()(x).detach().numpy()
    with torch.no_grad():
        expected = model(x).numpy()
    assert got.shape == (1, 1000) and np.abs(got - expected).max() < 1e-4


def test_dynamic_size_export_refuses_what_cannot_work(tmp_path):
    from linvit.export import ExportConfig, run_export

    def export(name, fmt, size=64, **kwargs):
        args = ExportConfig(model=name, model_kwargs={"depth": 2, **kwargs}, img_size=[size], format=None)
        args.output, args.dynamic_batch, args.dynamic_size = str(tmp_path / f"m.{fmt}"), False, True
        return run_export(args)

    with pytest.raises(ValueError, match="pt2 only"):
        export("weightformer_tiny_patch16_224", "onnx")
    with pytest.raises(ValueError, match="multiples of 32 px"):
        export("weightformer_tiny_patch16_224", "pt2", size=48)
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        export("deit_tiny_patch16_224", "onnx")
    with pytest.raises(ValueError, match="any input size already"):
        export("linear_infvit_tiny_patch16_224", "pt")
    assert not list(tmp_path.iterdir())  # nothing written


def test_onnx_without_the_export_extra_is_one_line(tmp_path, monkeypatch):
    import importlib.util

    from linvit.export import ExportConfig, run_export

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    args = ExportConfig(model="linear_infvit_tiny_patch16_224", model_kwargs={"depth": 1}, img_size=[32], format=None)
    args.output, args.dynamic_batch, args.dynamic_size = str(tmp_path / "m.onnx"), False, False
    with pytest.raises(ValueError, match=r'needs (onnx, )?onnxscript: pip install -e "\.\[export\]"'):
        run_export(args)
    assert not list(tmp_path.iterdir())


def test_weightformer_dynamic_size_pt2_runs_on_both_sides_of_the_association_switch(tmp_path):
    """WeightFormer-T's correlation changes association order at M = 48 pooled tokens: 224 px (M = 49) and 192 px
    (M = 36) take different orders, and the exported graph must take each size's (not guard on the export's)."""
    from linvit.export import ExportConfig, run_export

    out = tmp_path / "m.pt2"
    args = ExportConfig(
        model="weightformer_tiny_patch16_224", model_kwargs={"depth": 2}, img_size=[224], output=str(out)
    )
    args.format, args.dynamic_batch, args.dynamic_size = None, False, True
    torch.manual_seed(0)
    summary = run_export(args)
    assert summary["sizes_checked"] == [[224, 224], [64, 64], [192, 224], [256, 320]]
    torch.manual_seed(0)
    model = create_variant("weightformer_tiny_patch16_224", img_size=(224, 224), depth=2).eval()
    program = torch.export.load(str(out)).module()
    for size in [(192, 192), (160, 224), (96, 64)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            torch.testing.assert_close(program(x), model(x), rtol=0, atol=1e-4)


def _run_folder(tmp_path, name: str = "vit_4l_patch16_224"):
    """A classification run folder trained at 32 px (patch 8) as `linvit train` leaves it, and its model."""
    from linvit.utils.artifacts import save_model_folder

    torch.manual_seed(0)
    model = _model(name, img_size=32, patch_size=8)
    with torch.no_grad():  # weights (the position table too) far from their start, as training leaves them
        for p in model.parameters():
            p.normal_(0, 0.3)
    save_model_folder(tmp_path / "run", model, {"task": "classification", "model": name})
    return tmp_path / "run"


def _onnx_outputs(path, x: torch.Tensor) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


def test_dynamic_onnx_of_a_run_folder_equals_the_run_at_its_own_size_and_others(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run = _run_folder(tmp_path)
    out = tmp_path / "m.onnx"
    assert cli_main(["export", "--model", str(run), "--dynamic-size", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "checked at 32 x 32," in printed  # the default --img-size of a run folder is the run's own
    trained = linvit.load_run(run)
    for size in [(32, 32), (64, 96), (232, 248)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            np.testing.assert_allclose(_onnx_outputs(out, x), trained(x).numpy(), rtol=0, atol=1e-4)


def test_export_of_a_run_folder_at_another_size_checks_against_the_run(tmp_path, capsys):
    run = _run_folder(tmp_path)
    out = tmp_path / "m.pt2"
    args = ["export", "--model", str(run), "--img-size", "64", "--dynamic-size", "--output", str(out)]
    assert cli_main(args) == 0
    assert "32 x 32" in capsys.readouterr().out.splitlines()[1]  # the run's own size is among those checked
    trained, program = linvit.load_run(run), torch.export.load(str(out)).module()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(program(x), trained(x), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dynamic_batch, said", [(True, ", batch 1 and 3"), (False, ", batch 1")])
def test_export_says_the_batch_sizes_it_checked(tmp_path, capsys, dynamic_batch, said):
    args = ["export", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1", "--img-size", "32"]
    args += ["--output", str(tmp_path / "m.pt2")] + (["--dynamic-batch"] if dynamic_batch else [])
    assert cli_main(args) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(said)


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_dynamic_size_file_refuses_the_sizes_the_command_refuses(fmt, tmp_path, capsys):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    out = tmp_path / f"m.{fmt}"
    args = ["export", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*args, "--img-size", "64", "--dynamic-size", "--output", str(out)]) == 0
    run = (lambda x: _onnx_outputs(out, x)) if fmt == "onnx" else torch.export.load(str(out)).module()
    assert run(torch.randn(1, 3, 48, 80)).shape == (1, 1000)
    for size in [(100, 100), (16, 16), (16, 64), (64, 72)]:  # off the patch, under two patches
        with pytest.raises(Exception):  # noqa: B017 (onnxruntime's and torch.export's own errors)
            run(torch.randn(1, 3, *size))
    assert "other sizes: " + {"onnx": "onnxruntime fails", "pt2": "the program raises"}[fmt] in capsys.readouterr().out


@pytest.mark.parametrize("task, said", [("distillation", "a student of a torchvision or Hugging Face teacher"),
                                        ("segmentation", "a segmentation run")])  # fmt: skip
def test_a_run_that_is_not_a_timm_classifier_is_refused_saying_what_it_is(tmp_path, task, said):
    """A torchvision or Hugging Face student was refused as 'a distillation run', yet timm students export."""
    from linvit.export import load_export_model

    (tmp_path / "config.json").write_text(json.dumps({"linvit": {"task": task}}))
    with pytest.raises(ValueError, match=f"{said}; export takes timm classifiers"):
        load_export_model(str(tmp_path), {}, None)
