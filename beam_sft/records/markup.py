"""Tool-call or result markup in a text: the ``tool_markup_in_text`` rule of Beam records (a tag that starts a line
or touches JSON is markup; one quoted in prose or code stays text), shared by `beam_sft.validate.rules` and
`beam_sft.formats.toolmarkup`. See docs/decisions.md ("Tool markup is never text")."""

from __future__ import annotations

import re

# What counts as call/result markup (the tool_markup_in_text rule), and a cheap gate before the regex.
_MARKUP_RE = re.compile(
    r"</?tool_call>|</?tool_response>|</?tools>|<functioncall>|FUNCTION RESPONSE:"
    r"|```(?:tool_call|tool_response|tools)\b"
)
_FENCE_LINE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([^\s`]*)", re.MULTILINE)
_LIFTABLE_FENCES = frozenset(("tool_call", "tool_response", "tools"))


def may_have_markup(text: str) -> bool:
    """Cheap gate: False means `find_markup` would find nothing.

    Each multi-character search is gated by a one-character one: a single character is a memchr, while
    CPython searches for "<tool" or "```tool" in ordinary text at a few hundred MB/s (their letters defeat
    its skip table). "U" is the rarest letter of FUNCTION RESPONSE in prose."""
    return ("<" in text and ("<tool" in text or "</tool" in text or "<functioncall>" in text)) \
        or ("`" in text and "```tool" in text) or ("U" in text and "FUNCTION RESPONSE:" in text)


def code_spans(text: str) -> list[tuple[int, int]]:
    """Regions of `text` that quote code: fenced blocks of any language but the tool fences, and inline
    code spans. Only called when a markup candidate was found, so its cost does not matter."""
    spans: list[tuple[int, int]] = []
    fence_start = None
    fence_mark = ""
    for m in _FENCE_LINE.finditer(text):
        mark, info = m.group(1), m.group(2)
        if fence_start is None:
            if info in _LIFTABLE_FENCES:
                continue  # a tool fence is markup itself, not quoting
            fence_start, fence_mark = m.start(), mark[0] * 3
        elif mark.startswith(fence_mark) and not info:
            spans.append((fence_start, m.end()))
            fence_start = None
    if fence_start is not None:
        spans.append((fence_start, len(text)))
    for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text):
        spans.append((m.start(), m.end()))
    return spans


def structural(text: str, start: int, end: int) -> bool:
    """Whether the tag at text[start:end] is written as structure rather than quoted in a sentence."""
    line_start = text.rfind("\n", 0, start) + 1
    if not text[line_start:start].strip():
        return True
    after = text[end:end + 64].lstrip()
    if after[:1] in ("{", "["):
        return True
    before = text[max(0, start - 64):start].rstrip()
    return text[start:start + 2] == "</" and before[-1:] in ("}", "]")


def find_markup(text: str) -> str | None:
    """The first call/result markup in `text` that is not quoted in prose, or None."""
    if not may_have_markup(text):
        return None
    found = [m for m in _MARKUP_RE.finditer(text) if structural(text, m.start(), m.end())]
    spans = code_spans(text) if found else None
    found = [m for m in found if not any(a <= m.start() < b for a, b in spans)] if spans else found
    return found[0].group(0) if found else None
