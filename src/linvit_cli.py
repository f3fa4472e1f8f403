"""The `linvit` command line: one subcommand per task, each with --help and a one-line error on bad input.

A top-level module rather than part of the ``linvit`` package: ``import linvit`` imports torch and timm (it
registers the models), which takes seconds, and printing ``--help`` should not. The commands are the rows of
linvit_commands.COMMANDS (torch-free too): this module builds one parser from them, fills each flag the command line
and ``--config`` leave out with its config field's default, builds the row's config
(``XConfig.from_mapping(vars(args))``) and calls its run function: argparse stops here.

Renamed flags keep their old spelling for one release, hidden from --help, with a one-line note on stderr
(``_OldSpelling``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

from linvit_commands import (
    BUILTIN_DIT_MIXERS,
    BUILTIN_FORMS,
    COMMANDS,
    CONVERT_VARIANTS,
    DEVICES,
    DIT_MIXERS,
    PARENTS,
    POSITIVE,
    Command,
    Flag,
    Group,
    deprecated,
    usage,
)
from linvit_help_defaults import HELP_DEFAULTS

__all__ = ["BUILTIN_DIT_MIXERS", "BUILTIN_FORMS", "CONVERT_VARIANTS", "DEVICES", "DIT_MIXERS"]
__all__ += ["build_parser", "command_defaults", "load_command", "main", "parse_args", "run_command"]


def _parse_kwargs(pairs: list[str]) -> dict:
    """['k=v', ...] -> {k: v} with v parsed as JSON when possible (numbers, true/false), else a string.
    A dict (from --config, a run's args.yaml or the config's default) is taken as it is (copied)."""
    if isinstance(pairs, dict):
        return dict(pairs)
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise usage(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


class _OldSpelling(argparse.Action):
    """A renamed flag's old spelling: hidden from --help, it stores into the new flag's dest and says so."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.update(help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        deprecated(option_string, self.new)
        setattr(namespace, self.dest, values)


# ---- the parser, built from the table ----


def _flags(row: Command):
    """Every Flag of a row, the ones inside groups included."""
    for item in row.flags:
        yield from item.flags if isinstance(item, Group) else (item,)


def _add_flag(container, spec: Flag, shown_default: str | list[str] | None = None) -> argparse.Action:
    """One flag, with no default of its own (the config's fills it in after parsing; shown_default: the text its
    help ends with); a renamed flag and its old spelling are a pair: either satisfies required=True, both at once
    is an error."""
    kwargs = {"default": argparse.SUPPRESS, **spec.kwargs}
    if isinstance(shown_default, list):  # as the flag takes it: words (nargs) or one comma list (--res 224,512)
        shown_default = (" " if kwargs.get("nargs") is not None else ",").join(shown_default)
    if shown_default is not None and "default" not in (kwargs.get("help") or ""):
        kwargs["help"] = f"{kwargs.get('help') or ''} (default: {shown_default})".lstrip()
    if spec.old is None:
        return container.add_argument(*spec.names, **kwargs)
    group = container.add_mutually_exclusive_group(required=kwargs.pop("required", False))
    action = group.add_argument(*spec.names, **kwargs)
    same = {k: getattr(action, k) for k in ("dest", "type", "nargs", "choices", "metavar")}
    group.add_argument(spec.old, action=_OldSpelling, new=spec.names[0], **same)
    return action


