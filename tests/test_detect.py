"""Detection: torchvision detectors on every backbone, the COCO reader, COCO scoring, train/eval end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import linvit
from linvit.cli import main as cli_main
from linvit.data.cluttered_mnist import build_detection_set
from linvit.detect import CocoDetection, coco_stats, create_detector, to_coco_results

TINY = dict(min_size=64, max_size=96, anchor_base=8, pyramid_channels=16)
FAMILIES = {
    "deit_tiny_patch16_224": dict(depth=1, patch_size=8),
    "infvit_tiny_patch16_224": dict(depth=1, patch_size=8),
    "linear_infvit_tiny_patch16_224": dict(depth=1, patch_size=8),
    "katz_infvit_tiny_patch16_224": dict(depth=1, patch_size=8),
    "weightformer_tiny_patch16_224": dict(depth=2, patch_size=8, dynamic_interval=1),
}


def _targets(masks: bool = False):
    t = {"boxes": torch.tensor([[8.0, 10.0, 30.0, 40.0], [40.0, 20.0, 60.0, 50.0]]), "labels": torch.tensor([1, 3])}
    if masks:
        t["masks"] = torch.zeros(2, 64, 80, dtype=torch.uint8)
        t["masks"][0, 10:40, 8:30] = 1
        t["masks"][1, 20:50, 40:60] = 1
    return [t]


@pytest.mark.parametrize("backbone", sorted(FAMILIES))
def test_every_family_detects_with_finite_losses(backbone):
    torch.manual_seed(0)
    model = create_detector(backbone, 4, "fasterrcnn", **TINY, **FAMILIES[backbone])
    image = torch.rand(3, 64, 80)  # not square, not a multiple of the pyramid's divisor
    losses = model.train()([image], _targets())
    assert {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"} == losses.keys()
    assert all(torch.isfinite(v) for v in losses.values())
    (out,) = model.eval()([image])
    assert out["boxes"].shape[1] == 4 and out["boxes"].shape[0] == out["scores"].shape[0] == out["labels"].shape[0]


@pytest.mark.parametrize("kind", ["retinanet", "maskrcnn"])
def test_retinanet_and_mask_rcnn(kind):
    torch.manual_seed(0)
    model = create_detector("linear_infvit_tiny_patch16_224", 4, kind, **TINY, depth=1, patch_size=8)
    losses = model.train()([torch.rand(3, 64, 80)], _targets(masks=kind == "maskrcnn"))
    assert all(torch.isfinite(v) for v in losses.values()) and (kind != "maskrcnn" or "loss_mask" in losses)
    (out,) = model.eval()([torch.rand(3, 64, 80)])
    assert kind != "maskrcnn" or out["masks"].shape[-2:] == (64, 80)


def test_a_few_steps_lower_the_loss():
    torch.manual_seed(0)
    model = create_detector("katz_infvit_tiny_patch16_224", 4, "fasterrcnn", **TINY, depth=1, patch_size=8).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    image, targets = torch.rand(3, 64, 80), _targets()
    losses = []
    for _ in range(4):
        torch.manual_seed(1)  # the same proposal sampling every step
        loss = sum(model([image], targets).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_backbone_checkpoint_and_grad_checkpointing_reach_the_backbone(tmp_path):
    from safetensors.torch import save_file

    from linvit.models import create_variant

    classifier = create_variant("linear_infvit_tiny_patch16_224", num_classes=10, depth=1, patch_size=8)
    save_file(classifier.state_dict(), tmp_path / "w.safetensors")
    model = create_detector(
        "linear_infvit_tiny_patch16_224",
        4,
        **TINY,
        depth=1,
        patch_size=8,
        backbone_checkpoint=str(tmp_path / "w.safetensors"),
        grad_checkpointing=True,
    )
    body = model.backbone.body
    assert body.grad_checkpointing and torch.equal(body.blocks[0].attn.qkv.weight, classifier.blocks[0].attn.qkv.weight)
    losses = model.train()([torch.rand(3, 64, 80)], _targets())
    sum(losses.values()).backward()  # recomputed blocks still give the backbone gradients
    assert body.blocks[0].attn.qkv.weight.grad is not None


def test_bad_detector_arguments():
    with pytest.raises(ValueError, match="unknown detector"):
        create_detector("deit_tiny_patch16_224", 4, "yolo")
    with pytest.raises(ValueError, match="background"):
        create_detector("deit_tiny_patch16_224", 1)


# the COCO reader ---------------------------------------------------------------------------------------------


def _coco(tmp_path, annotations, images=None, categories=None):
    from PIL import Image

    images = images or [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}]
    for info in images:
        Image.new("RGB", (info["width"], info["height"])).save(tmp_path / info["file_name"])
    categories = categories or [{"id": 7, "name": "cat"}, {"id": 3, "name": "dog"}]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def _ann(i, bbox, category=7, image=1, crowd=0):
    return {"id": i, "image_id": image, "category_id": category, "bbox": bbox, "area": 1.0, "iscrowd": crowd}


def test_coco_reader_maps_categories_clips_and_counts_what_it_skips(tmp_path):
    images = [{"id": 1, "file_name": "a.png", "width": 50, "height": 40}]
    images.append({"id": 2, "file_name": "b.png", "width": 30, "height": 30})  # no annotations: kept
    anns = [
        _ann(1, [10, 5, 20, 10], category=3),
        _ann(2, [40, 30, 20, 20]),  # partly outside: clipped to [40, 30, 50, 40]
        _ann(3, [10, 10, 0, 5]),  # degenerate
        _ann(4, [60, 50, 5, 5]),  # outside the image
        _ann(5, [0, 0, 10, 10], crowd=1),  # crowd: left out of training targets
    ]
    ann_file = _coco(tmp_path, anns, images)
    train = CocoDetection(tmp_path, ann_file, train=True, hflip=0)
    assert len(train) == 2 and train.num_classes == 3 and train.class_names == ["dog", "cat"]
    image, target = train[0]
    assert image.shape == (3, 40, 50) and target["labels"].tolist() == [1, 2]  # dog (id 3) -> 1, cat (id 7) -> 2
    torch.testing.assert_close(target["boxes"], torch.tensor([[10.0, 5.0, 30.0, 15.0], [40.0, 30.0, 50.0, 40.0]]))
    assert dict(train.skipped) == {"degenerate": 1, "outside the image": 1, "crowd": 1}
    assert train[1][1]["boxes"].shape == (0, 4)
    evaluation = CocoDetection(tmp_path, ann_file, train=False)
    assert evaluation[0][1]["iscrowd"].tolist() == [0, 0, 1]  # COCOeval needs the crowd regions


def test_coco_reader_errors(tmp_path):
    with pytest.raises(ValueError, match="category id 9"):
        CocoDetection(tmp_path, _coco(tmp_path, [_ann(1, [1, 1, 5, 5], category=9)]))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"images": [], "annotations": [], "categories": [{"id": 1, "name": "x"}]}))
    with pytest.raises(ValueError, match="no images"):
        CocoDetection(tmp_path, empty)
    with pytest.raises(ValueError, match="not found"):
        CocoDetection(tmp_path, tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not a COCO instances file"):
        CocoDetection(tmp_path, tmp_path / "broken.json")


def test_ground_truth_as_detections_scores_100_through_the_category_mapping(tmp_path):
    anns = [_ann(1, [10, 5, 20, 10], category=3), _ann(2, [25, 20, 15, 15])]
    data = CocoDetection(tmp_path, _coco(tmp_path, anns))
    _, target = data[0]
    output = {"boxes": target["boxes"], "labels": target["labels"], "scores": torch.ones(2)}
    results = to_coco_results(output, target["image_id"], data.category_ids)
    assert [r["category_id"] for r in results] == [3, 7] and results[0]["bbox"] == [10.0, 5.0, 20.0, 10.0]
    stats, summary = coco_stats(data.coco, results)
    assert stats["AP"] == pytest.approx(100.0) and "Average Precision" in summary
    # scoring leaves the results in COCO's results format (loadRes adds area, id, iscrowd, a box polygon)
    assert all(r.keys() == {"image_id", "category_id", "bbox", "score"} for r in results)
    wrong = [{**r, "category_id": 10 - r["category_id"]} for r in results]  # labels swapped: nothing matches
    assert coco_stats(data.coco, wrong)[0]["AP"] == 0.0


def test_embedded_masks_scored_as_ground_truth_give_mask_ap_100(det_data):
    data = CocoDetection(det_data / "val", det_data / "annotations" / "instances_val.json", masks=True)
    results = []
    for image, target in (data[i] for i in range(len(data))):
        assert target["masks"].shape == (len(target["boxes"]), *image.shape[-2:])
        output = {k: target[k] for k in ("boxes", "labels")}
        output.update(scores=torch.ones(len(target["boxes"])), masks=target["masks"][:, None].float())
        results += to_coco_results(output, target["image_id"], data.category_ids)
    assert coco_stats(data.coco, results, "segm")[0]["AP"] == pytest.approx(100.0)


# train and eval end to end ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def det_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    build_detection_set(root, digits_per_image=2, canvas=48, per_class_train=2, per_class_val=1, clutter=1)
    return root / "detection"


ARGS = ["--model", "linear_infvit_tiny_patch16_224", "--min-size", "48", "--max-size", "64", "--anchor-base", "8"]
ARGS += ["--pyramid-channels", "16", "--workers", "0", "--device", "cpu", "--model-kwargs", "patch_size=8", "depth=1"]


def test_detect_train_resume_eval_and_rescoring(det_data, tmp_path):
    run = tmp_path / "run"
    train = ["detect", "train", "--data", str(det_data), "--train-split", "train", "--val-split", "val"]
    train += ["--output", str(run), "--batch-size", "2", "--lr", "1e-3", "--no-progress", "--warmup-epochs", "0"]
    assert cli_main([*train, "--epochs", "1", *ARGS]) == 0
    assert cli_main([*train, "--epochs", "2", "--resume", "auto", *ARGS]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1] and {"val_AP", "val_AP50", "train_loss"} <= rows[-1].keys()
    assert json.loads((run / "config.json").read_text())["linvit"]["task"] == "detection"
    reloaded = linvit.load_run(run)  # one call rebuilds the detector from the run (timm's local-dir cannot)
    assert type(reloaded).__name__ == "FasterRCNN" and not reloaded.training
    assert reloaded.transform.min_size == (48,) and reloaded.transform.max_size == 64
    with torch.no_grad():
        assert {"boxes", "labels", "scores"} <= reloaded([torch.rand(3, 48, 64)])[0].keys()

    out = tmp_path / "eval"
    evaluate = ["detect", "eval", "--data", str(det_data), "--split", "val", "--checkpoint", str(run)]
    assert cli_main([*evaluate, "--out", str(out), "--workers", "0", "--device", "cpu"]) == 0  # model from args.yaml
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["AP"] == pytest.approx(rows[-1]["val_AP"]) and metrics["model"] == "linear_infvit_tiny_patch16_224"
    assert (metrics["min_size"], metrics["max_size"], metrics["anchor_base"]) == (48, 64, 8)  # the run's detector
    data = CocoDetection(det_data / "val", det_data / "annotations" / "instances_val.json")
    rescored, _ = coco_stats(data.coco, json.loads((out / "detections.json").read_text()))
    assert rescored["AP"] == pytest.approx(metrics["AP"]) and rescored["AR100"] == pytest.approx(metrics["AR100"])
    _eval_takes_the_runs_split_and_refuses_its_categories_renamed(det_data, run, tmp_path, metrics)

    # torchrun with 2 processes scores the same detections
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "linvit"]
    cmd += [*evaluate, "--out", str(tmp_path / "eval2"), "--workers", "0", "--device", "cpu"]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "eval2" / "metrics.json").read_text())["AP"] == pytest.approx(metrics["AP"])


def _eval_takes_the_runs_split_and_refuses_its_categories_renamed(det_data, run, tmp_path, metrics):
    """No --split: the run's val split (it looked for val2017). A category renamed in the json: one line (the
    detector's boxes were written under the new id as if it were the class it learned)."""
    import contextlib
    import io

    base = ["detect", "eval", "--data", str(det_data), "--checkpoint", str(run), "--workers", "0", "--device", "cpu"]
    assert cli_main([*base, "--output", str(tmp_path / "e3")]) == 0
    assert json.loads((tmp_path / "e3" / "metrics.json").read_text())["AP"] == pytest.approx(metrics["AP"])
    coco = json.loads((det_data / "annotations" / "instances_val.json").read_text())
    last = max(c["id"] for c in coco["categories"])
    for item in coco["categories"] + coco["annotations"]:
        key = "id" if "name" in item else "category_id"
        item[key] = 99 if item[key] == last else item[key]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(coco))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(
            [*base, "--ann-file", str(renamed), "--images", str(det_data / "val"), "--output", str(tmp_path)]
        )
    assert code == 2 and "category ids" in err.getvalue() and "the run's" in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1 and not (tmp_path / "detections.json").exists()


