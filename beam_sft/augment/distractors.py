"""`distractors=K`: each record with tools also declares up to K tools of other records, so a model stops
learning that the one declared tool is the answer (held-out records declare several; docs/tool-calling.md)."""

from __future__ import annotations

import random

from beam_sft.augment.base import Skip, Transform, rng_for
from beam_sft.augment.pool import ToolPool
from beam_sft.augment.words import conversation_words, general_purpose, name_words, speaks_of_tools, tool_name
from beam_sft.records.types import BeamRecord


def unrelated_tools(pool: ToolPool, record: BeamRecord, declared: set[str]) -> list[str]:
    """The pool's tools that could not serve `record`'s request nor be mistaken for a `declared` one."""
    taken = set().union(*map(name_words, declared)) | conversation_words(record)
    return [name for name in pool.unrelated(taken, declared) if not general_purpose(pool[name])]


class Distractors(Transform):
    name = "distractors"
    needs_pool = True
    value_kind = "count"

    def __call__(self, record: BeamRecord, rng: random.Random) -> BeamRecord:
        if not (tools := list(record.get("tools") or [])):
            raise Skip("no_tools")
        if speaks_of_tools(record):
            raise Skip("speaks_of_tools")
        if not (candidates := unrelated_tools(self.pool, record, {tool_name(t) for t in tools})):
            raise Skip("no_unrelated_tool")
        for name in rng.sample(candidates, min(self.value, len(candidates))):
            tools.insert(rng.randrange(len(tools) + 1), self.pool[name])
        return {**record, "tools": tools}


def add_distractors(records: list[BeamRecord], k: int, seed: int = 0) -> tuple[list[BeamRecord], int]:
    """`Distractors` over a list of records that is also the pool (the demo's data step): the records and how
    many changed."""
    pool = ToolPool(seed)
    for record in records:
        pool.add_record(record)
    transform = Distractors(k, pool)
    out, changed = [], 0
    for position, record in enumerate(records):
        try:
            out.append(transform(record, rng_for(seed, transform.name, position)))
            changed += 1
        except Skip:
            out.append(record)
    return out, changed
