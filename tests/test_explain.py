"""Interpretability tools: metrics on maps with known answers, Perron vectors, map shapes, spectral, ERF, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn as nn
from PIL import Image
from sklearn.metrics import average_precision_score, roc_auc_score

import linvit  # noqa: F401
from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist
from linvit.explain import (
    area_over_curve,
    box_auc,
    box_mask,
    effective_receptive_field,
    importance_maps,
    perturbation_curves,
    pointing_game,
    spectral_report,
)
from linvit.explain.run import transform_boxes
from linvit.ops import perron_vector_dense
from reference import left_perron_numpy


def test_box_auc_perfect_reversed_and_sklearn_agreement():
    boxes = [[[4, 6, 12, 20]], [[0, 0, 5, 5], [20, 20, 32, 32]]]
    masks = np.stack([box_mask(b, 32, 32) for b in boxes]).astype(float)
    perfect = box_auc(masks, boxes)
    assert perfect["box_roc_auc"] == 1.0 and perfect["box_pr_auc"] == 1.0
    assert box_auc(1 - masks, boxes)["box_roc_auc"] == 0.0
    rng = np.random.default_rng(0)
    maps = rng.random((2, 32, 32))
    ours = box_auc(maps, boxes)
    direct_roc = np.mean([roc_auc_score(masks[i].ravel(), maps[i].ravel()) for i in range(2)])
    direct_pr = np.mean([average_precision_score(masks[i].ravel(), maps[i].ravel()) for i in range(2)])
    assert ours["box_roc_auc"] == pytest.approx(direct_roc) and ours["box_pr_auc"] == pytest.approx(direct_pr)
    assert box_auc(np.ones((1, 8, 8)), [[[0, 0, 8, 8]]])["box_images"] == 0  # all-inside: undefined, skipped


def test_pointing_game_hits_misses_and_tolerance():
    m = np.zeros((3, 64, 64))
    m[0, 10, 10] = 1  # inside
    m[1, 60, 60] = 1  # far away
    m[2, 30, 30] = 1  # 10 px from the box edge
    boxes = [[[5, 5, 20, 20]]] * 3
    assert pointing_game(m, boxes, tolerance=15)["pointing_hits"] == [True, False, True]
    assert pointing_game(m, boxes, tolerance=5)["pointing_hits"] == [True, False, False]


class TopLeftPatchModel(nn.Module):
    """Two-class toy whose evidence is the mean of the top-left 8x8 patch."""

    def forward(self, x):
        s = 20 * x[:, :, :8, :8].mean(dim=(1, 2, 3))
        return torch.stack([s, -s], dim=1)


def test_morf_lerf_on_a_model_with_known_evidence():
    images = torch.rand(2, 3, 32, 32) * 0.1
    images[:, :, :8, :8] = 1.0
    right = torch.zeros(2, 4, 4)
    right[:, 0, 0] = 1.0
    targets = torch.zeros(2, dtype=torch.long)
    kw = dict(patch_size=8, steps=8, fill=torch.zeros(3))
    morf = perturbation_curves(TopLeftPatchModel(), images, targets, right, order="morf", **kw)
    lerf = perturbation_curves(TopLeftPatchModel(), images, targets, right, order="lerf", **kw)
    # MoRF removes the evidence at step 1 (p drops to 0.5); LeRF only at the last step
    assert area_over_curve(morf).mean().item() == pytest.approx(0.5, abs=1e-3)
    assert area_over_curve(lerf).mean().item() == pytest.approx(0.5 / 8, abs=1e-3)
    wrong = perturbation_curves(TopLeftPatchModel(), images, targets, -right, order="morf", **kw)
    assert area_over_curve(wrong).mean() < area_over_curve(morf).mean()
    with pytest.raises(ValueError, match="tile"):
        perturbation_curves(TopLeftPatchModel(), images, targets, torch.zeros(2, 3, 3), 8)


def test_area_over_curve_is_in_probability_units():
    curves = torch.tensor([[0.01, 0.10, 0.10], [0.90, 0.10, 0.10]])
    # a barely believed image (p_0 = 0.01) counts by how much p moved, not by a ratio to p_0
    assert area_over_curve(curves).tolist() == pytest.approx([-0.09, 0.80])


def test_dense_perron_matches_numpy():
    A = torch.rand(1, 1, 20, 20, dtype=torch.float64) ** 3
    ours = perron_vector_dense(A)[0, 0].numpy()
    assert np.allclose(ours, left_perron_numpy(A[0, 0].numpy()), atol=1e-8)


CASES = [
    ("linear_infvit_tiny_patch16_224", ["linear", "column", "katz", "perron"]),
    ("infvit_tiny_patch16_224", ["column", "katz", "perron"]),
    ("katz_infvit_tiny_patch16_224", ["katz", "perron", "column"]),
    ("deit_tiny_patch16_224", ["cls", "rollout", "grad"]),
    ("weightformer_tiny_patch16_224", ["grad"]),
]


@pytest.mark.parametrize("name,methods", CASES)
def test_maps_have_the_right_shape_and_leave_outputs_unchanged(name, methods):
    model = timm.create_model(name, num_classes=4, **({} if "weightformer" in name else {"dynamic_img_size": True}))
    model.eval()
    images = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        before = model(images)
    for method in methods:
        maps = importance_maps(model, images, method=method)
        assert maps.patch.shape == (2, 3, 4) and maps.image.shape == (2, 48, 64), method
        assert torch.isfinite(maps.patch).all()
        if maps.layers is not None:
            assert maps.layers.shape[0] == 2 and maps.layers.shape[2:] == (3, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(images), before)


def test_per_layer_selection_and_wrong_method():
    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=3).eval()
    images = torch.randn(1, 3, 32, 32)
    maps = importance_maps(model, images, method="linear")
    assert maps.layers.shape == (1, 12, 2, 2)
    torch.testing.assert_close(importance_maps(model, images, method="linear", layer=-1).patch, maps.layers[:, -1])
    # the linear importance is a distribution over all tokens (class token included) per head
    assert (maps.layers >= 0).all()
    with pytest.raises(ValueError, match="grad"):
        importance_maps(timm.create_model("weightformer_tiny_patch16_224"), images, method="linear")


def test_spectral_report_on_random_weights():
    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=3, depth=2).eval()
    report = spectral_report(model, torch.randn(2, 3, 64, 64))
    assert len(report["layers"]) == 2 and len(report["layers"][0]["cosine"]) == 3
    assert -1 <= report["mean"]["cosine"] <= 1
    assert 0 < report["mean"]["spectral_radius"] < 1
    assert 0 <= report["mean"]["truncation_gap"] < 1


def test_erf_share_and_static_variant():
    images = torch.randn(2, 3, 64, 64)
    dyn = effective_receptive_field(timm.create_model("weightformer_tiny_patch16_224"), images)
    assert dyn["map"].shape == (64, 64) and 0 <= dyn["outside_center_share"] <= 1
    assert dyn["display"].max() == pytest.approx(1.0)


def test_transform_boxes_through_timm_eval_transform():
    cfg = {"input_size": (3, 64, 64), "crop_pct": 1.0}
    assert transform_boxes([[4, 5, 20, 30]], (64, 64), cfg) == [[4, 5, 20, 30]]
    cfg = {"input_size": (3, 32, 32), "crop_pct": 1.0}
    assert transform_boxes([[4, 6, 20, 30]], (64, 64), cfg) == [[2, 3, 10, 15]]
    cfg = {"input_size": (3, 56, 56), "crop_pct": 0.875}  # resize to 64, crop the middle 56: offset 4
    assert transform_boxes([[0, 0, 64, 10]], (64, 64), cfg) == [[0, 0, 56, 6]]


def test_cli_explain_spectral_erf(tmp_path, capsys):
    data = tmp_path / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=1, per_class_val=1, clutter=1, progress=False)
    common = [
        "--data",
        str(data),
        "--img-size",
        "32",
        "--crop-pct",
        "1.0",
        "--limit",
        "6",
        "--model-kwargs",
        "patch_size=8",
    ]
    out = tmp_path / "explain"
    assert cli_main(["explain", "--model", "linear_infvit_tiny_patch16_224", *common, "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["images"] == 6 and metrics["images_with_boxes"] == 6 and metrics["method"] == "linear"
    assert 0 <= metrics["box_roc_auc"] <= 1 and len(metrics["morf_curve"]) == 11
    assert (out / "maps.png").stat().st_size > 2000 and (out / "curves.png").stat().st_size > 2000
    # a folder of VOC XML boxes works the same way
    voc = tmp_path / "voc"
    voc.mkdir()
    for rel, boxes in json.loads((data / "boxes.json").read_text()).items():
        x0, y0, x1, y1 = boxes[0]
        name = rel.replace("/", "_")
        (data / rel).rename(data / rel.rsplit("/", 1)[0] / name)
        (voc / f"{name}.xml").write_text(
            f"<annotation><filename>{name}</filename><object><bndbox><xmin>{x0 + 1}</xmin><ymin>{y0 + 1}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object></annotation>"
        )
    out2 = tmp_path / "explain_voc"
    assert (
        cli_main(
            [
                "explain",
                "--model",
                "linear_infvit_tiny_patch16_224",
                *common,
                "--boxes",
                str(voc),
                "--output",
                str(out2),
            ]
        )
        == 0
    )
    assert json.loads((out2 / "metrics.json").read_text())["box_roc_auc"] == pytest.approx(metrics["box_roc_auc"])
    assert (
        cli_main(
            ["spectral", "--model", "linear_infvit_tiny_patch16_224", *common, "--output", str(tmp_path / "s.json")]
        )
        == 0
    )
    assert "cosine" in capsys.readouterr().out
    assert (
        cli_main(["erf", "--model", "weightformer_tiny_patch16_224", *common, "--output", str(tmp_path / "erf")]) == 0
    )
    assert (tmp_path / "erf" / "erf.png").is_file()
    assert (
        cli_main(
            [
                "explain",
                "--model",
                "weightformer_tiny_patch16_224",
                *common,
                "--method",
                "linear",
                "--output",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_spectral_radius_is_the_perron_root():
    from linvit.layers import LinearInfSAAttention

    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=3, depth=1).eval()
    images = torch.randn(1, 3, 32, 32)
    report = spectral_report(model, images)
    mixer = next(m for m in model.modules() if isinstance(m, LinearInfSAAttention))
    from linvit.explain.maps import capture_inputs, mixer_operator

    (x,), _ = capture_inputs(model, [mixer], images)
    A = mixer_operator(mixer, x)[0]
    expected = (mixer.gamma.double() * torch.linalg.eigvals(A).abs().amax(-1)).tolist()
    assert report["layers"][0]["spectral_radius"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", ["infvit_tiny_patch16_224", "katz_infvit_tiny_patch16_224"])
def test_explained_operator_is_the_one_the_forward_applies(name):
    """The maps and spectra read A^ through explain.maps.mixer_operator; rebuilding each layer's output
    from that matrix (one hop for pure InfSA, the whole Katz series for Katz-InfSA) gives the layer's output."""
    from linvit.explain.maps import attention_mixers, capture_inputs, mixer_operator
    from linvit.ops import katz_kernel

    model = timm.create_model(name, num_classes=3, depth=2).eval()
    images = torch.randn(2, 3, 48, 64)
    mixers = attention_mixers(model, "katz")
    inputs, _ = capture_inputs(model, mixers, images)
    for mixer, x in zip(mixers, inputs, strict=True):
        A = mixer_operator(mixer, x)
        gamma = mixer.gamma.double()
        hops = katz_kernel(A, gamma) if name.startswith("katz") else gamma[:, None, None] * A
        _, _, v = mixer.project_qkv(x)
        with torch.no_grad():
            rebuilt = mixer.merge_heads((hops @ v.double()).float())
            torch.testing.assert_close(rebuilt, mixer(x), rtol=1e-4, atol=1e-5)


