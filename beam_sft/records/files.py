"""Streaming readers with provenance (`read_items`, `expand_inputs`), output writers (`open_writer`), and Arrow-safe
storage of Beam records (`beam_features`, `normalize_record`). See docs/formats.md for the inputs and outputs
and docs/conversion.md for how they are read."""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from beam_sft.errors import FatalError, Reason, RecordError, UsageError
from beam_sft.storage import fresh_temporary, fsync_file, replace_dir, temporary_path

# The reader of each file suffix (.arrow: Arrow IPC, the stream format `datasets` writes, or the file format).
_KIND_OF_SUFFIX = {".jsonl": "jsonl", ".ndjson": "jsonl", ".jsonl.gz": "jsonl", ".ndjson.gz": "jsonl", ".json": "json",
                   ".traj": "json", ".txt": "text", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
SUPPORTED_SUFFIXES = tuple(_KIND_OF_SUFFIX)
REJECTS = "rejects.jsonl"  # the rejects file the data phase writes beside its output
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


@dataclass(slots=True)
class Item:
    """One input record. `payload` is raw bytes (`raw=True`, a JSONL line still to parse) or the record."""

    source: str
    position: int  # 1-based line (by_line) or 0-based index
    by_line: bool
    payload: Any
    raw: bool = False
    error: RecordError | None = None

    def json(self) -> bytes:
        """The record as JSON (a JSONL line as read; values JSON has no type for, such as Parquet timestamps, as
        text): what the data phase stores and every reader converts, so a record reads the same in every
        command. Raises `orjson.JSONEncodeError` for a record nested deeper than orjson writes."""
        return self.payload if self.raw else orjson.dumps(self.payload, default=str)


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in SUPPORTED_SUFFIXES if name.endswith(s)), path.suffix.lower())


# `datasets.load_dataset` options of a hub (or hub-like local) dataset: Source field -> load_dataset keyword.
HUB_OPTIONS = {"config": "name", "revision": "revision", "data_dir": "data_dir", "data_files": "data_files"}


@dataclass(slots=True)
class Source:
    """One input. A "hub" source is read by `datasets.load_dataset(name, config, split=..., revision=...,
    data_dir=..., data_files=...)`: a hub id, or a local directory laid out like a hub dataset repository."""

    kind: str  # "jsonl", "json", "text", "parquet", "csv", "arrow", "disk", "hub"
    name: str
    split: str | None = None
    config: str | None = None  # load_dataset's `name`: the subset (TRL's dataset_config)
    revision: str | None = None
    data_dir: str | None = None
    data_files: Any = None
    columns: Any = None  # {target key: column} renames, or TRL's list of columns to keep (`select_columns`)
    streaming: bool = False  # load_dataset(..., streaming=True), set by the training stream: docs/training.md

    def load_kwargs(self) -> dict[str, Any]:
        """The `load_dataset` keywords this source sets (none of the unset ones)."""
        return {kw: getattr(self, field) for field, kw in HUB_OPTIONS.items() if getattr(self, field) is not None}


def is_hub_layout(path: Path) -> bool:
    """A local directory laid out like a hub dataset repository: a README.md whose YAML header declares
    `configs:` (what `datasets.load_dataset(DIR, name=...)` reads its subsets and splits from)."""
    readme = path / "README.md"
    if not readme.is_file():
        return False
    with open(readme, "rb") as f:
        head = f.read(1 << 20).decode("utf-8", "replace")
    if not (found := re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", head, re.DOTALL)):
        return False
    import yaml

    try:
        meta = yaml.safe_load(found.group(1))
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and "configs" in meta


# The record keys a converter reads (beam_sft.formats): what `columns` may rename a column to.
COLUMN_TARGETS = ("messages", "conversations", "history", "tools", "system", "chat_template_kwargs", "text", "chat",
                  "query", "answers")


def check_columns(columns: Any, where: str) -> Any:
    """`columns` as given (a mapping target key -> column, or TRL's list of columns to keep), checked."""
    if columns is None:
        return None
    if isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        return list(columns)
    if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in columns.items()):
        raise UsageError(f"{where}: columns must map record keys to column names ({{messages: conversations}}) or "
                         f"list the columns to keep; got {columns!r}")
    if unknown := sorted(set(columns) - set(COLUMN_TARGETS)):
        raise UsageError(f"{where}: columns: unknown target key(s) {', '.join(unknown)}; a column can become one of "
                         f"{', '.join(COLUMN_TARGETS)}")
    if len(set(columns.values())) != len(columns):
        raise UsageError(f"{where}: columns: one column mapped to two keys ({columns!r})")
    return dict(columns)


