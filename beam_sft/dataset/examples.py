"""The per-record rules of training data: Beam records in, `input_ids` + `labels` out, with counts
(docs/training.md#truncation-policy---truncation_policy-applied-before-packing)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, groupby
from typing import Any

from beam_sft.errors import FatalError, UsageError
from beam_sft.records.messages import STOP_MARKERS
from beam_sft.storage import arrow_array
from beam_sft.template.tokenizer import stop_token_ids

TRUNCATION_POLICIES = ("turn", "drop", "keep_start")
IGNORE_INDEX = -100

# A conversation that exercises both ways an assistant turn ends: a tool call (<|call|>) and an answer
# (<|return|>). Used once per run to check that the template trains both stop tokens.
STOP_PROBE: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "I should call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "18 C in Paris."},
    ],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
}


class Counts:
    """The one counts type: named counts as attributes, ints and Counters (`PrepStats`, the pipeline's
    `Result`, `beam-sft convert`'s `Stats`); `subtract` takes back a duplicate found after it was counted."""

    def counts(self) -> dict[str, Any]:
        """The attributes that are counts."""
        return {k: v for k, v in vars(self).items() if isinstance(v, Counter) or type(v) is int}

    def add(self, other: Counts, sign: int = 1) -> None:
        for key, value in other.counts().items():
            mine = getattr(self, key)
            if not isinstance(value, Counter):
                setattr(self, key, mine + sign * value)
            elif sign > 0:
                mine.update(value)
            else:
                mine.subtract(value)
                setattr(self, key, +mine)

    def subtract(self, other: Counts) -> None:
        self.add(other, -1)

    def to_dict(self) -> dict[str, Any]:
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in self.counts().items()}


@dataclass
class PrepStats(Counts):
    """Counts for one prepared split. Token counts are after truncation, over the kept records."""

    records_in: int = 0
    records_kept: int = 0
    dropped_too_long: int = 0
    truncated: int = 0
    assistant_turns_cut: int = 0
    total_tokens: int = 0
    supervised_tokens: int = 0
    supervised_return: int = 0
    supervised_call: int = 0

    def summary(self, name: str = "train") -> str:
        share = 100.0 * self.supervised_tokens / self.total_tokens if self.total_tokens else 0.0
        return (f"{name}: {self.records_kept}/{self.records_in} records kept, {self.total_tokens} tokens, "
                f"{self.supervised_tokens} supervised ({share:.1f}%), trained stop tokens: "
                f"{self.supervised_return} <|return|>, {self.supervised_call} <|call|>; truncation: "
                f"{self.truncated} records cut, {self.dropped_too_long} dropped, "
                f"{self.assistant_turns_cut} assistant turns lost or cut")


