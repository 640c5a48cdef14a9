"""Row: training the tiny model on CPU, padded vs packed (TRL's BFD packing, padding-free)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from benchmarks.rows.measure import REPO_DIR, _log


def _tiny_model(tokenizer, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(REPO_DIR / "configs" / "models" / "tiny"))
    # The model must cover every token id of the tokenizer; round up to a multiple of 64 as usual.
    config.vocab_size = max(config.vocab_size, -(-len(tokenizer) // 64) * 64)
    config.max_position_embeddings = max(config.max_position_embeddings, 4096)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model


def _instrumented(base):
    """(trainer class, step-timer callback class): the trainer counts the positions the model computes on and
    the real tokens among them, the callback times each optimizer step."""
    from transformers import TrainerCallback

    class CountingTrainer(base):
        """Counts, per step, the positions the model computes on and how many of them are real tokens."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.positions: list[int] = []
            self.real: list[int] = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                ids = inputs["input_ids"]
                mask = inputs.get("attention_mask")
                self.positions.append(int(ids.numel()))
                self.real.append(int(mask.sum()) if mask is not None else int(ids.numel()))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)

    return CountingTrainer, StepTimer


def bench_training(tokenizer, records: list[dict], *, steps: int, max_length: int, padded_batch: int,
                   packed_batch: int, seed: int, workdir: Path, threads: int) -> dict:
    """A fixed number of optimizer steps, padded vs packed (BFD, padding-free), on the same prepared data."""
    import torch
    from trl import SFTConfig

    from beam_sft.train.trainer import make_trainer_class

    sys.path.insert(0, str(REPO_DIR / "tests"))
    from inmemory import prepare_dataset  # the in-memory reference path lives with the tests

    torch.set_num_threads(threads)

    dataset, stats = prepare_dataset(tokenizer, records, max_length=max_length, policy="turn",
                                     assistant_only_loss=True, name="bench")
    CountingTrainer, StepTimer = _instrumented(make_trainer_class())

    figures: dict = {"records": len(records), "records_kept": stats.records_kept, "max_length": max_length,
                     "steps": steps}
    for name, packing, batch in (("padded", False, padded_batch), ("packed", True, packed_batch)):
        _log(f"training: {name}, {steps} steps, batch {batch}, max_length {max_length}")
        args = SFTConfig(
            output_dir=str(workdir / f"train-{name}"),
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=1e-3,
            max_length=max_length,
            packing=packing,
            packing_strategy="bfd",
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=10_000,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=seed,
            shuffle_dataset=True,
        )
        timer = StepTimer()
        trainer = CountingTrainer(model=_tiny_model(tokenizer, seed), args=args, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[timer])
        # The trainer prints its log dicts when tqdm is off; keep stdout for the table.
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
        # The first step pays for lazy initialisation (allocator, kernels); it is left out of the rate.
        skip = 1 if steps > 2 else 0
        real, positions, seconds = sum(trainer.real[skip:]), sum(trainer.positions[skip:]), sum(timer.times[skip:])
        figures[f"{name}_tokens_per_s"] = real / seconds
        figures[f"{name}_positions_per_s"] = positions / seconds
        figures[f"{name}_real_token_fraction"] = real / positions
        figures[f"{name}_real_tokens"] = real
        figures[f"{name}_seconds"] = seconds
        if packing:
            lengths = trainer.train_dataset["seq_lengths"]
            packed_tokens = sum(sum(seq) for seq in lengths)
            figures["packed_sequences"] = len(lengths)
            # How full BFD's bins are: the real-token fraction if each pack were padded to max_length.
            figures["packed_bin_fill"] = packed_tokens / (len(lengths) * max_length)
        del trainer
    return figures
