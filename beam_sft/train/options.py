"""Parsing `beam-sft train` / `scripts/train.py` options (and `beam-sft prepare`'s): TRL's parser, with what
it lets through (an unknown key, a YAML value outside `choices`, a renamed option) a one-line `UsageError`."""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

from trl import TrlParser

from beam_sft.dataset.arguments import PREPARE_ONLY, renamed
from beam_sft.errors import UsageError

logger = logging.getLogger(__name__)

# Options naming local files that the shipped configs set relative to a checkout (data/samples, ...): a value
# missing from the working directory is looked up among the bundled files, so a named config runs anywhere.
PATH_FIELDS = ("dataset_name", "eval_dataset_name", "tokenizer_name_or_path", "tiny_model_config")


def _nearest(word: str, candidates, prefix: str = "") -> str:
    """` (did you mean 'x'?)`, the nearest candidate spelled with `prefix` (`--` for a command-line option)."""
    near = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {prefix + near[0]!r}?)" if near else ""


class BeamTrlParser(TrlParser):
    """TrlParser whose errors are `UsageError`s (one line, exit 2). `other_keys`: a function giving the YAML
    keys another command takes, passed over here; `config_path`: the YAML file read, once parsed."""

    def __init__(self, dataclass_types, *, other_keys=None, **kwargs):
        self.other_keys = other_keys or set
        self.config_path: Path | None = None
        super().__init__(dataclass_types, **kwargs)

    def error(self, message):
        if found := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
            message += _nearest(found.group(1), re.findall(r"'([^']*)'", found.group(2)))
        elif found := re.match(r"the following arguments are required: (.*)$", message):
            message = f"{self.prog} needs {found.group(1)}; see {self.prog} --help"
        raise UsageError(message)

    def option_names(self) -> set[str]:
        return {action.dest for action in self._actions if action.dest != "help"}

    def parse_args_and_config(self, args=None, **kwargs):
        """Strict (see the module docstring); TRL's own with TRL's keyword arguments (remaining strings)."""
        if kwargs:
            return super().parse_args_and_config(args, **kwargs)
        args = list(args) if args is not None else sys.argv[1:]
        for arg in args:
            if arg.startswith("-") and (message := renamed(arg)):
                raise UsageError(message)
        config_path, args = _pop_config(args)
        if config_path is not None:
            self._apply_config(config_path)
        try:
            *outputs, remaining = self.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
        except ValueError as err:  # a dataclass's __post_init__ (enum values, incompatible options)
            raise UsageError(str(err).strip().splitlines()[0]) from None
        if remaining:
            if not remaining[0].startswith("-"):
                raise UsageError(_stray_value(args, remaining[0]))
            flag = remaining[0]
            name = flag.lstrip("-").split("=", 1)[0]
            raise UsageError(f"unknown option {flag!r}{_nearest(name, self.option_names(), '--')}")
        for output in outputs:
            if is_dataclass(output):  # not the namespace of plain arguments (beam-sft prepare's INPUTs)
                check_choices(output)
        resolve_bundled_paths(outputs[0])
        return tuple(outputs)

    def _apply_config(self, config_path: str) -> None:
        import yaml

        from beam_sft.template.bundled import resolve_config

        try:
            path = resolve_config(config_path)
        except ValueError as err:
            raise UsageError(f"--config {err}") from None
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise UsageError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(config, dict):
            raise UsageError(f"{path}: must be a YAML mapping of option: value")
        if not isinstance(env := config.pop("env", {}), dict):
            raise UsageError(f"{path}: 'env' must be a mapping of VARIABLE: value")
        self.config_path = path
        known = self.option_names()
        for key in [k for k in config if k not in known]:
            if message := renamed(str(key)):
                raise UsageError(f"{path}: {message}")
            if key not in self.other_keys():
                raise UsageError(f"{path}: unknown key {key!r}{_nearest(str(key), known)}")
            del config[key]  # the other command's (training's learning_rate, prepare's output)
        for key, value in config.items():
            self._check_choice(path, key, value)
        for key, value in env.items():
            os.environ[str(key)] = str(value)
        self.set_defaults_with_config(**config)

    def _check_choice(self, path, key: str, value) -> None:
        """argparse checks `choices` on the command line only; a YAML value becomes a default, never checked."""
        action = next(a for a in self._actions if a.dest == key)
        if not action.choices or value is None:
            return
        choices = [str(getattr(c, "value", c)) for c in action.choices]
        if str(getattr(value, "value", value)) not in choices:
            raise UsageError(f"{path}: {key}: {value!r} is not one of {', '.join(choices)}"
                             f"{_nearest(str(value), choices)}")


def _stray_value(args: list[str], value: str) -> str:
    """The message for a value no option takes: most often a second value after a one-value option."""
    before = args[:args.index(value)] if value in args else []
    if (option := next((a for a in reversed(before) if a.startswith("--")), None)) is None:
        return f"unexpected argument {value!r}: options are given as --name value"
    if option.split("=", 1)[0] in ("--dataset_name", "--eval_dataset_name"):
        return (f"{option} takes one dataset, and {value!r} is a second: for several files give a glob "
                f"({option} 'data/*.jsonl') or a directory, or list them under `datasets:` in a --config YAML "
                "(docs/data.md#mixtures-several-sources-in-shares)")
    return f"{option} takes one value, and {value!r} is a second (quote a value with spaces)"


def _pop_config(args: list[str]) -> tuple[str | None, list[str]]:
    given = [a for a in args if a == "--config" or a.startswith("--config=")]
    if len(given) > 1:
        raise UsageError(f"--config is given {len(given)} times: one config per run; merge the YAML files into one, "
                         "or set single options on the command line after it (--learning_rate 1e-4)")
    for i, arg in enumerate(args):
        if arg == "--config":
            if i + 1 >= len(args):
                raise UsageError("--config needs a value: a YAML path or a shipped config's name")
            return args[i + 1], args[:i] + args[i + 2:]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1], args[:i] + args[i + 1:]
    return None, args


def check_choices(options) -> None:
    """Every field with `choices` metadata holds one of them, wherever its value came from."""
    for f in fields(options):
        choices = f.metadata.get("choices")
        value = getattr(options, f.name)
        if choices and value is not None and value not in choices:
            raise UsageError(f"{f.name}: {value!r} is not one of {', '.join(map(str, choices))}"
                             f"{_nearest(str(value), map(str, choices))}")


def resolve_bundled_paths(script_args) -> None:
    """A relative path option missing here but bundled (`data/samples` of the quickstart) names the bundled one."""
    from beam_sft.template.bundled import bundled

    for name in PATH_FIELDS:
        value = getattr(script_args, name, None)
        if not isinstance(value, str) or Path(value).is_absolute() or Path(value).exists():
            continue
        if (candidate := bundled(value)).exists():
            logger.info("%s %s: not in %s, using the bundled %s", name, value, os.getcwd(), candidate)
            setattr(script_args, name, str(candidate))


def make_parser(prog: str | None = None, description: str | None = None) -> BeamTrlParser:
    """The parser of `beam-sft train` and `scripts/train.py`: ScriptArguments, BeamSFTConfig, ModelConfig."""
    from trl import ModelConfig

    from beam_sft.train.config import BeamSFTConfig, ScriptArguments

    # allow_abbrev off: `--learning_rat` would silently set learning_rate.
    return BeamTrlParser((ScriptArguments, BeamSFTConfig, ModelConfig), prog=prog, description=description,
                         allow_abbrev=False, other_keys=lambda: PREPARE_ONLY)
