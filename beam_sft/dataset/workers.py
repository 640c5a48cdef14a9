"""The worker pool of the data phase: processes that live for the whole run and write their own Arrow shards.

`beam_sft.dataset.prepare.build_prepared` cuts the input into chunks of `CHUNK_ROWS` raw records (Arrow files
written by the main process as it reads). Each chunk is one task:

* `convert`: raw rows -> validated Beam records, with rejects (the same `_convert_batch` as before);
* `tokenize`: those records -> render, mask, truncate and count (`_tokenize_batch`), and the kept rows written
  straight to the chunk's shard of each split (`input_ids`, `labels`), their sources and lines beside it
  (`beam_sft.dataset.origins`);
* both at once when no eval split has to be drawn among the converted records first (the common case): the
  converted records then never touch the disk.

With `num_proc` > 1 a pool of `num_proc` processes is started once per run; each builds its encoder once
(inherited from the main process where processes fork, else set up from the disk cache, `beam_sft.render.
tiktoken_backend.build_cached`). Tasks are handed out a few ahead and their results taken back in input
order, so the shards, the rejects file and the counts do not depend on `num_proc` or on timing: a run gives
the same bytes with 1 or N processes. The main process reads the input, writes the rejects and adds up
counts; it never touches a tokenized row. With `num_proc` 1 the same tasks run in the main process.

Why not `datasets.map(num_proc=...)`: it starts a pool per call, pickling the tokenizer to every worker and
rebuilding the encoder there, once per chunk, and its Arrow writer costs more per row than the encoding.
"""

from __future__ import annotations

import gc
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from beam_sft.dataset.origins import origins_batch, origins_schema, shard_origins_path

# Rows per encoder call: large enough for the encoder's batched tokenization, small enough to keep the
# Python lists of one batch small.
BATCH_ROWS = 256
# Allocations between young-generation collections while records stream (`_frozen`); CPython's default is 700.
GC_THRESHOLD = 100_000
MAX_DEFAULT_PROCS = 32  # past this the main process (reading, rejects) is the bottleneck anyway

STAT_KEYS = ("records_in", "records_kept", "dropped_too_long", "truncated", "assistant_turns_cut", "total_tokens",
             "supervised_tokens", "supervised_return", "supervised_call")
# _tokenize_batch's per-row count columns -> PrepStats fields (the token counts come from the shard writer)
_SUMMED = {"dropped": "dropped_too_long", "truncated": "truncated", "assistant_turns_cut": "assistant_turns_cut"}


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
    fmt: str
    max_length: int | None
    policy: str
    assistant_only_loss: bool
    stop_ids: list[int]
    missing_reasoning: str = "mask"
    dedup: bool = False  # exact deduplication (beam_sft.records.dedup): keys and per-row counts sent back


@dataclass
class Task:
    """One chunk. `raw`: a raw chunk file to convert; `converted`: a converted chunk file to tokenize; with
    `tokenize` and `raw` both stages run. `eval_rows` (one bool per row) sends rows to the eval split.
    `shards`: split name -> the Arrow file this chunk's kept rows of that split go to."""

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


@dataclass
class Result:
    """What a task sends back: counts, rejects (JSON texts, in row order) and the shards it wrote."""

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


    def to_json(self) -> dict[str, Any]:
        """The result as JSON (a `beam-sft prepare --shard` run keeps one per chunk for the merge to replay);
        `shards` then holds file names, relative to the shard's split directories."""
        return {"index": self.index, "records_in": self.records_in, "n_records": self.n_records,
                "rejected": dict(self.rejected), "rejects": self.rejects,
                "stats": {k: dict(v) for k, v in self.stats.items()},
                "shards": {k: os.path.basename(v) for k, v in self.shards.items()},
                "reasoning": dict(self.reasoning), "eval_sources": self.eval_sources,
                "rows": [[r.key, r.src, r.pos, r.by_line, list(r.reasoning), r.split, r.shard_row, r.reject, r.index,
                          r.stats] for r in self.rows]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        rows = [Row(key, src, pos, by_line, tuple(reasoning), split, shard_row, reject, index, stats)
                for key, src, pos, by_line, reasoning, split, shard_row, reject, index, stats in data["rows"]]
        return cls(data["index"], data["records_in"], data["n_records"], Counter(data["rejected"]), data["rejects"],
                   {k: Counter(v) for k, v in data["stats"].items()}, dict(data["shards"]),
                   Counter(data["reasoning"]), rows, data["eval_sources"])


@dataclass(slots=True)  # one per converted record of a chunk with dedup: no __dict__ each
class Row:
    """One record's part of a Result: its key, provenance, split, and where it went (a shard row, a reject, or
    neither: dropped by truncation), with the counts it added."""

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


# --------------------------------------------------------------------------------------------------------
# One task


def _open(path: str):
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(path, "r"))


