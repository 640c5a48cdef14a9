"""The training-data phase: source(s) + tokenizer + settings in, tokenized Arrow dataset(s) + counts out.

One flow, used by `scripts/train.py`, `beam-sft prepare` (and, for the convert stage, `beam-sft eval`)::

    read_chunks      raw rows -> memory-mapped Arrow files of CHUNK_ROWS records (raw JSON + provenance)
    convert_source   + batched `datasets.map` (num_proc): convert / validate  -> Beam records (JSON) + rejects
    build_prepared   per chunk: convert, then render (beam_sft.render.encoder), mask, truncate and count in a second
                     batched `datasets.map`; kept rows appended to the prepared directory's Arrow files
    prepare_data     build_prepared cached under a fingerprint, once per job (main process first)
    stream_training_data  the same conversion and tokenization on the fly (an IterableDataset)

Nothing holds the dataset as Python objects: every stage writes Arrow files and the next one memory-maps
them; counts come out of the maps as columns and are summed with `pyarrow.compute`.

Every input record ends up in exactly one place: a kept row, `rejects.jsonl` (with its source, line or index,
reason and message), or the "dropped by truncation" count; `prepare_data` checks that the numbers add up.
An unexpected exception while converting one record makes that record a reject with reason
`internal_error`, never a stopped run. An empty assistant mask stays a hard error naming the record: that
is a template defect that would silently train nothing.

The result of `prepare_data` is a *prepared directory*: the train split as a `save_to_disk` dataset
(`input_ids`, `labels`) at its root, an optional `eval/` split, `rejects.jsonl` and `beam_sft_manifest.json`
(what made it: tokenizer and template hashes, `max_length`, policy, sources, counts). `datasets.load_from_disk`
reads it as a plain pre-tokenized dataset, so plain TRL can train on it too.

Cache: `prepare_data` keeps prepared directories under `cache_dir` (default `$BEAM_SFT_PREPARED_CACHE`, else
`$HF_DATASETS_CACHE/beam_sft_prepared`, else `~/.cache/huggingface/datasets/beam_sft_prepared`), one per
fingerprint of (data files: path + size + mtime, format, split, max_records, tokenizer vocabulary, chat
template, max_length, truncation policy, assistant_only_loss, eval split and seed, code version). A second
run with the same inputs loads it; any change makes a new entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from beam_sft.dataset.reasoning_stats import KEYS as REASONING_KEYS
from beam_sft.dataset.reasoning_stats import reasoning_counts
from beam_sft.errors import FatalError, Reason, RecordError, UsageError, internal_error
from beam_sft.formats import FORMAT_NAMES

logger = logging.getLogger(__name__)

# Part of every cache fingerprint and manifest: bump when what this module writes could change.
DATA_VERSION = "1"
MANIFEST = "beam_sft_manifest.json"
REJECTS = "rejects.jsonl"
EVAL_DIR = "eval"
# "beam": records as convert-dataset writes them (validated); the rest are beam_sft.formats' converters.
FORMATS = ("beam", *FORMAT_NAMES)
# Manifest fields a prepared dataset must match before it trains (field -> what the run uses).
CHECKED_FIELDS = ("tokenizer", "chat_template", "max_length", "truncation_policy", "assistant_only_loss")

_RAW_BATCH = 2000  # rows per Arrow record batch while reading: a few MB in flight
# Records per chunk of `build_prepared`: the most that is ever memory-mapped at once (tens of MB of JSON).
CHUNK_ROWS = 5_000
_MAP_BATCH = 256  # rows per datasets.map batch: large enough for the encoder's batched tokenization


@dataclass(frozen=True)
class DataSettings:
    """What decides the prepared data, besides the sources and the tokenizer."""

    format: str = "auto"
    max_length: int | None = None
    truncation_policy: str = "turn"
    assistant_only_loss: bool = True
    split: str = "train"
    max_records: int | None = None
    eval_split_size: float = 0.0
    seed: int = 0
    missing_reasoning: str = "mask"  # beam_sft.validate.rules.MISSING_REASONING_CHOICES

    def check(self) -> None:
        from beam_sft.dataset.examples import TRUNCATION_POLICIES
        from beam_sft.validate.rules import MISSING_REASONING_CHOICES

        if self.missing_reasoning not in MISSING_REASONING_CHOICES:
            raise UsageError(f"unknown missing_reasoning {self.missing_reasoning!r}; choose one of "
                             f"{', '.join(MISSING_REASONING_CHOICES)}")

        if self.format not in FORMATS:
            raise UsageError(f"unknown format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.truncation_policy not in TRUNCATION_POLICIES:
            raise UsageError(f"unknown truncation policy {self.truncation_policy!r}; choose one of "
                             f"{', '.join(TRUNCATION_POLICIES)}")
        if self.max_length is not None and self.max_length < 1:
            raise UsageError("max_length must be at least 1")
        if self.max_records is not None and self.max_records < 0:
            raise UsageError("max_records must be >= 0")
        if self.eval_split_size < 0:
            raise UsageError("eval_split_size must be >= 0")


# --------------------------------------------------------------------------------------------------------
# Stage 1: raw rows -> Arrow


def _raw_schema():
    import pyarrow as pa

    return pa.schema([
        ("src", pa.int32()),  # index into the list of source names
        ("pos", pa.int64()),  # 1-based line (JSONL) or 0-based index
        ("by_line", pa.bool_()),
        ("payload", pa.large_binary()),  # the record's JSON, as read (may be invalid UTF-8: a reject later)
        ("error", pa.string()),  # a reader's RecordError as JSON [code, message_index, message], or null
    ])


def expand_sources(inputs: Sequence[str], split: str = "train"):
    """`beam_sft.records.files` sources of the inputs; in a directory, convert-dataset's rejects files are not data."""
    from beam_sft.records.files import expand_inputs

    out = []
    for spec in inputs:
        sources = expand_inputs([spec], split)
        if Path(spec).is_dir():
            sources = [s for s in sources if s.kind == "disk" or "rejects" not in Path(s.name).name]
            if not sources:
                raise UsageError(f"{spec}: no training data in this directory (only rejects files)")
        out.extend(sources)
    return out


