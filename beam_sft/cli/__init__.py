"""The `beam-sft` command: one module per subcommand (its `register(subparsers)`), one error table."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import importlib
import itertools
import os
import re
import sys
from pathlib import Path

from beam_sft.errors import BeamSFTError, UsageError

# name -> module under beam_sft.cli (the name, "-" spelled "_"); order is the order of --help.
COMMANDS = {name: name.replace("-", "_") for name in (
    "convert", "check-template", "inspect", "prepare", "eval", "contamination", "export", "backfill", "augment",
    "beamify", "train")}

# A command whose removed option has another successor than RENAMED's: eval reads the held-out split.
RENAMED_IN = {"eval": {"split": "--dataset_test_split NAME"}}


def nearest(word: str, candidates) -> str:
    """` (did you mean 'x'?)` with the candidate nearest to `word`, or ""."""
    near = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with the error table's one-line messages. Abbreviated options are refused:
    `--max_record` would silently set --max_records."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self.seen = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        print(f"error: {self.explain(message)}", file=sys.stderr)
        sys.exit(2)

    def explain(self, message: str) -> str:
        # the subcommand's parser that the arguments named (argparse reports unknown ones from the top)
        commands = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})
        parser = next((commands[a] for a in self.seen if a in commands), self)
        see = f"see {parser.prog} --help"
        if found := re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message):
            choices = re.findall(r"'([^']*)'", found.group(3))
            return (f"{found.group(1).split('/')[0]} {found.group(2)!r} is not one of {', '.join(choices)}"
                    f"{nearest(found.group(2), choices)}")
        if found := re.match(r"unrecognized arguments: (.*)$", message):
            first = found.group(1).split()[0]
            if not first.startswith("-"):
                return (f"unexpected argument {first!r}: a second value where one is taken (quote a value with "
                        f"spaces; a glob or a directory names several files); {see}")
            options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
            return f"unknown option {first.split('=', 1)[0]!r}{nearest(first.split('=', 1)[0], options)}; {see}"
        if found := re.match(r"the following arguments are required: (.*)$", message):
            return f"{parser.prog} needs {found.group(1)}; {see}"
        return f"{message}; {see}"


def make_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="beam-sft", description="Fine-tuning toolkit for Beam Harmony chat data.",
                                     epilog="Set BEAM_SFT_DEBUG=1 to see tracebacks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        importlib.import_module(f"beam_sft.cli.{module_name}").register(sub)
    return parser


def run_guarded(func, args) -> int:
    """Run a command, turning known errors into the error table's one-line messages and exit codes."""
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # anything unexpected still gets one line unless debugging
        if os.environ.get("BEAM_SFT_DEBUG"):
            raise
        if isinstance(err, BeamSFTError):
            if str(err):  # a rank other than 0 of a preempted job has nothing to add
                print(f"{getattr(err, 'prefix', 'error')}: {err}", file=sys.stderr)
            return err.exit_code
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if "huggingface.co" in str(err):  # transformers' answer to a local path that does not exist
            text += (" (a model or tokenizer path that does not exist is looked up as a hub id: check the paths "
                     f"given{'; HF_HUB_OFFLINE=1 forbids downloading' if _offline() else ''})")
        print(f"error: {type(err).__name__}: {text} (set BEAM_SFT_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def check_renamed(command: str, argv: list[str]) -> None:
    """Refuse a removed data option (`--limit 5`) naming its new spelling, before anything is parsed."""
    from beam_sft.dataset.arguments import RENAMED, renamed

    table = {**RENAMED, **RENAMED_IN.get(command, {})}
    for arg in itertools.takewhile(lambda a: a != "--", argv):
        if arg.startswith("--") and (message := renamed(arg, table)):
            raise UsageError(message)


def parse_and_run(parser: argparse.ArgumentParser, command: str, argv: list[str]) -> int:
    """Refuse a removed option (`check_renamed`), parse `argv` and run `args.func`; the exit status."""
    args = run_guarded(functools.partial(check_renamed, command), argv) or parser.parse_args(argv)
    if isinstance(args, int):
        return args
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return run_guarded(args.func, args)


def command_main(module: str, register, name: str):
    """A subcommand module's `main(argv=None)`, run at once when `module` is `__main__`."""
    def main(argv: list[str] | None = None) -> int:
        parser = ArgumentParser(prog="beam-sft")
        register(parser.add_subparsers())
        return parse_and_run(parser, name, [name, *(argv if argv is not None else sys.argv[1:])])

    if module == "__main__":
        sys.exit(main())
    return main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return parse_and_run(make_parser(), next((a for a in argv if not a.startswith("-")), ""), argv)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for name in ("config.json", "tokenizer_config.json", "adapter_config.json"):
        try:
            if isinstance(try_to_load_from_cache(repo_id, name), str):
                return True
        except Exception:  # noqa: BLE001, S112  (an id the cache cannot hold is simply not there)
            continue
    return False


def check_local(source: str, option: str, hint: str) -> None:
    """Refuse a model, adapter or tokenizer path that names no local directory (or usable hub id) in one line:
    transformers would answer a mistyped path with "couldn't connect to huggingface.co"."""
    path = Path(source).expanduser()
    if path.exists():
        return
    near = ""
    local_parent = path.parent != Path(".") and path.parent.is_dir()
    if local_parent:
        siblings = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
        if found := difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.6):
            near = f" (did you mean {str(path.parent / found[0])!r}?)"
        elif siblings:
            near = f" ({path.parent} holds {', '.join(siblings[:5])}{', ...' if len(siblings) > 5 else ''})"
    hub_like = _HUB_ID.match(source) is not None and not local_parent
    if hub_like and (_cached(source) or not _offline()):
        return
    offline = (", and as a hub id it is not in the local cache while HF_HUB_OFFLINE=1 forbids downloading it "
               "(unset HF_HUB_OFFLINE to download it)") if hub_like else ""
    raise UsageError(f"{option} {source!r}: no such directory{near}{offline}; {hint}")


