"""The data phase of a training job: source(s) + tokenizer + settings in, a prepared directory out
(docs/prepare.md#how-a-run-works)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import compress
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from beam_sft.dataset.drops import DroppedTooMuch, drop_lines, format_keys, verdict
from beam_sft.dataset.examples import PrepStats
from beam_sft.dataset.mixture import Mixture
from beam_sft.dataset.origins import OriginsWriter, shard_origins_path
from beam_sft.dataset.pipeline import (
    CHUNK_ROWS,
    Job,
    Result,
    Task,
    convert_records,
    drop_rows,
    in_process,
    open_stream,
    read_chunks,
    run_tasks,
    shard_path,
    stream_writer,
    token_counts,
)
from beam_sft.dataset.reasoning_stats import KEYS as REASONING_KEYS
from beam_sft.dataset.reasoning_stats import REJECTED_KEYS, input_coverage
from beam_sft.dataset.settings import (
    DATA_VERSION,
    EVAL_DIR,
    MANIFEST,
    REJECTS,
    DataSettings,
    PhaseOptions,
    check_manifest,
    default_cache_dir,
    fingerprint,
    read_manifest,
    run_fields,
    source_identity,
)
from beam_sft.errors import FatalError, Reason, UsageError, reject_entry
from beam_sft.records.dedup import Seen, record_key
from beam_sft.records.files import JsonlSink, data_sources, iter_items, source_label
from beam_sft.storage import remove_stale_temporaries, replace_dir, temporary_path, write_json_atomic
from beam_sft.template.tokenizer import stop_token_ids

logger = logging.getLogger(__name__)


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
    """The Beam records of the eval split the data phase holds out for these settings, in order (for
    `--eval_beam`): `eval_dataset_name`'s ("test" split), else a seeded share of `dataset_name`'s, or none."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    if not eval_dataset_name and settings.eval_split_size <= 0:
        return
    seen = Seen() if settings.dedup else None
    train = convert_records(dataset_name, tempfile.mkdtemp(dir=work_dir), settings)
    # the training records' keys (their copies are not eval records), and how many are first occurrences
    n_train = sum(1 for _ in _first_occurrences(train.iter_records(), seen))
    if eval_dataset_name:
        held = convert_records(eval_dataset_name, tempfile.mkdtemp(dir=work_dir),
                               replace(settings, split="test", max_records=None))
        yield from _first_occurrences(held.iter_records(), seen)
    else:
        again = Seen() if settings.dedup else None
        yield from compress(_first_occurrences(train.iter_records(), again), _eval_mask(n_train, settings))


def _first_occurrences(records, seen) -> Iterator[dict[str, Any]]:
    """`records` without the ones `seen` already holds (all of them when `seen` is None: no dedup)."""
    for i, record in enumerate(records):
        if seen is None or seen.check(record_key(record), "", i) is None:
            yield record