def read_chunks(sources, work_dir: str | os.PathLike, *, chunk_rows: int | None = None, limit: int | None = None,
                progress: bool = False, prefix: str = "raw") -> Iterator[Any]:
    """The input records of `sources`, `chunk_rows` at a time, each chunk a memory-mapped Arrow dataset.

    Reads through `beam_sft.records.files.iter_items` (the readers `convert-dataset` uses), writing record batches as it
    goes; a chunk's file is written completely before it is yielded, the next one after the caller is done
    with it. Unreadable rows carry their `RecordError`. At least one (maybe empty) chunk is yielded.
    """
    import pyarrow as pa
    from datasets import Dataset
    from tqdm import tqdm

    from beam_sft.records.files import iter_items

    index = {s.name: i for i, s in enumerate(sources)}
    schema = _raw_schema()
    cols: dict[str, list] = {k: [] for k in schema.names}
    bar = tqdm(desc="reading", unit=" rec", disable=not progress or None, mininterval=0.5)
    items = iter_items(sources, limit=limit)
    n_chunk = 0
    done = False
    while not done:
        path = os.path.join(os.fspath(work_dir), f"{prefix}-{n_chunk:05d}.arrow")
        rows = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for item in items:
                cols["src"].append(index[item.source])
                cols["pos"].append(item.position)
                cols["by_line"].append(item.by_line)
                err = item.error
                if err is not None:
                    cols["payload"].append(None)
                    cols["error"].append(json.dumps([err.code.value, err.message_index, err.message]))
                else:
                    cols["payload"].append(item.payload if item.raw else orjson.dumps(item.payload, default=str))
                    cols["error"].append(None)
                rows += 1
                if len(cols["src"]) >= _RAW_BATCH:
                    _write_batch(writer, cols, schema)
                if rows == chunk_rows:
                    break
            else:
                done = True
            _write_batch(writer, cols, schema)
        bar.update(rows)
        if rows == 0 and n_chunk > 0:
            os.unlink(path)
            break
        yield Dataset.from_file(path)
        n_chunk += 1
    bar.close()


def _write_batch(writer, cols: dict[str, list], schema) -> None:
    import pyarrow as pa

    if cols["src"]:
        writer.write_batch(pa.record_batch([pa.array(cols[k], schema.field(k).type) for k in schema.names],
                                           schema=schema))
        for v in cols.values():
            v.clear()


def read_source(sources, work_dir: str | os.PathLike, *, limit: int | None = None, progress: bool = False):
    """Every input record of `sources` as one memory-mapped Arrow dataset; returns (dataset, names)."""
    return next(read_chunks(sources, work_dir, limit=limit, progress=progress)), [s.name for s in sources]


# --------------------------------------------------------------------------------------------------------
# Stage 2: convert + validate


def reject_entry(err: RecordError, source: str, pos: int, by_line: bool) -> dict[str, Any]:
    return {"source": source, ("line" if by_line else "index"): pos, "reason": err.code.value,
            "message_index": err.message_index, "message": err.message}


def convert_one(payload: bytes, fmt: str, missing_reasoning: str = "mask") -> dict[str, Any]:
    """One raw record (JSON bytes) -> a validated Beam record, or `RecordError`."""
    from beam_sft.dataset.examples import convert_row
    from beam_sft.records.files import parse_line

    return convert_row(parse_line(payload), fmt, missing_reasoning)


def _convert_batch(batch: dict[str, list], fmt: str, names: list[str], missing_reasoning: str = "mask") -> dict[str, list]:
    records, reasons, rejects = [], [], []
    for src, pos, by_line, payload, error in zip(batch["src"], batch["pos"], batch["by_line"], batch["payload"],
                                                  batch["error"], strict=True):
        try:
            if error is not None:
                code, index, message = json.loads(error)
                raise RecordError(code, message, message_index=index)
            rec = convert_one(payload, fmt, missing_reasoning)
            records.append(orjson.dumps(rec).decode())
            reasons.append(None)
            rejects.append(None)
            continue
        except RecordError as err:
            reject = err
        except Exception as exc:  # noqa: BLE001 - a converter bug: this record is a reject, the run goes on
            reject = internal_error(exc)
        records.append(None)
        reasons.append(reject.code.value)
        rejects.append(orjson.dumps(reject_entry(reject, names[src], pos, by_line)).decode())
    return {"record": records, "reason": reasons, "reject": rejects}


@dataclass
class Converted:
    """Validated Beam records (column `record`: JSON text; `src`/`pos`/`by_line`: provenance) and rejects."""

    records: Any  # datasets.Dataset
    rejects: Any  # datasets.Dataset with one column, `reject` (JSON text of a reject entry)
    names: list[str]
    records_in: int
    rejected: dict[str, int]
    rows: Any = None  # datasets.Dataset, one row per input record in input order: `record` or `reason`+`reject`

    def positions(self) -> Any:
        """0-based input positions of `records` (a numpy array: row i of `records` is input record
        positions[i]), for tools that name records as `--index` does."""
        import pyarrow.compute as pc

        return pc.indices_nonzero(pc.is_valid(self.rows.data.column("record"))).to_numpy()

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):
        """Beam records by position or slice, decoded only when asked for (a lazy `Sequence` of dicts)."""
        if isinstance(index, slice):
            return [orjson.loads(text) for text in self.records[index]["record"]]
        return orjson.loads(self.records[index]["record"])

    def iter_records(self, batch_size: int = 1000) -> Iterator[dict[str, Any]]:
        """The Beam records as dicts, batch by batch (never all at once)."""
        for batch in self.records.select_columns(["record"]).iter(batch_size=batch_size):
            for text in batch["record"]:
                yield orjson.loads(text)

    def provenance(self, row: dict[str, Any]) -> str:
        return f"{self.names[row['src']]}:{row['pos']}" if row["by_line"] else f"{self.names[row['src']]}[{row['pos']}]"

    def iter_rejects(self, batch_size: int = 1000) -> Iterator[dict[str, Any]]:
        for batch in self.rejects.iter(batch_size=batch_size):
            for text in batch["reject"]:
                yield orjson.loads(text)


def _value_counts(table_column) -> dict[str, int]:
    import pyarrow.compute as pc

    out = {}
    for entry in pc.value_counts(table_column).to_pylist():
        if entry["values"] is not None:
            out[entry["values"]] = entry["counts"]
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _not_null(column: str):
    return lambda batch: [v is not None for v in batch[column]]


