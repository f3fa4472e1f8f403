"""Every `linvit` command spells a concept one way, and its flags and its typed config agree (issue 35).

The config class of each command is the one its row in linvit_commands.COMMANDS names, so a command wired to the
wrong config, a flag the config drops, a flag with a default of its own (defaults are the config's, issue 47) or
an `--out` left visible all fail here.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

import linvit_cli
import linvit_commands
from linvit_cli import DEVICES, build_parser

PARSER = build_parser()
ROOT = Path(__file__).resolve().parent.parent
LEAVES = sorted(PARSER.commands)
CLI_ONLY = {"config", "threads", "debug", "func", "command", "dataset", "help"}  # dispatch and process flags


def _row(command: tuple) -> linvit_commands.Command:
    return PARSER.commands[command].get_default("func").row


def _visible(leaf: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in leaf._actions if a.help is not argparse.SUPPRESS and a.dest not in CLI_ONLY]


def _dests(leaf: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in leaf._actions if a.dest not in CLI_ONLY and not a.dest.endswith("_command")}


def _field_default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _required(leaf: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Given on every command line: a required flag or positional, or one of a required renamed pair."""
    groups = [g for g in leaf._mutually_exclusive_groups if action in g._group_actions]
    return action.required or any(g.required for g in groups)


def test_every_command_is_one_row_of_the_table():
    assert [tuple(row.words.split()) for row in linvit_commands.COMMANDS] == list(PARSER.commands)
    assert len({row.target for row in linvit_commands.COMMANDS}) == len(LEAVES)


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_every_command_builds_a_config_that_takes_all_its_flags(command):
    leaf, row = PARSER.commands[command], _row(command)
    from linvit.config import Config

    config_class, run = linvit_cli.load_command(row)
    assert callable(run) and issubclass(config_class, Config)
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    dests = _dests(leaf)
    assert dests - set(fields) == set(), f"flags the config drops: {sorted(dests - set(fields))}"
    config_class()  # every field has a default: a run folder written before a field existed still loads
    for spec in linvit_cli._flags(row):
        assert "default" not in spec.kwargs, f"{spec.names[0]}: a default of its own (the config's is the one)"
    defaults = linvit_cli.command_defaults(row)
    for action in _visible(leaf):
        assert action.default is argparse.SUPPRESS, action.dest
        if not _required(leaf, action):
            assert defaults[action.dest] == _field_default(fields[action.dest]), action.dest


DEFAULT_IN_HELP = re.compile(r"\bdefault: ([^;)]+)[;)]|\((\S+), the default\b")


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_a_default_written_in_help_is_the_configs(command):
    """--help shows some defaults as text (it imports no config, below): a number or word written there must
    be the config field's default, so changing a default without its help fails here."""
    leaf, row = PARSER.commands[command], _row(command)
    config_class, _ = linvit_cli.load_command(row)
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for action in _visible(leaf):
        for match in DEFAULT_IN_HELP.finditer(action.help or ""):
            written, default = match.group(1) or match.group(2), _field_default(fields[action.dest])
            where = f"{' '.join(command)} {action.option_strings[0]}: help says {written!r}, the config {default!r}"
            if isinstance(default, str) and re.fullmatch(r"[\w.+-]+", written):  # one word: the value itself
                assert written == default, where
            elif isinstance(default, (int, float)) and not isinstance(default, bool) and _is_number(written):
                assert float(written) == default, where


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False  # prose: "lr / 100", "torch's"
    return True


