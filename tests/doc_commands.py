"""Every command the docs tell a user to run, checked against the code that would run it.

`commands(path)` finds, in the fenced shell blocks of a Markdown page (and in inline code spans that start like
a command), each command line that calls `beam-sft`, `convert-dataset`, `python -m beam_sft`, a
`scripts/*.py` (also under `accelerate launch` or `sbatch scripts/slurm_multinode.sh`) or `make`.
`problem(command)` checks one against the real argument parsers, and for a training command the checks the
run makes before it loads weights (`run.check_arguments`, and on the meta device the LoRA config the model
would get: the tied-output refusal included); None when it passes.

What a page may write that is not a literal argument: `$VAR` / `<placeholder>` values, `[--optional flags]`
in brackets, and `...` (the rest elided: the command is checked for the options it names only). Inline code
spans are fragments, so for them only the options' names are checked.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"bash", "sh", "shell", "console", "zsh", ""}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
INLINE = re.compile(r"`([^`\n]+)`")
STARTS = re.compile(r"^((beam-sft|convert-dataset|make)(\s|$)|(python3?|\S*/python3?) (-m beam_sft|-m benchmarks|scripts/)|"
                    r"accelerate launch|sbatch\b.*scripts/slurm_multinode\.sh)")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
PLACEHOLDER = re.compile(r"\$\{?\w+\}?|<[^>]+>")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    argv: tuple[str, ...]
    inline: bool = False  # a fragment in prose: only its option names are checked
    elided: bool = False  # `...` stood in for the rest

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _segments(text: str) -> list[list[str]]:
    """The simple commands of one shell line (split on `&&`, `||`, `;`, `|`), comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: not a command line
        return []
    out, current = [], []
    for token in tokens:
        if token and set(token) <= set(";&|"):
            out.append(current)
            current = []
        else:
            current.append(token)
    out.append(current)
    return [c for c in out if c]


def _unwrap(argv: list[str]) -> tuple[list[str], bool]:
    """Strip env assignments, prompts and wrappers; optional `[...]` groups kept as plain arguments."""
    while argv and (ENV.match(argv[0]) or argv[0] in ("$", "time", "nohup", "env", "sudo")):
        argv = argv[1:]
    elided = "..." in argv or any(a.endswith("...") for a in argv)
    argv = [a for a in argv if a != "..." and not a.endswith("...")]
    argv = [a.strip("[]") if a.startswith("[") or a.endswith("]") else a for a in argv]
    return [a for a in argv if a], elided


def _logical_lines(block: list[tuple[int, str]]):
    buffer, start = "", None
    for number, raw in block:
        if start is None:
            start = number
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        yield start, buffer + raw
        buffer, start = "", None
    if buffer:
        yield start, buffer


def _closes(raw: str, fence: str) -> bool:
    """CommonMark: a closing fence is the opening's character, at least as many, and nothing after it."""
    stripped = raw.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def commands(path: Path) -> list[Command]:
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Command] = []
    block: list[tuple[int, str]] | None = None
    fence = None
    for number, raw in enumerate(lines, 1):
        match = FENCE.match(raw)
        if block is None and match:
            fence, lang = match.group(2), match.group(3).lower()
            block = [] if lang in SHELL_FENCES else None
            if block is None:
                fence = fence + "-skip"
            continue
        if fence and fence.endswith("-skip"):
            if _closes(raw, fence[:-5]):
                fence = None
            continue
        if block is not None:
            if _closes(raw, fence):
                found += _block_commands(page, block)
                block, fence = None, None
            else:
                block.append((number, raw))
            continue
        for span in INLINE.findall(raw):
            span = span.strip()
            if STARTS.match(span):
                for argv in _segments(span):
                    argv, elided = _unwrap(argv)
                    if argv and STARTS.match(" ".join(argv)):
                        found.append(Command(page, number, span, tuple(argv), inline=True, elided=elided))
    return found


def _block_commands(page: str, block: list[tuple[int, str]]) -> list[Command]:
    out = []
    for number, text in _logical_lines(block):
        stripped = text.strip().removeprefix("$ ")
        for argv in _segments(stripped):
            argv, elided = _unwrap(argv)
            if argv and STARTS.match(" ".join(argv)):
                out.append(Command(page, number, stripped, tuple(argv), elided=elided))
    return out


