"""Exact deduplication of validated Beam records: an 8-byte key per record, first occurrence kept.

The key is a BLAKE2b digest of the record's JSON with sorted keys, taken after validation: the same
conversation that arrived as OpenAI in one file and ShareGPT in another is one record twice. Only keys and
a packed provenance (source index, line or index) are held, about 100 bytes a record, never the records:
10 million records cost about 1 GB, and the chance of two different records sharing a key is below 1e-5.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError

_POS_BITS = 40  # positions below 2**40: lines of a file, rows of a dataset


def record_key(record: dict[str, Any]) -> int:
    """The record's dedup key (an unsigned 64-bit int)."""
    text = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class Seen:
    """First occurrences by key; `check` says whether a record is a duplicate, in the order records are met."""

    def __init__(self) -> None:
        self.first: dict[int, int] = {}
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.first)

    def _pack(self, source: str, position: int, by_line: bool) -> int:
        i = self._index.get(source)
        if i is None:
            i = self._index[source] = len(self.names)
            self.names.append(source)
        return (i << (_POS_BITS + 1)) | (int(by_line) << _POS_BITS) | position

    def _where(self, packed: int) -> str:
        name = self.names[packed >> (_POS_BITS + 1)]
        position = packed & ((1 << _POS_BITS) - 1)
        return f"{name}:{position}" if packed >> _POS_BITS & 1 else f"{name}[{position}]"

    def check(self, key: int, source: str, position: int, by_line: bool = True) -> RecordError | None:
        """None for a first occurrence (now remembered), else the `duplicate` reject naming the first one."""
        first = self.first.get(key)
        if first is None:
            self.first[key] = self._pack(source, position, by_line)
            return None
        return RecordError(Reason.DUPLICATE, f"exact duplicate of {self._where(first)} (the first is kept)")
