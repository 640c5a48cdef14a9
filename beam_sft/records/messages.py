"""The limits every Beam record obeys and the small helpers every converter shares to build its messages. Converters
build the dicts directly, so these stay allocation-light: conversion speed is measured against an orjson
load+dump floor. The shapes: docs/formats.md#beam-records-on-disk-and-training-on-them-with-plain-trl."""

from __future__ import annotations

import re
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.records.schema_types import is_xlam_map, parameters_schema, standardize
from beam_sft.records.types import (
    BeamRecord,
    FunctionSpec,
    Message,
    ToolCall,
    ToolSpec,
    json_type,
    wrong_type,
)

# The seven markers of the format, plus the other special tokens of the gpt-oss family that a text must not
# carry either: any of them inside a message would be tokenized as structure, not text.
HARMONY_MARKERS: tuple[str, ...] = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>",
                                    "<|return|>")
# How an assistant turn ends: an answer (<|return|>, also the EOS token) or a tool call (<|call|>). Training
# must put both inside the assistant mask; generation stops at either.
RETURN, CALL = "<|return|>", "<|call|>"
STOP_MARKERS: tuple[str, str] = (RETURN, CALL)
_MARKER_RE = re.compile(
    r"<\|(?:start|channel|constrain|message|end|call|return|endoftext|startoftext|refusal|endofprompt"
    r"|reserved_\d+)\|>"
)
PARAMETER_CLOSE_TAG = "</rfl:parameter>"


# Reasoning effort labels the Beam template accepts (an int is accepted too).
EFFORT_LABELS = frozenset(("minimal", "low", "medium", "high", "xhigh", "max"))

_THINK_OPEN = re.compile(r"^\s*<(think|thinking|reasoning)>", re.IGNORECASE)

# How deep free-form JSON (arguments, tool schemas, template kwargs) may nest, and why: docs/formats.md.
MAX_JSON_DEPTH = 64


