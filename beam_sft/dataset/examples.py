"""The per-record rules of training data: Beam records in, `input_ids` + `labels` out, with counts.

`scripts/train.py` runs them through `beam_sft.dataset.phase` (Arrow, chunked, cached, once per job). `read_rows`,
`to_beam_records` and `prepare_dataset` are the in-memory path over Python lists: for small data, tests,
and the benchmark's "today's path" baseline; they hold everything in memory, so don't feed them a real set.

The trainer gets a pre-tokenized dataset (`input_ids`, `labels`), so TRL skips its own chat-template pass
and everything that decides what is trained happens here, where it can be tested:

* masks come from the chat template's `{% generation %}` block (`beam_sft.render.encoder.encode_record` when that
  module is present, else `tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)`; the two
  are identical by contract), with the record's own `tools` and `chat_template_kwargs`;
* a record whose mask is empty is a hard error naming the record: it would silently train nothing;
* records longer than `max_length` follow a `TRUNCATION_POLICIES` policy, and every cut is counted;
* `PrepStats` holds total and supervised token counts for the run's log.

Truncation policies (records that fit are never touched):

    turn        cut back to the end of the last assistant turn that fits, so no assistant turn is trained
                half-way (a cut turn teaches output with no stop token); a record whose first assistant
                turn does not fit is dropped. The default.
    drop        drop every record longer than `max_length`.
    keep_start  keep the first `max_length` tokens, cutting wherever that falls (TRL's own behaviour);
                records whose cut lands inside an assistant turn are counted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError, Reason, RecordError, UsageError
from beam_sft.records.files import Item

logger = logging.getLogger(__name__)

TRUNCATION_POLICIES = ("turn", "drop", "keep_start")
STOP_MARKERS = ("<|return|>", "<|call|>")
IGNORE_INDEX = -100

# A conversation that exercises both ways an assistant turn ends: a tool call (<|call|>) and an answer
# (<|return|>). Used once per run to check that the template trains both stop tokens.
STOP_PROBE: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "18 C in Paris."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
}


@dataclass
class PrepStats:
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
        return (
            f"{name}: {self.records_kept}/{self.records_in} records kept, {self.total_tokens} tokens, "
            f"{self.supervised_tokens} supervised ({share:.1f}%), trained stop tokens: "
            f"{self.supervised_return} <|return|>, {self.supervised_call} <|call|>; truncation: "
            f"{self.truncated} records cut, {self.dropped_too_long} dropped, "
            f"{self.assistant_turns_cut} assistant turns lost or cut"
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


# --------------------------------------------------------------------------------------------------------
# Records


def normalize_record(record: dict[str, Any]) -> dict[str, Any]:
    """Undo what Arrow storage does to a Beam record, so the template sees the in-memory shape.

    Parquet / `datasets` storage may keep `tools`, `chat_template_kwargs` and tool-call `arguments` as JSON
    strings (heterogeneous keys do not survive struct inference) and fills absent struct fields with None.
    """
    out = dict(record)
    for key in ("tools", "chat_template_kwargs"):
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = json.loads(value) if value else None
            except json.JSONDecodeError as err:
                code = Reason.BAD_TOOL_SCHEMA if key == "tools" else Reason.BAD_CONTENT
                raise RecordError(code, f"{key} is a string but not valid JSON: {err}") from None
        if out.get(key) is None:
            out.pop(key, None)
    messages = []
    for message in out.get("messages") or []:
        message = {k: v for k, v in message.items() if v is not None}
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call = {k: v for k, v in call.items() if v is not None}
                function = dict(call.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except json.JSONDecodeError as err:
                        raise RecordError(
                            Reason.BAD_ARGUMENTS_JSON,
                            f"tool call arguments are not valid JSON: {err}",
                            message_index=len(messages),
                        ) from None
                call["function"] = function
                calls.append(call)
            message["tool_calls"] = calls
        messages.append(message)
    out["messages"] = messages
    return out


def convert_row(row: Any, input_format: str = "auto", missing_reasoning: str = "mask") -> dict[str, Any]:
    """One parsed row -> a validated Beam record in its in-memory shape, or `RecordError`.

    `input_format="beam"`: the row is a Beam record (Arrow artefacts undone, then validated); any other value
    is a converter name or "auto" (`beam_sft.formats.convert_record`). `missing_reasoning`: the policy of