def _add_command(parser: argparse.ArgumentParser, row: Command) -> None:
    shown = HELP_DEFAULTS.get(row.words, {})  # the config defaults as text (linvit_help_defaults: no torch here)
    for item in row.flags:
        if not isinstance(item, Group):
            _add_flag(parser, item, shown.get(item.dest))
            continue
        group = parser.add_argument_group(item.title) if item.title else parser
        group = group.add_mutually_exclusive_group() if item.exclusive else group
        for spec in item.flags:
            _add_flag(group, spec, shown.get(spec.dest))
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE.yaml",
        help="defaults for this command's flags (keys as the flag names); flags on the command line win",
    )
    parser.add_argument("--threads", type=POSITIVE, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of a usage error too")
    parser.set_defaults(func=_Run(row))


class _OneLineErrors(argparse.ArgumentParser):
    """An unknown flag or a bad value is one line naming it and where the flags are listed, not the whole usage
    block first (every command's parser is one of these: argparse builds subparsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every row of COMMANDS; ``parser.commands``: ('segment', 'train') -> that command's parser."""
    parser = _OneLineErrors(prog="linvit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    top = parser.add_subparsers(dest="command", required=True)
    parents, parser.commands = {}, {}
    for row in COMMANDS:
        words = tuple(row.words.split())
        sub = top
        if len(words) == 2:
            if words[0] not in parents:
                help, dest = PARENTS[words[0]]
                parents[words[0]] = top.add_parser(words[0], help=help).add_subparsers(dest=dest, required=True)
            sub = parents[words[0]]
        leaf = sub.add_parser(words[-1], help=row.help)
        _add_command(leaf, row)
        parser.commands[words] = leaf
    return parser


# ---- from parsed flags to the command's config ----


def load_command(row: Command):
    """The row's config class and run function (importing their module: torch, timm, ...)."""
    module, config, run = row.target.split(":")
    module = importlib.import_module(module)
    return getattr(module, config), getattr(module, run)


def _field_default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def command_defaults(row: Command) -> dict:
    """Each flag's default: its config field's (a flag whose field has none is required)."""
    fields = {f.name: f for f in dataclasses.fields(load_command(row)[0])}
    defaults = {spec.dest: _field_default(fields[spec.dest]) for spec in _flags(row)}
    return {dest: value for dest, value in defaults.items() if value is not dataclasses.MISSING}


def default_as_text(value) -> str | list[str] | None:
    """How --help shows a config default: a word or a number as the config has it, "on" for a switch that is on,
    a short list of them as a list (the flag's help joins it as the flag takes it); None (not shown) for none, off,
    empty or long lists
    and mappings (their flags' help says what they hold)."""
    if isinstance(value, list | tuple) and 0 < len(value) <= 4 and all(_scalar(v) for v in value):
        return [f"{v:.4g}" if isinstance(v, float) else default_as_text(v) for v in value]
    if value is True:
        return "on"
    if value is None or value is False or value == "" or not _scalar(value):
        return None
    return value if isinstance(value, str) else repr(value)


def _scalar(value) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool) and value != ""


def help_defaults() -> dict[str, dict[str, str | list[str]]]:
    """{command words: {flag dest: its default as --help shows it}} for every row (imports every config: what
    scripts/write_help_defaults.py writes to src/linvit_help_defaults.py, which --help reads without torch)."""
    table = {}
    for row in COMMANDS:
        shown = {dest: default_as_text(value) for dest, value in command_defaults(row).items()}
        table[row.words] = {dest: text for dest, text in sorted(shown.items()) if text is not None}
    return table


def _fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The flags neither the command line nor --config gave, at their config defaults."""
    for dest, value in command_defaults(args.func.row).items():
        if not hasattr(args, dest):
            setattr(args, dest, value)
    return args


def _prepare(args: argparse.Namespace, row: Command) -> argparse.Namespace:
    """--threads applied, --model-kwargs parsed, --pretrained folded into them, each flag's check run (a check may
    normalise its value)."""
    if getattr(args, "threads", None):  # on a machine busy with other work, fewer threads than cores
        import torch

        torch.set_num_threads(args.threads)
    if hasattr(args, "model_kwargs"):
        args.model_kwargs = _parse_kwargs(args.model_kwargs)
        if getattr(args, "pretrained", False):
            args.model_kwargs["pretrained"] = True
    for spec in _flags(row):
        if spec.check is not None and getattr(args, spec.dest, None) is not None:
            setattr(args, spec.dest, spec.check(getattr(args, spec.dest)))
    return args


@dataclasses.dataclass(frozen=True)
class _Run:
    """A command's dispatch (``args.func``): its config from the parsed flags, then its run function."""

    row: Command

    def __call__(self, args: argparse.Namespace) -> None:
        config_class, run = load_command(self.row)
        config = config_class.from_mapping(vars(_prepare(args, self.row)))
        run(config, execute=run_command) if self.row.execute else run(config)


# ---- --config FILE.yaml ----


