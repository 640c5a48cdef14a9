"""Where each row of a prepared split came from: the `row_origins.arrow` sidecar of each split (its source and
line or index), written and read back as docs/prepare.md#how-a-run-works says (Row origins)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from beam_sft.storage import arrow_array, numpy_ints

ORIGINS_FILE = "row_origins.arrow"
_SUFFIX = ".origins.arrow"
_METADATA_KEY = b"beam_sft_row_origins"
_VERSION = 1


def origins_schema(metadata: dict[bytes, bytes] | None = None):
    import pyarrow as pa

    return pa.schema([("src", pa.int32()), ("pos", pa.int64()), ("by_line", pa.bool_())], metadata=metadata)


def shard_origins_path(shard: str | os.PathLike) -> str:
    """The origins file that goes with a chunk's shard (`part-00003.arrow` -> `part-00003.origins.arrow`)."""
    return str(shard).removesuffix(".arrow") + _SUFFIX


class OriginsWriter:
    """The origins of one split's kept rows: the chunks' origins files, added in the split's chunk order, then
    written as the split's `row_origins.arrow`. Holds a few numbers per chunk, never a row."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, list[int]]] = []  # (chunk origins file, chunk's src -> split's src)
        self.names: dict[str, int] = {}
        self.complete = True

    def add(self, shard: str | os.PathLike, names: list[str]) -> None:
        path = shard_origins_path(shard)
        if not os.path.exists(path):
            # a shard written before origins were recorded (an older shard run): no sidecar rather than a wrong one
            self.complete = False
            return
        self.parts.append((path, [self.names.setdefault(name, len(self.names)) for name in names]))

    def write(self, directory: str | os.PathLike) -> None:
        """`directory/row_origins.arrow` from the chunks' files, which are removed."""
        import numpy as np
        import pyarrow as pa

        if self.complete:
            meta = json.dumps({"version": _VERSION, "names": list(self.names)}, ensure_ascii=False)
            schema = origins_schema({_METADATA_KEY: meta.encode()})
            with pa.OSFile(str(Path(directory) / ORIGINS_FILE), "wb") as sink, \
                    pa.ipc.new_file(sink, schema) as writer:
                for path, lookup in self.parts:
                    # one chunk at a time (at most CHUNK_ROWS rows), one batch each: batch boundaries inside a
                    # chunk then never show in the bytes
                    with pa.OSFile(path) as source:
                        table = pa.ipc.open_stream(source).read_all()
                    src, pos, by_line = (table.column(name).combine_chunks() for name in schema.names)
                    src = arrow_array(np.asarray(lookup, dtype=np.int32)[numpy_ints(src)], pa.int32())
                    writer.write_batch(pa.record_batch([src, pos, by_line], schema=schema))
        for path, _ in self.parts:
            os.unlink(path)


class RowOrigins:
    """The origins of a prepared split's rows, memory-mapped. Rows are those of the dataset it was found
    from: through its indices mapping where it has one (a `train_test_split`, `shuffle`, `select`)."""

    def __init__(self, path: str | os.PathLike, indices: Any = None) -> None:
        import pyarrow as pa

        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        meta = json.loads(reader.schema.metadata[_METADATA_KEY])
        self.path = str(path)
        self.names: list[str] = meta["names"]
        self.table = reader.read_all()  # zero-copy over the map
        self.indices = indices  # pyarrow (chunked) array: dataset row -> split row, or None

    def __len__(self) -> int:
        return len(self.indices) if self.indices is not None else self.table.num_rows

    def locate(self, rows: list[int]) -> list[tuple[str, int, bool]]:
        """(source, position, by_line) of each row: the 1-based line when by_line, else the 0-based index."""
        import pyarrow as pa

        n = len(self)
        if bad := [row for row in rows if not 0 <= row < n]:
            raise IndexError(f"rows {bad} out of range for {n} rows")
        take = arrow_array(rows, pa.int64())
        if self.indices is not None:
            take = self.indices.take(take)
        picked = self.table.take(take)
        return [(self.names[src], pos, by_line) for src, pos, by_line in
                zip(*(picked.column(name).to_pylist() for name in ("src", "pos", "by_line")), strict=True)]

    def describe(self, rows: list[int]) -> list[str]:
        """`source:line` for JSONL rows, `source[index]` for the others (as the data phase's messages name them)."""
        return [f"{src}:{pos}" if by_line else f"{src}[{pos}]" for src, pos, by_line in self.locate(rows)]


def row_origins(dataset_or_dir: Any) -> RowOrigins | None:
    """The origins of a prepared split's rows (`dataset_or_dir`: a `datasets.Dataset` loaded from a prepared
    directory, or the path of such a split or of its `row_origins.arrow`), or None where there are none to be
    had: older prepared data, a streaming or in-memory dataset, one whose rows were rewritten (a `map`)."""
    if isinstance(dataset_or_dir, (str, os.PathLike)):
        path = Path(dataset_or_dir)
        path = path / ORIGINS_FILE if path.is_dir() else path
        return RowOrigins(path) if path.is_file() else None
    files = [Path(f["filename"]) for f in getattr(dataset_or_dir, "cache_files", None) or []]
    if not files or not (files[0].parent / ORIGINS_FILE).is_file():
        return None
    directory = files[0].parent
    try:
        state = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        data_files = [directory / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # The split's own files first (any after them hold an indices mapping): a dataset rewritten by `map` has other
    # files, and its rows need not be these.
    if [f.resolve() for f in files[: len(data_files)]] != [f.resolve() for f in data_files]:
        return None
    # datasets keeps a reordering (train_test_split, shuffle, select, filter) as an indices table over unchanged
    # data files, with no public accessor; without it the names would be of the wrong rows.
    indices = getattr(dataset_or_dir, "_indices", None)
    origins = RowOrigins(directory / ORIGINS_FILE, indices.column(0) if indices is not None else None)
    return origins if origins.table.num_rows == dataset_or_dir.data.num_rows else None