def add_command(subparsers, name: str, func, help: str, description: str, epilog: str | None = None):
    """Add the subcommand `name`, which runs `func(args)`, its texts shown as written; returns its parser."""
    parser = subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=func)
    return parser


def boolean(text: str) -> bool:
    """A true/false option value, spelled as TRL's parser takes it (true/false, yes/no, t/f, y/n, 1/0)."""
    if text.lower() in ("true", "yes", "t", "y", "1"):
        return True
    if text.lower() in ("false", "no", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def data_option(parser, name: str, **kwargs) -> None:
    """Add the data setting `--name`, its dash form (`--max-records`) accepted too, as TRL's parser does."""
    dashed = name.replace("_", "-")
    parser.add_argument(f"--{name}", *([f"--{dashed}"] if dashed != name else []), **kwargs)


def add_rewrite_arguments(parser, own) -> None:
    """The options of a command that rewrites records (augment, backfill), `own(parser)`'s among them."""
    from beam_sft.validate.convert import INPUT_FORMATS

    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="files (.jsonl, .json, .parquet), globs, directories, save_to_disk dirs or hub ids")
    parser.add_argument("-o", "--output", required=True, help="output: .jsonl, .parquet or a directory")
    data_option(parser, "dataset_format", choices=INPUT_FORMATS, default="auto",
                help="input format (default: auto, detected per record)")
    own(parser)
    parser.add_argument("--rejects", metavar="PATH", help="write the records the converters reject here")
    parser.add_argument("--stats", metavar="PATH", help="write the run's counts here as JSON")
    data_option(parser, "dataset_train_split", default="train", metavar="NAME",
                help="split of a hub dataset (default: train)")
    data_option(parser, "max_records", type=int, metavar="N", help="read at most N input records")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def progress_bar(desc: str, quiet: bool, total: int | None = None):
    """The progress bar of a command reading records (on stderr; off with -q or when stderr is no terminal)."""
    from tqdm import tqdm

    return tqdm(desc=desc, unit=" rec", total=total, file=sys.stderr, disable=quiet or None, mininterval=0.5)


def quiet_datasets() -> None:
    """The datasets library's bars off: its switch is read when it is imported (importing it here just to
    silence it would cost a second)."""
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


@contextlib.contextmanager
def committed(*outputs):
    """Commit every output (None skipped) when the block ends, abort them all if it raises."""
    outputs = [o for o in outputs if o is not None]
    try:
        yield
        for output in outputs:
            output.commit()
    except BaseException:
        for output in outputs:
            output.abort()
        raise


def sources_besides(inputs: list[str], output: str, **options) -> list:
    """The sources of INPUTs (`beam_sft.records.files.data_sources`), refusing an output that is one of them."""
    from beam_sft.records.files import data_sources

    sources = data_sources(inputs, **options)
    if any(os.path.abspath(src.name) == os.path.abspath(output) for src in sources):
        raise UsageError(f"{output}: output is also an input")
    return sources


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a hub (or hub-like local) dataset and the column mapping."""
    group = parser.add_argument_group("hub datasets (an id, or a directory laid out like a hub repository)")
    data_option(group, "dataset_config", metavar="NAME", help="the subset (load_dataset's `name`)")
    data_option(group, "dataset_revision", metavar="REV", help="branch, tag or commit sha of the hub dataset")
    data_option(group, "dataset_data_dir", metavar="DIR", help="load_dataset's data_dir inside the dataset")
    data_option(group, "dataset_data_files", metavar="PATTERN", action="append",
                help="load_dataset's data_files inside the dataset (repeatable)")
    data_option(parser, "dataset_columns", metavar="KEY=COLUMN[,...]",
                help="rename columns to the record keys the converters read, before the format is detected, "
                     "e.g. messages=conversations,tools=functions")
