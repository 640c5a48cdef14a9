"""Streaming: the data phase's conversion and tokenization on the fly, for data larger than the disk."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from itertools import islice
from typing import Any

import orjson

from beam_sft.dataset.drops import drop_lines, format_keys
from beam_sft.dataset.mixture import Mixture
from beam_sft.dataset.pipeline import (
    BATCH_ROWS,
    RAW_COLUMNS,
    Job,
    arrow_schema,
    convert_batch,
    label_batch,
    raw_row,
    tokenize_batch,
)
from beam_sft.dataset.settings import DataSettings, PhaseOptions
from beam_sft.errors import UsageError
from beam_sft.records.files import data_sources, iter_items

logger = logging.getLogger(__name__)

# Rejects logged one by one per process (the rest are in the rejects file and the drop report).
LOGGED_REJECTS = 5


def _stream_rows(shard: list[int], sources: tuple, n_shards: int, limit: int | None, names: tuple, mixture=None):
    """Raw rows of the given shards: shard s holds input records s, s + n_shards, s + 2 n_shards, ... (of a
    mixture: of its seeded sequence, the same on every rank); between two markers for the drop report (`src`
    -1 - shard[0]; `pos` -1 first, then the number of rows)."""
    index = {name: i for i, name in enumerate(names)}
    wanted = set(shard)
    marker = {"src": -1 - shard[0], "pos": -1, "by_line": False, "payload": None, "error": None}
    yield marker
    rows = 0
    items = iter_items(list(sources), limit=limit) if mixture is None else islice(mixture.streamed_items(), limit)
    for i, item in enumerate(items):
        if i % n_shards in wanted:  # another rank's record is skipped before parsing, converting or tokenizing
            rows += 1
            yield raw_row(item, index)
    yield {**marker, "pos": rows}


def _converted(batch: dict[str, list], fmt, names: list[str], missing_reasoning, tool_call_checks: str = "reject"
               ) -> dict[str, list]:
    rows = [i for i, src in enumerate(batch["src"]) if src >= 0]  # the others are _stream_rows' markers
    raw = {key: [batch[key][i] for i in rows] for key in RAW_COLUMNS}
    out = convert_batch(raw, fmt, names, missing_reasoning, tool_call_checks=tool_call_checks)
    columns = {key: [None] * len(batch["src"]) for key in ("record", "reason", "reject")}
    for j, i in enumerate(rows):
        for key, column in columns.items():
            column[i] = out[key][j]
    return columns


def _tokenized(batch: dict[str, list], job: Job, names: list[str]) -> dict[str, list]:
    out = tokenize_batch(batch, job, names)
    _, labels, _, _ = label_batch(out["input_ids"], out["mask"], job.assistant_only_loss, job.stop_ids)
    return {"input_ids": out["input_ids"], "labels": labels.to_pylist(), "keep": out["keep"], "reject": out["reject"]}


class StreamDrops:
    """The filters of a streamed dataset, with its drop accounting (docs/prepare.md#what-was-dropped,
    Streaming). Rejects go to a per-rank file (the rank read when a batch arrives, so the same object serves
    every rank and its data workers) and to the log."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.logged = 0  # rejects logged one by one: the first LOGGED_REJECTS, as the prepared path does
        self.begun: set[int] = set()
        self.ended: set[int] = set()
        self.expected = self.reported = 0  # rows of the ended shards; of the last report
        self.again = False  # a second pass began
        self.counts: dict[str, Any] = {"records_in": 0, "records_kept": 0, "rejected": Counter(),
                                       "dropped_too_long": 0, "unknown_format_keys": Counter()}

    def converted(self, batch: dict[str, list]) -> list[bool]:
        """Filter: the converted records; counts the rows in, and takes `_stream_rows`' markers out."""
        for src, pos in zip(batch["src"], batch["pos"], strict=True):
            if src < 0 and pos < 0:
                self.again |= -1 - src in self.begun
                self.begun.add(-1 - src)
            elif src < 0 and not self.again:
                self.ended.add(-1 - src)
                self.expected += pos
        markers = [src < 0 for src in batch["src"]]
        self._count("records_in", len(markers) - sum(markers))
        return [keep and not marker for keep, marker in zip(self.tokenized(batch), markers, strict=True)]

    def tokenized(self, batch: dict[str, list]) -> list[bool]:
        """Filter: the rows without a reject."""
        # Each reject is counted, written and logged on the first pass only: later epochs read the same rows.
        lines = [text for text in batch["reject"] if text is not None] if not self.again else []
        for entry in map(orjson.loads, lines):
            self.counts["rejected"][entry["reason"]] += 1
            if keys := format_keys(entry):
                self.counts["unknown_format_keys"][keys] += 1
        if lines and self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            with open(self._rejects(), "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        for line in lines[: max(0, LOGGED_REJECTS - self.logged)]:
            logger.warning("rejected: %s", line)
        self.logged += len(lines)
        self._report()
        return [text is None for text in batch["reject"]]

    def keep(self, batch: dict[str, list]) -> list[bool]:
        """Filter: the rows that fit (`keep`); the others are dropped by the truncation policy."""
        self._count("records_kept", sum(batch["keep"]))
        self._count("dropped_too_long", len(batch["keep"]) - sum(batch["keep"]))
        self._report()
        return batch["keep"]

    def _count(self, key: str, n: int) -> None:
        if not self.again:
            self.counts[key] += n

    def _rejects(self) -> str:
        return os.path.join(self.directory, f"rejects.rank{os.environ.get('RANK', '0')}.jsonl")

    def _report(self) -> None:
        counts = self.counts
        done = counts["records_kept"] + sum(counts["rejected"].values()) + counts["dropped_too_long"]
        if self.again or self.ended != self.begun or done != self.expected or done == self.reported:
            return
        self.reported = done
        lines = drop_lines(counts, rejects=self.directory and self._rejects(), rejects_hint=None)
        log = logger.warning if len(lines) > 1 else logger.info
        log("streamed (rank %s): %s", os.environ.get("RANK", "0"), "\n".join(lines))


def stream_training_data(inputs: Sequence[str] | str, tokenizer, settings: DataSettings,
                         options: PhaseOptions | None = None):
    """Raw data (or a mixture resolved with `count=False`) -> a `datasets.IterableDataset` of `input_ids` +
    `labels`, converted and tokenized on the fly (docs/training.md, Streaming). Its `world_size *
    shards_per_rank` shards each hold every n-th record: a split by node gives each rank its own records."""
    from datasets import Features, IterableDataset, List, Value

    if isinstance(inputs, str):
        inputs = [inputs]
    options = options or PhaseOptions()
    settings.check()
    if settings.eval_split_size:
        raise UsageError("streaming has no eval split (eval_split_size): pass eval_dataset_name, or prepare the data")
    mixture = inputs if isinstance(inputs, Mixture) else None
    sources = mixture.sources if mixture else data_sources(inputs, settings.split)
    for source in sources:  # a hub split arrives as it downloads, not after a full download
        source.streaming = source.kind == "hub"
    names = tuple(s.name for s in sources)
    fmt = mixture.formats(settings.format) if mixture else settings.format
    policy = mixture.policies(settings.missing_reasoning) if mixture else settings.missing_reasoning
    n_shards = max(1, options.world_size) * max(1, options.shards_per_rank)
    raw = IterableDataset.from_generator(
        _stream_rows, features=Features.from_arrow_schema(arrow_schema(*RAW_COLUMNS)),
        gen_kwargs={"shard": list(range(n_shards)), "sources": tuple(sources), "n_shards": n_shards,
                    "limit": settings.max_records, "names": names, "mixture": mixture},
    )
    if options.shuffle_buffer:
        if options.shuffle_buffer < 1:
            raise UsageError("shuffle_buffer must be at least 1")
        raw = raw.shuffle(seed=settings.seed, buffer_size=options.shuffle_buffer)
    converted = raw.map(_converted, batched=True, batch_size=BATCH_ROWS, remove_columns=["payload", "error"],
                        fn_kwargs={"fmt": fmt, "names": list(names), "missing_reasoning": policy,
                                   "tool_call_checks": settings.tool_call_checks})
    drops = StreamDrops(None if options.output_dir is None else os.fspath(options.output_dir))
    converted = converted.filter(drops.converted, batched=True, batch_size=BATCH_ROWS)
    converted = converted.select_columns(["src", "pos", "by_line", "record"])
    tokenized = converted.map(
        _tokenized, batched=True, batch_size=BATCH_ROWS, remove_columns=["src", "pos", "by_line", "record"],
        features=Features({"input_ids": List(Value("int32")), "labels": List(Value("int32")), "keep": Value("bool"),
                           "reject": Value("string")}),
        fn_kwargs={"job": Job.of(tokenizer, settings), "names": list(names)},
    )
    tokenized = tokenized.filter(drops.tokenized, batched=True, batch_size=BATCH_ROWS)
    kept = tokenized.filter(drops.keep, batched=True, batch_size=BATCH_ROWS)
    return kept.select_columns(["input_ids", "labels"])
