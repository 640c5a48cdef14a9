"""The in-memory training-data path over Python lists, kept for tests and the benchmark's baseline.

`read_rows` + `to_beam_records` + `prepare_dataset`: the same per-record rules as the data phase
(`beam_sft.validate.convert`, `build_example`) but every record held in memory, so it is for small
data only. `scripts/train.py` never uses it: it runs `beam_sft.dataset.prepare` (Arrow, chunked, cached).
Tests compare the two; `benchmarks/data.py`'s prepare row runs this path as its in-memory reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from beam_sft.dataset.examples import (
    IGNORE_INDEX,
    TRUNCATION_POLICIES,
    PrepStats,
    encode,
    encode_many,
    fit_example,
    label_batch,
)
from beam_sft.errors import FatalError, RecordError, UsageError
from beam_sft.records.files import Item
from beam_sft.template.tokenizer import stop_token_ids


def build_example(tokenizer, record: dict[str, Any], *, max_length: int | None, policy: str = "turn",
                  assistant_only_loss: bool = True, stop_ids: Sequence[int] = (), where: str = "record",
                  encoded: tuple[list[int], list[int]] | None = None) -> dict[str, Any]:
    """One training row: `input_ids`, `labels` (`label_batch`'s, as the data phase makes them) and per-record
    counts; `keep` False when the truncation policy drops it (`fit_example`). `encoded`: (input_ids, mask)."""
    input_ids, mask = encoded if encoded is not None else encode(tokenizer, record)
    input_ids, mask, counts = fit_example(input_ids, mask, max_length=max_length, policy=policy, where=where)
    if counts["dropped"]:
        return {"input_ids": [], "labels": [], "keep": False, **counts, "n_supervised_return": 0,
                "n_supervised_call": 0}
    _, labels, tokens, _ = label_batch([input_ids], [mask], assistant_only_loss, stop_ids)
    return {"input_ids": input_ids, "labels": labels[0].as_py(), "keep": True, **counts,
            "n_supervised_return": tokens["supervised_return"], "n_supervised_call": tokens["supervised_call"]}


def read_rows(source: str, split: str = "train") -> list[Item]:
    """Read raw rows with their provenance through the reader every command uses
    (`beam_sft.records.files.read_items`: rejects files found in a directory are not data).

    `source`: a .jsonl / .json / .parquet file, a glob, a directory of them, a `save_to_disk` dataset, or a hub
    id (only from the local cache when HF_HUB_OFFLINE=1). Each item keeps its file and 1-based line (JSONL) or
    0-based index; an unreadable row (malformed JSON, invalid UTF-8) is an item carrying its `RecordError`,
    which `to_beam_records` counts as a reject instead of stopping the run.
    """
    from beam_sft.records.files import read_items

    return list(read_items([source], split))


def to_beam_records(
    items: Iterable[Item], input_format: str = "auto"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn rows read by `read_rows` into validated Beam records with the one per-record conversion
    (`beam_sft.validate.convert`; `input_format="beam"`: rows are Beam records as `convert-dataset` writes them).

    Returns (records, rejects); each reject is a `beam_sft.errors.reject_entry` with the row's source and its
    line (JSONL) or index: records + rejects = rows, nothing is lost silently.
    """
    from beam_sft.validate.convert import convert_item

    records: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    for item in items:
        record, _, reject = convert_item(item, input_format)
        if reject is None:
            records.append(record)
        else:
            rejects.append(reject)
    return records, rejects


def _prepare_batch(batch, tokenizer, max_length, policy, assistant_only_loss, stop_ids, offset_name):
    out: dict[str, list] = {
        k: []
        for k in (
            "input_ids",
            "labels",
            "keep",
            "truncated",
            "dropped",
            "assistant_turns_cut",
            "n_supervised_return",
            "n_supervised_call",
        )
    }
    records = [json.loads(raw) for raw in batch["record"]]
    try:
        encoded = encode_many(tokenizer, records)
    except RecordError as err:
        line = batch["row"][err.line] if err.line is not None and err.line < len(batch["row"]) else None
        raise err.with_provenance(offset_name, line) from None
    for row_index, record, enc in zip(batch["row"], records, encoded, strict=True):
        example = build_example(
            tokenizer,
            record,
            encoded=enc,
            max_length=max_length,
            policy=policy,
            assistant_only_loss=assistant_only_loss,
            stop_ids=stop_ids,
            where=f"{offset_name} record {row_index}",
        )
        for key, column in out.items():
            column.append(example[key])
    return out


def prepare_dataset(
    tokenizer,
    records: Sequence[dict[str, Any]],
    *,
    max_length: int | None,
    policy: str = "turn",
    assistant_only_loss: bool = True,
    num_proc: int | None = None,
    name: str = "train",
):
    """Tokenize Beam records into a `datasets.Dataset` with `input_ids` and `labels`; returns (dataset, stats).

    Records travel through Arrow as JSON strings, so tool arguments with different keys survive intact, and
    `num_proc` parallelises the template rendering.
    """
    from datasets import Dataset

    if policy not in TRUNCATION_POLICIES:
        raise UsageError(f"unknown truncation policy {policy!r}; choose one of {', '.join(TRUNCATION_POLICIES)}")
    if not records:
        raise UsageError(f"the {name} split has no records")
    stop_ids = stop_token_ids(tokenizer)
    raw = Dataset.from_dict(
        {"row": list(range(len(records))), "record": [json.dumps(r, ensure_ascii=False) for r in records]}
    )
    prepared = raw.map(
        _prepare_batch,
        batched=True,
        batch_size=64,
        num_proc=num_proc if num_proc and num_proc > 1 and len(records) >= 256 else None,
        remove_columns=["row", "record"],
        fn_kwargs={
            "tokenizer": tokenizer,
            "max_length": max_length,
            "policy": policy,
            "assistant_only_loss": assistant_only_loss,
            "stop_ids": stop_ids,
            "offset_name": name,
        },
        desc=f"Tokenizing {name} records",
    )
    stats = PrepStats(records_in=len(records))
    cols = prepared.select_columns(
        ["keep", "truncated", "dropped", "assistant_turns_cut", "n_supervised_return", "n_supervised_call"]
    ).to_dict()
    stats.records_kept = sum(cols["keep"])
    stats.truncated = sum(cols["truncated"])
    stats.dropped_too_long = sum(cols["dropped"])
    stats.assistant_turns_cut = sum(cols["assistant_turns_cut"])
    stats.supervised_return = sum(cols["n_supervised_return"])
    stats.supervised_call = sum(cols["n_supervised_call"])
    prepared = prepared.filter(lambda keep: keep, input_columns="keep").select_columns(["input_ids", "labels"])
    for labels in prepared["labels"]:
        stats.total_tokens += len(labels)
        stats.supervised_tokens += sum(1 for tok in labels if tok != IGNORE_INDEX)
    if stats.records_kept == 0:
        raise FatalError(f"the {name} split is empty after truncation: {stats.summary(name)}; raise max_length")
    return prepared, stats
