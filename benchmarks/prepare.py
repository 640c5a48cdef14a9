"""Benchmark of `beam-sft prepare` against its own encoder and TRL's dataset preparation, on real-sample records.

The workload is derived from the real third-party samples (tests/data/realdata); `--workload converted` (default)
feeds prepare their Beam records, `--workload raw` the rows as their files hold them (OpenAI, ShareGPT, Hermes,
ToolBench, xLAM, ... each converted by prepare from its own format; the encoder row encodes their Beam records).
With converted records:
record i is sample i mod N with every message made unique (a counter appended to each text), so no cache
ever sees a message twice; tools are shared as in the real sets, or, with the unique-tools variant, every
tool description is unique too (each TypeScript declaration then has to be written anew). Every figure is a
first pass over records the measured process has not seen. Rates are per CPU second (`time.process_time` in
this process; `getrusage(RUSAGE_CHILDREN)` for the `beam-sft prepare` subprocesses, workers included), since
wall clocks on a shared machine measure the neighbours; wall-clock scaling of `--num-proc` is reported too
and is only meaningful on an idle machine.

Rows:
* setup: a fresh process loading the tokenizer and building the encoder as `beam-sft prepare` does
  (`beam_sft.render.warm.load_for_encoding`, then `get_encoder`), warm disk cache, CPU seconds;
* encoder: `get_encoder(tok).encode` alone, batches of 256, shared tools and unique tools;
* trl: TRL's per-example preparation (`trl.data_utils._tokenize` with `return_assistant_tokens_mask`, what
  `SFTTrainer._prepare_dataset` maps over the data) on a subset, and its ids and masks compared with ours;
  and TRL's whole dataset preparation as a plain-TRL user runs it (`load_dataset("json")` +
  `SFTTrainer._prepare_dataset`), the baseline of the issue's "8x TRL";
* breakdown: one process's CPU time in `PrepareRun.build` split into converting, encoding and the rest;
* prepare: `beam-sft prepare --max-length 0` on JSONL files of each size and each `--num-proc`, with the
  sha256 of the written data (must be equal across `--num-proc`) and the peak RSS of the largest process;
* convert: `beam-sft convert` on the first size, each `--num-proc`, wall clock and output bytes;
* base: the encoder against TRL on the Llama 3 and Qwen3 vocabularies (scripts/build_base_tokenizer.py),
  with ids and masks compared;
* dedup: `beam-sft prepare --num-proc 1` with exact deduplication on (default) and off (`--keep-duplicates`)
  at each size, on records 10% of which are copies of earlier ones: CPU rate on / off, peak RSS of both;
* shards: `--shard 0/2`, `--shard 1/2` and `--merge` on the first size (10% copies) beside one run: CPU,
  wall and peak RSS of each step, and whether the merged directory has the single run's bytes.

```bash
python -m benchmarks prepare --json /tmp/bench_prepare.json            # o200k tokenizer, 20k and 80k records
python -m benchmarks prepare --quick                                   # a couple of minutes
python -m benchmarks prepare --tokenizer data/tokenizer --records 2000 --num-proc 1 2 --trl-records 500
```
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

REALDATA = REPO / "tests" / "data" / "realdata"
BATCH = 256


# --workload: what `beam-sft prepare` reads in the encoder and prepare rows (see the module docstring).
WORKLOADS = ("converted", "raw")
# The keys whose text a raw row's messages carry, in every format the converters read.
TEXT_KEYS = frozenset(("content", "value", "text", "reasoning_content", "thinking", "reasoning", "analysis"))


def _log(message: str) -> None:
    print(f"[bench_prepare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------
# Workload


def real_records(tokenizer, raw: bool = False) -> list[dict]:
    """Every real sample that converts to a Beam record the encoder renders, in file order: the Beam records, or
    with `raw` the rows as the files hold them (each in its own format), kept where their unique variant
    (`iter_raw`) converts too."""
    from beam_sft.render.encoder import get_encoder
    from beam_sft.validate.convert import convert
    from beam_sft.validate.rules import Options

    encoder = get_encoder(tokenizer)
    # `keep`: most real samples have no reasoning, and this workload measures encoding, not the mask policy.
    keep = Options(missing_reasoning="keep")
    out = []
    for path in sorted(REALDATA.rglob("*.json*")):
        text = path.read_text(encoding="utf-8")
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
                else json.loads(text)
        except ValueError:
            continue
        for row in rows if isinstance(rows, list) else [rows]:
            try:
                record = convert(next(iter_raw([row], 1, 0)) if raw else row, "auto", keep)[0]
                encoder.encode([record])
            except Exception:  # noqa: BLE001, S112 - a sample this workload cannot use (a reject): skip it
                continue
            out.append(json.loads(json.dumps(row if raw else record)))
    if not out:
        raise RuntimeError(f"no usable real samples under {REALDATA}")
    return out


def _unique(text, tag: str):
    return f"{text} {tag}" if isinstance(text, str) and text else text


def derived(pool: list[dict], n: int, start: int, unique_tools: bool) -> list[dict]:
    """Records start .. start+n-1: sample i mod len(pool), every message's text made unique by its number."""
    return list(iter_derived(pool, n, start, unique_tools))