`beam_sft.validate.rules.Options` (mask | keep | reject). The one per-record conversion of
    training data: the data phase (`beam_sft.dataset.phase`) and `to_beam_records` both call it.
    """
    from beam_sft.formats import convert_record
    from beam_sft.validate.rules import Options, validate

    options = Options(missing_reasoning=missing_reasoning) if missing_reasoning != "mask" else None
    if input_format == "beam":
        if not isinstance(row, dict):
            raise RecordError(Reason.NOT_AN_OBJECT, "not a Beam record (an object with 'messages')")
        return validate(normalize_record(row), options)
    return normalize_record(convert_record(row, format=input_format, options=options))


def read_rows(source: str, split: str = "train") -> list[Item]:
    """Read raw rows with their provenance through the readers `convert-dataset` uses (`beam_sft.records.files`).

    `source`: a .jsonl / .json / .parquet file, a glob, a directory of them, a `save_to_disk` dataset, or a hub
    id (only from the local cache when HF_HUB_OFFLINE=1). Each item keeps its file and 1-based line (JSONL) or
    0-based index; an unreadable row (malformed JSON, invalid UTF-8) is an item carrying its `RecordError`,
    which `to_beam_records` counts as a reject instead of stopping the run.
    """
    from beam_sft.records.files import expand_inputs, iter_items

    sources = expand_inputs([source], split)
    if Path(source).is_dir():
        # convert-dataset writes a rejects file next to its output; it is not training data.
        sources = [s for s in sources if "rejects" not in Path(s.name).name]
        if not sources:
            raise UsageError(f"{source}: no training data in this directory (only rejects files)")
    return list(iter_items(sources))


def to_beam_records(
    items: Iterable[Item], input_format: str = "auto"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn rows read by `read_rows` into validated Beam records with the project's converters.

    `input_format="beam"`: rows are Beam records (what `convert-dataset` writes); Arrow artefacts are undone
    and `beam_sft.validate.rules` checks them. Any other value goes through `beam_sft.formats.convert_record`
    ("auto" detects the format per row; a Beam record reads as OpenAI-shaped and passes unchanged).
    Returns (records, rejects); each reject is a `RecordError.to_dict()` with the row's source and its line
    (JSONL) or index: records + rejects = rows, nothing is lost silently.
    """
    from beam_sft.records.files import parse_line

    records: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    for item in items:
        try:
            if item.error is not None:
                raise item.error
            records.append(convert_row(parse_line(item.payload) if item.raw else item.payload, input_format))
        except RecordError as err:
            entry = err.with_provenance(item.source, item.position).to_dict()
            if not item.by_line:
                entry["index"] = entry.pop("line")
            rejects.append(entry)
    return records, rejects


# --------------------------------------------------------------------------------------------------------
# Tokenization and truncation


def encode_many(tokenizer, records: Sequence[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, assistant_masks) of Beam records, as the chat template renders them.

    Uses `beam_sft.render.encoder`'s batched encoder when present (identical to apply_chat_template by contract,
    and much faster), else `apply_chat_template(..., return_assistant_tokens_mask=True)` per record.
    """
    try:
        from beam_sft.render.encoder import get_encoder
    except ImportError:
        get_encoder = None
    if get_encoder is not None:
        outs = get_encoder(tokenizer).encode(list(records), None)
    else:
        outs = [
            tokenizer.apply_chat_template(
                record["messages"],
                tools=record.get("tools"),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **(record.get("chat_template_kwargs") or {}),
            )
            for record in records
        ]
    return [(list(out["input_ids"]), list(out["assistant_masks"])) for out in outs]


def encode(tokenizer, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_masks) of one Beam record."""
    return encode_many(tokenizer, [record])[0]


