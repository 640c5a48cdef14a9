"""Streaming: the data phase's conversion and tokenization on the fly, for data larger than the disk."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from beam_sft.dataset.pipeline import BATCH_ROWS, Job, convert_batch, label_batch, raw_row, tokenize_batch
from beam_sft.dataset.settings import DataSettings
from beam_sft.errors import UsageError
from beam_sft.records.files import data_sources

logger = logging.getLogger(__name__)


def _stream_rows(shard: list[int], sources: tuple, n_shards: int, limit: int | None, names: tuple, mixture=None):
    """Raw rows of the given shards: shard s holds input records s, s + n_shards, s + 2 n_shards, ... (of a
    mixture: of its seeded sequence, the same on every rank)."""
    from itertools import islice

    from beam_sft.records.files import iter_items

    index = {name: i for i, name in enumerate(names)}
    wanted = set(shard)
    items = iter_items(list(sources), limit=limit) if mixture is None else islice(mixture.streamed_items(), limit)
    for i, item in enumerate(items):
        if i % n_shards in wanted:  # another rank's record is skipped before parsing, converting or tokenizing
            yield raw_row(item, index)


def _converted(batch: dict[str, list], fmt, names: list[str], missing_reasoning, tool_call_checks: str = "reject"
               ) -> dict[str, list]:
    out = convert_batch(batch, fmt, names, missing_reasoning, tool_call_checks=tool_call_checks)
    return {"record": out["record"], "reason": out["reason"], "reject": out["reject"]}


def _tokenized(batch: dict[str, list], job: Job, names: list[str]) -> dict[str, list]:
    out = tokenize_batch(batch, job, names)
    _, labels, _, _ = label_batch(out["input_ids"], out["mask"], job.assistant_only_loss, job.stop_ids)
    return {"input_ids": out["input_ids"], "labels": labels.to_pylist(), "keep": out["keep"], "reject": out["reject"]}


class StreamRejects:
    """Filter of a streamed dataset: keeps converted records, appends the rejected ones to a per-rank file (the
    rank read when a batch arrives, so the same object serves every rank and its data workers)."""

    def __init__(self, directory: str | os.PathLike | None, column: str = "reject") -> None:
        self.directory = None if directory is None else os.fspath(directory)
        self.column = column
        # A stream is read again every epoch; each reject is written once. Rejects are few: the set stays small.
        self.seen: set[str] = set()

    def __call__(self, batch: dict[str, list]) -> list[bool]:
        lines = [text for text in batch[self.column] if text is not None and text not in self.seen]
        self.seen.update(lines)
        if lines and self.directory is not None:
            rank = os.environ.get("RANK", "0")
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, f"rejects.rank{rank}.jsonl"), "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        for line in lines:
            logger.warning("rejected: %s", line)
        return [text is None for text in batch[self.column]]


def stream_training_data(inputs: Sequence[str] | str, tokenizer, settings: DataSettings, *, world_size: int = 1,
                         shards_per_rank: int = 1, rejects_dir: str | os.PathLike | None = None,
                         shuffle_buffer: int | None = None):
    """Raw data -> a `datasets.IterableDataset` of `input_ids` + `labels`, converted and tokenized on the fly.

    Nothing is written but rejects (`rejects_dir/rejects.rank<N>.jsonl`). The stream has `world_size *
    shards_per_rank` shards, shard s holding every (world_size * shards_per_rank)-th record from s, so a split by
    node gives each rank its own records before they are parsed. `shuffle_buffer` N: a seeded buffer of N raw
    records. `inputs` may be a mixture resolved with `count=False`. See docs/training.md (Streaming).
    """
    from datasets import Features, IterableDataset, List, Value

    from beam_sft.dataset.mixture import Mixture

    if isinstance(inputs, str):
        inputs = [inputs]
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
    n_shards = max(1, world_size) * max(1, shards_per_rank)
    raw_features = Features({"src": Value("int32"), "pos": Value("int64"), "by_line": Value("bool"),
                             "payload": Value("large_binary"), "error": Value("string")})
    raw = IterableDataset.from_generator(
        _stream_rows, features=raw_features,
        gen_kwargs={"shard": list(range(n_shards)), "sources": tuple(sources), "n_shards": n_shards,
                    "limit": settings.max_records, "names": names, "mixture": mixture},
    )
    if shuffle_buffer:
        if shuffle_buffer < 1:
            raise UsageError("shuffle_buffer must be at least 1")
        raw = raw.shuffle(seed=settings.seed, buffer_size=shuffle_buffer)
    converted = raw.map(_converted, batched=True, batch_size=BATCH_ROWS, remove_columns=["payload", "error"],
                        fn_kwargs={"fmt": fmt, "names": list(names), "missing_reasoning": policy,
                                   "tool_call_checks": settings.tool_call_checks})
    converted = converted.filter(StreamRejects(rejects_dir), batched=True, batch_size=BATCH_ROWS)
    converted = converted.select_columns(["src", "pos", "by_line", "record"])
    tokenized = converted.map(
        _tokenized, batched=True, batch_size=BATCH_ROWS, remove_columns=["src", "pos", "by_line", "record"],
        features=Features({"input_ids": List(Value("int32")), "labels": List(Value("int32")), "keep": Value("bool"),
                           "reject": Value("string")}),
        fn_kwargs={"job": Job.of(tokenizer, settings), "names": list(names)},
    )
    tokenized = tokenized.filter(StreamRejects(rejects_dir), batched=True, batch_size=BATCH_ROWS)
    kept = tokenized.filter(lambda batch: batch["keep"], batched=True, batch_size=BATCH_ROWS)
    return kept.select_columns(["input_ids", "labels"])