def parse_columns(text: str | None, where: str = "--dataset_columns") -> dict[str, str] | None:
    """``messages=conversations,tools=functions`` (the command line's column mapping) -> a checked mapping."""
    if not text:
        return None
    pairs = [part.strip() for part in text.split(",") if part.strip()]
    if not all(p.count("=") == 1 and all(p.split("=")) for p in pairs):
        raise UsageError(f"{where}: expected KEY=COLUMN[,KEY=COLUMN...] (e.g. messages=conversations); got {text!r}")
    return check_columns(dict(p.split("=") for p in pairs), where)


def source_options(args, *, hub: bool = True) -> dict[str, Any]:
    """Set `dataset_*` options of a command line or config as `expand_inputs` options (hub=False: columns)."""
    options = {"columns": parse_columns(getattr(args, "dataset_columns", None))}
    if hub:
        options.update({k: getattr(args, f"dataset_{k}", None) for k in HUB_OPTIONS})
    return {k: v for k, v in options.items() if v is not None}


def apply_columns(item: Item, columns: Any) -> Item:
    """The item with `columns` applied to its record (a JSONL line is parsed here): a mapping renames a column
    to a record key (the column replaces any value the key had), a list keeps only those columns. Done before
    format detection, so an unfamiliar key layout converts like a known one."""
    if columns is None or item.error is not None:
        return item
    record = item.payload
    if item.raw:
        try:
            record = parse_line(record)
        except RecordError as err:
            return Item(item.source, item.position, item.by_line, None, error=err)
    if not isinstance(record, dict):
        return Item(item.source, item.position, item.by_line, record)
    if isinstance(columns, dict):
        record = dict(record)
        for key, column in columns.items():
            if column in record:
                record[key] = record.pop(column)
    else:
        record = {k: v for k, v in record.items() if k in columns}
    return Item(item.source, item.position, item.by_line, record)


def expand_inputs(specs: list, split: str = "train", options: dict[str, Any] | None = None) -> list[Source]:
    """The command line's INPUT arguments as sources, in the order given (globs and directories sorted); `options`:
    HUB_OPTIONS' keys for a hub id or a dataset directory, and `columns` for every source."""
    options = dict(options or {})
    columns = check_columns(options.pop("columns", None), "columns")
    if unknown := sorted(set(options) - set(HUB_OPTIONS)):
        raise ValueError(f"unknown source option(s) {unknown}")  # a programming error, not a user's
    hub = {k: v for k, v in options.items() if v is not None}
    out: list[Source] = []
    for spec in specs:
        if isinstance(spec, Source):
            out.append(spec)
            continue
        found = _expand_one(spec, split, hub)
        for src in found:
            src.columns = columns
        out.extend(found)
    return out


def _expand_one(spec: str, split: str, hub: dict[str, Any]) -> list[Source]:
    path = Path(spec)
    # a directory, but not one save_to_disk wrote
    dataset_dir = path.is_dir() and not ((path / "state.json").exists() or (path / "dataset_dict.json").exists())
    if hub and not dataset_dir and (path.exists() or not _HUB_ID.match(spec)):
        raise UsageError(f"{spec}: {', '.join(sorted(hub))} apply to a hub dataset or a dataset directory, "
                         "not to a file, glob or saved dataset")
    if path.is_dir():
        if not dataset_dir:
            return [Source("disk", spec, split)]
        if hub or is_hub_layout(path):
            return [Source("hub", spec, split, **hub)]
        files = sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) in SUPPORTED_SUFFIXES)
        if not files:
            raise UsageError(f"{spec}: directory holds no {'/'.join(SUPPORTED_SUFFIXES)} files")
        return [_file_source(p) for p in files]
    if path.is_file():
        return [_file_source(path)]
    if any(c in spec for c in "*?["):
        files = [Path(m) for m in sorted(glob.glob(spec, recursive=True)) if Path(m).is_file()]
        if not files:
            raise UsageError(f"{spec}: no files match")
        return [_file_source(p) for p in files]
    if _HUB_ID.match(spec) and not spec.endswith(SUPPORTED_SUFFIXES):
        return [Source("hub", spec, split, **hub)]
    raise UsageError(f"{spec}: no such file or directory")


