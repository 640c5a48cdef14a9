"""OpenAI chat messages (also legacy ``functions``/``function_call``, LLaMA-Factory v1 parts, data-genie JSON calls)
→ Beam messages; pairing and merging happen in `beam_sft.validate.rules` (docs/formats.md)."""

from __future__ import annotations

from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.toolmarkup import json_calls, lift, scan
from beam_sft.records.messages import (
    normalize_tools,
    openai_tool_call,
    openai_tool_calls,
    record,
    split_think,
    text_of,
    tool_call,
    tool_content,
)
from beam_sft.records.types import BeamRecord, Message, ToolCall, ToolSpec, json_type, wrong_type

_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
_MEDIA_KEYS = ("images", "videos", "audios")
_V1_ASSISTANT_PARTS = ("reasoning", "tool_call", "tool_calls")
# Record keys that need a closer look before converting (one set intersection in the common case).
_SPECIAL_KEYS = frozenset(("chosen", "rejected", "chosen_messages", "rejected_messages", "label", *_MEDIA_KEYS))


def record_object(rec: Any, key: str | None = None) -> dict:
    """The record as an object (a bare list: the messages under `key`); record-level shapes no format converts
    (preference data, undesirable KTO rows, multimodal rows) raise."""
    if key is not None and isinstance(rec, list):
        rec = {key: rec}
    if not isinstance(rec, dict):
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is {json_type(rec)}, not an object")
    if _SPECIAL_KEYS.isdisjoint(rec):
        return rec
    if "chosen" in rec or "rejected" in rec or "chosen_messages" in rec or "rejected_messages" in rec:
        raise RecordError(Reason.UNKNOWN_FORMAT, "preference record (chosen/rejected): not a single conversation")
    if rec.get("label") is False:
        raise RecordError(Reason.UNKNOWN_FORMAT, "KTO record labelled undesirable (label=false): its answer "
                          "must not be trained on")
    for media in _MEDIA_KEYS:
        if rec.get(media):
            raise RecordError(Reason.UNSUPPORTED_CONTENT_PART, f"record has {media}; Beam is text only")
    return rec


def record_kwargs(rec: dict) -> dict | None:
    """The record's template kwargs (an object or its JSON), plus a record-level ``reasoning_effort``."""
    kwargs = rec.get("chat_template_kwargs")
    if type(kwargs) is str and kwargs.strip():
        try:
            kwargs = orjson.loads(kwargs)
        except orjson.JSONDecodeError:
            raise RecordError(Reason.BAD_TEMPLATE_KWARGS, "chat_template_kwargs is not a JSON object") from None
    if kwargs and not isinstance(kwargs, dict):
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, "chat_template_kwargs is not an object")
    if (effort := rec.get("reasoning_effort")) is not None:
        kwargs = {**(kwargs or {}), "reasoning_effort": effort}
    return kwargs or None


def message_reasoning(m: dict, i: int) -> str | None:
    """The first non-empty reasoning field of input message `m` (number `i`) as text, or None."""
    for key in _REASONING_KEYS:
        value = m.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            value = text_of(value, message_index=i, what=key)
        if value:
            return value
    return None


def _v1_assistant_parts(parts: list, i: int) -> tuple[str | None, str, list[ToolCall]]:
    """LLaMA-Factory v1 assistant parts: reasoning, text, tool_call, tool_calls."""
    reasoning, texts, calls = [], [], []
    for k, part in enumerate(parts):
        if not isinstance(part, dict):
            raise RecordError(Reason.BAD_CONTENT, f"content part {k} is not an object", message_index=i)
        ptype = part.get("type", "text")
        value = part.get("value", part.get("text"))
        if ptype == "reasoning":
            reasoning.append(text_of(value, message_index=i))
        elif ptype in ("tool_call", "tool_calls"):
            calls.extend(openai_tool_calls(value, f"content part {k} ({ptype})", message_index=i))
        else:
            texts.append(part)
    return ("\n\n".join(r for r in reasoning if r) or None), text_of(texts, message_index=i), calls


def _has_part(content: Any, types: tuple[str, ...]) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in types for p in content)


def _split_result_list(text: str, pending: int) -> list[str] | None:
    """A v1 tool message holding a JSON list with one result per parallel call → the results, in order."""
    if pending < 2 or not text.startswith("["):
        return None
    try:
        items = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list) or len(items) != pending:
        return None
    out = []
    for item in items:
        if isinstance(item, dict) and "content" in item and ("tool_call_id" in item or "name" in item):
            item = item["content"]
        try:
            out.append(item if isinstance(item, str) else orjson.dumps(item).decode())
        except orjson.JSONEncodeError:
            return None  # too deep to write back as JSON text: keep the message as one result
    return out


