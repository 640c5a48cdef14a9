"""Generate held-out assistant turns and score them, in chunks (memory stays flat). See docs/evaluation.md."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from beam_sft.errors import RecordError, UsageError, reject_entry
from beam_sft.eval.backends import Generation, TransformersBackend, generate_sorted
from beam_sft.eval.metrics import (
    METRICS,
    EvalResult,
    TurnResult,
    analysis_tokens,
    score_turn,
    turn_empty_analysis,
)
from beam_sft.eval.report import summary_table
from beam_sft.eval.turns import TURN_CHOICES, Turn, effort_label, record_turns

logger = logging.getLogger(__name__)


def parse_generation(tokenizer, turn: Turn, generation: Generation) -> tuple[dict | None, str]:
    """(the parsed turn, "") or (None, why not): the server's parse, its refusal, or the response template's."""
    if getattr(generation, "error", ""):  # a served turn the server refused
        return None, generation.error
    if getattr(generation, "parsed", None) is not None:  # parsed by the server's own parsers
        return generation.parsed, ""
    try:
        return tokenizer.parse_response(generation.text, prefix=turn.prompt, tools=turn.tools), ""
    except Exception as err:  # noqa: BLE001  (a parser error is a malformed output, not a crash)
        return None, f"parse error: {type(err).__name__}: {err}"


def raw_text(generation: Generation) -> str | None:
    """The generated text with its markers: offline always; served only when the server sent its token ids."""
    if getattr(generation, "parsed", None) is not None or getattr(generation, "error", ""):
        return getattr(generation, "raw", None)
    return generation.text


@dataclass
class EvalOptions:
    """How `evaluate` and `evaluate_bfcl` (beam_sft.eval.bfcl.run) run."""

    turns: str = "first"  # held-out records: which assistant turns (TURN_CHOICES)
    style: str = "beam"  # BFCL: how an entry is prompted and decoded (beam_sft.eval.bfcl.prompts.STYLES)
    max_records: int | None = None  # BFCL: entries per category (a seeded subset, the same every run)
    seed: int = 0
    chunk_size: int = 64  # records (entries) generated at a time, each chunk sorted by prompt length
    keep: int = 200  # held-out records: failing turns and rejects kept for the report
    progress: bool = True
    total: int | None = None  # records expected, for the progress bar
    on_result: Callable[[Any], None] | None = None  # sees every scored turn, in generation order


def evaluate(backend, tokenizer, records: Iterable[tuple[dict | None, dict | None, str] | tuple[dict, str]],
             options: EvalOptions | None = None) -> EvalResult:
    """Generate and score the chosen turns of `records` (`(record, format)` or `read_held_out`'s triples)."""
    from tqdm.auto import tqdm

    opts = options or EvalOptions()
    if getattr(tokenizer, "response_template", None) is None:
        raise UsageError("the tokenizer has no response_template; install it with beam_sft.model.beamify.beamify")
    if opts.turns not in TURN_CHOICES:
        raise UsageError(f"--turns must be one of {', '.join(TURN_CHOICES)}, not {opts.turns!r}")
    result = EvalResult(backend=getattr(backend, "name", type(backend).__name__))
    bar = tqdm(total=opts.total, desc="Evaluating", unit=" rec", disable=not opts.progress)
    read = [0]  # records read so far: the bar counts them once their chunk is generated, so its ETA is real

    def accepted() -> Iterator[list[Turn]]:
        """Each record's turns to generate; a rejected record counted (and kept, up to `keep`) instead."""
        for entry in records:
            record, reject, fmt = entry if len(entry) == 3 else (entry[0], None, entry[1])
            read[0] += 1
            try:
                turns = record_turns(tokenizer, record, result.records, fmt, opts.turns) if reject is None else []
            except RecordError as err:
                reject = reject_entry(err, err.source, err.line, err.by_line)
            if reject is None:
                result.count_record(fmt, effort_label(record))
                yield turns
                continue
            result.rejected += 1
            if len(result.rejects) < opts.keep:
                result.rejects.append(reject)

    chunks = accepted()
    while chunk := list(islice(chunks, opts.chunk_size)):
        generated, seconds = generate_sorted(backend, [turn for turns in chunk for turn in turns])
        result.generation_seconds += seconds
        for turn, generation in generated:
            parsed, error = parse_generation(tokenizer, turn, generation)
            metrics, reason = score_turn(turn.reference, parsed, generation.stop, turn.tools, raw_text(generation))
            metrics["empty_analysis"] = turn_empty_analysis(generation, parsed)
            scored = TurnResult(turn, generation, parsed, error, metrics, error or reason,
                                analysis_tokens(tokenizer, parsed))
            result.add(scored, opts.keep)
            if opts.on_result is not None:
                opts.on_result(scored)
        bar.update(read[0] - bar.n)
    bar.update(read[0] - bar.n)
    bar.close()
    return result


def resolve_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter): a LoRA-only MODEL directory runs on the base its adapter config names."""
    config = Path(model) / "adapter_config.json"
    if adapter is not None or not config.is_file() or (Path(model) / "config.json").is_file():
        return model, adapter
    if not (base := json.loads(config.read_text()).get("base_model_name_or_path")):
        raise UsageError(f"{model} holds a LoRA adapter whose adapter_config.json names no base model; pass the "
                         "base model as MODEL and this directory as --adapter")
    return base, model


SAVED_MODEL_HINT = "pass the directory scripts/train.py saved (its --output_dir, e.g. outputs/quickstart/model)"


def _loaded(what: str, source: str, load: Callable[[str], Any]) -> Any:
    try:
        return load(source)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = "" if Path(source).exists() else f" (not a local directory; {SAVED_MODEL_HINT})"
        raise UsageError(f"cannot load the {what} {source!r}: {first}{hint}") from err


def load_eval_tokenizer(model: str, *, tokenizer: str | None = None, adapter: str | None = None, beam: bool = True):
    """(tokenizer, where it came from): `tokenizer`, else the adapter directory's, else the model's; with both
    Beam templates, or with `beam=False` (`eval --bfcl-style prompt`) a chat template and a pad token."""
    from transformers import AutoTokenizer

    source = tokenizer or (adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else model)
    tok = _loaded("tokenizer", source, AutoTokenizer.from_pretrained)
    if not beam:
        if not tok.chat_template:
            raise UsageError(f"{source}: the tokenizer has no chat template to prompt the model with")
        if tok.pad_token_id is None:  # batched generation pads; a plain base may have none
            tok.pad_token = tok.eos_token
        return tok, source
    if not tok.chat_template or getattr(tok, "response_template", None) is None:
        raise UsageError(f"{source}: the tokenizer lacks the Beam chat template or response_template "
                         "(save it with beam_sft.template.tokenizer.save_tokenizer, or beamify it)")
    return tok, source


def load_model(model: str, *, tokenizer: str | None = None, adapter: str | None = None, device: str | None = None,
               beam: bool = True):
    """(model, tokenizer) for evaluation, a LoRA adapter (peft) merged in when given."""
    import torch
    from transformers import AutoModelForCausalLM

    tok, _ = load_eval_tokenizer(model, tokenizer=tokenizer, adapter=adapter, beam=beam)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' own "Loading weights" bar: library noise before ours
    try:
        lm = _loaded("model", model, lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=dtype))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if adapter is not None:
        from peft import PeftModel

        if lm.get_input_embeddings().num_embeddings < len(tok):  # a --beamify LoRA run: its rows are in the adapter
            lm.resize_token_embeddings(len(tok))
        lm = _loaded("LoRA adapter", adapter, lambda path: PeftModel.from_pretrained(lm, path).merge_and_unload())
    if len(tok) > lm.get_input_embeddings().weight.shape[0]:
        raise UsageError(f"the tokenizer has {len(tok)} tokens but the model only {lm.get_input_embeddings().weight.shape[0]} "
                         "embeddings: wrong tokenizer for this model?")
    return lm.to(device).eval(), tok


def evaluate_trainer(trainer, tokenizer, records: Sequence[dict]) -> dict[str, float] | None:
    """`--eval_beam`: the overall `eval_beam/<metric>`s of the model being trained, through `trainer.log`.
    Every rank must call it with the same `records` (docs/training.md); DeepSpeed: None."""
    from beam_sft.eval.backends import ShardedBackend

    accelerator = trainer.accelerator
    if trainer.is_deepspeed_enabled:
        if accelerator.is_main_process:
            logger.warning("eval_beam: not supported under DeepSpeed; run `beam-sft eval %s --data ...` on the "
                           "saved model instead", trainer.args.output_dir)
        return None
    if not records:
        return None  # the empty eval split was warned about before training (beam_sft.train.eval_callback)
    world = accelerator.num_processes
    model = accelerator.unwrap_model(trainer.model)
    backend = TransformersBackend(model, tokenizer, synced_gpus=trainer.is_fsdp_enabled and world > 1)
    if world > 1:
        backend = ShardedBackend(backend, accelerator.process_index, world)
    # The records are already converted: their source format is not known here, so one group.
    result = evaluate(backend, tokenizer, ((r, "eval_split") for r in records), EvalOptions(
        progress=accelerator.is_main_process and not trainer.args.disable_tqdm, total=len(records)))
    summary = result.summary()
    if accelerator.is_main_process:
        logger.info("Beam eval on %d eval records:\n%s", len(records), summary_table(result))
    metrics = {f"eval_beam/{k}": float(v) for k in (*METRICS, "turns", "generation_tokens", "tokens_per_second")
               if (v := summary.get(k)) is not None}
    trainer.log(dict(metrics))  # on every rank, as the Trainer logs its own metrics
    return metrics