def data_sources(specs: list, split: str = "train", options: dict[str, Any] | None = None) -> list[Source]:
    """`expand_inputs`, without the rejects files a directory or glob turns up: convert-dataset and the data
    phase write them beside their outputs, and they are not data. A rejects file named on its own is read.
    Every reader of data (convert-dataset, the data phase, inspect, eval) starts here."""
    out: list[Source] = []
    for spec in specs:
        sources = expand_inputs([spec], split, options)
        if not isinstance(spec, Source) and not Path(spec).is_file():  # a directory or a glob found these files
            # rejects.jsonl, rejects.rank0.jsonl, x.rejects.jsonl...
            sources = [s for s in sources if s.kind in ("disk", "hub") or "rejects" not in Path(s.name).name]
            if not sources:
                raise UsageError(f"{spec}: no data here (only rejects files)")
        out.extend(sources)
    return out


def read_items(specs: list, split: str = "train", *, max_bytes: int | None = None,
               limit: int | None = None, options: dict[str, Any] | None = None) -> Iterator[Item]:
    """Every input record of `specs` (`data_sources`), in order, with its provenance (`iter_items`)."""
    return iter_items(data_sources(specs, split, options), max_bytes=max_bytes, limit=limit)


def source_label(spec) -> str:
    """An input as the manifest and messages name it: the path or id given (a `Source`: its name)."""
    return spec.name if isinstance(spec, Source) else str(spec)


def _file_source(path: Path) -> Source:
    kind = _KIND_OF_SUFFIX.get(_suffix(path))
    if kind is None:  # unknown suffix: JSONL unless the file is one JSON document
        with open(path, "rb") as f:
            kind = "json" if f.read(1).lstrip() == b"[" else "jsonl"
    return Source(kind, str(path))


