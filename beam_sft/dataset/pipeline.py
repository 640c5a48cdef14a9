"""The data pipeline's core, which every driver runs: raw rows -> Beam records -> `input_ids` + `labels`, in
batches, and the ordered pool (docs/prepare.md#how-a-run-works)."""

from __future__ import annotations

import gc
import json
import os
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, fields
from itertools import count, starmap
from pathlib import Path
from typing import Any

import orjson

from beam_sft.dataset.examples import Counts, fit_example, label_batch
from beam_sft.dataset.origins import origins_schema, shard_origins_path
from beam_sft.dataset.reasoning_stats import KEYS, REASONING_REJECTS, reasoning_counts
from beam_sft.dataset.settings import DataSettings
from beam_sft.errors import RecordError, internal_error, reject_entry, where
from beam_sft.records.dedup import Seen, record_key, text_key
from beam_sft.records.files import data_sources, iter_items
from beam_sft.storage import arrow_array
from beam_sft.template.tokenizer import stop_token_ids
from beam_sft.validate.rules import Options

RAW_BATCH = 2000  # rows per Arrow record batch while reading: a few MB in flight
# Records per chunk of `PrepareRun`: the most that is ever memory-mapped at once (tens of MB of JSON).
CHUNK_ROWS = 5_000
# Rows per encoder call: large enough for the encoder's batched tokenization, small enough to keep the
# Python lists of one batch small.
BATCH_ROWS = 256
# Allocations between young-generation collections while records stream (`_frozen`); CPython's default is 700.
GC_THRESHOLD = 100_000
MAX_DEFAULT_PROCS = 32  # past this the main process (reading, rejects) is the bottleneck anyway

# tokenize_batch's per-row count columns -> PrepStats fields (the token counts come from the shard writer)
SUMMED = {"dropped": "dropped_too_long", "truncated": "truncated", "assistant_turns_cut": "assistant_turns_cut"}


def default_num_proc() -> int:
    """The cores this process may run on (its CPU affinity), at most MAX_DEFAULT_PROCS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_PROCS))


@dataclass
class Job:
    """What every task of one run shares (sent to each worker once)."""

    tokenizer: Any
    fmt: Any  # a format name, or one per source (a mixture)
    max_length: int | None
    policy: str
    assistant_only_loss: bool
    stop_ids: list[int]
    missing_reasoning: Any = "mask"  # a policy, or one per source (a mixture)
    dedup: bool = False  # exact deduplication (beam_sft.records.dedup): keys and per-row counts sent back
    tool_call_checks: str = "reject"  # the validator's policy for records eval would score as failures

    @classmethod
    def of(cls, tokenizer, settings) -> Job:
        return cls(tokenizer, settings.format, settings.max_length, settings.truncation_policy,
                   settings.assistant_only_loss, list(stop_token_ids(tokenizer)), settings.missing_reasoning,
                   settings.dedup, settings.tool_call_checks)


@dataclass
class Task:
    """One chunk: `raw` to convert, `converted` to tokenize (`raw` and `tokenize`: both); `eval_rows` (a bool
    per row) sends rows to the eval split; `shards`: split -> the Arrow file of this chunk's kept rows."""

    index: int
    names: list[str]
    raw: str | None = None
    converted: str | None = None
    convert_to: str | None = None  # convert only: where the converted chunk goes
    tokenize: bool = True
    eval_rows: Any = None  # numpy bool array or None
    all_eval: bool = False  # every row goes to the eval split (separate eval data)
    shards: dict[str, str] = field(default_factory=dict)
    skip_rows: Any = None  # numpy bool array or None: duplicates (decided by the main process), not tokenized
    formats: list[str] | None = None  # per source (a mixture), else Job.fmt
    policies: list[str] | None = None  # per source missing_reasoning (a mixture), else Job.missing_reasoning
    groups: list[int] | None = None  # per source, its mixture entry: recorded for each eval row (Result.eval_sources)


