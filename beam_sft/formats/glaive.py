"""glaive-function-calling-v2 rows (a ``system`` string with the functions as JSON, a ``chat`` string of
``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` turns, ``<functioncall>`` calls) → Beam records."""

from __future__ import annotations

import json
import re
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import record_object
from beam_sft.formats.toolmarkup import call_from_value, loads_lenient, strip_tool_prompt
from beam_sft.records.messages import normalize_tools, record
from beam_sft.records.types import BeamRecord, Message, ToolCall, wrong_type

_ROLE = re.compile(r"(?:^|\n)[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE|SYSTEM):[ \t]?")
_EOT = "<|endoftext|>"
_SPACE = re.compile(r"\s*")
_PLAIN_ROLES = {"USER": "user", "SYSTEM": "system", "FUNCTION RESPONSE": "tool"}  # turns kept as text
# glaive's '<json>' arguments, when an apostrophe inside breaks the Python literal: docs/formats.md.
_CALL_FALLBACK = re.compile(r"""^\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*'(.*)'\s*\}$""", re.DOTALL)


def _functions(system: str) -> tuple[list, str]:
    """The JSON objects in the system text, and the text around them."""
    start = system.find("{")
    if start < 0:
        return [], system
    text, tail = system[:start], system[start:]
    decoder = json.JSONDecoder()
    funcs, pos = [], 0
    while (pos := _SPACE.match(tail, pos).end()) < len(tail):
        if tail[pos] != "{":
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"text after the functions in the system prompt: "
                              f"{tail[pos:pos + 60]!r}")
        try:
            value, pos = decoder.raw_decode(tail, pos)
        except (ValueError, RecursionError) as err:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"a function in the system prompt is not JSON "
                              f"({type(err).__name__}: {str(err)[:80]})") from None
        funcs.append(value)
    return funcs, text


def _call(body: str, i: int) -> ToolCall:
    body = body.strip()
    try:
        value = loads_lenient(body)
    except ValueError as err:
        if not (m := _CALL_FALLBACK.match(body)):
            raise RecordError(Reason.BAD_TOOL_CALL, f"<functioncall> body is {err}: {body[:80]!r}",
                              message_index=i) from None
        value = {"name": m.group(1), "arguments": m.group(2)}
    return call_from_value(value, body, i, "<functioncall>")


def convert(rec: Any) -> BeamRecord:
    """One glaive-function-calling-v2 row → a Beam record (not yet validated)."""
    rec = record_object(rec)
    chat, system = rec.get("chat"), rec.get("system")
    if type(chat) is not str:
        raise wrong_type(Reason.BAD_CONTENT if "chat" in rec else Reason.UNKNOWN_FORMAT, "'chat'", chat, "a string")
    if system is not None and type(system) is not str:
        raise wrong_type(Reason.BAD_CONTENT, "'system'", system, "a string")
    funcs, instructions = _functions((system or "").strip().removeprefix("SYSTEM:"))
    stripped: dict = {"tool_list": 1} if funcs else {}
    instructions = strip_tool_prompt(instructions, stripped).strip()
    messages: list[Message] = [{"role": "system", "content": instructions}] if instructions else []
    parts = _ROLE.split(chat.replace(_EOT, ""))
    if parts[0].strip():
        raise RecordError(Reason.BAD_CONTENT, f"text before the first role marker: {parts[0][:60]!r}")
    for k in range(1, len(parts), 2):
        role, text = parts[k], parts[k + 1].strip()
        if role in _PLAIN_ROLES:
            messages.append({"role": _PLAIN_ROLES[role], "content": text})
        elif (at := text.find("<functioncall>")) < 0:
            messages.append({"role": "assistant", "reasoning_content": "", "content": text})
        else:
            messages.append({"role": "assistant", "reasoning_content": text[:at].strip(), "content": "",
                             "tool_calls": [_call(text[at + len("<functioncall>"):], k // 2)]})
    beam = record(messages, normalize_tools(funcs) if funcs else None)
    if instructions:  # message indexes in errors count the turns of `chat`
        beam["_src"] = [None, *range(len(messages) - 1)]
    if stripped:
        beam["_stripped"] = stripped  # counted by beam_sft.validate.rules as stripped_tool_prompt
    return beam
