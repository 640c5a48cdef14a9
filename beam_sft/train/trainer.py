"""Model side of `scripts/train.py`: the embedded tiny model and the trainer.

* `build_tiny_model` makes the quickstart's randomly initialised causal LM from `configs/models/tiny`,
  reproducibly (fixed seed), sized to the bundled tokenizer.
* `BeamSFTTrainer` is TRL's `SFTTrainer` that also logs how many supervised (loss-bearing) tokens it has
  trained on, next to TRL's `num_tokens` (every token seen).
* `is_well_formed` (whether a generation parsed into a proper Beam turn) lives in `beam_sft.eval.evaluate`, with
  the generate-and-parse loop; it is re-exported here for older imports.
"""

from __future__ import annotations

import logging
from pathlib import Path

from beam_sft.errors import FatalError
from beam_sft.eval.evaluate import is_well_formed  # noqa: F401  (re-export; the rule lives in beam_sft.eval.evaluate)

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = REPO_DIR / "configs" / "models" / "tiny"


def build_tiny_model(tokenizer, config_dir: str | Path | None = None, seed: int = 0):
    """A randomly initialised causal LM from `config_dir` (default configs/models/tiny), weights fixed by `seed`.

    The config's vocabulary must hold every token id of `tokenizer`; its special-token ids are set from it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dir = Path(config_dir) if config_dir is not None else TINY_MODEL_DIR
    if not (config_dir / "config.json").is_file():
        raise FatalError(f"tiny model config not found: {config_dir / 'config.json'}")
    config = AutoConfig.from_pretrained(str(config_dir))
    if config.vocab_size < len(tokenizer):
        raise FatalError(
            f"{config_dir / 'config.json'}: vocab_size {config.vocab_size} < tokenizer size {len(tokenizer)}; "
            "the tiny model must cover every token id"
        )
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id
    # fork_rng: the seed fixes the weights without moving the caller's global RNG streams.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    # Both stop tokens end generation (a tool call ends at <|call|>); a checkpoint saves this file as is.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|call|>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def make_trainer_class():
    """`BeamSFTTrainer`, built lazily so importing this module does not import TRL."""
    from torch import as_tensor as torch_as_tensor
    from trl import SFTTrainer

    class BeamSFTTrainer(SFTTrainer):
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
            super().log(logs, start_time)

    return BeamSFTTrainer