def _converted_schema():
    import pyarrow as pa

    return pa.schema([("src", pa.int32()), ("pos", pa.int64()), ("by_line", pa.bool_()), ("record", pa.string())])


def _final_schema():
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("labels", pa.list_(pa.int32()))])


def _converted_batches(task: Task, job: Job, result: Result) -> Iterator[dict[str, list]]:
    """The chunk's rows as column dicts of BATCH_ROWS rows (`record` None for a conversion reject)."""
    from beam_sft.dataset.stages import _convert_batch

    if task.raw is None:
        for batch in _open(task.converted):
            for part in _slices(batch):
                yield part.to_pydict()
        return
    for batch in _open(task.raw):
        for part in _slices(batch):
            cols = part.to_pydict()
            # Tokenized right here: the records need not go through JSON text again.
            out = _convert_batch(cols, task.formats or job.fmt, task.names, as_dicts=task.tokenize,
                                 missing_reasoning=task.policies or job.missing_reasoning, with_counts=not job.dedup,
                                 with_keys=job.dedup)
            result.reasoning.update(out.get("reasoning", {}))
            result.records_in += len(cols["src"])
            for reason, reject in zip(out["reason"], out["reject"], strict=True):
                if reason is not None:
                    result.rejected[reason] += 1
                    result.rejects.append(reject)
            result.n_records += len(out["record"]) - sum(r is not None for r in out["reason"])
            yield {"src": cols["src"], "pos": cols["pos"], "by_line": cols["by_line"], "record": out["record"],
                   **({"key": out["key"]} if job.dedup else {})}


def _slices(batch) -> Iterator[Any]:
    for start in range(0, batch.num_rows, BATCH_ROWS):
        yield batch.slice(start, BATCH_ROWS)


class _ShardWriters:
    """The Arrow stream files of one chunk's kept rows, one per split, opened when the first row comes; beside
    each, the same rows' origins (`beam_sft.dataset.origins`)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths
        self.open: dict[str, Any] = {}  # split -> (sink, writer, origins sink, origins writer)
        self.rows: Counter = Counter()  # rows written per split so far

    def write(self, split: str, ids: list[list[int]], masks: list[list[int]], job: Job,
              origins: list[tuple[int, int, bool]]) -> tuple[dict, Any]:
        """Write rows (ids and their assistant masks: the labels are made here) and their (src, pos, by_line);
        return their token counts and, with `job.dedup`, each row's (a list of dicts), else None."""
        import pyarrow as pa

        if not ids:
            return {}, []
        if split not in self.open:
            sink = pa.OSFile(self.paths[split], "wb")
            origins_sink = pa.OSFile(shard_origins_path(self.paths[split]), "wb")
            self.open[split] = (sink, pa.ipc.new_stream(sink, _final_schema()),
                                origins_sink, pa.ipc.new_stream(origins_sink, origins_schema()))
        input_ids, labels, counts, per_row = _labelled(ids, masks, job.assistant_only_loss, job.stop_ids,
                                                       per_row=job.dedup)
        self.open[split][1].write_batch(pa.record_batch([input_ids, labels], schema=_final_schema()))
        self.open[split][3].write_batch(origins_batch(*map(list, zip(*origins, strict=True))))
        self.rows[split] += len(ids)
        return counts, per_row

    def close(self) -> dict[str, str]:
        for sink, writer, origins_sink, origins_writer in self.open.values():
            writer.close()
            sink.close()
            origins_writer.close()
            origins_sink.close()
        return {split: self.paths[split] for split in self.open}


_TOKEN_KEYS = ("total_tokens", "supervised_tokens", "supervised_return", "supervised_call")


