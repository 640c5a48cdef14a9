"""The one per-record conversion: a raw record (or a Beam record) → a validated Beam record, or `RecordError`. Every
reader of training data ends here. See docs/conversion.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError, internal_error, reject_entry
from beam_sft.formats import alpaca, glaive, harmony, hermes, openai, prompt_completion, sharegpt, xlam
from beam_sft.records.files import Item, normalize_record, parse_line
from beam_sft.records.types import BeamRecord
from beam_sft.validate.rules import Options, validate

Converter = Callable[[Any], BeamRecord]  # raw record in any shape → unvalidated Beam record

# Each format is named as its module in beam_sft.formats, in the order `format_shapes` lists them.
FORMATS: dict[str, Converter] = {module.__name__.rpartition(".")[2]: module.convert for module in
                                 (openai, sharegpt, harmony, hermes, glaive, xlam, prompt_completion, alpaca)}
FORMAT_NAMES = ("auto", *FORMATS)

# One line per format: the outer shape its converter reads (printed when a run reads nothing, docs/formats.md).
SHAPES: dict[str, str] = {
    "openai": '{"messages": [{"role", "content", "tool_calls"?, "reasoning_content"?}...], "tools"?}',
    "sharegpt": '{"conversations": [{"from", "value"}...], "system"?, "tools"?}',
    "harmony": '{"text": "<|start|>...<|end|>"} or {"messages": [{"role", "channel"?, "recipient"?}...]}',
    "hermes": 'openai or sharegpt turns with <tool_call>{"name", "arguments"}</tool_call> in the text',
    "glaive": '{"system": "... {function JSON}", "chat": "USER: ... ASSISTANT: <functioncall> ..."}',
    "xlam": '{"query", "tools", "answers": [{"name", "arguments"}...]}',
    "prompt_completion": '{"prompt": [{"role", "content"}...], "completion": [{"role": "assistant", ...}...], '
                         '"tools"?} or {"prompt": str, "completion": str}',
    "alpaca": '{"instruction", "input"?, "output", "system"?, "history"?: [[user, assistant]...]}',
}


def format_shapes() -> list[str]:
    """One line per format the converters read, naming its outer shape: ``name: shape``."""
    return [f"{name}: {SHAPES[name]}" for name in FORMATS]


def _looks_harmony_json(msgs: list) -> bool:
    """openai-harmony JSON: assistant/tool messages carry `channel`/`recipient`, system/developer messages
    carry `system_content`/`developer_content` parts. Looking at the first few messages is enough."""
    for m in msgs[:4]:
        if type(m) is not dict:
            return False
        if "channel" in m or "recipient" in m or "content_type" in m:
            return True
        content = m.get("content")
        if type(content) is list and content and type(content[0]) is dict:
            ptype = content[0].get("type")
            if type(ptype) is str and ptype in ("system_content", "developer_content"):
                return True
    return False


def detect(rec: Any) -> str | None:
    """The format name of one raw record by its outer shape, or None when it fits none. Hermes / Qwen tags are
    found by the OpenAI and ShareGPT converters while they convert (`convert_raw` reports ``hermes``)."""
    if isinstance(rec, str):
        return "harmony" if "<|" in rec else None
    if isinstance(rec, list):
        if rec and all(isinstance(m, dict) and "role" in m for m in rec):
            return "openai"
        return "sharegpt" if rec and all(isinstance(m, dict) and "from" in m for m in rec) else None
    if not isinstance(rec, dict):
        return None
    text = rec.get("text")
    if isinstance(text, str) and ("<|start|>" in text or "<|channel|>" in text):
        return "harmony"
    if "conversations" in rec:
        return "sharegpt"
    if "prompt" in rec and "completion" in rec and "messages" not in rec:
        return "prompt_completion"
    if "instruction" in rec and "output" in rec:  # before `history`, which Alpaca rows use for earlier turns
        return "alpaca"
    msgs = rec.get("messages")
    if msgs is None:
        msgs = rec.get("history")
    if isinstance(msgs, str) and "<|start|>" in msgs:
        return "harmony"
    if isinstance(msgs, list):
        if not msgs:
            return "openai"
        first = msgs[0]
        if isinstance(first, dict) and "from" in first and "role" not in first:
            return "sharegpt"
        if _looks_harmony_json(msgs):
            return "harmony"
        if isinstance(first, dict) and "role" in first:
            return "openai"
    if "chosen_messages" in rec or "rejected_messages" in rec:
        return "openai"  # so the converter rejects it with its preference-pair reason
    if type(rec.get("chat")) is str:
        return "glaive"
    if "query" in rec and "answers" in rec:
        return "xlam"
    return None


def convert_raw(rec: Any, format: str = "auto") -> tuple[BeamRecord, str]:
    """Run one converter (no validation) → (unvalidated Beam record, format name used)."""
    if format == "auto":
        name = detect(rec)
        if name is None:
            if isinstance(rec, dict) and isinstance(rec.get("text"), str) or isinstance(rec, str):
                raise RecordError(Reason.UNKNOWN_FORMAT, "text without Harmony markers (<|start|>, <|channel|>): "
                                  "not a rendered conversation")
            keys = sorted(rec)[:8] if isinstance(rec, dict) else None
            raise RecordError(Reason.UNKNOWN_FORMAT, "record fits no known format"
                              + (f" (keys: {', '.join(keys)})" if keys is not None else ""), keys=keys)
    else:
        name = format
    try:
        conv = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {format!r}; choose from {', '.join(FORMAT_NAMES)}") from None
    beam = conv(rec)
    if type(beam) is dict and "_format" in beam:  # the OpenAI and ShareGPT converters found Hermes tags
        name = beam.pop("_format")
    return beam, name


def to_row(beam: BeamRecord) -> dict:
    """A Beam record with all three columns present (for `datasets.map` with `beam_sft.records.files.beam_features()`)."""
    return {"messages": beam["messages"], "tools": beam.get("tools"),
            "chat_template_kwargs": beam.get("chat_template_kwargs") or {}}


# "beam": records as convert-dataset writes them (validated again); the rest are beam_sft.formats' converters.
INPUT_FORMATS = ("beam", *FORMAT_NAMES)


def convert(rec: Any, format: str = "auto", options: Options | None = None,
            counters: dict | None = None) -> tuple[BeamRecord, str]:
    """One record → (validated Beam record, name of the format it was read as), or `RecordError`."""
    if format == "beam":
        if type(rec) is not dict:
            raise RecordError(Reason.NOT_AN_OBJECT, "not a Beam record (an object with 'messages')")
        return validate(normalize_record(rec), options, counters), "beam"
    beam, name = convert_raw(rec, format)
    return validate(beam, options, counters), name


def try_convert(rec: Any, format: str = "auto", options: Options | None = None, counters: dict | None = None, *,
                raw: bool = False) -> tuple[BeamRecord | None, str | None, RecordError | None]:
    """`convert` that never raises for one record: ``(record, format, None)`` or ``(None, None, error)``.

    `raw`: `rec` is a JSONL line still to parse (`beam_sft.records.files.parse_line`). `rec` may be a
    `RecordError` already (a reader's: malformed JSON, invalid UTF-8, too large): it is returned as the error."""
    if isinstance(rec, RecordError):
        return None, None, rec
    try:
        beam, name = convert(parse_line(rec) if raw else rec, format, options, counters)
    except RecordError as err:
        return None, None, err
    except Exception as exc:  # a converter bug must cost one record, not the run
        if os.environ.get("BEAM_SFT_DEBUG"):
            raise
        return None, None, internal_error(exc)
    return beam, name, None


def convert_item(item: Item, format: str = "auto", options: Options | None = None
                 ) -> tuple[BeamRecord | None, str | None, dict | None]:
    """One `beam_sft.records.files.Item` (from `read_items`) → ``(record, format, None)``, or
    ``(None, None, reject entry)`` with the item's provenance (`beam_sft.errors.reject_entry`)."""
    if item.error is not None:
        beam, name, err = None, None, item.error
    else:
        try:
            payload, raw = item.json(), True
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: the converters reject it with a reason
            payload, raw = item.payload, False
        beam, name, err = try_convert(payload, format, options, raw=raw)
    if err is not None:
        return None, None, reject_entry(err, item.source, item.position, item.by_line)
    return beam, name, None

