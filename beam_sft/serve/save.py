"""A prepared or trained model saved the one way (`beamify`, `export`): `save_checked`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError

DTYPES = ("auto", "float32", "bfloat16", "float16")


def save_checked(model, tokenizer, output: Path, failure: str) -> dict[str, Any]:
    """Save `model` + `tokenizer` to `output` atomically, made servable and checked (servability, every
    check-template rule): nothing is written if one fails (FatalError). Returns `make_servable`'s report."""
    from transformers import AutoTokenizer

    from beam_sft.serve.servable import make_servable, servable_problems
    from beam_sft.storage import atomic_output
    from beam_sft.template.conformance import run_suite
    from beam_sft.template.tokenizer import save_tokenizer

    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(output, directory=True) as tmp:
        model.save_pretrained(str(tmp))
        save_tokenizer(tokenizer, tmp)
        report = make_servable(tmp, tokenizer, strict=True)
        problems = servable_problems(tmp)
        saved = AutoTokenizer.from_pretrained(str(tmp))
        problems += [f"check-template: {r.line()}" for r in run_suite(saved, tmp) if not r.ok]
        if problems:
            raise FatalError(f"{output} {failure}:\n  " + "\n  ".join(problems))
    return report
