"""What a run dropped, said loudly (docs/prepare.md#what-was-dropped).

Every command that drops records (`beam-sft convert`, `beam-sft prepare`, training's data phase) reports through
`drop_lines` and `verdict` from one counts dict: `records_in`, `records_kept`, `rejected` (reason -> count),
`dropped_too_long`, and optionally `unknown_format_keys` (key set -> count), `shortest_dropped` and `max_length`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from beam_sft.errors import Reason, UsageError

TOO_LONG = "too_long"  # the truncation policy's drops: not a reject reason, a count of its own

# Reason -> the switch or command that keeps such records (the rest have none: the rejects file says what to fix).
HOW_TO_KEEP = {
    Reason.NOTHING_TO_TRAIN.value: "--missing_reasoning keep (trains an empty analysis: docs/reasoning.md), or fill "
                                   "the reasoning in first: beam-sft backfill",
    Reason.MISSING_REASONING.value: "--missing_reasoning mask (the default), or fill the reasoning in first: "
                                    "beam-sft backfill",
    Reason.DUPLICATE.value: "--dedup false",
    TOO_LONG: "a larger --max_length, or --truncation_policy keep_start",
    Reason.UNKNOWN_FORMAT.value: "give them a shape listed below (rename columns with --dataset_columns "
                                 "KEY=COLUMN), or name the format with --dataset_format",
    Reason.LATE_SYSTEM.value: "beam-sft convert --late-system move",
    Reason.RECORD_TOO_LARGE.value: "a larger --max-record-bytes",
    Reason.INTERNAL_ERROR.value: "none: a bug in beam-sft, please report it",
    **dict.fromkeys((Reason.UNDECLARED_TOOL.value, Reason.NO_TOOLS_DECLARED.value, Reason.ARGUMENTS_BREAK_SCHEMA.value,
                     Reason.TURN_WITHOUT_TEXT.value, Reason.ASSISTANT_FIRST.value),
                    "--tool_call_checks keep (trains what eval scores as a failure: "
                    "docs/conversion.md#calls-checked-against-their-tools)"),
}


class DroppedTooMuch(UsageError):
    """A run that wrote nothing, or dropped more than `max_reject_share` of its input: raised after its outputs
    and rejects are written (nothing lost); `counts` are the run's, for the summary the command prints first."""

    def __init__(self, message: str, counts: dict[str, Any] | None = None, manifest: dict[str, Any] | None = None):
        super().__init__(message)
        self.counts = counts or {}
        self.manifest = manifest


def format_keys(entry: dict[str, Any]) -> str | None:
    """The input keys of an `unknown_format` reject entry as the report names them (`a, b`), else None."""
    keys = entry.get("keys") if entry.get("reason") == Reason.UNKNOWN_FORMAT.value else None
    return ", ".join(keys) if keys else None


def aligned_rows(rows: list[tuple[str, Any]], indent: str = "  ") -> list[str]:
    """A summary table's lines: each key padded to the longest, then its value."""
    width = max(len(k) for k, _ in rows)
    return [f"{indent}{k:<{width}}  {v}" for k, v in rows]


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def drops(counts: dict[str, Any]) -> Counter:
    """Reason -> records dropped (`TOO_LONG` for the truncation policy's drops)."""
    out = Counter({code: n for code, n in (counts.get("rejected") or {}).items() if n})
    if counts.get("dropped_too_long"):
        out[TOO_LONG] = counts["dropped_too_long"]
    return out


