"""`BeamSFTTrainer`: TRL's `SFTTrainer`, logging supervised tokens, with Beam's fault handling (faults.py)."""

from __future__ import annotations

from collections import defaultdict

from beam_sft.train.checkpoints import save_guarded
from beam_sft.train.faults import NonFiniteGuard


class _RowIndexed:
    """A map-style dataset whose rows also carry their index as `beam_row`, so a batch knows its records."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return {**self.dataset[int(index)], "beam_row": int(index)}

    def __getitems__(self, indices):
        rows = self.dataset[[int(i) for i in indices]]  # one Arrow read for the batch
        return [{**{name: column[j] for name, column in rows.items()}, "beam_row": int(i)}
                for j, i in enumerate(indices)]


class _RowsCollator:
    """The trainer's collator, with the rows' `beam_row` indices passed along as the batch's `beam_rows`."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, examples):
        from torch import tensor

        rows = [example.pop("beam_row") for example in examples if "beam_row" in example]
        batch = self.collator(examples)
        if rows:
            batch["beam_rows"] = tensor(rows)
        return batch


class _Faults:
    """The trainer's side of beam_sft/train/faults.py and checkpoints.py."""

    def _init_faults(self, guard) -> None:
        self.guard = guard if guard is not None else NonFiniteGuard()
        self.data_collator = _RowsCollator(self.data_collator)
        self.committed_steps: set[int] = set()  # steps checkpointed by this process's run

    def _log_faults(self, logs: dict) -> None:
        if self.guard.skipped:
            logs["nonfinite_steps_skipped"] = float(self.guard.skipped)
        if self.guard.empty_batches:
            logs["batches_without_trained_tokens"] = float(self.guard.empty_batches)

    def _count_trained_tokens(self, labels) -> int:
        # Position 0 of a row is never predicted, so it never carries loss.
        local = (labels[..., 1:] != -100).sum()
        if int(local) == 0:
            self.guard.empty_batches += 1  # counted, and its loss is 0 (not 0/0)
        self._supervised_tokens += int(self.accelerator.gather_for_metrics(local.reshape(1)).sum())
        return int(local)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self._signature_columns is not None and "beam_row" not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, "beam_row"]

    def get_train_dataloader(self):
        import datasets

        original = self.train_dataset
        if isinstance(original, datasets.Dataset) and not getattr(self.args, "group_by_length", False):
            self.train_dataset = _RowIndexed(original)
        try:
            return super().get_train_dataloader()
        finally:
            self.train_dataset = original

    def training_step(self, model, inputs, num_items_in_batch=None):
        rows = inputs.pop("beam_rows", None)
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.guard.seen(loss, rows)
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self.guard.check(self, grad_norm)  # before the optimizer step: stop, or drop this step's gradients
        return grad_norm

    def _save_checkpoint(self, model, trial):
        save_guarded(self, lambda: super(_Faults, self)._save_checkpoint(model, trial),
                     self._get_output_dir(trial=trial))

    def _run_epoch(self, *args, **kwargs):
        # transformers trains the rest of a resumed epoch before it looks at max_steps: a run resumed at
        # its last step would train one step more (and write checkpoint-<max_steps + 1>).
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def _issue_warnings_after_load(self, load_result):
        # Tied weights (lm_head = embed_tokens) are saved once: their "missing" alias is not missing. A
        # wrapped model (PEFT) names the aliases with a prefix the checkpoint's keys may lack.
        aliases = ({n for n, _ in self.model.named_parameters(remove_duplicate=False)}
                   - {n for n, _ in self.model.named_parameters()})
        tied = aliases | {name.split(".", 1)[1] for name in aliases if "." in name}
        if load_result.missing_keys and set(load_result.missing_keys) <= tied:
            load_result.missing_keys.clear()
        return super()._issue_warnings_after_load(load_result)


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
        """TRL names its eval metrics `eval_<key>` whatever the prefix: under `eval_<label>` (a source, a
        dict's dataset) they become `eval_<label>_<key>`, not a second `eval_mean_token_accuracy` per step."""
        if not self.evaluation_calls or not self.evaluation_calls[-1][0].startswith("eval_"):
            return
        label = self.evaluation_calls[-1][0].removeprefix("eval_")
        self._metrics["eval"] = defaultdict(list, {f"{label}_{k}": v for k, v in self._metrics["eval"].items()})


def make_trainer_class():
    """`BeamSFTTrainer`, built lazily so importing this module does not import TRL."""
    from torch import as_tensor as torch_as_tensor
    from trl import SFTTrainer

    class BeamSFTTrainer(_EvaluationCalls, _Faults, SFTTrainer):
        """SFTTrainer that counts supervised tokens (labels != -100 after the shift) across processes.
        `plain_loss`: the same loss from the model's logits (`cross_entropy` over TRL's token count, the router
        loss added once) instead of TRL's chunked fused LM head, about 3x slower on CPU for a small model."""

        def __init__(self, *args, plain_loss: bool = False, guard=None, **kwargs):
            super().__init__(*args, **kwargs)
            self._supervised_tokens = 0
            self.plain_loss = plain_loss
            self.evaluation_calls = []  # _EvaluationCalls
            self._init_faults(guard)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            trained = self._count_trained_tokens(inputs["labels"]) if self.model.training and "labels" in inputs else 1
            # A batch (or step) without one trained token: TRL's fused path would divide 0 by 0.
            nothing = trained == 0 or (num_items_in_batch is not None and int(num_items_in_batch) == 0)
            if (not self.plain_loss and not nothing) or return_outputs or self.args.loss_type != "nll":
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
                mask = inputs.get("attention_mask")
                local_tokens = mask.sum() if mask is not None else torch_as_tensor(inputs["input_ids"].numel())
                self._total_train_tokens += int(self.accelerator.gather_for_metrics(local_tokens.reshape(1)).sum())
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.model.training:
                logs["num_supervised_tokens"] = float(self._supervised_tokens)
                self._log_faults(logs)
            else:
                self._label_eval_metrics()
            super().log(logs, start_time)

    return BeamSFTTrainer
