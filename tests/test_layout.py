"""The package's structure as a contract: data flows one way through the layers, with no import circles, no
module imports another's private names, and functions stay short.

Layers, lowest first; a module may import its own layer and the ones below it, never one above. Imports inside
functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "beam_sft"

LAYERS = (
    "errors",  # the one error type for bad records, and the CLI's error table
    "storage",  # the cache directory, cache-key hashes and atomic writes: what every layer writes to disk with
    "records",  # the Beam record type, constants, file reading and output writers
    "template",  # the chat template, response template, the bundled tokenizer, conformance rules
    "formats",  # pure converters: raw record -> unvalidated Beam record
    "validate",  # Beam rules, and the one per-record conversion entry
    "augment",  # transforms over validated Beam records that teach when and which tool (beam-sft augment)
    "render",  # record -> input_ids + assistant_masks
    "dataset",  # examples, truncation, the data phase, prepared datasets
    "report",  # mask views, HTML pages, statistics
    "eval",  # generation, parsing, metrics
    "backfill",  # teacher models fill missing reasoning (beam-sft backfill)
    "serve",  # the serving rules: servable model directories, the one checked save, export
    "model",  # model preparation: beamify, marker-row init, the model a training run starts from
    "train",  # trainer, packing, MoE, checkpoints and faults
    "cli",  # one module per command
)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "beam_sft" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every beam_sft module this file imports, at any depth (`from beam_sft.x import y` may name a module y)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("beam_sft"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("beam_sft") and not node.level:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                base = PACKAGE.parent / candidate.replace(".", "/")
                is_module = base.with_suffix(".py").exists() or (base / "__init__.py").exists()
                found.add(candidate if is_module else node.module)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_package_is_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert packages | modules <= set(LAYERS), sorted((packages | modules) - set(LAYERS))


def test_no_import_from_a_higher_layer():
    wrong = []
    for module, imported in sorted(_graph().items()):
        own = _layer(module)
        if own is None:
            continue
        for target in sorted(imported):
            layer = _layer(target)
            if layer is not None and layer > own:
                wrong.append(f"{module} (layer {LAYERS[own]}) imports {target} (layer {LAYERS[layer]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    graph = _graph()
    modules = set(graph)

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    edges = {m: {t for t in (resolve(x) for x in imported) if t and t != m} for m, imported in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_no_import_of_another_modules_private_names():
    """`from beam_sft.x import _y` (at any depth, lazy imports included) couples a module to another's insides:
    what two modules share is public and named for what it does."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("beam_sft")):
                continue
            if node.level or node.module == module:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                wrong.append(f"{module}:{node.lineno} imports {', '.join(private)} from {node.module}")
    assert not wrong, "\n".join(wrong)


MAX_FUNCTION_LINES = 80


def test_functions_are_short():
    """Every function and method of the package and the scripts fits in MAX_FUNCTION_LINES lines (its
    decorators, signature, docstring and body): a longer one is split into named steps."""
    long = []
    for root in (PACKAGE, PACKAGE.parent / "scripts"):
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    lines = node.end_lineno - start + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_data_settings_are_built_in_one_place():
    """`beam-sft prepare` and training get their DataSettings from one function (dataset/arguments.py), so the
    same options always mean the same prepared data."""
    builders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "DataSettings":
                builders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert len(builders) == 1 and builders[0].startswith("beam_sft/dataset/arguments.py:"), builders


def test_scripts_and_benchmarks_import_only_what_beam_sft_has():
    """scripts/ and benchmarks/ import beam_sft's public names, and each still exists: a rename or a move inside
    the package cannot leave `make demo` or a benchmark to fail at run time."""
    import importlib

    wrong = []
    for folder in ("scripts", "benchmarks"):
        for path in sorted((PACKAGE.parent / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("beam_sft")):
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                    if alias.name.startswith("_"):
                        wrong.append(f"{where} imports the private {node.module}.{alias.name}")
                    elif not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            wrong.append(f"{where}: {node.module} has no {alias.name}")
    assert not wrong, "\n".join(wrong)
