"""How many assistant turns of converted records have no reasoning, and how many are masked (weight 0).

Counted on the validated record dicts (a validated assistant message always has a `reasoning_content` string,
and only assistant messages carry a `weight`), a few dict lookups per message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

KEYS = ("assistant_turns", "without_reasoning", "masked_turns")


def reasoning_counts(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    """The counts over validated Beam records."""
    turns = without = masked = 0
    for record in records:
        for message in record["messages"]:
            if message["role"] == "assistant":
                turns += 1
                if not message["reasoning_content"]:
                    without += 1
                if message.get("weight") == 0:
                    masked += 1
    return dict(zip(KEYS, (turns, without, masked), strict=True))


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