# ---------------------------------------------------------------------------------------------- checking


def _script_module(name: str):
    path = ROOT / "scripts" / name
    name = f"_doc_script_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@cache
def _script_parser(name: str):
    return _script_module(name).make_parser()


@cache
def _beam_sft_parser():
    from beam_sft.cli import make_parser

    return make_parser()


@cache
def _make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, flags=re.MULTILINE))


def _options_of(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def _subparser(parser, name: str):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def _has_placeholder(argv) -> bool:
    return any(PLACEHOLDER.search(a) for a in argv)


def _argparse_problem(parser, args: list[str], command: Command) -> str | None:
    """Parse as the program would; for fragments (inline, elided, placeholders) only the option names."""
    if command.inline or command.elided or _has_placeholder(args):
        known = _options_of(parser)
        unknown = [a.split("=", 1)[0] for a in args
                   if a.startswith("--") and a.split("=", 1)[0] not in known and a != "--"]
        return f"unknown option(s) {unknown}" if unknown else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit_.code}"
    return _abbreviated(parser, args)


def _abbreviated(parser, args: list[str]) -> str | None:
    """argparse takes `--distractor` for `--distractors`; a page must write the real name."""
    import argparse

    by_name = {s: action for action in parser._actions for s in action.option_strings}
    for arg in args:
        name = arg.split("=", 1)[0]
        if arg == "--":
            return None
        if name in by_name:
            if by_name[name].nargs == argparse.REMAINDER:
                return None  # the rest belongs to another program (demo_real.py --train-args ...)
            continue
        if name.startswith("--"):
            return f"{name} is not an option's full name (argparse took it as an abbreviation)"
    return None


def _train_problem(args: list[str], command: Command) -> str | None:
    """scripts/train.py / beam-sft train: TRL's parser with the YAML config, the run's own argument checks,
    and the model-level refusals it makes before training (on the meta device, when the model is local)."""
    from beam_sft.errors import BeamSFTError
    from beam_sft.train.sft import make_parser

    parser = make_parser(prog="train.py")
    if command.inline or command.elided or _has_placeholder(args):
        known = {f"--{name}" for name in parser.option_names()} | {"--config", "--help", "-h", "--help-all"}
        unknown = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in known]
        return f"unknown option(s) {unknown}" if unknown else None
    if {"--help", "-h", "--help-all"} & set(args):
        return None
    import torch

    if not torch.cuda.is_available() and "--use_cpu" not in args:
        args = [*args, "--use_cpu", "true"]  # a GPU command (bf16) checked on a CPU machine: the same options
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(args)
        _train_checks(script_args, training_args, model_args)
    except BeamSFTError as err:
        return f"refused: {err}"
    return None


def _train_checks(script_args, training_args, model_args) -> None:
    from beam_sft.train import run
    from beam_sft.train.dry_run import parameter_counts, tokenizer_and_config

    if script_args.dry_run:  # cheap: documented to be run, so run it (the data phase is cached)
        from beam_sft.train.dry_run import dry_run

        dry_run(script_args, training_args, model_args)
        return
    run.check_arguments(script_args, training_args)
    name = model_args.model_name_or_path
    if name is not None and not Path(name).exists():
        return  # a hub id: its config is not here (offline); the run checks it after loading
    _tokenizer, config, _ = tokenizer_and_config(script_args, training_args, model_args)
    parameter_counts(config, script_args, model_args)  # LoRA built on the meta device: tied-output refusal


