"""Dataset converters: raw records in OpenAI, ShareGPT, gpt-oss Harmony, Hermes/Qwen-tag, glaive-v2 or xLAM
shape → Beam records.

Each converter is a pure function ``record -> beam record`` that raises `RecordError` (with a reason code
and the offending message index) for a record it cannot convert. They sit in `FORMATS`, keyed by name;
`convert_record` runs one (or detects which) and then `beam_sft.validate.rules.validate`, so what it returns is a
checked Beam record::

    from beam_sft.formats import convert_record, FORMATS, detect
    beam = convert_record({"messages": [...]}, format="openai")

    # with datasets: `to_row` gives every row the same keys, and `beam_features()` stores arguments,
    # tools and template kwargs as Json, so heterogeneous records don't become null-padded structs.
    # A bad record raises RecordError; filter first with `try_convert` to skip rejects instead.
    from beam_sft.records.files import beam_features
    ds = ds.map(lambda r: to_row(convert_record(r, "sharegpt")), remove_columns=ds.column_names,
                features=beam_features())

`beam-sft convert` / `convert-dataset` is a thin shell over these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats import glaive, harmony, hermes, openai, sharegpt, xlam

Converter = Callable[[Any], dict]

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


def convert_raw(rec: Any, format: str = "auto") -> tuple[dict, str]:
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


def convert_record(rec: Any, format: str = "auto", options: Any = None) -> dict:
    """One raw record → a validated Beam record, or `RecordError`. `options` is a `validate.Options`."""
    from beam_sft.validate.rules import validate

    if format == "openai" or format == "auto":
        # The fast path accepts only plain OpenAI rows (no key or field of another format), so under `auto`
        # it can run before detection, which would cost it a tenth of its time.
        fast = openai.fast_convert(rec, options)
        if fast is not None:
            return fast
    beam, _ = convert_raw(rec, format)
    return validate(beam, options)


def try_convert(rec: Any, format: str = "auto", options: Any = None) -> tuple[dict | None, RecordError | None]:
    """Like `convert_record`, but returns ``(record, None)`` or ``(None, error)`` instead of raising."""
    try:
        return convert_record(rec, format, options), None
    except RecordError as err:
        return None, err


def to_row(beam: dict) -> dict:
    """A Beam record with all three columns present (for `datasets.map` with `beam_sft.records.files.beam_features()`)."""
    return {"messages": beam["messages"], "tools": beam.get("tools"),
            "chat_template_kwargs": beam.get("chat_template_kwargs") or {}}


__all__ = ["FORMATS", "FORMAT_NAMES", "convert_raw", "convert_record", "detect", "to_row", "try_convert"]