def test_help_shows_every_scalar_default_from_a_current_table():
    """--help reads the defaults from src/linvit_help_defaults.py (no torch); it must be what the configs say now,
    and a flag whose help says nothing of its default gets the table's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_help_defaults", ROOT / "scripts/write_help_defaults.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    assert writer.TARGET.read_text() == writer.render(), "run: python scripts/write_help_defaults.py"
    train = PARSER.commands[("train",)].format_help()
    assert "(default: adamw)" in train and "(default: 0.05)" in train and "(default: on)" in train
    assert linvit_cli.default_as_text(None) is None and linvit_cli.default_as_text([]) is None
    assert linvit_cli.default_as_text([512]) == ["512"] and linvit_cli.default_as_text([0.75, 4 / 3]) == [
        "0.75",
        "1.333",
    ]
    assert linvit_cli.default_as_text({"a": 1}) is None and linvit_cli.default_as_text([1, 2, 3, 4, 5]) is None
    segment = PARSER.commands[("segment", "train")].format_help()  # a list default is shown as the flag takes it
    assert "(default: 512)" in segment and "(default: 0.5 2)" in segment
    assert "(default:224,512,1024)" in PARSER.commands[("bench",)].format_help().replace("\n", "").replace(" ", "")
    assert linvit_cli.default_as_text(1e-05) == "1e-05" and linvit_cli.default_as_text(False) is None


def test_the_distill_recipe_flags_show_their_defaults():
    text = PARSER.commands[("distill",)].format_help()
    for flag in ("--transfer-epochs", "--transfer-lr", "--epochs", "--lr", "--temperature", "--context"):
        action = next(a for a in PARSER.commands[("distill",)]._actions if flag in a.option_strings)
        assert DEFAULT_IN_HELP.search(action.help), flag
    assert "default: mse" in text


def test_a_parse_gives_the_config_defaults_and_help_imports_no_torch():
    """What the command line leaves out is the config's default (one place), filled in only once a command
    runs: --help and a bad flag stop before, so they never import torch."""
    import subprocess
    import sys

    from linvit.segment.engine import SegmentConfig

    args = linvit_cli.parse_args(["segment", "train", "--data", "d", "--model", "m", "--output", "o"])
    config = SegmentConfig.from_mapping(vars(linvit_cli._prepare(args, args.func.row)))
    assert config == SegmentConfig(data="d", model="m", output="o")
    assert args.crop_size == SegmentConfig().crop_size and args.batch_size == SegmentConfig().batch_size
    code = (
        "import sys, contextlib, io, linvit_cli\n"
        "for argv in (['--help'], ['train', '--help'], ['segment', 'eval', '--help'], ['train', '--bogus']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try: linvit_cli.main(argv)\n"
        "        except SystemExit: pass\n"
        "print(sorted(m for m in ('torch', 'timm', 'linvit') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_old_spellings_are_hidden_and_point_at_a_shown_flag(command):
    leaf = PARSER.commands[command]
    shown = {a.dest for a in _visible(leaf)}
    for action in leaf._actions:
        if "--out" in action.option_strings:
            assert isinstance(action, linvit_cli._OldSpelling) and action.help is argparse.SUPPRESS
        if isinstance(action, linvit_cli._OldSpelling):
            assert action.dest in shown and action.new in leaf._option_string_actions


def test_one_device_flag_and_one_meaning_of_img_size():
    devices = {tuple(a.choices) for leaf in PARSER.commands.values() for a in leaf._actions if a.dest == "device"}
    assert devices == {DEVICES}
    with_img_size = {
        " ".join(command)
        for command, leaf in PARSER.commands.items()
        for a in _visible(leaf)
        if "--img-size" in a.option_strings
    }
    # the model's input size H [W] only: the shorter side is --resize, a sample's side --side, ...
    assert with_img_size == {"train", "distill", "eval", "explain", "spectral", "erf", "predict", "export"}


def test_old_spellings_still_work_for_one_release_and_say_so(capsys, tmp_path):
    args = linvit_cli.parse_args(["export", "--model", "m", "--out", "m.onnx"])
    assert args.output == "m.onnx" and "--out is deprecated, use --output" in capsys.readouterr().err
    args = linvit_cli.parse_args(["segment", "predict", "x.png", "--checkpoint", "run", "--img-size", "64"])
    assert args.img_size == 64 and "--img-size is deprecated, use --resize" in capsys.readouterr().err
    args = linvit_cli.parse_args(["generate", "train", "--data", "d", "--output", "o", "--mixer", "linear_infsa"])
    assert args.mixer == "linear_infsa" and capsys.readouterr().err == ""  # one spelling, the registry's
    args = linvit_cli.parse_args(["generate", "train", "--data", "d", "--output", "o", "--mixer", "katz"])
    assert args.mixer == "katz_infsa"
    assert "--mixer katz is deprecated, use --mixer katz_infsa" in capsys.readouterr().err
    config = tmp_path / "run.yaml"
    config.write_text("out: folder\n")  # a --config file with the old key: also satisfies the required flag
    args = linvit_cli.parse_args(["data", "digits", "--config", str(config)])
    assert args.output == "folder" and "deprecated" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        linvit_cli.parse_args(["export", "--model", "m", "--out", "a.onnx", "--output", "b.onnx"])
    assert "not allowed with" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        linvit_cli.parse_args(["export", "--model", "m"])
    assert "--output" in capsys.readouterr().err.splitlines()[-1]


def test_a_config_file_value_parses_as_its_flag_would(tmp_path):
    """`crop_size: 48` in a --config file is `--crop-size 48` ([48]), as `crop_size: [48, 64]` is `--crop-size 48 64`;
    a single-valued flag stays a scalar, typed."""
    config = tmp_path / "run.yaml"
    for text, crop in (("crop_size: 48\n", [48]), ("crop_size: [48, 64]\n", [48, 64]), ("crop_size: '40'\n", [40])):
        config.write_text(text + "epochs: '3'\n")
        args = linvit_cli.parse_args(
            ["segment", "train", "--data", "d", "--model", "m", "--output", "o", "--config", str(config)]
        )
        assert args.crop_size == crop and args.epochs == 3


def test_the_convert_and_mixer_choices_are_linvit_convert_forms():
    """The parser's torch-free lists (its --help before linvit loads) are the registry's built-in mixers: every
    form, nothing else, in order; once linvit is loaded the choices are the registry's."""
    from linvit.conversion import FORMS
    from linvit.models.dit import dit_mixers

    assert linvit_cli.BUILTIN_FORMS == FORMS and tuple(linvit_cli.CONVERT_VARIANTS) == FORMS
    assert linvit_cli.BUILTIN_DIT_MIXERS == dit_mixers() == tuple(linvit_cli.DIT_MIXERS)


def test_distill_transfer_losses_are_the_librarys():
    from linvit.distillation.attention_weights import TRANSFER_LOSSES

    distill = PARSER.commands[("distill",)]
    assert next(a.choices for a in distill._actions if a.dest == "transfer_loss") == TRANSFER_LOSSES


def test_the_library_keeps_no_argument_parser():
    """argparse stops at linvit_cli (issue 47): runners of library code live in scripts/ or in the command table."""
    import ast
    from pathlib import Path

    root = Path(linvit_cli.__file__).parent / "linvit"
    importers = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if "argparse" in names:
                importers.append(str(path.relative_to(root)))
    assert importers == []
