"""Throughput and memory benchmark of beam-sft's data path and training, against TRL and the floors.

One run, one generated workload (fixed seed: multi-turn conversations with reasoning on every assistant
turn, tool declarations, tool calls and their results), every row measured side by side:

* masked tokenization: our `MaskedEncoder` vs TRL's per-example preparation (`trl.data_utils._tokenize`,
  i.e. `apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`, which is what
  `SFTTrainer._prepare_dataset` maps over the dataset with `assistant_only_loss=True`) vs the floor (render
  every conversation to text with the chat template, then one batched tokenizer call, no masks); in one
  process, then `encode_dataset` with `num_proc` = 1 .. cores;
* conversion: OpenAI -> Beam records per second (`convert_record`, with orjson in and out) vs the floor of
  orjson load + dump of the same lines;
* training on the tiny model (CPU): real (non-pad) tokens per second and real-token fraction, padded vs
  packed (TRL's BFD packing, padding-free);
* memory: peak RSS of `beam-sft convert` on a generated OpenAI JSONL of `--memory_mb` (2 GB by default);
* prepare: `beam-sft prepare` (the training data phase) on generated OpenAI JSONL of two sizes, one 4x the
  other (`--prepare_mb`, 250 MB and 1 GB by default): seconds and peak RSS of each, a cached rerun, and
  today's in-memory path (read_rows + to_beam_records + prepare_dataset) side by side on the smaller one.

Run from the repository root:

```bash
python scripts/bench.py                              # the full table (20k conversations, 2 GB file)
python scripts/bench.py --quick --json bench.json    # the same rows, smaller (about a minute)
python scripts/bench.py --smoke --json /tmp/b.json   # seconds: what tests/test_bench.py runs
python scripts/bench.py --conversations 5000 --num_proc 1 2 --memory_mb 200 --train_steps 10
python scripts/bench.py --rows prepare --prepare_mb 64 256 --json /tmp/prepare.json   # the prepare row only
```

This is a benchmark, not a test: it prints the figures and whether each goal of the table is met, and exits
0 either way (non-zero only when something failed to run or ours disagrees with the reference).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
# Runnable as `python scripts/bench.py` from a checkout without installing the package.
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(REPO_DIR / "scripts"))

from make_samples import CURRENCY_TOOL, WEATHER_TOOL  # a sibling script: importable once the path is set

SEED = 1234

# --------------------------------------------------------------------------------------------------------
# Workload: Beam records, and the same conversations in OpenAI shape for the conversion rows.

_WORDS = ["the", "a", "of", "to", "and", "in", "is", "that", "for", "it", "as", "with", "on", "be", "by", "this", "are", "from", "or", "at", "which", "we", "an", "not", "can", "will", "use", "data", "model", "token", "train", "loss", "batch", "step", "value", "city", "weather", "price", "stock", "order", "result", "query", "file", "line", "error", "test", "check", "count", "number", "table", "field", "index", "range", "start", "end", "first", "last", "next", "previous", "user", "tool", "call", "answer", "reason", "think", "plan", "search", "read", "write", "open", "close", "update", "create", "delete", "list", "find", "sort", "merge", "split", "join", "parse", "render", "encode", "decode", "mask", "pad", "pack", "shard", "cache", "lock", "queue", "stream", "buffer", "window", "frame", "gradient", "optimizer", "schedule", "warmup", "decay", "epoch", "sample", "label", "metric", "score", "budget", "limit", "timeout", "retry", "harmony", "channel", "message", "analysis", "final", "return", "constrain", "lighthouse", "parquet", "arrow", "json", "schema", "vector", "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Sydney", "Toronto", "Nairobi", "Madrid", "London", "café", "naïve", "東京", "数据", "Привет"]

# get_weather and convert_currency are the bundled samples' own schemas (scripts/make_samples.py).
_TOOLS = [
    WEATHER_TOOL,
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation.\nReturns the best matching passages.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "top_k": {"type": "integer", "default": 3},
                    "filters": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["query"],
            },
        },
    },
    CURRENCY_TOOL,
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Run a read-only SQL query and return the rows as JSON.",
            "parameters": {
                "type": "object",
                "properties": {"sql": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["sql"],
            },
        },
    },
]
_SYSTEMS = (
    "You are a concise assistant.",
    "You are a helpful assistant with access to tools. Answer briefly and cite tool results.",
    "Answer like a careful tutor: explain the steps, then give the result.",
)
_EFFORTS = ("minimal", "low", "medium", "high", 16, 100)


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = rng.choices(_WORDS, k=rng.randint(lo, hi))
    return " ".join(words).capitalize() + rng.choice((".", ".", "?", "!", ":\n- item one\n- item two."))


def _text(rng: random.Random, sentences: tuple[int, int], words: tuple[int, int] = (6, 18)) -> str:
    return " ".join(_sentence(rng, *words) for _ in range(rng.randint(*sentences)))


def _arguments(rng: random.Random, name: str) -> dict:
    if name == "get_weather":
        return {"city": rng.choice(_WORDS[-12:]), "unit": rng.choice(("celsius", "fahrenheit"))}
    if name == "search_docs":
        return {"query": _sentence(rng, 3, 8), "top_k": rng.randint(1, 9), "filters": rng.sample(_WORDS, 2)}
    if name == "convert_currency":
        return {"amount": round(rng.uniform(1, 5000), 2), "source": "USD", "target": rng.choice(("EUR", "JPY"))}
    return {"sql": f"SELECT {rng.choice(_WORDS)} FROM t{rng.randint(1, 99)} LIMIT {rng.randint(1, 50)}",
            "limit": rng.randint(1, 50)}


def make_beam_record(rng: random.Random) -> dict:
    """One Beam conversation: 1-4 user turns, reasoning on every assistant message, tool rounds on some."""
    tools = rng.sample(_TOOLS, rng.randint(1, 3)) if rng.random() < 0.7 else None
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _text(rng, (1, 3))})
        if tools and rng.random() < 0.6:
            for _ in range(rng.randint(1, 2)):  # tool rounds within the turn
                calls = []
                for _ in range(1 if rng.random() < 0.7 else 2):  # parallel calls sometimes
                    name = rng.choice(tools)["function"]["name"]
                    calls.append({"type": "function", "function": {"name": name, "arguments": _arguments(rng, name)}})
                messages.append({"role": "assistant", "reasoning_content": _text(rng, (1, 3)), "tool_calls": calls})
                for call in calls:
                    result = {"ok": True, "items": [_sentence(rng, 3, 10) for _ in range(rng.randint(1, 3))]}
                    messages.append({"role": "tool", "name": call["function"]["name"],
                                     "content": json.dumps(result, ensure_ascii=False)})
        messages.append({"role": "assistant", "reasoning_content": _text(rng, (1, 4)), "content": _text(rng, (1, 4))})
    record: dict = {"messages": messages}
    if tools:
        record["tools"] = tools
    if rng.random() < 0.8:
        record["chat_template_kwargs"] = {"reasoning_effort": rng.choice(_EFFORTS)}
    return record


def to_openai(record: dict, index: int) -> dict:
    """The same conversation as an OpenAI chat-completions row (JSON-string arguments, call ids)."""
    messages = []
    pending: list[str] = []
    for k, m in enumerate(record["messages"]):
        if m["role"] == "assistant" and "tool_calls" in m:
            calls, pending = [], []
            for j, call in enumerate(m["tool_calls"]):
                call_id = f"call_{index}_{k}_{j}"
                pending.append(call_id)
                fn = call["function"]
                calls.append({"id": call_id, "type": "function",
                              "function": {"name": fn["name"], "arguments": json.dumps(fn["arguments"])}})
            messages.append({"role": "assistant", "content": None, "reasoning_content": m["reasoning_content"],
                             "tool_calls": calls})
        elif m["role"] == "tool":
            messages.append({"role": "tool", "tool_call_id": pending.pop(0), "content": m["content"]})
        else:
            messages.append(dict(m))
    row: dict = {"messages": messages}
    if "tools" in record:
        row["tools"] = record["tools"]
    effort = (record.get("chat_template_kwargs") or {}).get("reasoning_effort")
    if effort is not None:
        row["reasoning_effort"] = effort
    return row


def make_workload(n: int, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    return [make_beam_record(rng) for _ in range(n)]


def write_openai_jsonl(path: Path, target_bytes: int, seed: int = SEED, pool_size: int = 2000) -> int:
    """Stream OpenAI rows to `path` until it holds `target_bytes`; returns the number of rows.

    A pool of distinct conversations is cycled (with fresh call ids) so that a 2 GB file costs seconds, not
    minutes, of generation; the converter's work per row is the same either way.
    """
    import orjson

    rng = random.Random(seed)
    pool = [make_beam_record(rng) for _ in range(pool_size)]
    written = rows = 0
    with open(path, "wb") as f:
        while written < target_bytes:
            line = orjson.dumps(to_openai(pool[rows % pool_size], rows)) + b"\n"
            f.write(line)
            written += len(line)
            rows += 1
    return rows


# --------------------------------------------------------------------------------------------------------
# Helpers


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


def machine_info() -> dict:
    import tokenizers
    import torch
    import transformers
    import trl

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
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


# --------------------------------------------------------------------------------------------------------
# Row 1: masked tokenization


def _record_kwargs(record: dict) -> tuple[list, list | None, dict]:
    kwargs = {k: v for k, v in (record.get("chat_template_kwargs") or {}).items() if v is not None}
    return record["messages"], record.get("tools"), kwargs


def bench_masked_tokenization(tokenizer, records: list[dict], num_procs: list[int], batch_size: int) -> dict:
    """Ours vs TRL's per-example preparation vs the floor, in this process; then `encode_dataset` scaling."""
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    try:  # TRL 1.16's per-example tokenization helper, private: fall back to what it calls
        from trl.data_utils import _tokenize as trl_tokenize
    except ImportError:
        def trl_tokenize(processing_class, conversation, **kwargs):
            return processing_class.apply_chat_template(conversation, tokenize=True, return_dict=True, **kwargs)

    from beam_sft.render.encoder import MaskedEncoder, encode_dataset

    n = len(records)
    n_tokens = 0

    # Ours: a fresh encoder (empty piece and prefix caches), batches as encode_dataset hands them over. Its
    # one-off setup (checks, probe, tiktoken tables: seconds on a 201k vocabulary) is timed apart.
    _log("masked tokenization: encoder setup")
    encoder, setup_s = _timed(MaskedEncoder, tokenizer)
    if not encoder.fast:
        raise RuntimeError(f"the fast path is off for this tokenizer: {encoder.fallback_reason}")

    def ours():
        encoder.clear_caches()
        out = []
        for start in range(0, n, batch_size):
            out.extend(encoder.encode(records[start:start + batch_size]))
        return out

    # TRL: what SFTTrainer._prepare_dataset's tokenize_fn does per example with assistant_only_loss=True and
    # a template that already has generation blocks (chat_template=None).
    def trl():
        out = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            processed = trl_tokenize(tokenizer, messages, return_assistant_tokens_mask=True,
                                     chat_template=None, tools=tools, **kwargs)
            out.append({"input_ids": processed["input_ids"], "assistant_masks": processed["assistant_masks"]})
        return out

    # Floor: the public API's text rendering, then one batched tokenizer call; no masks.
    def floor():
        texts = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            texts.append(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs))
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    # A tighter floor (extra): the compiled template rendered directly, the Rust tokenizer's encode_batch.
    backend = tokenizer._tokenizer
    special = dict(tokenizer.special_tokens_map)

    def floor_raw():
        texts = []
        for record in records:
            messages, tools, kwargs = _record_kwargs(record)
            rendered, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(messages)], tools=tools,
                chat_template=tokenizer.get_chat_template(None, tools), **{**special, **kwargs})
            texts.append(rendered[0])
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    # Per core: CPU seconds of this process (tokenizers runs one thread with TOKENIZERS_PARALLELISM=false),
    # so the neighbours on a shared machine do not count. The ceiling encodes the rendered text exactly,
    # without masks: the tokenizer's own encode_batch, and tiktoken where its backend checks pass.
    texts = [encoder.render(record)[0] for record in records]
    special = {content: token_id for token_id, content in
               ((i, t.content) for i, t in backend.get_added_tokens_decoder().items())}
    whole_text = encoder._tiktoken.encoding_with_special_tokens(special) if encoder._tiktoken else None

    def render_only():
        encoder.clear_caches()
        return [encoder.render(record) for record in records]

    def hf_ceiling():
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    def tiktoken_ceiling():
        return [whole_text.encode(text, allowed_special="all") for text in texts]

    results = {}
    cpu = {}
    _log(f"masked tokenization: ours on {n} conversations")
    (ours_out, results["ours_s"]), cpu["ours"] = _cpu_timed(ours)
    _log("masked tokenization: TRL per-example apply_chat_template")
    (trl_out, results["trl_s"]), cpu["trl"] = _cpu_timed(trl)
    _log("masked tokenization: floor (render + batched tokenize, no masks)")
    (floor_out, results["floor_s"]), cpu["floor"] = _cpu_timed(floor)
    _log("masked tokenization: raw floor (compiled template + encode_batch)")
    (_, results["floor_raw_s"]), cpu["floor_raw"] = _cpu_timed(floor_raw)
    _log("masked tokenization: render only (our renderer)")
    _, cpu["render"] = _cpu_timed(render_only)
    _log("masked tokenization: encode ceiling, encode_batch of the rendered text")
    (hf_ids, _), cpu["hf_encode"] = _cpu_timed(hf_ceiling)
    tiktoken_mismatches = None
    if whole_text is not None:
        _log("masked tokenization: encode ceiling, tiktoken of the rendered text")
        (tiktoken_ids, _), cpu["tiktoken_encode"] = _cpu_timed(tiktoken_ceiling)
        tiktoken_mismatches = sum(a != b for a, b in zip(tiktoken_ids, hf_ids, strict=True))
        del tiktoken_ids

    mismatches = [i for i, (a, b) in enumerate(zip(ours_out, trl_out, strict=True)) if a != b]
    floor_mismatches = sum(1 for a, b in zip(ours_out, floor_out, strict=True) if a["input_ids"] != b)
    n_tokens = sum(len(o["input_ids"]) for o in ours_out)
    n_supervised = sum(sum(o["assistant_masks"]) for o in ours_out)
    hf_mismatches = sum(a["input_ids"] != b for a, b in zip(ours_out, hf_ids, strict=True))
    del ours_out, trl_out, floor_out, hf_ids
    per_core = {name: n_tokens / seconds for name, seconds in cpu.items()}
    figures = {
        "vocabulary": len(tokenizer),
        "encoder_setup_s": setup_s,
        "encoder_backend": "tiktoken" if encoder._tiktoken is not None else "tokenizers",
        "tiktoken_reason": encoder.tiktoken_reason,
        "tokens_per_cpu_s": per_core,
        "cpu_s": cpu,
        "ids_mismatches_vs_hf_encode": hf_mismatches,
        "ids_mismatches_tiktoken_vs_hf": tiktoken_mismatches,
        "ours": n / results["ours_s"],
        "trl": n / results["trl_s"],
        "floor": n / results["floor_s"],
        "floor_raw": n / results["floor_raw_s"],
        "conversations": n,
        "tokens": n_tokens,
        "tokens_per_conversation": n_tokens / n,
        "supervised_fraction": n_supervised / n_tokens,
        "ours_tokens_per_s": n_tokens / results["ours_s"],
        "mismatches_vs_trl": len(mismatches),
        "first_mismatch": mismatches[0] if mismatches else None,
        "ids_mismatches_vs_floor": floor_mismatches,
    }

    # Scaling: encode_dataset (datasets.map, batched) at each num_proc, records as JSON strings.
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    dataset = Dataset.from_dict({"record": [json.dumps(r, ensure_ascii=False) for r in records]})
    scaling, cpu_rates = {}, {}
    for p in num_procs:
        _log(f"masked tokenization: encode_dataset num_proc={p}")
        cpu_before = _cpu_seconds()
        _, seconds = _timed(encode_dataset, tokenizer, dataset, record_column="record", num_proc=p if p > 1 else None,
                            batch_size=batch_size, load_from_cache_file=False, desc=None)
        scaling[str(p)] = n / seconds
        # CPU seconds of this process and its (joined) workers: on a shared machine wall-clock scaling
        # measures the neighbours too, while conversations per CPU-second show the parallel overhead alone.
        cpu_rates[str(p)] = n / (_cpu_seconds() - cpu_before)
    base = scaling[str(num_procs[0])] / num_procs[0] if num_procs else None
    figures["encode_dataset"] = {
        p: {"conv_per_s": v, "speedup": v / scaling[str(num_procs[0])] * num_procs[0],
            "efficiency": v / (base * int(p)), "conv_per_cpu_s": cpu_rates[p],
            "cpu_efficiency": cpu_rates[p] / cpu_rates[str(num_procs[0])]}
        for p, v in scaling.items()
    }
    return figures


