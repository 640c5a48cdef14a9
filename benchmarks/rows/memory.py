"""Row: peak memory of the converter CLI (`convert-dataset`) on a generated OpenAI JSONL."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.rows.measure import _RUSAGE_WRAPPER, _log, _timed
from benchmarks.rows.workload import write_openai_jsonl


def convert_command(src: Path, dst: Path, extra: list[str]) -> list[str]:
    # `convert-dataset` (the console script) is `beam_sft.cli.convert:main`, the same parser and code as
    # `beam-sft convert`.
    return [sys.executable, "-m", "beam_sft.cli.convert", str(src), "-o", str(dst), *extra]


def bench_memory(target_mb: int, workdir: Path, seed: int, convert_args: list[str]) -> dict:
    """Peak RSS of `convert-dataset` on a generated OpenAI JSONL of `target_mb` MiB."""
    import psutil

    target = target_mb * 2**20
    free = shutil.disk_usage(workdir).free
    if free < 2.5 * target:  # input + output (Beam rows are about as large) + headroom
        raise RuntimeError(f"not enough free disk in {workdir} for a {target_mb} MiB input: {free / 2**30:.1f} GiB free")
    src, dst = workdir / "memory_input.jsonl", workdir / "memory_output.jsonl"
    _log(f"memory: writing {target_mb} MiB of OpenAI rows to {src}")
    rows, gen_s = _timed(write_openai_jsonl, src, target, seed)
    size = src.stat().st_size
    report, log = workdir / "rusage.json", workdir / "convert.log"
    command = convert_command(src, dst, convert_args)
    _log(f"memory: convert-dataset {src.name} -o {dst.name} {' '.join(convert_args)} ({rows} rows)")
    with open(log, "wb") as err:
        proc = psutil.Popen([sys.executable, "-c", _RUSAGE_WRAPPER, str(report), *command], stderr=err,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        # Sampled sum over the process tree as well: ru_maxrss is the largest single process, and a
        # converter with worker processes holds the sum.
        tree_peak = 0
        start = time.perf_counter()
        while proc.poll() is None:
            total = 0
            try:
                for child in proc.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            tree_peak = max(tree_peak, total)
            time.sleep(0.05)
        wall = time.perf_counter() - start
    usage = json.loads(report.read_text()) if report.exists() else {"rc": proc.returncode}
    if proc.returncode != 0 or usage.get("rc") != 0:
        tail = log.read_text(errors="replace").strip()[-2000:]
        raise RuntimeError(f"the converter failed (exit {usage.get('rc')}): {tail}")
    with open(dst, "rb") as f:
        out_rows = sum(1 for _ in f)
    return {
        "input_mb": size / 2**20,
        "rows": rows,
        "output_rows": out_rows,
        "generation_s": gen_s,
        "convert_s": usage["seconds"],
        "cli_rows_per_s": rows / usage["seconds"],
        "cli_mb_per_s": size / 2**20 / usage["seconds"],
        "peak_rss_mb": usage["maxrss_kb"] / 1024,
        "peak_rss_tree_sampled_mb": tree_peak / 2**20,
        "wall_s": wall,
        "command": " ".join(["convert-dataset", "INPUT.jsonl", "-o", "OUTPUT.jsonl", *convert_args]),
    }