def test_explained_linear_importance_pools_the_layer_output():
    """Linear-InfSA's map is the importance vector a whose pooled value gamma * sum_j a_j v_j every token gets."""
    from linvit.explain.maps import capture_inputs, layer_scores

    model = timm.create_model("linear_infvit_tiny_patch16_224", num_classes=3, depth=1).eval()
    images = torch.randn(2, 3, 48, 64)
    mixer = model.blocks[0].attn
    (x,), _ = capture_inputs(model, [mixer], images)
    a = mixer.importance(x)  # (B, H, N)
    _, _, v = mixer.project_qkv(x)
    with torch.no_grad():
        pooled = mixer.gamma[:, None] * torch.einsum("bhn,bhnd->bhd", a, v)
        rebuilt = mixer.merge_heads(pooled[:, :, None].expand_as(v).contiguous())
        torch.testing.assert_close(rebuilt, mixer(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(layer_scores(mixer, x, "linear"), a.double().mean(1))


def _tiny(name: str, **kwargs) -> nn.Module:
    args = dict(img_size=32, patch_size=4, depth=1, embed_dim=16, num_heads=2, num_classes=3)
    return timm.create_model(name, **dict(args, **kwargs)).eval()


@pytest.mark.parametrize(
    "name, methods",
    [
        ("linear_infvit_tiny_patch16_224", ("linear", "grad")),
        ("katz_infvit_tiny_patch16_224", ("katz", "perron", "column")),
    ],
)
def test_maps_above_the_token_chunking_threshold(name, methods):
    """1024 px at patch 4 is 65,536 tokens, where inference runs token-chunked (the hooks saw nothing before)."""
    from linvit.models._chunking import AUTO_CHUNK_MIN_TOKENS

    model = _tiny(name)
    images = torch.randn(1, 3, 1024, 1024)
    assert model.token_chunk_for(images) is None  # autograd on here
    with torch.no_grad():
        assert model.token_chunk_for(images) is not None and 256 * 256 >= AUTO_CHUNK_MIN_TOKENS
    for method in methods:
        maps = importance_maps(model, images, method=method)
        assert maps.patch.shape == (1, 256, 256) and torch.isfinite(maps.patch).all()
        assert maps.patch.sum() > 0
    assert model.token_chunk == "auto"  # restored


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        ("infvit_tiny_patch16_224", {}, "column"),
        ("vit_4l_patch16_224", {}, "grad"),
        ("weightformer_tiny_patch16_224", {"depth": 2, "embed_dim": 32, "dynamic_interval": 1}, "grad"),
    ],
)
def test_every_familys_default_map_works_above_the_chunking_threshold(name, kwargs, expected, monkeypatch):
    """The default method of each remaining family above both thresholds (dense maps' bytes, token chunking),
    lowered to 4,096 tokens so that the quadratic forwards stay quick: dense maps give way to ones that fit."""
    from linvit.explain import maps as maps_module
    from linvit.models import _chunking

    monkeypatch.setattr(maps_module, "DENSE_MAP_MAX_BYTES", maps_module._dense_bytes(1, 1, 4096) - 1)
    monkeypatch.setattr(_chunking, "AUTO_CHUNK_MIN_TOKENS", 4096)
    monkeypatch.setattr(_chunking, "AUTO_TOKEN_CHUNK", 1024)  # several chunks, as at full size
    args = dict(img_size=32, patch_size=4, num_classes=3)
    args.update(kwargs or dict(depth=1, embed_dim=16, num_heads=2))
    model = timm.create_model(name, **args).eval()
    maps = importance_maps(model, torch.randn(1, 3, 256, 256), upsample=False)
    assert maps.method == expected and maps.patch.shape == (1, 64, 64) and torch.isfinite(maps.patch).all()


