# /// script
# dependencies = ["beam-sft", "trl>=1.16", "peft", "tensorboard"]
# ///
"""Supervised fine-tuning on Beam Harmony data with TRL's SFTTrainer, loss on assistant turns only.

Data: Beam records written by `convert-dataset` (.jsonl / .parquet / a directory / a `save_to_disk`
dataset / a hub id), or raw OpenAI, ShareGPT or Harmony files, converted on the fly by the same converters
(`--dataset_format auto|beam|openai|sharegpt|harmony|hermes|glaive|xlam`). Masks come from the chat template's generation
block; records longer than `--max_length` follow `--truncation_policy` (turn | drop | keep_start, see
beam_sft/dataset/examples.py), and every cut is counted in the log. The data phase is `beam_sft.dataset.phase`: converted
and tokenized once per job (main process first) into memory-mapped Arrow, cached by fingerprint
(`--prepared_cache_dir`), every reject in `output_dir/rejects.jsonl`; or a directory from `beam-sft prepare`.
With packing on, the model is probed for attention across packed records before training and given explicit
masks or refused (beam_sft/train/packing.py).

# Quickstart: the embedded tiny random model and the bundled tokenizer, on CPU (about 100 s for 12 epochs).
# Its data is what `python scripts/quickstart.py` converts into outputs/quickstart/data/train.jsonl.
```bash
python scripts/train.py --config configs/quickstart.yaml
```

# Same, as two gloo processes on one machine (DDP on CPU)
```bash
accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train.py \
    --config configs/quickstart.yaml --output_dir outputs/quickstart-ddp
```

# Full fine-tuning of a Beam checkpoint on converted data, 8 GPUs
```bash
convert-dataset data/samples/openai.jsonl -o data/converted/train.jsonl
accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train.py \
    --config configs/beam_full.yaml --model_name_or_path $BEAM_MODEL_ID --dataset_name data/converted/train.jsonl
```

# LoRA on a Beam checkpoint, straight from a raw ShareGPT file
```bash
python scripts/train.py --config configs/beam_lora.yaml --model_name_or_path $BEAM_MODEL_ID \
    --dataset_name data/samples/sharegpt.json --dataset_format sharegpt
```

# LoRA on a gpt-oss-shaped Beam checkpoint: attention + fused expert tensors, router loss, packing probed
# (add --mxfp4_dequantize true for an MXFP4 checkpoint; merge with scripts/merge_lora.py)
```bash
python scripts/train.py --config configs/beam_moe_lora.yaml --model_name_or_path $BEAM_MODEL_ID
```

# Any other base model: add the markers and both templates first (--beamify)
```bash
python scripts/train.py --config configs/beam_lora.yaml --model_name_or_path Qwen/Qwen2.5-0.5B --beamify
```

# Tokenize once with `beam-sft prepare`, then train on every node from shared storage without tokenizing
```bash
beam-sft prepare data/samples/openai.jsonl -o /shared/prepared --max-length 1024
accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train.py \
    --config configs/quickstart.yaml --dataset_name /shared/prepared --dataset_format auto
```

# Data larger than the disk: convert and tokenize on the fly (needs max_steps)
```bash
python scripts/train.py --config configs/quickstart.yaml --dataset_name data/samples/openai.jsonl \
    --dataset_format auto --streaming true --max_steps 50 --packing true
```

# Resume after a crash (same output_dir; same data order, same final step)
```bash
python scripts/train.py --config configs/quickstart.yaml --resume_from_checkpoint last
```
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Runnable as `python scripts/train.py` from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trl import SFTConfig  # the config dataclass must exist before the parser is built

logger = logging.getLogger("beam_sft.train")


@dataclass
class ScriptArguments:
    """Data and model-source options of scripts/train.py (the rest is SFTConfig and ModelConfig)."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Training data: a .jsonl/.json/.parquet file, a directory of them, a save_to_disk "
                  "dataset, a hub dataset id, or a directory written by `beam-sft prepare` (trained as is, "
                  "after checking its manifest against this run's tokenizer and settings)."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "Convert and tokenize on the fly while training (a datasets.IterableDataset; each rank "
                  "takes its own share of the records): for data larger than the disk. Needs max_steps; no "
                  "eval_split_size; nothing is cached."},
    )
    prepared_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where raw data is kept once converted and tokenized (one directory per fingerprint of "
                  "data, tokenizer, template and settings; a rerun loads it). Default: $BEAM_SFT_PREPARED_CACHE, "
                  "else $HF_DATASETS_CACHE/beam_sft_prepared. Multi-node: put it on shared storage."},
    )
    dataset_format: str = field(
        default="auto",
        metadata={"help": "Format of the rows: 'beam' (convert-dataset output), 'openai', 'sharegpt', 'harmony', "
                  "'hermes', 'glaive', 'xlam', or 'auto' (detect per row).",
                  "choices": ["auto", "beam", "openai", "sharegpt", "harmony", "hermes", "glaive", "xlam"]},
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to read from a hub/disk dataset."})
    missing_reasoning: str = field(
        default="mask",
        metadata={"help": "An assistant turn without reasoning: 'mask' (weight 0: context, not trained), 'keep' "
                  "(trained with an empty analysis: teaches Beam to skip reasoning, docs/reasoning.md) or "
                  "'reject' the record. Same option as `beam-sft convert/prepare --missing-reasoning`.",
                  "choices": ["mask", "keep", "reject"]},
    )
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Separate evaluation data (same forms as dataset_name)."}
    )
    eval_split_size: float = field(
        default=0.0,
        metadata={"help": "Hold out this share (0-1) or number (>=1) of training records for evaluation when "
                  "no eval_dataset_name is given. The split is seeded by --seed."},
    )
    max_records: int | None = field(default=None, metadata={"help": "Use only the first N training records."})
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Tokenizer to use. Default: the model's own; data/tokenizer for the embedded model."},
    )
    tiny_model_config: str | None = field(
        default=None,
        metadata={"help": "Directory with the config.json of the embedded random model (default "
                  "configs/models/tiny). Used when model_name_or_path is not set."},
    )
    beamify: bool = field(
        default=False,
        metadata={"help": "Add the Beam markers, pad token and both templates to a non-Beam tokenizer, and grow "
                  "the model's embeddings to match."},
    )
    check_template: bool = field(
        default=True,
        metadata={"help": "Run the check-template conformance suite on the tokenizer first; failures are "
                  "logged loudly but do not stop the run."},
    )
    eval_beam: bool = field(
        default=False,
        metadata={"help": "After training, generate the first assistant turn of each eval record and score it "
                  "like `beam-sft eval` (well_formed, stopped, tool calls, ...); the metrics are logged next to "
                  "the loss as eval_beam/<metric>. Needs an eval split."},
    )
    lora_target_experts: bool = field(
        default=False,
        metadata={"help": "MoE models: also put LoRA on the fused expert tensors (peft target_parameters, e.g. "
                  "gpt-oss mlp.experts.gate_up_proj / down_proj); forces lora_dropout 0, which peft requires "
                  "there. The run fails if no expert adapter is present after injection."},
    )
    mxfp4_dequantize: bool = field(
        default=False,
        metadata={"help": "Load an MXFP4-quantized checkpoint (gpt-oss) dequantized to --dtype, so it can be "
                  "trained (transformers' Mxfp4Config(dequantize=True))."},
    )