def iter_derived(pool: list[dict], n: int, start: int, unique_tools: bool):
    """`derived`, one record at a time: a 10^6-record input file written without 10^6 dicts in memory."""
    for i in range(start, start + n):
        record = copy.deepcopy(pool[i % len(pool)])
        for k, message in enumerate(record["messages"]):
            for key in ("content", "reasoning_content"):
                if key in message:
                    message[key] = _unique(message[key], f"[{i}.{k}]")
        yield _with_unique_tools(record, i) if unique_tools else record


def _with_unique_tools(record: dict, i: int) -> dict:
    """`record` with every tool description made unique: each TypeScript declaration has to be written anew."""
    for tool in record.get("tools") or ():
        fn = tool.get("function", tool)
        fn["description"] = f"{fn.get('description') or fn['name']} (variant {i})"
    return record


def _tagged(value, tag: str, counter: list[int]):
    """`value` with every non-empty text under TEXT_KEYS suffixed by `tag` and a running number; markup-only
    texts (Harmony's `<|...|>` transcripts) are left alone, as a suffix after their last marker is not theirs."""
    if isinstance(value, list):
        return [_tagged(v, tag, counter) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, v in value.items():
        if key in TEXT_KEYS and isinstance(v, str) and v.strip() and "<|" not in v:
            counter[0] += 1
            out[key] = f"{v} [{tag}.{counter[0]}]"
        else:
            out[key] = _tagged(v, tag, counter)
    return out


def iter_raw(pool: list, n: int, start: int):
    """Raw rows start .. start+n-1: row i mod len(pool) in its own format, every text made unique by its number."""
    for i in range(start, start + n):
        yield _tagged(pool[i % len(pool)], str(i), [0])


def converted(rows) -> list[dict]:
    """The Beam records of raw rows, as `beam-sft prepare --missing-reasoning keep` converts them."""
    from beam_sft.validate.convert import convert
    from beam_sft.validate.rules import Options

    keep = Options(missing_reasoning="keep")
    return [json.loads(json.dumps(convert(row, "auto", keep)[0])) for row in rows]


# --------------------------------------------------------------------------------------------------------
# Rows


_SETUP = """
import json, sys, time
t0 = time.process_time()
from beam_sft.render.warm import load_for_encoding
tok = load_for_encoding(sys.argv[1] or None)
t1 = time.process_time()
from beam_sft.render.encoder import get_encoder
enc = get_encoder(tok)
t2 = time.process_time()
print(json.dumps({"tokenizer_s": t1 - t0, "encoder_s": t2 - t1, "fast": enc.fast,
                  "tiktoken": enc._tiktoken is not None, "tiktoken_reason": enc.tiktoken_reason,
                  "warm_start": type(tok).__name__ == "WarmTokenizer"}))
"""


def bench_setup(tokenizer_path: str | None) -> dict:
    """CPU seconds of a fresh process to load the tokenizer and build its encoder: the second of two runs
    (the first fills the disk cache if it is empty)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _SETUP, tokenizer_path or ""], capture_output=True, text=True,
                              env=env, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = runs[-1]
    out["total_s"] = out["tokenizer_s"] + out["encoder_s"]
    out["first_run_encoder_s"] = runs[0]["encoder_s"]
    out["first_run_total_s"] = runs[0]["tokenizer_s"] + runs[0]["encoder_s"]
    return out


def bench_encoder(tokenizer, records: list[dict]) -> dict:
    import gc

    from beam_sft.render.encoder import get_encoder

    encoder = get_encoder(tokenizer)
    encoder.clear_caches()
    encoder._backend  # noqa: B018 - setup, not the first pass: the private backend copy is made on first use
    tokens = 0
    # The records held here (and the rest of this process) frozen out of the cyclic GC's way, as prepare does
    # with what it holds: the row measures the encoder, not the GC walking this benchmark's record list.
    gc.collect()
    gc.freeze()
    start = time.process_time()
    for i in range(0, len(records), BATCH):
        tokens += sum(len(r["input_ids"]) for r in encoder.encode(records[i: i + BATCH]))
    cpu = time.process_time() - start
    gc.unfreeze()
    return {"records": len(records), "tokens": tokens, "cpu_s": cpu, "records_per_s": len(records) / cpu,
            "tokens_per_s": tokens / cpu, "tiktoken": encoder._tiktoken is not None}


def bench_trl(tokenizer, records: list[dict]) -> dict:
    """TRL's per-example preparation, CPU time, and whether its ids and masks equal ours on every record."""
    import trl
    from trl.data_utils import _tokenize as trl_tokenize

    from beam_sft.render.encoder import get_encoder, record_inputs

    outputs = []
    tokens = 0
    start = time.process_time()
    for record in records:
        messages, tools, kwargs = record_inputs(record)
        done = trl_tokenize(tokenizer, messages, return_assistant_tokens_mask=True, chat_template=None,
                            tools=tools, **kwargs)
        outputs.append((list(done["input_ids"]), list(done["assistant_masks"])))
        tokens += len(done["input_ids"])
    cpu = time.process_time() - start
    encoder = get_encoder(tokenizer)
    ours = []
    for i in range(0, len(records), BATCH):
        ours.extend((r["input_ids"], r["assistant_masks"]) for r in encoder.encode(records[i: i + BATCH]))
    mismatches = sum(a != b for a, b in zip(ours, outputs, strict=True))
    return {"trl": trl.__version__, "records": len(records), "tokens": tokens, "cpu_s": cpu,
            "records_per_s": len(records) / cpu, "tokens_per_s": tokens / cpu, "mismatches_vs_ours": mismatches}


_TRL = """
import json, sys
import orjson
from beam_sft.template.tokenizer import load_tokenizer
from benchmarks.prepare import bench_trl
records = [orjson.loads(line) for line in open(sys.argv[2], "rb")]
print(json.dumps(bench_trl(load_tokenizer(sys.argv[1]), records)))
"""


def bench_trl_fresh(tokenizer_path: str, records: list[dict], work: Path) -> dict:
    """`bench_trl` in a fresh process, as a TRL user's process is: after the encoder's rounds in this one, TRL's
    call measured 15-25% slower (a process that has loaded and run our encoder is not TRL's)."""
    src = work / "trl-records.jsonl"
    write_jsonl(records, src)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", _TRL, tokenizer_path, str(src)], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_trl_prepare(tokenizer, records: list[dict], work: Path) -> dict:
    """TRL's dataset preparation as a plain-TRL user runs it (docs/formats.md): the records written as
    convert-dataset writes them, `load_dataset("json")`, then `SFTTrainer._prepare_dataset` (its
    `datasets.map` of `_tokenize` with the assistant mask, then the labels), CPU time of both, in this process.
    The trainer object is not built (it needs a model); `_prepare_dataset` reads only the attributes given."""
    import types

    import orjson
    import trl
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from beam_sft.validate.convert import to_row

    src = work / "trl-input.jsonl"
    with open(src, "wb") as f:
        f.writelines(orjson.dumps(to_row(record)) + b"\n" for record in records)
    args = SFTConfig(output_dir=str(work / "trl-out"), assistant_only_loss=True, max_length=None, report_to=[],
                     use_cpu=True, bf16=False, dataset_num_proc=None)
    trainer = types.SimpleNamespace(_tokenizer=tokenizer, chat_template=None, completion_only_loss=None,
                                    padding_free=False)
    start = time.process_time()
    dataset = load_dataset("json", data_files=str(src), split="train", cache_dir=str(work / "trl-cache"))
    loaded = time.process_time()
    prepared = SFTTrainer._prepare_dataset(trainer, dataset, tokenizer, args, False, None, "train")
    cpu = time.process_time() - start
    tokens = sum(len(ids) for ids in prepared["input_ids"])
    return {"trl": trl.__version__, "records": len(prepared), "tokens": tokens, "load_cpu_s": loaded - start,
            "cpu_s": cpu, "records_per_s": len(records) / cpu, "tokens_per_s": tokens / cpu}


_RUSAGE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"rc": rc, "wall_s": time.perf_counter() - t, "cpu_s": u.ru_utime + u.ru_stime,
           "peak_rss_mb": u.ru_maxrss / 1024}, open(sys.argv[1], "w"))