# --------------------------------------------------------------------------------------------------------
# Row 2: conversion


def bench_conversion(records: list[dict]) -> dict:
    """OpenAI JSON lines -> Beam JSON lines with `convert_record`, vs orjson load + dump of the same lines."""
    import orjson

    from beam_sft.errors import RecordError
    from beam_sft.formats import convert_record

    lines = [orjson.dumps(to_openai(r, i)) for i, r in enumerate(records)]
    n = len(lines)

    def ours():
        out, rejected = [], 0
        for line in lines:
            try:
                out.append(orjson.dumps(convert_record(orjson.loads(line), "auto")))
            except RecordError:
                rejected += 1
        return out, rejected

    def floor():
        return [orjson.dumps(orjson.loads(line)) for line in lines]

    # Each side is a second or less, so one timing is at the mercy of the neighbours and the garbage
    # collector: interleave three timings of each and keep the best of each side.
    import gc

    ours_times, floor_times = [], []
    for attempt in range(1, 4):
        _log(f"conversion: ours on {n} OpenAI rows (timing {attempt}/3)")
        gc.collect()
        (out, rejected), seconds = _timed(ours)
        ours_times.append(seconds)
        _log(f"conversion: orjson load + dump floor (timing {attempt}/3)")
        gc.collect()
        _, seconds = _timed(floor)
        floor_times.append(seconds)
    ours_s, floor_s = min(ours_times), min(floor_times)
    # The conversion must give back the conversation it was generated from (ids aside).
    first = orjson.loads(out[0]) if out else None
    if first is not None:
        for m in first["messages"]:
            m.pop("tool_call_id", None)
            for call in m.get("tool_calls") or ():
                call.pop("id", None)
    return {
        "ours": n / ours_s,
        "floor": n / floor_s,
        "rows": n,
        "rejected": rejected,
        "mb_per_s": sum(map(len, lines)) / 2**20 / ours_s,
        "roundtrip_ok": first == records[0],
    }