def parse_line(line: bytes) -> Any:
    """One JSONL line → its record, or `RecordError` (``invalid_utf8`` / ``malformed_json``)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise _json_error(line, err) from None


def _json_error(data: bytes, err: Exception, where: str = "") -> RecordError:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as uerr:
        return RecordError(Reason.INVALID_UTF8, f"{where}invalid UTF-8 at byte {uerr.start}")
    return RecordError(Reason.MALFORMED_JSON, f"{where}not JSON: {err}")


def _read_jsonl(src: Source, max_bytes: int | None) -> Iterator[Item]:
    opener = gzip.open if src.name.endswith(".gz") else open
    with opener(src.name, "rb") as f:
        for n, line in enumerate(f, start=1):
            if line.isspace():  # no copy, unlike strip(); blank lines are not records
                continue
            if max_bytes is not None and len(line) > max_bytes:
                yield Item(src.name, n, True, None, error=RecordError(
                    Reason.RECORD_TOO_LARGE, f"{len(line)} bytes, over the limit of {max_bytes}"))
                continue
            yield Item(src.name, n, True, line, raw=True)


def _too_large(obj: Any, max_bytes: int | None) -> RecordError | None:
    if max_bytes is None:
        return None
    try:
        size = len(orjson.dumps(obj, default=str))
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: the converters reject it with a reason
        return None
    if size > max_bytes:
        return RecordError(Reason.RECORD_TOO_LARGE, f"{size} bytes as JSON, over the limit of {max_bytes}")
    return None


def _read_json(src: Source, max_bytes: int | None) -> Iterator[Item]:
    data = Path(src.name).read_bytes()
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        first = data.lstrip().split(b"\n", 1)[0]
        if first.startswith(b"{") and _parses(first):  # JSON Lines under a .json name (common on the hub)
            yield from _read_jsonl(Source("jsonl", src.name), max_bytes)
            return
        yield Item(src.name, 0, False, None, error=_json_error(data, err, "whole file: "))
        return
    # One conversation: an object, or a bare list of messages (role-keyed or from/value dicts without a
    # conversation key).
    if isinstance(doc, list) and doc and all(isinstance(m, dict) and "conversations" not in m for m in doc):
        if all("role" in m and "messages" not in m for m in doc):
            doc = {"messages": doc}
        elif all("from" in m and "value" in m for m in doc):
            doc = {"conversations": doc}  # the same for ShareGPT turns
    records = doc if isinstance(doc, list) else [doc]
    for i, rec in enumerate(records):
        yield Item(src.name, i, False, rec, error=_too_large(rec, max_bytes))


def _parses(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _read_text(src: Source, max_bytes: int | None) -> Iterator[Item]:
    data = Path(src.name).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        yield Item(src.name, 0, False, None, error=RecordError(Reason.INVALID_UTF8, f"invalid UTF-8 at byte "
                                                               f"{err.start}"))
        return
    err = None
    if max_bytes is not None and len(data) > max_bytes:
        err = RecordError(Reason.RECORD_TOO_LARGE, f"{len(data)} bytes, over the limit of {max_bytes}")
    yield Item(src.name, 0, False, {"text": text}, error=err)


def _read_parquet(src: Source, max_bytes: int | None) -> Iterator[Item]:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(src.name)
    json_columns = _json_columns(file.schema_arrow)
    rows = (rec for batch in file.iter_batches(batch_size=1024) for rec in batch.to_pylist())
    for i, rec in enumerate(rows):
        record = _decode_json_columns(rec, json_columns)
        yield Item(src.name, i, False, record, error=_too_large(rec, max_bytes))


# Columns the converters read as a list of turns: a string there that holds a JSON list is that list, stored
# as text (a string column written with json.dumps, say). A string elsewhere may be the record's own text.
TURN_COLUMNS = ("messages", "conversations")
# Written as JSON text by our own Parquet writer: always decoded.
_ALWAYS_JSON = frozenset({"chat_template_kwargs"})


def _json_columns(schema) -> frozenset[str]:
    """The top-level columns that hold JSON text: the arrow.json extension type, or a `datasets` ``Json``
    feature (`datasets.Dataset.to_parquet` of rows whose values no one Arrow type holds)."""
    import pyarrow as pa

    names = {f.name for f in schema if isinstance(f.type, pa.JsonType)}
    try:
        features = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))["info"]["features"]
    except (KeyError, TypeError, ValueError):
        features = {}
    names.update(name for name, feature in features.items()
                 if isinstance(feature, dict) and feature.get("_type") == "Json")
    return _ALWAYS_JSON.union(names)


def _decode_json_columns(rec: dict, json_columns: frozenset[str] = _ALWAYS_JSON) -> dict:
    """Parquet written by us (or by `datasets` with ``Json``) reads back through pyarrow as JSON strings."""
    for key in (*json_columns, *TURN_COLUMNS):
        value = rec.get(key)
        if isinstance(value, str) and (key in json_columns or value.lstrip()[:1] == "["):
            try:
                decoded = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue  # left as text: the converter says what is wrong with it
            if key in json_columns or isinstance(decoded, list):
                rec[key] = decoded
    # Tool-call arguments stay JSON strings: every converter accepts those.
    tools = rec.get("tools")
    if isinstance(tools, list) and tools and all(isinstance(t, str) for t in tools):
        try:
            rec["tools"] = [orjson.loads(t) for t in tools]
        except orjson.JSONDecodeError:
            pass
    return rec


def _read_csv(src: Source, max_bytes: int | None) -> Iterator[Item]:
    """A CSV file with a header row, one record per row (`_csv_record`), streamed; a row that does not
    parse is a `malformed_row` reject and the file reads on. Positions are the row's first line (1-based)."""
    import csv
    import io

    csv.field_size_limit(2**31 - 1)  # a `messages` cell can be MBs; the per-record limit is max_bytes
    with open(src.name, "rb") as raw:
        # surrogateescape: a bad byte fails its own row (invalid_utf8), not the rest of the file
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")
        reader = csv.reader(text)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            yield Item(src.name, 1, True, None, error=RecordError(Reason.MALFORMED_ROW, f"CSV header: {err}"))
            return
        while True:
            line = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield Item(src.name, line, True, None, error=RecordError(Reason.MALFORMED_ROW, f"CSV row: {err}"))
                continue
            if not cells:
                continue
            item = Item(src.name, line, True, None)
            try:
                item.payload = _csv_record(header, cells)
                item.error = _too_large(item.payload, max_bytes)
            except RecordError as err:
                item.error = err
            yield item


def _csv_record(header: list[str], cells: list[str]) -> dict[str, Any]:
    """A CSV row as a record: empty cells are null; a cell holding a JSON array or object (a `messages` or
    `tools` column) is decoded, as a JSON column of Parquet is (`_decode_json_columns`)."""
    if len(cells) != len(header):
        raise RecordError(Reason.MALFORMED_ROW, f"CSV row has {len(cells)} fields, the header {len(header)}")
    record: dict[str, Any] = {}
    for key, cell in zip(header, cells, strict=True):
        try:
            cell.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RecordError(Reason.INVALID_UTF8, f"column {key!r}: invalid UTF-8") from err
        value: Any = cell if cell != "" else None
        if cell[:1] in ("[", "{"):
            try:
                value = orjson.loads(cell)
            except orjson.JSONDecodeError:
                pass  # text that starts with a bracket
        record[key] = value
    return _decode_json_columns(record)