def test_maps_under_chunking_equal_unchunked(monkeypatch):
    """The capture takes the whole-tensor path, so chunking never changes a map (column: query blocks)."""
    from linvit.models import _chunking

    model = _tiny("linear_infvit_tiny_patch16_224")
    images = torch.randn(2, 3, 48, 40)
    expected = {m: importance_maps(model, images, method=m).patch for m in ("linear", "column", "katz")}
    monkeypatch.setattr(_chunking, "AUTO_CHUNK_MIN_TOKENS", 16)
    monkeypatch.setattr(_chunking, "AUTO_TOKEN_CHUNK", 7)
    with torch.no_grad():
        assert model.token_chunk_for(images) == 7
    for method, patch in expected.items():
        torch.testing.assert_close(importance_maps(model, images, method=method).patch, patch)


def test_column_sums_equal_the_dense_operators():
    from linvit.ops import infsa_operator, katz_operator
    from linvit.ops.infsa import infsa_column_sums
    from linvit.ops.katz import katz_column_sums

    q, k = torch.randn(2, 3, 37, 8, dtype=torch.float64), torch.randn(2, 3, 37, 8, dtype=torch.float64)
    dense = infsa_operator(q, k).sum(-2)
    for block in (1, 5, 37, 100):
        torch.testing.assert_close(infsa_column_sums(q, k, block_size=block), dense, rtol=1e-12, atol=1e-14)
    for kind in ("relu", "elu+1"):
        expected = katz_operator(q, k, feature_map=kind).sum(-2)
        torch.testing.assert_close(katz_column_sums(q, k, feature_map=kind), expected, rtol=1e-12, atol=1e-14)


