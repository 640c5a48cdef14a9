"""Checks on a teacher's reasoning before it goes into a record, each failure a counted reason (FILTERS; what
each catches: docs/reasoning.md); `repetitive` and `truncated` live in `beam_sft.eval.degenerate`."""

from __future__ import annotations

import re
from collections.abc import Callable
from difflib import SequenceMatcher

from beam_sft.backfill.prompt import EXAMPLES
from beam_sft.eval.degenerate import degenerate, words
from beam_sft.records.messages import find_marker

FILTERS = ("empty", "harmony_marker", "repetitive", "truncated", "echoes_prompt", "narration", "restates_reply",
           "copies_example", "contradicts_reply", "too_long", "names_other_tool")

# The headings and role labels `beam_sft.backfill.prompt` writes (and wrote, before rationalize-2): real
# reasoning never starts a line with them.
_PROMPT_ECHO_RE = re.compile(
    r"^\s*##\s*(tools|conversation so far|the assistant's next reply)\b|^\s*\[(assistant( reasoning| tool calls)?|"
    r"user|system|developer|result of [^\]]*)\]\s*$|\bthe assistant (calls tools|answers):|"
    r"^\s*(tools|conversation|reply|thoughts before this reply\??|assistant (thinks|calls)|result of [\w.-]+|"
    r"user|assistant)\s*:", re.IGNORECASE | re.MULTILINE)

# Narration about the reply rather than reasoning towards it: the teacher describes what "the assistant"
# says next. First-person reasoning ("I should answer ...") is never matched.
_NARRATION_RE = re.compile(
    r"\bthe (assistant'?s?|model'?s?|ai'?s?) (next |final |following )?(reply|response|answer)\b|"
    r"\bthe (next|following|given|reference) (reply|response)\b|"
    r"\bthe assistant (responds|replies|says|writes|answers|calls|will respond|will reply|will say|will call)\b|"
    r"\b(i was|i am|i'm) (shown|given) the (reply|response|answer)\b|"
    r"^\s*the (answer|reply|response) is:\s*$", re.IGNORECASE | re.MULTILINE)

# Restating the reference answer: thresholds between real traces and the teacher's copies (docs/reasoning.md).
MAX_COVERED_TRIGRAMS = 0.6
MIN_TRIGRAMS = 10
MIN_COPIED_RUN = 12
MIN_COPIED_SHARE = 0.5
MAX_COPIED_SHARE = 0.8
MIN_SHORT_COPY = 4

MIN_EXAMPLE_RUN = 6

# A tool named only to be ruled out ("So no need to call calculate_area.") does not argue for it.
_NEGATION_RE = re.compile(r"\b(no need|not|n't|never|without|instead of|rather than|no)\b[^.\n]{0,40}$", re.IGNORECASE)


def longest_common_run(text: str, reference: str) -> int:
    """The longest run of consecutive words (lower-cased) that `text` and `reference` share."""
    a, b = words(text), words(reference)
    return SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b)).size


def restates_reply(reasoning: str, reference: dict) -> bool:
    """The reasoning copies the reference answer (not calls: reasoning before one names its arguments)."""
    content = reference.get("content")
    if reference.get("tool_calls") or not isinstance(content, str):
        return False
    run = longest_common_run(reasoning, content)
    answer, own = len(words(content)), len(words(reasoning))
    if run >= MIN_COPIED_RUN and run >= MIN_COPIED_SHARE * min(answer, own):
        return True
    return run >= MIN_SHORT_COPY and run >= MAX_COPIED_SHARE * own or covered_trigrams(reasoning, content) >= \
        MAX_COVERED_TRIGRAMS


def covered_trigrams(text: str, reference: str) -> float:
    """The share of the word 3-grams of `text` that occur in `reference` (0 when `text` has too few)."""
    a, b = words(text), words(reference)
    grams = [tuple(a[i:i + 3]) for i in range(len(a) - 2)]
    if len(grams) < MIN_TRIGRAMS:
        return 0.0
    known = {tuple(b[i:i + 3]) for i in range(len(b) - 2)}
    return sum(g in known for g in grams) / len(grams)


