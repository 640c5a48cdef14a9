"""The words of tool names and conversations, and where a record's first call is: what every transform reads
(when a tool "could serve a request": docs/tool-calling.md)."""

from __future__ import annotations

import re
from typing import Any

from beam_sft.records.types import BeamRecord, FunctionSpec, Message, ToolSpec

NAME_VERBS = frozenset({"get", "set", "calculate", "find", "search", "create", "check", "generate", "convert", "fetch",
                        "list", "add", "send", "update"})
_WORD = re.compile(r"[a-z0-9]{3,}")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
# a name counts as written when no letter, digit or underscore touches it: `get_weather` is not inside
# `get_weather_forecast`, and a sentence's full stop after it does not hide it
_EDGE_BEFORE, _EDGE_AFTER = r"(?<![A-Za-z0-9_])", r"(?![A-Za-z0-9_])"


# A tool with one of these words in its name or description could serve almost any request.
GENERAL_PURPOSE = frozenset({"search", "query", "answer", "web", "google", "internet", "lookup", "browse", "ask",
                             "chat", "assistant", "wikipedia", "duckduckgo", "bing", "llm", "gpt"})


def general_purpose(tool: ToolSpec) -> bool:
    function = tool.get("function", tool)
    words = stems(_CAMEL.sub(r"\1 \2", str(function.get("name"))).replace("_", " "))
    return bool((words | stems(str(function.get("description") or ""))) & GENERAL_PURPOSE)


def tool_name(tool: ToolSpec) -> str:
    return str(tool.get("function", tool).get("name"))


def stems(text: str) -> set[str]:
    """Lower-case words of three or more letters, a plural `s` dropped."""
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in _WORD.findall(text.lower())}


def name_words(name: str) -> set[str]:
    """The words of a tool name (snake_case, camelCase), the common verbs aside."""
    return stems(_CAMEL.sub(r"\1 \2", name).replace("_", " ")) - NAME_VERBS


def texts(record: BeamRecord) -> list[str]:
    """Every text of the record's messages: contents, reasoning, tool results."""
    return [v for m in record["messages"] for key in ("content", "reasoning_content")
            if type(v := m.get(key)) is str and v]


def conversation_words(record: BeamRecord) -> set[str]:
    return stems(" ".join(texts(record)))


def names_pattern(names: list[str]) -> re.Pattern[str]:
    """Any of `names` where it is written as a whole name (longest first, so one name inside another loses)."""
    body = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(f"{_EDGE_BEFORE}(?:{body}){_EDGE_AFTER}")


def speaks_of_tools(record: BeamRecord) -> bool:
    """Whether the reasoning talks about the tool list ("the tools provided are X and Y"): adding to that list,
    or taking from it, would make the reasoning untrue."""
    declared = [tool_name(t) for t in record.get("tools") or []]
    thought = " ".join(m.get("reasoning_content") or "" for m in record["messages"] if m.get("role") == "assistant")
    return bool(re.search(r"\b(tools|functions)\b", thought, re.IGNORECASE)) or sum(n in thought for n in declared) >= 2


def first_call(messages: list[Message]) -> int | None:
    """The index of the first assistant turn that calls tools, or None."""
    return next((k for k, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls")), None)


def declared(record: BeamRecord) -> dict[str, FunctionSpec]:
    """name -> the function of each declared tool (the first of a name)."""
    return {tool_name(tool): tool.get("function", tool) for tool in reversed(record.get("tools") or [])}


def short_description(text: Any, limit: int = 100) -> str:
    """The first sentence of a description, cut at a word before `limit` characters ("..."); "" for none."""
    if type(text) is not str or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    first = re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.!?])\s", line, maxsplit=1)[0].strip().rstrip(".:")
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "..."