def test_detect_trains_under_fsdp_as_under_ddp(det_data, tmp_path):
    """--strategy fsdp on the detector (its backbone's blocks and the root sharded): the same losses as ddp."""
    from pathlib import Path

    def train(strategy: str) -> list[str]:
        args = ["detect", "train", "--data", str(det_data), "--train-split", "train", "--val-split", "val"]
        args += ["--output", str(tmp_path / strategy), "--batch-size", "2", "--lr", "1e-3", "--no-progress"]
        return [*args, "--warmup-epochs", "0", "--epochs", "2", "--strategy", strategy, *ARGS]

    runner = Path(__file__).parent / "fixtures" / "torchrun_commands.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(runner)]
    result = subprocess.run([*cmd, json.dumps([train("ddp"), train("fsdp")])], env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    ddp, fsdp = (
        [json.loads(x) for x in (tmp_path / s / "metrics.jsonl").read_text().splitlines()] for s in ("ddp", "fsdp")
    )
    assert [r["train_loss"] for r in fsdp] == pytest.approx([r["train_loss"] for r in ddp], rel=1e-5)
    assert ddp[-1]["train_loss"] < ddp[0]["train_loss"]


def test_detect_cli_errors_are_one_line(det_data, tmp_path, capsys):
    base = ["detect", "eval", "--data", str(det_data), "--out", str(tmp_path), *ARGS]
    assert cli_main([*base, "--split", "nosuchsplit"]) == 2
    assert "instances_nosuchsplit.json" in capsys.readouterr().err
    assert cli_main([*base, "--ann-file", str(tmp_path / "x.json")]) == 2
    assert "annotation file not found" in capsys.readouterr().err


def test_bench_measures_the_whole_detector_at_the_coco_aspect():
    from linvit.bench.point import measure

    spec = dict(model="linear_infvit_tiny_patch16_224", res=64, task="detect", iters=1, warmup=0)
    record = measure({**spec, "model_kwargs": dict(depth=1, patch_size=8, pyramid_channels=16)})
    assert record["status"] == "ok" and record["tokens"] == (64 // 8) * (107 // 8)  # 64 x 107 (1333 / 800)
    with pytest.raises(ValueError, match="inference only"):
        measure({**spec, "mode": "train"})


def _rotated_coco(tmp_path, annotated: tuple[int, int]):
    """One picture stored 50 x 30 whose EXIF orientation (6) turns it to 30 x 50, annotated at `annotated`."""
    from PIL import Image

    ann_file = _coco(tmp_path, [_ann(1, [2, 30, 10, 10])], [{"id": 1, "file_name": "a.jpg", "width": 50, "height": 30}])
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    pixels = np.full((30, 50, 3), 220, np.uint8)
    pixels[:, :25] = 20  # dark left half as stored: the top half upright
    Image.fromarray(pixels).save(tmp_path / "a.jpg", exif=exif, quality=100)
    data = json.loads(ann_file.read_text())
    data["images"][0].update(width=annotated[0], height=annotated[1])
    ann_file.write_text(json.dumps(data))
    return CocoDetection(tmp_path, ann_file, hflip=0)


def test_coco_pictures_are_read_upright_as_predict_reads_them(tmp_path):
    image, target = _rotated_coco(tmp_path, annotated=(30, 50))[0]
    assert image.shape == (3, 50, 30)
    assert image[:, :25].mean() < image[:, 25:].mean()  # the dark half on top
    assert target["boxes"].tolist() == [[2.0, 30.0, 12.0, 40.0]]  # inside the upright picture, not clipped


def test_coco_annotations_on_a_rotated_pictures_stored_pixels_or_another_size_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"stored 50 x 30 pixels, but its EXIF orientation turns it to 30 x 50"):
        _rotated_coco(tmp_path, annotated=(50, 30))[0]
    with pytest.raises(ValueError, match=r"annotations say 60 x 30 pixels, the file holds 30 x 50"):
        _rotated_coco(tmp_path, annotated=(60, 30))[0]


def test_a_turned_picture_is_named_once_in_a_warning(tmp_path, monkeypatch):
    """A half turn or a mirror keeps the size, so annotations made on the stored pixels cannot be caught: the
    first picture with an orientation tag is named (once a process)."""
    import linvit.data.images as images

    monkeypatch.setattr(images, "_turned_noted", False)
    data = _rotated_coco(tmp_path, annotated=(30, 50))
    with pytest.warns(UserWarning, match=r"a\.jpg \(and maybe others\) has EXIF orientation 6"):
        data[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data[0]  # said once