@dataclass(slots=True)  # one per converted record of a chunk with dedup: no __dict__ each
class Row:
    """One record's part of a Result: where it went (a shard row, a reject, or neither: too long)."""

    key: int
    src: int
    pos: int
    by_line: bool
    reasoning: tuple[int, int, int]
    split: str = "train"
    shard_row: int = -1
    reject: int = -1  # index into Result.rejects
    index: int = -1  # row of the chunk (convert-only tasks)
    stats: dict[str, int] = field(default_factory=dict)


@dataclass
class Result(Counts):
    """What a task sends back (counts, rejects as JSON texts in row order, shards); summed, a run's totals."""

    index: int
    records_in: int = 0  # raw rows read (convert tasks)
    n_records: int = 0  # rows converted (convert tasks)
    rejected: Counter = field(default_factory=Counter)
    rejects: list[str] = field(default_factory=list)
    stats: dict[str, Counter] = field(default_factory=dict)
    shards: dict[str, str] = field(default_factory=dict)  # split -> file, only where rows were written
    reasoning: Counter = field(default_factory=Counter)  # beam_sft.dataset.reasoning_stats.KEYS, converted rows
    # With Job.dedup, one Row per converted record this chunk did not already hold (in row order): what the
    # main process needs to decide duplicates across chunks and to take a duplicate back out of the counts.
    rows: list[Row] = field(default_factory=list)
    # With Task.groups: the mixture entry of each row written to the eval shard, in shard order.
    eval_sources: list[int] = field(default_factory=list)
    # The fewest tokens of a record the truncation policy dropped (None: none dropped): the max_length that
    # keeps at least one, for the message of a run that keeps none (beam_sft.dataset.drops).
    shortest_dropped: int | None = None

    def reject(self, reason: str, entry: str, row: Row | None = None) -> None:
        """Count a reject and keep its JSON entry (`row`, with dedup: the record it came from)."""
        self.rejected[reason] += 1
        self.rejects.append(entry)
        if row is not None:
            row.reject = len(self.rejects) - 1

    def counts(self) -> dict[str, Any]:
        return {k: v for k, v in super().counts().items() if k not in ("index", "shortest_dropped")}

    def add(self, other: Result) -> None:
        """Add another result's counts (a run's totals: its chunks' results, in input order)."""
        super().add(other)
        self.dropped(other.shortest_dropped)
        self.eval_sources.extend(other.eval_sources)
        for split, counts in other.stats.items():
            self.stats.setdefault(split, Counter()).update(counts)

    def dropped(self, length: int | None) -> None:
        """A record of `length` tokens was dropped as too long (None: nothing)."""
        if length is not None and (self.shortest_dropped is None or length < self.shortest_dropped):
            self.shortest_dropped = length

    def to_json(self) -> dict[str, Any]:
        """The result as JSON (a `beam-sft prepare --shard` run keeps one per chunk for the merge to replay);
        `shards` then holds file names, relative to the shard's split directories."""
        row_fields = [f.name for f in fields(Row)]
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rows"}
        return {**data, "shards": {k: os.path.basename(v) for k, v in self.shards.items()},
                "rows": [[getattr(r, name) for name in row_fields] for r in self.rows]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(**{**data, "rejected": Counter(data["rejected"]), "reasoning": Counter(data["reasoning"]),
                      "stats": {k: Counter(v) for k, v in data["stats"].items()},
                      "rows": [Row(*row[:4], tuple(row[4]), *row[5:]) for row in data["rows"]]})


# --- Reading ---


def arrow_schema(*columns: str):
    import pyarrow as pa

    types = {"src": pa.int32(), "pos": pa.int64(), "by_line": pa.bool_(),
             "payload": pa.large_binary(),  # the record's JSON, as read (may be invalid UTF-8: a reject later)
             "error": pa.string(),  # a reader's RecordError as JSON [code, message_index, message], or null
             "record": pa.string(), "input_ids": pa.list_(pa.int32()), "labels": pa.list_(pa.int32())}
    return pa.schema([(name, types[name]) for name in columns])


RAW_COLUMNS = ("src", "pos", "by_line", "payload", "error")
CONVERTED_COLUMNS = ("src", "pos", "by_line", "record")


def raw_row(item, index: dict[str, int]) -> dict[str, Any]:
    """An input item (`beam_sft.records.files.iter_items`) as a raw row; `index`: source name -> `src`."""
    err = item.error
    return {"src": index[item.source], "pos": item.position, "by_line": item.by_line,
            "payload": None if err else item.json(),
            "error": json.dumps([err.code.value, err.message_index, err.message]) if err else None}


def read_chunks(names: list[str], items: Iterable[Any], prefix: str | os.PathLike, *, chunk_rows: int | None = None,
                own: Callable[[int], bool] | None = None, progress: bool = False) -> Iterator[str | None]:
    """The input `items` (`iter_items` of the sources `names`), `chunk_rows` at a time, each chunk an Arrow
    file (`prefix-00000.arrow`, ...) written before it is yielded; at least one (maybe empty) chunk. `own(n)`
    False: chunk n is another shard's: its rows are counted through, not written, and None yielded for it."""
    from tqdm import tqdm

    index = {name: i for i, name in enumerate(names)}
    schema = arrow_schema(*RAW_COLUMNS)
    items = iter(items)
    with tqdm(desc="reading", unit=" rec", disable=not progress or None, mininterval=0.5) as bar:
        for n_chunk in count():
            mine = own is None or own(n_chunk)
            path = f"{os.fspath(prefix)}-{n_chunk:05d}.arrow"
            rows, cols = 0, {k: [] for k in RAW_COLUMNS}
            with stream_writer(path if mine else os.devnull, schema) as writer:
                for item in items:
                    rows += 1
                    if mine:  # another shard's JSONL line is not even parsed: that shard converts it
                        for key, value in raw_row(item, index).items():
                            cols[key].append(value)
                        if len(cols["src"]) >= RAW_BATCH:
                            _write_columns(writer, cols, schema)
                    if rows == chunk_rows:
                        break
                _write_columns(writer, cols, schema)
            bar.update(rows)
            if rows == 0 and n_chunk > 0:
                if mine:
                    os.unlink(path)
                return
            yield path if mine else None
            if rows != chunk_rows:  # the input ran out
                return


@contextmanager
def stream_writer(path: str, schema) -> Iterator[Any]:
    import pyarrow as pa

    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        yield writer


def _write_columns(writer, cols: dict[str, list], schema) -> None:
    """Write the rows in `cols` (the schema's columns, and maybe others) as one record batch, and empty them."""
    import pyarrow as pa

    if cols[schema.names[0]]:
        writer.write_batch(pa.record_batch([arrow_array(cols[k], schema.field(k).type) for k in schema.names],
                                           schema=schema))
        for v in cols.values():
            v.clear()


def open_stream(path: str):
    """An Arrow stream file of the pipeline (a chunk or a shard), memory-mapped."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(path, "r"))


# --- Converting, tokenizing, labelling: one batch at a time ---


def convert_batch(batch: dict[str, list], fmt: Any, names: list[str], missing_reasoning: Any = "mask", *,
                  as_dicts: bool = False, dedup: bool = False, tool_call_checks: str = "reject") -> dict[str, Any]:
    """Raw rows (`RAW_COLUMNS`) -> `record` (None for a reject), `reason` and `reject` (its JSON entry), and
    the kept records' `reasoning_counts` as `reasoning`. `fmt` and `missing_reasoning` are one value, or one
    per source (a mixture: lists indexed by `src`). `as_dicts`: the records as the converter returned them
    (still checked to serialise), for a caller that tokenizes them right away, else their JSON text. `dedup`:
    `key` holds each kept record's (key, reasoning counts), None for a reject (reasoning counted per row)."""
    from beam_sft.validate.convert import try_convert

    per_source = not isinstance(missing_reasoning, str)
    options = {policy: Options(missing_reasoning=policy, tool_call_checks=tool_call_checks) for policy in
               (set(missing_reasoning) if per_source else [missing_reasoning])}
    out: dict[str, list] = {"record": [], "reason": [], "reject": [], "key": []}
    kept = []
    rejected_reasoning: Counter = Counter()  # the assistant turns of the records rejected for want of reasoning
    keep = Options(missing_reasoning="keep")  # such records converted again: their turns count in coverage
    # Records handed on as dicts: their serialisation check writes the sorted JSON the dedup key hashes.
    sort = orjson.OPT_SORT_KEYS if dedup and as_dicts else None
    for src, pos, by_line, payload, error in zip(*(batch[k] for k in RAW_COLUMNS), strict=True):
        if error is not None:
            code, index, message = json.loads(error)
            rec, reject = None, RecordError(code, message, message_index=index)
        else:
            rec, _, reject = try_convert(payload, fmt if isinstance(fmt, str) else fmt[src], options[
                missing_reasoning[src] if per_source else missing_reasoning], raw=True)
        if reject is None:
            try:
                text = orjson.dumps(rec, option=sort)
            except (TypeError, orjson.JSONEncodeError) as exc:  # a record no file could hold costs only itself
                reject = internal_error(exc)
            else:
                out["record"].append(rec if as_dicts else text.decode())
                kept.append(rec)
                if dedup:
                    out["key"].append((text_key(text) if sort else record_key(rec),
                                       tuple(reasoning_counts([rec]).values())))
                out["reason"].append(None)
                out["reject"].append(None)
                continue
        if reject.code.value in REASONING_REJECTS:
            again, _, err = try_convert(payload, fmt if isinstance(fmt, str) else fmt[src], keep, raw=True)
            if err is None:
                counts = reasoning_counts([again])
                rejected_reasoning.update(rejected_assistant_turns=counts["assistant_turns"],
                                          rejected_without_reasoning=counts["without_reasoning"])
        out["record"].append(None)
        out["key"].append(None)
        out["reason"].append(reject.code.value)
        out["reject"].append(orjson.dumps(reject_entry(reject, names[src], pos, by_line)).decode())
    out["reasoning"] = {} if dedup else reasoning_counts(kept)
    out["rejected_reasoning"] = rejected_reasoning
    return out


def tokenize_batch(batch: dict[str, list], job: Job, names: list[str]) -> dict[str, list]:
    """Render, mask, truncate and count a batch of Beam records (`batch["record"]`: dicts or JSON texts, with
    `src`, `pos`, `by_line`): the columns of `out`, `reason` + `reject` for a record the template rejects."""
    from beam_sft.render.encoder import encode_each, get_encoder

    out: dict[str, list] = {k: [] for k in ("input_ids", "mask", "keep", "truncated", "dropped",
                                            "assistant_turns_cut", "length", "reason", "reject")}
    # JSON text from a converted chunk file, or dicts straight from `convert_batch(as_dicts=True)`.
    records = [text if type(text) is dict else orjson.loads(text) for text in batch["record"]]
    encoded = encode_each(get_encoder(job.tokenizer), records)
    for src, pos, by_line, enc in zip(batch["src"], batch["pos"], batch["by_line"], encoded, strict=True):
        if isinstance(enc, RecordError):
            example = {"input_ids": [], "mask": [], "keep": False, "truncated": 0, "dropped": 0,
                       "assistant_turns_cut": 0, "length": 0, "reason": enc.code.value,
                       "reject": orjson.dumps(reject_entry(enc, names[src], pos, by_line)).decode()}
        else:
            ids, mask, example = fit_example(enc["input_ids"], enc["assistant_masks"], max_length=job.max_length,
                                             policy=job.policy, where=where(names[src], pos, by_line))
            example.update(input_ids=ids, mask=mask, keep=not example["dropped"],
                           length=len(enc["input_ids"]), reason=None, reject=None)
        for k, column in out.items():
            column.append(example[k])
    return out


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


# --- One task ---


class _TaskRun:
    """One chunk's task as it runs (`run_task`): its result, and its kept rows per split, in an Arrow stream
    file opened when the first row comes, their origins beside it (`beam_sft.dataset.origins`)."""

    def __init__(self, task: Task, job: Job) -> None:
        self.task, self.job, self.result = task, job, Result(task.index)
        self.files = ExitStack()
        self.open: dict[str, tuple[Any, Any]] = {}  # split -> (writer, origins writer)
        self.rows: Counter = Counter()  # rows written per split so far
        self.stats = self.result.stats = {split: Counter() for split in task.shards}

    def batches(self) -> Iterator[dict[str, list]]:
        """The chunk's rows as column dicts of BATCH_ROWS rows (`record` None for a conversion reject)."""
        task, job, result = self.task, self.job, self.result
        for batch in open_stream(task.raw or task.converted):
            for start in range(0, batch.num_rows, BATCH_ROWS):
                cols = batch.slice(start, BATCH_ROWS).to_pydict()
                if task.raw is None:
                    yield cols
                    continue
                # Tokenized right here: the records need not go through JSON text again.
                out = convert_batch(cols, task.formats or job.fmt, task.names,
                                    task.policies or job.missing_reasoning, as_dicts=task.tokenize,
                                    dedup=job.dedup, tool_call_checks=job.tool_call_checks)
                result.reasoning.update(out["reasoning"])
                result.reasoning.update(out["rejected_reasoning"])
                result.records_in += len(cols["src"])
                for reason, reject in zip(out["reason"], out["reject"], strict=True):
                    if reason is not None:
                        result.reject(reason, reject)
                result.n_records += len(out["record"]) - sum(r is not None for r in out["reason"])
                yield {"src": cols["src"], "pos": cols["pos"], "by_line": cols["by_line"],
                       "record": out["record"], "key": out["key"]}

    def keyed(self) -> Iterator[dict[str, list]]:
        """The batches as they pass, each converted record given its Row (convert-only tasks with dedup)."""
        index = 0
        for cols in self.batches():
            first = len(self.result.rows)
            rows = zip(cols["key"], cols["src"], cols["pos"], cols["by_line"], strict=True)
            for key, src, pos, by_line in rows:
                if key is not None:
                    self.result.rows.append(Row(key[0], src, pos, by_line, key[1], index=index))
                index += 1
            self._count_reasoning(first)
            yield cols

    def _count_reasoning(self, first: int) -> None:
        """The reasoning of the rows from `first` on, counted a batch at once."""
        if rows := self.result.rows[first:]:
            sums = map(sum, zip(*(row.reasoning for row in rows)))
            self.result.reasoning.update(dict(zip(KEYS, sums, strict=True)))

    def tokenize(self, run_seen) -> None:
        task = self.task
        seen = Seen() if self.job.dedup and task.raw is not None else None
        seens = (seen,) if seen is None or run_seen is None else (seen, run_seen)
        row = 0
        with self.files:
            for cols in self.batches():
                present = [i for i, text in enumerate(cols["record"]) if text is not None
                           and (task.skip_rows is None or not task.skip_rows[row + i])]
                rows: list[Row | None] = [None] * len(present)
                if seen is not None:
                    first = len(self.result.rows)
                    present = self._unique(cols, present, seens)
                    rows = self.result.rows[first:]
                if present:
                    self._tokenize_present(cols, present, rows, row)
                row += len(cols["record"])
        self.result.shards = {split: task.shards[split] for split in self.open}

    def _unique(self, cols: dict[str, list], present: list[int], seens: tuple) -> list[int]:
        """With dedup: the rows of `present` that this chunk has not met yet (the others become `duplicate`
        rejects here, before tokenizing), each given its Row. `seens`: this chunk's first occurrences, and, in
        the main process of a single run, the run's (an earlier chunk's record is then a `duplicate` here, not
        taken out of a written shard afterwards: the same checks in the same order, the same outputs)."""
        names, result = self.task.names, self.result
        unique, first = [], len(result.rows)
        for i in present:
            key, reasoning = cols["key"][i]
            src, pos, by_line = cols["src"][i], cols["pos"][i], cols["by_line"][i]
            for n, seen in enumerate(seens):
                dup = seen.check(key, names[src], pos, by_line)
                if dup is not None:
                    entry = reject_entry(dup, names[src], pos, by_line)
                    result.reject(dup.code.value, orjson.dumps(entry).decode())
                    result.n_records -= n  # "less duplicates" of earlier chunks, as `PrepareRun` counts them
                    break
            if dup is not None:
                continue
            result.rows.append(Row(key, src, pos, by_line, reasoning))
            unique.append(i)
        self._count_reasoning(first)
        return unique

    def _tokenize_present(self, cols, present: list[int], rows: list, row: int) -> None:
        """Tokenize the batch's rows `present` and write the kept ones to their split's shard."""
        task, result = self.task, self.result
        sub = {k: [cols[k][i] for i in present] for k in CONVERTED_COLUMNS}
        done = tokenize_batch(sub, self.job, task.names)
        kept: dict[str, tuple[list, list, list, list]] = {split: ([], [], [], []) for split in task.shards}
        for j, i in enumerate(present):
            held = task.all_eval or (task.eval_rows is not None and task.eval_rows[row + i])
            split = "eval" if held else "train"
            if done["reason"][j] is not None:
                result.reject(done["reason"][j], done["reject"][j], rows[j])
                continue
            counts = {"records_in": 1, **{key: done[column][j] for column, key in SUMMED.items()}}
            stats = self.stats[split]
            for key, value in counts.items():  # Counter.update's Mapping check costs more, once a record
                stats[key] += value
            if rows[j] is not None:
                rows[j].split, rows[j].stats = split, counts
            if done["dropped"][j]:
                result.dropped(done["length"][j])
            if done["keep"][j]:
                ids, masks, kept_rows, origins = kept[split]
                ids.append(done["input_ids"][j])
                masks.append(done["mask"][j])
                kept_rows.append(rows[j])
                origins.append((sub["src"][j], sub["pos"][j], sub["by_line"][j]))
                if split == "eval" and task.groups is not None:
                    result.eval_sources.append(task.groups[sub["src"][j]])
        for split, (ids, masks, kept_rows, origins) in kept.items():
            if ids:
                self._write(split, ids, masks, origins, kept_rows)

    def _write(self, split: str, ids: list[list[int]], masks: list[list[int]], origins: list[tuple],
               rows: list[Row | None]) -> None:
        """Write rows (ids and assistant masks: the labels are made here) and their origins; count them."""
        import pyarrow as pa

        if split not in self.open:
            path = self.task.shards[split]
            writer = self.files.enter_context(stream_writer(path, arrow_schema("input_ids", "labels")))
            sidecar = self.files.enter_context(stream_writer(shard_origins_path(path), origins_schema()))
            self.open[split] = (writer, sidecar)
        input_ids, labels, counts, per_row = label_batch(ids, masks, self.job.assistant_only_loss, self.job.stop_ids,
                                                         per_row=self.job.dedup)
        self.open[split][0].write_batch(pa.record_batch([input_ids, labels], names=["input_ids", "labels"]))
        origin_columns = dict(zip(origins_schema().names, map(list, zip(*origins, strict=True)), strict=True))
        _write_columns(self.open[split][1], origin_columns, origins_schema())
        for n, (row, row_counts) in enumerate(zip(rows, per_row or [None] * len(rows), strict=True)):
            if row is not None:
                row.shard_row = self.rows[split] + n
                row.stats.update(records_kept=1, **row_counts)
        self.rows[split] += len(ids)
        self.stats[split].update({"records_kept": len(ids), **counts})


def run_task(task: Task, job: Job, run_seen=None) -> Result:
    """Run one chunk's task (in a worker or in the main process). `run_seen`: the run's first occurrences
    (`beam_sft.records.dedup.Seen`), for a tokenizing task in the main process (see `_TaskRun._unique`)."""
    run = _TaskRun(task, job)
    if task.tokenize:
        run.tokenize(run_seen)
        return run.result
    schema = arrow_schema(*CONVERTED_COLUMNS)
    with stream_writer(task.convert_to, schema) as writer:
        for cols in run.keyed() if job.dedup else run.batches():
            _write_columns(writer, cols, schema)
    return run.result


# --- The ordered pool ---

_JOB: Job | None = None


def _init_worker(job: Job) -> None:
    global _JOB
    from beam_sft.render.encoder import get_encoder

    _JOB = job
    get_encoder(job.tokenizer)  # once per worker (inherited ready-made where the process forked)
    gc.freeze()  # see _frozen
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


def _run_in_worker(task: Task) -> Result:
    return run_task(task, _JOB)


def ordered_map(function: Callable, args: Iterable[tuple], num_proc: int | None, *, init: tuple = (None, ()),
                start_method: str | None = None, ahead: int = 2) -> Iterator[Any]:
    """`function(*a)` for each `a` of `args`, in their order, computed by `num_proc` long-lived processes (or
    this one: `num_proc` None or 1). `init`: (initializer, its arguments), run once per process. `args` is read
    at most `ahead * num_proc` ahead of the result waited for (`Pool.imap` would read the whole input ahead)."""
    initializer, initargs = init
    if in_process(num_proc):
        if initializer is not None:
            initializer(*initargs)
        yield from starmap(function, args)
        return
    import multiprocessing

    context = multiprocessing.get_context(start_method or _start_method())
    with context.Pool(num_proc, initializer=initializer, initargs=initargs) as pool:
        pending: deque = deque()
        for a in args:
            pending.append(pool.apply_async(function, a))
            if len(pending) >= ahead * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def run_tasks(tasks: Iterable[Task], job: Job, num_proc: int | None, run_seen=None) -> Iterator[Result]:
    """The results of `tasks`, in their order (`ordered_map`), the encoder built before the workers fork, so
    they inherit it. `run_seen` reaches the tasks only when they run in this process (`in_process`)."""
    from beam_sft.render.encoder import get_encoder

    get_encoder(job.tokenizer)
    with _frozen():
        if in_process(num_proc):
            yield from (run_task(task, job, run_seen) for task in tasks)
            return
        yield from ordered_map(_run_in_worker, ((task,) for task in tasks), num_proc, init=(_init_worker, (job,)))


def in_process(num_proc: int | None) -> bool:
    """Whether `run_tasks` runs its tasks in this process."""
    return not num_proc or num_proc <= 1


@contextmanager
def _frozen() -> Iterator[None]:
    """The cyclic GC kept out of the way while the records stream through (docs/prepare.md, The cyclic GC)."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _start_method() -> str:
    """fork where it is safe (workers inherit the encoder ready-made); spawn in a process that has initialised
    CUDA (a training job that loaded its model first): a forked CUDA context is unusable."""
    import multiprocessing
    import sys

    torch = sys.modules.get("torch")
    cuda = torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized()
    return "fork" if "fork" in multiprocessing.get_all_start_methods() and not cuda else "spawn"


# --- Shard files ---


def drop_rows(path: str, rows: list[int]) -> bool:
    """Rewrite a shard and its origins file without `rows` (duplicates found after it was written), a record
    batch at a time; False when nothing is left (the files are then gone)."""
    import numpy as np

    drop = np.asarray(sorted(rows), dtype=np.int64)
    origins = shard_origins_path(path)
    written = _drop_from(path, drop)
    if os.path.exists(origins) and _drop_from(origins, drop) != written:
        raise RuntimeError(f"{origins}: not the rows of {path}")
    return written > 0


def _drop_from(path: str, drop) -> int:
    """Rewrite the Arrow stream file `path` without the rows `drop` (sorted); the rows left (none: removed)."""
    import numpy as np
    import pyarrow as pa

    written = start = 0
    # Read into buffers a batch at a time, not memory-mapped: a mapped shard's pages stay resident while it is
    # read through, so the peak RSS grew by a shard (tens of MB) on the first cross-chunk duplicate, measured.
    with pa.OSFile(path) as source:
        reader = pa.ipc.open_stream(source)
        with stream_writer(path + ".tmp", reader.schema) as writer:
            for batch in reader:
                keep = np.ones(batch.num_rows, dtype=bool)
                here = drop[(drop >= start) & (drop < start + batch.num_rows)] - start
                keep[here] = False
                start += batch.num_rows
                if keep.any():
                    writer.write_batch(batch.filter(arrow_array(keep, pa.bool_())))
                    written += int(keep.sum())
    if not written:
        os.unlink(path + ".tmp")
        os.unlink(path)
        return 0
    os.replace(path + ".tmp", path)
    return written


def shard_path(directory: Path, index: int) -> str:
    return str(directory / f"part-{index:05d}.arrow")


# --- Converted records, for tools that read them (inspect --stats, eval_records) ---


class Converted:
    """The Beam records of some sources, converted by the pipeline's convert-only task into one Arrow file that
    stays memory-mapped: a lazy `Sequence` of dicts (decoded only when asked for), with the rejects."""

    def __init__(self, path: str, names: list[str], result: Result) -> None:
        import pyarrow.compute as pc

        self.names = names
        self.records_in = result.records_in
        self.rejected = dict(sorted(result.rejected.items(), key=lambda kv: (-kv[1], kv[0])))
        self.rejects = result.rejects
        self.table = open_stream(path).read_all()
        valid = pc.is_valid(self.table.column("record")).to_numpy(zero_copy_only=False)
        self.rows = valid.nonzero()[0]  # record i is input record rows[i] (0-based, as --index names them)
        self.reject_rows = (~valid).nonzero()[0]  # rejects[k] is input record reject_rows[k]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [orjson.loads(text) for text in self.table.column("record").take(self.rows[index]).to_pylist()]
        return orjson.loads(self.table.column("record")[int(self.rows[index])].as_py())

    def iter_records(self, batch_size: int = 1000) -> Iterator[dict[str, Any]]:
        """The Beam records as dicts, batch by batch (never all at once)."""
        for start in range(0, len(self), batch_size):
            yield from self[start:start + batch_size]

    def iter_rejects(self) -> Iterator[dict[str, Any]]:
        yield from map(orjson.loads, self.rejects)


def convert_records(inputs: Sequence[str] | str, work_dir: str | os.PathLike, settings: DataSettings, *,
                    progress: bool = False) -> Converted:
    """Raw source(s) -> their validated Beam records and rejects (`Converted`), by the pipeline's convert-only
    task, as `settings` say; `work_dir` holds the Arrow file: keep it while the records are read."""
    settings.check()
    sources = data_sources([inputs] if isinstance(inputs, str) else inputs, settings.split)
    names = [s.name for s in sources]
    items = iter_items(sources, limit=settings.max_records)
    raw = next(read_chunks(names, items, os.path.join(work_dir, "raw"), progress=progress))
    converted = os.path.join(os.fspath(work_dir), "converted.arrow")
    job = Job(None, settings.format, None, "turn", True, [], settings.missing_reasoning,
              tool_call_checks=settings.tool_call_checks)
    result = run_task(Task(0, names, raw=raw, convert_to=converted, tokenize=False), job)
    os.unlink(raw)
    return Converted(converted, names, result)
