"""Exact deduplication of validated Beam records: an 8-byte BLAKE2b key per record, first occurrence kept, held in
an open-addressing table of flat `array("Q")` words, never the records. Two different records among 10 million
share a key with a chance below 1e-5. See docs/prepare.md#deduplication."""

from __future__ import annotations

import hashlib
from array import array

import orjson

from beam_sft.errors import Reason, RecordError, where
from beam_sft.records.types import BeamRecord

_POS_BITS = 40  # positions below 2**40: lines of a file, rows of a dataset


def record_key(record: BeamRecord) -> int:
    """The record's dedup key (an unsigned 64-bit int)."""
    return text_key(orjson.dumps(record, option=orjson.OPT_SORT_KEYS))


def text_key(sorted_json: bytes) -> int:
    """`record_key` of a record's JSON already written with sorted keys."""
    return int.from_bytes(hashlib.blake2b(sorted_json, digest_size=8).digest(), "little")


class Seen:
    """First occurrences by key; `check` says whether a record is a duplicate, in the order records are met."""

    _START = 1 << 12  # slots; a power of two, doubled when the table is 5/8 full

    def __init__(self) -> None:
        self._keys = array("Q", bytes(8 * self._START))  # 0 = empty slot (a key of 0 is stored as 1)
        self._where_of = array("Q", bytes(8 * self._START))
        self._mask = self._START - 1
        self._count = 0
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes the table holds (the two arrays; source names aside)."""
        return self._keys.itemsize * (len(self._keys) + len(self._where_of))

    def _pack(self, source: str, position: int, by_line: bool) -> int:
        i = self._index.get(source)
        if i is None:
            i = self._index[source] = len(self.names)
            self.names.append(source)
        return (i << (_POS_BITS + 1)) | (int(by_line) << _POS_BITS) | position

    def _slot(self, key: int) -> int:
        """The slot holding `key`, or the empty slot where it would go."""
        keys, mask = self._keys, self._mask
        slot = key & mask  # the key is a digest: its low bits are already uniform
        while keys[slot] and keys[slot] != key:
            slot = (slot + 1) & mask
        return slot

    def _grow(self) -> None:
        old_keys, old_where = self._keys, self._where_of
        size = 2 * len(old_keys)
        self._keys, self._where_of, self._mask = array("Q", bytes(8 * size)), array("Q", bytes(8 * size)), size - 1
        for key, packed in zip(old_keys, old_where, strict=True):
            if key:
                slot = self._slot(key)
                self._keys[slot], self._where_of[slot] = key, packed

    def check(self, key: int, source: str, position: int, by_line: bool = True) -> RecordError | None:
        """None for a first occurrence (now remembered), else the `duplicate` reject naming the first one."""
        key = key or 1
        slot = self._slot(key)
        if self._keys[slot]:
            first = self._where_of[slot]  # unpacked as `_pack` packs it
            name, position = self.names[first >> (_POS_BITS + 1)], first & ((1 << _POS_BITS) - 1)
            return RecordError(Reason.DUPLICATE, f"exact duplicate of {where(name, position, first >> _POS_BITS & 1)} "
                               "(the first is kept)")
        self._keys[slot], self._where_of[slot] = key, self._pack(source, position, by_line)
        self._count += 1
        if 8 * self._count > 5 * len(self._keys):
            self._grow()
        return None
