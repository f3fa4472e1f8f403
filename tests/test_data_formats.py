"""`--data wds:FOLDER` and `--data hfds:FOLDER`: the same images as a class folder give the same training run;
bad shards, folders and prefixes stop with one line."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist
from linvit.data.splits import open_split
from linvit.errors import UsageError

FAST = ["--img-size", "32", "--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--smoothing", "0"]
FAST += ["--warmup-epochs", "0", "--drop-path", "0", "--workers", "0", "--no-progress", "--crop-pct", "1.0"]
MODEL = ["--model", "katz_infvit_tiny_patch16_224", "--model-kwargs", "patch_size=8", "depth=1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmnist")
    build_cluttered_mnist(root, canvas=32, per_class_train=3, per_class_val=1, clutter=1, progress=False)
    return root


def _files(folder: Path, split: str) -> list[tuple[Path, int]]:
    """The split's (file, label) in ImageFolder's order (classes sorted, files sorted)."""
    classes = sorted(p.name for p in (folder / split).iterdir())
    return [(f, i) for i, c in enumerate(classes) for f in sorted((folder / split / c).iterdir())]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(folder: Path, out: Path, per_shard: int = 7) -> Path:
    """folder's splits as WebDataset shards train-00000.tar, ... (same order), each sample key.png + key.cls."""
    out.mkdir()
    for split in ("train", "val"):
        files = _files(folder, split)
        for shard, start in enumerate(range(0, len(files), per_shard)):
            with tarfile.open(out / f"{split}-{shard:05d}.tar", "w") as tar:
                for j, (path, label) in enumerate(files[start : start + per_shard]):
                    key = f"s{start + j:06d}"
                    _add(tar, f"{key}.png", path.read_bytes())
                    _add(tar, f"{key}.cls", str(label).encode())
    return out


def write_hf_folder(folder: Path, out: Path) -> Path:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    classes = sorted(p.name for p in (folder / "train").iterdir())
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    splits = {}
    for split, name in (("train", "train"), ("val", "validation")):
        rows = [(Image.open(path), label) for path, label in _files(folder, split)]
        splits[name] = datasets.Dataset.from_dict(
            {"image": [r[0] for r in rows], "label": [r[1] for r in rows]}, features=features
        )
    datasets.DatasetDict(splits).save_to_disk(str(out))
    return out