"""


def _data_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != "beam_sft_manifest.json":
            digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _measured(command: list[str], report: Path, log: Path) -> dict:
    """Run a beam-sft command under the rusage wrapper: its wall clock, CPU time (children included) and peak RSS."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "wb") as err:
        subprocess.call([sys.executable, "-c", _RUSAGE, str(report), *command], stderr=err, env=env)
    usage = json.loads(report.read_text())
    if usage["rc"] != 0:
        raise RuntimeError(f"{' '.join(command[2:4])} failed: {log.read_text(errors='replace')[-2000:]}")
    return usage


def bench_prepare_run(src: Path, dst: Path, num_proc: int, tokenizer_path: str | None, work: Path,
                      extra: tuple[str, ...] = ()) -> dict:
    import orjson

    report = work / f"{dst.name}.rusage.json"
    command = [sys.executable, "-m", "beam_sft", "prepare", str(src), "-o", str(dst), "-q", "--force",
               "--missing_reasoning", "keep",
               "--max_length", "0", "--dataset_num_proc", str(num_proc),
               *(["--tokenizer_name_or_path", tokenizer_path] if tokenizer_path else []), *extra]
    usage = _measured(command, report, work / f"{dst.name}.log")
    manifest = orjson.loads((dst / "beam_sft_manifest.json").read_bytes())
    counts = manifest["counts"]
    return {"num_proc": num_proc, **usage, "records": counts["records_in"], "kept": counts["records_kept"],
            "rejected": counts["rejected_total"], "tokens": counts["total_tokens"],
            "records_per_cpu_s": counts["records_in"] / usage["cpu_s"],
            "records_per_wall_s": counts["records_in"] / usage["wall_s"], "data_sha256": _data_hash(dst),
            "fingerprint": manifest["fingerprint"], "manifest_seconds": manifest["seconds"]}