def copies_example(reasoning: str) -> bool:
    """A run of the prompt's worked examples' thoughts, which a small teacher copies into the wrong domain
    (real traces share at most three words in a row with them)."""
    return any(longest_common_run(reasoning, example[3]) >= MIN_EXAMPLE_RUN for example in EXAMPLES)


# Asking the user or declining: what reasoning before an answer concludes, never before a call.
_DECLINES_RE = re.compile(
    r"\b(I|so I|then I|I'll|I will|I should|I need to|I must|I have to) (ask|tell) (them|the user|him|her|you)? ?"
    r"(for|to (provide|give|clarify|specify|confirm|ask))\b|\b(ask for|request|need) clarification\b|"
    r"\bI (can't|cannot|can not|am unable to|am not able to|don't have the (ability|capability) to) (help|do (that|this|it)|"
    r"provide|find|fulfil|fulfill|complete|perform|assist|answer|fetch|get)\b", re.IGNORECASE)
# Deciding to call: what reasoning before a call concludes, never before an answer.
_CALLS_RE = re.compile(r"\b(I|so I|then I|and I)( will|'ll| can| should| need to| must)? (call|invoke)\b|"
                       r"\bI (get|find|check|fetch|answer|handle|do) (?:(it|this|that|them) )?by (calling|invoking)\b",
                       re.IGNORECASE)
# A call ruled out or put off ("no need to call", "before I can call it", "if I call").
_NOT_NOW_RE = re.compile(r"\b(no need|not|n't|never|without|instead of|rather than|no|before|until|once|if|unless|"
                         r"when|after)\b[^.\n]{0,40}$", re.IGNORECASE)


def contradicts_reply(reasoning: str, reference: dict, tools: list[dict] | None) -> bool:
    """Before a call, the reasoning concludes to ask or decline; before an answer with tools declared, to
    call (unless ruled out: "I can't call it without the city")."""
    if reference.get("tool_calls"):
        return _DECLINES_RE.search(reasoning) is not None
    return bool(tools) and _unnegated(_CALLS_RE, reasoning, _NOT_NOW_RE)


def _unnegated(pattern: re.Pattern, reasoning: str, negation: re.Pattern) -> bool:
    """A match of `pattern` in `reasoning` not ruled out by `negation` in the 60 characters before it."""
    return any(not negation.search(reasoning[max(0, m.start() - 60):m.start()])
               for m in pattern.finditer(reasoning))


def names_other_tool(reasoning: str, reference: dict, tools: list[dict] | None) -> str | None:
    """A declared tool the reasoning argues for although the reference calls others (not checked before an
    answer, whose reasoning may well mention a tool it decides not to use)."""
    calls = reference.get("tool_calls") or []
    if not calls or not tools:
        return None
    called = {c["function"]["name"] for c in calls}
    for tool in tools:
        name = tool.get("function", tool).get("name")
        if isinstance(name, str) and name not in called and _unnegated(
                re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])"), reasoning, _NEGATION_RE):
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
    if reason := degenerate(reasoning, stopped):
        return reason  # "repetitive" or "truncated"
    checks = (("echoes_prompt", lambda: _PROMPT_ECHO_RE.search(reasoning)),
              ("narration", lambda: _NARRATION_RE.search(reasoning)),
              ("restates_reply", lambda: restates_reply(reasoning, reference)),
              ("copies_example", lambda: copies_example(reasoning)),
              ("contradicts_reply", lambda: contradicts_reply(reasoning, reference, tools)),
              ("too_long", lambda: max_tokens is not None and count_tokens(reasoning) > max_tokens),
              ("names_other_tool", lambda: names_other_tool(reasoning, reference, tools)))
    return next((name for name, fails in checks if fails()), None)