def nests_deeper(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` has containers nested more than `limit` deep. Iterative: hostile input can't exhaust
    the stack."""
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        t = type(v)
        if t is dict or t is list:
            if depth > limit:
                return True
            for item in (v.values() if t is dict else v):
                if type(item) is dict or type(item) is list:
                    push((item, depth + 1))
    return False


# Datasets repeat one tool list in every record: each distinct list (by its JSON) is checked once. The value
# says whether the list is fine as it is (True) or nests too deep (False).
_TOOLS_CHECKED: dict[bytes, bool] = {}


def tools_json(tools: list) -> bytes:
    """The tool list as JSON bytes, or `RecordError` (``bad_tool_schema``) when it can't be written as JSON or
    nests deeper than `MAX_JSON_DEPTH`."""
    try:
        blob = orjson.dumps(tools)
    except orjson.JSONEncodeError as err:
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tool schemas can't be written as JSON ({err})") from None
    ok = _TOOLS_CHECKED.get(blob)
    if ok is None:
        ok = not nests_deeper(tools, MAX_JSON_DEPTH + 1)
        if not ok or all(normalize_tool(t, index=k) is t for k, t in enumerate(tools)):
            if len(_TOOLS_CHECKED) > 256:
                _TOOLS_CHECKED.clear()
            _TOOLS_CHECKED[blob] = ok
    if not ok:
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tool schemas nest deeper than {MAX_JSON_DEPTH} levels")
    return blob


def checked_tools(tools: Any) -> tuple[list[ToolSpec], bytes]:
    """A record's tool list, normalized (`normalize_tool`) and checked (`tools_json`), with its JSON; a list seen
    before costs one serialization and one lookup."""
    if type(tools) is not list:
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools is {json_type(tools)}, not a list")
    blob = tools_json(tools)
    if _TOOLS_CHECKED.get(blob) is not True:  # not known to be in shape: normalize (raises for a bad schema)
        tools = [normalize_tool(t, index=k) for k, t in enumerate(tools)]
        blob = tools_json(tools)
    return tools, blob


def find_marker(text: str) -> str | None:
    """The first Harmony marker inside `text`, or None.

    Callers gate on ``"<" in text`` first: a one-character search is a memchr, many times faster than
    searching for "<|" in long text without markers."""
    if "<" not in text or "<|" not in text:
        return None
    m = _MARKER_RE.search(text)
    return m.group(0) if m else None


def split_think(text: str, *, message_index: int | None = None) -> tuple[str | None, str]:
    """Split a leading ``<think>…</think>`` (or ``<thinking>`` / ``<reasoning>``) block off `text`.

    Returns ``(reasoning or None, rest)``. The rest loses the whitespace that separated it from the block
    (the usual ``"</think>\\n\\n"``); the reasoning loses its surrounding whitespace. An opening tag without
    its closing tag is an error, never silently kept as answer text."""
    if "<" not in text or not (m := _THINK_OPEN.match(text)):
        return None, text
    tag = m.group(1)
    close = f"</{tag}>"
    end = text.lower().find(close.lower(), m.end())
    if end < 0:
        raise RecordError(Reason.BAD_CONTENT, f"<{tag}> without a closing {close}", message_index=message_index)
    return text[m.end():end].strip(), text[end + len(close):].lstrip()


_TEXT_PART_TYPES = frozenset(("text", "input_text", "output_text"))


def text_of(content: Any, *, message_index: int | None = None, what: str = "content") -> str:
    """Content as one string: a string as is, a list of text parts joined with no separator (the template's rule).

    ``None`` is the empty string. Parts of any other type (images, audio, files) are rejected: Beam is text
    only, and dropping a part silently would change what the message says."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RecordError(Reason.BAD_CONTENT, f"{what} is {json_type(content)}, expected a string or a list "
                          "of parts", message_index=message_index)
    out = []
    for k, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise wrong_type(Reason.BAD_CONTENT, f"{what} part {k}", part, "an object", message_index)
        ptype = part.get("type", "text")
        if type(ptype) is not str:
            raise wrong_type(Reason.BAD_CONTENT, f"{what} part {k} has a type that", ptype, "a string", message_index)
        if ptype not in _TEXT_PART_TYPES:
            raise RecordError(Reason.UNSUPPORTED_CONTENT_PART, f"{what} part {k} has type {ptype!r}; only text "
                              "parts are supported", message_index=message_index)
        text = part.get("text", part.get("value"))
        if not isinstance(text, str):
            raise RecordError(Reason.BAD_CONTENT, f"{what} part {k} ({ptype}) has no text string",
                              message_index=message_index)
        out.append(text)
    return "".join(out)


def tool_content(content: Any, *, message_index: int | None = None) -> str:
    """A tool result as text: strings and text parts as is, any other JSON value serialized."""
    if isinstance(content, (dict, int, float, bool)) or (
            isinstance(content, list) and content and not all(isinstance(p, dict) and "type" in p for p in content)):
        try:
            return orjson.dumps(content).decode()
        except orjson.JSONEncodeError as err:
            raise RecordError(Reason.BAD_CONTENT, f"tool result can't be written as JSON text ({err})",
                              message_index=message_index) from None
    return text_of(content, message_index=message_index)


def parse_arguments(raw: Any, *, message_index: int | None = None, name: str = "?") -> dict:
    """Tool-call arguments as a dict: a dict as is, a JSON string decoded, an empty string as ``{}``."""
    if isinstance(raw, dict):
        return raw
    if raw is None:
        return {}
    if isinstance(raw, (str, bytes)):
        if not raw.strip():
            return {}
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            snippet = raw[:60] if isinstance(raw, str) else raw[:60].decode("utf-8", "replace")
            raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"arguments of call {name!r} are not JSON ({err}): "
                              f"{snippet!r}", message_index=message_index) from None
        if isinstance(value, dict):
            return value
        hint = " (a JSON string inside a JSON string: double-encoded)" if isinstance(value, str) else ""
        raise RecordError(Reason.ARGUMENTS_NOT_OBJECT, f"arguments of call {name!r} decode to "
                          f"{json_type(value)}, not an object{hint}", message_index=message_index)
    raise RecordError(Reason.ARGUMENTS_NOT_OBJECT, f"arguments of call {name!r} are {json_type(raw)}, "
                      "not an object", message_index=message_index)


def tool_call(name: Any, arguments: Any, call_id: Any = None, *, message_index: int | None = None) -> ToolCall:
    """One Beam tool call; `arguments` may be a dict or a JSON string."""
    if type(name) is not str or not name:
        raise RecordError(Reason.BAD_CONTENT, f"tool call without a name (got {name!r})",
                          message_index=message_index)
    if type(arguments) is not dict:
        arguments = parse_arguments(arguments, message_index=message_index, name=name)
    call: ToolCall = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is None or call_id == "":
        return call
    if type(call_id) is not str and type(call_id) is not int:
        raise wrong_type(Reason.BAD_CONTENT, "tool call id", call_id, "a string", message_index)
    return {"id": call_id if type(call_id) is str else str(call_id), **call}


def openai_tool_call(call: Any, *, message_index: int | None = None) -> ToolCall:
    """A call in the OpenAI shape (``{"id", "type", "function": {"name", "arguments"}}``, or a bare
    ``{"name", "arguments"}``) as a Beam tool call."""
    if type(call) is not dict:
        raise wrong_type(Reason.BAD_CONTENT, "tool call", call, "an object", message_index)
    fn = call.get("function", call)
    if type(fn) is not dict:
        raise RecordError(Reason.BAD_CONTENT, "tool call 'function' is not an object", message_index=message_index)
    args = fn.get("arguments")
    if args is None:
        args = fn.get("parameters")
    return tool_call(fn.get("name"), args, call.get("id"), message_index=message_index)


def function_tool(name: str, description: str | None, parameters: dict) -> ToolSpec:
    """A tool schema in the OpenAI shape; an empty description is left out."""
    fn: FunctionSpec = {"name": name, "description": description} if description else {"name": name}
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def openai_tool_calls(value: Any, what: str, *, message_index: int | None = None) -> list[ToolCall]:
    """One call or a list of calls in the OpenAI shape (`openai_tool_call`), decoded first when `value` is JSON
    text (`bad_arguments_json` naming `what` when it is not JSON)."""
    if isinstance(value, (str, bytes)):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as err:
            raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"{what} is not JSON ({err})",
                              message_index=message_index) from None
    return [openai_tool_call(c, message_index=message_index) for c in (value if isinstance(value, list) else [value])]


def normalize_tool(tool: Any, *, index: int = 0) -> ToolSpec:
    """A tool schema, the OpenAI shape or the bare function shape (legacy ``functions``, glaive), as
    ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``."""
    if type(tool) is dict and tool.get("type") == "function":  # the OpenAI shape: checked, kept as is
        fn = tool.get("function")
        if type(fn) is dict and type(fn.get("name")) is str and fn["name"]:
            params, desc = fn.get("parameters"), fn.get("description")
            if (params is None or type(params) is dict) and (desc is None or type(desc) is str):
                return tool
    if not isinstance(tool, dict):
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] is {json_type(tool)}, not an object")
    fn = tool.get("function") if tool.get("type", "function") == "function" and "function" in tool else tool
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] has no function name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise wrong_type(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] ({fn['name']}): parameters", params, "an object")
    desc = fn.get("description")
    if desc is not None and type(desc) is not str:
        raise wrong_type(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] ({fn['name']}): description", desc, "a string")
    if fn is tool or tool.get("type") != "function":
        return {"type": "function", "function": fn}
    return tool


def normalize_tools(tools: Any) -> list[ToolSpec] | None:
    """A record's tool list (a list, or a JSON string of one, as LLaMA-Factory and glaive store it)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)):
        if not tools.strip():
            return None
        try:
            tools = orjson.loads(tools)
        except orjson.JSONDecodeError as err:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools is a string but not JSON ({err})") from None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools is {json_type(tools)}, not a list")
    if not tools:
        return None
    return [_standard_types(normalize_tool(t, index=i)) for i, t in enumerate(tools)]


def _standard_types(tool: ToolSpec) -> ToolSpec:
    """Python / xLAM type names (``int``, ``dict``) in the parameters, or a whole xLAM parameter map → JSON
    Schema (`schema_types`)."""
    fn = tool["function"]
    params = fn.get("parameters")
    new = parameters_schema(params, fn["name"]) if is_xlam_map(params) else standardize(params)
    required = fn.get("required")
    if type(required) is list and type(new) is dict and "required" not in new:
        # xLAM-derived exports put `required` next to `parameters`, where the template never looks
        new = {**new, "required": required}
        fn = {k: v for k, v in fn.items() if k != "required"}
    return tool if new is params else {**tool, "function": {**fn, "parameters": new}}


def record(messages: list[Message], tools: list[ToolSpec] | None = None, kwargs: dict | None = None) -> BeamRecord:
    """A Beam record of these parts; empty tools and kwargs are left out."""
    out: BeamRecord = {"messages": messages}
    if tools:
        out["tools"] = tools
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    return out