def bench_convert_run(src: Path, dst: Path, num_proc: int, work: Path) -> dict:
    """`beam-sft convert` (convert-dataset) on the same kind of input: wall clock per `--num-proc`, and the
    sha256 of the output (equal for any N). CPU time is not reported: its pool's workers are forkserver
    children, whose CPU time does not come back through RUSAGE_CHILDREN."""
    report = work / f"{dst.name}.rusage.json"
    command = [sys.executable, "-m", "beam_sft", "convert", str(src), "-o", str(dst), "-q",
               "--missing_reasoning", "keep", "--dataset_num_proc", str(num_proc)]
    usage = _measured(command, report, work / f"{dst.name}.log")
    records = src.read_bytes().count(b"\n")
    return {"num_proc": num_proc, "wall_s": usage["wall_s"], "records": records,
            "records_per_wall_s": records / usage["wall_s"],
            "output_sha256": hashlib.sha256(dst.read_bytes()).hexdigest()[:16]}


def bench_breakdown(tokenizer, src: Path, work: Path) -> dict:
    """Where one process's CPU time goes in `PrepareRun.build` (warm: tokenizer, encoder, imports): converting
    (the converters, `convert_batch`), encoding (`MaskedEncoder.encode`) and everything else (reading,
    chunk files, labels, counts, shard writes, rejects): the share the worker pool's design has to keep small."""
    from beam_sft.dataset import pipeline
    from beam_sft.dataset.prepare import PrepareRun
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.render import encoder as render

    spent = {"convert": 0.0, "encode": 0.0}

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.process_time() - start
        return wrapper

    # A task looks `convert_batch` up in `pipeline` when it runs: patched there, it is timed.
    real_convert, real_encode = pipeline.convert_batch, render.MaskedEncoder.encode
    pipeline.convert_batch = timed("convert", real_convert)
    render.MaskedEncoder.encode = timed("encode", real_encode)
    try:
        # Imports, hashes and the like once, on a few records: the row is about what grows with the data.
        PrepareRun([str(src)], tokenizer,
                   DataSettings(max_length=None, max_records=50, missing_reasoning="keep"), work / "warm-up",
                   num_proc=1).build()
        spent.update(convert=0.0, encode=0.0)
        render.get_encoder(tokenizer).clear_caches()
        start = time.process_time()
        manifest = PrepareRun([str(src)], tokenizer, DataSettings(max_length=None, missing_reasoning="keep"),
                              work / "breakdown",
                              num_proc=1).build()
        total = time.process_time() - start
    finally:
        pipeline.convert_batch, render.MaskedEncoder.encode = real_convert, real_encode
    records = manifest["counts"]["records_in"]
    other = total - spent["convert"] - spent["encode"]
    return {"records": records, "cpu_s": total, "convert_s": spent["convert"], "encode_s": spent["encode"],
            "other_s": other, "other_share": other / total, "records_per_cpu_s": records / total}


def write_jsonl(records, path: Path) -> None:
    import orjson

    with open(path, "wb") as f:
        f.writelines(orjson.dumps(record) + b"\n" for record in records)


# --------------------------------------------------------------------------------------------------------


def with_duplicates(records: list[dict], share: float) -> list[dict]:
    """`records` with every (1/share)-th position followed by a copy of a record from far earlier (another
    chunk of 5,000 once the input is large enough): the duplicates dedup has to find across chunks."""
    step = max(2, round(1 / share))
    out = []
    for i, record in enumerate(records):
        out.append(record)
        if i % step == step - 1:
            out.append(records[(i * 7919) % (i + 1)])
    return out


def _dedup_rows(args, fig: dict, pool: list[dict], start: int, sizes: list[int], tokenizer_path: str) -> int:
    """`beam-sft prepare --num-proc 1` with exact deduplication on (the default) and off (--keep-duplicates),
    at each size, on records of which 10% are copies of earlier ones: CPU rate per input record, the ratio on
    / off within a repeat, and the peak RSS of both (flat across sizes: keys, not records, are kept)."""
    if "dedup" not in args.rows:
        return start
    runs = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        for size in sizes:
            write_jsonl(with_duplicates(derived(pool, size, start, False), 0.1), work / f"dedup-{size}.jsonl")
            start += size
        for rep in range(args.repeat):
            for size in sizes:
                for label, extra in (("on", ()), ("off", ("--dedup", "false"))):
                    _log(f"dedup {label}: {size} records (+10% copies), run {rep + 1}/{args.repeat}")
                    run = bench_prepare_run(work / f"dedup-{size}.jsonl", work / f"dedup-out-{size}-{label}", 1,
                                            tokenizer_path, work, extra)
                    runs.append({"size": size, "repeat": rep, "dedup": label, **run})
    fig["dedup_runs"] = runs
    fig["dedup"] = _dedup_summary(runs)
    return start


