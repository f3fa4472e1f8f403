"""Every `linvit` command spells a concept one way, and its flags and its typed config agree (issue 35).

The config class of each command is the one the CLI itself builds (its dispatch function is run up to the
point where it builds the config), so a command wired to the wrong config, a flag the config drops, a config
default that drifted from the flag's, or an `--out` left visible all fail here.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import linvit_cli
from linvit_cli import DEVICES, build_parser

PARSER = build_parser()
LEAVES = sorted(PARSER.commands)
CLI_ONLY = {"config", "threads", "debug", "func", "command", "dataset", "help"}  # dispatch and process flags


class _Built(Exception):
    """Raised in place of building a config: the class is recorded, the handler never runs."""


def _config_class(command: tuple, monkeypatch):
    """The Config class the CLI builds for command (None: it still hands the handler the Namespace)."""
    seen = []

    def config(config_class, args, *checks):
        seen.append(config_class)
        raise _Built

    def prepare(args, *checks):
        seen.append(None)
        raise _Built

    monkeypatch.setattr(linvit_cli, "_config", config)
    monkeypatch.setattr(linvit_cli, "_prepare", prepare)
    with pytest.raises(_Built):
        PARSER.commands[command].get_default("func")(argparse.Namespace())
    return seen[0]


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


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_every_command_builds_a_config_that_takes_all_its_flags(command, monkeypatch):
    leaf = PARSER.commands[command]
    config_class = _config_class(command, monkeypatch)
    assert config_class is not None, f"linvit {' '.join(command)} hands its handler the argparse Namespace"
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    dests = _dests(leaf)
    assert dests - set(fields) == set(), f"flags the config drops: {sorted(dests - set(fields))}"
    for name in set(fields) - dests:  # a field the command has no flag for (a spec shared with training)
        assert _field_default(fields[name]) is not dataclasses.MISSING, f"{name}: no flag and no default"
    config_class()  # every field has a default: a run folder written before a field existed still loads
    for action in _visible(leaf):
        if _required(leaf, action):
            continue
        default = leaf._defaults.get(action.dest, action.default)
        if action.dest == "model_kwargs":
            default = linvit_cli._parse_kwargs(default)
        assert _field_default(fields[action.dest]) == default, f"{action.dest}: config and flag defaults differ"


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
