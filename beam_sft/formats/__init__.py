"""Dataset converters: raw records in OpenAI, ShareGPT, gpt-oss Harmony, Hermes/Qwen-tag, glaive-v2 or xLAM
shape → Beam records.

Each converter is a pure function ``record -> unvalidated beam record`` that raises `RecordError` (with a
reason code and the offending message index) for a record it cannot convert. They sit in `FORMATS`, keyed by
name; `convert_raw` runs one (or detects which). Converters never validate: the one conversion entry,
`beam_sft.validate.convert.convert_record`, runs a converter and then the Beam rules, and is what
`convert-dataset`, the data phase, `inspect` and `eval` call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats import glaive, harmony, hermes, openai, sharegpt, xlam
from beam_sft.records.types import BeamRecord

Converter = Callable[[Any], BeamRecord]  # raw record in any shape → unvalidated Beam record

FORMATS: dict[str, Converter] = {
    "openai": openai.convert,
    "sharegpt": sharegpt.convert,
    "harmony": harmony.convert,
    "hermes": hermes.convert,
    "glaive": glaive.convert,
    "xlam": xlam.convert,
}
FORMAT_NAMES = ("auto", *FORMATS)

_HARMONY_JSON_PART_TYPES = frozenset(("system_content", "developer_content"))


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
            if type(ptype) is str and ptype in _HARMONY_JSON_PART_TYPES:
                return True
    return False


def detect(rec: Any) -> str | None:
    """The format name of one raw record, or None when it fits none.

    * a string, or ``text`` holding Harmony markers → ``harmony``;
    * ``messages`` with Harmony fields (``channel``, ``recipient``, ``system_content`` parts) → ``harmony``;
    * ``conversations``, or ``messages`` whose turns use ``from``/``value`` → ``sharegpt``;
    * ``messages`` / ``history`` with ``role`` turns, or a bare list of such turns → ``openai``;
    * a bare list of ``from``/``value`` turns → ``sharegpt``;
    * ``chat`` (a string) → ``glaive``; ``query`` and ``answers`` → ``xlam``.

    Hermes / Qwen tags are found by the OpenAI and ShareGPT converters while they convert (a record that has
    them is reported as ``hermes`` by `convert_raw`): telling them apart here would mean searching every
    text of every record before the OpenAI fast path.
    """
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
            keys = f" (keys: {', '.join(sorted(rec)[:8])})" if isinstance(rec, dict) else ""
            raise RecordError(Reason.UNKNOWN_FORMAT, f"record fits no known format{keys}")
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


__all__ = ["FORMATS", "FORMAT_NAMES", "convert_raw", "detect", "to_row"]
