"""Throughput and memory benchmark of beam-sft's data path and training, against TRL and the floors.

One run, one generated workload (fixed seed: multi-turn conversations with reasoning on every assistant
turn, tool declarations, tool calls and their results), every row measured side by side:

* masked tokenization: our `MaskedEncoder` vs TRL's per-example preparation (`trl.data_utils._tokenize`,
  i.e. `apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`, which is what
  `SFTTrainer._prepare_dataset` maps over the dataset with `assistant_only_loss=True`) vs the floor (render
  every conversation to text with the chat template, then one batched tokenizer call, no masks); in one
  process, then `PrepareRun.build` with `num_proc` = 1 .. cores;
* conversion: OpenAI -> Beam records per second (`convert`, with orjson in and out) vs the floor of
  orjson load + dump of the same lines;
* training on the tiny model (CPU): real (non-pad) tokens per second and real-token fraction, padded vs
  packed (TRL's BFD packing, padding-free);
* memory: peak RSS of `beam-sft convert` on a generated OpenAI JSONL of `--memory_mb` (2 GB by default);
* prepare: `beam-sft prepare` (the training data phase) on generated OpenAI JSONL of two sizes, one 4x the
  other (`--prepare_mb`, 250 MB and 1 GB by default): seconds and peak RSS of each, a cached rerun, and
  today's in-memory path (read_rows + to_beam_records + prepare_dataset) side by side on the smaller one.

Run from the repository root:

```bash
python -m benchmarks data                              # the full table (20k conversations, 2 GB file)
python -m benchmarks data --quick --json bench.json    # the same rows, smaller (about a minute)
python -m benchmarks data --smoke --json /tmp/b.json   # seconds: what tests/test_bench.py runs
python -m benchmarks data --conversations 5000 --num_proc 1 2 --memory_mb 200 --train_steps 10
python -m benchmarks data --rows prepare --prepare_mb 64 256 --json /tmp/prepare.json   # the prepare row only
```

Each row is a module of `benchmarks/rows/` (workload, measure, tokenization, conversion, training,
memory, prepare, goals); this script runs the chosen rows and prints the goal table.

This is a benchmark, not a test: it prints the figures and whether each goal of the table is met, and exits
0 either way (non-zero only when something failed to run or ours disagrees with the reference).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
# Runnable as `python -m benchmarks data` from a checkout without installing the package.
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(REPO_DIR / "scripts"))

# The rows: importable once the path is set.
from benchmarks.rows.conversion import bench_conversion
from benchmarks.rows.goals import evaluate_goals, format_table
from benchmarks.rows.measure import _log, _timed, machine_info
from benchmarks.rows.memory import bench_memory
from benchmarks.rows.prepare import PREPARE_MB, bench_prepare
from benchmarks.rows.tokenization import bench_masked_tokenization
from benchmarks.rows.training import bench_training
from benchmarks.rows.workload import SEED, make_workload

PRESETS = {
    "full": {"conversations": 20_000, "memory_mb": 2048, "train_steps": 30, "train_records": 600, "max_length": 2048},
    "quick": {"conversations": 1_000, "memory_mb": 50, "train_steps": 8, "train_records": 160, "max_length": 2048},
    "smoke": {"conversations": 80, "memory_mb": 2, "train_steps": 3, "train_records": 16, "max_length": 512},
}
ROWS = ("tokenization", "conversion", "training", "memory", "prepare")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks data",
        description="Benchmark beam-sft's masked tokenization, conversion, training and converter memory, "
                    "side by side with TRL and the floors, on one generated workload.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a small run, about a minute")
    size.add_argument("--smoke", action="store_true", help="a tiny run, seconds (what the tests run)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    parser.add_argument("--conversations", type=int, help="workload size (default: 20000; --quick 1000)")
    parser.add_argument("--num_proc", type=int, nargs="+",
                        help="PrepareRun.build process counts to time (default: 1 .. usable cores; --smoke: 1)")
    parser.add_argument("--memory_mb", type=int, help="size of the generated JSONL for the memory row (default 2048)")
    parser.add_argument("--train_steps", type=int, help="optimizer steps per training mode (default 30)")
    parser.add_argument("--train_records", type=int, help="conversations prepared for training (default 600)")
    parser.add_argument("--max_length", type=int, help="training max_length and pack size (default 2048; --smoke 512)")
    parser.add_argument("--padded_batch", type=int, default=2, help="conversations per padded training batch")
    parser.add_argument("--packed_batch", type=int, default=1, help="packs of max_length per packed batch")
    parser.add_argument("--batch_size", type=int, default=512, help="records per encoder batch")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), help="which rows to run")
    parser.add_argument("--convert_args", default="--render-check sample --quiet",
                        help="options for convert-dataset in the memory row (the default render check, 'all', "
                             "renders every record: ~1 ms each, 10+ minutes on 2 GB; the memory it needs is the same)")
    parser.add_argument("--train_threads", type=int, default=1,
                        help="torch threads for the training row (1 is the steadiest on a shared machine)")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="tokenizer directory for the tokenization and training rows (default: the bundled "
                             "data/tokenizer; the real gpt-oss vocabulary: python scripts/build_o200k_tokenizer.py)")
    parser.add_argument("--prepare_mb", type=float, nargs=2, metavar=("MB1", "MB2"),
                        help="JSONL sizes for the prepare row (default 250 1000; --quick 8 32; --smoke 1 4)")
    parser.add_argument("--prepare_legacy_sizes", type=int, default=1, choices=(0, 1, 2),
                        help="run today's in-memory path on this many of the prepare sizes (its memory grows with "
                             "the data: about 11x the file)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--tmp_dir", help="where to write the generated JSONL and training output (default: system temp)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    preset = PRESETS["smoke" if args.smoke else "quick" if args.quick else "full"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if args.num_proc is None:
        args.num_proc = [1] if args.smoke else sorted({1, *range(2, cores + 1, max(1, cores // 4))} | {cores})
    if args.conversations < 1 or any(p < 1 for p in args.num_proc):
        raise SystemExit("--conversations and --num_proc must be positive")

    import transformers

    transformers.logging.set_verbosity_error()
    from beam_sft.template.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    fig: dict = {"machine": machine_info(), "config": {
        "tokenizer": args.tokenizer or "data/tokenizer", "vocabulary": len(tokenizer),
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full", "conversations": args.conversations,
        "seed": args.seed, "num_proc": args.num_proc, "memory_mb": args.memory_mb, "train_steps": args.train_steps,
        "train_records": args.train_records, "max_length": args.max_length, "padded_batch": args.padded_batch,
        "packed_batch": args.packed_batch, "command": " ".join(["python", "benchmarks/data.py", *(argv or sys.argv[1:])]),
    }}
    _log(f"generating {args.conversations} conversations (seed {args.seed})")
    records, _ = _timed(make_workload, args.conversations, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="beam-sft-bench-", dir=args.tmp_dir))
    started = time.perf_counter()
    try:
        if "tokenization" in args.rows:
            fig["masked_tokenization"] = bench_masked_tokenization(tokenizer, records, args.num_proc, args.batch_size)
        if "conversion" in args.rows:
            fig["conversion"] = bench_conversion(records)
        if "training" in args.rows:
            fig["training"] = bench_training(
                tokenizer, records[: args.train_records], steps=args.train_steps, max_length=args.max_length,
                padded_batch=args.padded_batch, packed_batch=args.packed_batch, seed=args.seed, workdir=workdir,
                threads=args.train_threads)
        if "memory" in args.rows:
            fig["memory"] = bench_memory(args.memory_mb, workdir, args.seed, args.convert_args.split())
            fig["peak_rss_mb"] = fig["memory"]["peak_rss_mb"]
        if "prepare" in args.rows:
            fig["prepare"] = bench_prepare(args.prepare_mb or PREPARE_MB[fig["config"]["mode"]], workdir, args.seed,
                                           args.max_length, args.prepare_legacy_sizes, args.tokenizer)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    fig["seconds"] = time.perf_counter() - started
    fig["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    goals = evaluate_goals(fig)
    fig["goals"] = {g["name"].strip(): {"ok": g["ok"], "ratio": g["ratio"], "goal": g["goal"]} for g in goals}
    table = format_table(fig, goals)
    print(table)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(fig, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        _log(f"figures written to {path}")
    tok = fig.get("masked_tokenization")
    if tok and tok["mismatches_vs_trl"]:
        print(f"error: ours differs from TRL's apply_chat_template on {tok['mismatches_vs_trl']} conversations "
              f"(first: {tok['first_mismatch']})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