def convert_source(
    inputs: Sequence[str] | str,
    work_dir: str | os.PathLike,
    *,
    format: str = "auto",
    split: str = "train",
    limit: int | None = None,
    num_proc: int | None = None,
    progress: bool = False,
    missing_reasoning: str = "mask",
) -> Converted:
    """Raw source(s) -> Arrow dataset of validated Beam records + rejects + counts (the convert-only stage).

    `inputs`: files, globs, directories, `save_to_disk` dirs or hub ids (as `convert-dataset` takes them).
    `format`: "beam" (records as `convert-dataset` writes them; Arrow artefacts undone, then validated) or a
    converter name / "auto". `work_dir` holds the Arrow files; the returned datasets memory-map them, so keep
    it until you are done with them. records_in = len(records) + sum(rejected.values()), always.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    if format not in FORMATS:
        raise UsageError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    sources = expand_sources(inputs, split)
    raw, names = read_source(sources, work_dir, limit=limit, progress=progress)
    converted = raw.map(
        _convert_batch, batched=True, batch_size=_MAP_BATCH, num_proc=_procs(num_proc, len(raw)),
        fn_kwargs={"fmt": format, "names": names, "missing_reasoning": missing_reasoning},
        remove_columns=["payload", "error"],
        desc="converting" if progress else None,
    )
    rejected = _value_counts(converted.data.column("reason"))
    records = converted.filter(_not_null("record"), batched=True, batch_size=5000) \
        .select_columns(["src", "pos", "by_line", "record"])
    rejects = converted.filter(_not_null("reject"), batched=True, batch_size=5000).select_columns(["reject"])
    out = Converted(records, rejects, names, len(raw), rejected, rows=converted)
    if len(records) + len(rejects) != len(raw):
        raise FatalError(f"bookkeeping error: {len(raw)} rows in != {len(records)} records + {len(rejects)} rejected")
    return out


def _procs(num_proc: int | None, n_rows: int) -> int | None:
    # A process pool costs more than it saves on a few hundred rows.
    return num_proc if num_proc and num_proc > 1 and n_rows >= 4 * _MAP_BATCH else None


# --------------------------------------------------------------------------------------------------------
# Stage 3: render, mask, truncate, count


def _tokenize_batch(batch, tokenizer, max_length, policy, assistant_only_loss, stop_ids, names):
    from beam_sft.dataset.examples import build_example
    from beam_sft.render.encoder import get_encoder

    keys = ("input_ids", "labels", "keep", "truncated", "dropped", "assistant_turns_cut", "n_supervised_return",
            "n_supervised_call")
    out: dict[str, list] = {k: [] for k in (*keys, "n_tokens", "n_supervised", "reason", "reject")}
    records = [orjson.loads(text) for text in batch["record"]]
    encoder = get_encoder(tokenizer)
    try:
        encoded: list = encoder.encode(records, None)
    except Exception:  # noqa: BLE001 - some record of the batch failed: find which, one by one
        encoded = []
        for record in records:  # find the culprits one by one; the others still train
            try:
                encoded.append(encoder.encode([record], None)[0])
            except RecordError as err:
                encoded.append(err)
            except Exception as exc:  # noqa: BLE001 - the template or encoder tripping on one record: a reject
                encoded.append(internal_error(exc))
    for src, pos, by_line, record, enc in zip(batch["src"], batch["pos"], batch["by_line"], records, encoded,
                                              strict=True):
        where = f"{names[src]}:{pos}" if by_line else f"{names[src]}[{pos}]"
        if isinstance(enc, RecordError):
            example = {"input_ids": [], "labels": [], "keep": False, "truncated": 0, "dropped": 0,
                       "assistant_turns_cut": 0, "n_supervised_return": 0, "n_supervised_call": 0}
            out["reason"].append(enc.code.value)
            out["reject"].append(orjson.dumps(reject_entry(enc, names[src], pos, by_line)).decode())
        else:
            example = build_example(
                tokenizer, record, encoded=(enc["input_ids"], enc["assistant_masks"]), max_length=max_length,
                policy=policy, assistant_only_loss=assistant_only_loss, stop_ids=stop_ids, where=where,
            )
            out["reason"].append(None)
            out["reject"].append(None)
        for k in keys:
            out[k].append(example[k])
        # Counted here, in the map (and its workers), so the totals are sums of small columns.
        out["n_tokens"].append(len(example["labels"]))
        out["n_supervised"].append(len(example["labels"]) - example["labels"].count(-100))
    return out


def _tokenized_features():
    from datasets import Features, List, Value

    return Features({
        "input_ids": List(Value("int32")), "labels": List(Value("int32")), "keep": Value("bool"),
        "truncated": Value("int32"), "dropped": Value("int32"), "assistant_turns_cut": Value("int32"),
        "n_supervised_return": Value("int32"), "n_supervised_call": Value("int32"), "n_tokens": Value("int64"),
        "n_supervised": Value("int64"), "reason": Value("string"), "reject": Value("string"),
    })


def token_counts(dataset, stop_ids: Sequence[int], batch_size: int = 4096) -> dict[str, int]:
    """Total / supervised tokens and trained stop tokens of a tokenized dataset, by Arrow compute, in batches."""
    import pyarrow.compute as pc

    counts = {"total_tokens": 0, "supervised_tokens": 0, "supervised_return": 0, "supervised_call": 0}
    for table in dataset.select_columns(["labels"]).with_format("arrow").iter(batch_size=batch_size):
        labels = pc.list_flatten(table.column("labels"))
        counts["total_tokens"] += len(labels)
        counts["supervised_tokens"] += int(pc.sum(pc.not_equal(labels, -100)).as_py() or 0)
        counts["supervised_return"] += int(pc.sum(pc.equal(labels, stop_ids[0])).as_py() or 0)
        counts["supervised_call"] += int(pc.sum(pc.equal(labels, stop_ids[1])).as_py() or 0)
    return counts


# --------------------------------------------------------------------------------------------------------
# Fingerprints and manifests


def short_hash(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


def vocab_hash(tokenizer) -> str:
    """A hash of what turns text into ids: the backend tokenizer (vocabulary, merges, added tokens) and specials."""
    backend = getattr(tokenizer, "_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return short_hash(f"{body}|{special}|{tokenizer.truncation_side}|{getattr(tokenizer, 'split_special_tokens', False)}")


def template_hash(tokenizer) -> str:
    return short_hash(json.dumps(tokenizer.chat_template, sort_keys=True))


def source_identity(sources) -> list[dict[str, Any]]:
    """What identifies the data without reading it: path, size and mtime of every file (hub ids: name + split)."""
    out = []
    for src in sources:
        if src.kind == "hub":
            out.append({"hub": src.name, "split": src.split})
            continue
        path = Path(src.name)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        out.append({"path": str(path.resolve()), "split": src.split if src.kind == "disk" else None,
                    "files": [[str(f.relative_to(path)) if path.is_dir() else f.name, f.stat().st_size,
                               f.stat().st_mtime_ns] for f in files]})
    return out


def tokenizer_files_hash(path: str | os.PathLike | None) -> str | None:
    """A hash of a local tokenizer directory's files, or None (a hub id): lets `beam-sft prepare` see that a
    prepared directory is up to date without loading the tokenizer."""
    if path is None:
        from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR

        path = DEFAULT_TOKENIZER_DIR
    directory = Path(path)
    if not directory.is_dir():
        return None
    h = hashlib.sha256()
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        h.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def run_fields(tokenizer, settings: DataSettings) -> dict[str, Any]:
    """The manifest fields a prepared dataset must match to train with this tokenizer and these settings."""
    return {"tokenizer": vocab_hash(tokenizer), "chat_template": template_hash(tokenizer),
            "max_length": settings.max_length, "truncation_policy": settings.truncation_policy,
            "assistant_only_loss": settings.assistant_only_loss}


def fingerprint(identity: Any, tokenizer, settings: DataSettings, extra: Any = None) -> str:
    from beam_sft.render.encoder import RENDER_VERSION

    parts = {"data_version": DATA_VERSION, "render_version": RENDER_VERSION, "sources": identity,
             "settings": asdict(settings), **run_fields(tokenizer, settings), "extra": extra}
    if not settings.eval_split_size:
        parts["settings"].pop("seed")  # the seed only matters to the eval split
    return short_hash(json.dumps(parts, sort_keys=True, default=str))


def default_cache_dir() -> str:
    if os.environ.get("BEAM_SFT_PREPARED_CACHE"):
        return os.environ["BEAM_SFT_PREPARED_CACHE"]
    from datasets import config

    return os.path.join(str(config.HF_DATASETS_CACHE), "beam_sft_prepared")


def read_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a prepared directory, or None when `path` is not one."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise FatalError(f"{file}: unreadable manifest: {err}") from err


def check_manifest(manifest: dict[str, Any], tokenizer, settings: DataSettings, where: str) -> None:
    """Fail with a message naming the first field where the prepared data and this run disagree."""
    want = run_fields(tokenizer, settings)
    for key in CHECKED_FIELDS:
        have = manifest.get(key)
        if have != want[key]:
            what = {"tokenizer": "tokenizer vocabulary", "chat_template": "chat template"}.get(key, key)
            raise UsageError(
                f"{where} was prepared with a different {what}: manifest field {key!r} is {have!r}, this run has "
                f"{want[key]!r}; run `beam-sft prepare` again with this run's settings, or match them"
            )


# --------------------------------------------------------------------------------------------------------
# Stage 4: the whole phase, cached


@dataclass
class Prepared:
    """The result of the data phase."""

    train: Any  # datasets.Dataset (input_ids, labels), memory-mapped
    eval: Any  # datasets.Dataset or None
    manifest: dict[str, Any]
    path: str  # the prepared directory
    action: str = "loaded"  # "tokenized" (this process built it) or "loaded"
    stats: dict[str, Any] = field(default_factory=dict)  # split -> PrepStats.to_dict()


def _split_sizes(n: int, size: float) -> int:
    n_eval = int(size) if size >= 1 else max(1, round(size * n))
    if n_eval >= n:
        raise UsageError(f"eval_split_size {size} leaves no training records ({n} in total)")
    return n_eval


def _eval_mask(n_train: int, settings: DataSettings):
    """Which of the `n_train` converted training records (in input order) the eval split holds out: seeded."""
    import numpy as np

    mask = np.zeros(n_train, dtype=bool)
    n_eval = _split_sizes(n_train, settings.eval_split_size)
    mask[np.random.default_rng(settings.seed).choice(n_train, size=n_eval, replace=False)] = True
    return mask


def eval_records(dataset_name: str, settings: DataSettings, work_dir: str | os.PathLike, *,
                 eval_dataset_name: str | None = None) -> Iterator[dict[str, Any]]:
    """The Beam records of the eval split that the data phase holds out for these settings, in order.

    For `scripts/train.py --eval_beam`, which generates from conversations, not from the tokenized split:
    the records of `eval_dataset_name` (its "test" split), or else the same seeded share of `dataset_name`'s
    converted records that `build_prepared` puts in `eval/`. Nothing when there is no eval split.
    """
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    if eval_dataset_name:
        yield from convert_source(eval_dataset_name, work_dir, format=settings.format, split="test").iter_records()
        return
    if settings.eval_split_size <= 0:
        return
    converted = convert_source(dataset_name, work_dir, format=settings.format, split=settings.split,
                               limit=settings.max_records)
    mask = _eval_mask(len(converted.records), settings)
    for held, record in zip(mask, converted.iter_records(), strict=True):
        if held:
            yield record


class _SplitWriter:
    """The kept rows of one split, written chunk by chunk as the Arrow files of a `save_to_disk` directory.

    Each chunk's rows go straight to their own file, so nothing is read back (or memory-mapped) to save it.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True)
        self.files: list[Path] = []
        self.rows = 0

    def write(self, table, is_eval: bool | None = None) -> None:
        """Append the kept rows of `table` (of the split `is_eval` says, when given), a slice at a time."""
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = _final_features().arrow_schema
        path = self.dir / f"part-{len(self.files):05d}.arrow"
        rows = 0
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for batch in table.to_batches(max_chunksize=1000):
                if is_eval is not None:
                    keep = batch.column("keep") if "keep" in batch.schema.names else None
                    mask = pc.equal(batch.column("is_eval"), is_eval)
                    batch = batch.filter(pc.and_(mask, keep))
                if batch.num_rows:
                    writer.write_batch(pa.RecordBatch.from_arrays([batch.column(n) for n in schema.names],
                                                                  schema=schema))
                    rows += batch.num_rows
        if rows == 0 and self.files:
            path.unlink()
            return
        self.files.append(path)
        self.rows += rows

    def commit(self, fingerprint: str) -> None:
        from datasets import Dataset

        if not self.files:
            self.write(_final_features().arrow_schema.empty_table())
        names = []
        for i, file in enumerate(self.files):
            names.append(f"data-{i:05d}-of-{len(self.files):05d}.arrow")
            os.replace(file, self.dir / names[-1])
        # dataset_info.json as datasets writes it (features included), from an empty dataset of the same features.
        empty = self.dir / ".empty"
        Dataset.from_dict({"input_ids": [], "labels": []}, features=_final_features()).save_to_disk(str(empty))
        os.replace(empty / "dataset_info.json", self.dir / "dataset_info.json")
        shutil.rmtree(empty)
        state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": fingerprint,
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        (self.dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))