# --------------------------------------------------------------------------------------------------------
# Row 3: training on the tiny model


def _tiny_model(tokenizer, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(REPO_DIR / "configs" / "models" / "tiny"))
    # The model must cover every token id of the tokenizer; round up to a multiple of 64 as usual.
    config.vocab_size = max(config.vocab_size, -(-len(tokenizer) // 64) * 64)
    config.max_position_embeddings = max(config.max_position_embeddings, 4096)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model


def bench_training(tokenizer, records: list[dict], *, steps: int, max_length: int, padded_batch: int,
                   packed_batch: int, seed: int, workdir: Path, threads: int) -> dict:
    """A fixed number of optimizer steps, padded vs packed (BFD, padding-free), on the same prepared data."""
    import torch
    from transformers import TrainerCallback
    from trl import SFTConfig

    from beam_sft.dataset.examples import prepare_dataset
    from beam_sft.train.trainer import make_trainer_class

    torch.set_num_threads(threads)

    dataset, stats = prepare_dataset(tokenizer, records, max_length=max_length, policy="turn",
                                     assistant_only_loss=True, name="bench")
    base = make_trainer_class()

    class CountingTrainer(base):
        """Counts, per step, the positions the model computes on and how many of them are real tokens."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.positions: list[int] = []
            self.real: list[int] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                ids = inputs["input_ids"]
                mask = inputs.get("attention_mask")
                self.positions.append(int(ids.numel()))
                self.real.append(int(mask.sum()) if mask is not None else int(ids.numel()))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

    figures: dict = {"records": len(records), "records_kept": stats.records_kept, "max_length": max_length,
                     "steps": steps}
    for name, packing, batch in (("padded", False, padded_batch), ("packed", True, packed_batch)):
        _log(f"training: {name}, {steps} steps, batch {batch}, max_length {max_length}")
        args = SFTConfig(
            output_dir=str(workdir / f"train-{name}"),
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=1e-3,
            max_length=max_length,
            packing=packing,
            packing_strategy="bfd",
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=10_000,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=seed,
            shuffle_dataset=True,
        )
        timer = StepTimer()
        trainer = CountingTrainer(model=_tiny_model(tokenizer, seed), args=args, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[timer])
        # The trainer prints its log dicts when tqdm is off; keep stdout for the table.
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
        # The first step pays for lazy initialisation (allocator, kernels); it is left out of the rate.
        skip = 1 if steps > 2 else 0
        real, positions, seconds = sum(trainer.real[skip:]), sum(trainer.positions[skip:]), sum(timer.times[skip:])
        figures[f"{name}_tokens_per_s"] = real / seconds
        figures[f"{name}_positions_per_s"] = positions / seconds
        figures[f"{name}_real_token_fraction"] = real / positions
        figures[f"{name}_real_tokens"] = real
        figures[f"{name}_seconds"] = seconds
        if packing:
            lengths = trainer.train_dataset["seq_lengths"]
            packed_tokens = sum(sum(seq) for seq in lengths)
            figures["packed_sequences"] = len(lengths)
            # How full BFD's bins are: the real-token fraction if each pack were padded to max_length.
            figures["packed_bin_fill"] = packed_tokens / (len(lengths) * max_length)
        del trainer
    return figures


# --------------------------------------------------------------------------------------------------------
# Row 4: peak memory of the converter CLI

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


# --------------------------------------------------------------------------------------------------------
# Row: `beam-sft prepare` (the training data phase) at two sizes, against today's in-memory path

# MiB of generated OpenAI JSONL: the second size is 4x the first (the memory-flatness goal compares them).
PREPARE_MB = {"full": (250, 1000), "quick": (8, 32), "smoke": (1, 4)}
_LEGACY_PATH = (
    "import sys\n"
    "from beam_sft.template.tokenizer import load_tokenizer\n"
    "from beam_sft.dataset.examples import prepare_dataset, read_rows, to_beam_records\n"
    "records, _ = to_beam_records(read_rows(sys.argv[1]))\n"
    "prepare_dataset(load_tokenizer(sys.argv[3] or None), records, max_length=int(sys.argv[2]))\n"
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
        # One process: figures per core (scripts/bench_prepare.py measures the worker pool).
        command = [sys.executable, "-m", "beam_sft", "prepare", str(src), "-o", str(dst), "-q", "--num-proc", "1",
                   "--max-length", str(max_length), *(["--tokenizer", tokenizer] if tokenizer else [])]
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


# --------------------------------------------------------------------------------------------------------
# The table


def _goal(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def evaluate_goals(fig: dict) -> list[dict]:
    """Each goal of the issue as {name, ours, reference, ratio, goal, ok}."""
    rows: list[dict] = []
    tok = fig.get("masked_tokenization")
    if tok:
        rows.append({"name": "masked tokenization vs TRL (1 process)", "ours": f"{tok['ours']:,.0f} conv/s",
                     "reference": f"{tok['trl']:,.0f} conv/s (TRL)", "ratio": f"{tok['ours'] / tok['trl']:.2f}x",
                     "goal": ">= 1.5x", "ok": tok["ours"] >= 1.5 * tok["trl"]})
        rows.append({"name": "masked tokenization vs floor (1 process)", "ours": f"{tok['ours']:,.0f} conv/s",
                     "reference": f"{tok['floor']:,.0f} conv/s (floor)",
                     "ratio": f"{100 * tok['ours'] / tok['floor']:.0f}%", "goal": ">= 90%",
                     "ok": tok["ours"] >= 0.9 * tok["floor"]})
        rows.append({"name": "  (extra) vs raw floor: compiled template + encode_batch",
                     "ours": f"{tok['ours']:,.0f} conv/s", "reference": f"{tok['floor_raw']:,.0f} conv/s",
                     "ratio": f"{100 * tok['ours'] / tok['floor_raw']:.0f}%", "goal": "-", "ok": None})
        per_core = tok.get("tokens_per_cpu_s") or {}
        if per_core:
            real = tok["vocabulary"] > 100_000
            vocab = f"{tok['vocabulary']:,}-token vocabulary"
            rows.append({"name": f"masked tokenization, tokens/s per core ({vocab}, {tok['encoder_backend']})",
                         "ours": f"{per_core['ours'] / 1e6:.2f} M", "reference": f"{per_core['trl'] / 1e6:.2f} M (TRL)",
                         "ratio": f"{per_core['ours'] / per_core['trl']:.1f}x", "goal": ">= 5x (real vocabulary)",
                         "ok": per_core["ours"] >= 5 * per_core["trl"] if real else None})
            rows.append({"name": "  tokens/s per core: ours vs the goal", "ours": f"{per_core['ours'] / 1e6:.2f} M",
                         "reference": "1.5 M", "ratio": f"{per_core['ours'] / 1.5e6:.2f}x",
                         "goal": ">= 1.5 M (real vocabulary)", "ok": per_core["ours"] >= 1.5e6 if real else None})
            for key, label in (("render", "render only (our renderer, no tokenizing)"),
                               ("hf_encode", "ceiling: encode_batch of the rendered text"),
                               ("tiktoken_encode", "ceiling: tiktoken of the rendered text")):
                if key in per_core:
                    rows.append({"name": f"  tokens/s per core: {label}", "ours": f"{per_core['ours'] / 1e6:.2f} M",
                                 "reference": f"{per_core[key] / 1e6:.2f} M",
                                 "ratio": f"{100 * per_core['ours'] / per_core[key]:.0f}%", "goal": "-", "ok": None})
        scaling = tok.get("encode_dataset") or {}
        procs = sorted(scaling, key=int)
        for p in procs:
            s = scaling[p]
            is_top = p == procs[-1] and int(p) > 1
            cpu = f"; {s['conv_per_cpu_s']:,.0f} conv/CPU-s" if "conv_per_cpu_s" in s else ""
            rows.append({"name": f"encode_dataset num_proc={p}", "ours": f"{s['conv_per_s']:,.0f} conv/s{cpu}",
                         "reference": f"{int(p)}x ideal", "ratio": f"{s['speedup']:.2f}x",
                         "goal": f">= {0.8 * int(p):.1f}x (80% of linear)" if is_top else "-",
                         "ok": s["efficiency"] >= 0.8 if is_top else None})
    conv = fig.get("conversion")
    if conv:
        rows.append({"name": "conversion OpenAI -> Beam vs orjson load+dump", "ours": f"{conv['ours']:,.0f} rec/s",
                     "reference": f"{conv['floor']:,.0f} rec/s (floor)",
                     "ratio": f"{100 * conv['ours'] / conv['floor']:.0f}%", "goal": ">= 40%",
                     "ok": conv["ours"] >= 0.4 * conv["floor"]})
    train = fig.get("training")
    if train:
        rows.append({"name": "training tiny model: real tokens/s, packed vs padded",
                     "ours": f"{train['packed_tokens_per_s']:,.0f} tok/s packed",
                     "reference": f"{train['padded_tokens_per_s']:,.0f} tok/s padded",
                     "ratio": f"{train['packed_tokens_per_s'] / train['padded_tokens_per_s']:.2f}x",
                     "goal": "> 1x", "ok": train["packed_tokens_per_s"] > train["padded_tokens_per_s"]})
        fraction = min(train["packed_real_token_fraction"], train["packed_bin_fill"])
        rows.append({"name": "training: packed real-token fraction (min of computed, bin fill)",
                     "ours": f"{100 * fraction:.1f}%",
                     "reference": f"{100 * train['padded_real_token_fraction']:.1f}% padded",
                     "ratio": "-", "goal": ">= 95%", "ok": fraction >= 0.95})
    if fig.get("peak_rss_mb") is not None:
        mem = fig["memory"]
        rows.append({"name": f"peak RSS converting a {mem['input_mb']:,.0f} MiB JSONL",
                     "ours": f"{fig['peak_rss_mb']:,.0f} MiB",
                     "reference": f"{mem['cli_rows_per_s']:,.0f} rows/s, {mem['cli_mb_per_s']:.1f} MiB/s",
                     "ratio": "-", "goal": "< 1024 MiB", "ok": fig["peak_rss_mb"] < 1024})
    rows.extend(prepare_goals(fig))
    return rows


def format_table(fig: dict, goals: list[dict]) -> str:
    header = "| Row | Ours | Reference | Ratio | Goal | Result |\n|---|---:|---:|---:|---|---|\n"
    body = "".join(
        f"| {g['name']} | {g['ours']} | {g['reference']} | {g['ratio']} | {g['goal']} | {_goal(g['ok'])} |\n"
        for g in goals
    )
    m = fig["machine"]
    lines = [
        (f"Machine: {m['cpu']}, {m['usable_cores']} usable cores, {m['memory_gb']} GB; Python {m['python']}, "
        f"torch {m['torch']}, transformers {m['transformers']}, trl {m['trl']}, tokenizers {m['tokenizers']}; "
        f"load average at start {m['load_average_at_start']}, at end {m.get('load_average_at_end')}."),
        f"Workload: {fig['config']['conversations']} generated conversations (seed {fig['config']['seed']})",
    ]
    tok = fig.get("masked_tokenization")
    if tok:
        lines[-1] += (f", {tok['tokens_per_conversation']:.0f} tokens each on average, "
                      f"{100 * tok['supervised_fraction']:.0f}% of them supervised; ours == TRL on "
                      f"{tok['conversations'] - tok['mismatches_vs_trl']}/{tok['conversations']} conversations")
    train = fig.get("training")
    if train:
        lines.append(
            f"Training: {train['steps']} steps per mode (first left out), max_length {train['max_length']}, "
            f"padded {train['padded_real_tokens']:,} real tokens in {train['padded_seconds']:.1f} s "
            f"({100 * train['padded_real_token_fraction']:.1f}% real), packed {train['packed_real_tokens']:,} in "
            f"{train['packed_seconds']:.1f} s (padding-free: {100 * train['packed_real_token_fraction']:.1f}% of "
            f"computed positions real; BFD bins {100 * train['packed_bin_fill']:.1f}% full).")
    return header + body + "\n" + "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------
# CLI

PRESETS = {
    "full": {"conversations": 20_000, "memory_mb": 2048, "train_steps": 30, "train_records": 600, "max_length": 2048},
    "quick": {"conversations": 1_000, "memory_mb": 50, "train_steps": 8, "train_records": 160, "max_length": 2048},
    "smoke": {"conversations": 80, "memory_mb": 2, "train_steps": 3, "train_records": 16, "max_length": 512},
}
ROWS = ("tokenization", "conversion", "training", "memory", "prepare")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench.py",
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
                        help="encode_dataset process counts to time (default: 1 .. usable cores; --smoke: 1)")
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
        "packed_batch": args.packed_batch, "command": " ".join(["python", "scripts/bench.py", *(argv or sys.argv[1:])]),
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
