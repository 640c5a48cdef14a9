"""A resumable cache of teacher answers: one JSONL line per finished turn, flushed at once, so a killed run
loses at most the turns in flight (docs/reasoning.md)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson

from beam_sft.storage import short_hash


def record_key(record: dict[str, Any]) -> str:
    return short_hash(orjson.dumps(record, option=orjson.OPT_SORT_KEYS), length=24)


def turn_key(record_hash: str, turn: int, teacher: str, prompt_version: str) -> str:
    return short_hash(f"{record_hash}\0{turn}\0{teacher}\0{prompt_version}", length=32)


class TurnCache:
    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path else None
        self.entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._file = None
        if self.path is None:
            return
        if self.path.is_file():
            for line in self.path.read_bytes().splitlines():
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # the torn last line of a killed run
                self.entries[entry["key"]] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - held for the run, closed in close()
        if self._file.tell() and not self.path.read_bytes().endswith(b"\n"):
            self._file.write(b"\n")  # end a torn line so the next entry starts on its own

    def put(self, key: str, reasoning: str | None, status: str, *, text: str | None = None) -> None:
        entry = {"key": key, "reasoning": reasoning, "status": status}
        if text is not None:
            entry["text"] = text  # the answer a filter refused
        with self._lock:
            self.entries[key] = entry
            if self._file is not None:
                self._file.write(orjson.dumps(entry) + b"\n")
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
