"""LoRA on a beamified base: the new tokens' rows train, or the markers never learn (docs/real-model.md)."""

from __future__ import annotations

import logging

from beam_sft.errors import UsageError
from beam_sft.model.beamify import new_token_ids

logger = logging.getLogger(__name__)


def _module_name(model, module) -> str | None:
    return next((name.rsplit(".", 1)[-1] for name, candidate in model.named_modules() if candidate is module), None)


def _tied(model) -> bool:
    output = model.get_output_embeddings()
    return output is not None and output.weight is model.get_input_embeddings().weight


def refuse_tied_output(modules_to_save, model) -> None:
    """Refuse `modules_to_save` holding the output projection of a tied model, on any model: PEFT would train
    two full copies and break the tie (`--dry_run` calls this on the meta device, the run before it loads)."""
    if not modules_to_save or not _tied(model):
        return
    embed = _module_name(model, model.get_input_embeddings())
    if (output := _module_name(model, model.get_output_embeddings())) in set(modules_to_save):
        raise UsageError(
            f"modules_to_save lists {output!r}, the output projection tied to {embed!r}: PEFT would train two full "
            "copies and break the tie. Drop it: beam-sft makes the new marker rows trainable by itself "
            "(trainable_token_indices, tied to the output)")


def refuse_tied_output_before_loading(script_args, training_args, model_args) -> None:
    """`refuse_tied_output` on the model its config describes, built on the meta device: before any weight or
    data is read. Only `lora_modules_to_save` can hold the output projection, so nothing else is built."""
    if not (model_args.use_peft and model_args.lora_modules_to_save):
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from beam_sft.model.load import TINY_MODEL_DIR

    remote = training_args.trust_remote_code
    source = model_args.model_name_or_path or script_args.tiny_model_config or TINY_MODEL_DIR
    config = AutoConfig.from_pretrained(str(source), revision=model_args.model_revision,
                                        trust_remote_code=remote)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
    refuse_tied_output(model_args.lora_modules_to_save, model)


def make_new_rows_trainable(peft_config, model) -> dict | None:
    """Add beamify's new ids to `peft_config.trainable_token_indices` (in place); what was done, or None."""
    refuse_tied_output(peft_config and peft_config.modules_to_save, model)
    ids = new_token_ids(model)
    if peft_config is None or not ids:
        return None
    embed = _module_name(model, model.get_input_embeddings())
    output = _module_name(model, model.get_output_embeddings())  # None without an output projection
    tied = _tied(model)
    saved = set(peft_config.modules_to_save or [])
    if embed in saved:
        return {"new_token_ids": ids, "how": f"modules_to_save ({embed} trained whole)"}
    wanted = {embed: ids}
    if not tied and output is not None and output not in saved:
        wanted[output] = ids
    current = peft_config.trainable_token_indices
    merged = {embed: current} if isinstance(current, list) else dict(current or {})
    for name, names_ids in wanted.items():
        merged[name] = sorted(set(merged.get(name, [])) | set(names_ids))
    peft_config.trainable_token_indices = merged
    logger.info("LoRA: the %d token rows beamify added train too (trainable_token_indices %s%s)", len(ids),
                sorted(merged), ", tied to the output projection" if tied else "")
    return {"new_token_ids": ids, "how": "trainable_token_indices", "modules": sorted(merged), "tied": tied}


def check_new_rows_trainable(model, ids: list[int]) -> None:
    """After PEFT wrapped the model: every new row trains (a TrainableTokens adapter or a trained copy of the
    whole embedding covers it), so a LoRA run never silently leaves them frozen."""
    if not ids:
        return
    embeddings = model.get_input_embeddings()
    if (adapter := getattr(embeddings, "token_adapter", None)) is not None:
        missing = sorted(set(ids).difference(*adapter.token_indices.values()))
    else:
        weight = getattr(embeddings, "weight", None)
        trained = any(p.requires_grad for p in embeddings.parameters())
        missing = [] if trained and weight is not None else sorted(ids)
    if missing:
        raise UsageError(f"{len(missing)} token rows beamify added would stay frozen under LoRA (ids {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}): their markers could never be learned")
