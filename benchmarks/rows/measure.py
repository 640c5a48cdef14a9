"""Timing, CPU seconds, peak RSS of a child process, and the machine a figure was measured on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def _cpu_timed(fn, *args, **kwargs):
    """((result, wall seconds), CPU seconds of this process) of one call."""
    start = time.process_time()
    result = _timed(fn, *args, **kwargs)
    return result, time.process_time() - start


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    import tokenizers
    import torch
    import transformers
    import trl

    cpu = cpu_name()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "tokenizers": tokenizers.__version__,
        "platform": platform.platform(),
    }


# Runs the command given after the output path as the only child of a fresh interpreter, so that
# RUSAGE_CHILDREN's peak is the converter's own (and its workers'), not that of this process's earlier children.
_RUSAGE_WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL)\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "json.dump({'rc': rc, 'maxrss_kb': usage.ru_maxrss, 'seconds': time.perf_counter() - t,\n"
    "           'cpu_seconds': usage.ru_utime + usage.ru_stime}, open(sys.argv[1], 'w'))\n"
)


def _rusage_run(command: list[str], workdir: Path, name: str) -> dict:
    """Run `command` under the rusage wrapper: {seconds, peak_rss_mb, cpu_seconds}; raises when it fails."""
    report, log = workdir / f"{name}.rusage.json", workdir / f"{name}.log"
    with open(log, "wb") as err:
        rc = subprocess.call([sys.executable, "-c", _RUSAGE_WRAPPER, str(report), *command], stderr=err,
                             env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    usage = json.loads(report.read_text()) if report.exists() else {"rc": rc}
    if rc != 0 or usage.get("rc") != 0:
        raise RuntimeError(f"{name} failed (exit {usage.get('rc')}): {log.read_text(errors='replace')[-2000:]}")
    return {"seconds": usage["seconds"], "peak_rss_mb": usage["maxrss_kb"] / 1024, "cpu_seconds": usage["cpu_seconds"]}