def _shard_rows(args, fig: dict, pool: list[dict], start: int, sizes: list[int], tokenizer_path: str) -> int:
    """`beam-sft prepare --shard I/2` twice and `--merge`, on the first size (10% copies, so the merge decides
    duplicates across shards), beside one `--num-proc 1` run of the same input: CPU and wall per step, peak
    RSS, and whether the merged directory holds the single run's bytes."""
    if "shards" not in args.rows:
        return start
    size = sizes[0]
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        src = work / f"shards-{size}.jsonl"
        write_jsonl(with_duplicates(derived(pool, size, start, False), 0.1), src)
        start += size
        _log(f"shards: one run, {size} records")
        one = bench_prepare_run(src, work / "one", 1, tokenizer_path, work)
        steps = []
        for i in range(2):
            _log(f"shards: shard {i}/2")
            command = [sys.executable, "-m", "beam_sft", "prepare", str(src), "-o", str(work / f"shard{i}"), "-q",
                       "--missing_reasoning", "keep", "--max_length", "0", "--dataset_num_proc", "1",
                       "--shard", f"{i}/2", *(["--tokenizer_name_or_path", tokenizer_path] if tokenizer_path else [])]
            steps.append({"step": f"shard {i}/2", **_measured(command, work / f"shard{i}.rusage.json",
                                                              work / f"shard{i}.log")})
        _log("shards: merge")
        merged = bench_prepare_run(src, work / "merged", 1, tokenizer_path, work,
                                   ("--merge", str(work / "shard0"), str(work / "shard1")))
        steps.append({"step": "merge", **{k: merged[k] for k in ("cpu_s", "wall_s", "peak_rss_mb")}})
    fig["shards"] = {"size": size, "records": one["records"], "one_run": {k: one[k] for k in (
        "cpu_s", "wall_s", "peak_rss_mb", "data_sha256")}, "steps": steps, "merged_sha256": merged["data_sha256"],
        "same_bytes": merged["data_sha256"] == one["data_sha256"], "counts_equal": merged["kept"] == one["kept"]}
    return start


def _dedup_summary(runs: list[dict]) -> list[dict]:

    out = []
    for size in sorted({r["size"] for r in runs}):
        on = [r for r in runs if r["size"] == size and r["dedup"] == "on"]
        off = {r["repeat"]: r for r in runs if r["size"] == size and r["dedup"] == "off"}
        ratios = sorted(r["records_per_cpu_s"] / off[r["repeat"]]["records_per_cpu_s"] for r in on)
        out.append({"size": size, "records_in": on[0]["records"], "kept_on": on[0]["kept"],
                    "kept_off": next(iter(off.values()))["kept"],
                    "cpu_rate_on": statistics.median(r["records_per_cpu_s"] for r in on),
                    "cpu_rate_off": statistics.median(r["records_per_cpu_s"] for r in off.values()),
                    "on_vs_off": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios],
                    "peak_rss_mb_on": max(r["peak_rss_mb"] for r in on),
                    "peak_rss_mb_off": max(r["peak_rss_mb"] for r in off.values())})
    return out


ROWS = ("setup", "encoder", "trl", "breakdown", "prepare", "convert", "base", "dedup", "shards")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="tokenizer directory (default: the o200k Beam tokenizer, built offline from quicktok-v1 "
                             "by scripts/build_o200k_tokenizer.py and cached)")
    parser.add_argument("--records", type=int, nargs="+", default=None,
                        help="records per prepare input file (default: 20000 80000; --quick 4000 16000)")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2], help="--num-proc values (default 1 2)")
    parser.add_argument("--encoder-records", type=int, help="records per encoder row (default 40000, long enough that the "
                        "machine's noise averages out; --quick 3000)")
    parser.add_argument("--trl-records", type=int, help="records for TRL's row (default 4000; --quick 1000)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--breakdown-records", type=int, help="records for the breakdown row (default 20000; "
                        "--quick 4000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the encoder and prepare rows (round robin); the median is reported, as the CPU "
                             "time of one task moves by 20%% between runs on a shared VM (default 3)")
    parser.add_argument("--workload", choices=WORKLOADS, default="converted",
                        help="what prepare reads in the encoder and prepare rows: `converted` (default), the real "
                             "samples already converted to Beam records; `raw`, the same samples as their files hold "
                             "them (OpenAI, ShareGPT, Hermes, ToolBench, xLAM, ... rows), so prepare converts each "
                             "from its own format, while the encoder row encodes their Beam records. Either way every "
                             "text is made unique, so every figure is a first pass")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument("--work-dir", help="where the JSONL inputs and outputs go (default: a temporary directory)")
    return parser