def _read_arrow(src: Source, max_bytes: int | None) -> Iterator[Item]:
    """An Arrow IPC file (`datasets`' cache and shard files are the stream format; the file format too),
    memory-mapped and read batch by batch; JSON columns decoded as for Parquet."""
    import pyarrow as pa

    try:
        source = pa.memory_map(src.name)
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        json_columns = _json_columns(reader.schema)
        for i, rec in enumerate(rec for batch in batches for rec in batch.to_pylist()):
            record = _decode_json_columns(rec, json_columns)
            yield Item(src.name, i, False, record, error=_too_large(rec, max_bytes))
    except pa.ArrowInvalid as err:
        yield Item(src.name, 0, False, None, error=RecordError(Reason.MALFORMED_ROW, f"not Arrow IPC data: {err}"))


def _read_dataset(src: Source, max_bytes: int | None) -> Iterator[Item]:
    import datasets

    try:
        if src.kind == "disk":
            ds = datasets.load_from_disk(src.name)
        else:
            # A local hub-like directory is always streamed, never served from a stale Arrow cache: docs/training.md.
            local = Path(src.name).is_dir()
            ds = datasets.load_dataset(src.name, split=src.split, streaming=src.kind == "hub" and (src.streaming or local),
                                       **src.load_kwargs())
    except Exception as err:  # datasets raises many types; all of them mean "can't read this input"
        what = ("saved dataset" if src.kind == "disk" else "dataset directory" if Path(src.name).is_dir()
                else "not a local path, and as a hub dataset")
        options = "".join(f", {k}={v!r}" for k, v in src.load_kwargs().items())
        raise FatalError(f"{src.name}: {what} (split={src.split!r}{options}): cannot load: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}") from err
    if isinstance(ds, datasets.DatasetDict | datasets.IterableDatasetDict):
        if src.split not in ds:
            raise UsageError(f"{src.name}: no split {src.split!r} (splits: {', '.join(ds)}); "
                             "pick one with --dataset_train_split")
        ds = ds[src.split]
    for i, rec in enumerate(ds):
        yield Item(src.name, i, False, rec, error=_too_large(rec, max_bytes))


_READERS = {"jsonl": _read_jsonl, "json": _read_json, "text": _read_text, "parquet": _read_parquet,
            "csv": _read_csv, "arrow": _read_arrow, "disk": _read_dataset, "hub": _read_dataset}


def iter_items(sources: list[Source], *, max_bytes: int | None = None, limit: int | None = None) -> Iterator[Item]:
    """Every input record of every source, in order, at most `limit` in all."""
    n = 0
    for src in sources:
        try:
            for item in _READERS[src.kind](src, max_bytes):
                if limit is not None and n >= limit:
                    return
                yield item if src.columns is None else apply_columns(item, src.columns)
                n += 1
        except OSError as err:
            raise FatalError(f"{src.name}: {err.strerror or err}") from err
        if limit is not None and n >= limit:
            return


def beam_features():
    """`datasets.Features` of a Beam record, with the free-form parts as ``Json``."""
    from datasets import Features, Json, List, Value

    call = {"id": Value("string"), "type": Value("string"),
            "function": {"name": Value("string"), "arguments": Json()}}
    message = {"role": Value("string"), "content": Value("string"), "reasoning_content": Value("string"),
               "tool_calls": List(call), "name": Value("string"), "tool_call_id": Value("string")}
    return Features({"messages": List(message), "tools": List(Json()), "chat_template_kwargs": Json()})


def _storage_type(t):
    import pyarrow as pa

    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_storage_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _storage_type(f.type)) for f in t])
    return t


def arrow_row(rec: dict) -> dict:
    """A Beam record with its ``Json`` parts as JSON strings (the Arrow storage of that feature)."""
    msgs = []
    for m in rec["messages"]:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [
                {"id": c.get("id"), "type": c.get("type", "function"),
                 "function": {"name": c["function"]["name"],
                              "arguments": orjson.dumps(c["function"]["arguments"]).decode()}}
                for c in calls]}
        msgs.append(m)
    tools = rec.get("tools")
    return {"messages": msgs,
            "tools": [orjson.dumps(t).decode() for t in tools] if tools else None,
            "chat_template_kwargs": orjson.dumps(rec.get("chat_template_kwargs") or {}).decode()}


