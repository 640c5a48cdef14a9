"""A transform: `transform(record, rng) -> record` over a validated Beam record, `Skip(reason)` when it does
not apply, never changing its input; and the per-record generator that makes a run reproducible."""

from __future__ import annotations

import random

from beam_sft.augment.pool import ToolPool
from beam_sft.records.types import BeamRecord


class Skip(Exception):
    """The transform does not apply to this record; `reason` is counted in the run's stats."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Transform:
    name = ""
    adds = False  # True: returns a new record derived from the input; False: the input, rewritten
    needs_pool = False  # True: draws tools from the other records (beam_sft.augment.pool)
    value_kind = "share"  # the spec's value: "share" (P in [0, 1]) or "count" (K)

    def __init__(self, value: float, pool: ToolPool | None = None):
        self.value, self.pool = value, pool

    def __call__(self, record: BeamRecord, rng: random.Random) -> BeamRecord:
        raise NotImplementedError


def rng_for(seed: int, transform: str, position: int, member: int = 0) -> random.Random:
    """The generator of one transform on one record, seeded from where the record is, never from what came
    before: its choices are the same whatever the other records (a string seed: in every process too)."""
    return random.Random(f"{seed}/{transform}/{position}/{member}")


def sampled(rng: random.Random, share: float) -> None:
    """Skip, as `not_sampled`, all but a `share` of the records that reach this point."""
    if rng.random() >= share:
        raise Skip("not_sampled")
