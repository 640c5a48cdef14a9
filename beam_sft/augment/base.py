"""What a transform is: a callable `transform(record, rng) -> record` over a validated Beam record, which raises
`Skip(reason)` when it does not apply and never changes the record it is given (it builds new dicts and lists);
and the per-record random generator that makes a run reproducible.
"""

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
    """The generator of one transform on one record: seeded from the run's seed, the transform, the record's
    position in the input and its place among the records derived from it, never from what came before, so
    a record's choices are the same whatever the other records are. (A string seed is hashed with SHA-512,
    the same in every process.)"""
    return random.Random(f"{seed}/{transform}/{position}/{member}")


def sampled(rng: random.Random, share: float) -> None:
    """Skip, as `not_sampled`, all but a `share` of the records that reach this point."""
    if rng.random() >= share:
        raise Skip("not_sampled")