def normalize_record(record: dict[str, Any]) -> dict[str, Any]:
    """Undo what Arrow storage does to a Beam record, so the template sees the in-memory shape.

    Parquet / `datasets` storage may keep `tools`, `chat_template_kwargs` and tool-call `arguments` as JSON
    strings (heterogeneous keys do not survive struct inference) and fills absent struct fields with None."""
    out = dict(record)
    for key in ("tools", "chat_template_kwargs"):
        value = out.get(key)
        if isinstance(value, str):
            try:
                out[key] = json.loads(value) if value else None
            except json.JSONDecodeError as err:
                code = Reason.BAD_TOOL_SCHEMA if key == "tools" else Reason.BAD_CONTENT
                raise RecordError(code, f"{key} is a string but not valid JSON: {err}") from None
        if out.get(key) is None:
            out.pop(key, None)
    messages = []
    for message in out.get("messages") or []:
        message = {k: v for k, v in message.items() if v is not None}
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call = {k: v for k, v in call.items() if v is not None}
                function = dict(call.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    try:
                        function["arguments"] = json.loads(function["arguments"])
                    except json.JSONDecodeError as err:
                        raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"tool call arguments are not valid JSON: {err}",
                                          message_index=len(messages)) from None
                call["function"] = function
                calls.append(call)
            message["tool_calls"] = calls
        messages.append(message)
    out["messages"] = messages
    return out


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self.tmp = fresh_temporary(path)
        self.f = open(self.tmp, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by commit() or abort()

    def write_raw(self, line: bytes) -> None:
        """`line` is one record's JSON (orjson output), with or without its newline."""
        self.f.write(line if line.endswith(b"\n") else line + b"\n")

    def commit(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


class ArrowWriter:
    """Parquet, or a `save_to_disk` directory (written from a temporary Parquet file), batch by batch."""

    BATCH = 1000

    def __init__(self, path: Path, kind: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.kind = path, kind
        self.schema = beam_features().arrow_schema
        self.storage_schema = pa.schema([pa.field(f.name, _storage_type(f.type)) for f in self.schema],
                                        metadata=self.schema.metadata)
        self.tmp = fresh_temporary(path, ".parquet")
        self.writer = pq.ParquetWriter(self.tmp, self.schema)
        self.rows: list[dict] = []

    def write_raw(self, line: bytes) -> None:
        self.rows.append(arrow_row(orjson.loads(line)))
        if len(self.rows) >= self.BATCH:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self.rows:
            table = pa.Table.from_pylist(self.rows, schema=self.storage_schema).cast(self.schema)
            self.writer.write_table(table)
            self.rows = []

    def commit(self) -> None:
        self._flush()
        self.writer.close()
        if self.kind == "parquet":
            fsync_file(self.tmp)
            os.replace(self.tmp, self.path)
            return
        import datasets

        # The save_to_disk directory is built in a temporary directory beside the target and renamed into place.
        work = temporary_path(self.path, directory=True)
        try:
            ds = datasets.Dataset.from_parquet(str(self.tmp), cache_dir=str(work / "cache"),
                                               features=beam_features())
            ds.save_to_disk(str(work / "out"))
            del ds
            replace_dir(work / "out", self.path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            self.tmp.unlink(missing_ok=True)

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def open_writer(path: str):
    target, lower = Path(path), path.lower()
    kind = "jsonl" if lower.endswith(".jsonl") else "parquet" if lower.endswith(".parquet") else "disk"
    if kind == "disk" and lower.endswith((".json", ".ndjson", ".gz", ".txt", ".csv")):
        raise UsageError(f"{path}: output must be .jsonl, .parquet, or a directory for save_to_disk")
    if kind == "disk" and target.exists() and not target.is_dir():
        raise UsageError(f"{path}: exists and is not a directory")
    if kind != "disk" and target.is_dir():
        raise UsageError(f"{path}: is a directory")
    return JsonlWriter(target) if kind == "jsonl" else ArrowWriter(target, kind)


class JsonlSink(JsonlWriter):
    """A small atomic JSONL writer for side outputs (rejects)."""

    def __init__(self, path: str):
        if path.lower().endswith(".jsonl") and Path(path).is_dir():
            raise UsageError(f"{path}: is a directory")  # as `open_writer` says
        super().__init__(Path(path))

    def write(self, obj: Any) -> None:
        self.write_raw(orjson.dumps(obj))
