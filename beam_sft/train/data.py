"""The data phase as `scripts/train.py` runs it: prepared (or streamed) datasets, logged, counted and checked."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from beam_sft.dataset.prepare import prepare_data
from beam_sft.dataset.settings import REJECTS, DataSettings
from beam_sft.dataset.stream import stream_training_data
from beam_sft.errors import FatalError, Reason

logger = logging.getLogger(__name__)


def training_inputs(script_args, *, seed: int = 0, base: str | os.PathLike = "."):
    """What the data phase reads: the `datasets:` mixture of the config (beam_sft.dataset.mixture), resolved,
    else `dataset_name`."""
    if getattr(script_args, "datasets", None):
        from beam_sft.dataset.mixture import resolve

        entries = [e if isinstance(e, dict) else {k: v for k, v in vars(e).items() if v is not None}
                   for e in script_args.datasets]
        return resolve(entries, base=base, seed=seed, where="datasets (--config)")
    return script_args.dataset_name


def prepared_mixture_note(inputs) -> str | None:
    """One line naming a mixture's entries and shares (None for plain inputs)."""
    plans = getattr(inputs, "plans", None)
    if not plans:
        return None
    return ", ".join(f"{p.entry.path}{'' if p.entry.data_files is None else ':' + str(p.entry.data_files)} "
                     f"({p.taken}/{p.rows})" for p in plans)


def training_datasets(
    dataset_name,
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
    """The data phase of `scripts/train.py`: (train, eval or None, stats), logged and checked; stats is what
    `output_dir/data_stats.json` holds (per split, and `data`: the whole input's counts).

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
    if counts_mixture := prepared_mixture_note(dataset_name):
        logger.info("data: mixture of %s", counts_mixture)
    prepared = prepare_data(dataset_name, tokenizer, settings, eval_inputs=[eval_dataset_name] if eval_dataset_name
                            else None, cache_dir=cache_dir, num_proc=num_proc, record_dir=output_dir)
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
    stats = {**prepared.stats, "data": {"path": prepared.path, "action": prepared.action, **counts}}
    if is_main_process and output_dir is not None:
        write_json_atomic(os.path.join(output_dir, "data_stats.json"), stats)
    return prepared.train, prepared.eval, stats
