"""Did the fine-tune keep its reasoning? Two figures per generated turn, besides `has_reasoning`.

* ``empty_analysis``: the turn opened an analysis message and closed it with nothing in it
  (``<|channel|>analysis<|message|><|end|>``), the exact output a model trained on turns without reasoning
  learns (docs/reasoning.md). Beam never writes one. A served turn (`beam_sft.eval.openai_backend`) comes back
  parsed by the server, without its text: there an empty ``thinking`` counts as an empty analysis.
* ``analysis_tokens``: the length of the parsed ``thinking`` in tokens (0 when there is none); the report
  shows its mean per turn, so a model whose reasoning shrank shows it even when it is not empty.
"""

from __future__ import annotations

from typing import Any

ANALYSIS_OPEN = "<|channel|>analysis<|message|>"


def empty_analysis(text: str) -> bool:
    """Whether the first analysis message of a generated turn is empty (or whitespace only)."""
    start = text.find(ANALYSIS_OPEN)
    if start < 0:
        return False
    body = text[start + len(ANALYSIS_OPEN):]
    for end in ("<|end|>", "<|start|>", "<|call|>", "<|return|>"):
        cut = body.find(end)
        if cut >= 0:
            body = body[:cut]
    return not body.strip()


def turn_empty_analysis(generation: Any, parsed: dict[str, Any] | None) -> bool:
    """`empty_analysis` of one generated turn: from its text, or from the server's parse of a served turn."""
    if getattr(generation, "parsed", None) is not None:
        thinking = (parsed or {}).get("thinking")
        return not (isinstance(thinking, str) and thinking.strip())
    return empty_analysis(generation.text)


def analysis_tokens(tokenizer, parsed: dict[str, Any] | None) -> int:
    thinking = (parsed or {}).get("thinking")
    if not isinstance(thinking, str) or not thinking:
        return 0
    return len(tokenizer.encode(thinking, add_special_tokens=False))
