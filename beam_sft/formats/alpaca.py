"""Alpaca-style instruction rows (``{"instruction", "input", "output", "system"?, "history"?}``) → Beam
records; the mapping: docs/formats.md#alpaca-and-trl-promptcompletion-records."""

from __future__ import annotations

from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import finish, record_object
from beam_sft.records.messages import split_think
from beam_sft.records.types import BeamRecord, Message, json_type, wrong_type


def _text(rec: dict, key: str, required: bool = False) -> str:
    if (value := rec.get(key)) is None:
        if required:
            raise RecordError(Reason.UNKNOWN_FORMAT, f"an Alpaca row needs {key!r} (keys: "
                              f"{', '.join(sorted(rec)[:8])})", keys=sorted(rec)[:8])
        return ""
    if type(value) is not str:
        raise wrong_type(Reason.BAD_CONTENT, f"{key!r}", value, "a string")
    return value


def _answer(text: str, where: str, i: int | None = None) -> Message:
    """An assistant turn of `text`; a leading <think> block becomes its reasoning."""
    reasoning, text = split_think(text, message_index=i)
    if not text.strip():
        raise RecordError(Reason.EMPTY_COMPLETION, f"{where} is empty: no answer to train", message_index=i)
    return {"role": "assistant", "reasoning_content": reasoning or "", "content": text}


def _history(history: Any) -> list[Message]:
    """LLaMA-Factory's ``history``: [[instruction, answer], ...], the turns before the row's own."""
    if type(history) is not list:
        raise wrong_type(Reason.BAD_CONTENT, "'history'", history, "a list of [instruction, answer] pairs")
    out: list[Message] = []
    for k, pair in enumerate(history):
        if type(pair) is not list or len(pair) != 2 or not all(type(t) is str for t in pair):
            raise RecordError(Reason.BAD_CONTENT, f"history[{k}] is {json_type(pair)} ({pair!r:.60}), not an "
                              "[instruction, answer] pair of strings")
        out.append({"role": "user", "content": pair[0]})
        out.append(_answer(pair[1], f"the answer of history[{k}]"))
    return out


def convert(rec: Any) -> BeamRecord:
    """One Alpaca row → a Beam record (not yet validated)."""
    rec = record_object(rec)
    instruction = _text(rec, "instruction", required=True)
    if "output" not in rec:
        _text(rec, "output", required=True)
    if type(rec["output"]) is list:  # LLaMA-Factory's ranking rows: [chosen, rejected]
        raise RecordError(Reason.UNKNOWN_FORMAT, "'output' is a list (a preference pair: chosen, rejected), not "
                          "one answer")
    prompt = "\n".join(t for t in (instruction, _text(rec, "input")) if t)
    if not prompt.strip():
        raise RecordError(Reason.BAD_CONTENT, "'instruction' and 'input' are empty: no prompt for the output")
    messages: list[Message] = []
    if system := _text(rec, "system"):
        messages.append({"role": "system", "content": system})
    if rec.get("history") is not None:
        messages += _history(rec["history"])
    messages.append({"role": "user", "content": prompt})
    messages.append(_answer(_text(rec, "output"), "'output'"))
    return finish(rec, messages, None, None)