def _labelled(ids: list[list[int]], masks: list[list[int]], assistant_only_loss: bool, stop_ids,
              per_row: bool = False):
    """(input_ids, labels) as Arrow list<int32> arrays, and the batch's token counts: the rule of
    `examples.build_example` (IGNORE_INDEX off the mask, or every token without assistant-only loss) applied to
    the whole batch at once on the flat arrays, instead of a Python list of labels per row (a fifth of the data
    phase's time outside the encoder, measured). `per_row`: the same counts row by row (sums over each row's
    slice, `np.add.reduceat`), else None."""
    import numpy as np
    import pyarrow as pa

    from beam_sft.dataset.examples import IGNORE_INDEX

    # pyarrow's own conversion of nested int lists: measured 2.4x faster than numpy.fromiter over the chained
    # lists plus offsets (pyarrow 26, 256 rows of 200-700 ids).
    input_ids = pa.array(ids, pa.list_(pa.int32()))
    flat = input_ids.flatten().to_numpy()
    if assistant_only_loss:
        try:
            trained = np.frombuffer(b"".join(map(bytes, masks)), dtype=np.uint8) != 0
        except (TypeError, ValueError):  # not small non-negative ints
            trained = np.fromiter((bool(bit) for mask in masks for bit in mask), dtype=bool, count=len(flat))
        if len(trained) != len(flat):
            raise ValueError(f"{len(trained)} mask entries for {len(flat)} tokens")
        values = np.where(trained, flat, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
    else:
        values, trained = flat, np.ones(len(flat), dtype=bool)
    labels = pa.ListArray.from_arrays(input_ids.offsets, pa.array(values, pa.int32()))
    columns = (np.ones(len(flat), dtype=bool), trained,
               values == stop_ids[0] if stop_ids else np.zeros(len(flat), dtype=bool),
               values == stop_ids[1] if len(stop_ids) > 1 else np.zeros(len(flat), dtype=bool))
    counts = {key: int(np.count_nonzero(col)) for key, col in zip(_TOKEN_KEYS, columns, strict=True)}
    rows = None
    if per_row:
        offsets = input_ids.offsets.to_numpy()
        rows = [dict(zip(_TOKEN_KEYS, r, strict=True)) for r in
                zip(*(_row_sums(col, offsets).tolist() for col in columns), strict=True)]
    return input_ids, labels, counts, rows


def _row_sums(column, offsets):
    """The sum of `column` (bools) over each row's slice [offsets[i], offsets[i + 1]), 0 for an empty row.
    reduceat over the row starts: with dedup's per-row counts, a cumulative sum of every column of every batch
    was 2% of a run's CPU time (24,000 records, bundled tokenizer) and 17x slower than this, measured."""
    import numpy as np

    full = np.diff(offsets) > 0
    sums = np.zeros(len(full), dtype=np.int64)
    if full.any():
        # over the non-empty rows only: their starts increase strictly, so each slice ends where the next begins
        sums[full] = np.add.reduceat(column, offsets[:-1][full], dtype=np.int64)
    return sums


def _unique_rows(cols: dict[str, list], present: list[int], task: Task, seen, result: Result) -> list[int]:
    """With dedup: the rows of `present` that this chunk has not met yet (the others become `duplicate` rejects
    here, before tokenizing), each given its Row."""
    from beam_sft.errors import reject_entry

    unique = []
    for i in present:
        key, reasoning = cols["key"][i]
        src, pos, by_line = cols["src"][i], cols["pos"][i], cols["by_line"][i]
        dup = seen.check(key, task.names[src], pos, by_line)
        if dup is not None:
            result.rejected[dup.code.value] += 1
            result.rejects.append(orjson.dumps(reject_entry(dup, task.names[src], pos, by_line)).decode())
            continue
        result.rows.append(_row(result, key, src, pos, by_line, reasoning))
        unique.append(i)
    return unique


def _row(result: Result, key: int, src: int, pos: int, by_line: bool, reasoning) -> Row:
    """A Row; its record's reasoning counted (the main process takes a duplicate's back out)."""
    from beam_sft.dataset.reasoning_stats import KEYS

    result.reasoning.update(dict(zip(KEYS, reasoning, strict=True)))
    return Row(key, src, pos, by_line, reasoning)


def _keyed(batches: Iterable[dict[str, list]], result: Result) -> Iterator[dict[str, list]]:
    """The batches as they pass, each converted record given its Row (convert-only tasks with dedup: the main
    process decides the duplicates before the second pass tokenizes)."""
    index = 0
    for cols in batches:
        for key, src, pos, by_line in zip(cols["key"], cols["src"], cols["pos"], cols["by_line"], strict=True):
            if key is not None:
                result.rows.append(_row(result, key[0], src, pos, by_line, key[1]))
                result.rows[-1].index = index
            index += 1
        yield cols


class _RowCounts:
    """One chunk's counts per split, and with dedup the same counts on each Row."""

    def __init__(self, task: Task, job: Job, result: Result) -> None:
        self.result = result
        self.stats = {split: Counter() for split in task.shards}
        self.dedup = job.dedup

    def reject(self, row: Row | None, reason: str, entry: str) -> None:
        self.result.rejected[reason] += 1
        self.result.rejects.append(entry)
        if row is not None:
            row.reject = len(self.result.rejects) - 1

    def tokenized(self, row: Row | None, split: str, done: dict[str, list], j: int) -> None:
        counts = {"records_in": 1, **{key: done[column][j] for column, key in _SUMMED.items()}}
        self.stats[split].update(counts)
        if row is not None:
            row.split, row.stats = split, counts

    def kept(self, row: Row | None, split: str, shard_row: int) -> None:
        self.stats[split]["records_kept"] += 1
        if row is not None:
            row.shard_row = shard_row
            row.stats["records_kept"] = 1

    def written(self, split: str, counts: dict, per_row, rows: list) -> None:
        self.stats[split].update(counts)
        for row, row_counts in zip(rows, per_row, strict=True):
            if row is not None:
                row.stats.update(row_counts)


def _tokenize_into(batches: Iterable[dict[str, list]], task: Task, job: Job, result: Result) -> None:
    from beam_sft.records.dedup import Seen

    writers = _ShardWriters(task.shards)
    tally = _RowCounts(task, job, result)
    seen = Seen() if job.dedup and task.raw is not None else None
    row = 0
    try:
        for cols in batches:
            n = len(cols["record"])
            present = [i for i, text in enumerate(cols["record"]) if text is not None
                       and (task.skip_rows is None or not task.skip_rows[row + i])]
            rows: list[Row | None] = [None] * len(present)
            if seen is not None:
                first = len(result.rows)
                present = _unique_rows(cols, present, task, seen, result)
                rows = result.rows[first:]
            if present:
                _tokenize_present(cols, present, rows, row, task, job, writers, tally)
            row += n
    finally:
        result.shards = writers.close()
    result.stats = tally.stats


def _tokenize_present(cols, present: list[int], rows: list, row: int, task: Task, job: Job,
                      writers: _ShardWriters, tally: _RowCounts) -> None:
    """Tokenize the batch's rows `present` and write the kept ones to their split's shard."""
    from beam_sft.dataset.stages import _tokenize_batch

    sub = {k: [cols[k][i] for i in present] for k in ("src", "pos", "by_line", "record")}
    done = _tokenize_batch(sub, job.tokenizer, job.max_length, job.policy, job.assistant_only_loss,
                           job.stop_ids, task.names, with_labels=False)
    kept: dict[str, tuple[list, list, list, list]] = {split: ([], [], [], []) for split in task.shards}
    for j, i in enumerate(present):
        held = task.all_eval or (task.eval_rows is not None and task.eval_rows[row + i])
        split = "eval" if held else "train"
        if done["reason"][j] is not None:
            tally.reject(rows[j], done["reason"][j], done["reject"][j])
            continue
        tally.tokenized(rows[j], split, done, j)
        if done["keep"][j]:
            ids, masks, kept_rows, origins = kept[split]
            tally.kept(rows[j], split, writers.rows[split] + len(ids))
            ids.append(done["input_ids"][j])
            masks.append(done["mask"][j])
            kept_rows.append(rows[j])
            origins.append((sub["src"][j], sub["pos"][j], sub["by_line"][j]))
            if split == "eval" and task.groups is not None:
                tally.result.eval_sources.append(task.groups[sub["src"][j]])
    for split, (ids, masks, kept_rows, origins) in kept.items():
        counts, per_row = writers.write(split, ids, masks, job, origins)
        tally.written(split, counts, per_row or [None] * len(kept_rows), kept_rows)


def _write_converted(batches: Iterable[dict[str, list]], path: str) -> None:
    import pyarrow as pa

    schema = _converted_schema()
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for cols in batches:
            writer.write_batch(pa.record_batch([pa.array(cols[k], schema.field(k).type) for k in schema.names],
                                               schema=schema))


def run_task(task: Task, job: Job) -> Result:
    """Run one chunk's task (in a worker or in the main process)."""
    result = Result(task.index)
    batches = _converted_batches(task, job, result)
    if task.tokenize:
        _tokenize_into(batches, task, job, result)
    else:
        _write_converted(_keyed(batches, result) if job.dedup else batches, task.convert_to)
    return result


# --------------------------------------------------------------------------------------------------------
# The pool

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


def run_tasks(tasks: Iterable[Task], job: Job, num_proc: int | None) -> Iterator[Result]:
    """The results of `tasks`, in their order, computed by `num_proc` long-lived processes (or this one).

    `tasks` is consumed lazily, at most 2 * num_proc ahead of the result being waited for, so the input is
    read (and its chunk files written) only as fast as the workers take it.
    """
    from beam_sft.render.encoder import get_encoder

    get_encoder(job.tokenizer)  # built before the workers fork, so they inherit it
    with _frozen():
        if not num_proc or num_proc <= 1:
            for task in tasks:
                yield run_task(task, job)
            return
        import multiprocessing

        context = multiprocessing.get_context(_start_method())
        with context.Pool(num_proc, initializer=_init_worker, initargs=(job,)) as pool:
            pending: deque = deque()
            for task in tasks:
                pending.append(pool.apply_async(_run_in_worker, (task,)))
                if len(pending) >= 2 * num_proc:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()


@contextmanager
def _frozen() -> Iterator[None]:
    """The cyclic GC kept out of the way while the records stream through.

    Everything alive now (tokenizer, encoder, a training job's model) is frozen: a full collection otherwise
    walks all of it again and again (with the encoder's piece cache, a fifth of the encoding time, measured).
    Garbage cycles are collected first so that none is kept. The young generation's threshold is raised: a
    batch's records, ids and masks are acyclic and freed by reference counting, so collecting every 700
    allocations only re-scans live batch objects (9% of a process's CPU time at the default, 4% at 20,000,
    none at 200,000, measured on 20k records); the threshold still bounds what cycles could pile up. Forked
    workers inherit both (`gc.freeze` also keeps their pages shared). Both are undone at the end."""
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
    """fork where it is safe: workers inherit the tokenizer and its encoder ready-made. A process that has
    initialised CUDA (a training job that loaded its model first) spawns instead: a forked CUDA context is
    unusable, and the workers get the tokenizer pickled once each."""
    import multiprocessing
    import sys

    torch = sys.modules.get("torch")
    cuda = torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized()
    return "fork" if "fork" in multiprocessing.get_all_start_methods() and not cuda else "spawn"


def drop_rows(path: str, rows: list[int]) -> bool:
    """Rewrite a shard without `rows` (duplicates found after it was written), and its origins file the same
    way, one record batch at a time (a whole chunk's tokens never in memory); False when nothing is left (the
    files are then gone)."""
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
        with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_stream(sink, reader.schema) as writer:
            for batch in reader:
                keep = np.ones(batch.num_rows, dtype=bool)
                here = drop[(drop >= start) & (drop < start + batch.num_rows)] - start
                keep[here] = False
                start += batch.num_rows
                if keep.any():
                    writer.write_batch(batch.filter(pa.array(keep)))
                    written += int(keep.sum())
    if not written:
        os.unlink(path + ".tmp")
        os.unlink(path)
        return 0
    os.replace(path + ".tmp", path)
    return written


def copy_shard(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy a chunk's shard and, where there is one, its origins file (a `--shard` run's, into the merge)."""
    import shutil

    shutil.copyfile(source, target)
    if os.path.exists(shard_origins_path(source)):
        shutil.copyfile(shard_origins_path(source), shard_origins_path(target))


def result_rejects(result: Result) -> Iterator[dict[str, Any]]:
    for text in result.rejects:
        yield orjson.loads(text)


def shard_path(directory: Path, index: int) -> str:
    return str(directory / f"part-{index:05d}.arrow")