def _train(data: str, out: Path) -> list[dict]:
    argv = ["train", "--data", data, *MODEL, "--output", str(out), "--epochs", "2", "--batch-size", "8"]
    assert cli_main([*argv, "--lr", "1e-3", *FAST, "--log", "none"]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_items(a, b) -> None:
    assert len(a) == len(b) and a.classes == b.classes
    for i in (0, len(a) // 2, len(a) - 1):
        (x, y, _), (u, v, _) = a[i], b[i]
        assert y == v and x.tobytes() == u.tobytes()


def test_webdataset_shards_read_and_train_as_the_class_folder(folder, tmp_path):
    shards = write_shards(folder, tmp_path / "shards")
    for split in ("train", "val"):
        _same_items(open_split(f"wds:{shards}", split), open_split(folder, split))
    rows = _train(f"wds:{shards}", tmp_path / "wds_run")
    reference = _train(str(folder), tmp_path / "folder_run")
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in reference]
    assert [r["val_top1"] for r in rows] == [r["val_top1"] for r in reference]
    evaluation = ["eval", "--data", f"wds:{shards}", "--checkpoint", str(tmp_path / "wds_run"), "--workers", "0"]
    assert cli_main([*evaluation, "--no-progress", "--json", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["top1"] == pytest.approx(rows[-1]["val_top1"])


def test_a_saved_hugging_face_dataset_reads_and_trains_as_the_class_folder(folder, tmp_path):
    saved = write_hf_folder(folder, tmp_path / "hf")
    split = open_split(f"hfds:{saved}", "val")  # linvit's val is the DatasetDict's validation
    _same_items(split, open_split(folder, "val"))
    rows = _train(f"hfds:{saved}", tmp_path / "hf_run")
    reference = _train(str(folder), tmp_path / "folder_run")
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in reference]


def _one_line(fn, *match: str) -> str:
    with pytest.raises(UsageError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message and all(m in message for m in match), message
    return message


def test_bad_data_specs_stop_with_one_line(folder, tmp_path):
    _one_line(lambda: open_split("tfds:imagenet", "train"), "unknown reader 'tfds'", "wds:", "hfds:")
    shards = write_shards(folder, tmp_path / "shards")
    _one_line(lambda: open_split(f"wds:{shards}", "test"), "no shards match", "test-*.tar")
    with tarfile.open(shards / "train-09999.tar", "w") as tar:
        _add(tar, "lonely.png", (folder / "train" / "0").iterdir().__next__().read_bytes())
    _one_line(lambda: open_split(f"wds:{shards}", "train"), "'lonely'", "has no .cls label")
    _one_line(lambda: open_split(f"hfds:{tmp_path / 'nowhere'}", "train"), "no such folder")


def test_a_saved_dataset_without_a_label_column_is_refused(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    table = datasets.Dataset.from_dict({"image": [Image.new("RGB", (4, 4))], "target": [0]})
    datasets.DatasetDict({"train": table, "validation": table}).save_to_disk(str(tmp_path / "hf"))
    _one_line(lambda: open_split(f"hfds:{tmp_path / 'hf'}", "train"), "no label column", "target")
    _one_line(lambda: open_split(f"hfds:{tmp_path / 'hf'}", "test"), "no split 'test'", "train, validation")


def test_webdataset_multi_part_extensions_and_bad_shards_stop_with_one_line(folder, tmp_path):
    """WebDataset's key is the name up to the first dot, so "k.input.jpg" is sample k's image (WebDataset
    decodes it by its last part); an empty, compressed or undecodable shard is one line, not a traceback."""
    png = next((folder / "train" / "0").iterdir()).read_bytes()
    shards = tmp_path / "named"
    shards.mkdir()
    with tarfile.open(shards / "train-0.tar", "w") as tar:
        for key, label in (("a", 1), ("b", 0)):
            _add(tar, f"dir.v2/{key}.input.png", png)
            _add(tar, f"dir.v2/{key}.cls", str(label).encode())
    split = open_split(f"wds:{shards}", "train")
    assert [split[i][1] for i in range(len(split))] == [1, 0] and split.classes == ["0", "1"]
    with tarfile.open(shards / "train-1.tar", "w") as tar:
        _add(tar, "c.left.png", png), _add(tar, "c.right.png", png), _add(tar, "c.cls", b"0")
    _one_line(lambda: open_split(f"wds:{shards}", "train"), "'c'", "several images")
    empty = tmp_path / "empty"
    empty.mkdir()
    tarfile.open(empty / "train-0.tar", "w").close()
    _one_line(lambda: open_split(f"wds:{empty}", "train"), "hold no samples")
    with tarfile.open(empty / "train-0.tar", "w:gz") as tar:
        _add(tar, "a.png", png), _add(tar, "a.cls", b"0")
    _one_line(lambda: open_split(f"wds:{empty}", "train"), "train-0.tar", "not an uncompressed tar")
    with tarfile.open(empty / "train-0.tar", "w") as tar:
        _add(tar, "a.png", png), _add(tar, "a.cls", b"\xff\xfe")
    _one_line(lambda: open_split(f"wds:{empty}", "train"), "not a class index")


def test_a_saved_dataset_of_image_paths_or_bytes_reads_and_bad_labels_stop_with_one_line(folder, tmp_path):
    """Image columns saved as file paths or {"bytes", "path"} are decoded as an Image column would be; string
    labels and an unlabelled split's -1 are refused in one line rather than failing inside a worker."""
    datasets = pytest.importorskip("datasets")
    files = _files(folder, "val")
    as_images = open_split(folder, "val")
    for column in ([str(f) for f, _ in files], [{"bytes": f.read_bytes(), "path": None} for f, _ in files]):
        table = datasets.Dataset.from_dict({"image": column, "label": [label for _, label in files]})
        datasets.DatasetDict({"validation": table}).save_to_disk(str(tmp_path / "hf"))
        split = open_split(f"hfds:{tmp_path / 'hf'}", "val")
        assert [split[i][1] for i in range(len(split))] == as_images.targets
        assert split[1][0].tobytes() == as_images[1][0].tobytes()
    for labels, bad in ((["cat"] * len(files), "'cat'"), ([-1] * len(files), "-1")):
        table = datasets.Dataset.from_dict({"image": [str(f) for f, _ in files], "label": labels})
        datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "bad"))
        _one_line(lambda: open_split(f"hfds:{tmp_path / 'bad'}", "train"), f"label {bad}", "not a class index")


def test_numbered_wds_classes_that_differ_between_splits_say_how_to_name_them(folder, tmp_path, capsys):
    """Without classes.txt a split's classes end at its highest label, so a val split without the last class
    differs from train: the refusal says so (it said "class folders"), and classes.txt makes the run train."""
    shards = write_shards(folder, tmp_path / "shards", per_shard=100)
    keep = [p for p in _files(folder, "val") if p[1] < 9]
    (shards / "val-00000.tar").unlink()
    with tarfile.open(shards / "val-00000.tar", "w") as tar:
        for j, (path, label) in enumerate(keep):
            _add(tar, f"v{j}.png", path.read_bytes()), _add(tar, f"v{j}.cls", str(label).encode())
    argv = ["train", "--data", f"wds:{shards}", *MODEL, "--output", str(tmp_path / "run"), *FAST]
    assert cli_main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "10 vs 9 classes" in error and "classes.txt" in error, error
    (shards / "classes.txt").write_text("\n".join(str(i) for i in range(10)))
    assert _train(f"wds:{shards}", tmp_path / "named")[-1]["epoch"] == 1


def test_a_class_folder_reads_transparent_and_16_bit_pictures_as_predict_does(tmp_path):
    """Training and evaluation folders read each file as predict and explain do (data.images.read_rgb): a digit
    drawn in the alpha channel over transparent red was a solid red square through ImageFolder's convert("RGB"),
    and a 16-bit picture was clipped to white."""
    import numpy as np
    from PIL import Image

    from linvit.data.folder import SafeImageFolder
    from linvit.data.images import read_rgb

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    alpha = np.zeros((12, 12), np.uint8)
    alpha[3:9, 5:7] = 255  # a stroke: opaque red inside, transparent red around it
    rgba = np.dstack([np.full((12, 12), 255, np.uint8), np.zeros((12, 12, 2), np.uint8), alpha])
    Image.fromarray(rgba).save(tmp_path / "a/stroke.png")
    ramp = (np.arange(144, dtype=np.uint16).reshape(12, 12) * 455).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "b/ramp.png")
    folder = SafeImageFolder(tmp_path)
    for index, (path, _) in enumerate(folder.samples):
        image = np.asarray(folder.decode(index))
        assert np.array_equal(image, np.asarray(read_rgb(path))), path
    stroke, ramp_read = (np.asarray(folder.decode(i)) for i in range(2))
    assert (stroke[0, 0] == 255).all() and tuple(stroke[5, 5]) == (255, 0, 0)  # white around a red stroke
    assert ramp_read.min() == 0 and 0 < np.median(ramp_read) < 255  # not clipped to white


def test_a_missing_split_folder_says_what_the_data_folder_holds(tmp_path):
    """--data DATA/train looked for DATA/train/train and said only 'split folder not found' (new-user trial)."""
    from linvit.data.folder import SafeImageFolder

    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
    with pytest.raises(UsageError, match=f"--data names a split: give the folder that holds it, {tmp_path}$"):
        SafeImageFolder(tmp_path / "train" / "train")
    with pytest.raises(UsageError, match=r"the folder holds train, val: DATA/<split>/<class>/\*"):
        SafeImageFolder(tmp_path / "valid")
    with pytest.raises(UsageError, match="split folder not found$"):
        SafeImageFolder(tmp_path / "train" / "a" / "train")
