"""The stages of the data phase, each a batched pass over memory-mapped Arrow files::

    read_chunks      raw rows -> memory-mapped Arrow files of CHUNK_ROWS records (raw JSON + provenance)
    convert_source   + batched `datasets.map` (num_proc): convert / validate  -> Beam records (JSON) + rejects
    _tokenize_batch  Beam records -> rendered (beam_sft.render.encoder), masked, truncated and counted rows

Nothing holds the dataset as Python objects: every stage writes Arrow files and the next one memory-maps
them; counts come out of the maps as columns and are summed with `pyarrow.compute`. An unexpected exception
while converting or rendering one record makes that record a reject with reason `internal_error`, never a
stopped run. An empty assistant mask stays a hard error naming the record: that is a template defect that
would silently train nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from beam_sft.errors import FatalError, RecordError, UsageError, internal_error, reject_entry
from beam_sft.records.files import data_sources
from beam_sft.validate.convert import INPUT_FORMATS

_RAW_BATCH = 2000  # rows per Arrow record batch while reading: a few MB in flight
# Records per chunk of `build_prepared`: the most that is ever memory-mapped at once (tens of MB of JSON).
CHUNK_ROWS = 5_000
_MAP_BATCH = 256  # rows per datasets.map batch: large enough for the encoder's batched tokenization


def _raw_schema():
    import pyarrow as pa

    return pa.schema([
        ("src", pa.int32()),  # index into the list of source names
        ("pos", pa.int64()),  # 1-based line (JSONL) or 0-based index
        ("by_line", pa.bool_()),
        ("payload", pa.large_binary()),  # the record's JSON, as read (may be invalid UTF-8: a reject later)
        ("error", pa.string()),  # a reader's RecordError as JSON [code, message_index, message], or null
    ])



def read_chunks(sources, work_dir: str | os.PathLike, *, chunk_rows: int | None = None, limit: int | None = None,
                progress: bool = False, prefix: str = "raw", items=None, own=None) -> Iterator[Any]:
    """The input records of `sources`, `chunk_rows` at a time, each chunk a memory-mapped Arrow dataset.

    Reads through `beam_sft.records.files.iter_items` (the readers `convert-dataset` uses), writing record batches as it
    goes; a chunk's file is written completely before it is yielded, the next one after the caller is done
    with it. Unreadable rows carry their `RecordError`. At least one (maybe empty) chunk is yielded.
    `own(n)` False: chunk n is another shard's (`beam-sft prepare --shard`): its rows are counted through, not
    written, and None is yielded in its place, so every shard numbers the chunks alike.
    """
    import pyarrow as pa
    from datasets import Dataset
    from tqdm import tqdm

    from beam_sft.records.files import iter_items

    index = {s.name: i for i, s in enumerate(sources)}
    schema = _raw_schema()
    cols: dict[str, list] = {k: [] for k in schema.names}
    bar = tqdm(desc="reading", unit=" rec", disable=not progress or None, mininterval=0.5)
    # `items`: the rows to read when not all of `sources` (a mixture's taken rows, beam_sft.dataset.mixture)
    items = iter_items(sources, limit=limit) if items is None else items
    n_chunk = 0
    done = False
    while not done:
        if own is not None and not own(n_chunk):
            rows = 0
            for _ in items:  # a JSONL line is not even parsed: another shard converts it
                rows += 1
                if rows == chunk_rows:
                    break
            else:
                done = True
            bar.update(rows)
            if rows == 0 and n_chunk > 0:
                break
            yield None
            n_chunk += 1
            continue
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
                    cols["payload"].append(item.json())
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



def _convert_batch(batch: dict[str, list], fmt: str, names: list[str], as_dicts: bool = False,
                   missing_reasoning: str = "mask", with_counts: bool = False,
                   with_keys: bool = False) -> dict[str, Any]:
    """`as_dicts`: the records as the converter returned them (still checked to serialise), for a caller
    that tokenizes them right away instead of storing their JSON (`beam_sft.dataset.workers`).
    `missing_reasoning`: the validator's policy (mask | keep | reject). `with_counts`: `reasoning` in the
    result holds the kept records' `reasoning_stats.reasoning_counts` (not a column: `datasets.map` callers
    leave it off). `with_keys`: `key` holds each kept record's (`key`, reasoning counts) for deduplication
    (`beam_sft.records.dedup`), None for a reject; the records' reasoning is then counted per row there."""
    from beam_sft.dataset.reasoning_stats import reasoning_counts
    from beam_sft.records.dedup import record_key
    from beam_sft.validate.convert import try_convert
    from beam_sft.validate.rules import Options

    # per source (a mixture, beam_sft.dataset.mixture): lists indexed by `src`
    options = {policy: Options(missing_reasoning=policy) for policy in
               ([missing_reasoning] if isinstance(missing_reasoning, str) else set(missing_reasoning))}
    records, reasons, rejects, kept, keys = [], [], [], [], []
    for src, pos, by_line, payload, error in zip(batch["src"], batch["pos"], batch["by_line"], batch["payload"],
                                                  batch["error"], strict=True):
        if error is not None:
            code, index, message = json.loads(error)
            rec, reject = None, RecordError(code, message, message_index=index)
        else:
            rec, _, reject = try_convert(payload, fmt if isinstance(fmt, str) else fmt[src], options[
                missing_reasoning if isinstance(missing_reasoning, str) else missing_reasoning[src]], raw=True)
        if reject is None:
            try:
                text = orjson.dumps(rec)
            except (TypeError, orjson.JSONEncodeError) as exc:  # a record no file could hold costs only itself
                reject = internal_error(exc)
            else:
                records.append(rec if as_dicts else text.decode())
                kept.append(rec)
                if with_keys:
                    keys.append((record_key(rec), tuple(reasoning_counts([rec]).values())))
                reasons.append(None)
                rejects.append(None)
                continue
        records.append(None)
        if with_keys:
            keys.append(None)
        reasons.append(reject.code.value)
        rejects.append(orjson.dumps(reject_entry(reject, names[src], pos, by_line)).decode())
    out: dict[str, Any] = {"record": records, "reason": reasons, "reject": rejects}
    if with_counts:
        out["reasoning"] = reasoning_counts(kept)
    if with_keys:
        out["key"] = keys
    return out



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
    converter name / "auto". `missing_reasoning`: the validator's policy (mask | keep | reject). `work_dir` holds the Arrow files; the returned datasets memory-map them, so keep
    it until you are done with them. records_in = len(records) + sum(rejected.values()), always.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    if format not in INPUT_FORMATS:
        raise UsageError(f"unknown format {format!r}; choose one of {', '.join(INPUT_FORMATS)}")
    sources = data_sources(inputs, split)
    raw, names = read_source(sources, work_dir, limit=limit, progress=progress)
    converted = raw.map(
        _convert_batch, batched=True, batch_size=_MAP_BATCH, num_proc=_procs(num_proc, len(raw)),
        fn_kwargs={"fmt": format, "names": names, "missing_reasoning": missing_reasoning},
        remove_columns=["payload", "error"], desc="converting" if progress else None,
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


def _tokenize_batch(batch, tokenizer, max_length, policy, assistant_only_loss, stop_ids, names, *,
                    with_labels: bool = True):
    """Render, mask, truncate and count a batch of Beam records (`batch["record"]`: dicts or JSON texts).

    `with_labels=False` (`beam_sft.dataset.workers`, which builds a whole batch's labels at once in Arrow):
    the rows carry the truncated `mask` instead of `labels`, and no supervised-token counts."""
    from beam_sft.dataset.examples import build_example, fit_example
    from beam_sft.render.encoder import encode_each, get_encoder

    keys = ("input_ids", "labels" if with_labels else "mask", "keep", "truncated", "dropped", "assistant_turns_cut")
    counted = ("n_tokens", "n_supervised", "n_supervised_return", "n_supervised_call") if with_labels else ()
    out: dict[str, list] = {k: [] for k in (*keys, *counted, "reason", "reject")}
    # JSON text from a converted chunk file, or dicts straight from `_convert_batch(as_dicts=True)`.
    records = [text if type(text) is dict else orjson.loads(text) for text in batch["record"]]
    encoded = encode_each(get_encoder(tokenizer), records)
    for src, pos, by_line, record, enc in zip(batch["src"], batch["pos"], batch["by_line"], records, encoded,
                                              strict=True):
        if isinstance(enc, RecordError):
            example = {"input_ids": [], "labels": [], "mask": [], "keep": False, "truncated": 0, "dropped": 0,
                       "assistant_turns_cut": 0, "n_supervised_return": 0, "n_supervised_call": 0}
            out["reason"].append(enc.code.value)
            out["reject"].append(orjson.dumps(reject_entry(enc, names[src], pos, by_line)).decode())
        else:
            where = f"{names[src]}:{pos}" if by_line else f"{names[src]}[{pos}]"
            if with_labels:
                example = build_example(
                    tokenizer, record, encoded=(enc["input_ids"], enc["assistant_masks"]), max_length=max_length,
                    policy=policy, assistant_only_loss=assistant_only_loss, stop_ids=stop_ids, where=where,
                )
            else:
                ids, mask, example = fit_example(enc["input_ids"], enc["assistant_masks"], max_length=max_length,
                                                 policy=policy, where=where)
                example.update(input_ids=ids, mask=mask, keep=not example["dropped"])
            out["reason"].append(None)
            out["reject"].append(None)
        for k in keys:
            out[k].append(example[k])
        if with_labels:
            # Counted here, in the map (and its workers), so the totals are sums of small columns.
            out["n_tokens"].append(len(example["labels"]))
            out["n_supervised"].append(len(example["labels"]) - example["labels"].count(-100))
            out["n_supervised_return"].append(example["n_supervised_return"])
            out["n_supervised_call"].append(example["n_supervised_call"])
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
