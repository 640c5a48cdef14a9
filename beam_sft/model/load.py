"""The model and tokenizer a training run starts from (the embedded tiny model, a Beam checkpoint, or
--beamify), and the checks and refusals before it trains."""

from __future__ import annotations

import logging
from pathlib import Path

from beam_sft.errors import FatalError, UsageError
from beam_sft.model.beamify import beamify
from beam_sft.template.bundled import bundled
from beam_sft.template.conformance import run_suite
from beam_sft.template.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

# configs/models/tiny: the checkout's, or the copy an installed wheel carries (beam_sft/template/bundled.py).
TINY_MODEL_DIR = bundled("configs/models/tiny")
# Where LoRA on the embedded model keeps its base, inside output_dir (`save_embedded_base`).
EMBEDDED_BASE_DIR = "base_model"


def build_tiny_model(tokenizer, config_dir: str | Path | None = None, seed: int = 0):
    """A randomly initialised causal LM from `config_dir` (default configs/models/tiny), weights fixed by
    `seed`; its vocabulary must hold every id of `tokenizer`, whose special-token ids it takes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dir = Path(config_dir) if config_dir is not None else TINY_MODEL_DIR
    if not (config_dir / "config.json").is_file():
        raise FatalError(f"tiny model config not found: {config_dir / 'config.json'}")
    config = AutoConfig.from_pretrained(str(config_dir))
    if config.vocab_size < len(tokenizer):
        raise FatalError(f"{config_dir / 'config.json'}: vocab_size {config.vocab_size} < tokenizer size "
                         f"{len(tokenizer)}; the tiny model must cover every token id")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(config, name, getattr(tokenizer, name))
    # fork_rng: the seed fixes the weights without moving the caller's global RNG streams.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    # Both stop tokens end generation (a tool call ends at <|call|>); a checkpoint saves this file as is.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|call|>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def embedded_model(script_args, training_args):
    """(model, tokenizer) of the embedded source: the bundled (or given) tokenizer and the tiny random model."""
    tokenizer = load_tokenizer(script_args.tokenizer_name_or_path)
    if script_args.beamify:
        beamify(tokenizer)
    return build_tiny_model(tokenizer, script_args.tiny_model_config, seed=training_args.seed), tokenizer


def load_model_and_tokenizer(script_args, training_args, model_args):
    """(model, tokenizer, embedded) for the three sources: embedded tiny model, Beam checkpoint, --beamify."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import get_quantization_config

    refuse_quantization(script_args, model_args)
    if model_args.model_name_or_path is None:
        return *embedded_model(script_args, training_args), True

    tokenizer = AutoTokenizer.from_pretrained(script_args.tokenizer_name_or_path or model_args.model_name_or_path,
                                              revision=model_args.model_revision,
                                              trust_remote_code=training_args.trust_remote_code)
    refuse_without_template(tokenizer, script_args, model_args)  # before the weights are read, not after
    quantization_config = get_quantization_config(model_args)
    if script_args.mxfp4_dequantize:
        from beam_sft.model.moe import mxfp4_dequantize_config

        quantization_config = mxfp4_dequantize_config()
    dtype = model_args.dtype
    init_kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
                   "attn_implementation": model_args.attn_implementation,
                   "dtype": dtype if dtype in (None, "auto") else getattr(torch, dtype),
                   "quantization_config": quantization_config}
    # k-bit weights are placed at load time, one full copy per process.
    kbit = quantization_config is not None and not script_args.mxfp4_dequantize
    init_kwargs["device_map"] = {"": PartialState().local_process_index} if kbit else None
    init_kwargs.update(training_args.model_init_kwargs or {})
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **init_kwargs)
    if script_args.beamify:
        beamify(tokenizer, model, init=script_args.beamify_init)
    return model, tokenizer, False


def refuse_without_template(tokenizer, script_args, model_args) -> None:
    """A checkpoint whose tokenizer lacks the Beam templates trains only with --beamify: refused in one line."""
    if script_args.beamify or model_args.model_name_or_path is None:
        return
    if not tokenizer.chat_template or getattr(tokenizer, "response_template", None) is None:
        source = script_args.tokenizer_name_or_path or model_args.model_name_or_path
        raise UsageError(f"{source}: the tokenizer has no Beam chat template / response template; add --beamify true "
                         "to install them (and the markers) while training, or run `beam-sft beamify` on it first "
                         "(`beam-sft check-template` shows what it lacks)")


def refuse_quantization(script_args, model_args) -> None:
    """--load_in_4bit / --load_in_8bit that would be ignored or fail at load time: refused before any load."""
    import importlib.util

    import torch

    flags = [f"--{name}" for name in ("load_in_4bit", "load_in_8bit") if getattr(model_args, name, False)]
    if not flags:
        return
    given = " ".join(f"{flag} true" for flag in flags)
    if script_args.mxfp4_dequantize:
        raise UsageError(f"{given} cannot be combined with --mxfp4_dequantize (it loads the weights dequantized): "
                         "drop one of them")
    if model_args.model_name_or_path is None:
        raise UsageError(f"{given}: the embedded tiny model is built in full precision and never quantized; drop "
                         f"{' and '.join(flags)}, or give a checkpoint with --model_name_or_path")
    if not torch.cuda.is_available():
        raise UsageError(f"{given} needs a CUDA GPU (bitsandbytes' k-bit weights) and this machine has none: drop "
                         f"{' and '.join(flags)} (LoRA in full precision: --use_peft true)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UsageError(f"{given} needs the bitsandbytes package, which is not installed: pip install bitsandbytes, "
                         f"or drop {' and '.join(flags)}")


def save_embedded_base(model, tokenizer, output_dir: str, *, write: bool) -> Path:
    """LoRA on the embedded model: its random base exists nowhere else, so `write` (the main process) saves it
    as output_dir/base_model, which every adapter_config.json names (absolute); `beam-sft eval` loads both."""
    from beam_sft.storage import atomic_output
    from beam_sft.template.tokenizer import save_tokenizer

    base = Path(output_dir).resolve() / EMBEDDED_BASE_DIR
    if write:
        base.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(base, directory=True) as tmp:
            model.save_pretrained(tmp)
            save_tokenizer(tokenizer, tmp)
    # peft's get_peft_model takes base_model_name_or_path from here.
    model.name_or_path = model.config._name_or_path = str(base)
    return base


def run_template_check(tokenizer) -> None:
    """Run the check-template suite; log every failure loudly, never stop the run."""
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


def check_tokenizer(tokenizer, *, conformance: bool, assistant_only_loss: bool) -> None:
    """The checks before training: that the template trains both stop tokens (assistant-only loss; fatal, one
    line), then the check-template suite (logged, never fatal): so the line that matters comes first."""
    from beam_sft.dataset.examples import check_stop_tokens_trained

    if assistant_only_loss:
        check_stop_tokens_trained(tokenizer)
    if conformance:
        run_template_check(tokenizer)
