"""The trainer of `scripts/train.py`.

* `BeamSFTTrainer` is TRL's `SFTTrainer` that also logs how many supervised (loss-bearing) tokens it has
  trained on, next to TRL's `num_tokens` (every token seen), and keeps the evaluations in progress
  (`evaluation_calls`) for the per-source eval loss (`beam_sft.train.source_eval`).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class _EvaluationCalls:
    """The evaluations in progress, for `beam_sft.train.source_eval` (which acts on the outermost one only)."""

    evaluation_calls: list[tuple[str, bool]]  # (metric_key_prefix, on the trainer's own eval_dataset), outermost first

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        self.evaluation_calls.append((metric_key_prefix, eval_dataset is None))
        try:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self.evaluation_calls.pop()

    def _label_eval_metrics(self) -> None:
        """TRL names its eval metrics `eval_<key>` whatever the evaluation's prefix: under `eval_<label>` (a
        source, a dict's dataset) they become `eval_<label>_<key>`, not a second `eval_mean_token_accuracy` at
        the same step."""
        if not self.evaluation_calls or not self.evaluation_calls[-1][0].startswith("eval_"):
            return
        from collections import defaultdict

        label = self.evaluation_calls[-1][0].removeprefix("eval_")
        self._metrics["eval"] = defaultdict(list, {f"{label}_{k}": v for k, v in self._metrics["eval"].items()})


def make_trainer_class():
    """`BeamSFTTrainer`, built lazily so importing this module does not import TRL."""
    from torch import as_tensor as torch_as_tensor
    from trl import SFTTrainer

    class BeamSFTTrainer(_EvaluationCalls, SFTTrainer):
        """SFTTrainer that counts supervised tokens (labels != -100 after the shift) across processes.

        `plain_loss=True` computes the loss from the model's own logits (`cross_entropy`, summed and divided
        by the same token count TRL uses) instead of TRL's chunked fused LM head, which on CPU runs about
        3x slower for a small model with a large vocabulary. Same value, checked by tests/test_train.py.
        MoE models: the router (load-balancing) loss is added once, as in TRL's path, and logged as `aux_loss`.
        """

        def __init__(self, *args, plain_loss: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self._supervised_tokens = 0
            self.plain_loss = plain_loss
            self.evaluation_calls = []  # _EvaluationCalls

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.model.training and "labels" in inputs:
                # Position 0 of a row is never predicted, so it never carries loss.
                local = (inputs["labels"][..., 1:] != -100).sum()
                self._supervised_tokens += int(self.accelerator.gather_for_metrics(local.reshape(1)).sum())
            if not self.plain_loss or return_outputs or self.args.loss_type != "nll":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return self._plain_loss(model, inputs, num_items_in_batch)

        def _plain_loss(self, model, inputs, num_items_in_batch):
            import torch.nn.functional as F

            mode = "train" if self.model.training else "eval"
            labels = inputs["labels"]
            forward = {k: v for k, v in inputs.items() if k != "labels"}
            forward["use_cache"] = False  # also what lets a packed row get its block-diagonal mask
            if self.aux_loss_enabled:
                forward["output_router_logits"] = True
            # No labels to the model: its own loss would add the router loss a second time.
            outputs = model(**forward)
            logits = outputs.logits[:, :-1].float()
            target = labels[:, 1:]
            valid = target != -100
            nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="sum")
            num_tokens = valid.sum() if num_items_in_batch is None else num_items_in_batch
            loss = nll / torch_as_tensor(num_tokens).clamp(min=1)
            # As TRL (and Trainer): num_items_in_batch counts every rank's tokens and DDP averages gradients.
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            if self.aux_loss_enabled:
                # As TRL's fused path: the router loss is a per-micro-batch mean, added once, weighted by the
                # coefficient TRL resolved from SFTConfig / the model config, averaged over accumulation steps.
                steps = self.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
                loss = loss + self.router_aux_loss_coef * outputs.aux_loss / steps
                aux = self.accelerator.gather_for_metrics(outputs.aux_loss.detach().reshape(1)).mean().item()
                self._metrics[mode]["aux_loss"].append(aux)
            correct = ((logits.detach().argmax(-1) == target) & valid).sum()
            n_valid = self.accelerator.gather_for_metrics(valid.sum().reshape(1)).sum()
            n_correct = self.accelerator.gather_for_metrics(correct.reshape(1)).sum()
            self._metrics[mode]["mean_token_accuracy"].append((n_correct / n_valid).item() if n_valid > 0 else 0.0)
            if mode == "train":
                if "attention_mask" in inputs:
                    local_tokens = inputs["attention_mask"].sum()
                else:
                    local_tokens = torch_as_tensor(inputs["input_ids"].numel())
                self._total_train_tokens += int(self.accelerator.gather_for_metrics(local_tokens.reshape(1)).sum())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.model.training:
                logs["num_supervised_tokens"] = float(self._supervised_tokens)
            else:
                self._label_eval_metrics()
            super().log(logs, start_time)

    return BeamSFTTrainer