def _final_features():
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})


def _tokenize_chunk(tokenizer, converted, settings: DataSettings, names, eval_rows, num_proc, progress):
    """Tokenize one converted chunk (rejected rows pass through as empty); returns the map's Arrow table."""
    from beam_sft.dataset.examples import stop_token_ids

    mapped = converted.map(
        _tokenize_chunk_batch, batched=True, batch_size=_MAP_BATCH, num_proc=_procs(num_proc, len(converted)),
        with_indices=True, remove_columns=converted.column_names, features=_chunk_features(),
        fn_kwargs={"tokenizer": tokenizer, "max_length": settings.max_length, "policy": settings.truncation_policy,
                   "assistant_only_loss": settings.assistant_only_loss, "stop_ids": stop_token_ids(tokenizer),
                   "names": names, "eval_rows": eval_rows},
        desc="tokenizing" if progress else None, load_from_cache_file=False,
    )
    return mapped


def _chunk_features():
    from datasets import Value

    features = _tokenized_features()
    features["converted"] = Value("bool")
    features["is_eval"] = Value("bool")
    return features


def _tokenize_chunk_batch(batch, indices, tokenizer, max_length, policy, assistant_only_loss, stop_ids, names,
                          eval_rows):
    present = [i for i, text in enumerate(batch["record"]) if text is not None]
    sub = {k: [batch[k][i] for i in present] for k in ("src", "pos", "by_line", "record")}
    done = _tokenize_batch(sub, tokenizer, max_length, policy, assistant_only_loss, stop_ids, names) if present \
        else {k: [] for k in _tokenized_features()}
    n = len(batch["record"])
    out: dict[str, list] = {k: [None] * n for k in _tokenized_features()}
    for j, i in enumerate(present):
        for k, column in out.items():
            column[i] = done[k][j]
    for i in range(n):
        if out["keep"][i] is None:  # a conversion reject (already in the rejects file): no row, no count
            for k, column in out.items():
                column[i] = [] if k in ("input_ids", "labels") else False if k == "keep" else None if k in (
                    "reason", "reject") else 0
    out["converted"] = [text is not None for text in batch["record"]]
    out["is_eval"] = [bool(eval_rows is not None and eval_rows[i]) for i in indices]
    return out