@dataclass
class BeamSFTConfig(SFTConfig):
    """SFTConfig with Beam defaults: assistant-only loss on, bf16 only where the hardware has it."""

    assistant_only_loss: bool = field(
        default=True,
        metadata={"help": "Train only on assistant turns (the template's generation block). On by default."},
    )
    truncation_policy: str = field(
        default="turn",
        metadata={"help": "Records longer than max_length: 'turn' cuts back to the last whole assistant turn "
                  "(drops the record if none fits), 'drop' drops them, 'keep_start' cuts at max_length.",
                  "choices": ["turn", "drop", "keep_start"]},
    )
    loss_path: str = field(
        default="auto",
        metadata={"help": "'fused': TRL's chunked fused LM head; 'plain': the model's logits + cross_entropy (same "
                  "loss, ~3x faster on CPU for small models); 'auto': plain on CPU, fused elsewhere.",
                  "choices": ["auto", "fused", "plain"]},
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of activation_checkpointing."}
    )
    packing_check: str = field(
        default="auto",
        metadata={"help": "Padding-free packing: probe the model for attention across packed records before "
                  "training. 'auto' gives a leaking model explicit per-record masks (and refuses if it still "
                  "leaks), 'refuse' stops on a leak, 'skip' trusts the model (see beam_sft/train/packing.py).",
                  "choices": ["auto", "refuse", "skip"]},
    )

    def __post_init__(self):
        # TRL's default (checkpointing on) through the non-deprecated name, so the alias warns only when used.
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        if self.bf16 is None and not self.fp16:
            import torch

            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        super().__post_init__()


