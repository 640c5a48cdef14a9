"""The `beam-sft eval` metrics during training: docs/training.md#watching-beam-metrics-during-training."""

from __future__ import annotations

import logging
import tempfile

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def beam_metric_named(metric_for_best_model: str | None) -> bool:
    """Whether `metric_for_best_model` is an `eval_beam/` metric (the Trainer adds the `eval_` it lacks)."""
    return bool(metric_for_best_model) and metric_for_best_model.removeprefix("eval_").startswith("beam/")


class BeamEvalCallback(TrainerCallback):
    """Score `records` like `beam-sft eval` every `every` steps (and at the last) and/or at each evaluation."""

    def __init__(self, trainer, tokenizer, records: list[dict], every: int | None, at_evaluate: bool = False):
        self.trainer, self.tokenizer, self.records = trainer, tokenizer, records
        self.every, self.at_evaluate = every, at_evaluate
        self._last: tuple[int, dict[str, float] | None] | None = None  # (step, metrics) of the last run

    def on_step_end(self, args, state, control, **kwargs):
        if self.every and (state.global_step % self.every == 0 or state.global_step == state.max_steps):
            self.run(state.global_step)
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # With a dict of eval datasets the Trainer evaluates (and calls this) once per dataset and merges the
        # dicts: the Beam metrics are generated once per step and added to each.
        if self.at_evaluate and metrics is not None:
            metrics.update(self.run(state.global_step) or {})
        return control

    def run(self, step: int) -> dict[str, float] | None:
        """The metrics at `step`, generated (and logged) once per step however many hooks ask."""
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        from beam_sft.eval.run import evaluate_trainer

        model = self.trainer.model
        was_training = model.training
        try:
            metrics = evaluate_trainer(self.trainer, self.tokenizer, self.records)
        finally:
            model.train(was_training)  # generation put the model in eval mode
        self._last = (step, metrics)
        if metrics is not None:
            logger.info("eval_beam at step %d: well_formed %s", step, metrics.get("eval_beam/well_formed"))
        return metrics


def held_out_records(trainer, script_args, settings) -> list[dict]:
    """The eval split's Beam records, read once on the main process and broadcast, so every rank has them
    (each generates a share). Warns, once, when the split is empty: no Beam metric will be logged."""
    from accelerate.utils import broadcast_object_list

    from beam_sft.dataset.prepare import eval_records
    from beam_sft.train.data_phase import eval_inputs, training_inputs

    box: list = [None]
    if trainer.accelerator.is_main_process:
        with tempfile.TemporaryDirectory(prefix="beam_eval_") as work:
            box[0] = list(eval_records(training_inputs(script_args), settings, work,
                                       eval_dataset_name=eval_inputs(script_args)))
    if trainer.accelerator.num_processes > 1:
        box = broadcast_object_list(box)
    if not (records := box[0]) and trainer.accelerator.is_main_process:
        why = ("deduplication removed every eval record: each equals a training record or an earlier one; "
               "--dedup false keeps them" if settings.dedup else "it holds no record")
        logger.warning("eval_beam: the eval split is empty (%s); no eval_beam/<metric> will be logged", why)
    return records


def beam_eval_wanted(script_args, training_args) -> bool:
    return bool(script_args.eval_beam or script_args.eval_beam_steps or beam_at_evaluate(script_args, training_args))


def beam_at_evaluate(script_args, training_args) -> bool:
    return bool(script_args.eval_beam_on_evaluate or beam_metric_named(training_args.metric_for_best_model))


def add_beam_eval(trainer, tokenizer, script_args, training_args, records: list[dict]) -> None:
    """Attach the callback when Beam metrics are asked for, then early stopping (`--early_stopping_patience`):
    after it (and after the per-source eval loss), so it sees the Beam metrics (and `eval_<source>_loss`)."""
    every, at_evaluate = script_args.eval_beam_steps, beam_at_evaluate(script_args, training_args)
    if every or at_evaluate:
        trainer.add_callback(BeamEvalCallback(trainer, tokenizer, records, every, at_evaluate))
    if script_args.early_stopping_patience is not None:
        from beam_sft.train.source_eval import OuterEarlyStopping

        trainer.add_callback(OuterEarlyStopping(trainer, script_args.early_stopping_patience,
                                                script_args.early_stopping_threshold))
