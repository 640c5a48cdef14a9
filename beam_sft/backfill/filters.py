"""Checks on a teacher's reasoning before it goes into a record; each failure has a counted reason.

A turn whose reasoning fails stays without reasoning, so the default `--missing-reasoning mask` keeps it out
of the loss rather than training a bad trace.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from beam_sft.records.messages import find_marker

FILTERS = ("empty", "harmony_marker", "truncated", "too_long", "names_other_tool")


def names_other_tool(reasoning: str, reference: dict, tools: list[dict] | None) -> str | None:
    """A declared tool the reasoning names although the reference calls other tools (it argues for a
    different action than the one trained). Only checked when the reference calls tools: reasoning before an
    answer may well mention a tool it decides not to use."""
    calls = reference.get("tool_calls") or []
    if not calls or not tools:
        return None
    called = {c["function"]["name"] for c in calls}
    for tool in tools:
        name = tool.get("function", tool).get("name")
        if isinstance(name, str) and name not in called and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])",
                                                                      reasoning):
            return name
    return None


def check(reasoning: str | None, reference: dict, tools: list[dict] | None, *, max_tokens: int | None,
          count_tokens: Callable[[str], int], stopped: bool | None = None) -> str | None:
    """The first filter `reasoning` fails (one of FILTERS), or None when it may be used. `stopped` is the
    teacher's word on whether it ended the text itself (False: cut at the generation bound)."""
    if not isinstance(reasoning, str) or not reasoning.strip():
        return "empty"
    if find_marker(reasoning):
        return "harmony_marker"
    if stopped is False:
        return "truncated"
    if max_tokens is not None and count_tokens(reasoning) > max_tokens:
        return "too_long"
    if names_other_tool(reasoning, reference, tools):
        return "names_other_tool"
    return None