def encode_many(tokenizer, records: Sequence[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, assistant_masks) of Beam records, as the chat template renders them (`beam_sft.render.encoder`'s
    batched encoder: identical to apply_chat_template by contract, and much faster)."""
    from beam_sft.render.encoder import get_encoder

    return [(list(out["input_ids"]), list(out["assistant_masks"]))
            for out in get_encoder(tokenizer).encode(list(records), None)]


def encode(tokenizer, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_masks) of one Beam record."""
    return encode_many(tokenizer, [record])[0]


def assistant_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) spans of consecutive 1s in `mask`: one per assistant turn."""
    spans, start = [], 0
    for bit, run in groupby(map(bool, mask)):
        end = start + sum(1 for _ in run)
        if bit:
            spans.append((start, end))
        start = end
    return spans


def truncate(input_ids: list[int], mask: list[int], max_length: int | None,
             policy: str) -> tuple[list[int], list[int], dict[str, int]] | None:
    """Apply `policy` to one tokenized record: (ids, mask, {"truncated": 0|1, "assistant_turns_cut": turns that
    lost tokens}), or None when the record is dropped."""
    if policy not in TRUNCATION_POLICIES:
        raise UsageError(f"unknown truncation policy {policy!r}; choose one of {', '.join(TRUNCATION_POLICIES)}")
    if max_length is None or len(input_ids) <= max_length:
        return input_ids, mask, {"truncated": 0, "assistant_turns_cut": 0}
    spans = assistant_spans(mask)
    if policy == "drop":
        return None
    if policy == "keep_start":
        cut = max_length
    else:  # "turn": end of the last assistant turn that fits
        ends = [end for _, end in spans if end <= max_length]
        if not ends:
            return None
        cut = ends[-1]
    lost = sum(1 for _, end in spans if end > cut)
    return input_ids[:cut], mask[:cut], {"truncated": 1, "assistant_turns_cut": lost}


class EmptyMaskError(FatalError):
    """A record has no supervised token: the template produced no assistant mask for it."""


def fit_example(input_ids: list[int], mask: list[int], *, max_length: int | None, policy: str = "turn",
                where: str = "record") -> tuple[list[int], list[int], dict[str, int]]:
    """The empty-mask check (EmptyMaskError: a template or data defect, not a length problem), then the truncation
    policy: (ids, mask, counts `truncated`, `dropped`, `assistant_turns_cut`); a dropped record has empty ids."""
    if not any(mask):
        raise EmptyMaskError(f"{where}: the chat template produced an empty assistant mask ({len(input_ids)} tokens, "
                             "no supervised token). Check that the record has an assistant message and that the "
                             "template wraps assistant output in {% generation %}...{% endgeneration %}")
    result = truncate(input_ids, mask, max_length, policy)
    if result is None:
        return [], [], {"truncated": 0, "dropped": 1, "assistant_turns_cut": len(assistant_spans(mask))}
    input_ids, mask, counts = result
    return input_ids, mask, {**counts, "dropped": 0}


TOKEN_KEYS = ("total_tokens", "supervised_tokens", "supervised_return", "supervised_call")


def label_batch(ids: list[list[int]], masks: list[list[int]], assistant_only_loss: bool, stop_ids: Sequence[int],
                per_row: bool = False):
    """The labels of a batch of rows: (input_ids, labels) as Arrow list<int32> arrays, and the batch's token
    counts (`TOKEN_KEYS`). The one rule: IGNORE_INDEX off the mask, or every token without assistant-only
    loss; applied to the whole batch at once on the flat arrays, instead of a Python list of labels per row (a
    fifth of the data phase's time outside the encoder, measured). `per_row`: the same counts row by row (sums
    over each row's slice, `np.add.reduceat`), else None."""
    import numpy as np
    import pyarrow as pa

    # numpy.fromiter over the chained rows, offsets from their lengths: 1.5x pyarrow's conversion of the nested
    # lists (pyarrow 26, numpy 2.4, 256 rows of 100-700 ids, CPU time; measured for issue 52).
    starts = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, ids), dtype=np.int32, count=len(ids)), out=starts[1:])
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(starts[-1]))
    offsets = arrow_array(starts, pa.int32())
    input_ids = pa.ListArray.from_arrays(offsets, arrow_array(flat, pa.int32()))
    if assistant_only_loss:
        try:
            trained = np.frombuffer(b"".join(map(bytes, masks)), dtype=np.uint8) != 0
        except (TypeError, ValueError):  # not small non-negative ints
            trained = np.fromiter((bool(bit) for mask in masks for bit in mask), dtype=bool, count=len(flat))
        if len(trained) != len(flat):
            raise ValueError(f"{len(trained)} mask entries for {len(flat)} tokens")
        values = np.where(trained, flat, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
    else:
        values, trained = flat, np.ones(len(flat), dtype=bool)
    labels = pa.ListArray.from_arrays(offsets, arrow_array(values, pa.int32()))
    columns = (np.ones(len(flat), dtype=bool), trained,
               values == stop_ids[0] if stop_ids else np.zeros(len(flat), dtype=bool),
               values == stop_ids[1] if len(stop_ids) > 1 else np.zeros(len(flat), dtype=bool))
    counts = {key: int(np.count_nonzero(col)) for key, col in zip(TOKEN_KEYS, columns, strict=True)}
    rows = [dict(zip(TOKEN_KEYS, r, strict=True)) for r in
            zip(*(_row_sums(col, starts).tolist() for col in columns), strict=True)] if per_row else None
    return input_ids, labels, counts, rows


def _row_sums(column, offsets):
    """The sum of `column` (bools) over each row's slice [offsets[i], offsets[i + 1]), 0 for an empty row.
    reduceat over the row starts: with dedup's per-row counts, a cumulative sum of every column of every batch
    was 2% of a run's CPU time (24,000 records, bundled tokenizer) and 17x slower than this, measured."""
    import numpy as np

    full = np.diff(offsets) > 0
    sums = np.zeros(len(full), dtype=np.int64)
    if full.any():
        # over the non-empty rows only: their starts increase strictly, so each slice ends where the next begins
        sums[full] = np.add.reduceat(column, offsets[:-1][full], dtype=np.int64)
    return sums


def check_stop_tokens_trained(tokenizer) -> None:
    """Fail unless the template puts both `<|return|>` and `<|call|>` inside the assistant mask (once per run:
    a template that leaves a stop token outside `{% generation %}` trains a model that never stops)."""
    input_ids, mask = encode(tokenizer, STOP_PROBE)
    trained = {tok for tok, bit in zip(input_ids, mask, strict=True) if bit}
    missing = [m for m, tid in zip(STOP_MARKERS, stop_token_ids(tokenizer), strict=True) if tid not in trained]
    if missing:
        raise FatalError(f"the chat template does not train {', '.join(missing)}: the assistant mask must cover "
                         "each assistant turn through its stop token, or the model never learns to stop")
