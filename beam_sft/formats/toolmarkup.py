"""Tool-call markup inside text (Hermes / Qwen tags, their fences, data-genie JSON calls): `lift` turns it
into structure, `strip_tool_prompt` removes the dataset's call-syntax instructions (docs/tool-calling.md)."""

from __future__ import annotations

import ast
import math
import re
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.records.markup import code_spans, may_have_markup, structural
from beam_sft.records.messages import normalize_tools, tool_call
from beam_sft.records.types import Message, ToolCall, ToolSpec, json_type


def _plain(value: Any, depth: int = 0) -> Any:
    """A Python literal as a JSON value (tuples → lists); anything JSON can't hold raises ValueError."""
    if depth > 200:
        raise ValueError("nested too deeply")
    t = type(value)
    if value is None or t is str or t is bool or t is int:
        return value
    if t is float:
        if not math.isfinite(value):
            raise ValueError("NaN or infinity")
        return value
    if t is list or t is tuple:
        return [_plain(v, depth + 1) for v in value]
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise ValueError(f"a key is {json_type(k)}, not a string")
            out[k] = _plain(v, depth + 1)
        return out
    raise ValueError(f"a {t.__name__} is not a JSON value")


def loads_lenient(text: str) -> Any:
    """JSON, else a Python literal (single quotes, True/None) turned into JSON values. ValueError if neither."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
        raise ValueError(f"neither JSON nor a Python literal ({type(err).__name__})") from None
    return _plain(value)


def _blocks(text: str, kind: str, i: int | None) -> tuple[list[str], str] | None:
    """The bodies of the `kind` blocks (``<kind>…</kind>`` or ```` ```kind … ``` ````) that are markup, and the
    text outside them; None when there are none. An opening tag without its end is `bad_tool_call`."""
    opener = re.compile(rf"<{kind}>|```{kind}\b")
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    spans = None
    for m in opener.finditer(text):
        if m.start() < pos or not structural(text, m.start(), m.end()):
            continue
        if spans is None:
            spans = code_spans(text)
        if any(a <= m.start() < b for a, b in spans):
            continue  # quoted in a code span or another language's fence (an example, not a call)
        closer = f"</{kind}>" if m.group(0).startswith("<") else "```"
        if (close := text.find(closer, m.end())) < 0:
            raise RecordError(Reason.BAD_TOOL_CALL, f"{m.group(0)} without its closing tag or fence",
                              message_index=i)
        outside.append(text[pos:m.start()])
        bodies.append(text[m.end():close])
        pos = close + len(closer)
    if not bodies:
        return None
    outside.append(text[pos:])
    return bodies, "\n\n".join(s.strip() for s in outside if s.strip())


def _calls_from_body(body: str, i: int | None) -> list[ToolCall]:
    if not (body := body.strip()):
        raise RecordError(Reason.BAD_TOOL_CALL, "empty <tool_call> block", message_index=i)
    try:
        value = loads_lenient(body)
    except ValueError as err:
        raise RecordError(Reason.BAD_TOOL_CALL, f"<tool_call> body is {err}: {body[:80]!r}",
                          message_index=i) from None
    items = value if type(value) is list else [value]
    if not items:
        raise RecordError(Reason.BAD_TOOL_CALL, "<tool_call> block with an empty list", message_index=i)
    return [call_from_value(item, body, i) for item in items]


def call_from_value(item: Any, body: str, i: int | None, what: str = "<tool_call>") -> ToolCall:
    """A parsed call body (``{"name", "arguments"}``, or OpenAI's ``{"function": {...}}``) → a Beam call."""
    if type(item) is not dict:
        raise RecordError(Reason.BAD_TOOL_CALL, f"{what} holds {json_type(item)}, not a "
                          "{name, arguments} object", message_index=i)
    fn = item.get("function") if type(item.get("function")) is dict else item
    name = fn.get("name")
    if type(name) is not str or not name:
        raise RecordError(Reason.BAD_TOOL_CALL, f"{what} without a name: {body[:80]!r}", message_index=i)
    args = fn.get("arguments", fn.get("parameters"))
    if args is not None and type(args) not in (dict, str):
        raise RecordError(Reason.ARGUMENTS_NOT_OBJECT, f"arguments of call {name!r} are a "
                          f"{type(args).__name__}, not an object", message_index=i)
    return tool_call(name, args, item["id"] if type(item.get("id")) is str else None, message_index=i)


def _result(body: str) -> tuple[str, str | None]:
    """One result body → (text, name), a ``{"name", "content"}`` wrapper unwrapped."""
    body = body.strip()
    if body[:1] in ("{", "[") and ("name" in body or "content" in body):
        try:
            value = loads_lenient(body)
        except ValueError:
            return body, None
        if type(value) is dict and "content" in value and set(value) <= {"name", "content", "tool_call_id"}:
            content, name = value["content"], value.get("name")
            try:
                text = content if type(content) is str else orjson.dumps(content).decode()
            except orjson.JSONEncodeError:  # nested deeper than orjson writes: kept as written (result_wrapper too)
                return body, None
            return text, name if type(name) is str and name else None
    return body, None


def _results(bodies: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for body in bodies:
        lines = [ln for ln in body.split("\n") if ln.strip()]
        if len(lines) > 1 and all(ln.lstrip().startswith("{") for ln in lines):
            # data-genie writes one wrapper per line for parallel calls in one block
            parts = [_result(ln) for ln in lines]
            if all(name is not None for _, name in parts):
                out.extend(parts)
                continue
        out.append(_result(body))
    return out


_I = re.IGNORECASE
# The instructions for the dataset's own call syntax, each removed under its ``stripped_tool_prompt`` name; why and
# which: docs/tool-calling.md. Texts: tests/data/tool_prompts/SOURCES.md.
_PROMPT_SOURCES = (
    ("hermes_role", r"You are a function calling AI model\.?", _I),
    ("tools_intro", r"You are provided with function signatures within <tools>\s*</tools> XML tags[.:]?", _I),
    ("tools_intro", r"Here are the available tools:", _I),
    ("may_call", r"You may call one or more functions to assist with the user query\.?", _I),
    ("no_assumptions", r"Don'?t make assumptions about what values to plug into functions\.?", _I),
    ("results_format", (r"After calling (?:&|and) executing the functions, you will be provided with function results "
     r"within <tool_response>\s*</tool_response> XML tags\.?"), _I),
    ("call_format", (r"For each function call,? return a json object,? with function name and arguments within "
     r"<tool_call>\s*</tool_call> (?:XML )?tags(?: as follows| with the following schema)?[.:]?"), _I),
    ("call_format", r"Each function call should be enclosed within <tool_call>\s*</tool_call> XML tags\.?", _I),
    # a format example: placeholders (<function-name>, <args-dict>, {tool_call}) instead of a call
    ("call_template", r"<tool_call>\s*(?:\{[^\n]*<[\w-]+>[^\n]*\}|\{\{?[\w-]+\}?\})\s*</tool_call>", 0),
    ("qwen_header", r"^#[ \t]*Tools[ \t]*$", re.MULTILINE),
    ("glaive_preamble", (r"You are an? helpful assistant,? (?:with|who has) access to (?:the following )?functions"
     r"(?:\.?[ \t]*Use them if required|,? to help the user, you can use the functions if needed)?[ \t]*-?"), _I),
)
PROMPT_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple(
    # each takes the blanks after it: removing a sentence leaves the line's other sentences spaced as they were
    (name, re.compile(f"(?:{source})[ \t]*", flags)) for name, source, flags in _PROMPT_SOURCES)
# The pydantic FunctionCall schema of Hermes 2 Pro / Hermes 3 prompts: the lead-in, then a balanced {...}.
_PYDANTIC = re.compile(r"(?:Use the following pydantic model json schema for each tool call you will make|For each "
                       r"function call return a JSON object, with the following pydantic model json schema):\s*", _I)
# Cheap gate: a text none of whose patterns can match is returned untouched without running them.
_PROMPT_HINTS = ("<tool", "function", "Tools", "tools")


def _skip_braces(text: str, pos: int) -> int:
    """The end of the balanced {...} starting at `pos` (or `pos` when there is none)."""
    if text[pos:pos + 1] != "{":
        return pos
    depth = 0
    for k, c in enumerate(text[pos:], pos):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return pos


def _bump(counts: dict | None, name: str, n: int = 1) -> None:
    if counts is not None and n:
        counts[name] = counts.get(name, 0) + n


def strip_tool_prompt(text: str, counts: dict | None = None) -> str:
    """`text` without the known call-syntax paragraphs, counted per pattern in `counts`; whitespace is tidied
    only where something was removed."""
    if not any(h in text for h in _PROMPT_HINTS):
        return text
    removed = 0
    m = _PYDANTIC.search(text)
    while m:
        end = _skip_braces(text, m.end())
        text = text[:m.start()] + text[end:].lstrip(" \t")
        _bump(counts, "pydantic_schema")
        removed += 1
        m = _PYDANTIC.search(text, m.start())
    for name, pattern in PROMPT_PATTERNS:
        text, n = pattern.subn("", text)
        _bump(counts, name, n)
        removed += n
    if not removed:
        return text
    lines = [ln.rstrip() for ln in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _tools_from_body(body: str) -> list:
    if not (body := body.strip()):
        return []
    try:
        value = loads_lenient(body)
    except ValueError:
        lines = [ln for ln in body.split("\n") if ln.strip()]
        try:  # Qwen: one JSON object per line
            value = [loads_lenient(ln) for ln in lines] if len(lines) > 1 else None
        except ValueError:
            value = None
        if value is None:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"<tools> block is neither JSON nor a Python literal: "
                              f"{body[:80]!r}") from None
    return value if type(value) is list else [value]


_CALL_KEYS = frozenset(("id", "type", "function", "index"))
_FUNCTION_KEYS = frozenset(("name", "arguments", "type"))


def _is_openai_call(item: Any) -> bool:
    """``{"id"?, "type"?: "function", "function": {"name", "arguments", "type"?}}`` and nothing else."""
    if type(item) is not dict or not _CALL_KEYS.issuperset(item) or item.get("type", "function") != "function":
        return False
    fn = item.get("function")
    return type(fn) is dict and _FUNCTION_KEYS.issuperset(fn) and fn.get("type", "function") == "function" \
        and type(fn.get("name")) is str and bool(fn["name"]) and type(fn.get("arguments")) in (dict, str)


def json_calls(text: str, i: int | None) -> list[ToolCall] | None:
    """The calls of an assistant text that is, whole, a JSON list (or one object) of OpenAI-style tool calls,
    as data-genie writes them; None for any other text, including JSON that only looks similar."""
    body = text.strip()
    if not body or (body[0], body[-1]) not in (("[", "]"), ("{", "}")) or "function" not in body:
        return None
    try:
        value = loads_lenient(body)
    except ValueError:
        return None
    items = value if type(value) is list else [value]
    if not items or not all(_is_openai_call(c) for c in items):
        return None
    return [tool_call(c["function"]["name"], c["function"]["arguments"],
                      c["id"] if type(c.get("id")) is str else None, message_index=i) for c in items]


# data-genie's tool message as JSON text, also without the quote that closes the id (docs/tool-calling.md).
_RESULT_WRAPPER = re.compile(r'^\{\s*"tool_call_id"\s*:\s*"([^"\\,]*)"?\s*,\s*"name"\s*:\s*"([^"\\]*)"\s*,'
                             r'\s*"content"\s*:\s*(.*)\}\s*$', re.DOTALL)


def result_wrapper(text: str) -> tuple[str, str | None, str | None] | None:
    """(content, name, tool_call_id) of a tool result written as an OpenAI tool message in JSON text, or None."""
    body = text.strip()
    if not body.startswith("{") or '"tool_call_id"' not in body:
        return None
    try:
        value = loads_lenient(body)
    except ValueError:
        value = None
    if type(value) is dict:
        if "content" not in value or not set(value) <= {"tool_call_id", "name", "content"}:
            return None
        content, name, cid = value["content"], value.get("name"), value.get("tool_call_id")
    else:
        if not (m := _RESULT_WRAPPER.match(body)):
            return None
        cid, name, raw = m.group(1), m.group(2), m.group(3).strip()
        try:
            content = loads_lenient(raw)
        except ValueError:
            content = raw
    if type(content) is not str:
        try:
            content = orjson.dumps(content).decode()
        except orjson.JSONEncodeError:
            return None
    return content, (name if type(name) is str and name else None), (cid if type(cid) is str and cid else None)


def _has_tags(text: str) -> bool:
    """Whether `text` may hold tags or fences to lift (one-character gates first: `may_have_markup`)."""
    return ("<" in text and "<tool" in text) or ("`" in text and "```tool" in text)


def scan(messages: list[Message]) -> tuple[bool, bool]:
    """(may hold any tool markup, may hold tags to lift) for converted messages, in one search; ``_no_markup``
    spares `beam_sft.validate.rules` its own search, so the common record pays for one pass, not two."""
    joined = "".join([text for m in messages for key in ("content", "reasoning_content")
                      if type(text := m.get(key)) is str])
    return (True, _has_tags(joined)) if may_have_markup(joined) else (False, False)


def lift(messages: list[Message], tools: list[ToolSpec] | None, src: list | None = None, counts: dict | None = None
         ) -> tuple[list[Message], list[ToolSpec] | None, list | None]:
    """Turn tag markup in converted Beam messages into calls, results and tools; `src` maps each message to
    the caller's index (for errors). A system/developer message loses its call-syntax instructions when the
    record has tools (one left empty is dropped); `counts` gets what was removed, per pattern."""
    out: list[Message] = []
    out_src: list = []
    found_tools: list = []

    def emit(msg: Message) -> None:
        out.append(msg)
        out_src.append(i)

    for k, m in enumerate(messages):
        i = src[k] if src is not None and k < len(src) else k
        role = m.get("role")
        text = m.get("content")
        if type(text) is not str or not _has_tags(text):
            emit(m)
            continue
        if role in ("system", "developer"):
            got = _blocks(text, "tools", i)
            if got is not None or tools or found_tools:
                if got is not None:  # the prompt declares tools: they go to the record's tools
                    bodies, text = got
                    found_tools.extend([t for body in bodies for t in _tools_from_body(body)])
                    _bump(counts, "tool_list", len(bodies))
                if rest := strip_tool_prompt(text, counts):
                    emit({**m, "content": rest})
                continue
        elif role == "assistant":
            got = _blocks(text, "tool_call", i)
            if got is not None:
                bodies, rest = got
                calls = [c for body in bodies for c in _calls_from_body(body, i)]
                reasoning = "\n\n".join(t for t in (m.get("reasoning_content"), rest) if t)
                emit({"role": "assistant", "reasoning_content": reasoning, "content": "",
                      "tool_calls": [*(m.get("tool_calls") or ()), *calls]})
                continue
        elif role in ("tool", "user"):
            got = _blocks(text, "tool_response", i)
            if got is not None:
                bodies, rest = got
                for result, name in _results(bodies):
                    msg: Message = {"role": "tool", "content": result}
                    name = name or (m.get("name") if role == "tool" else None)
                    if name:
                        msg["name"] = name
                    if role == "tool" and m.get("tool_call_id") is not None and len(bodies) == 1:
                        msg["tool_call_id"] = m["tool_call_id"]
                    emit(msg)
                if rest:  # a user who also says something after the results
                    emit({"role": role, "content": rest})
                continue
        emit(m)
    if found_tools:
        tools = (tools or []) + (normalize_tools(found_tools) or [])
    return out, tools, out_src
