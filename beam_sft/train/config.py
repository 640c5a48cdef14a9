"""The options of `scripts/train.py`: `ScriptArguments` and TRL's `SFTConfig` with Beam defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig  # BeamSFTConfig subclasses it: TRL is imported with this module

from beam_sft.dataset.arguments import DataArguments


def _option(default, help: str, **metadata):
    """A dataclass field with its `--help` text (and `choices`, checked wherever the value comes from)."""
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class ScriptArguments(DataArguments):
    """The data options (`DataArguments`, shared with `beam-sft prepare`) and the training job's own."""

    streaming: bool = _option(False, "Convert and tokenize on the fly while training (a datasets.IterableDataset; "
                              "each rank takes its own share of the records): for data larger than the disk. Needs "
                              "max_steps; no eval_split_size; nothing is cached.")
    shuffle_buffer: int | None = _option(None, "With --streaming: draw records from a seeded buffer of N (seed: "
                                         "--seed; memory bounded by N records) instead of input order.")
    prepared_cache_dir: str | None = _option(
        None, "Where raw data is kept once converted and tokenized (one directory per fingerprint of data, tokenizer, "
        "template and settings; a rerun loads it). Default: $BEAM_SFT_PREPARED_CACHE, else "
        "$HF_DATASETS_CACHE/beam_sft_prepared. Multi-node: put it on shared storage.")
    tiny_model_config: str | None = _option(None, "Directory with the config.json of the embedded random model "
                                            "(default configs/models/tiny). Used when model_name_or_path is not set.")
    beamify: bool = _option(False, "Add the Beam markers, pad token and both templates to a non-Beam tokenizer, and "
                            "grow the model's embeddings to match.")
    beamify_init: str = _option("semantic", "With --beamify: how the new marker rows start. semantic: from the base's "
                                "own message-start/end tokens and the markers' words (docs/real-model.md); mean: all "
                                "the mean of the old rows (the markers start indistinguishable).",
                                choices=["semantic", "mean"])
    check_template: bool = _option(True, "Run the check-template conformance suite on the tokenizer first; failures "
                                   "are logged loudly but do not stop the run.")
    eval_beam: bool = _option(False, "After training, generate the first assistant turn of each eval record and score "
                              "it like `beam-sft eval` (well_formed, stopped, tool calls, ...); the metrics are "
                              "logged next to the loss as eval_beam/<metric>. Needs an eval split.")
    lora_target_experts: bool = _option(False, "MoE models: also put LoRA on the fused expert tensors (peft "
                                        "target_parameters, e.g. gpt-oss mlp.experts.gate_up_proj / down_proj); "
                                        "forces lora_dropout 0, which peft requires there. The run fails if no expert "
                                        "adapter is present after injection.")
    mxfp4_dequantize: bool = _option(False, "Load an MXFP4-quantized checkpoint (gpt-oss) dequantized to --dtype, so "
                                     "it can be trained (transformers' Mxfp4Config(dequantize=True)).")
    eval_beam_steps: int | None = _option(None, "During training, every N steps (and at the last), generate on the "
                                          "eval split's records and log the `beam-sft eval` metrics as "
                                          "eval_beam/<metric> (TensorBoard, W&B, ...). Needs an eval split; each rank "
                                          "generates its share (DDP, FSDP); not under DeepSpeed.")
    eval_beam_on_evaluate: bool = _option(
        False, "At each evaluation (eval_strategy steps/epoch), generate on the eval split's records and add the "
        "`beam-sft eval` metrics to the evaluation's metrics as eval_beam/<metric>, so metric_for_best_model and "
        "early stopping can use them. On by itself when metric_for_best_model is an eval_beam/ metric.")
    eval_per_source: bool | None = _option(
        None, "At each evaluation, also the eval loss of each source of a `datasets:` mixture, logged as "
        "eval_<label>_loss (label: the entry's `label`, else a slug of its path) next to eval_loss; usable as "
        "metric_for_best_model. Default: on when the eval split holds rows of several sources. Each evaluation then "
        "runs twice (whole split, then by source).")
    early_stopping_patience: int | None = _option(None, "Stop training after this many evaluations without "
                                                  "improvement of metric_for_best_model (transformers' "
                                                  "EarlyStoppingCallback; a Beam metric such as eval_beam/well_formed "
                                                  "works). Needs eval_strategy and metric_for_best_model.")
    early_stopping_threshold: float = _option(0.0, "With early_stopping_patience: how much metric_for_best_model must "
                                              "improve to count.")
    dry_run: bool = _option(False, "Check the whole run without training: options, tokenizer, model config (no "
                            "weights for a checkpoint), the data phase's counts (cached like a real run's), the "
                            "packing probe; prints the effective batch, steps, epochs, tokens, supervised tokens and "
                            "a memory estimate. Writes nothing to output_dir.")


