"""The docs as a contract: they name modules, paths, options and reason codes that exist, and their links resolve.

When a module moves or an option is renamed, these fail and name the page to update, so README.md and docs/
cannot quietly drift from the code.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "beam_sft"
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.glob("*.md")])

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"\bbeam_sft(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"^\s*from (beam_sft(?:\.\w+)*) import ([\w, ()]+)", re.MULTILINE)
# repository paths worth checking: the package, scripts, configs and tests (data/ and outputs/ in examples are
# often the reader's own)
REPO_PATH = re.compile(r"(?<![\w/.-])((?:beam_sft|scripts|configs|tests)/[\w./-]*)")


def _split(text: str) -> tuple[str, str]:
    """(prose, code): the page's text outside and inside fenced code blocks."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return "\n".join(prose), "\n".join(code)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------- architecture.md


def _package_modules() -> set[str]:
    """Every module as the page writes it: `beam_sft/x/y.py`, and a subpackage as `beam_sft/x/` (its __init__)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = _rel(path)
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = _rel(path.parent) + "/"
        found.add(rel)
    return found


def _architecture_rows() -> list[str]:
    """The module named by each row of architecture.md's module table (first cell, one backticked path)."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].startswith("`beam_sft/"):
            names = INLINE_CODE.findall(cells[0])
            assert len(names) == 1, f"architecture.md: one module per line, got {cells[0]!r}"
            rows.append(names[0])
    return rows


def test_architecture_names_every_module_once():
    rows = _architecture_rows()
    modules = _package_modules()
    missing = sorted(modules - set(rows))
    stale = sorted(set(rows) - modules)
    duplicated = sorted({r for r in rows if rows.count(r) > 1})
    assert not missing, f"docs/architecture.md has no line for: {missing}"
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
    assert not duplicated, f"docs/architecture.md names these twice: {duplicated}"


# ---------------------------------------------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    prose, _ = _split(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors = set()
    for line in prose.splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(anchors)


def _broken_links(page: Path) -> list[str]:
    prose, _ = _split(page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {_rel(dest)})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    assert not _broken_links(page), f"{_rel(page)}: {_broken_links(page)}"


def test_slug_follows_github():
    assert _slug("Truncation policy (`--truncation_policy`, applied before packing)") == (
        "truncation-policy---truncation_policy-applied-before-packing"
    )
    assert _slug("Training figures (measured on a 2-core CPU VM, torch 2.13 CPU)") == (
        "training-figures-measured-on-a-2-core-cpu-vm-torch-213-cpu"
    )


def test_the_docs_pages_are_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in DOCS.glob("*.md") if f"](docs/{p.name}" not in readme]
    assert not unlinked, f"README.md links to no docs page named {unlinked}"


# ---------------------------------------------------------------------------------- names and paths that exist


