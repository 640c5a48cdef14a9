"""Checks on a teacher's reasoning before it goes into a record; each failure has a counted reason.

A turn whose reasoning fails stays without reasoning, so the default `--missing-reasoning mask` keeps it out
of the loss rather than training a bad trace. Besides the plain checks (`empty`, Harmony markers, over the
length bound, a tool other than the called ones), these catch what a weak or misprompted teacher writes,
seen on SmolLM2-135M-Instruct (docs/reasoning.md has a real example of each):

- `truncated`: the teacher did not stop on its own (cut at the generation bound, mid-word or mid-loop);
- `repetitive`: a loop (`The assistant's next reply is: The assistant's next reply is: ...`), measured as the
  share of repeated word 4-grams and as the zlib compression ratio of longer texts;
- `echoes_prompt`: the prompt's own scaffolding copied out (`## Conversation so far`, `[assistant]`,
  `The assistant calls tools:`);
- `narration`: talk *about* the reply (`The assistant's next reply is ...`, `The assistant responds: ...`)
  instead of reasoning towards it;
- `restates_reply`: the reference answer copied (a long verbatim run of its words) instead of reasoned to.

The thresholds were chosen on real teacher output and checked against every reasoning trace in the real
samples (`tests/test_backfill_filters.py`): none of those is filtered.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable

from beam_sft.records.messages import find_marker

FILTERS = ("empty", "harmony_marker", "repetitive", "truncated", "echoes_prompt", "narration", "restates_reply",
           "too_long", "names_other_tool")

# Repetition, measured on the 397 reasoning traces of the real samples (harmony/, reasoning/, the llamafactory
# reason/tool-use demo, data/samples) and on SmolLM2-135M-Instruct's answers to real glaive turns. Real
# reasoning repeats names and short phrases, rarely four words in a row: at most 28% of the 4-grams of a real
# trace repeat (a palindrome check spelling the string out twice), while the teacher's loops repeat 39-97%.
# The compression ratio catches loops with a varying word that the 4-gram share misses; it only means
# something on longer texts (a short text never compresses well): real traces of 400+ characters compress to
# 0.37 or more, the teacher's loops to 0.05-0.32.
NGRAM = 4
MAX_REPEATED_NGRAMS = 0.35
MIN_NGRAMS = 12
MIN_COMPRESS_CHARS = 400
MIN_COMPRESSION_RATIO = 0.3
# The same line written three times or more (headings and list markers excluded by the length floor).
MAX_LINE_REPEATS = 2
MIN_REPEATED_LINE_CHARS = 16

_WORD_RE = re.compile(r"\w+", re.UNICODE)

# The headings and role labels `beam_sft.backfill.prompt` writes: real reasoning never contains them.
_PROMPT_ECHO_RE = re.compile(
    r"^\s*##\s*(tools|conversation so far|the assistant's next reply)\b|^\s*\[(assistant( reasoning| tool calls)?|"
    r"user|system|developer|result of [^\]]*)\]\s*$|\bthe assistant (calls tools|answers):", re.I | re.M)

# Narration about the reply rather than reasoning towards it: the teacher describes what "the assistant"
# says next. First-person reasoning ("I should answer ...") is never matched.
_NARRATION_RE = re.compile(
    r"\bthe (assistant'?s?|model'?s?|ai'?s?) (next |final |following )?(reply|response|answer)\b|"
    r"\bthe (next|following|given|reference) (reply|response)\b|"
    r"\bthe assistant (responds|replies|says|writes|answers|will respond|will reply|will say)\b|"
    r"\b(i was|i am|i'm) (shown|given) the (reply|response|answer)\b", re.I)

# Restating the reference answer. Real reasoning drafts its answer ("The capital of Japan is Tokyo. One short
# sentence is enough." before the answer "The capital of Japan is Tokyo.") and quotes the tool results it
# sums up (runs of up to 15 words shared with the answer, at most 36% of it); the teacher copies the whole
# answer, or writes little else. Filtered: a shared run of MIN_COPIED_RUN words that is at least half of the
# answer or of the reasoning, or a reasoning that is mostly (MAX_COPIED_SHARE) one run of the answer.
MIN_COPIED_RUN = 12
MIN_COPIED_SHARE = 0.5
MAX_COPIED_SHARE = 0.8
MIN_SHORT_COPY = 4

# A tool named only to be ruled out ("So no need to call calculate_area.") does not argue for it.
_NEGATION_RE = re.compile(r"\b(no need|not|n't|never|without|instead of|rather than|no)\b[^.\n]{0,40}$", re.I)


def words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def repeated_ngram_share(text: str, n: int = NGRAM) -> float:
    """The share of the word n-grams of `text` that repeat an earlier one (0 when there are too few)."""
    tokens = words(text)
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < MIN_NGRAMS:
        return 0.0
    return 1 - len(set(grams)) / len(grams)


def compression_ratio(text: str) -> float:
    """zlib-compressed size over raw size (lower: more repetitive); 1 for texts too short to say."""
    raw = text.encode()
    if len(raw) < MIN_COMPRESS_CHARS:
        return 1.0
    return len(zlib.compress(raw, 9)) / len(raw)


def max_line_repeats(text: str) -> int:
    counts: dict[str, int] = {}
    for line in text.splitlines():
        line = " ".join(line.split()).lower()
        if len(line) >= MIN_REPEATED_LINE_CHARS:
            counts[line] = counts.get(line, 0) + 1
    return max(counts.values(), default=0)


def is_repetitive(text: str) -> bool:
    return (repeated_ngram_share(text) > MAX_REPEATED_NGRAMS or compression_ratio(text) < MIN_COMPRESSION_RATIO
            or max_line_repeats(text) > MAX_LINE_REPEATS)


def longest_common_run(text: str, reference: str) -> int:
    """The longest run of consecutive words (lower-cased) that `text` and `reference` share."""
    a, b = words(text), words(reference)
    if not a or not b:
        return 0
    best = 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def restates_reply(reasoning: str, reference: dict) -> bool:
    """The reasoning copies the reference answer (tool calls are not checked: naming the arguments to pass
    is what reasoning before a call does)."""
    content = reference.get("content")
    if reference.get("tool_calls") or not isinstance(content, str):
        return False
    run = longest_common_run(reasoning, content)
    answer, own = len(words(content)), len(words(reasoning))
    if run >= MIN_COPIED_RUN and run >= MIN_COPIED_SHARE * min(answer, own):
        return True
    return run >= MIN_SHORT_COPY and run >= MAX_COPIED_SHARE * own


def _argues_for(name: str, reasoning: str) -> bool:
    """`name` appears in `reasoning` other than ruled out by a negation just before it."""
    for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", reasoning):
        if not _NEGATION_RE.search(reasoning[max(0, match.start() - 60):match.start()]):
            return True
    return False


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
        if isinstance(name, str) and name not in called and _argues_for(name, reasoning):
            return name
    return None


def degenerate(reasoning: str, stopped: bool | None = None) -> str | None:
    """The checks that need no reference: `repetitive`, `truncated` (what `beam-sft eval` also measures on
    a model's own analysis), or None."""
    if is_repetitive(reasoning):
        return "repetitive"
    if stopped is False:
        return "truncated"
    return None


def check(reasoning: str | None, reference: dict, tools: list[dict] | None, *, max_tokens: int | None,
          count_tokens: Callable[[str], int], stopped: bool | None = None) -> str | None:
    """The first filter `reasoning` fails (one of FILTERS), or None when it may be used. `stopped` is the
    teacher's word on whether it ended the text itself (False: cut at the generation bound)."""
    if not isinstance(reasoning, str) or not reasoning.strip():
        return "empty"
    if find_marker(reasoning):
        return "harmony_marker"
    reason = degenerate(reasoning, stopped)
    if reason:
        return reason
    if _PROMPT_ECHO_RE.search(reasoning):
        return "echoes_prompt"
    if _NARRATION_RE.search(reasoning):
        return "narration"
    if restates_reply(reasoning, reference):
        return "restates_reply"
    if max_tokens is not None and count_tokens(reasoning) > max_tokens:
        return "too_long"
    if names_other_tool(reasoning, reference, tools):
        return "names_other_tool"
    return None