def _split_stats(table, mask) -> dict[str, int]:
    """PrepStats fields of the rows of `table` selected by `mask`: sums of the map's count columns."""
    import pyarrow.compute as pc

    part = table.select(["converted", "reason", "keep", "dropped", "truncated", "assistant_turns_cut", "n_tokens",
                         "n_supervised", "n_supervised_return", "n_supervised_call"]).filter(mask)

    def total(column) -> int:
        return int(pc.sum(part.column(column)).as_py() or 0)

    return {
        "records_in": int(pc.sum(pc.and_(part.column("converted"), pc.is_null(part.column("reason")))).as_py() or 0),
        "records_kept": total("keep"),
        "dropped_too_long": total("dropped"),
        "truncated": total("truncated"),
        "assistant_turns_cut": total("assistant_turns_cut"),
        "total_tokens": total("n_tokens"),
        "supervised_tokens": total("n_supervised"),
        "supervised_return": total("n_supervised_return"),
        "supervised_call": total("n_supervised_call"),
    }


def build_prepared(
    inputs: Sequence[str],
    tokenizer,
    settings: DataSettings,
    out_dir: str | os.PathLike,
    *,
    eval_inputs: Sequence[str] | None = None,
    num_proc: int | None = None,
    progress: bool = False,
    identity: Any = None,
    fingerprint: str | None = None,
    extra_manifest: dict[str, Any] | None = None,
    chunk_rows: int | None = None,
) -> dict[str, Any]:
    """Run the whole phase and write a prepared directory at `out_dir` (atomically). Returns its manifest.

    `eval_inputs`: separate eval data (split "test" of hub/disk datasets); else `settings.eval_split_size`
    holds out a seeded share of the converted records. Empty-mask records raise; every other bad record is a
    reject in `out_dir/rejects.jsonl`.

    Memory stays flat as the data grows: the input is cut into chunks of `chunk_rows` records (default
    `CHUNK_ROWS`); each chunk is converted (first pass, all chunks: that fixes the eval split), then tokenized
    and its kept rows appended to the output files (second pass), and its memory-mapped files are closed
    and deleted before the next one, so at most one chunk's pages are ever resident.
    """
    import numpy as np
    import pyarrow.compute as pc

    from beam_sft.dataset.examples import PrepStats
    from beam_sft.records.files import (
        JsonlSink,
        remove_stale_temporaries,
        replace_dir,
        temporary_path,
        write_json_atomic,
    )

    settings.check()
    chunk_rows = chunk_rows or CHUNK_ROWS
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Named like every other temporary output (beam_sft.records.files), so a run killed here is cleaned up by the next.
    remove_stale_temporaries(out)
    work = temporary_path(out, directory=True)
    started = time.time()
    final = work / "out"
    final.mkdir()
    rejects = JsonlSink(str(final / REJECTS))
    try:
        # Pass 1: read + convert every chunk; conversion rejects go to the rejects file as they come.
        parts = [(inputs, settings.split, settings.max_records, False)]
        if eval_inputs:
            parts.append((eval_inputs, "test", None, True))
        # converted files (several with num_proc), source names, is eval data, records converted
        chunks: list[tuple[list[Path], list[str], bool, int]] = []
        records_in, rejected, reasoning = 0, Counter(), Counter()
        for part_inputs, split, limit, is_eval in parts:
            sources = expand_sources(part_inputs, split)
            names = [src.name for src in sources]
            for raw in read_chunks(sources, work, chunk_rows=chunk_rows, limit=limit, progress=progress,
                                   prefix="eval" if is_eval else "train"):
                converted = raw.map(
                    _convert_batch, batched=True, batch_size=_MAP_BATCH, num_proc=_procs(num_proc, len(raw)),
                    fn_kwargs={"fmt": settings.format, "names": names, "missing_reasoning": settings.missing_reasoning},
                    remove_columns=["payload", "error"],
                    desc="converting" if progress else None, load_from_cache_file=False,
                )
                reasons = converted.data.column("reason")
                rejected.update(_value_counts(reasons))
                reasoning.update(reasoning_counts(converted.data.column("record")))
                for text in converted.data.column("reject").drop_null().to_pylist():
                    rejects.write(orjson.loads(text))
                records_in += len(raw)
                n_records = reasons.null_count  # no reason: converted
                kept_files = [Path(f["filename"]) for f in converted.cache_files]
                raw_file = Path(raw.cache_files[0]["filename"])
                del raw, converted, reasons  # closes the memory maps of this chunk
                raw_file.unlink()
                chunks.append((kept_files, names, is_eval, n_records))
        if not any(n for _, _, is_eval, n in chunks if not is_eval):
            raise UsageError(f"no usable training records in {', '.join(inputs)}: {records_in} read, "
                             f"{sum(rejected.values())} rejected ({dict(rejected)})")

        # The eval split: a seeded choice among the converted training records (one byte per record).
        eval_mask = None
        if not eval_inputs and settings.eval_split_size > 0:
            eval_mask = _eval_mask(sum(n for _, _, _, n in chunks), settings)

        # Pass 2: tokenize chunk by chunk, appending kept rows to the split files.
        from datasets import Dataset, concatenate_datasets

        writers = {"train": _SplitWriter(final / "train_parts")}
        if eval_inputs or eval_mask is not None:
            writers["eval"] = _SplitWriter(final / "eval_parts")
        totals = {name: Counter() for name in writers}
        offset = 0
        for paths, names, is_eval, n_records in chunks:
            converted = concatenate_datasets([Dataset.from_file(str(p)) for p in paths])
            eval_rows = None
            if eval_mask is not None:
                has_record = pc.is_valid(converted.data.column("record")).to_numpy(zero_copy_only=False)
                eval_rows = np.zeros(len(converted), dtype=bool)
                eval_rows[has_record] = eval_mask[offset: offset + n_records]
                offset += n_records
            elif is_eval:
                eval_rows = np.ones(len(converted), dtype=bool)
            mapped = _tokenize_chunk(tokenizer, converted, settings, names, eval_rows, num_proc, progress)
            table = mapped.data.table
            rejected.update(_value_counts(table.column("reason")))
            for text in table.column("reject").drop_null().to_pylist():
                rejects.write(orjson.loads(text))
            for name, writer in writers.items():
                totals[name].update(_split_stats(table, pc.equal(table.column("is_eval"), name == "eval")))
                writer.write(table, name == "eval")
            files = [Path(f["filename"]) for f in mapped.cache_files] + paths
            del converted, mapped, table
            for file in files:
                file.unlink(missing_ok=True)
        stats = {name: PrepStats(**{k: totals[name][k] for k in PrepStats().to_dict()}).to_dict() for name in writers}
        if stats["train"]["records_kept"] == 0:
            raise FatalError(f"the train split is empty after truncation ({stats['train']}); raise max_length")
        dropped = sum(s["dropped_too_long"] for s in stats.values())
        kept_total = sum(s["records_kept"] for s in stats.values())
        rejected_total = sum(rejected.values())
        if records_in != kept_total + rejected_total + dropped:
            raise FatalError(f"bookkeeping error: {records_in} records in != {kept_total} kept + {rejected_total} "
                             f"rejected + {dropped} dropped by truncation")
        rejects.commit()
        rejects = None
        for name, writer in writers.items():
            writer.commit(f"{fingerprint or 'prepared'}-{name}")
        # The train split at the root (load_from_disk(DIR) is the training set), the eval split in eval/.
        for file in (final / "train_parts").iterdir():
            os.replace(file, final / file.name)
        (final / "train_parts").rmdir()
        if "eval" in writers:
            os.replace(final / "eval_parts", final / EVAL_DIR)
        manifest = {
            "beam_sft_prepared": DATA_VERSION,
            "fingerprint": fingerprint,
            **run_fields(tokenizer, settings),
            "format": settings.format,
            "split": settings.split,
            "max_records": settings.max_records,
            "eval_split_size": settings.eval_split_size if not eval_inputs else None,
            "seed": settings.seed,
            "inputs": list(inputs),
            "eval_inputs": list(eval_inputs) if eval_inputs else None,
            "sources": identity,
            "counts": {
                "records_in": records_in,
                "records_kept": kept_total,
                "rejected_total": rejected_total,
                "rejected": dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
                "dropped_too_long": dropped,
                **{key: sum(s[key] for s in stats.values()) for key in (
                    "truncated", "assistant_turns_cut", "total_tokens", "supervised_tokens", "supervised_return",
                    "supervised_call")},
                "reasoning": {key: reasoning[key] for key in REASONING_KEYS},
            },
            "missing_reasoning": settings.missing_reasoning,
            "splits": stats,
            "seconds": round(time.time() - started, 3),
            **(extra_manifest or {}),
        }
        # Written last: a directory with a manifest is complete.
        write_json_atomic(str(final / MANIFEST), manifest)
        replace_dir(final, out)
        return manifest
    finally:
        if rejects is not None:
            rejects.abort()
        shutil.rmtree(work, ignore_errors=True)