def test_dense_maps_refuse_sizes_they_cannot_hold():
    from linvit.explain import default_method

    model = _tiny("infvit_tiny_patch16_224")
    images = torch.randn(1, 3, 1024, 1024)
    assert default_method(model) == "katz" and default_method(model, 256 * 256) == "column"
    with pytest.raises(ValueError, match="dense 65537 x 65537 float64 .* use method='column'"):
        importance_maps(model, images, method="katz")


@pytest.fixture(scope="module")
def digits_and_run(tmp_path_factory):
    """Cluttered digits (class folders "0".."9") and a one-epoch run folder trained on them."""
    root = tmp_path_factory.mktemp("explain_run")
    data = root / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=1, per_class_val=1, clutter=1, progress=False)
    run = root / "run"
    argv = ["train", "--data", str(data), "--model", "linear_infvit_tiny_patch16_224", "--output", str(run)]
    argv += ["--img-size", "32", "--crop-pct", "1.0", "--workers", "0", "--epochs", "1", "--batch-size", "4"]
    assert cli_main([*argv, "--no-progress", "--model-kwargs", "patch_size=8", "depth=1"]) == 0
    return data, run


def test_explain_takes_a_run_folder_and_matches_classes_by_name(digits_and_run, tmp_path):
    data, run = digits_and_run
    one_class = tmp_path / "sevens" / "val" / "7"
    one_class.mkdir(parents=True)
    for image in sorted((data / "val" / "7").iterdir()):
        (one_class / image.name).write_bytes(image.read_bytes())
    out = tmp_path / "out"
    assert (
        cli_main(["explain", "--checkpoint", str(run), "--data", str(tmp_path / "sevens"), "--output", str(out)]) == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["labelled"] and metrics["model"] == "linear_infvit_tiny_patch16_224"  # from the run
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert {r["target"] for r in rows} == {7}  # the folder "7" is the run's class "7", not class 0 of one
    assert metrics["accuracy"] == pytest.approx(100 * sum(r["class"] == 7 for r in rows) / len(rows))
    assert rows[0]["label"] == str(rows[0]["class"]) and rows[0]["path"].endswith(".png")


def test_explain_on_unlabelled_pictures_gives_maps_only(tmp_path, capsys):
    import sklearn.datasets

    photos = Path(sklearn.datasets.__file__).parent / "images"
    out = tmp_path / "out"
    argv = ["explain", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1"]
    assert cli_main([*argv, "--data", str(photos), "--img-size", "64", "96", "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert not metrics["labelled"] and metrics["unlabelled_because"] == "the pictures are not in class folders"
    assert "accuracy" not in metrics and "morf_aoc" not in metrics and metrics["box_roc_auc"] is None
    assert not (out / "curves.png").exists() and "maps only" in capsys.readouterr().out
    saved = np.load(out / "maps.npz")
    assert saved["maps"].shape == (2, 64, 96)  # the non-square size, not a square crop
    assert [Path(p).name for p in saved["paths"]] == ["china.jpg", "flower.jpg"]


def test_a_one_output_model_scores_nothing(tmp_path):
    folder = tmp_path / "data" / "val" / "cat"
    folder.mkdir(parents=True)
    Image.new("RGB", (40, 30), (90, 20, 200)).save(folder / "a.png")
    out = tmp_path / "out"
    argv = ["explain", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1", "num_classes=1"]
    assert cli_main([*argv, "--data", str(tmp_path / "data"), "--img-size", "32", "--output", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "accuracy" not in metrics and "one output" in metrics["unlabelled_because"]


# every command that takes a run folder and an input size: (argv after the run and the data, what it writes)
SIZED_COMMANDS = {
    "predict": (["--img-size", "48", "64", "--no-progress"], "preds.jsonl"),
    "predict --model": (["--img-size", "48", "64", "--no-progress"], "preds.jsonl"),
    "explain": (["--img-size", "48", "64", "--limit", "2"], "out"),
    "spectral": (["--img-size", "48", "64", "--limit", "2"], "spectral.json"),
    "erf": (["--img-size", "48", "64", "--limit", "2"], "out"),
    "eval": (["--img-size", "48", "--workers", "0", "--no-progress"], "eval.json"),
}


@pytest.mark.parametrize("command", SIZED_COMMANDS)
def test_every_command_runs_a_run_folder_at_another_size(command, digits_and_run, tmp_path):
    """Issue 39 item 7: the run's weights (32 px, patch 8) load at the run's size and are resampled to 48 x 64."""
    data, run = digits_and_run
    extra, written = SIZED_COMMANDS[command]
    out = tmp_path / written
    name, *rest = command.split()
    if name == "predict":
        model = ["--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "patch_size=8", "depth=1"]
        weights = str(run / "model.safetensors") if rest else str(run)
        argv = [name, str(data / "val" / "3"), "--checkpoint", weights, *(model if rest else []), "--output", str(out)]
    else:
        argv = [name, "--checkpoint", str(run), "--data", str(data), "--split", "val"]
        argv += ["--json" if name == "eval" else "--output", str(out)]
    assert cli_main([*argv, *extra]) == 0
    assert out.exists()
    if name == "predict":
        assert {tuple(json.loads(line)["size"]) for line in out.read_text().splitlines()} == {(48, 64)}
    if name == "explain":
        assert np.load(out / "maps.npz")["maps"].shape[1:] == (48, 64)


def test_a_run_loaded_for_another_size_is_the_run_resampled(digits_and_run):
    """The model explain builds for --img-size 48 64 is the run itself: the same outputs as linvit.load_run."""
    from linvit.explain.inputs import AnalysisConfig, build_model

    _, run = digits_and_run
    args = AnalysisConfig(checkpoint=str(run), model=None, model_kwargs={}, img_size=[48, 64], crop_pct=None, seed=0)
    model, names = build_model(args, None)
    x = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), linvit.load_run(run)(x), rtol=0, atol=0)
    assert names == [str(i) for i in range(10)]


def test_the_deletion_figure_and_the_claims_agree_on_which_way_is_better():
    """Issue 39 item 15: a faithful map has the lower MoRF curve and the higher MoRF-AOC; the figure's titles
    and the claims table must both say so (the figure said "lower is better" beside "MoRF-AOC, higher better")."""
    from linvit.reproduce.figures import LERF_TITLE, MORF_TITLE

    images = torch.rand(2, 3, 32, 32) * 0.1
    images[:, :, :8, :8] = 1.0
    right = torch.zeros(2, 4, 4)
    right[:, 0, 0] = 1.0
    kw = dict(patch_size=8, steps=8, fill=torch.zeros(3))
    targets = torch.zeros(2, dtype=torch.long)
    good, bad = (perturbation_curves(TopLeftPatchModel(), images, targets, m, **kw) for m in (right, -right))
    assert (good[:, 1:] <= bad[:, 1:]).all() and area_over_curve(good).mean() > area_over_curve(bad).mean()
    kw["order"] = "lerf"
    good, bad = (perturbation_curves(TopLeftPatchModel(), images, targets, m, **kw) for m in (right, -right))
    assert (good[:, 1:] >= bad[:, 1:]).all() and area_over_curve(good).mean() < area_over_curve(bad).mean()
    assert "drop fast: higher MoRF-AOC" in MORF_TITLE and "stay up: lower LeRF-AOC" in LERF_TITLE


def test_boxes_that_match_no_picture_are_a_warning_with_a_count(tmp_path, capsys):
    """Issue 39 item 15: --boxes whose keys name none of the pictures leave null box scores, and say so."""
    folder = tmp_path / "pics"
    folder.mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (32, 32), (90, 20, 200)).save(folder / name)
    boxes = tmp_path / "boxes.json"
    boxes.write_text(json.dumps({"elsewhere/a.png": [[0, 0, 8, 8]], "c.png": [[1, 1, 9, 9]]}))
    out = tmp_path / "out"
    argv = ["explain", "--model", "linear_infvit_tiny_patch16_224", "--model-kwargs", "depth=1", "--img-size", "32"]
    assert cli_main([*argv, "--data", str(folder), "--boxes", str(boxes), "--output", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["box_roc_auc"] is None
    err = capsys.readouterr().err
    assert "0 of 2 pictures have boxes" in err and str(boxes) in err and "2 entries" in err


def test_explain_takes_the_digits_spec_and_reads_what_the_digit_folder_holds(digits_and_run, tmp_path):
    """Issue 45.9: --data digits:... as train and eval take it, with the canvases' labels and ink boxes; the
    numbers equal those on the folder `linvit data digits` writes of the same canvases."""
    from linvit.data.digit_tasks import write_digit_folder

    _, run = digits_and_run
    spec = "digits:digit,canvas=32,clutter=1"
    folder = tmp_path / "folder"
    write_digit_folder(folder, canvas=32, clutter=1, splits=("val",), progress=False)
    argv = ["explain", "--checkpoint", str(run), "--limit", "10"]
    assert cli_main([*argv, "--data", spec, "--output", str(tmp_path / "spec")]) == 0
    assert cli_main([*argv, "--data", str(folder), "--output", str(tmp_path / "folder_out")]) == 0
    spec_metrics = json.loads((tmp_path / "spec" / "metrics.json").read_text())
    folder_metrics = json.loads((tmp_path / "folder_out" / "metrics.json").read_text())
    assert spec_metrics["labelled"] and spec_metrics["images_with_boxes"] == 10
    for key in ("accuracy", "morf_aoc", "box_roc_auc", "pointing_game"):
        assert spec_metrics[key] == pytest.approx(folder_metrics[key], abs=1e-5), key
    rows = [json.loads(line) for line in (tmp_path / "spec" / "predictions.jsonl").read_text().splitlines()]
    assert rows[0]["path"].startswith(f"{spec}#val/")
    from linvit.explain.run import ExplainConfig, run_explain

    with pytest.raises(ValueError, match=r"--boxes matches pictures by their files; --data digits:\S+ has none"):
        run_explain(ExplainConfig(data=spec, checkpoint=str(run), boxes="b.json", output=str(tmp_path / "x")))


def test_the_figures_show_a_seeded_class_spread_sample(digits_and_run, tmp_path):
    """Issue 45.10: on a class-sorted split the first 8 maps (maps.png, maps.npz) show 8 classes, the same for the
    same seed; a unit check of the order on a sorted list and without classes."""
    from linvit.explain.inputs import spread_order

    classes = [str(c) for c in range(10) for _ in range(6)]
    order = spread_order(classes, seed=0)
    assert sorted(order) == list(range(60)) and len({classes[k] for k in order[:10]}) == 10
    assert order == spread_order(classes, seed=0) and order != spread_order(classes, seed=1)
    assert sorted(spread_order([None] * 7, 3)) == list(range(7))
    _, run = digits_and_run
    argv = ["explain", "--checkpoint", str(run), "--data", "digits:digit,canvas=32,clutter=1", "--limit", "40"]

    def first_targets(name, seed):
        assert cli_main([*argv, "--seed", str(seed), "--output", str(tmp_path / name)]) == 0
        saved = np.load(tmp_path / name / "maps.npz")
        rows = [json.loads(line) for line in (tmp_path / name / "predictions.jsonl").read_text().splitlines()]
        assert [r["path"] for r in rows[:8]] == saved["paths"].tolist()
        return [r["target"] for r in rows[:8]], saved["paths"].tolist()

    targets, paths = first_targets("a", 0)
    assert len(set(targets)) == 8
    assert first_targets("b", 0) == (targets, paths) and first_targets("c", 1)[1] != paths


def test_export_at_another_size_says_the_runs_own_on_stderr(digits_and_run, tmp_path, capsys):
    """An exported file at another size than the run trained at runs, at another accuracy: said, as eval does."""
    _, run = digits_and_run
    argv = ["export", "--model", str(run), "--output", str(tmp_path / "run.pt2")]  # .onnx needs .[export]
    assert cli_main([*argv, "--img-size", "48"]) == 0
    assert f"linvit export: note: {run} was trained at 32 px and is exported at 48 px" in capsys.readouterr().err
    assert cli_main(argv) == 0
    assert "trained at" not in capsys.readouterr().err


def test_eval_at_another_size_says_the_runs_own_on_stderr(digits_and_run, capsys):
    """Issue 45.11: --img-size other than the run's still runs, with one line naming the size it was trained at."""
    data, run = digits_and_run
    argv = ["eval", "--checkpoint", str(run), "--data", str(data), "--workers", "0", "--no-progress"]
    assert cli_main([*argv, "--img-size", "48"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"linvit eval: note: {run} was trained at 32 px and is evaluated at 48 px (position embeddings resampled; "
        "accuracy at another size is not the run's)"
    ]
    for same in ([], ["--img-size", "32"]):
        assert cli_main([*argv, *same]) == 0
        assert "trained at" not in capsys.readouterr().err
