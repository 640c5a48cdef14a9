"""`ToolPool`: the tools distractors and irrelevance draw from, a seeded bottom-k sample by a keyed hash of
each name, the same whatever order the records come in."""

from __future__ import annotations

import hashlib
import heapq

from beam_sft.augment.words import name_words, tool_name
from beam_sft.records.types import BeamRecord, ToolSpec

POOL_SIZE = 2000


class ToolPool:
    def __init__(self, seed: int = 0, size: int = POOL_SIZE):
        self.seed, self.size = seed, size
        self.tools: dict[str, ToolSpec] = {}
        self._heap: list[tuple[int, str]] = []  # (-priority, name): the root is the first to go
        self.refused = 0  # schemas not kept because the pool was full (a name counts each time it comes)
        self._names: list[str] | None = None
        self._index: dict[str, set[str]] = {}

    def add(self, tool: ToolSpec) -> None:
        if (name := tool_name(tool)) in self.tools:
            return
        priority = int.from_bytes(hashlib.blake2b(f"{self.seed}\0{name}".encode(), digest_size=8).digest(), "big")
        if len(self._heap) >= self.size:
            self.refused += 1  # this schema or the one it pushes out
            if priority >= -self._heap[0][0]:
                return
            _, gone = heapq.heappushpop(self._heap, (-priority, name))
            del self.tools[gone]
        else:
            heapq.heappush(self._heap, (-priority, name))
        self.tools[name] = tool
        self._names = None

    def add_record(self, record: BeamRecord) -> None:
        for tool in record.get("tools") or []:
            self.add(tool)

    def __len__(self) -> int:
        return len(self.tools)

    def __getitem__(self, name: str) -> ToolSpec:
        return self.tools[name]

    def _freeze(self) -> list[str]:
        """The names in sorted order (the same list for the same pool) and the index word -> names."""
        if self._names is None:
            self._names = sorted(self.tools)
            self._index = {}
            for name in self._names:
                for word in name_words(name):
                    self._index.setdefault(word, set()).add(name)
        return self._names

    def unrelated(self, taken: set[str], exclude: set[str]) -> list[str]:
        """The pool's names, sorted, that share no name word with `taken` and are not in `exclude`."""
        names = self._freeze()
        related = set().union(*(self._index.get(w, ()) for w in taken)) if taken else set()
        return [n for n in names if n not in related and n not in exclude]

    def summary(self) -> dict:
        return {"tools": len(self), "size": self.size, "refused": self.refused}
