"""What an evaluation generates: records read and converted lazily, and their assistant turns as prompts."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from beam_sft.errors import BeamSFTError, Reason, RecordError, UsageError

TURN_CHOICES = ("first", "last", "all")
DEFAULT_EFFORT = "default"


def read_held_out(path: str | Sequence[str], fmt: str = "auto", split: str = "test",
                  max_records: int | None = None) -> Iterator[tuple[dict | None, dict | None, str]]:
    """`(record, None, format)` or `(None, reject, format)` for each row of `path`, converted lazily."""
    from beam_sft.records.files import parse_line, read_items
    from beam_sft.validate.convert import convert_item, detect
    from beam_sft.validate.rules import Options

    # A reference turn needs no reasoning to be scored; under the training default (`mask`) a held-out
    # tool-calling record without reasoning would be rejected as nothing_to_train.
    options = Options(missing_reasoning="keep")
    specs = [path] if isinstance(path, str) else list(path)
    for item in read_items(specs, split, limit=max_records):
        source_format = fmt
        if fmt == "auto" and item.error is None:
            try:
                source_format = detect(parse_line(item.json())) or "unknown"
            except (RecordError, TypeError):  # unparsable, or nested deeper than orjson writes
                source_format = "unknown"
        record, _, reject = convert_item(item, fmt, options)
        yield record, reject, source_format


# A JSON array, CSV or text file is parsed once more just to count its records only below this size.
COUNT_PARSED_BELOW = 64 << 20


def held_out_total(path: str | Sequence, split: str = "test", max_records: int | None = None) -> int | None:
    """How many rows a reader of `data_sources(path)` yields when cheap to know, else None/max_records."""
    from beam_sft.records.files import data_sources, iter_items

    try:
        sources = data_sources([path] if isinstance(path, str) else list(path), split)
    except (BeamSFTError, OSError):  # read_held_out says what is wrong with the input
        return max_records
    total = 0
    for src in sources:
        if src.kind == "parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(src.name).metadata.num_rows
        elif src.kind == "jsonl" or (src.kind in ("json", "csv", "text")
                                     and os.path.getsize(src.name) < COUNT_PARSED_BELOW):
            total += sum(1 for _ in iter_items([src]))
        else:
            return max_records
        if max_records is not None and total >= max_records:
            return max_records
    return total


@dataclass
class Turn:
    """One assistant turn to generate: the prompt is the conversation before it."""

    record: int  # 0-based position of the record among the records evaluated
    message_index: int  # index of the reference assistant message in the record
    reference: dict[str, Any]
    tools: list[dict] | None
    format: str
    effort: str
    prompt: str = ""
    # for backends that send conversations to a server instead of prompts (beam_sft.eval.openai_backend)
    messages: list[dict] = field(default_factory=list)
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def expects_call(self) -> bool:
        return bool(self.reference.get("tool_calls"))


def assistant_indices(record: dict[str, Any], turns: str = "first") -> list[int]:
    """Indices of the assistant messages to evaluate. A message at index 0 has no prompt and is skipped."""
    if turns not in TURN_CHOICES:
        raise UsageError(f"--turns must be one of {', '.join(TURN_CHOICES)}, not {turns!r}")
    found = [i for i, m in enumerate(record.get("messages") or []) if m.get("role") == "assistant" and i > 0]
    if turns == "all" or not found:
        return found
    return [found[0]] if turns == "first" else [found[-1]]


def effort_label(record: dict[str, Any]) -> str:
    effort = (record.get("chat_template_kwargs") or {}).get("reasoning_effort")
    return DEFAULT_EFFORT if effort is None else str(effort)


def record_turns(tokenizer, record: dict[str, Any], index: int, source_format: str, turns: str) -> list[Turn]:
    """The record's chosen turns with their rendered prompts; RecordError(render_failed) if it cannot."""
    tools = record.get("tools") or None
    kwargs = record.get("chat_template_kwargs") or {}
    out = []
    for i in assistant_indices(record, turns):
        try:
            prompt = tokenizer.apply_chat_template(record["messages"][:i], tools=tools, tokenize=False,
                                                   add_generation_prompt=True, **kwargs)
        except Exception as err:  # noqa: BLE001  (a template error on one record rejects that record only)
            raise RecordError(Reason.RENDER_FAILED, f"chat template failed on the prompt: {err}",
                              message_index=i) from None
        out.append(Turn(index, i, record["messages"][i], tools, source_format, effort_label(record), prompt,
                        record["messages"][:i], kwargs))
    return out