def drop_lines(counts: dict[str, Any], rejects: str | None = None,
               rejects_hint: str | None = "--rejects PATH lists each one", keep: Callable[[str], str] | None = None,
               head: str = "dropped", noun: str = "input records") -> list[str]:
    """The drops by reason: count, share of the input and what keeps them; for `unknown_format`, the shapes each
    converter reads and the keys the input had. One line when nothing was dropped. `rejects`: the file that
    lists them, else `rejects_hint` says how to get one. `keep`: reason -> what keeps it, for a command whose
    switches are not training's (`HOW_TO_KEEP`); `head` and `noun` name what it drops (augment: a transform's
    records, backfill: a filter's turns)."""
    from beam_sft.validate.convert import format_shapes

    n_in, by_reason = counts.get("records_in", 0), drops(counts)
    total = sum(by_reason.values())
    if not total:
        return [f"{head}: nothing (all {n_in} {noun} kept)"]
    where = f" (each one, with its line and what is wrong: {rejects})" if rejects else \
        f" ({rejects_hint})" if rejects_hint else ""
    lines = [f"{head}: {total} of {n_in} {noun} ({_share(total, n_in)}) by reason, and what keeps them{where}:"]
    width = max(len(code) for code in by_reason)
    for code, n in by_reason.most_common():
        how = keep(code) if keep is not None else HOW_TO_KEEP.get(code, "no switch: fix the records")
        lines.append(f"  {code:<{width}}  {n:>6}  {_share(n, n_in):>6}  keep them: {how}")
        if code == Reason.UNKNOWN_FORMAT.value:
            if keys := Counter(counts.get("unknown_format_keys") or {}):
                lines.append("    keys the input had: " + "; ".join(
                    f"{{{k}}} ({m} record{'s' if m != 1 else ''})" for k, m in keys.most_common(3)))
            lines.append("    shapes the converters read:")
            lines.extend(f"      {shape}" for shape in format_shapes())
    return lines


def rewrite_rejected_lines(by_reason: Counter, n_in: int, rejects: str | None) -> list[str]:
    """The input records `beam-sft augment` or `backfill` rejected (they convert with every check on), by reason,
    with what keeps them among those commands' switches."""
    keep = {Reason.UNKNOWN_FORMAT.value: "name the format with --dataset_format, or fix the records",
            **{code: HOW_TO_KEEP[code] for code in (Reason.LATE_SYSTEM.value, Reason.INTERNAL_ERROR.value)}}
    return drop_lines({"records_in": n_in, "rejected": by_reason}, rejects,
                      keep=lambda code: keep.get(code, "no switch: fix the records"))


def verdict(counts: dict[str, Any], threshold: float | None, names: Sequence[str] = (),
            noun: str = "records") -> str | None:
    """The one line of a run that wrote nothing, or dropped more than `threshold` of its input (None: fine).
    `names` are the inputs (the first three named), `noun` what the run makes of it ("training records")."""
    what = ", ".join(names[:3]) + (f" (and {len(names) - 3} more)" if len(names) > 3 else "") or "the input"
    n_in, kept, by_reason = counts.get("records_in", 0), counts.get("records_kept", 0), drops(counts)
    total = sum(by_reason.values())
    reasons = ", ".join(f"{code} {n}" for code, n in by_reason.most_common(3))
    if kept == 0 and n_in == 0:
        return f"{what}: no records read; check the paths (and --dataset_train_split for a dataset directory)"
    if kept == 0 and by_reason.get(TOO_LONG) and counts.get("shortest_dropped"):
        rejected = total - by_reason[TOO_LONG]
        others = ", ".join(f"{code} {n}" for code, n in by_reason.most_common(4) if code != TOO_LONG)
        also = f" ({rejected} others rejected: {others})" if rejected else ""
        return (f"{what}: no {noun} left: all {by_reason[TOO_LONG]} converted records are longer than "
                f"--max_length {counts.get('max_length')}{also}; the shortest is {counts['shortest_dropped']} "
                f"tokens: raise --max_length to at least {counts['shortest_dropped']}, or use --truncation_policy "
                "keep_start")
    if kept == 0:
        return (f"no usable {noun} in {what}: all {n_in} input records were dropped ({reasons}); the lines above "
                "say what keeps each reason")
    if threshold is not None and total > threshold * n_in:
        return (f"{what}: {total} of {n_in} input records dropped ({_share(total, n_in)}: {reasons}), more than "
                f"--max_reject_share {threshold:g}; the lines above say what keeps each reason (--max_reject_share "
                "1.0 accepts any share; the outputs and rejects are written)")
    return None

