"""Statistics of a whole dataset as training encodes it: `dataset_stats`, printed by `stats_table`."""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from beam_sft.errors import Reason, RecordError
from beam_sft.render.encoder import MaskedEncoder, encode_each
from beam_sft.report.masks import kept_by_truncation, marker_ids, token_messages, truncation_cut, turn_end_ids


@dataclass
class DatasetStats:
    records: int = 0
    rejected: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    max_length: int | None = None
    policy: str = "turn"  # the truncation policy applied with max_length
    tokens: int = 0  # after truncation, of the records kept
    trained: int = 0
    lengths: list[int] = field(default_factory=list)  # before truncation
    groups: dict[str, list[int]] = field(default_factory=dict)  # group -> [trained, tokens]
    empty_mask: list[int] = field(default_factory=list)  # record indices
    truncated: list[int] = field(default_factory=list)
    cut_inside_assistant: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # records the truncation policy drops
    stop_untrained: list[int] = field(default_factory=list)
    internal_errors: list[int] = field(default_factory=list)  # records whose encoding raised unexpectedly
    labels: list[str] = field(default_factory=list)

    @property
    def trained_fraction(self) -> float:
        return self.trained / self.tokens if self.tokens else 0.0

    def histogram(self, bins: int = 10) -> list[tuple[int, int, int]]:
        """[(low, high, count)] of the untruncated lengths, equal-width bins."""
        if not self.lengths:
            return []
        low, high = min(self.lengths), max(self.lengths)
        width = max(1, math.ceil((high - low + 1) / bins))
        counts = Counter((n - low) // width for n in self.lengths)
        return [(low + b * width, low + (b + 1) * width - 1, counts.get(b, 0))
                for b in range(bins) if low + b * width <= high]


def _add_record(stats: DatasetStats, index: int, full: dict, markers, stops, decode) -> None:
    """Count one encoded record, cut as training cuts it (a dropped one only in `dropped`)."""
    stats.records += 1
    stats.lengths.append(len(full["input_ids"]))
    if (kept := kept_by_truncation(full, stats.max_length, stats.policy)) is None:
        stats.dropped.append(index)
        return
    ids, mask = kept
    stats.tokens += len(ids)
    stats.trained += sum(mask)
    for message in token_messages(ids, mask, markers, decode)[1]:
        entry = stats.groups.setdefault(message.group, [0, 0])
        entry[0] += message.trained
        entry[1] += message.tokens
    if not any(mask):
        stats.empty_mask.append(index)
    truncated, inside = truncation_cut(full["assistant_masks"], len(ids))
    if truncated:
        stats.truncated.append(index)
        if inside:
            stats.cut_inside_assistant.append(index)
    if any(i in stops and not m for i, m in zip(ids, mask, strict=True)):
        stats.stop_untrained.append(index)


def dataset_stats(tokenizer, records: Sequence[dict], *, max_length: int | None = None,
                  encoder: MaskedEncoder | None = None, labels: Sequence[str] | Callable[[int], str] | None = None,
                  rejected: Sequence[dict] = (), batch_size: int = 256, policy: str = "turn") -> DatasetStats:
    """Statistics over `records` (a sliceable sequence of Beam records), encoded and cut as training does."""
    from tqdm import tqdm

    encoder = encoder or MaskedEncoder(tokenizer)
    stats = DatasetStats(max_length=max_length, policy=policy, rejected=len(rejected))
    stats.rejected_reasons.update(r.get("reason", "?") for r in rejected)
    markers, stops = marker_ids(tokenizer), turn_end_ids(tokenizer)
    # A callable or a sequence: for a large dataset the caller names records lazily.
    label_of = "record {}".format if labels is None else labels if callable(labels) else labels.__getitem__
    cached_decode = functools.cache(lambda key: tokenizer.decode(list(key)))

    def decode(header_ids):
        return cached_decode(tuple(header_ids))

    for start in tqdm(range(0, len(records), batch_size), desc="Encoding", unit="batch", disable=len(records) < 2000):
        encoded = encode_each(encoder, list(records[start : start + batch_size]))
        for index, full in enumerate(encoded, start):
            if isinstance(full, RecordError):
                stats.rejected += 1
                stats.rejected_reasons[full.code.value] += 1
                if full.code is Reason.INTERNAL_ERROR:
                    stats.internal_errors.append(index)
                continue
            stats.labels.append(label_of(index))
            _add_record(stats, index, full, markers, stops, decode)
    return stats


def _indices(values: list[int], limit: int = 12) -> str:
    if not values:
        return "none"
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def stats_rows(stats: DatasetStats) -> list[tuple[str, str]]:
    reasons = f" ({', '.join(f'{k}: {v}' for k, v in stats.rejected_reasons.most_common())})" if stats.rejected else ""
    rows = [
        ("records", str(stats.records)),
        ("rejected", f"{stats.rejected}{reasons}"),
        ("tokens (after truncation)", str(stats.tokens)),
        ("trained tokens", f"{stats.trained} ({100 * stats.trained_fraction:.1f}%)"),
    ]
    if stats.lengths:
        lengths = sorted(stats.lengths)
        rows.append(("length min / median / max", f"{lengths[0]} / {lengths[len(lengths) // 2]} / {lengths[-1]}"))
    rows.append(("max_length", f"{stats.max_length} (truncation policy {stats.policy})"
                 if stats.max_length is not None else "none"))
    for group, (trained, total) in sorted(stats.groups.items()):
        rows.append((f"  {group}: trained / tokens", f"{trained} / {total}"))
    rows += [
        ("empty mask (nothing trains)", f"{len(stats.empty_mask)}: {_indices(stats.empty_mask)}"),
        ("truncated by max_length", f"{len(stats.truncated)}: {_indices(stats.truncated)}"),
        ("  cut inside an assistant turn", f"{len(stats.cut_inside_assistant)}: {_indices(stats.cut_inside_assistant)}"),
        *((("dropped by the truncation policy", f"{len(stats.dropped)}: {_indices(stats.dropped)}"),)
          if stats.max_length is not None else ()),
        ("stop tokens outside the mask", f"{len(stats.stop_untrained)}: {_indices(stats.stop_untrained)}"),
    ]
    return rows


def drop_counts(stats: DatasetStats) -> dict:
    """The counts `beam_sft.dataset.drops` reads: what training would drop of these records, by reason."""
    return {"records_in": stats.records + stats.rejected, "records_kept": stats.records - len(stats.dropped),
            "rejected": dict(stats.rejected_reasons), "dropped_too_long": len(stats.dropped)}


def stats_table(stats: DatasetStats, *, histogram: bool = True) -> str:
    from beam_sft.dataset.drops import aligned_rows, drop_lines

    out = aligned_rows(stats_rows(stats), indent="")
    out += drop_lines(drop_counts(stats), rejects_hint=None)
    if histogram and stats.lengths:
        out.append("length histogram (tokens before truncation):")
        hist = stats.histogram()
        top = max(c for _, _, c in hist) or 1
        for low, high, count in hist:
            out.append(f"  {low:>7}-{high:<7} {count:>6} {'#' * math.ceil(40 * count / top) if count else ''}")
    return "\n".join(out)
