"""Row: `beam-sft prepare` (the training data phase) at two sizes, against the in-memory reference path."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.rows.measure import REPO_DIR, _log, _rusage_run
from benchmarks.rows.workload import write_openai_jsonl

# MiB of generated OpenAI JSONL: the second size is 4x the first (the memory-flatness goal compares them).
PREPARE_MB = {"full": (250, 1000), "quick": (8, 32), "smoke": (1, 4)}
_LEGACY_PATH = (
    "import sys\n"
    f"sys.path.insert(0, {str(REPO_DIR / 'tests')!r})\n"
    "from beam_sft.template.tokenizer import load_tokenizer\n"
    "from inmemory import prepare_dataset, read_rows, to_beam_records\n"
    "records, _ = to_beam_records(read_rows(sys.argv[1]))\n"
    "prepare_dataset(load_tokenizer(sys.argv[3] or None), records, max_length=int(sys.argv[2]))\n"
)


def bench_prepare(sizes_mb: Sequence[float], workdir: Path, seed: int, max_length: int,
                  legacy_sizes: int = 1, tokenizer: str | None = None) -> dict:
    """`beam-sft prepare` (`tokenizer`, default the bundled one) on generated OpenAI JSONL of each size, then a
    cached rerun of the largest, and today's in-memory path (read_rows + to_beam_records + prepare_dataset)
    on the first `legacy_sizes` sizes, each in its own process; wall seconds and peak RSS (ru_maxrss) per run."""
    out: dict = {"records": [], "seconds": [], "peak_rss_mb": [], "cpu_seconds": [], "input_mb": [],
                 "max_length": max_length, "legacy": {"records": [], "seconds": [], "peak_rss_mb": [], "cpu_seconds": []}}
    for i, mb in enumerate(sizes_mb):
        src, dst = workdir / f"prepare_{i}.jsonl", workdir / f"prepared_{i}"
        _log(f"prepare: writing {mb} MiB of OpenAI rows to {src}")
        rows = write_openai_jsonl(src, int(mb * 2**20), seed)
        # One process: figures per core (benchmarks/prepare.py measures the worker pool).
        command = [sys.executable, "-m", "beam_sft", "prepare", str(src), "-o", str(dst), "-q",
                   "--dataset_num_proc", "1", "--max_length", str(max_length),
                   *(["--tokenizer_name_or_path", tokenizer] if tokenizer else [])]
        _log(f"prepare: beam-sft prepare on {rows} rows")
        run = _rusage_run(command, workdir, f"prepare_{i}")
        out["records"].append(rows)
        out["seconds"].append(run["seconds"])
        out["peak_rss_mb"].append(run["peak_rss_mb"])
        out["cpu_seconds"].append(run["cpu_seconds"])
        out["input_mb"].append(src.stat().st_size / 2**20)
        if i == len(sizes_mb) - 1:
            _log("prepare: cached rerun (same files, tokenizer, settings)")
            out["cached_seconds"] = _rusage_run(command, workdir, f"prepare_{i}_cached")["seconds"]
        if i < legacy_sizes:
            _log(f"prepare: today's in-memory path on {rows} rows")
            legacy = _rusage_run([sys.executable, "-c", _LEGACY_PATH, str(src), str(max_length), tokenizer or ""],
                                 workdir, f"legacy_{i}")
            out["legacy"]["records"].append(rows)
            out["legacy"]["seconds"].append(legacy["seconds"])
            out["legacy"]["peak_rss_mb"].append(legacy["peak_rss_mb"])
            out["legacy"]["cpu_seconds"].append(legacy["cpu_seconds"])
        shutil.rmtree(dst, ignore_errors=True)
        src.unlink()
    return out


def prepare_goals(fig: dict) -> list[dict]:
    prep = fig.get("prepare")
    if not prep:
        return []
    (n1, n2), (t1, t2), (r1, r2) = prep["records"], prep["seconds"], prep["peak_rss_mb"]
    rows = [
        {"name": f"prepare: peak RSS at {n2:,} vs {n1:,} records", "ours": f"{r2:,.0f} MiB",
         "reference": f"{r1:,.0f} MiB", "ratio": f"{r2 / r1:.2f}x", "goal": "<= 1.25x", "ok": r2 <= 1.25 * r1},
        {"name": f"prepare: peak RSS at {prep['input_mb'][1]:,.0f} MiB of JSONL", "ours": f"{r2:,.0f} MiB",
         "reference": "-", "ratio": "-", "goal": "< 2048 MiB", "ok": r2 < 2048},
        {"name": "prepare: cached rerun vs first run", "ours": f"{prep['cached_seconds']:.1f} s",
         "reference": f"{t2:.1f} s", "ratio": f"{100 * prep['cached_seconds'] / t2:.0f}%", "goal": "<= 10%",
         "ok": prep["cached_seconds"] <= 0.1 * t2},
    ]
    legacy = prep.get("legacy") or {}
    if legacy.get("records"):
        # Per CPU-second (the process and its children): steadier than wall time on a shared machine.
        ours, old = n1 / prep["cpu_seconds"][0], legacy["records"][0] / legacy["cpu_seconds"][0]
        wall_ours, wall_old = n1 / t1, legacy["records"][0] / legacy["seconds"][0]
        rows.append({"name": f"prepare: records per CPU-s vs today's in-memory path ({n1:,} records)",
                     "ours": f"{ours:,.0f} rec/CPU-s ({wall_ours:,.0f} rec/s wall), {r1:,.0f} MiB",
                     "reference": f"{old:,.0f} rec/CPU-s ({wall_old:,.0f} rec/s wall), "
                                  f"{legacy['peak_rss_mb'][0]:,.0f} MiB",
                     "ratio": f"{ours / old:.2f}x", "goal": ">= 1x", "ok": ours >= old})
    return rows