@dataclass
class BeamSFTConfig(SFTConfig):
    """SFTConfig with Beam defaults: assistant-only loss on, bf16 only where the hardware has it."""

    assistant_only_loss: bool = _option(True, "Train only on assistant turns (the template's generation block). On by "
                                        "default.")
    loss_path: str = _option("auto", "'fused': TRL's chunked fused LM head; 'plain': the model's logits + "
                             "cross_entropy (same loss, ~3x faster on CPU for small models); 'auto': plain on CPU, "
                             "fused elsewhere.", choices=["auto", "fused", "plain"])
    gradient_checkpointing: bool | None = _option(None, "Deprecated alias of activation_checkpointing.")
    packing_check: str = _option("auto", "Padding-free packing: probe the model for attention across packed records "
                                 "before training. 'auto' gives a leaking model explicit per-record masks (and "
                                 "refuses if it still leaks), 'refuse' stops on a leak, 'skip' trusts the model (see "
                                 "beam_sft/train/packing.py).", choices=["auto", "refuse", "skip"])

    resume_from_checkpoint: str | None = _option(
        None, "Go on from a checkpoint: 'last' (or 'true') takes the newest complete checkpoint-N of output_dir (one "
        "whose commit marker beam_checkpoint.json is there and matches its files; an incomplete one is named in the "
        "log and skipped), or a checkpoint directory's path. No checkpoint yet: training starts from scratch. The log "
        "says which checkpoint and step it goes on from; a run already at max_steps trains nothing more.")
    preemption_signals: str = _option("SIGTERM,SIGUSR1", "Signals that mean 'save and stop' (a Slurm preemption, a "
                                      "spot VM reclaimed, scancel, #SBATCH --signal=USR1@...): all ranks agree at the "
                                      "next step end, write a complete checkpoint and exit with status 75. 'none' "
                                      "leaves the signals' default action (killed at once).")
    on_nonfinite: str = _option("stop", "A NaN/Inf loss or gradient norm (checked on every rank before each optimizer "
                                "step): 'stop' the run with one message naming the step and the batch's records (exit "
                                "65; no checkpoint after it), or 'skip' that step's update (at most "
                                "nonfinite_max_skips in a row; logged as nonfinite_steps_skipped).",
                                choices=["stop", "skip"])
    nonfinite_max_skips: int = _option(10, "With on_nonfinite skip: stop after this many non-finite steps in a row.")
    ddp_timeout: int = _option(1800, "Seconds a collective may wait for the other ranks before the job fails, until "
                               "the first training step: covers start-up, and the data phase in which rank 0 prepares "
                               "while the others wait (prepare big data with `beam-sft prepare` first). From the "
                               "first step on, step_timeout applies.")
    step_timeout: int = _option(600, "Seconds a collective may wait once training runs: a hung (not dead) rank ends "
                                "the job after this long instead of ddp_timeout. Raise it for checkpoints or "
                                "evaluations that take longer on one rank than this. 0: keep ddp_timeout.")

    def __post_init__(self):
        # TRL's default (checkpointing on) through the non-deprecated name, so the alias warns only when used.
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        if self.bf16 is None and not self.fp16:
            import torch

            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        super().__post_init__()