class _SplitWriter:
    """The kept rows of one split: the chunks' shard files, in chunk order, committed as the Arrow files of a
    `save_to_disk` directory, with the rows' origins beside them. Nothing is read back to save it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True)
        self.files: list[Path] = []
        self.origins = OriginsWriter()

    def add(self, shard: str | os.PathLike, names: list[str]) -> None:
        """A chunk's shard, after its duplicates are out; `names`: the chunk's sources (its rows' `src`)."""
        self.files.append(Path(shard))
        self.origins.add(shard, names)

    def commit(self, fingerprint: str) -> None:
        if not self.files:
            path = self.dir / "part-empty.arrow"
            with stream_writer(str(path), _final_features().arrow_schema):
                pass
            self.files.append(path)
        names = [f"data-{i:05d}-of-{len(self.files):05d}.arrow" for i in range(len(self.files))]
        for file, name in zip(self.files, names, strict=True):
            os.replace(file, self.dir / name)
        (self.dir / "dataset_info.json").write_text(DATASET_INFO)
        state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": fingerprint,
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        (self.dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        self.origins.write(self.dir)


# dataset_info.json of a split, byte for byte what `save_to_disk` writes for `_final_features()` (checked by
# tests/test_data.py against datasets itself): importing datasets to write it would cost a second per run.
_TOKEN_LIST = {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "List"}
DATASET_INFO = json.dumps({"citation": "", "description": "", "features": {"input_ids": _TOKEN_LIST,
                                                                            "labels": _TOKEN_LIST},
                           "homepage": "", "license": ""}, indent=2)


def _final_features():
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32")), "labels": List(Value("int32"))})


@dataclass
class _Chunk:
    """One input chunk: its raw file, its converted file (only when an eval split is drawn: then the chunk is
    converted in pass 1 and tokenized in pass 2), source names, from the separate eval data or not."""

    raw: str
    converted: str | None
    names: list[str]
    is_eval: bool
    n_records: int = 0  # records converted (the rest of its rows are rejects), less duplicates
    skip: Any = None  # numpy bool per row: duplicates (convert-only chunks with dedup), not tokenized
    groups: list[int] | None = None  # a mixture's: each source's entry, recorded for the eval rows drawn from it


def _owns(n: int, *, shard: tuple[int, int], base: int) -> bool:
    """Chunk `base + n` (a part's n-th, numbered across parts) is shard I's of N: I, I + N, I + 2N, ..."""
    return (base + n) % shard[1] == shard[0]


def _input_names(inputs) -> list[str]:
    return [src.name for src in inputs.sources] if isinstance(inputs, Mixture) else [source_label(s) for s in inputs]


SHARD_MANIFEST = "beam_sft_shard.json"


@dataclass
class PrepareRun:
    """One run of the data phase and all its state (`counts`: the chunks' results summed in input order).
    `build` writes a prepared directory, `shard` a shard directory, `merge` a prepared directory from shard
    directories: the same bytes whatever `num_proc` (None or 1: this process). `eval_inputs`: separate eval
    data (split "test"); else `settings.eval_split_size` holds out a seeded share of the converted records."""

    inputs: Any  # paths, or a Mixture
    tokenizer: Any
    settings: DataSettings
    out_dir: str | os.PathLike
    eval_inputs: Sequence[str] | None = None
    identity: Any = None
    fingerprint: str | None = None
    extra_manifest: dict[str, Any] | None = None
    num_proc: int | None = None
    chunk_rows: int | None = None
    progress: bool = False
    chunks: list[_Chunk | None] = field(default_factory=list)
    writers: dict[str, _SplitWriter] = field(default_factory=dict)
    counts: Result = field(default_factory=lambda: Result(-1))
    by_source: dict[str, Counter] = field(default_factory=dict)  # source name -> rejects by reason
    unknown_keys: Counter = field(default_factory=Counter)  # the key sets of the records no converter reads

    @property
    def draws_eval(self) -> bool:
        """An eval split drawn among the converted training records (not separate eval data)."""
        return not self.eval_inputs and self.settings.eval_split_size > 0

    @contextmanager
    def _session(self, splits: list[str], with_rejects: bool = True) -> Iterator[None]:
        """The work directory (named like every other temporary output, beam_sft.storage, so a run killed here
        is cleaned up by the next), the split writers and the rejects file; all gone at the end."""
        out = Path(self.out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out)
        self.work = temporary_path(out, directory=True)
        self.started = time.time()
        self.final = self.work / "out"
        self.final.mkdir()
        self.rejects = JsonlSink(str(self.final / REJECTS)) if with_rejects else None
        self.seen = Seen() if self.settings.dedup else None  # first occurrences across chunks (and train -> eval)
        try:
            self.writers = {split: _SplitWriter(self.final / f"{split}_parts") for split in splits}
            self.counts.stats = {split: Counter() for split in splits}
            yield
        finally:
            if self.rejects is not None:
                self.rejects.abort()
            shutil.rmtree(self.work, ignore_errors=True)

    def build(self) -> dict[str, Any]:
        """The prepared directory at `out_dir`; returns its manifest."""
        self.settings.check()
        with self._session(["train", "eval"] if self.eval_inputs or self.draws_eval else ["train"]):
            self._first_pass()
            if self.draws_eval and any(c.n_records for c in self.chunks if c is not None and not c.is_eval):
                self._eval_pass()
            return self._finish()

    def shard(self, shard: tuple[int, int]) -> dict[str, Any]:
        """Shard I of N (chunks I, I + N, ...) into the shard directory at `out_dir`; returns its manifest."""
        self.settings.check()
        index, count = shard
        if count < 1 or not 0 <= index < count:
            raise UsageError(f"shard {index}/{count}: I/N needs 0 <= I < N")
        if self.draws_eval:
            raise UsageError("an eval split drawn among the converted records (eval_split_size) needs all of them "
                             "first: with shards, give the eval data separately (--dataset_test_split), or prepare "
                             "without one and train with eval_split_size (it then holds out a seeded share of the "
                             "rows)")
        if self.fingerprint is None:
            self.fingerprint = fingerprint(self.identity or train_identity(self.inputs, self.settings),
                                           self.tokenizer, self.settings)
        with self._session(["train", "eval"] if self.eval_inputs else ["train"], with_rejects=False):
            (self.final / "results").mkdir()
            self._first_pass(shard)
            manifest = {"beam_sft_shard": DATA_VERSION, "shard": index, "of": count, "chunks": len(self.chunks),
                        "own": [i for i, chunk in enumerate(self.chunks) if chunk is not None],
                        "fingerprint": self.fingerprint, "inputs": _input_names(self.inputs),
                        "splits": sorted(self.writers), "seconds": round(time.time() - self.started, 3)}
            write_json_atomic(str(self.final / SHARD_MANIFEST), manifest)
            replace_dir(self.final, Path(self.out_dir))
            return manifest

    def merge(self, shard_dirs: Sequence[str | os.PathLike]) -> dict[str, Any]:
        """The prepared directory at `out_dir` from the N shard directories of this run; returns its manifest.
        Each chunk's result is taken in chunk order, as `build` takes them (duplicates across shards too)."""
        from tqdm import tqdm

        self.settings.check()
        if self.draws_eval:
            raise UsageError("shards hold no eval split drawn among the records (eval_split_size): merge without it")
        dirs, n_chunks = _shard_set(shard_dirs, self.fingerprint)
        with self._session(["train", "eval"] if self.eval_inputs else ["train"]):
            with tqdm(desc="merging", unit=" rec", disable=not self.progress or None, mininterval=0.5) as bar:
                for i in range(n_chunks):
                    result, chunk = self._shard_result(dirs[i % len(dirs)], i)
                    self._deduplicate(result, chunk)
                    self.chunks.append(chunk)
                    self._take(result, bar, chunk.names)
            return self._finish()

    def _shard_result(self, shard: Path, i: int) -> tuple[Result, _Chunk]:
        """Chunk i's result as a shard run kept it, its Arrow files copied into this run's split directories."""
        try:
            data = json.loads((shard / "results" / f"part-{i:05d}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UsageError(f"{shard}: chunk {i}'s result is missing or unreadable ({err}); prepare "
                             "that shard again") from err
        result = Result.from_json(data["result"])
        for split, name in result.shards.items():
            if split not in self.writers:
                raise UsageError(f"{shard}: holds a {split} split that these arguments do not make")
            source, copy = shard / f"{split}_parts" / name, shard_path(self.writers[split].dir, i)
            shutil.copyfile(source, copy)
            if os.path.exists(shard_origins_path(source)):
                shutil.copyfile(shard_origins_path(source), shard_origins_path(copy))
            result.shards[split] = copy
        return result, _Chunk("", None, data["names"], data["is_eval"])

    def _tasks(self, shard: tuple[int, int] | None) -> Iterator[Task]:
        """Pass 1 tasks as the input is read (convert + tokenize, or convert only when `draws_eval`), each
        chunk appended to `chunks`; with `shard`, another shard's chunk gets no task, a None in `chunks`."""
        settings, work = self.settings, self.work
        parts = [(self.inputs, settings.split, settings.max_records, False)]
        if self.eval_inputs:
            parts.append((self.eval_inputs, "test", None, True))
        for part_inputs, split, limit, is_eval in parts:
            mixture = part_inputs if isinstance(part_inputs, Mixture) else None
            sources = mixture.sources if mixture else data_sources(part_inputs, split)
            items = mixture.items() if mixture else iter_items(sources, limit=limit)
            formats = mixture.formats(settings.format) if mixture else None
            policies = mixture.policies(settings.missing_reasoning) if mixture else None
            groups = mixture.groups() if mixture else None
            names = [src.name for src in sources]
            own = None if shard is None else partial(_owns, shard=shard, base=len(self.chunks))
            split_name = "eval" if is_eval else "train"
            for raw in read_chunks(names, items, work / split_name, own=own,
                                   chunk_rows=self.chunk_rows or CHUNK_ROWS, progress=self.progress):
                i = len(self.chunks)
                if raw is None:
                    self.chunks.append(None)
                    continue
                # convert only (the eval split is drawn after pass 1), or convert + tokenize into the split
                converted = str(work / f"converted-{i:05d}.arrow") if self.draws_eval else None
                self.chunks.append(_Chunk(raw, converted, names, is_eval, groups=groups))
                shards = {} if self.draws_eval else {split_name: shard_path(self.writers[split_name].dir, i)}
                yield Task(i, names, raw=raw, convert_to=converted, tokenize=not self.draws_eval,
                           all_eval=is_eval, shards=shards, formats=formats, policies=policies)

    def _first_pass(self, shard: tuple[int, int] | None = None) -> None:
        """Pass 1: every chunk's task run in the pool; with `shard`, this shard's, each result written to the
        shard's `results` (`merge` takes them in chunk order, as this loop does in a single run)."""
        from tqdm import tqdm

        with tqdm(desc="converting" if self.draws_eval else "preparing", unit=" rec",
                  disable=not self.progress or None, mininterval=0.5) as bar:
            # A single run's tasks in this process check the run's first occurrences themselves.
            checked = shard is None and not self.draws_eval and in_process(self.num_proc)
            for result in run_tasks(self._tasks(shard), Job.of(self.tokenizer, self.settings), self.num_proc,
                                    self.seen if checked else None):
                chunk = self.chunks[result.index]
                if shard is not None:
                    write_json_atomic(str(self.final / "results" / f"part-{result.index:05d}.json"),
                                      {"names": chunk.names, "is_eval": chunk.is_eval, "result": result.to_json()})
                    bar.update(result.records_in)
                else:
                    self._deduplicate(result, chunk, checked)
                    self._take(result, bar, chunk.names)
                os.unlink(chunk.raw)
                del result  # its Rows (one per record with dedup) freed before the next chunk's are made

    def _eval_pass(self) -> None:
        """Pass 2 (`draws_eval`): every chunk tokenized, its rows sent to the split the seeded choice among
        the converted training records (one byte per record, known only now) says."""
        import numpy as np
        import pyarrow.compute as pc
        from tqdm import tqdm

        eval_mask = _eval_mask(sum(c.n_records for c in self.chunks), self.settings)

        def tasks() -> Iterator[Task]:
            offset = 0
            for i, chunk in enumerate(self.chunks):
                table = open_stream(chunk.converted).read_all()
                has_record = pc.is_valid(table.column("record")).to_numpy(zero_copy_only=False)
                del table
                if chunk.skip is not None:
                    has_record &= ~chunk.skip
                eval_rows = np.zeros(len(has_record), dtype=bool)
                eval_rows[has_record] = eval_mask[offset: offset + chunk.n_records]
                offset += chunk.n_records
                yield Task(i, chunk.names, converted=chunk.converted, eval_rows=eval_rows, skip_rows=chunk.skip,
                           shards={name: shard_path(w.dir, i) for name, w in self.writers.items()},
                           groups=chunk.groups)

        with tqdm(desc="tokenizing", unit=" rec", disable=not self.progress or None, mininterval=0.5) as bar:
            for result in run_tasks(tasks(), Job.of(self.tokenizer, self.settings), self.num_proc):
                self._take(result, bar, self.chunks[result.index].names)
                os.unlink(self.chunks[result.index].converted)

    def _deduplicate(self, result: Result, chunk: _Chunk, checked: bool = False) -> None:
        """Take the records earlier chunks already hold out of `result` (counts, rejects, shard rows), as
        `duplicate` rejects (a convert-only chunk's: skipped in pass 2), and count the chunk's records.
        `checked`: the task did (`run_task`'s `run_seen`): only its rejects are put in input order here."""
        import numpy as np

        dups = [] if checked or self.seen is None else [
            (row, err) for row in result.rows
            if (err := self.seen.check(row.key, chunk.names[row.src], row.pos, row.by_line)) is not None]
        retract, drops = set(), {}
        for row, err in dups:
            result.reasoning.subtract(dict(zip(REASONING_KEYS, row.reasoning, strict=True)))
            if row.stats:
                result.stats[row.split].subtract(row.stats)
            if row.reject >= 0:
                retract.add(row.reject)
                result.rejected[orjson.loads(result.rejects[row.reject])["reason"]] -= 1
            if row.shard_row >= 0:
                drops.setdefault(row.split, []).append(row.shard_row)
                if row.split == "eval" and result.eval_sources:
                    result.eval_sources[row.shard_row] = -1
            result.rejected[err.code.value] += 1
        result.rejected = +result.rejected
        result.eval_sources = [group for group in result.eval_sources if group >= 0]
        result.rejects = [text for i, text in enumerate(result.rejects) if i not in retract] + [
            orjson.dumps(reject_entry(err, chunk.names[row.src], row.pos, row.by_line)).decode() for row, err in dups]
        if result.rejected.get(Reason.DUPLICATE.value):
            # in input order (duplicates are found in other stages than the rest): one chunk holds rows of its
            # sources in order, so (source, line or index) sorts them
            index = {name: i for i, name in enumerate(chunk.names)}
            where = [(index.get(entry["source"], -1), entry.get("line", entry.get("index")) or 0)
                     for entry in map(orjson.loads, result.rejects)]
            in_order = sorted(zip(where, result.rejects, strict=True), key=itemgetter(0))
            result.rejects = [text for _, text in in_order]
        for split, rows in drops.items():
            if not drop_rows(result.shards[split], rows):
                del result.shards[split]
        result.n_records -= len(dups)
        chunk.n_records = result.n_records
        if dups and self.draws_eval:
            chunk.skip = np.zeros(result.records_in, dtype=bool)
            chunk.skip[[row.index for row, _ in dups]] = True

    def _take(self, result: Result, bar, names: list[str]) -> None:
        """Add a chunk's result (`names`: its sources): counts, rejects (written as they come), shards."""
        self.counts.add(result)
        for text in result.rejects:
            entry = orjson.loads(text)
            self.rejects.write(entry)
            self.by_source.setdefault(entry["source"], Counter())[entry["reason"]] += 1
            if keys := format_keys(entry):
                self.unknown_keys[keys] += 1
        for name, shard in result.shards.items():
            self.writers[name].add(shard, names)
        bar.update(result.records_in or sum(c["records_in"] for c in result.stats.values()))

    def _checked_stats(self) -> dict[str, dict[str, int]]:
        """PrepStats per split, after checking that every record in is kept, rejected or dropped."""
        stats = {name: PrepStats(**{k: sums[k] for k in PrepStats().to_dict()}).to_dict()
                 for name, sums in self.counts.stats.items()}
        dropped = sum(s["dropped_too_long"] for s in stats.values())
        kept_total = sum(s["records_kept"] for s in stats.values())
        rejected_total = sum(self.counts.rejected.values())
        if self.counts.records_in != kept_total + rejected_total + dropped:
            raise FatalError(f"bookkeeping error: {self.counts.records_in} records in != {kept_total} kept + "
                             f"{rejected_total} rejected + {dropped} dropped by truncation")
        return stats

    def _finish(self) -> dict[str, Any]:
        """Counts checked, rejects and splits committed, the manifest written last, the directory moved to
        `out_dir`; then a run that keeps no training record fails (`max_reject_share` is for the callers)."""
        stats = self._checked_stats()
        self.rejects.commit()
        for name, writer in self.writers.items():
            writer.commit(f"{self.fingerprint or 'prepared'}-{name}")
        # The train split at the root (load_from_disk(DIR) is the training set), the eval split in eval/.
        for file in (self.final / "train_parts").iterdir():
            os.replace(file, self.final / file.name)
        (self.final / "train_parts").rmdir()
        if "eval" in self.writers:
            os.replace(self.final / "eval_parts", self.final / EVAL_DIR)
        manifest = {**self._manifest(stats), "seconds": round(time.time() - self.started, 3),
                    **(self.extra_manifest or {})}
        # Written last: a directory with a manifest is complete.
        write_json_atomic(str(self.final / MANIFEST), manifest)
        replace_dir(self.final, Path(self.out_dir))
        self.rejects = None
        check_drops(manifest, None)
        return manifest

    def _manifest(self, stats: dict[str, dict[str, int]]) -> dict[str, Any]:
        settings, inputs, counts = self.settings, self.inputs, self.counts
        mixture = isinstance(inputs, Mixture)
        return {
            "beam_sft_prepared": DATA_VERSION,
            "fingerprint": self.fingerprint,
            **run_fields(self.tokenizer, settings),
            "format": settings.format,
            "split": settings.split,
            "max_records": settings.max_records,
            "eval_split_size": settings.eval_split_size if not self.eval_inputs else None,
            "seed": settings.seed,
            "inputs": _input_names(inputs),
            "mixture": self._mixture_counts() if mixture else None,
            "eval_inputs": _input_names(self.eval_inputs) if self.eval_inputs else None,
            "eval_sources": self._eval_sources() if mixture and "eval" in stats and not self.eval_inputs else None,
            "sources": self.identity,
            "counts": {
                "records_in": counts.records_in,
                "records_kept": sum(s["records_kept"] for s in stats.values()),
                "rejected_total": sum(counts.rejected.values()),
                "rejected": dict(sorted(counts.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
                **{key: sum(s[key] for s in stats.values()) for key in (
                    "dropped_too_long", "truncated", "assistant_turns_cut", "total_tokens",
                    "supervised_tokens", "supervised_return", "supervised_call")},
                "reasoning": {key: counts.reasoning[key] for key in (*REASONING_KEYS, *REJECTED_KEYS)},
                "unknown_format_keys": dict(self.unknown_keys.most_common(5)),
                "shortest_dropped": counts.shortest_dropped,
            },
            "missing_reasoning": settings.missing_reasoning,
            "splits": stats,
        }

    def _mixture_counts(self) -> list[dict[str, Any]]:
        """Per entry of the mixture: rows read, taken, rejected by reason, duplicates."""
        out = []
        for entry, plan in zip(self.inputs.identity(), self.inputs.plans, strict=True):
            rejected: Counter = Counter()
            for src in {src.name for src in plan.files}:
                rejected.update(self.by_source.get(src, {}))
            out.append({"path": entry["path"], "data_files": entry["data_files"], "fraction": entry["fraction"],
                        "files": [src.name for src in plan.files], "read": plan.rows, "taken": plan.taken,
                        "rejected": dict(rejected.most_common()),
                        "duplicates": rejected.get(Reason.DUPLICATE.value, 0)})
        return out

    def _eval_sources(self) -> list[dict[str, Any]]:
        """Per mixture entry, the rows of the eval split drawn from it: its label, count and [start, stop) ranges
        of eval rows (one range: the split keeps input order, and the entries are read one after the other)."""
        out = [{"label": label, "rows": 0, "ranges": []} for label in self.inputs.labels()]
        for row, group in enumerate(self.counts.eval_sources):
            ranges = out[group]["ranges"]
            if ranges and ranges[-1][1] == row:
                ranges[-1][1] = row + 1
            else:
                ranges.append([row, row + 1])
            out[group]["rows"] += 1
        return out


def drop_counts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The counts `beam_sft.dataset.drops` reads, from a prepared directory's manifest (none kept when the train
    split is empty: an eval split alone trains nothing)."""
    counts = manifest.get("counts") or {}
    train = (manifest.get("splits") or {}).get("train") or {}
    return {**counts, "max_length": manifest.get("max_length"),
            "records_kept": counts.get("records_kept", 0) if train.get("records_kept", 1) else 0}


def check_drops(manifest: dict[str, Any], threshold: float | None) -> None:
    """Raise `DroppedTooMuch` (after the run: its directory and rejects are written) for a prepared directory that
    holds no training record, or whose run dropped more than `threshold` of its input."""
    line = verdict(drop_counts(manifest), threshold, manifest.get("inputs") or [], noun="training records")
    if line is not None:
        raise DroppedTooMuch(line, drop_counts(manifest), manifest)


def _shard_set(shard_dirs: Sequence[str | os.PathLike], fingerprint: str | None) -> tuple[list[Path], int]:
    """The shard directories in shard order (0..N-1, each once, all of one run): refused otherwise, naming what
    is wrong. Returns them and the number of chunks."""
    found: dict[int, tuple[Path, dict[str, Any]]] = {}
    for d in shard_dirs:
        try:
            manifest = json.loads((Path(d) / SHARD_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UsageError(f"{d}: not a shard directory (no {SHARD_MANIFEST}); make one with "
                             "`beam-sft prepare ... --shard I/N`") from None
        if manifest.get("beam_sft_shard") != DATA_VERSION:
            raise UsageError(f"{d}: written by another beam-sft data version ({manifest.get('beam_sft_shard')}, "
                             f"this one reads {DATA_VERSION}); prepare it again")
        if manifest["shard"] in found:
            raise UsageError(f"{d} and {found[manifest['shard']][0]} are both shard {manifest['shard']}")
        found[manifest["shard"]] = (Path(d), manifest)
    first = found[min(found)][1]
    for path, manifest in found.values():
        if any(manifest[key] != first[key] for key in ("fingerprint", "of", "chunks")):
            raise UsageError(f"{path}: another run's shard (its inputs, tokenizer or settings differ from "
                             f"{found[min(found)][0]}'s)")
    if fingerprint is not None and first["fingerprint"] != fingerprint:
        raise UsageError(f"{found[min(found)][0]}: prepared from other inputs, tokenizer or settings than these "
                         f"(fingerprint {first['fingerprint']}, here {fingerprint}); merge with the arguments the "
                         "shards were prepared with")
    if missing := sorted(set(range(first["of"])) - set(found)):
        raise UsageError(f"shard(s) {', '.join(map(str, missing))} of {first['of']} missing")
    return [found[i][0] for i in range(first["of"])], first["chunks"]


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


def train_identity(inputs, settings: DataSettings) -> dict[str, Any]:
    """The training sources' identity in the cache fingerprint (a mixture's: its entries, the rows taken)."""
    if isinstance(inputs, Mixture):
        return {"train": source_identity(inputs.sources), "mixture": inputs.identity()}
    return {"train": source_identity(data_sources(inputs, settings.split))}


def _record_action(record_dir: str | os.PathLike | None, rank: int, action: str, path: str, fp: str) -> None:
    """One small file per rank saying what its data phase did (tests and operators read it)."""
    if record_dir is None:
        return
    os.makedirs(record_dir, exist_ok=True)
    with open(os.path.join(record_dir, f"data_phase.rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "action": action, "path": path, "fingerprint": fp}, f)


def _use_prepared(path: str, tokenizer, settings: DataSettings, eval_inputs) -> Prepared:
    """A prepared directory as the training input: checked, loaded, and split when eval_split_size asks."""
    if settings.max_records is not None:
        raise UsageError(f"{path} is a prepared dataset: max_records applies to raw data (prepare it with "
                         "`beam-sft prepare --max_records N`)")
    prepared = load_prepared(path, tokenizer, settings)
    if settings.eval_split_size > 0 and not eval_inputs:
        if prepared.eval is not None:
            raise UsageError(f"{path} already holds an eval split; drop eval_split_size")
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
    return prepared


def _log_drops(manifest: dict[str, Any], path: str | os.PathLike) -> None:
    """The input's reasoning coverage and the drops by reason (`drops.drop_lines`), in the training log."""
    if reasoning := (manifest.get("counts") or {}).get("reasoning"):
        logger.info("data: reasoning coverage %s", input_coverage(reasoning))
    lines = drop_lines(drop_counts(manifest), rejects=str(Path(path) / REJECTS))
    for line in lines:
        (logger.warning if len(lines) > 1 else logger.info)(line)


def _main_process_first(state, build_if_missing) -> None:
    """`build_if_missing` on the main process first; then on each node's local main process (a cache that is
    not on shared storage); a failure on the main process stops every rank, none hangs."""
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


def prepare_data(inputs: Sequence[str] | str, tokenizer, settings: DataSettings, *,
                 eval_inputs: Sequence[str] | None = None, cache_dir: str | os.PathLike | None = None,
                 options: PhaseOptions | None = None) -> Prepared:
    """The data phase of a training job, once per job (`_main_process_first`): `inputs` is raw data (converted
    and tokenized here, cached under a fingerprint in `cache_dir`) or one prepared directory (checked against
    `tokenizer` and `settings`, then loaded as is; a positive `settings.eval_split_size` then holds out a
    seeded share of its rows). `options.output_dir` gets `data_phase.rank<N>.json`."""
    from accelerate import PartialState

    if isinstance(inputs, str):
        inputs = [inputs]
    options = options or PhaseOptions()
    state = PartialState()
    if (not isinstance(inputs, Mixture) and len(inputs) == 1 and isinstance(inputs[0], str)
            and read_manifest(inputs[0]) is not None):
        prepared = _use_prepared(inputs[0], tokenizer, settings, eval_inputs)
        if state.is_main_process:
            _log_drops(prepared.manifest, inputs[0])
        check_drops(prepared.manifest, None)  # its share was `beam-sft prepare`'s to check; an empty one cannot train
        _record_action(options.output_dir, state.process_index, "loaded", str(inputs[0]),
                       prepared.manifest["tokenizer"])
        return prepared

    settings.check()
    identity = train_identity(inputs, settings)
    if eval_inputs:
        identity["eval"] = source_identity(data_sources(eval_inputs, "test"))
    fp = fingerprint(identity, tokenizer, settings)
    if state.num_processes > 1 and "unresolved" in json.dumps(identity, default=str):
        # a hub source of unknown commit has a fresh nonce per process: every rank takes the main process's
        from accelerate.utils import broadcast_object_list

        fp = broadcast_object_list([fp])[0]
    root = Path(cache_dir or default_cache_dir())
    path = root / f"prepared-{fp}"
    action = "loaded"

    def build_if_missing() -> None:
        nonlocal action
        if read_manifest(path) is None:
            logger.info("preparing data into %s", path)
            try:
                PrepareRun(inputs, tokenizer, settings, path, eval_inputs, identity, fp,
                           num_proc=options.num_proc, progress=options.progress).build()
            except DroppedTooMuch as err:
                _log_drops(err.manifest, path)
                raise
            action = "tokenized"
        else:
            logger.info("loading prepared data from cache %s", path)

    _main_process_first(state, build_if_missing)
    prepared = load_prepared(path)
    prepared.action = action
    if state.is_main_process:
        _log_drops(prepared.manifest, path)
    # cached data too: the threshold is no part of the fingerprint
    check_drops(prepared.manifest, settings.max_reject_share)
    _record_action(options.output_dir, state.process_index, action, str(path), fp)
    return prepared
