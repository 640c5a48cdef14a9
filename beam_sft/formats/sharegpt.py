"""ShareGPT conversations (``{"from", "value"}`` or ``{"role", "content"}`` turns) → Beam messages; a call
turn is an assistant message of its own, which `beam_sft.validate.rules` merges (docs/formats.md)."""

from __future__ import annotations

from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import finish, message_reasoning, record_object
from beam_sft.formats.toolmarkup import json_calls, result_wrapper
from beam_sft.records.messages import normalize_tools, openai_tool_calls, split_think, text_of, tool_content
from beam_sft.records.types import BeamRecord, Message, json_type

USER_ROLES = frozenset(("human", "user", "prompter", "usr"))
ASSISTANT_ROLES = frozenset(("gpt", "assistant", "model", "chatgpt", "bing", "bard", "claude", "bot", "ai"))
CALL_ROLES = frozenset(("function_call", "tool_call", "tool_calls"))
RESULT_ROLES = frozenset(("observation", "tool", "function_response", "tool_response", "function", "ipython"))


def convert(rec: Any) -> BeamRecord:
    """One ShareGPT record → a Beam record (not yet validated)."""
    rec = record_object(rec, "conversations")
    if (conv := rec.get("conversations")) is None:
        conv = rec.get("messages")
    if conv is None:
        raise RecordError(Reason.UNKNOWN_FORMAT, "no 'conversations' list")
    if not isinstance(conv, list):
        raise RecordError(Reason.BAD_CONTENT, f"conversations is {json_type(conv)}, not a list")
    out: list[Message] = []
    if system := rec.get("system"):
        if not isinstance(system, str):
            raise RecordError(Reason.BAD_CONTENT, "record-level 'system' is not a string")
        out.append({"role": "system", "content": system})
    no_text: list[int] = []  # the turns with neither 'value' nor 'content': rules.py rejects them by policy
    for i, m in enumerate(conv):
        if not isinstance(m, dict):
            raise RecordError(Reason.BAD_CONTENT, f"turn is {json_type(m)}, not an object", message_index=i)
        role = m.get("from", m.get("role"))
        value = m["value"] if "value" in m else m.get("content")
        if not isinstance(role, str):
            raise RecordError(Reason.UNKNOWN_ROLE, f"turn has no role ({role!r})", message_index=i)
        role = role.lower()
        if value is None and role not in CALL_ROLES:
            no_text.append(i)
        if role in USER_ROLES:
            out.append({"role": "user", "content": text_of(value, message_index=i)})
        elif role in ASSISTANT_ROLES:
            text = text_of(value, message_index=i)
            reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
            if reasoning is not None and type(reasoning) is not str:
                reasoning = message_reasoning(m, i)  # text parts are fine, other types are bad_content
            if "function" in text and (calls := json_calls(text, i)):  # data-genie: a JSON list of calls
                out.append({"role": "assistant", "reasoning_content": reasoning or "", "content": "",
                            "tool_calls": calls})
                continue
            if not reasoning:
                reasoning, text = split_think(text, message_index=i)
            out.append({"role": "assistant", "reasoning_content": reasoning or "", "content": text})
        elif role in CALL_ROLES:
            if not (calls := openai_tool_calls(value, "function_call value", message_index=i)):
                raise RecordError(Reason.BAD_CONTENT, "function_call turn with no call", message_index=i)
            out.append({"role": "assistant", "reasoning_content": "", "content": "", "tool_calls": calls})
        elif role in RESULT_ROLES:
            msg: Message = {"role": "tool", "content": tool_content(value, message_index=i)}
            if isinstance(m.get("name"), str) and m["name"]:
                msg["name"] = m["name"]
            wrapped = result_wrapper(msg["content"]) if type(value) is str else None
            if wrapped:  # data-genie: the turn is an OpenAI tool message as JSON text
                msg["content"], name, call_id = wrapped
                if name:
                    msg["name"] = name
                if call_id:
                    msg["tool_call_id"] = call_id
            out.append(msg)
        elif role in ("system", "developer"):
            out.append({"role": role, "content": text_of(value, message_index=i)})
        else:
            raise RecordError(Reason.UNKNOWN_ROLE, f"unknown role {role!r}", message_index=i)
    src = [None, *range(len(conv))] if system else None
    # errors name turns of `conversations`, which a record-level system prompt is not part of
    return finish(rec, out, normalize_tools(rec.get("tools")), src, no_text)