@cache
def _top_level_names(module_file: Path) -> frozenset[str]:
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _module_file(dotted: str) -> Path | None:
    base = ROOT / dotted.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _resolves(dotted: str, names: tuple[str, ...] = ()) -> bool:
    """`beam_sft.a.b[.attr]` is a module, or a module and one name it defines (or a submodule)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(".".join(parts[:cut]))
        if module is None:
            continue
        rest = parts[cut:] + list(names)
        if len(parts) - cut > 1:
            return False
        return all(
            n in _top_level_names(module) or _module_file(f"{'.'.join(parts[:cut])}.{n}") for n in rest
        )
    return False


def _unresolved_names(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    bad = [d for d in sorted(set(DOTTED.findall(text))) if not _resolves(d)]
    for module, imported in FROM_IMPORT.findall(text):
        names = tuple(n.strip() for n in imported.replace("(", "").replace(")", "").split(",") if n.strip())
        if not _resolves(module, names):
            bad.append(f"from {module} import {', '.join(names)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_modules_and_functions_exist(page):
    assert not _unresolved_names(page), (
        f"{_rel(page)} names what beam_sft does not have: {_unresolved_names(page)}"
    )


def _missing_paths(page: Path) -> list[str]:
    prose, code = _split(page.read_text(encoding="utf-8"))
    candidates = [p for span in INLINE_CODE.findall(prose) for p in REPO_PATH.findall(span)]
    candidates += REPO_PATH.findall(code)
    missing = set()
    for raw in candidates:
        path = raw.split("::")[0].rstrip(".,;:")
        if not path or any(c in raw for c in "{}<>*"):
            continue  # a pattern or a placeholder, not a path
        if not (ROOT / path).exists():
            missing.add(path)
    return sorted(missing)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_repository_paths_exist(page):
    assert not _missing_paths(page), f"{_rel(page)} names paths that do not exist: {_missing_paths(page)}"


# -------------------------------------------------------------------------------- reason codes, CLI options


def _reason_table_codes() -> list[str]:
    text = (DOCS / "formats.md").read_text(encoding="utf-8")
    section = text.split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    codes = []
    for line in section.splitlines():
        if line.startswith("| `"):
            codes.extend(INLINE_CODE.findall(line.split("|")[1]))
    return codes


def test_reason_code_table_equals_the_enum():
    from beam_sft.errors import Reason

    documented = _reason_table_codes()
    assert sorted(documented) == sorted(set(documented)), "a reason code is listed twice"
    assert set(documented) == {r.value for r in Reason}, (
        f"docs/formats.md reason codes: missing {sorted({r.value for r in Reason} - set(documented))}, "
        f"not in beam_sft.errors.Reason {sorted(set(documented) - {r.value for r in Reason})}"
    )


def _subcommand_options() -> dict[str, list[str]]:
    import argparse

    from beam_sft.cli import make_parser
    from beam_sft.cli.prepare import make_parser as prepare_parser

    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # a data setting's dash form (`--max-records` beside `--max_records`) is an alias, not a second option
    options = {
        name: [s for action in p._actions for s in action.option_strings if s not in ("-h", "--help")
               and not ("-" in s[2:] and "--" + s[2:].replace("-", "_") in action.option_strings)]
        for name, p in sub.choices.items()
    }
    # prepare's options are TRL's parser's (the subcommand only dispatches): each by its own name, the
    # `--no_x` complements and `--x-y` spellings HfArgumentParser adds aside
    options["prepare"] = [action.option_strings[0] for action in prepare_parser()._actions
                          if action.option_strings and action.option_strings[0] not in ("-h", "--help")
                          and not action.option_strings[0].startswith("--no_")] + ["--config"]
    return options


def test_cli_page_lists_every_option_of_every_command():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    options = _subcommand_options()
    assert {"convert", "inspect", "prepare", "eval", "check-template"} <= set(options)
    missing = []
    for name, opts in options.items():
        if f"## `beam-sft {name}" not in text:
            missing.append(f"section beam-sft {name}")
            continue
        section = text.split(f"## `beam-sft {name}", 1)[1].split("\n## ", 1)[0]
        missing += [f"{name} {o}" for o in opts if not re.search(rf"`{re.escape(o)}[`\s=,]", section)]
    assert not missing, f"docs/cli.md does not document: {missing}"


def test_reference_page_is_what_the_parsers_say():
    """docs/reference.md is generated from the argument parsers (scripts/build_reference.py): it cannot drift."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_build_reference", ROOT / "scripts" / "build_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = ROOT / "docs" / "reference.md"
    assert page.read_text(encoding="utf-8") == module.render(), (
        "docs/reference.md is stale: run `python scripts/build_reference.py`")


# ---------------------------------------------------------------------------------------------- the record's walk


def _walk_section() -> str:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    return text.split("## One record, from a JSONL line", 1)[1].split("\n## ", 1)[0]


def _walk_steps() -> list[tuple[str, str]]:
    """(file, first function named) of each numbered step of architecture.md's walk of one record."""
    section = _walk_section()
    return re.findall(r"^\d+\. `(beam_sft/[\w/]+\.py)` — `([\w.]+)`", section, flags=re.MULTILINE)


def test_the_walk_of_one_record_is_what_the_code_does(tmp_path):
    """At most 8 files, each once, and a record prepared for real enters them in the order the page gives."""
    import sys

    from beam_sft.dataset.prepare import PrepareRun
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.template.tokenizer import load_tokenizer

    steps = _walk_steps()
    files = [f for f, _ in steps]
    assert 0 < len(files) <= 8 and len(set(files)) == len(files), files
    numbered = re.findall(r"^\d+\. ", _walk_section(), flags=re.MULTILINE)
    assert len(numbered) == len(steps), "every step of the walk names its file and a function of it"
    src = tmp_path / "one.jsonl"
    src.write_text((ROOT / "data" / "samples" / "openai.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n")
    entered: list[str] = []

    def profile(frame, event, arg):
        # the first call of each step's named function (a class: its methods), in its own file
        if event == "call":
            code = frame.f_code
            path = code.co_filename.replace("\\", "/")
            for file, name in steps:
                if path.endswith(file) and file not in entered and (
                        code.co_qualname == name or code.co_qualname.startswith(name + ".")):
                    entered.append(file)

    tokenizer = load_tokenizer()
    # The record's way starts with the read (step 1): the encoder's set-up, before any record, is not part of it.
    from beam_sft.render.encoder import get_encoder

    get_encoder(tokenizer)
    sys.setprofile(profile)
    try:
        PrepareRun([str(src)], tokenizer, DataSettings(), tmp_path / "out", num_proc=1).build()
    finally:
        sys.setprofile(None)
    assert entered == files, f"the page's order {files}, the code's {entered}"
