"""The missing-reasoning policy's words (its help text, the warning `keep` gives, the hint when most turns have no
reasoning), shared by every command that takes ``--missing_reasoning``: one option, one meaning.
Why `mask` is the default: docs/reasoning.md."""

from __future__ import annotations

from beam_sft.validate.rules import MISSING_REASONING_CHOICES

DEFAULT = "mask"
assert DEFAULT in MISSING_REASONING_CHOICES

HELP = ("an assistant turn without reasoning: mask it (weight 0: the whole turn is context, not trained), keep "
        "it (trained with an empty analysis, which teaches Beam to stop reasoning: docs/reasoning.md), or reject "
        "the record. A record left with no trained turn is rejected as nothing_to_train (default: mask)")


def keep_warning(kept: int) -> str | None:
    """The warning for a run that kept `kept` turns without reasoning (None when there were none)."""
    if not kept:
        return None
    return (f"warning: --missing_reasoning keep trains {kept} assistant turn(s) with an empty analysis. The Beam "
            "format page: \"Beam never writes an empty analysis message\"; a model trained on such turns learns "
            "to skip its reasoning (docs/reasoning.md). Use the default `mask`, or fill the reasoning in with "
            "`beam-sft backfill`.")


def majority_hint(assistant_turns: int, without_reasoning: int) -> str | None:
    """A pointer to `backfill` when more than half of the assistant turns have no reasoning."""
    if not assistant_turns or 2 * without_reasoning <= assistant_turns:
        return None
    share = 100.0 * without_reasoning / assistant_turns
    return (f"note: {without_reasoning}/{assistant_turns} assistant turns ({share:.0f}%) have no reasoning. Beam "
            "always reasons; these turns are not trained under `mask` (or train Beam to skip reasoning under "
            "`keep`). Fill the reasoning in with a teacher model first: beam-sft backfill INPUT -o OUT "
            "--base-url URL --model NAME (docs/reasoning.md).")