def _setup_logging(training_args) -> None:
    import datasets
    import transformers

    level = logging.INFO if training_args.process_index == 0 else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, force=True)
    logging.getLogger("beam_sft").setLevel(level)
    transformers.utils.logging.set_verbosity(logging.WARNING)
    datasets.utils.logging.set_verbosity(logging.WARNING)


def load_model_and_tokenizer(script_args, training_args, model_args):
    """(model, tokenizer, embedded) for the three sources: embedded tiny model, Beam checkpoint, --beamify."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import get_quantization_config

    from beam_sft.template.tokenizer import beamify, load_tokenizer
    from beam_sft.train.trainer import build_tiny_model

    if model_args.model_name_or_path is None:
        tokenizer = load_tokenizer(script_args.tokenizer_name_or_path)
        if script_args.beamify:
            beamify(tokenizer)
        model = build_tiny_model(tokenizer, script_args.tiny_model_config, seed=training_args.seed)
        return model, tokenizer, True

    tokenizer = AutoTokenizer.from_pretrained(
        script_args.tokenizer_name_or_path or model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    quantization_config = get_quantization_config(model_args)
    if script_args.mxfp4_dequantize:
        from beam_sft.errors import UsageError
        from beam_sft.train.moe import mxfp4_dequantize_config

        if quantization_config is not None:
            raise UsageError("mxfp4_dequantize cannot be combined with load_in_4bit / load_in_8bit")
        quantization_config = mxfp4_dequantize_config()
    dtype = model_args.dtype
    init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype if dtype in (None, "auto") else getattr(torch, dtype),
        "quantization_config": quantization_config,
        # k-bit weights are placed at load time, one full copy per process.
        "device_map": (
            {"": PartialState().local_process_index}
            if quantization_config is not None and not script_args.mxfp4_dequantize else None
        ),
    }
    init_kwargs.update(training_args.model_init_kwargs or {})
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **init_kwargs)
    if script_args.beamify:
        beamify(tokenizer, model)
    elif not tokenizer.chat_template or getattr(tokenizer, "response_template", None) is None:
        from beam_sft.errors import UsageError

        raise UsageError(
            f"{model_args.model_name_or_path} has no Beam chat template / response template; pass --beamify to "
            "install them (and the markers) on this tokenizer"
        )
    return model, tokenizer, False


def run_template_check(tokenizer) -> None:
    """Run the check-template suite; log every failure loudly, never stop the run."""
    from beam_sft.template.conformance import run_suite

    failures = [r for r in run_suite(tokenizer) if not r.ok]
    if not failures:
        logger.info("check-template: all rules pass")
        return
    banner = "!" * 100
    logger.warning(banner)
    logger.warning("check-template: %d rule(s) FAIL; training goes on with this template as is:", len(failures))
    for failure in failures:
        logger.warning("  %s", failure.line())
    logger.warning("run `beam-sft check-template` on the tokenizer for the details")
    logger.warning(banner)


def main(script_args, training_args, model_args, callbacks=None):
    """Prepare data, train, save model + tokenizer (both templates). Returns the trainer."""
    import torch
    import transformers
    from packaging.version import Version
    from transformers.trainer_utils import get_last_checkpoint

    from beam_sft.dataset.examples import check_stop_tokens_trained
    from beam_sft.dataset.phase import DataSettings, training_datasets
    from beam_sft.errors import UsageError
    from beam_sft.template.tokenizer import save_tokenizer
    from beam_sft.train.moe import build_peft_config, check_expert_adapters
    from beam_sft.train.packing import ensure_exact_packing
    from beam_sft.train.trainer import make_trainer_class

    _setup_logging(training_args)
    if script_args.dataset_name is None:
        raise UsageError("--dataset_name is required (a file, a directory, or a hub dataset id)")
    if training_args.use_liger_kernel:
        # Untested here: Liger's kernels need a GPU and Liger is not a dependency. Refused rather than trusted
        # to leave the assistant masks alone.
        raise UsageError("use_liger_kernel is not supported by beam-sft: its effect on assistant masks is untested")
    if script_args.streaming and training_args.max_steps <= 0:
        raise UsageError("--streaming needs --max_steps: a stream has no length to count epochs in")
    if training_args.bf16 and not torch.cuda.is_available():
        logger.warning("bf16 requested without a GPU: training runs in bf16 autocast on CPU")

    model, tokenizer, embedded = load_model_and_tokenizer(script_args, training_args, model_args)
    if script_args.check_template and not embedded:
        run_template_check(tokenizer)
    if training_args.assistant_only_loss:
        check_stop_tokens_trained(tokenizer)

    settings = DataSettings(
        format=script_args.dataset_format, max_length=training_args.max_length,
        truncation_policy=training_args.truncation_policy, assistant_only_loss=training_args.assistant_only_loss,
        split=script_args.dataset_train_split, max_records=script_args.max_records,
        eval_split_size=script_args.eval_split_size, seed=training_args.seed,
        missing_reasoning=script_args.missing_reasoning,
    )
    train_dataset, eval_dataset, _ = training_datasets(
        script_args.dataset_name, tokenizer, settings, eval_dataset_name=script_args.eval_dataset_name,
        cache_dir=script_args.prepared_cache_dir, num_proc=training_args.dataset_num_proc,
        output_dir=training_args.output_dir, is_main_process=training_args.process_index == 0,
        streaming=script_args.streaming, world_size=training_args.world_size,
    )

    # The labels are already built from the template's masks, so TRL must take the dataset as tokenized;
    # its own assistant_only_loss path expects raw conversations.
    training_args.assistant_only_loss = False

    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "true"):
        resume = get_last_checkpoint(training_args.output_dir)
        if resume is None:
            logger.info("no checkpoint in %s; starting from scratch", training_args.output_dir)

    peft_config = build_peft_config(model_args, model, target_experts=script_args.lora_target_experts)
    plain_loss = training_args.loss_path == "plain" or (
        training_args.loss_path == "auto" and training_args.device.type == "cpu"
    )
    trainer_cls = make_trainer_class()
    trainer = trainer_cls(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
        plain_loss=plain_loss,
    )
    if peft_config is not None:
        check_expert_adapters(trainer.model, wanted=script_args.lora_target_experts)
    # After the trainer is built: the model is on its device and wrapped as it will train (LoRA B = 0, so the
    # adapters do not change the probe). Every rank probes and, if needed, hooks its own copy.
    packing = ensure_exact_packing(trainer.model, training_args, training_args.packing_check)
    if packing is not None and training_args.process_index == 0:
        from beam_sft.records.files import write_json_atomic

        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(str(Path(training_args.output_dir) / "packing_probe.json"), packing.to_dict())
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        # Again, through save_tokenizer: it keeps the response template's key order (see its docstring).
        save_tokenizer(tokenizer, training_args.output_dir)
    trainer.accelerator.print(
        f"trained {trainer.state.global_step} steps; tokens seen {trainer._total_train_tokens}, supervised "
        f"{trainer._supervised_tokens} (this process's session); saved to {training_args.output_dir}"
    )
    if script_args.eval_beam:
        import tempfile

        from beam_sft.dataset.phase import eval_records
        from beam_sft.eval.evaluate import evaluate_trainer

        with tempfile.TemporaryDirectory(prefix="beam_eval_") as work:
            records = list(eval_records(script_args.dataset_name, settings, work,
                                        eval_dataset_name=script_args.eval_dataset_name)) \
                if trainer.accelerator.is_main_process else []
            evaluate_trainer(trainer, tokenizer, records)
    # A rank that reaches end() (which tears the process group down) while another is still saving would
    # leave that one blocked in a collective forever.
    trainer.accelerator.wait_for_everyone()
    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()
    return trainer


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import ModelConfig, TrlParser

    dataclass_types = (ScriptArguments, BeamSFTConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("train", help="Fine-tune on Beam data", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args = parser.parse_args_and_config()
    from beam_sft.cli import run_guarded

    sys.exit(run_guarded(lambda _: main(script_args, training_args, model_args) and 0, None))
