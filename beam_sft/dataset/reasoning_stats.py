"""How many assistant turns of converted records have no reasoning, and how many are masked (weight 0).

The data phase keeps converted records as JSON text in an Arrow column (written by orjson, compact), so the
counts are substring counts over that column with `pyarrow.compute`: no record is parsed. They are exact: a
key such as ``"weight":0`` can only appear unescaped as a key, since quotes inside JSON strings are escaped.
"""

from __future__ import annotations

from typing import Any

ASSISTANT = '"role":"assistant"'
NO_REASONING = '"reasoning_content":""'
MASKED = '"weight":0'
KEYS = ("assistant_turns", "without_reasoning", "masked_turns")


def reasoning_counts(records) -> dict[str, int]:
    """Counts over an Arrow column (or chunked array) of compact JSON records; nulls (rejects) count nothing."""
    import pyarrow.compute as pc

    def count(pattern: str) -> int:
        return int(pc.sum(pc.count_substring(records, pattern)).as_py() or 0)

    return dict(zip(KEYS, (count(ASSISTANT), count(NO_REASONING), count(MASKED)), strict=True))


def summary_rows(counts: dict[str, Any], policy: str | None) -> list[tuple[str, object]]:
    """Rows for a prepare / train summary table (nothing when the counts are absent: older manifests)."""
    if not counts:
        return []
    turns, missing, masked = (counts.get(k, 0) for k in KEYS)
    return [("assistant turns", f"{turns} ({missing} without reasoning, {masked} masked: weight 0)"),
            ("missing reasoning", policy or "-")]


def notes(counts: dict[str, Any], policy: str | None, rejected: dict[str, int]) -> list[str]:
    """The `keep` warning and the `backfill` hint for these counts, if they apply."""
    from beam_sft.validate.reasoning import keep_warning, majority_hint

    if not counts:
        return []
    untrained = rejected.get("nothing_to_train", 0)  # each had at least one turn, none with reasoning
    out = [majority_hint(counts["assistant_turns"] + untrained, counts["without_reasoning"] + untrained)]
    if policy == "keep":
        out.insert(0, keep_warning(counts["without_reasoning"] - counts["masked_turns"]))
    return [note for note in out if note]
