"""The benchmark's workload: generated Beam records (fixed seed), and the same conversations in OpenAI shape."""

from __future__ import annotations

import json
import random
from pathlib import Path

from make_samples import (  # a build helper: scripts/ is on the path (benchmarks/data.py)
    CURRENCY_TOOL,
    WEATHER_TOOL,
)

SEED = 1234

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