def _side_by_side_rows(args, fig: dict, tok, pool: list[dict], start: int, sizes: list[int], tokenizer_path: str,
                       n_encoder: int, n_trl: int) -> int:
    """The encoder, TRL's per-example call and prepare, side by side: each repeat runs the encoder and TRL (in
    this process) and then every prepare configuration (subprocesses), so that the ratios to the encoder are
    taken within a repeat, where a slow spell of the machine hits both; the medians and the median ratios are
    reported. Returns the next unused record number."""
    variants = (("shared_tools", False), ("unique_tools", True)) if "encoder" in args.rows else ()
    encoder_runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    trl_runs: list[dict] = []
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        if "prepare" in args.rows:
            for size in sizes:
                rows = iter_raw(pool, size, start) if args.workload == "raw" else iter_derived(pool, size, start, False)
                write_jsonl(rows, work / f"records-{size}.jsonl")
                start += size
        for rep in range(args.repeat):
            for name, unique_tools in variants:
                _log(f"encoder, {name} (run {rep + 1}/{args.repeat})")
                if args.workload == "raw":
                    records = converted(iter_raw(pool, n_encoder, start))
                    records = [_with_unique_tools(r, start + i) for i, r in enumerate(records)] if unique_tools \
                        else records
                else:
                    records = derived(pool, n_encoder, start, unique_tools)
                encoder_runs[name].append({"repeat": rep, **bench_encoder(tok, records)})
                start += n_encoder
            if "trl" in args.rows:
                _log(f"TRL, per example (run {rep + 1}/{args.repeat})")
                records = converted(iter_raw(pool, n_trl, start)) if args.workload == "raw" else \
                    derived(pool, n_trl, start, False)
                trl_runs.append({"repeat": rep, **bench_trl_fresh(tokenizer_path, records, work)})
                start += n_trl
            # Each prepare run is a fresh process on records it has not seen: one file serves every repeat.
            for size in sizes if "prepare" in args.rows else ():
                for procs in args.num_proc:
                    _log(f"prepare: {size} records, --num-proc {procs} (run {rep + 1}/{args.repeat})")
                    run = bench_prepare_run(work / f"records-{size}.jsonl", work / f"out-{size}-{procs}", procs,
                                            tokenizer_path, work)
                    runs.append({"size": size, "repeat": rep, **run})
    for name, group in encoder_runs.items():
        group = sorted(group, key=lambda r: r["records_per_s"])
        fig[f"encoder_{name}"] = {**group[len(group) // 2], "rates": [round(r["records_per_s"]) for r in group]}
    if trl_runs:
        fig["trl"] = {**sorted(trl_runs, key=lambda r: r["records_per_s"])[len(trl_runs) // 2],
                      "rates": sorted(round(r["records_per_s"]) for r in trl_runs)}
        if encoder_runs.get("shared_tools"):
            fig["encoder_vs_trl"] = {unit: _per_repeat_ratios(encoder_runs["shared_tools"], trl_runs, unit)
                                     for unit in ("records_per_s", "tokens_per_s")}
    if runs:
        fig["prepare_runs"] = runs
        fig["prepare"] = _medians(runs)
        if encoder_runs.get("shared_tools"):
            fig["prepare_vs_encoder"] = _ratios_to_encoder(runs, encoder_runs["shared_tools"])
    return start


def _per_repeat_ratios(ours: list[dict], theirs: list[dict], unit: str) -> dict:
    """`unit` of ours over theirs within each repeat; the median and every ratio."""
    by_repeat = {r["repeat"]: r[unit] for r in theirs}
    ratios = sorted(r[unit] / by_repeat[r["repeat"]] for r in ours if r["repeat"] in by_repeat)
    return {"median": statistics.median(ratios), "ratios": [round(x, 2) for x in ratios]}


def _ratios_to_encoder(runs: list[dict], encoder: list[dict]) -> dict[str, dict]:
    """Per size: one process's CPU rate over the encoder's rate of the same repeat; the median and every ratio."""

    by_repeat = {r["repeat"]: r["records_per_s"] for r in encoder}
    out = {}
    for size in sorted({r["size"] for r in runs}):
        ratios = sorted(r["records_per_cpu_s"] / by_repeat[r["repeat"]] for r in runs
                        if r["size"] == size and r["num_proc"] == 1 and r["repeat"] in by_repeat)
        if ratios:
            out[str(size)] = {"median": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios]}
    return out


def _convert_rows(args, fig: dict, pool: list[dict], start: int, sizes: list[int]) -> int:
    """`beam-sft convert` per --num-proc on the first size; returns the next unused record number."""
    if "convert" in args.rows:
        with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
            work = Path(tmp)
            size = sizes[0]
            src = work / f"convert-{size}.jsonl"
            write_jsonl(derived(pool, size, start, False), src)
            start += size
            fig["convert"] = []
            for procs in args.num_proc:
                _log(f"convert: {size} records, --num-proc {procs}")
                fig["convert"].append({"size": size, **bench_convert_run(src, work / f"conv-{procs}.jsonl", procs,
                                                                         work)})
    return start


def _medians(runs: list[dict]) -> list[dict]:
    """Per (size, --num-proc): the run with the median CPU rate, with every run's CPU and wall rates, and the
    wall-clock ratio to --num-proc 1 taken within each repeat (the median of those)."""

    out = []
    for key in sorted({(r["size"], r["num_proc"]) for r in runs}):
        group = sorted((r for r in runs if (r["size"], r["num_proc"]) == key), key=lambda r: r["records_per_cpu_s"])
        chosen = dict(group[len(group) // 2])
        chosen["cpu_rates"] = [round(r["records_per_cpu_s"]) for r in group]
        chosen["wall_rates"] = [round(r["records_per_wall_s"]) for r in group]
        ratios = []
        for r in group:
            base = [b for b in runs if b["size"] == r["size"] and b["num_proc"] == 1 and b["repeat"] == r["repeat"]]
            if base:
                ratios.append(r["records_per_wall_s"] / base[0]["records_per_wall_s"])
        chosen["wall_vs_one_process"] = statistics.median(ratios) if ratios else None
        chosen["wall_ratios"] = [round(x, 2) for x in sorted(ratios)]
        out.append(chosen)
    return out


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from beam_sft.template.tokenizer import load_tokenizer

    tokenizer_path = args.tokenizer
    if tokenizer_path is None:
        from build_o200k_tokenizer import cached_build

        tokenizer_path = str(cached_build())
    sizes = args.records or ([4000, 16000] if args.quick else [20000, 80000])
    n_encoder = args.encoder_records or (3000 if args.quick else 40000)
    n_trl = args.trl_records or (1000 if args.quick else 4000)
    fig: dict = {"tokenizer": tokenizer_path, "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
    tok = load_tokenizer(tokenizer_path)
    pool = real_records(tok)
    raw_pool = real_records(tok, raw=True) if args.workload == "raw" else None
    fig["pool"], fig["workload"] = len(raw_pool or pool), args.workload
    _log(f"{len(pool)} real samples in the pool")
    # Disjoint record ranges per row: every row sees records no one has encoded before.
    start = 10**7
    if "setup" in args.rows:
        _log("setup")
        fig["setup"] = bench_setup(tokenizer_path)
    if "trl" in args.rows:  # TRL's per-example call runs beside the encoder (_side_by_side_rows)
        _log("TRL, dataset preparation")
        with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
            fig["trl_prepare"] = bench_trl_prepare(tok, derived(pool, n_trl, start, False), Path(tmp))
        start += n_trl
    if "breakdown" in args.rows:
        with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
            n = args.breakdown_records or (4000 if args.quick else 20000)
            src = Path(tmp) / "breakdown.jsonl"
            write_jsonl(derived(pool, n, start, False), src)
            start += n
            _log(f"breakdown: {n} records in this process")
            fig["breakdown"] = bench_breakdown(tok, src, Path(tmp))
    start = _side_by_side_rows(args, fig, tok, raw_pool or pool, start, sizes, tokenizer_path, n_encoder, n_trl)
    start = _convert_rows(args, fig, pool, start, sizes)
    start = _dedup_rows(args, fig, pool, start, sizes, tokenizer_path)
    start = _shard_rows(args, fig, pool, start, sizes, tokenizer_path)
    if "base" in args.rows:
        from build_base_tokenizer import cached_build as base_build

        for name in ("llama3", "qwen3"):
            _log(f"base vocabulary {name}: encoder vs TRL")
            base_tok = load_tokenizer(str(base_build(name)))
            records = derived(pool, n_trl, start, False)
            start += n_trl
            fig[f"base_{name}"] = {"encoder": bench_encoder(base_tok, records), "trl": bench_trl(base_tok, records)}
    fig["summary"] = summary(fig)
    text = json.dumps(fig, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def _scaling_lines(fig: dict) -> list[str]:
    """--num-proc N against one process, per size: the median of the per-repeat wall-clock ratios, and whether
    every run of that size wrote the same bytes."""
    lines = []
    for run in fig.get("prepare", []):
        if run["num_proc"] > 1 and run.get("wall_vs_one_process") is not None:
            same = {r["data_sha256"] for r in fig.get("prepare_runs", [run]) if r["size"] == run["size"]}
            lines.append(f"prepare {run['size']:,}: --num-proc {run['num_proc']} wall rate {run['wall_vs_one_process']:.2f}x "
                         f"one process (median of {run['wall_ratios']}; goal >= 1.7x on 2 idle cores), same bytes in "
                         f"every run: {len(same) == 1}")
    return lines


def summary(fig: dict) -> list[str]:
    """The issue's goals, each with the measured figure."""
    lines = []
    enc = fig.get("encoder_shared_tools")
    trl = fig.get("trl")
    if fig.get("setup"):
        s = fig["setup"]
        lines.append(f"fixed cost (tokenizer {s['tokenizer_s']:.2f} + encoder {s['encoder_s']:.2f} CPU-s, warm cache) = "
                     f"{s['total_s']:.2f} s (goal <= 2 s)")
    if enc:
        lines.append(f"encoder, shared tools: {enc['records_per_s']:,.0f} rec/CPU-s (median of {enc.get('rates')}), "
                     f"{enc['tokens_per_s'] / 1e6:.2f} M tok/s")
    if fig.get("encoder_unique_tools"):
        u = fig["encoder_unique_tools"]
        lines.append(f"encoder, unique tools: {u['records_per_s']:,.0f} rec/CPU-s (median of {u.get('rates')}), "
                     f"{u['tokens_per_s'] / 1e6:.2f} M tok/s (goal >= 2 M tok/s)")
    trl_prep = fig.get("trl_prepare")
    if trl:
        lines.append(f"TRL per-example: {trl['records_per_s']:,.0f} rec/CPU-s (median of {trl.get('rates')}), "
                     f"{trl['tokens_per_s'] / 1e6:.2f} M tok/s; ids+masks differ from ours on "
                     f"{trl['mismatches_vs_ours']}/{trl['records']}")
    if side := fig.get("encoder_vs_trl"):
        by_rec, by_tok = side["records_per_s"], side["tokens_per_s"]
        lines.append(f"encoder vs TRL per-example, within each repeat: {by_rec['median']:.2f}x by records (median of "
                     f"{by_rec['ratios']}), {by_tok['median']:.2f}x by tokens (median of {by_tok['ratios']}; "
                     "goal >= 9x on o200k)")
    if trl_prep:
        lines.append(f"TRL dataset preparation (load_dataset json + SFTTrainer._prepare_dataset): "
                     f"{trl_prep['records_per_s']:,.0f} rec/CPU-s ({trl_prep['load_cpu_s']:.1f} CPU-s of it loading)")
    for run in fig.get("prepare", []):
        line = (f"prepare {run['size']:,} records, --num-proc {run['num_proc']}: {run['records_per_cpu_s']:,.0f} rec/CPU-s "
                f"(median of {run.get('cpu_rates')}), {run['records_per_wall_s']:,.0f} rec/wall-s, "
                f"peak RSS {run['peak_rss_mb']:,.0f} MiB, data {run['data_sha256']}")
        side = fig.get("prepare_vs_encoder", {}).get(str(run["size"]))
        if run["num_proc"] == 1 and side:
            line += (f"; {side['median']:.0%} of the encoder run beside it (median of {side['ratios']}; "
                     "goal >= 60%)")
        if run["num_proc"] == 1 and trl_prep:
            line += f"; {run['records_per_cpu_s'] / trl_prep['records_per_s']:.1f}x TRL's dataset preparation (goal >= 8x)"
        if run["num_proc"] == 1 and trl:
            line += f", {run['records_per_cpu_s'] / trl['records_per_s']:.1f}x TRL's per-example call alone"
        lines.append(line)
    if fig.get("breakdown"):
        b = fig["breakdown"]
        lines.append(f"breakdown of one process ({b['records']:,} records, tokenizer loaded): convert {b['convert_s']:.1f} + "
                     f"encode {b['encode_s']:.1f} + other {b['other_s']:.1f} CPU-s ({b['other_share']:.0%} other)")
    for name in ("llama3", "qwen3"):
        if fig.get(f"base_{name}"):
            e, t = fig[f"base_{name}"]["encoder"], fig[f"base_{name}"]["trl"]
            lines.append(f"{name} encoder: {e['tokens_per_s'] / 1e6:.2f} M tok/CPU-s (tiktoken: {e['tiktoken']}), "
                         f"{e['records_per_s'] / t['records_per_s']:.1f}x TRL first pass (goal >= 5x); ids+masks differ "
                         f"on {t['mismatches_vs_ours']}/{t['records']}")
    lines.extend(_scaling_lines(fig))
    runs = {run["num_proc"]: run for run in fig.get("convert", [])}
    if 1 in runs:
        for procs, run in runs.items():
            if procs > 1:
                lines.append(f"convert {run['size']:,}: --num-proc {procs} wall rate "
                             f"{run['records_per_wall_s'] / runs[1]['records_per_wall_s']:.2f}x one process, same bytes: "
                             f"{run['output_sha256'] == runs[1]['output_sha256']}")
    for row in fig.get("dedup", []):
        lines.append(f"dedup {row['size']:,} records (+10% copies): CPU rate on/off {row['on_vs_off']:.3f} "
                     f"(goal >= 0.9; {row['ratios']}), kept {row['kept_on']:,} of {row['records_in']:,}, peak RSS "
                     f"{row['peak_rss_mb_on']:,.0f} MiB on, {row['peak_rss_mb_off']:,.0f} MiB off")
    if fig.get("shards"):
        sh = fig["shards"]
        shard_cpu = max(step["cpu_s"] for step in sh["steps"] if step["step"] != "merge")
        merge = next(step for step in sh["steps"] if step["step"] == "merge")
        lines.append(f"shards {sh['size']:,} records (+10% copies): each of 2 shards {shard_cpu:.0f} CPU-s at most, merge "
                     f"{merge['cpu_s']:.0f} CPU-s, one run {sh['one_run']['cpu_s']:.0f} CPU-s; peak RSS shard "
                     f"{max(s['peak_rss_mb'] for s in sh['steps']):,.0f} MiB, one run {sh['one_run']['peak_rss_mb']:,.0f} "
                     f"MiB; merged = one run byte for byte: {sh['same_bytes']}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
