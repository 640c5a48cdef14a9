"""`--dry_run`: checks and counts, then a plan; no training (docs/training.md#the-dry-run---dry_run)."""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from beam_sft.dataset.drops import aligned_rows
from beam_sft.model.beamify import beamify
from beam_sft.model.load import (
    EMBEDDED_BASE_DIR,
    check_tokenizer,
    embedded_model,
    refuse_quantization,
    refuse_without_template,
    run_template_check,
)
from beam_sft.model.moe import build_peft_config
from beam_sft.train import run
from beam_sft.train.checkpoints import free_bytes, size_text
from beam_sft.train.new_tokens import refuse_tied_output
from beam_sft.train.packing import ensure_exact_packing, packing_is_padding_free

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Activation elements kept per token and hidden unit by one transformer layer in training, without
# checkpointing (Korthikanti et al. 2022: 34*s*b*h bytes in 16-bit, attention scores excluded as with SDPA).
ACTIVATION_ELEMENTS_PER_LAYER = 17
# Layers the probe's reduced copy keeps at most: the probe tests the attention code, not the weights.
PROBE_LAYERS = 2
PROBE_VOCAB = 2048


@dataclass
class Plan:
    """What the dry run found: printed by `str(plan)`, one `name: value` line each."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    facts: dict[str, int | float] = field(default_factory=dict)  # the figures, for a caller that checks them

    def add(self, name: str, value) -> None:
        self.lines.append((name, str(value)))

    def __str__(self) -> str:
        return "\n".join(["dry run: nothing trained or saved", *aligned_rows(self.lines)])


def tokenizer_and_config(script_args, training_args, model_args):
    """(tokenizer, model config, embedded model or None): no checkpoint weights are read."""
    from transformers import AutoConfig, AutoTokenizer

    if model_args.model_name_or_path is None:
        model, tokenizer = embedded_model(script_args, training_args)
        return tokenizer, model.config, model
    kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code}
    tokenizer = AutoTokenizer.from_pretrained(script_args.tokenizer_name_or_path or model_args.model_name_or_path,
                                              **kwargs)
    refuse_without_template(tokenizer, script_args, model_args)
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, **kwargs)
    if script_args.beamify:
        beamify(tokenizer)
        config.get_text_config().vocab_size = max(config.get_text_config().vocab_size, len(tokenizer))
    return tokenizer, config, None


def parameter_counts(config, script_args, model_args) -> tuple[int, int]:
    """(total, trainable) parameters of the model this run trains, built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        peft_config = build_peft_config(model_args, model, target_experts=script_args.lora_target_experts)
        refuse_tied_output(peft_config and peft_config.modules_to_save, model)
        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
    total = sum(p.numel() for p in model.parameters())
    return total, sum(p.numel() for p in model.parameters() if p.requires_grad)


def probe_model(config, model_args):
    """A random copy of the architecture, reduced (layers, vocabulary, MLP width) so it builds in seconds."""
    from transformers import AutoModelForCausalLM

    small = copy.deepcopy(config)
    text = small.get_text_config()
    types = getattr(text, "layer_types", None)
    if types:  # one layer of each attention kind (sliding, full, ...), in order
        text.layer_types = list(dict.fromkeys(types))
        text.num_hidden_layers = len(text.layer_types)
    else:
        text.num_hidden_layers = min(text.num_hidden_layers, PROBE_LAYERS)
    text.vocab_size = min(text.vocab_size, PROBE_VOCAB)
    if getattr(text, "intermediate_size", None):
        text.intermediate_size = min(text.intermediate_size, 256)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(text, name, None), int) and getattr(text, name) >= text.vocab_size:
            setattr(text, name, 0)
    return AutoModelForCausalLM.from_config(small, attn_implementation=model_args.attn_implementation)


def packed_rows(train, training_args) -> int:
    """Rows per epoch as TRL's SFTTrainer makes them: the records, or the packed rows (same shuffle, same packer)."""
    if not training_args.packing:
        return len(train)
    from trl.data_utils import pack_dataset

    rows = train.select_columns(["input_ids"])
    if training_args.shuffle_dataset:
        rows = rows.shuffle(seed=training_args.seed)
    return len(pack_dataset(rows, training_args.max_length, training_args.packing_strategy))