def problem(command: Command) -> str | None:
    argv = list(command.argv)
    head = argv[0]
    if head in ("python", "python3") or head.endswith(("/python", "/python3")):
        argv = argv[1:]
        if argv[:2] == ["-m", "beam_sft"]:
            return _beam_sft_problem(argv[2:], command)
        if argv[:2] == ["-m", "benchmarks"]:
            return _benchmarks_problem(argv[2:], command)
        return _script_problem(argv, command)
    if head == "beam-sft":
        return _beam_sft_problem(argv[1:], command)
    if head == "convert-dataset":
        return _beam_sft_problem(["convert", *argv[1:]], command)
    if head == "make":
        targets = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
        missing = [t for t in targets if t not in _make_targets()]
        return f"no make target {missing}" if missing else None
    if head == "accelerate":
        scripts = [i for i, a in enumerate(argv) if a.startswith("scripts/") and a.endswith(".py")]
        if "-m" in argv and argv.index("-m") + 1 < len(argv):
            module = argv[argv.index("-m") + 1]
            if module in ("beam_sft.cli.train", "beam_sft"):
                rest = argv[argv.index("-m") + 2:]
                return _train_problem(rest if module != "beam_sft" else rest[1:], command)
            return f"accelerate launch -m {module}: not a beam-sft entry point"
        if not scripts:
            return None if command.inline and len(argv) == 2 else "accelerate launch of no scripts/*.py"
        return _script_problem(argv[scripts[0]:], command)
    if head == "sbatch":
        index = next(i for i, a in enumerate(argv) if a.endswith("slurm_multinode.sh"))
        rest = argv[index + 1:]
        if not rest:
            return "slurm_multinode.sh needs a config"
        return _train_problem(["--config", *rest], command)
    return f"not a command this checker knows: {head}"


def _beam_sft_problem(args: list[str], command: Command) -> str | None:
    if not args or args[0].startswith("-"):
        return _argparse_problem(_beam_sft_parser(), args, command)
    if args[0].isupper():  # `beam-sft COMMAND --help`: the general form
        return None
    sub = _subparser(_beam_sft_parser(), args[0])
    if sub is None:
        return f"no beam-sft command {args[0]!r}"
    if args[0] == "train":
        from beam_sft.cli.train import split_launch_args

        _, train_args = split_launch_args(args[1:])
        return _train_problem(train_args, command)
    if args[0] == "prepare":
        return _prepare_problem(args[1:], command)
    return _argparse_problem(sub, args[1:], command)


def _prepare_problem(args: list[str], command: Command) -> str | None:
    """beam-sft prepare: TRL's parser with the YAML config (parsed, nothing prepared); with a YAML the page
    writes (`mix.yaml`), the options' names only."""
    from beam_sft.cli.prepare import make_parser, parse
    from beam_sft.errors import BeamSFTError
    from beam_sft.template.bundled import resolve_config

    config = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
    try:
        page_yaml = config is not None and not resolve_config(config).exists()
    except ValueError:
        page_yaml = True
    if command.inline or command.elided or _has_placeholder(args) or page_yaml:
        known = _options_of(make_parser()) | {"--config"}
        unknown = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in known]
        return f"unknown option(s) {unknown}" if unknown else None
    if "--help" in args or "-h" in args:
        return None
    try:
        parse(args)
    except BeamSFTError as err:
        return f"refused: {err}"
    return None


def _benchmarks_problem(args: list[str], command: Command) -> str | None:
    """`python -m benchmarks [its options] NAME [the benchmark's options]`."""
    import importlib

    from benchmarks.__main__ import make_parser as entry_parser
    from benchmarks.registry import BENCHMARKS

    names = (*BENCHMARKS, "list", "report")
    split = next((i for i, a in enumerate(args) if a in names or a == "NAME"), None)
    if split is None:
        return f"python -m benchmarks names no benchmark (one of {', '.join(names)})"
    if args[split] == "NAME":  # the general form
        return None
    if problem := _argparse_problem(entry_parser(), args[:split + 1], command):
        return problem
    if args[split] in ("list", "report"):
        return f"{args[split]} takes no options" if args[split + 1:] else None
    module = importlib.import_module(f"benchmarks.{BENCHMARKS[args[split]][0]}")
    return _argparse_problem(module.make_parser(), args[split + 1:], command)


def _script_problem(argv: list[str], command: Command) -> str | None:
    script = argv[0].removeprefix("./")
    if not script.startswith("scripts/"):
        return f"not a scripts/ path: {script}"
    name = script.removeprefix("scripts/")
    if PLACEHOLDER.search(name):  # `python scripts/<name>.py --help`: the general form
        return None
    if not (ROOT / script).is_file():
        return f"no such script: {script}"
    if name == "train.py":
        return _train_problem(argv[1:], command)
    module = _script_module(name)
    if not hasattr(module, "make_parser"):
        return f"{script} has no make_parser(): its options cannot be checked"
    parser = _script_parser(name)
    if hasattr(parser, "parse_args_into_dataclasses") and not hasattr(parser, "_actions"):
        return None
    return _argparse_problem(parser, argv[1:], command)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
