"""`--eval_beam_steps N`: the `beam-sft eval` metrics during training, every N optimizer steps.

A `TrainerCallback` generates the first assistant turn of each record of a fixed held-out sample (the eval
split's records, converted once before training) with `beam_sft.eval.run.evaluate_trainer`, the code
`--eval_beam` runs after training, and logs the overall metrics through the trainer (`Trainer.log`: the log
history, TensorBoard, W&B, trackio) as `eval_beam/<metric>`. The main process generates; the other ranks wait
at its barrier. Under FSDP/DeepSpeed nothing is generated (a warning, as for `--eval_beam`).
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

logger = logging.getLogger(__name__)


class BeamEvalCallback(TrainerCallback):
    """Score `records` like `beam-sft eval` every `every` steps (and at the last step), then train on."""

    def __init__(self, trainer, tokenizer, records: list[dict], every: int):
        self.trainer, self.tokenizer, self.records, self.every = trainer, tokenizer, records, every

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.run(state.global_step)
        return control

    def run(self, step: int) -> None:
        from beam_sft.eval.run import evaluate_trainer

        model = self.trainer.model
        was_training = model.training
        try:
            summary = evaluate_trainer(self.trainer, self.tokenizer, self.records)
        finally:
            model.train(was_training)  # generation put the model in eval mode
        if summary is not None:
            logger.info("eval_beam at step %d: well_formed %s", step, summary.get("well_formed"))


def add_beam_eval(trainer, tokenizer, script_args, settings) -> None:
    """Attach the callback when `--eval_beam_steps` is set: the held-out records are read here, once."""
    if not script_args.eval_beam_steps:
        return
    import tempfile

    from beam_sft.dataset.prepare import eval_records
    from beam_sft.train.data import eval_inputs, training_inputs

    records = []
    if trainer.accelerator.is_main_process:
        with tempfile.TemporaryDirectory(prefix="beam_eval_") as work:
            records = list(eval_records(training_inputs(script_args), settings, work,
                                        eval_dataset_name=eval_inputs(script_args)))
    trainer.add_callback(BeamEvalCallback(trainer, tokenizer, records, script_args.eval_beam_steps))
