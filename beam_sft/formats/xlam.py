"""Salesforce xLAM / APIGen rows (``{"query", "tools", "answers"}``, or an API-Bank message list as the query)
→ Beam records, parameter maps as JSON Schema (`beam_sft.records.schema_types`; docs/formats.md)."""

from __future__ import annotations

from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import record_object
from beam_sft.formats.toolmarkup import loads_lenient
from beam_sft.records.messages import openai_tool_call, record, text_of, tool_content
from beam_sft.records.schema_types import parameters_schema
from beam_sft.records.types import BeamRecord, Message, ToolCall, ToolSpec, json_type, wrong_type

_SUFFIX = "Generate API Request:"


def _json_field(rec: dict, key: str) -> Any:
    value = rec.get(key)
    if type(value) is str:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as err:
            code = Reason.BAD_TOOL_SCHEMA if key == "tools" else Reason.BAD_TOOL_CALL
            raise RecordError(code, f"{key} is a string but not JSON ({err})") from None
    return value


def _tools(raw: Any) -> list[ToolSpec] | None:
    if raw is None:
        return None
    if type(raw) is dict:
        raw = [raw]
    if type(raw) is not list:
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools is {json_type(raw)}, not a list")
    out = []
    for k, tool in enumerate(raw):
        if type(tool) is not dict:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{k}] is {json_type(tool)}, not an object")
        fn = tool["function"] if tool.get("type") == "function" and type(tool.get("function")) is dict else tool
        name = fn.get("name")
        if type(name) is not str or not name:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{k}] has no function name")
        entry: dict = {"name": name}
        if (desc := fn.get("description")) is not None:
            if type(desc) is not str:
                raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{k}] ({name}): description is not a string")
            entry["description"] = desc
        entry["parameters"] = parameters_schema(fn.get("parameters"), name, k)
        out.append({"type": "function", "function": entry})
    return out or None


def _calls(value: Any, i: int | None, what: str) -> list[ToolCall]:
    if type(value) is dict:
        value = [value]
    if type(value) is not list:
        raise wrong_type(Reason.BAD_TOOL_CALL, what, value, "a list of calls", i)
    return [openai_tool_call(c, message_index=i) for c in value]


def _fenced_calls(text: str, i: int) -> list[ToolCall]:
    """An API-Bank call message: ```[{"name": ..., "arguments": {...}}]``` (the fence is optional)."""
    body = text.strip()
    if body.startswith("```"):
        body = body[3:].removeprefix("json")
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    try:
        value = loads_lenient(body.strip())
    except ValueError as err:
        raise RecordError(Reason.BAD_TOOL_CALL, f"call message is {err}: {text[:80]!r}", message_index=i) from None
    return _calls(value, i, "the call message")


def _history(query: list) -> list[Message]:
    out: list[Message] = []
    last = len(query) - 1
    for i, m in enumerate(query):
        if type(m) is not dict:
            raise wrong_type(Reason.BAD_CONTENT, "query message", m, "an object", i)
        role, content = m.get("role"), m.get("content")
        if role == "tool":
            out.append({"role": "tool", "content": tool_content(content, message_index=i)})
            continue
        text = text_of(content, message_index=i)
        if i == last and text.rstrip().endswith(_SUFFIX):
            text = text.rstrip()[:-len(_SUFFIX)].rstrip()
        if role == "user" or role == "system":
            out.append({"role": role, "content": text})
        elif role == "agent":
            out.append({"role": "assistant", "reasoning_content": "", "content": text})
        elif role == "assistant":
            out.append({"role": "assistant", "reasoning_content": "", "content": "",
                        "tool_calls": _fenced_calls(text, i)})
        else:
            raise RecordError(Reason.UNKNOWN_ROLE, f"unknown role {role!r} in query", message_index=i)
    return out


def convert(rec: Any) -> BeamRecord:
    """One xLAM / APIGen row → a Beam record (not yet validated)."""
    rec = record_object(rec)
    if "query" not in rec or "answers" not in rec:
        raise RecordError(Reason.UNKNOWN_FORMAT, "an xLAM row needs 'query' and 'answers'")
    query = rec["query"]
    if type(query) is str:
        messages: list[Message] = [{"role": "user", "content": query}]
    elif type(query) is list:
        messages = _history(query)
    else:
        raise RecordError(Reason.BAD_CONTENT, f"query is {json_type(query)}, not a string or messages")
    tools = _tools(_json_field(rec, "tools"))
    if not (calls := _calls(_json_field(rec, "answers"), None, "answers")):
        raise RecordError(Reason.BAD_CONTENT, "answers is empty: no call and no text answer to train")
    messages.append({"role": "assistant", "reasoning_content": "", "content": "", "tool_calls": calls})
    return record(messages, tools)