def load_prepared(path: str | os.PathLike, tokenizer=None, settings: DataSettings | None = None) -> Prepared:
    """A prepared directory, memory-mapped; with `tokenizer`+`settings`, checked against them first."""
    from datasets import load_from_disk

    manifest = read_manifest(path)
    if manifest is None:
        raise UsageError(f"{path}: not a prepared dataset (no {MANIFEST}); make one with `beam-sft prepare`")
    if tokenizer is not None and settings is not None:
        check_manifest(manifest, tokenizer, settings, str(path))
    train = load_from_disk(str(path))
    eval_ds = load_from_disk(str(Path(path) / EVAL_DIR)) if (Path(path) / EVAL_DIR).is_dir() else None
    return Prepared(train, eval_ds, manifest, str(path), "loaded", dict(manifest.get("splits") or {}))


def _record_action(record_dir: str | os.PathLike | None, rank: int, action: str, path: str, fp: str) -> None:
    """One small file per rank saying what its data phase did (tests and operators read it)."""
    if record_dir is None:
        return
    os.makedirs(record_dir, exist_ok=True)
    with open(os.path.join(record_dir, f"data_phase.rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "action": action, "path": path, "fingerprint": fp}, f)


def prepare_data(
    inputs: Sequence[str] | str,
    tokenizer,
    settings: DataSettings,
    *,
    eval_inputs: Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    num_proc: int | None = None,
    record_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> Prepared:
    """The data phase of a training job: raw data -> tokenized, memory-mapped datasets + counts, once per job.

    `inputs` is raw data (converted and tokenized here, cached under a fingerprint in `cache_dir`) or one
    prepared directory (checked against `tokenizer` and `settings`, then loaded as is; a positive
    `settings.eval_split_size` then holds out a seeded share of its rows). In a distributed job the main
    process builds the cache first; the other ranks load it (on other nodes too when `cache_dir` is shared;
    otherwise each node's local main process builds it once). `record_dir` gets `data_phase.rank<N>.json`.
    """
    from accelerate import PartialState

    if isinstance(inputs, str):
        inputs = [inputs]
    state = PartialState()
    if len(inputs) == 1 and read_manifest(inputs[0]) is not None:
        if settings.max_records is not None:
            raise UsageError(f"{inputs[0]} is a prepared dataset: max_records applies to raw data (prepare it with "
                             "`beam-sft prepare --limit N`)")
        prepared = load_prepared(inputs[0], tokenizer, settings)
        prepared.action = "loaded"
        if settings.eval_split_size > 0 and not eval_inputs:
            if prepared.eval is not None:
                raise UsageError(f"{inputs[0]} already holds an eval split; drop eval_split_size")
            from beam_sft.dataset.examples import stop_token_ids

            n_eval = _split_sizes(len(prepared.train), settings.eval_split_size)
            # Indices in memory: identical on every rank (same seed) and no cache file races on shared storage.
            parts = prepared.train.train_test_split(test_size=n_eval, seed=settings.seed, keep_in_memory=True)
            prepared.train, prepared.eval = parts["train"], parts["test"]
            stops = stop_token_ids(tokenizer)
            prepared.stats = {name: {"records_kept": len(ds), **token_counts(ds, stops)}
                              for name, ds in (("train", prepared.train), ("eval", prepared.eval))}
        elif eval_inputs:
            raise UsageError("a prepared dataset trains with the eval split it was prepared with; prepare the eval "
                             "data into it (or train from raw data)")
        _record_action(record_dir, state.process_index, "loaded", str(inputs[0]), prepared.manifest["tokenizer"])
        return prepared

    settings.check()
    sources = expand_sources(inputs, settings.split)
    identity = {"train": source_identity(sources)}
    if eval_inputs:
        identity["eval"] = source_identity(expand_sources(eval_inputs, "test"))
    fp = fingerprint(identity, tokenizer, settings)
    root = Path(cache_dir or default_cache_dir())
    path = root / f"prepared-{fp}"
    action = "loaded"

    def build_if_missing() -> None:
        nonlocal action
        if read_manifest(path) is None:
            logger.info("preparing data into %s", path)
            build_prepared(inputs, tokenizer, settings, path, eval_inputs=eval_inputs, num_proc=num_proc,
                           progress=progress, identity=identity, fingerprint=fp)
            action = "tokenized"
        else:
            logger.info("loading prepared data from cache %s", path)

    failure = None
    with state.main_process_first():
        if state.is_main_process:
            try:
                build_if_missing()
            except BaseException as err:  # noqa: BLE001 - re-raised below, after the other ranks know
                failure = err
    if state.num_processes > 1:
        # The other ranks must not redo a build that failed on the main process (and must not hang).
        from accelerate.utils import broadcast_object_list

        ok = broadcast_object_list([failure is None])[0]
        if not ok and failure is None:
            raise FatalError("the main process failed to prepare the training data (see its error)")
    if failure is not None:
        raise failure
    # Ranks on other nodes: their local main process builds it when the cache is not on shared storage.
    with state.local_main_process_first():
        if not state.is_main_process:
            build_if_missing()
    prepared = load_prepared(path)
    prepared.action = action
    _record_action(record_dir, state.process_index, action, str(path), fp)
    return prepared


# --------------------------------------------------------------------------------------------------------
# For scripts/train.py


def training_datasets(
    dataset_name: str,
    tokenizer,
    settings: DataSettings,
    *,
    eval_dataset_name: str | None = None,
    cache_dir: str | None = None,
    num_proc: int | None = None,
    output_dir: str | None = None,
    is_main_process: bool = True,
    streaming: bool = False,
    world_size: int = 1,
) -> tuple[Any, Any, dict[str, Any]]:
    """The data phase of `scripts/train.py`: (train, eval or None, stats), logged and checked.

    On the main process the rejects go to `output_dir/rejects.jsonl` (the log shows the first few) and the
    counts to `output_dir/data_stats.json`; every rank writes `output_dir/data_phase.rank<N>.json`.
    `streaming`: `stream_training_data` instead (nothing cached, rejects in `output_dir/rejects.rank<N>.jsonl`).
    """
    from beam_sft.dataset.reasoning_stats import notes
    from beam_sft.records.files import atomic_output, write_json_atomic

    if streaming:
        train = stream_training_data(dataset_name, tokenizer, settings, world_size=world_size, rejects_dir=output_dir)
        eval_ds = None
        if eval_dataset_name:
            eval_ds = stream_training_data(eval_dataset_name, tokenizer, replace(settings, split="test",
                                           max_records=None), world_size=world_size, rejects_dir=output_dir)
        logger.info("data: streaming %s (converted and tokenized on the fly, %d shards)", dataset_name, train.n_shards)
        return train, eval_ds, {}
    prepared = prepare_data(dataset_name, tokenizer, settings, eval_inputs=[eval_dataset_name] if eval_dataset_name
                            else None, cache_dir=cache_dir, num_proc=num_proc, record_dir=output_dir)
    counts = prepared.manifest.get("counts", {})
    logger.info("data: %s (%s)", prepared.path, "built now" if prepared.action == "tokenized" else "from cache")
    if counts:
        logger.info("data: %d records in, %d kept, %d rejected %s, %d dropped by truncation", counts["records_in"],
                    counts["records_kept"], counts["rejected_total"], counts["rejected"], counts["dropped_too_long"])
    for note in notes(counts.get("reasoning"), prepared.manifest.get("missing_reasoning"), counts.get("rejected", {})):
        logger.warning(note)
    if counts.get("rejected", {}).get(Reason.INTERNAL_ERROR.value):
        logger.warning("!!! %d records failed with an unexpected error (reason internal_error): a converter bug; "
                       "see rejects.jsonl", counts["rejected"][Reason.INTERNAL_ERROR.value])
    from beam_sft.dataset.examples import PrepStats

    for name, split in prepared.stats.items():
        if "records_in" in split:
            logger.info(PrepStats(**split).summary(name))
        else:
            logger.info("%s: %s", name, split)
    train_stats = prepared.stats["train"]
    if settings.assistant_only_loss and train_stats["supervised_return"] + train_stats["supervised_call"] == 0:
        raise FatalError("no <|return|> or <|call|> token is trained in this data: the model could not learn to stop")
    if is_main_process and output_dir is not None:
        os.makedirs(output_dir, exist_ok=True)
        rejects = Path(prepared.path) / REJECTS
        if rejects.is_file() and os.path.abspath(output_dir) != os.path.abspath(prepared.path):
            with atomic_output(Path(output_dir) / REJECTS) as tmp:
                shutil.copyfile(rejects, tmp)
            with open(rejects, "rb") as f:
                for _, line in zip(range(5), f, strict=False):
                    logger.warning("rejected: %s", line.decode().rstrip())
        write_json_atomic(os.path.join(output_dir, "data_stats.json"),
                          {**prepared.stats, "data": {"path": prepared.path, "action": prepared.action, **counts}})
    return prepared.train, prepared.eval, prepared.stats


# --------------------------------------------------------------------------------------------------------
# Streaming: for data larger than the disk


def _stream_rows(shard: list[int], sources: tuple, n_shards: int, limit: int | None, names: tuple):
    """Raw rows of the given shards: shard s holds input records s, s + n_shards, s + 2 n_shards, ..."""
    from beam_sft.records.files import iter_items

    index = {name: i for i, name in enumerate(names)}
    wanted = set(shard)
    for i, item in enumerate(iter_items(list(sources), limit=limit)):
        if i % n_shards not in wanted:
            continue  # another rank's record: skipped before parsing, converting or tokenizing
        err = item.error
        yield {"src": index[item.source], "pos": item.position, "by_line": item.by_line,
               "payload": None if err else (item.payload if item.raw else orjson.dumps(item.payload, default=str)),
               "error": json.dumps([err.code.value, err.message_index, err.message]) if err else None}


class StreamRejects:
    """Filter of a streamed dataset: keeps converted records, appends the rejected ones to a per-rank file.

    The rank is read when the first batch arrives (the filter runs in the training process or its data
    workers), so the same object serves every rank.
    """

    def __init__(self, directory: str | os.PathLike | None, column: str = "reject") -> None:
        self.directory = None if directory is None else os.fspath(directory)
        self.column = column
        # A stream is read again every epoch; each reject is written once. Rejects are few: the set stays small.
        self.seen: set[str] = set()

    def __call__(self, batch: dict[str, list]) -> list[bool]:
        lines = [text for text in batch[self.column] if text is not None and text not in self.seen]
        self.seen.update(lines)
        if lines and self.directory is not None:
            rank = os.environ.get("RANK", "0")
            os.makedirs(self.directory, exist_ok=True)
            with open(os.path.join(self.directory, f"rejects.rank{rank}.jsonl"), "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        for line in lines:
            logger.warning("rejected: %s", line)
        return [text is None for text in batch[self.column]]


def stream_training_data(
    inputs: Sequence[str] | str,
    tokenizer,
    settings: DataSettings,
    *,
    world_size: int = 1,
    shards_per_rank: int = 1,
    rejects_dir: str | os.PathLike | None = None,
):
    """Raw data -> a `datasets.IterableDataset` of `input_ids` + `labels`, converted and tokenized on the fly.

    Nothing is written but rejects (`rejects_dir/rejects.rank<N>.jsonl`, as they are met): for data that does
    not fit on the disk, or to start training at once. The stream has `world_size * shards_per_rank` shards,
    shard s holding every (world_size * shards_per_rank)-th record from s, so a split by node (what accelerate's
    dataloader does to a `datasets.IterableDataset` with `IterableDataset.shard`, the shard path of
    `datasets.distributed.split_dataset_by_node`) gives each rank its own records before they are parsed,
    converted or tokenized. Each rank still reads the input bytes once. The same truncation policy, masks
    and empty-mask error as `prepare_data`; records the template rejects are rejects too. Counts are not known
    ahead (use `beam-sft prepare` for them), so there is no eval split and `max_steps` must be set.
    """
    from datasets import Features, IterableDataset, Value

    from beam_sft.dataset.examples import stop_token_ids

    if isinstance(inputs, str):
        inputs = [inputs]
    settings.check()
    if settings.eval_split_size:
        raise UsageError("streaming has no eval split (eval_split_size): pass eval_dataset_name, or prepare the data")
    sources = expand_sources(inputs, settings.split)
    names = tuple(s.name for s in sources)
    n_shards = max(1, world_size) * max(1, shards_per_rank)
    raw_features = Features({"src": Value("int32"), "pos": Value("int64"), "by_line": Value("bool"),
                             "payload": Value("large_binary"), "error": Value("string")})
    raw = IterableDataset.from_generator(
        _stream_rows, features=raw_features,
        gen_kwargs={"shard": list(range(n_shards)), "sources": tuple(sources), "n_shards": n_shards,
                    "limit": settings.max_records, "names": names},
    )
    converted = raw.map(_convert_batch, batched=True, batch_size=_MAP_BATCH, remove_columns=["payload", "error"],
                        fn_kwargs={"fmt": settings.format, "names": list(names),
                                   "missing_reasoning": settings.missing_reasoning})
    converted = converted.filter(StreamRejects(rejects_dir), batched=True, batch_size=_MAP_BATCH)
    converted = converted.select_columns(["src", "pos", "by_line", "record"])
    tokenized = converted.map(
        _tokenize_batch, batched=True, batch_size=_MAP_BATCH, remove_columns=["src", "pos", "by_line", "record"],
        features=_tokenized_features(),
        fn_kwargs={"tokenizer": tokenizer, "max_length": settings.max_length, "policy": settings.truncation_policy,
                   "assistant_only_loss": settings.assistant_only_loss, "stop_ids": stop_token_ids(tokenizer),
                   "names": list(names)},
    )
    tokenized = tokenized.filter(StreamRejects(rejects_dir), batched=True, batch_size=_MAP_BATCH)
    kept = tokenized.filter(lambda batch: batch["keep"], batched=True, batch_size=_MAP_BATCH)
    return kept.select_columns(["input_ids", "labels"])
