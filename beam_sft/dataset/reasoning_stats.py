"""How many assistant turns of converted records have no reasoning, and how many are masked (weight 0),
counted on the validated record dicts: a validated assistant message always has a `reasoning_content` string,
and only assistant messages carry a `weight` (docs/prepare.md#what-was-dropped)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from beam_sft.errors import Reason

KEYS = ("assistant_turns", "without_reasoning", "masked_turns")
REJECTED_KEYS = ("rejected_assistant_turns", "rejected_without_reasoning")
REASONING_REJECTS = frozenset((Reason.NOTHING_TO_TRAIN.value, Reason.MISSING_REASONING.value))


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


def coverage(with_reasoning: int, turns: int) -> str:
    return f"{with_reasoning}/{turns} ({100 * with_reasoning / turns:.1f}%)" if turns else f"{with_reasoning}/0 (-)"


def input_coverage(counts: dict[str, Any]) -> str:
    """Reasoning coverage over the input's assistant turns: the kept records' and those of the records rejected
    for want of reasoning. The kept records' own coverage follows, when it differs."""
    turns, missing = counts.get("assistant_turns", 0), counts.get("without_reasoning", 0)
    all_turns = turns + counts.get("rejected_assistant_turns", 0)
    all_missing = missing + counts.get("rejected_without_reasoning", 0)
    text = f"{coverage(all_turns - all_missing, all_turns)} of the input's assistant turns"
    if all_turns != turns:
        text += f"; {coverage(turns - missing, turns)} of the kept records'"
    return text


def summary_rows(counts: dict[str, Any], policy: str | None) -> list[tuple[str, object]]:
    """Rows for a prepare / train summary table (nothing when the counts are absent: older manifests)."""
    if not counts:
        return []
    turns, missing, masked = (counts.get(k, 0) for k in KEYS)
    return [("assistant turns", f"{turns} ({missing} without reasoning, {masked} masked: weight 0)"),
            ("reasoning coverage", input_coverage(counts)),
            ("missing reasoning", policy or "-")]


def notes(counts: dict[str, Any], policy: str | None, rejected: dict[str, int]) -> list[str]:
    """The `keep` warning and the `backfill` hint for these counts, if they apply."""
    from beam_sft.validate.reasoning import keep_warning, majority_hint

    if not counts:
        return []
    if "rejected_assistant_turns" in counts:
        turns = counts["assistant_turns"] + counts["rejected_assistant_turns"]
        missing = counts["without_reasoning"] + counts["rejected_without_reasoning"]
    else:  # an older manifest: each nothing_to_train reject had at least one turn, none with reasoning
        untrained = rejected.get("nothing_to_train", 0)
        turns, missing = counts["assistant_turns"] + untrained, counts["without_reasoning"] + untrained
    out = [majority_hint(turns, missing)]
    if policy == "keep":
        out.insert(0, keep_warning(counts["without_reasoning"] - counts["masked_turns"]))
    return [note for note in out if note]
