"""`beam-sft beamify BASE -o DIR`: any base model directory (or cached hub id) into a Beam base model.

DIR holds the base's weights with the embeddings grown for the seven markers (each new row initialised from
what it means, `beam_sft.template.marker_init`), the tokenizer with both Beam templates, the eos list
`[<|return|>, <|call|>]`, and `config.json`'s `beam_sft` entry (which ids are new and how they started, so a
LoRA run on DIR trains those rows). It is written atomically and only when it is servable as is and passes
every check-template rule (`serve.export.check_export`), the checks `beam-sft export` makes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError, UsageError


def beamify_directory(base: str, output: str | Path, *, init: str = "semantic", dtype: str = "auto") -> dict[str, Any]:
    """Write the beamified `base` to `output`; returns what was done (rows, eos, pad, check counts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.model.save import DTYPES, save_checked
    from beam_sft.template.conformance import run_suite
    from beam_sft.template.marker_init import INIT_CHOICES
    from beam_sft.template.tokenizer import beamify

    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if init not in INIT_CHOICES:
        raise UsageError(f"--init must be one of {', '.join(INIT_CHOICES)}, not {init!r}")
    output = Path(output)
    if output.resolve() == Path(base).resolve():
        raise UsageError("the output directory must differ from the base model's")
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError) as err:
        raise FatalError(f"cannot load {base!r}: {err}") from err
    if getattr(model.config, "beam_sft", None) or getattr(tokenizer, "response_template", None) is not None:
        raise UsageError(f"{base} is already a Beam model (it has a response template or beam_sft config)")
    old_len, base_eos = len(tokenizer), tokenizer.eos_token
    beamify(tokenizer, model, init=init)
    servable = save_checked(model, tokenizer, output, "would not be a usable Beam base")
    # save_checked ran every check-template rule on the written files and raised if one failed: count them
    checks = len(run_suite(AutoTokenizer.from_pretrained(str(output)), output))
    info = model.config.beam_sft or {}
    return {"output": str(output), "base": base, "old_vocab": old_len, "new_vocab": len(tokenizer),
            "init": init, "rows": info.get("rows", {}), "new_token_ids": info.get("new_token_ids", []),
            "tied": model.get_output_embeddings() is None
            or model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "base_eos": base_eos, "eos_token_id": servable["eos_token_id"], "pad_token": tokenizer.pad_token,
            "checks_passed": checks}


def describe(report: dict[str, Any]) -> list[str]:
    """What a person reads after `beam-sft beamify`: one line per fact."""
    rows = report["rows"]
    lines = [(f"{report['base']} -> {report['output']}: vocabulary {report['old_vocab']:,} -> {report['new_vocab']:,} "
              f"({len(rows)} rows added, init {report['init']}, embeddings "
              f"{'tied' if report['tied'] else 'untied: input and output rows both set'})")]
    for token, parts in rows.items():
        lines.append(f"  {token:<14} = " + " + ".join(
            f"{'1/' + str(len(parts)) + ' ' if len(parts) > 1 else ''}{'mean of the old rows' if p == 'mean' else repr(p)}"
            for p in parts))
    lines.append(f"eos_token_id {report['eos_token_id']} (<|return|>, <|call|>; the base's {report['base_eos']!r} "
                 "is not a stop: docs/real-model.md); pad " + repr(report["pad_token"]))
    lines.append(f"check-template: {report['checks_passed']}/{report['checks_passed']} rules pass")
    return lines