def _assistant_message(m: dict, content: Any, i: int) -> Message:
    """One OpenAI assistant message → a Beam assistant message (reasoning and calls from every shape)."""
    calls: list[ToolCall] = []
    if type(content) is str:
        text = content
    elif _has_part(content, _V1_ASSISTANT_PARTS):
        reasoning, text, calls = _v1_assistant_parts(content, i)
        if reasoning:
            m = {**m, "reasoning_content": message_reasoning(m, i) or reasoning}
    else:
        text = text_of(content, message_index=i)
    reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
    if reasoning is not None and type(reasoning) is not str:
        reasoning = message_reasoning(m, i)
    if not reasoning and text and "<" in text:
        reasoning, text = split_think(text, message_index=i)
    if raw_calls := m.get("tool_calls"):
        if type(raw_calls) is not list:
            raise RecordError(Reason.BAD_CONTENT, "tool_calls is not a list", message_index=i)
        calls += [openai_tool_call(c, message_index=i) for c in raw_calls]
    if fc := m.get("function_call"):
        if type(fc) is not dict:
            raise RecordError(Reason.BAD_CONTENT, "function_call is not an object", message_index=i)
        calls.append(tool_call(fc.get("name"), fc.get("arguments"), message_index=i))
    if not calls and text and "function" in text and (found := json_calls(text, i)):
        calls, text = found, ""  # data-genie: the text is a JSON list of OpenAI-style calls
    message: Message = {"role": "assistant", "reasoning_content": reasoning or "", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _keep_weight(m: dict, beam: Message) -> None:
    """Keep the per-message ``weight`` (axolotl: ``train``) for the validator, which checks it."""
    for key in ("weight", "train"):
        if key in m:
            beam[key] = m[key]


def convert_messages(msgs: Any, tools: list[ToolSpec] | None, no_text: list[int] | None = None
                     ) -> tuple[list[Message], list[ToolSpec] | None, list[int] | None]:
    """Messages → Beam messages, the record's tools, and (when a message became several) the map from Beam to
    input message index. `no_text` gets the index of each user, system or developer message without text."""
    if type(msgs) is not list:
        raise RecordError(Reason.BAD_CONTENT, f"messages is {json_type(msgs)}, not a list")
    out: list[Message] = []
    append = out.append
    pending = 0  # calls of the last assistant message not yet answered, for v1 result lists
    splits: dict[int, int] = {}  # input index -> extra Beam messages it became
    for i, m in enumerate(msgs):
        if type(m) is not dict:
            raise RecordError(Reason.BAD_CONTENT, f"message is {json_type(m)}, not an object", message_index=i)
        role = m.get("role")
        content = m.get("content")
        if role == "assistant":
            message = _assistant_message(m, content, i)
            _keep_weight(m, message)
            append(message)
            pending = len(message.get("tool_calls", ()))
        elif role == "user" or role == "system" or role == "developer":
            if type(content) is not str:
                if content is None and no_text is not None:
                    no_text.append(i)
                if role != "user" and _has_part(content, ("tools",)):  # LLaMA-Factory v1: tools as a part
                    for p in content:
                        if isinstance(p, dict) and p.get("type") == "tools":
                            tools = (tools or []) + (normalize_tools(p.get("value", p.get("tools"))) or [])
                    content = [p for p in content if not (isinstance(p, dict) and p.get("type") == "tools")]
                content = text_of(content, message_index=i)
            append({"role": role, "content": content})
            _keep_weight(m, out[-1])
        elif role == "tool" or role == "function":
            text = content if type(content) is str else tool_content(content, message_index=i)
            call_id = m.get("tool_call_id")
            if call_id is None and type(m.get("tool_call_ids")) is list and len(m["tool_call_ids"]) == 1:
                call_id = m["tool_call_ids"][0]
            if call_id is not None and type(call_id) is not str and type(call_id) is not int:
                raise wrong_type(Reason.BAD_CONTENT, "tool_call_id", call_id, "a string", i)
            split = _split_result_list(text, pending) if call_id is None and pending > 1 else None
            if split:
                splits[i] = len(split) - 1
            name = m.get("name")
            if name is not None and type(name) is not str:
                raise wrong_type(Reason.BAD_CONTENT, "tool result name", name, "a string", i)
            for part in split or (text,):
                msg: Message = {"role": "tool", "content": part}
                _keep_weight(m, msg)
                if name:
                    msg["name"] = name
                if call_id is not None:
                    msg["tool_call_id"] = str(call_id)
                append(msg)
            pending = 0
        else:
            raise RecordError(Reason.UNKNOWN_ROLE, f"unknown role {role!r}", message_index=i)
    src = [i for i in range(len(msgs)) for _ in range(1 + splits.get(i, 0))] if splits else None
    return out, tools, src


def convert(rec: Any) -> BeamRecord:
    """One OpenAI-style record → a Beam record (not yet validated)."""
    rec = record_object(rec, "messages")
    if (msgs := rec.get("messages")) is None:
        msgs = rec.get("history")
    if msgs is None:
        raise RecordError(Reason.UNKNOWN_FORMAT, "no 'messages' list")
    tools = normalize_tools(rec.get("tools"))
    if tools is None and rec.get("functions"):
        tools = normalize_tools(rec["functions"])
    no_text: list[int] = []
    messages, tools, src = convert_messages(msgs, tools, no_text)
    return finish(rec, messages, tools, src, no_text)


def finish(rec: dict, messages: list[Message], tools: list[ToolSpec] | None, src: list | None,
           no_text: list[int] | None = None) -> BeamRecord:
    """The unvalidated Beam record: Hermes / Qwen tags lifted into calls, results and tools, and the notes
    `validate` reads (`_src`: the source index of each message; `_no_markup`; `_format`; `_no_text`: the first
    message without text, which rules.py rejects by policy)."""
    markup, hermes = scan(messages)
    stripped: dict = {}
    if hermes:  # Hermes / Qwen tags: calls, results and tools written as text
        messages, tools, src = lift(messages, tools, src, stripped)
    beam = record(messages, tools, record_kwargs(rec))
    if src is not None:
        beam["_src"] = src
    if hermes:
        beam["_format"] = "hermes"
        if stripped:
            beam["_stripped"] = stripped  # counted by beam_sft.validate.rules as stripped_tool_prompt
    elif not markup:
        beam["_no_markup"] = True  # validate need not search again
    if no_text:
        beam["_no_text"] = no_text[0]
    return beam
