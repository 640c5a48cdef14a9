"""A prepared or trained model saved the one way (`beamify`, `export`): atomically, made servable, and
checked before it is in place, or not written at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_export(directory: Path) -> list[str]:
    """Problems of an exported directory: servability, then every check-template rule, run on the files."""
    from transformers import AutoTokenizer

    from beam_sft.serve.servable import servable_problems
    from beam_sft.template.conformance import run_suite

    problems = servable_problems(directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    problems += [f"check-template: {r.line()}" for r in run_suite(tokenizer, directory) if not r.ok]
    return problems


def save_checked(model, tokenizer, output: Path, failure: str) -> dict[str, Any]:
    """Save `model` + `tokenizer` into `output` atomically, made servable and checked (`check_export`); nothing
    is written when a check fails (FatalError "{output} {failure}: ..."). Returns `make_servable`'s report."""
    from beam_sft.serve.servable import make_servable
    from beam_sft.storage import atomic_output
    from beam_sft.template.tokenizer import save_tokenizer

    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(output, directory=True) as tmp:
        model.save_pretrained(str(tmp))
        save_tokenizer(tokenizer, tmp)
        report = make_servable(tmp, tokenizer, strict=True)
        if problems := check_export(tmp):
            raise FatalError(f"{output} {failure}:\n  " + "\n  ".join(problems))
    return report
