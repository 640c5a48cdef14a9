"""Eval loss per data source (docs/training.md#dataset-mixtures, "Eval loss per source")."""

from __future__ import annotations

import logging

from transformers import EarlyStoppingCallback, TrainerCallback

from beam_sft.errors import FatalError

logger = logging.getLogger(__name__)


def by_source(eval_dataset, eval_sources: list[dict] | None) -> dict:
    """label -> that source's rows of `eval_dataset` (`eval_sources`: the manifest's), if it has any."""
    if not eval_sources or eval_dataset is None:
        return {}
    if sum(s["rows"] for s in eval_sources) != len(eval_dataset):
        raise FatalError(f"the manifest's eval_sources count {sum(s['rows'] for s in eval_sources)} eval rows, "
                         f"the eval split has {len(eval_dataset)}")
    # In memory: no indices file written next to the prepared data (shared by every rank).
    return {s["label"]: eval_dataset.select([i for start, stop in s["ranges"] for i in range(start, stop)],
                                            keep_in_memory=True) for s in eval_sources if s["rows"]}


class SourceEvalCallback(TrainerCallback):
    """At each evaluation of the trainer's eval split, the same evaluation on each source's rows."""

    def __init__(self, trainer, datasets: dict) -> None:
        self.trainer, self.datasets = trainer, datasets

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # Only the outermost evaluation of the trainer's own split, so the nested ones never recurse. `metrics`
        # is the Trainer's dict, by reference: what is added here reaches `_determine_best_metric` too.
        if metrics is None or self.trainer.evaluation_calls != [("eval", True)]:
            return control
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


def add_source_eval(trainer, script_args, eval_dataset, stats: dict) -> None:
    """Attach `SourceEvalCallback` when asked (or by default, for several sources)."""
    from datasets import Dataset

    if not isinstance(eval_dataset, Dataset):
        if script_args.eval_per_source:
            logger.warning("eval_per_source: no prepared eval split (streamed, or none); only eval_loss is logged")
        return
    datasets = by_source(eval_dataset, (stats.get("data") or {}).get("eval_sources"))
    if script_args.eval_per_source and len(datasets) < 2:
        logger.warning("eval_per_source: the eval split holds %s; only eval_loss is logged",
                       f"rows of one source ({next(iter(datasets))})" if datasets else "no per-source rows")
    if len(datasets) < 2 or script_args.eval_per_source is False:  # unset: on for several sources
        return
    trainer.add_callback(SourceEvalCallback(trainer, datasets))
    logger.info("eval: per-source eval loss for %s", ", ".join(f"{k} ({len(v)} rows)" for k, v in datasets.items()))
