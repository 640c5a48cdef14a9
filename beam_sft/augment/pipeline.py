"""The transforms of one run, from their specs to the records written, with counts (docs/tool-calling.md)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from beam_sft.augment.ask_missing import AskMissing
from beam_sft.augment.base import Skip, Transform, rng_for
from beam_sft.augment.distractors import Distractors
from beam_sft.augment.irrelevance import Irrelevance
from beam_sft.augment.mask_names import MaskNames
from beam_sft.augment.pool import POOL_SIZE, ToolPool
from beam_sft.errors import RecordError, UsageError
from beam_sft.records.types import BeamRecord
from beam_sft.validate.convert import convert
from beam_sft.validate.rules import Options

# the spec names, in the order of --help; each class is built as cls(value, pool)
TRANSFORMS: dict[str, type[Transform]] = {t.name: t for t in (Irrelevance, Distractors, MaskNames, AskMissing)}
MAX_DISTRACTORS = 32
KEEP = Options(missing_reasoning="keep")


def parse_spec(text: str) -> tuple[str, float | int]:
    """``NAME=VALUE`` -> (name, value), or a one-line `UsageError`."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if name not in TRANSFORMS:
        raise UsageError(f"--transform {text}: unknown transform {name!r} (known: {', '.join(TRANSFORMS)})")
    if not sep:
        raise UsageError(f"--transform {text}: expected {name}=VALUE")
    kind = TRANSFORMS[name].value_kind
    try:
        value = float(raw) if kind == "share" else int(raw)
    except ValueError:
        value = None
    if kind == "share" and (value is None or not 0 <= value <= 1):
        raise UsageError(f"--transform {text}: the share P must be a number in [0, 1]")
    if kind == "count" and (value is None or not 1 <= value <= MAX_DISTRACTORS):
        raise UsageError(f"--transform {text}: K must be a whole number from 1 to {MAX_DISTRACTORS}")
    return name, value


def parse_specs(texts: list[str]) -> list[tuple[str, float | int]]:
    specs = [parse_spec(t) for t in texts]
    names = [n for n, _ in specs]
    if not specs:
        raise UsageError("give at least one --transform NAME=VALUE (" + ", ".join(TRANSFORMS) + ")")
    if len(set(names)) != len(names):
        raise UsageError(f"--transform: each transform once (got {', '.join(names)})")
    return specs


@dataclass
class Counts:
    """One transform's counts: seen = changed (rewrites) + added (additions) + skipped by reason."""

    adds: bool
    seen: int = 0
    changed: int = 0
    added: int = 0
    skipped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {"kind": "adds" if self.adds else "rewrites", "seen": self.seen, "changed": self.changed,
                "added": self.added, "skipped": dict(sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])))}


@dataclass
class Output:
    """A record to write, the addition that made it (None: an input record), the rewrites that changed it."""

    record: BeamRecord
    position: int
    added_by: str | None = None
    rewrites: list[str] = field(default_factory=list)

    @property
    def touched(self) -> bool:
        return self.added_by is not None or bool(self.rewrites)


class Augmenter:
    def __init__(self, specs: list[str] | list[tuple[str, Any]], seed: int = 0, pool_size: int = POOL_SIZE,
                 options: Options | None = None):
        self.specs = parse_specs([s if isinstance(s, str) else f"{s[0]}={s[1]}" for s in specs])
        self.seed, self.options = seed, options or KEEP
        self.pool = ToolPool(seed, pool_size)
        self.counts = {name: Counts(adds=TRANSFORMS[name].adds) for name, _ in self.specs}
        self._transforms: list[Transform] = [TRANSFORMS[name](value, self.pool) for name, value in self.specs]

    @property
    def needs_pool(self) -> bool:
        return any(TRANSFORMS[name].needs_pool for name, _ in self.specs)

    def collect(self, record: BeamRecord) -> None:
        """First pass: the record's tools join the pool."""
        self.pool.add_record(record)

    def apply(self, record: BeamRecord, position: int) -> list[Output]:
        """The input record (rewritten or not), then the records added from it."""
        group = [Output(record, position)]
        for t in self._transforms:
            if t.adds and (new := self._run(t, record, position, 0)) is not None:
                group.append(Output(new, position, added_by=t.name))
        for t in [t for t in self._transforms if not t.adds]:
            for member, out in enumerate(group):
                if (new := self._run(t, out.record, position, member)) is not None:
                    out.record = new
                    out.rewrites.append(t.name)
        return group

    def _run(self, t: Transform, record: BeamRecord, position: int, member: int) -> BeamRecord | None:
        counts = self.counts[t.name]
        counts.seen += 1
        try:
            new = self._valid(t(record, rng_for(self.seed, t.name, position, member)))
        except Skip as skip:
            counts.skipped[skip.reason] += 1
            return None
        except Exception:  # a transform's bug costs it this record, not the run
            if os.environ.get("BEAM_SFT_DEBUG"):
                raise
            counts.skipped["internal_error"] += 1
            return None
        if t.adds:
            counts.added += 1
        else:
            counts.changed += 1
        return new

    def _valid(self, record: BeamRecord) -> BeamRecord:
        """The transform's result as the validator normalises it, or Skip(invalid_<code>)."""
        try:
            return convert(record, "beam", self.options)[0]
        except RecordError as err:
            raise Skip(f"invalid_{err.code.value}") from None

    def summary(self) -> dict[str, Any]:
        return {"transforms": {name: self.counts[name].to_dict() for name, _ in self.specs},
                "pool": self.pool.summary() if self.needs_pool else None}
