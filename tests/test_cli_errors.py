"""Bad input a new user types gets one line naming the problem (exit code 2), never a traceback."""

from __future__ import annotations

import pytest

from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist, load_boxes


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmnist")
    build_cluttered_mnist(root, canvas=32, per_class_train=2, per_class_val=1, clutter=0, progress=False)
    return root


def _fails_cleanly(argv: list[str], capsys, *phrases: str) -> None:
    try:
        code = cli_main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]  # argparse prints its usage above the error
    assert "Traceback" not in err and last.startswith("linvit ") and ": error: " in last, err
    for phrase in phrases:
        assert phrase in last, err


def _train(data, out, *extra: str) -> list[str]:
    return [
        "train",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--output",
        str(out),
        "--img-size",
        "32",
        "--workers",
        "0",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--no-progress",
        *extra,
    ]


def test_model_kwargs_of_the_wrong_kind(data, tmp_path, capsys):
    _fails_cleanly(_train(data, tmp_path, "--model-kwargs", "patch_size=banana"), capsys, "patch_size", "banana")


@pytest.mark.parametrize("flag,value", [("--epochs", "0"), ("--batch-size", "-3"), ("--workers", "-1")])
def test_counts_must_be_positive(data, tmp_path, capsys, flag, value):
    _fails_cleanly([*_train(data, tmp_path), flag, value], capsys, flag, ">=")


def test_resume_from_a_damaged_checkpoint_names_it(data, tmp_path, capsys):
    (tmp_path / "last.pth").write_bytes(b"not a checkpoint")
    _fails_cleanly(_train(data, tmp_path, "--resume", "auto"), capsys, str(tmp_path / "last.pth"), "delete it")


def test_output_paths_that_are_files(tmp_path, capsys):
    blocker = tmp_path / "taken.txt"
    blocker.write_text("x")
    _fails_cleanly(["data", "cluttered-mnist", "--out", str(blocker)], capsys, "is a file, not a folder")
    _fails_cleanly(["reproduce", "--quick", "--out", str(blocker / "sub")], capsys, "is a file, not a folder")


def test_malformed_boxes_name_the_file_and_the_entry(data, tmp_path, capsys):
    bad = tmp_path / "boxes.json"
    bad.write_text('{"val/0/00000.png": [["a", 1, 2, 3]]}')
    with pytest.raises(ValueError, match="val/0/00000.png"):
        load_boxes(bad)
    argv = [
        "explain",
        "--data",
        str(data),
        "--model",
        "linear_infvit_tiny_patch16_224",
        "--img-size",
        "32",
        "--boxes",
        str(bad),
        "--out",
        str(tmp_path / "ex"),
        "--limit",
        "2",
    ]
    _fails_cleanly(argv, capsys, str(bad), "val/0/00000.png")
    bad.write_text("[1, 2")
    _fails_cleanly(argv, capsys, str(bad), "not a JSON file")