def steps(rows: int, training_args, world_size: int) -> tuple[int, int, float]:
    """(optimizer steps per epoch, total steps, epochs) as transformers' Trainer computes them."""
    per_process = training_args.per_device_train_batch_size
    batches = rows // per_process if training_args.dataloader_drop_last else math.ceil(rows / per_process)
    per_rank = math.ceil(batches / world_size)  # accelerate shards whole batches, evened out across ranks
    accum = training_args.gradient_accumulation_steps
    per_epoch = max(per_rank // accum + int(per_rank % accum > 0), 1)
    if training_args.max_steps > 0:
        return per_epoch, training_args.max_steps, training_args.max_steps / per_epoch
    return per_epoch, math.ceil(training_args.num_train_epochs * per_epoch), training_args.num_train_epochs


def estimate_memory(config, total: int, trainable: int, dtype: str, training_args, row_tokens: int) -> dict:
    """Bytes per process, by part: weights, gradients, AdamW's two moments, activations, logits. An estimate."""
    text = config.get_text_config()
    weight_bytes = BYTES.get(dtype, 4)
    act_bytes = 2 if (training_args.bf16 or training_args.fp16) else weight_bytes
    tokens = training_args.per_device_train_batch_size * row_tokens
    per_layer = tokens * text.hidden_size * act_bytes
    layers = text.num_hidden_layers
    checkpointing = bool(training_args.activation_checkpointing)
    activations = (layers + ACTIVATION_ELEMENTS_PER_LAYER) * per_layer if checkpointing \
        else layers * ACTIVATION_ELEMENTS_PER_LAYER * per_layer
    parts = {
        "weights": total * weight_bytes,
        "gradients": trainable * weight_bytes,
        "optimizer": 2 * trainable * weight_bytes,  # torch AdamW keeps its moments in the parameters' dtype
        "activations": activations,
        "logits": 2 * tokens * text.vocab_size * 4,  # float32 logits and their gradient
    }
    return {**parts, "total": sum(parts.values())}


def probe(config, embedded, training_args, model_args) -> str:
    """The packing probe's verdict line, or why it did not run."""
    if not packing_is_padding_free(training_args):
        return "not needed (no padding-free packing)"
    try:
        model = embedded if embedded is not None else probe_model(config, model_args)
    except Exception as err:  # noqa: BLE001  a kernel missing here (flash-attn on CPU) is not a config error
        return f"not run: the reduced model could not be built here ({type(err).__name__}: {err})"
    report = ensure_exact_packing(model, training_args, training_args.packing_check)
    where = "" if embedded is not None else " (on a reduced random copy of the architecture)"
    return (report.line() if report is not None else "skipped (packing_check skip)") + where


@contextlib.contextmanager
def quiet_libraries():
    """No progress bars, no libraries' deprecation notes about their internals: the output is the plan."""
    with run.progress_bars_off(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft|trl)\.")
        yield


@quiet_libraries()
def dry_run(script_args, training_args, model_args, world_size: int = 1) -> Plan:
    """Check the run and return its plan; trains nothing, writes nothing to output_dir. Every refusal comes
    first, as one line (a UsageError / FatalError) before any report: the template suite's report follows them."""
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.dataset.settings import PhaseOptions
    from beam_sft.train.data_phase import eval_inputs, streamed_note, training_datasets, training_inputs

    run.check_arguments(script_args, training_args)  # the real run's refusals, in its order, before any report
    refuse_quantization(script_args, model_args)
    run.resume_checkpoint(training_args)  # a path that cannot be resumed: refused now, not at the first step
    tokenizer, config, embedded = tokenizer_and_config(script_args, training_args, model_args)
    check_tokenizer(tokenizer, conformance=False, assistant_only_loss=training_args.assistant_only_loss)
    total, trainable = parameter_counts(config, script_args, model_args)
    if script_args.check_template and embedded is None:
        run_template_check(tokenizer)  # logged, never fatal: after every refusal
    plan = Plan()
    plan.add("model", model_args.model_name_or_path or "embedded tiny model (random init)")
    if embedded is not None and model_args.use_peft:
        plan.add("LoRA base", f"the embedded model exists nowhere else: saved with the adapter as "
                 f"{Path(training_args.output_dir) / EMBEDDED_BASE_DIR} (adapter_config.json names it; "
                 f"`beam-sft eval {training_args.output_dir}` loads both)")
    plan.add("dataset", f"{script_args.dataset_name} (format {script_args.dataset_format})" if script_args.dataset_name
             else f"mixture of {len(script_args.datasets)} sources (--config datasets:)")
    plan.add("parameters", f"{total:,} ({trainable:,} trainable)")
    settings = data_settings(script_args, training_args)
    if script_args.streaming:
        plan.add("data", f"{streamed_note(training_inputs(script_args, seed=training_args.seed)) or script_args.dataset_name}"
                         ": streamed, not counted")
        plan.add("steps", training_args.max_steps)
        stats, rows, longest = {}, None, training_args.max_length
    else:
        train, eval_ds, stats = training_datasets(
            training_inputs(script_args, seed=training_args.seed), tokenizer, settings,
            PhaseOptions(num_proc=training_args.dataset_num_proc),
            eval_dataset_name=eval_inputs(script_args), cache_dir=script_args.prepared_cache_dir)
        rows = packed_rows(train, training_args)
        longest = training_args.max_length if training_args.packing else max(len(x) for x in train["input_ids"])
        counts = stats.get("data", {})
        action = counts.get("action")
        plan.add("data", f"{counts.get('path')} ({'built now' if action == 'tokenized' else action})")
        if "records_in" in counts:
            plan.add("records", f"{counts['records_in']} in, {len(train)} training, "
                     f"{len(eval_ds) if eval_ds is not None else 0} eval, {counts['rejected_total']} rejected "
                     f"{counts['rejected']}, {counts['dropped_too_long']} dropped by truncation")
        else:
            plan.add("records", f"{len(train)} training, {len(eval_ds) if eval_ds is not None else 0} eval")
        if training_args.packing:
            plan.add("packed rows", f"{rows} rows of up to {training_args.max_length} tokens "
                     f"({training_args.packing_strategy})")
    _batch_lines(plan, rows, training_args, world_size, stats.get("train", {}))
    dtype = (str(next(embedded.parameters()).dtype).removeprefix("torch.") if embedded is not None
             else model_args.dtype if model_args.dtype in BYTES else "float32")
    memory = estimate_memory(config, total, trainable, dtype, training_args, longest)
    plan.facts.update(memory_bytes=memory["total"], parameters=total, trainable=trainable)
    plan.add("memory (estimate)", f"{size_text(memory['total'])} per process: " + ", ".join(
        f"{k} {size_text(v)}" for k, v in memory.items() if k != "total"))
    # One checkpoint (what trains is what is saved: all weights, or LoRA's adapters only, and AdamW's two
    # moments) against the free space of output_dir, where a full disk would stop the run at its first save.
    size = 3 * trainable * BYTES.get(dtype, 4)
    free = free_bytes(training_args.output_dir)
    limit = training_args.save_total_limit
    kept = f"at most {limit + 1} at once (save_total_limit {limit})" if limit else "every one kept (no save_total_limit)"
    plan.facts.update(checkpoint_bytes=size, output_dir_free_bytes=free)
    plan.add("checkpoints", f"{size_text(size)} each (estimate), {kept}; {training_args.output_dir} has {size_text(free)} free"
             + (" -- NOT ENOUGH FOR ONE" if free < size else ""))
    plan.add("packing probe", probe(config, embedded, training_args, model_args))
    return plan


def _batch_lines(plan: Plan, rows: int | None, training_args, world_size: int, split: dict) -> None:
    effective = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world_size
    plan.add("effective batch", f"{effective} rows ({training_args.per_device_train_batch_size} per device x "
             f"{training_args.gradient_accumulation_steps} accumulation x {world_size} processes)")
    if rows is None:
        return
    per_epoch, total_steps, epochs = steps(rows, training_args, world_size)
    tokens, supervised = split.get("total_tokens", 0), split.get("supervised_tokens", 0)
    plan.facts.update(rows=rows, steps=total_steps, steps_per_epoch=per_epoch, epochs=epochs, tokens_per_epoch=tokens,
                      supervised_per_epoch=supervised, effective_batch=effective)
    plan.add("steps", f"{total_steps} ({per_epoch} per epoch)")
    plan.add("epochs", f"{epochs:g}")
    plan.add("tokens", f"{tokens:,} per epoch, {int(tokens * epochs):,} in all")
    plan.add("supervised tokens", f"{supervised:,} per epoch ({100 * supervised / max(tokens, 1):.1f}%), "
             f"{int(supervised * epochs):,} in all")