def assistant_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) spans of consecutive 1s in `mask`: one per assistant turn."""
    spans, start = [], None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def truncate(
    input_ids: list[int], mask: list[int], max_length: int | None, policy: str
) -> tuple[list[int], list[int], dict[str, int]] | None:
    """Apply `policy` to one tokenized record. Returns (ids, mask, counts) or None when the record is dropped.

    counts: {"truncated": 0|1, "assistant_turns_cut": n} where n counts assistant turns that lost tokens.
    """
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


def build_example(
    tokenizer,
    record: dict[str, Any],
    *,
    max_length: int | None,
    policy: str = "turn",
    assistant_only_loss: bool = True,
    stop_ids: Sequence[int] = (),
    where: str = "record",
    encoded: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """One training row: `input_ids`, `labels` (IGNORE_INDEX off the mask) and per-record counts.

    `keep` is False when the truncation policy drops the record. Raises EmptyMaskError on an empty mask,
    before truncation: that is a template or data defect, not a length problem.
    """
    input_ids, mask = encoded if encoded is not None else encode(tokenizer, record)
    if not any(mask):
        raise EmptyMaskError(
            f"{where}: the chat template produced an empty assistant mask ({len(input_ids)} tokens, no "
            "supervised token). Check that the record has an assistant message and that the template wraps "
            "assistant output in {% generation %}...{% endgeneration %}"
        )
    result = truncate(input_ids, mask, max_length, policy)
    if result is None:
        spans = assistant_spans(mask)
        return {
            "input_ids": [],
            "labels": [],
            "keep": False,
            "truncated": 0,
            "dropped": 1,
            "assistant_turns_cut": len(spans),
            "n_supervised_return": 0,
            "n_supervised_call": 0,
        }
    input_ids, mask, counts = result
    if assistant_only_loss:
        labels = [tok if bit else IGNORE_INDEX for tok, bit in zip(input_ids, mask, strict=True)]
    else:
        labels = list(input_ids)
    supervised_stops = [tok for tok, lab in zip(input_ids, labels, strict=True) if lab != IGNORE_INDEX]
    return {
        "input_ids": input_ids,
        "labels": labels,
        "keep": True,
        "dropped": 0,
        **counts,
        "n_supervised_return": supervised_stops.count(stop_ids[0]) if stop_ids else 0,
        "n_supervised_call": supervised_stops.count(stop_ids[1]) if len(stop_ids) > 1 else 0,
    }


def stop_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of `<|return|>` and `<|call|>`; each must be a single token."""
    ids = []
    for marker in STOP_MARKERS:
        encoded = tokenizer.encode(marker, add_special_tokens=False)
        if len(encoded) != 1:
            raise FatalError(
                f"{marker} encodes to {len(encoded)} tokens with this tokenizer; Beam markers must be single "
                "tokens (run beamify on it, or use --beamify)"
            )
        ids.append(encoded[0])
    return ids[0], ids[1]


def check_stop_tokens_trained(tokenizer) -> None:
    """Fail unless the template puts both `<|return|>` and `<|call|>` inside the assistant mask.

    Run once per training run: a template that leaves the stop token outside `{% generation %}` trains a
    model that never stops, and the loss curve does not show it.
    """
    input_ids, mask = encode(tokenizer, STOP_PROBE)
    trained = {tok for tok, bit in zip(input_ids, mask, strict=True) if bit}
    missing = [m for m, tid in zip(STOP_MARKERS, stop_token_ids(tokenizer), strict=True) if tid not in trained]
    if missing:
        raise FatalError(
            f"the chat template does not train {', '.join(missing)}: the assistant mask must cover each "
            "assistant turn through its stop token, or the model never learns to stop"
        )


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
