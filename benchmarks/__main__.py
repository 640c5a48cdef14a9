"""`python -m benchmarks NAME [options]`: every beam-sft benchmark behind one command, each run one result row.

    python -m benchmarks list                                   # the benchmarks and what each measures
    python -m benchmarks data --quick                           # tokenization, conversion, training, memory, prepare
    python -m benchmarks convert --records 20000                # OpenAI -> Beam against the orjson floor
    python -m benchmarks prepare --help                         # every benchmark explains its options
    python -m benchmarks report                                 # rewrite docs/performance.md from the results file

A run appends one JSON line to `benchmarks/results.jsonl` (`--results PATH` elsewhere, `--no-record` not at all):
the benchmark, its arguments, its figures (what its `--json` writes), the exit status, the seconds it took, the
machine (CPU, cores, load, GPU) and the versions (python, torch, transformers, trl, tokenizers, datasets) and the git
commit it ran on, with `dirty` when the tree had changes. `report` renders the latest row of each benchmark into
docs/performance.md; `tests/test_benchmarks.py` fails when that page and the results file disagree.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.registry import BENCHMARKS, PAGE, REPO, RESULTS


def _git() -> dict:
    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    # the results file and the page made from it change with every run: not "uncommitted changes" of the code
    changes = run("status", "--porcelain", "--", ".", ":!benchmarks/results.jsonl", ":!docs/performance.md")
    return {"commit": run("rev-parse", "--short=12", "HEAD") or None, "dirty": bool(changes)}


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "tokenizers", "datasets", "beam-sft"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _machine() -> dict:
    from benchmarks.rows.measure import cpu_name

    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2), "gpu": gpu}


def run_benchmark(name: str, argv: list[str], results: Path | None) -> int:
    module_name, _ = BENCHMARKS[name]
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    module = importlib.import_module(f"benchmarks.{module_name}")
    if any(a in ("-h", "--help") for a in argv):
        return int(module.main(argv) or 0)
    own_json = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--json"), None)
    own_json = own_json or next((a.split("=", 1)[1] for a in argv if a.startswith("--json=")), None)
    with tempfile.TemporaryDirectory() as tmp:
        json_path = own_json or str(Path(tmp) / "figures.json")
        started, machine = time.time(), _machine()
        code = int(module.main(argv if own_json else [*argv, "--json", json_path]) or 0)
        seconds = time.time() - started
        try:
            figures = json.loads(Path(json_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            figures = None
    if results is not None:
        row = {"benchmark": name, "args": argv, "exit": code, "seconds": round(seconds, 1),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "git": _git(),
               "machine": machine, "versions": _versions(), "figures": figures}
        results.parent.mkdir(parents=True, exist_ok=True)
        with results.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        print(f"[benchmarks] {name}: exit {code}, {seconds:.0f} s, row appended to {results}", file=sys.stderr)
    return code


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
        epilog="\n".join(f"  {n:<20} {what}" for n, (_, what) in BENCHMARKS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", choices=[*BENCHMARKS, "list", "report"],
                        help="a benchmark (below), `list`, or `report` (docs/performance.md from the results)")
    parser.add_argument("--results", default=str(RESULTS), help=f"the results file (default: {RESULTS.relative_to(REPO)})")
    parser.add_argument("--no-record", action="store_true", help="run without appending a row")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the benchmark's own options follow its name; ours come before it
    split = next((i for i, a in enumerate(argv) if a in (*BENCHMARKS, "list", "report")), len(argv))
    args = make_parser().parse_args(argv[:split + 1])
    rest = argv[split + 1:]
    if args.name == "list":
        for name, (_, what) in BENCHMARKS.items():
            print(f"{name:<20} {what}")
        return 0
    if args.name == "report":
        from benchmarks.report import write_page

        print(write_page(Path(args.results), PAGE))
        return 0
    return run_benchmark(args.name, rest, None if args.no_record else Path(args.results))


if __name__ == "__main__":
    sys.exit(main())