def _config_file(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def stage_config_warning(path: str, values: dict, args: argparse.Namespace) -> str | None:
    """A line where `linvit distill --config` reads OUT/attention/args.yaml, a two-stage run's first-stage record:
    its lr and epochs are the transfer's, and the end-to-end stage of the new run would train with them. None for
    a run's own file (a run of its own named attention has its own attention/ inside), for --stages attention,
    where both lr and epochs are given anew, and for --output that stage folder (refused with its own line)."""
    folder = Path(path).resolve().parent
    if folder.name != "attention" or values.get("stages") != "both" or (folder / "attention").is_dir():
        return None
    given = {k: getattr(args, k, None) for k in ("lr", "epochs", "stages", "output")}  # unset: no attribute yet
    overridden = given["lr"] != values.get("lr") and given["epochs"] != values.get("epochs")
    if given["stages"] == "attention" or overridden or Path(str(given["output"])).resolve() == folder:
        return None
    whole = folder.parent / "args.yaml"  # written when the run's end-to-end stage starts
    rerun = f"--config {whole}" if whole.is_file() else f"the run's own flags ({whole} is not written yet)"
    return (
        f"linvit distill: warning: --config {path} is the attention-transfer stage of the run in {folder.parent}: "
        f"its lr and epochs are that stage's (lr {values.get('lr')}, epochs {values.get('epochs')}), and the "
        f"end-to-end stage would train with them; rerun the whole run with {rerun}, or this stage alone with "
        "--stages attention"
    )


def another_forms_settings(argv: list[str], values: dict, args: argparse.Namespace) -> str | None:
    """Where --mixer on the command line replaces a distill config's, the file's settings the new form refuses
    (a discount's rate where it has none, a learned map's size and rate where it has none) and a first discount
    that was the old form's default are left open for the new form's defaults (args changed in place), unless
    typed as flags too; a line names them. A recorded Katz config rerun as the anchor was refused for its
    --gamma-lr, and a linear-attention one rerun as Katz started at its stored 0.9."""
    from linvit.distillation.task import default_gamma  # torch: only for such a rerun
    from linvit.errors import UsageError
    from linvit.mixers import get_mixer

    values = {str(k).replace("-", "_"): v for k, v in values.items()}
    old, new = values.get("mixer"), getattr(args, "mixer", None)  # flags left unset have no attribute yet
    if old in (None, "auto") or new in (None, "auto") or new == old:
        return None
    try:
        discount = get_mixer(new.partition(":")[0], warn=False).discount
    except UsageError:  # an unknown form: the config's own check names it
        return None
    maps = new.endswith(":hedgehog")
    refused = {"gamma_lr": not discount, "map_lr": not maps, "feature_dim": not maps}
    refused["gamma_init"] = not discount or values.get("gamma_init") == default_gamma(old) != default_gamma(new)
    typed = [a.split("=")[0] for a in argv if a.startswith("--") and len(a.split("=")[0]) > 2]
    dropped = {}
    for key, drop in refused.items():
        flag = f"--{key.replace('_', '-')}"
        if drop and values.get(key) is not None and not any(flag.startswith(t) for t in typed):  # argparse's prefixes
            dropped[key] = values[key]
            setattr(args, key, None)
    if not dropped:
        return None
    shown = ", ".join(f"{key} {value}" for key, value in dropped.items())
    return (
        f"linvit distill: --mixer {new} replaces the config's {old}: its {shown} "
        f"{'is' if len(dropped) == 1 else 'are'} left to {new}'s defaults (give as flags what to keep)"
    )


def _apply_config(p: argparse.ArgumentParser, path: str) -> dict:
    """Make the YAML file's values the command's defaults (timm's train.py convention), checked like flags;
    returns them."""
    import yaml

    try:
        values = yaml.safe_load(open(path)) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        p.error(f"--config {path}: cannot read it as YAML text ({type(err).__name__}: {err})")
    if not isinstance(values, dict):
        p.error(f"--config {path}: expected a mapping of flag names to values")
    actions = _config_keys(p)
    defaults = {}
    for key, value in values.items():
        action = actions.get(str(key).replace("-", "_"))
        if action is None:
            p.error(f"--config {path}: {key!r} is not an option of this command")
        if isinstance(action, _OldSpelling):
            deprecated(f"--config key {key!r}", f"{action.new.lstrip('-')!r}")
        defaults[action.dest] = _config_value(p, action, value, path)
        action.required = False
    for group in p._mutually_exclusive_groups:  # a renamed flag's pair: the file gives it
        if any(a.dest in defaults for a in group._group_actions):
            group.required = False
    p.set_defaults(**defaults)
    return values


def _config_keys(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A --config file's keys: each flag's dest (what a run's args.yaml holds) and each of its spellings
    (output, resize; out, img_size for the old ones), underscores for dashes."""
    keys = {}
    for action in p._actions:
        if action.dest in ("help", "config"):
            continue
        spellings = [o.lstrip("-").replace("-", "_") for o in action.option_strings if o.startswith("--")]
        for key in (action.dest, *spellings):
            keys.setdefault(key, action)
    return keys


def _config_value(p: argparse.ArgumentParser, action: argparse.Action, value, path: str):
    """value as the flag would have parsed it: typed, and within its choices."""
    if value is None:
        return None
    takes_values = action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 0)
    if not takes_values and action.nargs != 0 and isinstance(value, (list, dict)):  # `lr: [0.1, 0.2]`
        p.error(f"--config {path}: {action.dest}: expected one value, got {value!r}")
    many = takes_values and not isinstance(value, dict)
    items = value if isinstance(value, list) and action.nargs is not None else [value]
    parsed = []
    for item in items:
        if action.type is not None and item is not None and not isinstance(item, (bool, list, dict)):
            try:
                item = action.type(str(item))
            except (argparse.ArgumentTypeError, ValueError) as err:
                p.error(f"--config {path}: {action.dest}: {err}")
        if action.choices is not None and item is not None and item not in action.choices:
            p.error(f"--config {path}: {action.dest}: {item!r} is not one of {list(action.choices)}")
        parsed.append(item)
    if isinstance(action.nargs, int) and action.nargs > 1 and len(parsed) != action.nargs:  # `scale: 0.5`
        p.error(f"--config {path}: {action.dest}: expected a list of {action.nargs} values, got {value!r}")
    return parsed if many or items is value else parsed[0]  # `crop_size: 48` for a nargs="+" flag is [48]


# ---- running ----


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line, with --config FILE.yaml supplying defaults for the chosen command and the command's
    config supplying the rest (--help and a bad flag stop before that, without importing torch)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    config = _config_file(argv)
    if config is not None:
        leaf = parser.commands.get(tuple(argv[:2])) or parser.commands.get(tuple(argv[:1]))
        if leaf is None:
            parser.error("--config goes after the command, e.g. `linvit train --config run.yaml`")
        values = _apply_config(leaf, config)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command's own parser: "linvit train: error: ... (see linvit train --help)"
        leaf = parser.commands.get(tuple(argv[:2])) or parser.commands.get(tuple(argv[:1])) or parser
        leaf.error(f"unrecognized arguments: {' '.join(unknown)}")
    if config is not None and argv[0] == "distill":
        notices = (stage_config_warning(config, values, args), another_forms_settings(argv, values, args))
        for notice in filter(None, notices):
            if os.environ.get("RANK", "0") == "0":  # once under torchrun
                print(notice, file=sys.stderr)
    return _fill_defaults(args)


def run_command(argv: list[str]) -> None:
    """Run one `linvit` command line in this process; errors propagate to the caller."""
    args = parse_args(argv)
    args.func(args)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("linvit")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


WEIGHT_FLAGS = ("--pretrained-file", "--teacher-file", "--checkpoint", "--backbone-checkpoint")


def _weight_flags(argv: list[str] | None) -> str:
    """What to give instead of Hub weights, by argv's command's own flags (distill's --teacher-file, train's
    --pretrained-file; a command without one takes a run folder only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = build_parser().commands
    leaf = commands.get(tuple(argv[:2])) or commands.get(tuple(argv[:1]))
    found = [o for a in (leaf._actions if leaf else []) for o in a.option_strings if o in WEIGHT_FLAGS]
    return f"give a weights file ({', '.join(found)}) or a run folder instead" if found else "give a run folder instead"


def _hub_offline_if_unresolvable(argv: list[str] | None):
    """huggingface_hub offline for the command, where it may download weights (--pretrained, a pretrained= model
    kwarg, a hf: teacher, an hf-hub: model; --flag=value too) and the Hub cannot be named
    (linvit.hub_offline); a context manager, so a Python caller of main() gets its setting back."""
    argv = list(sys.argv[1:] if argv is None else argv)
    values = [a.partition("=")[2] if a.startswith("--") and "=" in a else a for a in argv]
    if any(a == "--pretrained" or "pretrained=" in a or a.startswith(("hf:", "hf-hub:")) for a in values):
        from linvit.hub_offline import offline_while_hub_unresolvable

        return offline_while_hub_unresolvable()
    return contextlib.nullcontext()


def _worker_message(err: Exception) -> str:
    """The error's own message where a DataLoader worker raised it: PyTorch re-raises it in the main process with
    "Caught UsageError in DataLoader worker process N." and the worker's whole traceback as its message, which
    ends with "linvit.errors.UsageError: " and the message (of any length)."""
    text = str(err)
    marker = f"{type(err).__module__}.{type(err).__qualname__}: "
    if not (text.startswith("Caught ") and "Original Traceback" in text and marker in text):
        return text
    return text[text.rindex(marker) + len(marker) :].strip()


def main(argv: list[str] | None = None) -> int:
    """Run a command: input the user can fix (linvit.errors.UsageError) is one line and exit 2 (its traceback
    with --debug); Ctrl-C is one line and exit 130 (the shell's code for SIGINT); any other exception, a
    ValueError from torch or a bug included, keeps its traceback."""
    args = parse_args(argv)
    try:
        with _hub_offline_if_unresolvable(argv):
            args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"\nlinvit {args.command}: interrupted", file=sys.stderr)
        return 130
    except ValueError as err:
        from linvit.errors import UsageError

        if not isinstance(err, UsageError) or args.debug:
            raise
        print(f"linvit {args.command}: error: {_worker_message(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # the Hugging Face Hub unreachable for --pretrained weights not in its cache
        if type(err).__name__ != "LocalEntryNotFoundError" or args.debug:
            raise
        print(
            f"linvit {args.command}: error: pretrained weights are not in the local cache and the Hugging Face Hub "
            f"cannot be reached; {_weight_flags(argv)}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
