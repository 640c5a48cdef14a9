"""Looping or cut-off reasoning: refused by backfill, counted by eval (docs/reasoning.md)."""

from __future__ import annotations

import re
import zlib
from collections import Counter

# Thresholds between the real traces and a small teacher's loops, as measured in docs/reasoning.md.
NGRAM = 4
MAX_REPEATED_NGRAMS = 0.35
MIN_NGRAMS = 12
MIN_COMPRESS_CHARS = 400
MIN_COMPRESSION_RATIO = 0.3
# The same line written three times or more (headings and list markers excluded by the length floor).
MAX_LINE_REPEATS = 2
MIN_REPEATED_LINE_CHARS = 16

_WORD_RE = re.compile(r"\w+", re.UNICODE)


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
    if len(raw := text.encode()) < MIN_COMPRESS_CHARS:
        return 1.0
    return len(zlib.compress(raw, 9)) / len(raw)


def max_line_repeats(text: str) -> int:
    lines = (" ".join(line.split()).lower() for line in text.splitlines())
    return max(Counter(line for line in lines if len(line) >= MIN_REPEATED_LINE_CHARS).values(), default=0)


def is_repetitive(text: str) -> bool:
    return (repeated_ngram_share(text) > MAX_REPEATED_NGRAMS or compression_ratio(text) < MIN_COMPRESSION_RATIO
            or max_line_repeats(text) > MAX_LINE_REPEATS)


def degenerate(reasoning: str, stopped: bool | None = None) -> str | None:
    """"repetitive", "truncated" (`stopped` False: cut at the bound; None: unknown, not counted), or None."""
    if is_repetitive(reasoning):
        return "repetitive"
    if stopped is False:
        return "truncated"
    return None
