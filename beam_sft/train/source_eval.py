"""Eval loss per data source: `eval_<label>_loss` for each source of a `datasets:` mixture, next to `eval_loss`.

The data phase records which mixture source each row of the eval split came from (the manifest's
`eval_sources`: per source its label and row ranges, `beam_sft.dataset.prepare`). The trainer keeps the whole
eval split as its `eval_dataset`, so `eval_loss` is what it always was (and `metric_for_best_model: loss`
keeps working, which a dict of eval datasets would break: the Trainer then reports no plain `eval_loss`).
`SourceEvalCallback`, at each evaluation of that split, runs `trainer.evaluate(source_rows,
metric_key_prefix="eval_<label>")` once per source and adds what it returns to the evaluation's metrics dict
(the Trainer hands its callbacks that dict by reference, then to `_determine_best_metric`): so
`metric_for_best_model: eval_<label>_loss` and early stopping on it work. Each source's figures are also
logged on their own (log history, TensorBoard `eval/<label>_loss`, ...), as transformers logs each dataset of
a dict.

The nested evaluations fire `on_evaluate` too (as the Trainer does for each dataset of a dict); this callback
acts only on the outermost evaluation of the trainer's own eval split (`BeamSFTTrainer.evaluation_calls`), so
it never recurses, and `OuterEarlyStopping` counts only outer evaluations. Every rank runs the same
evaluations in the same order (the rows come from the prepared data, identical on every rank). The cost: the
eval split is evaluated twice per evaluation (whole, then by source).
"""

from __future__ import annotations

import logging

from transformers import EarlyStoppingCallback, TrainerCallback

from beam_sft.errors import FatalError

logger = logging.getLogger(__name__)


def by_source(eval_dataset, eval_sources: list[dict] | None) -> dict:
    """label -> that source's rows of `eval_dataset` (`eval_sources` as the manifest gives it); sources with
    no eval row are left out."""
    if not eval_sources or eval_dataset is None:
        return {}
    if sum(s["rows"] for s in eval_sources) != len(eval_dataset):
        raise FatalError(f"the manifest's eval_sources count {sum(s['rows'] for s in eval_sources)} eval rows, "
                         f"the eval split has {len(eval_dataset)}")
    out = {}
    for source in eval_sources:
        if source["rows"]:
            rows = [i for start, stop in source["ranges"] for i in range(start, stop)]
            # in memory: no indices file written next to the prepared data (shared by every rank)
            out[source["label"]] = eval_dataset.select(rows, keep_in_memory=True)
    return out


def per_source_wanted(script_args, datasets: dict) -> bool:
    """`--eval_per_source`: true, false, or unset (on when the eval split holds more than one source)."""
    wanted = script_args.eval_per_source
    if wanted and len(datasets) < 2:
        logger.warning("eval_per_source: the eval split holds %s; only eval_loss is logged",
                       f"rows of one source ({next(iter(datasets))})" if datasets else "no per-source rows")
        return False
    return len(datasets) > 1 if wanted is None else bool(wanted)


class SourceEvalCallback(TrainerCallback):
    """At each evaluation of the trainer's eval split, the same evaluation on each source's rows."""

    def __init__(self, trainer, datasets: dict) -> None:
        self.trainer, self.datasets = trainer, datasets

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics is None or self.trainer.evaluation_calls != [("eval", True)]:
            return control  # a nested evaluation (ours, or a dict's), or one on other data
        for label, dataset in self.datasets.items():
            prefix = f"eval_{label}"
            out = self.trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
            metrics.update({k: v for k, v in out.items() if k.startswith(f"{prefix}_")})
        return control


class OuterEarlyStopping(EarlyStoppingCallback):
    """transformers' EarlyStoppingCallback counting only outermost evaluations: a per-source evaluation inside
    one neither lacks the metric (a warning) nor counts twice."""

    def __init__(self, trainer, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trainer = trainer

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        if len(getattr(self.trainer, "evaluation_calls", [])) > 1:
            return control
        return super().on_evaluate(args, state, control, metrics, **kwargs)


def add_source_eval(trainer, script_args, eval_dataset, stats: dict) -> dict:
    """Attach `SourceEvalCallback` when asked (or by default, for several sources); returns label -> rows."""
    from datasets import Dataset

    if not isinstance(eval_dataset, Dataset):
        if script_args.eval_per_source:
            logger.warning("eval_per_source: no prepared eval split (streamed, or none); only eval_loss is logged")
        return {}
    datasets = by_source(eval_dataset, (stats.get("data") or {}).get("eval_sources"))
    if not per_source_wanted(script_args, datasets):
        return {}
    trainer.add_callback(SourceEvalCallback(trainer, datasets))
    logger.info("eval: per-source eval loss for %s", ", ".join(f"{k} ({len(v)} rows)" for k, v in datasets.items()))
    return datasets
