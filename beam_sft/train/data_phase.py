"""The data phase as `scripts/train.py` runs it: prepared (or streamed) datasets, logged, counted and checked."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from beam_sft.dataset.examples import PrepStats
from beam_sft.dataset.mixture import resolve, shares
from beam_sft.dataset.prepare import prepare_data
from beam_sft.dataset.reasoning_stats import notes
from beam_sft.dataset.settings import REJECTS, DataSettings, PhaseOptions
from beam_sft.dataset.stream import stream_training_data
from beam_sft.errors import FatalError, Reason, UsageError
from beam_sft.records.files import data_sources, source_label, source_options
from beam_sft.storage import atomic_output, write_json_atomic

logger = logging.getLogger(__name__)


def training_inputs(script_args, *, seed: int = 0, base: str | os.PathLike = "."):
    """What the data phase reads: the config's `datasets:` mixture, resolved (uncounted under --streaming: its
    shares are drawn as it streams), else `dataset_name` (its sources when hub options or columns are set)."""
    if getattr(script_args, "datasets", None):
        entries = [e if isinstance(e, dict) else {k: v for k, v in vars(e).items() if v is not None}
                   for e in script_args.datasets]
        return resolve(entries, base=base, seed=seed, where="datasets (--config)",
                       count=not getattr(script_args, "streaming", False))
    if not (options := source_options(script_args)):
        return script_args.dataset_name
    return data_sources([script_args.dataset_name], script_args.dataset_train_split, options)


def eval_inputs(script_args) -> list | None:
    """The separate eval data: `eval_dataset_name` at split `dataset_test_split` (default test), or else, when
    `dataset_test_split` is set, that split of `dataset_name` (which must then have splits: a hub dataset or a
    dataset directory). None when neither is set."""
    split = getattr(script_args, "dataset_test_split", None)
    if script_args.eval_dataset_name:
        return data_sources([script_args.eval_dataset_name], split or "test", source_options(script_args, hub=False))
    if not split:
        return None
    if getattr(script_args, "datasets", None):
        raise UsageError("dataset_test_split picks a split of dataset_name; a `datasets:` mixture draws its eval "
                         "split with eval_split_size (or give eval_dataset_name)")
    sources = data_sources([script_args.dataset_name], split, source_options(script_args))
    if not all(src.kind in ("hub", "disk") for src in sources):
        raise UsageError(f"dataset_test_split {split!r}: {script_args.dataset_name} has no splits (files); give the "
                         "eval data as eval_dataset_name, or a hub dataset or dataset directory as dataset_name")
    if sources == data_sources([script_args.dataset_name], script_args.dataset_train_split,
                               source_options(script_args)):
        raise UsageError(f"dataset_test_split {split!r} is the training split")
    return sources


def streamed_note(inputs) -> str | None:
    """One line naming a streamed mixture's entries and shares (None for plain inputs)."""
    if not (plans := getattr(inputs, "plans", None)):
        return None
    fractions = [p.entry.fraction for p in plans]
    weights = shares(fractions) if fractions[0] is not None else [None] * len(plans)
    return "a mixture of " + ", ".join(
        f"{label} ({'every row, in turn' if w is None else f'{100 * w:.0f}% of the rows'}"
        f"{'' if p.entry.max_records is None else f', at most {p.entry.max_records}'})"
        for label, p, w in zip(inputs.labels(), plans, weights, strict=True))


def training_datasets(dataset_name, tokenizer, settings: DataSettings, options: PhaseOptions | None = None, *,
                      eval_dataset_name=None, cache_dir: str | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """The data phase of `scripts/train.py`: (train, eval or None, stats), logged and checked. The main
    process copies the rejects to `options.output_dir/rejects.jsonl` and writes the stats (per split, and
    `data`: the whole input's counts) to `data_stats.json` there. `options.streaming`: `stream_training_data`
    instead (nothing cached). `eval_dataset_name`: a path or id (its "test" split), or `eval_inputs`' sources."""
    options = options or PhaseOptions()
    output_dir, is_main_process = options.output_dir, options.main_process
    if options.streaming:
        train = stream_training_data(dataset_name, tokenizer, settings, options)
        eval_ds = None
        if eval_dataset_name:
            eval_ds = stream_training_data(eval_dataset_name, tokenizer, replace(settings, split="test",
                                           max_records=None), replace(options, shuffle_buffer=None))
        names = streamed_note(dataset_name) or (dataset_name if isinstance(dataset_name, str)
                                                else ", ".join(source_label(s) for s in dataset_name))
        logger.info("data: streaming %s (converted and tokenized on the fly, %d shards)", names, train.n_shards)
        return train, eval_ds, {}
    if plans := getattr(dataset_name, "plans", None):
        logger.info("data: mixture of %s", ", ".join(
            f"{p.entry.path}{'' if p.entry.data_files is None else ':' + str(p.entry.data_files)} ({p.taken}/{p.rows})"
            for p in plans))
    eval_list = [eval_dataset_name] if isinstance(eval_dataset_name, str) else eval_dataset_name
    prepared = prepare_data(dataset_name, tokenizer, settings, eval_inputs=eval_list or None, cache_dir=cache_dir,
                            options=options)
    counts = prepared.manifest.get("counts", {})
    for entry in prepared.manifest.get("mixture") or ():
        logger.info("data: source %s: %d rows read, %d taken, %d rejected (%d duplicates)", entry["files"],
                    entry["read"], entry["taken"], sum(entry["rejected"].values()), entry["duplicates"])
    logger.info("data: %s (%s)", prepared.path, "built now" if prepared.action == "tokenized" else "from cache")
    if counts:
        logger.info("data: %d records in, %d kept, %d rejected %s, %d dropped by truncation", counts["records_in"],
                    counts["records_kept"], counts["rejected_total"], counts["rejected"], counts["dropped_too_long"])
    for note in notes(counts.get("reasoning"), prepared.manifest.get("missing_reasoning"), counts.get("rejected", {})):
        logger.warning(note)
    if counts.get("rejected", {}).get(Reason.INTERNAL_ERROR.value):
        logger.warning("!!! %d records failed with an unexpected error (reason internal_error): a converter bug; "
                       "see rejects.jsonl", counts["rejected"][Reason.INTERNAL_ERROR.value])
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
    stats = {**prepared.stats, "data": {"path": prepared.path, "action": prepared.action, **counts}}
    if prepared.manifest.get("eval_sources") and prepared.eval is not None:  # for beam_sft.train.source_eval
        stats["data"]["eval_sources"] = prepared.manifest["eval_sources"]
        logger.info("data: eval rows per source: %s", ", ".join(
            f"{s['label']} {s['rows']}" for s in prepared.manifest["eval_sources"]))
    if is_main_process and output_dir is not None:
        write_json_atomic(os.path.join(output_dir, "data_stats.json"), stats)
    return prepared.train, prepared.eval, stats
