"""Fill the missing reasoning of a dataset's assistant turns with a teacher model, `concurrency` records at a
time, in input order; records in = records out + rejected (docs/reasoning.md)."""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from beam_sft.backfill.cache import TurnCache, record_key, turn_key
from beam_sft.backfill.filters import check
from beam_sft.backfill.prompt import PROMPT_VERSION, teacher_messages
from beam_sft.backfill.teachers import Answer, TeacherError

SAMPLES = 3  # refused answers kept per filter in the stats
SAMPLE_CHARS = 400


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


MAX_REASONING_TOKENS = 256  # a rationale for one known reply; measured: docs/reasoning.md (Bounds)
UNBOUNDED_GENERATION = 4096  # the generation bound when the reasoning has none


def generation_bound(max_tokens: int | None, max_reasoning_tokens: int | None) -> int:
    """The teacher's generation budget per turn (why so: docs/reasoning.md, Bounds)."""
    if max_tokens:
        return max_tokens
    if not max_reasoning_tokens:
        return UNBOUNDED_GENERATION
    return max_reasoning_tokens + max_reasoning_tokens // 4 + 32


@dataclass
class Settings:
    mode: str = "rationalize"
    max_reasoning_tokens: int | None = MAX_REASONING_TOKENS
    concurrency: int = 8
    retries: int = 4
    retry_wait: float = 1.0  # seconds before the first retry; doubled each time, with jitter


@dataclass
class Stats:
    records_in: int = 0
    records_out: int = 0
    rejected: Counter = field(default_factory=Counter)
    assistant_turns: int = 0
    turns_missing: int = 0
    filled: int = 0
    from_cache: int = 0
    filtered: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    requests: int = 0
    retried: int = 0
    samples: dict = field(default_factory=dict)  # filter -> the first SAMPLES answers it refused

    def add(self, counts: Counter) -> None:
        for key, value in counts.items():
            if ":" in key:
                group, name = key.split(":", 1)
                getattr(self, group)[name] += value
            else:
                setattr(self, key, getattr(self, key) + value)

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in vars(self).items()}

    def table(self) -> str:
        from beam_sft.dataset.drops import aligned_rows

        def codes(counter: Counter) -> list[tuple[str, Any]]:
            return [(f"  {code}", n) for code, n in counter.most_common()]

        def example(code: str) -> str:  # the first answer the filter refused
            return _clip((self.samples.get(code) or [""])[0], 90)

        rows = [("records in", self.records_in), ("records out", self.records_out),
                ("rejected", sum(self.rejected.values())), *codes(self.rejected),
                ("assistant turns", self.assistant_turns), ("without reasoning", self.turns_missing),
                ("filled", f"{self.filled} ({self.from_cache} from the cache)"),
                ("filtered out", sum(self.filtered.values())),
                *((f"  {c}", f"{n}  e.g. {example(c)!r}" if example(c) else n) for c, n in self.filtered.most_common()),
                ("failed calls (asked again next run)", sum(self.failed.values())), *codes(self.failed),
                ("requests", f"{self.requests} ({self.retried} retries)")]
        return "\n".join(aligned_rows(rows))


def ask(teacher, messages: list[dict], settings: Settings, counts: Counter) -> Answer:
    """One teacher answer, retried with exponential backoff on what may pass (timeouts, 429, 5xx)."""
    for attempt in range(settings.retries + 1):
        counts["requests"] += 1
        try:
            return teacher.complete(messages)
        except TeacherError as err:
            if not err.retryable or attempt == settings.retries:
                raise
            counts["retried"] += 1
            time.sleep(settings.retry_wait * (2 ** attempt) * (1 + 0.25 * random.random()))


def fill_record(record: dict[str, Any], teacher, cache: TurnCache, settings: Settings,
                count_tokens: Callable[[str], int]) -> tuple[dict[str, Any], Counter, list]:
    """The record with its missing reasoning filled in place, its counts, and the refused (filter, text)."""
    counts: Counter = Counter()
    refused: list[tuple[str, str | None]] = []
    record_hash = record_key(record)
    source = f"{teacher.id} ({settings.mode}, {PROMPT_VERSION})"
    for index, message in enumerate(record["messages"]):
        if message["role"] != "assistant":
            continue
        counts["assistant_turns"] += 1
        if message.get("reasoning_content"):
            continue
        counts["turns_missing"] += 1
        key = turn_key(record_hash, index, teacher.id, PROMPT_VERSION)
        if (entry := cache.entries.get(key)) is not None:
            counts["from_cache"] += 1
            if entry["status"] == "ok":  # filters added since it was asked apply to it too
                reason = check(entry["reasoning"], message, record.get("tools"),
                               max_tokens=settings.max_reasoning_tokens, count_tokens=count_tokens)
                entry = entry if reason is None else {"status": reason, "text": entry["reasoning"]}
        else:
            try:
                answer = ask(teacher, teacher_messages(record, index), settings, counts)
            except TeacherError as err:
                counts[f"failed:{err.kind}"] += 1
                continue
            text = answer.text.strip() if isinstance(answer.text, str) else answer.text
            reason = check(text, message, record.get("tools"), max_tokens=settings.max_reasoning_tokens,
                           count_tokens=count_tokens, stopped=answer.stopped)
            # A filtered answer is kept aside (`text`), never as reasoning: the stats sample it.
            cache.put(key, text if reason is None else None, reason or "ok", text=None if reason is None else text)
            entry = cache.entries.get(key)
        if entry["status"] == "ok":
            message["reasoning_content"] = entry["reasoning"]
            message["reasoning_source"] = source
            counts["filled"] += 1
        else:
            counts[f"filtered:{entry['status']}"] += 1
            refused.append((entry["status"], entry.get("text")))
    return record, counts, refused


@dataclass
class Output:
    """Where `backfill` sends each record it is done with, in input order."""

    write: Callable[[dict], None]  # a record, its missing reasoning filled where the teacher's passed
    write_reject: Callable[[dict], None] = lambda _: None  # a row the conversion rejected
    progress: Callable[[int], None] = lambda _: None  # one more input row done


def backfill(records: Iterable[tuple[dict | None, dict | None]], teacher, cache: TurnCache, settings: Settings,
             count_tokens: Callable[[str], int], out: Output) -> Stats:
    """Run over `records` ((record, None) or (None, reject) pairs, in input order) into `out`."""
    stats = Stats()
    window: deque = deque()
    workers = max(1, settings.concurrency)

    def finish_one() -> None:
        record, counts, refused = window.popleft().result()
        stats.add(counts)
        for reason, text in refused:
            kept = stats.samples.setdefault(reason, [])
            if len(kept) < SAMPLES:
                kept.append(_clip(text or "", SAMPLE_CHARS))
        out.write(record)
        stats.records_out += 1
        out.progress(1)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="backfill") as pool:
        for record, reject in records:
            stats.records_in += 1
            if reject is not None:
                stats.rejected[reject["reason"]] += 1
                out.write_reject(reject)
                out.progress(1)
                continue
            window.append(pool.submit(fill_record, record, teacher, cache, settings, count_tokens))
            while len(window) >= 2 * workers:
                finish_one()
        while window:
            finish_one()
    return stats
