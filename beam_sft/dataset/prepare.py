"""The data phase of a training job: source(s) + tokenizer + settings in, a prepared directory out.

    build_prepared   per chunk: convert, then tokenize (beam_sft.dataset.stages); kept rows appended to the
                     prepared directory's Arrow files
    prepare_data     build_prepared cached under a fingerprint, once per job (main process first)
    load_prepared    a prepared directory, memory-mapped and checked against the run

Every input record ends up in exactly one place: a kept row, `rejects.jsonl` (with its source, line or index,
reason and message), or the "dropped by truncation" count; `build_prepared` checks that the numbers add up.

A *prepared directory* holds the train split as a `save_to_disk` dataset (`input_ids`, `labels`) at its root,
an optional `eval/` split, `rejects.jsonl` and `beam_sft_manifest.json` (what made it: tokenizer and template
hashes, `max_length`, policy, sources, counts). `datasets.load_from_disk` reads it as a plain pre-tokenized
dataset, so plain TRL can train on it too.

Cache: `prepare_data` keeps prepared directories under `cache_dir` (default `$BEAM_SFT_PREPARED_CACHE`, else
`$HF_DATASETS_CACHE/beam_sft_prepared`, else `~/.cache/huggingface/datasets/beam_sft_prepared`), one per
fingerprint of (data files: path + size + mtime, format, split, max_records, tokenizer vocabulary, chat
template, max_length, truncation policy, assistant_only_loss, eval split and seed, code version). A second
run with the same inputs loads it; any change makes a new entry.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from beam_sft.dataset.reasoning_stats import KEYS as REASONING_KEYS
from beam_sft.dataset.reasoning_stats import reasoning_counts
from beam_sft.dataset.settings import (
    DATA_VERSION,
    EVAL_DIR,
    MANIFEST,
    REJECTS,
    DataSettings,
    check_manifest,
    default_cache_dir,
    fingerprint,
    read_manifest,
    run_fields,
    source_identity,
)
from beam_sft.dataset.stages import (
    _MAP_BATCH,
    CHUNK_ROWS,
    _convert_batch,
    _procs,
    _tokenize_batch,
    _tokenized_features,
    _value_counts,
    convert_source,
    read_chunks,
    token_counts,
)
from beam_sft.errors import FatalError, UsageError
from beam_sft.records.files import data_sources

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
    """The Beam records of the eval split that the data phase holds out for these settings, in order.

    For `scripts/train.py --eval_beam`, which generates from conversations, not from the tokenized split:
    the records of `eval_dataset_name` (its "test" split), or else the same seeded share of `dataset_name`'s
    converted records that `build_prepared` puts in `eval/`. Nothing when there is no eval split.
    """
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    if eval_dataset_name:
        yield from convert_source(eval_dataset_name, work_dir, format=settings.format, split="test",
                                  missing_reasoning=settings.missing_reasoning).iter_records()
        return
    if settings.eval_split_size <= 0:
        return
    converted = convert_source(dataset_name, work_dir, format=settings.format, split=settings.split,
                               limit=settings.max_records, missing_reasoning=settings.missing_reasoning)
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
    from beam_sft.template.tokenizer import stop_token_ids

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


@dataclass
class _Chunk:
    """One converted chunk waiting for the tokenize pass."""

    files: list[Path]  # the converted Arrow files (several with num_proc)
    names: list[str]  # source names
    is_eval: bool  # from the separate eval data
    n_records: int  # records converted (the rest of its rows are rejects)


class _Tally:
    """Records in, rejects by reason (written to the rejects file as they come), per split PrepStats sums."""

    def __init__(self, rejects) -> None:
        self.rejects = rejects
        self.records_in = 0
        self.rejected: Counter = Counter()
        self.reasoning: Counter = Counter()  # beam_sft.dataset.reasoning_stats.KEYS over converted records
        self.splits: dict[str, Counter] = {}

    def add_rejects(self, reasons, entries) -> None:
        self.rejected.update(_value_counts(reasons))
        for text in entries.drop_null().to_pylist():
            self.rejects.write(orjson.loads(text))


def _convert_pass(inputs, eval_inputs, settings: DataSettings, work: Path, tally: _Tally, *, chunk_rows: int,
                  num_proc, progress) -> list[_Chunk]:
    """Pass 1: read + convert every chunk; conversion rejects go to the rejects file as they come."""
    parts = [(inputs, settings.split, settings.max_records, False)]
    if eval_inputs:
        parts.append((eval_inputs, "test", None, True))
    chunks: list[_Chunk] = []
    for part_inputs, split, limit, is_eval in parts:
        sources = data_sources(part_inputs, split)
        names = [src.name for src in sources]
        for raw in read_chunks(sources, work, chunk_rows=chunk_rows, limit=limit, progress=progress,
                               prefix="eval" if is_eval else "train"):
            converted = raw.map(
                _convert_batch, batched=True, batch_size=_MAP_BATCH, num_proc=_procs(num_proc, len(raw)),
                fn_kwargs={"fmt": settings.format, "names": names, "missing_reasoning": settings.missing_reasoning},
                remove_columns=["payload", "error"], desc="converting" if progress else None,
                load_from_cache_file=False,
            )
            reasons = converted.data.column("reason")
            tally.add_rejects(reasons, converted.data.column("reject"))
            tally.reasoning.update(reasoning_counts(converted.data.column("record")))
            tally.records_in += len(raw)
            n_records = reasons.null_count  # no reason: converted
            kept_files = [Path(f["filename"]) for f in converted.cache_files]
            raw_file = Path(raw.cache_files[0]["filename"])
            del raw, converted, reasons  # closes the memory maps of this chunk
            raw_file.unlink()
            chunks.append(_Chunk(kept_files, names, is_eval, n_records))
    if not any(c.n_records for c in chunks if not c.is_eval):
        raise UsageError(f"no usable training records in {', '.join(inputs)}: {tally.records_in} read, "
                         f"{sum(tally.rejected.values())} rejected ({dict(tally.rejected)})")
    return chunks


def _tokenize_pass(chunks: list[_Chunk], tokenizer, settings: DataSettings, eval_mask, writers, tally: _Tally, *,
                   num_proc, progress) -> None:
    """Pass 2: tokenize chunk by chunk, appending kept rows to the split files."""
    import numpy as np
    import pyarrow.compute as pc
    from datasets import Dataset, concatenate_datasets

    tally.splits = {name: Counter() for name in writers}
    offset = 0
    for chunk in chunks:
        converted = concatenate_datasets([Dataset.from_file(str(p)) for p in chunk.files])
        eval_rows = None
        if eval_mask is not None:
            has_record = pc.is_valid(converted.data.column("record")).to_numpy(zero_copy_only=False)
            eval_rows = np.zeros(len(converted), dtype=bool)
            eval_rows[has_record] = eval_mask[offset: offset + chunk.n_records]
            offset += chunk.n_records
        elif chunk.is_eval:
            eval_rows = np.ones(len(converted), dtype=bool)
        mapped = _tokenize_chunk(tokenizer, converted, settings, chunk.names, eval_rows, num_proc, progress)
        table = mapped.data.table
        tally.add_rejects(table.column("reason"), table.column("reject"))
        for name, writer in writers.items():
            tally.splits[name].update(_split_stats(table, pc.equal(table.column("is_eval"), name == "eval")))
            writer.write(table, name == "eval")
        files = [Path(f["filename"]) for f in mapped.cache_files] + chunk.files
        del converted, mapped, table
        for file in files:
            file.unlink(missing_ok=True)


def _checked_stats(tally: _Tally) -> dict[str, dict[str, int]]:
    """PrepStats per split, after checking that every record in is kept, rejected or dropped."""
    from beam_sft.dataset.examples import PrepStats

    stats = {name: PrepStats(**{k: sums[k] for k in PrepStats().to_dict()}).to_dict()
             for name, sums in tally.splits.items()}
    if stats["train"]["records_kept"] == 0:
        raise FatalError(f"the train split is empty after truncation ({stats['train']}); raise max_length")
    dropped = sum(s["dropped_too_long"] for s in stats.values())
    kept_total = sum(s["records_kept"] for s in stats.values())
    rejected_total = sum(tally.rejected.values())
    if tally.records_in != kept_total + rejected_total + dropped:
        raise FatalError(f"bookkeeping error: {tally.records_in} records in != {kept_total} kept + "
                         f"{rejected_total} rejected + {dropped} dropped by truncation")
    return stats


def _commit_splits(final: Path, writers: dict[str, _SplitWriter], fingerprint: str | None) -> None:
    for name, writer in writers.items():
        writer.commit(f"{fingerprint or 'prepared'}-{name}")
    # The train split at the root (load_from_disk(DIR) is the training set), the eval split in eval/.
    for file in (final / "train_parts").iterdir():
        os.replace(file, final / file.name)
    (final / "train_parts").rmdir()
    if "eval" in writers:
        os.replace(final / "eval_parts", final / EVAL_DIR)


def _manifest(tokenizer, settings: DataSettings, inputs, eval_inputs, identity, fingerprint, tally: _Tally,
              stats: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {
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
            "records_in": tally.records_in,
            "records_kept": sum(s["records_kept"] for s in stats.values()),
            "rejected_total": sum(tally.rejected.values()),
            "rejected": dict(sorted(tally.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
            "dropped_too_long": sum(s["dropped_too_long"] for s in stats.values()),
            **{key: sum(s[key] for s in stats.values()) for key in (
                "truncated", "assistant_turns_cut", "total_tokens", "supervised_tokens", "supervised_return",
                "supervised_call")},
            "reasoning": {key: tally.reasoning[key] for key in REASONING_KEYS},
        },
        "missing_reasoning": settings.missing_reasoning,
        "splits": stats,
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
    from beam_sft.records.files import (
        JsonlSink,
        remove_stale_temporaries,
        replace_dir,
        temporary_path,
        write_json_atomic,
    )

    settings.check()
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
        tally = _Tally(rejects)
        chunks = _convert_pass(inputs, eval_inputs, settings, work, tally, chunk_rows=chunk_rows or CHUNK_ROWS,
                               num_proc=num_proc, progress=progress)
        # The eval split: a seeded choice among the converted training records (one byte per record).
        eval_mask = None
        if not eval_inputs and settings.eval_split_size > 0:
            eval_mask = _eval_mask(sum(c.n_records for c in chunks), settings)
        writers = {"train": _SplitWriter(final / "train_parts")}
        if eval_inputs or eval_mask is not None:
            writers["eval"] = _SplitWriter(final / "eval_parts")
        _tokenize_pass(chunks, tokenizer, settings, eval_mask, writers, tally, num_proc=num_proc, progress=progress)
        stats = _checked_stats(tally)
        rejects.commit()
        rejects = None
        _commit_splits(final, writers, fingerprint)
        manifest = {**_manifest(tokenizer, settings, inputs, eval_inputs, identity, fingerprint, tally, stats),
                    "seconds": round(time.time() - started, 3), **(extra_manifest or {})}
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


def _use_prepared(path: str, tokenizer, settings: DataSettings, eval_inputs) -> Prepared:
    """A prepared directory as the training input: checked, loaded, and split when eval_split_size asks."""
    if settings.max_records is not None:
        raise UsageError(f"{path} is a prepared dataset: max_records applies to raw data (prepare it with "
                         "`beam-sft prepare --limit N`)")
    prepared = load_prepared(path, tokenizer, settings)
    prepared.action = "loaded"
    if settings.eval_split_size > 0 and not eval_inputs:
        if prepared.eval is not None:
            raise UsageError(f"{path} already holds an eval split; drop eval_split_size")
        from beam_sft.template.tokenizer import stop_token_ids

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
        prepared = _use_prepared(inputs[0], tokenizer, settings, eval_inputs)
        _record_action(record_dir, state.process_index, "loaded", str(inputs[0]), prepared.manifest["tokenizer"])
        return prepared

    settings.check()
    sources = data_sources(inputs, settings.split)
    identity = {"train": source_identity(sources)}
    if eval_inputs:
        identity["eval"] = source_identity(data_sources(eval_inputs, "test"))
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

    _main_process_first(state, build_if_missing)
    prepared = load_prepared(path)
    prepared.action = action
    _record_action(record_dir, state.process_index, action, str(path), fp)
    return prepared
