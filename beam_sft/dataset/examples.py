"""The per-record rules of training data: Beam records in, `input_ids` + `labels` out, with counts.

`scripts/train.py` runs them through `beam_sft.dataset.prepare` (Arrow, chunked, cached, once per job).

The trainer gets a pre-tokenized dataset (`input_ids`, `labels`), so TRL skips its own chat-template pass
and everything that decides what is trained happens here, where it can be tested:

* masks come from the chat template's `{% generation %}` block (`beam_sft.render.encoder.encode_record` when that
  module is present, else `tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True)`; the two
  are identical by contract), with the record's own `tools` and `chat_template_kwargs`;
* a record whose mask is empty is a hard error naming the record: it would silently train nothing;
* records longer than `max_length` follow a `TRUNCATION_POLICIES` policy, and every cut is counted;
* `PrepStats` holds total and supervised token counts for the run's log.

Truncation policies (records that fit are never touched):

    turn        cut back to the end of the last assistant turn that fits, so no assistant turn is trained
                half-way (a cut turn teaches output with no stop token); a record whose first assistant
                turn does not fit is dropped. The default.
    drop        drop every record longer than `max_length`.
    keep_start  keep the first `max_length` tokens, cutting wherever that falls (TRL's own behaviour);
                records whose cut lands inside an assistant turn are counted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from beam_sft.errors import FatalError, UsageError
from beam_sft.records.messages import STOP_MARKERS
from beam_sft.template.tokenizer import stop_token_ids

logger = logging.getLogger(__name__)

TRUNCATION_POLICIES = ("turn", "drop", "keep_start")
IGNORE_INDEX = -100

# A conversation that exercises both ways an assistant turn ends: a tool call (<|call|>) and an answer
# (<|return|>). Used once per run to check that the template trains both stop tokens.
STOP_PROBE: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Report it.", "content": "18 C in Paris."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
}


@dataclass
class PrepStats:
    """Counts for one prepared split. Token counts are after truncation, over the kept records."""

    records_in: int = 0
    records_kept: int = 0
    dropped_too_long: int = 0
    truncated: int = 0
    assistant_turns_cut: int = 0
    total_tokens: int = 0
    supervised_tokens: int = 0
    supervised_return: int = 0
    supervised_call: int = 0

    def summary(self, name: str = "train") -> str:
        share = 100.0 * self.supervised_tokens / self.total_tokens if self.total_tokens else 0.0
        return (
            f"{name}: {self.records_kept}/{self.records_in} records kept, {self.total_tokens} tokens, "
            f"{self.supervised_tokens} supervised ({share:.1f}%), trained stop tokens: "
            f"{self.supervised_return} <|return|>, {self.supervised_call} <|call|>; truncation: "
            f"{self.truncated} records cut, {self.dropped_too_long} dropped, "
            f"{self.assistant_turns_cut} assistant turns lost or cut"
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


# --------------------------------------------------------------------------------------------------------
# Records




# --------------------------------------------------------------------------------------------------------
# Tokenization and truncation


def encode_many(tokenizer, records: Sequence[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(input_ids, assistant_masks) of Beam records, as the chat template renders them.

    Uses `beam_sft.render.encoder`'s batched encoder when present (identical to apply_chat_template by contract,
    and much faster), else `apply_chat_template(..., return_assistant_tokens_mask=True)` per record.
    """
    try:
        from beam_sft.render.encoder import get_encoder
    except ImportError:
        get_encoder = None
    if get_encoder is not None:
        outs = get_encoder(tokenizer).encode(list(records), None)
    else:
        outs = [
            tokenizer.apply_chat_template(
                record["messages"],
                tools=record.get("tools"),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
                **(record.get("chat_template_kwargs") or {}),
            )
            for record in records
        ]
    return [(list(out["input_ids"]), list(out["assistant_masks"])) for out in outs]


def encode(tokenizer, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_masks) of one Beam record."""
    return encode_many(tokenizer, [record])[0]


def assistant_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) spans of consecutive 1s in `mask`: one per assistant turn."""
    spans, start = [], None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def truncate(
    input_ids: list[int], mask: list[int], max_length: int | None, policy: str
) -> tuple[list[int], list[int], dict[str, int]] | None:
    """Apply `policy` to one tokenized record. Returns (ids, mask, counts) or None when the record is dropped.

    counts: {"truncated": 0|1, "assistant_turns_cut": n} where n counts assistant turns that lost tokens.
    """
    if policy not in TRUNCATION_POLICIES:
        raise UsageError(f"unknown truncation policy {policy!r}; choose one of {', '.join(TRUNCATION_POLICIES)}")
    if max_length is None or len(input_ids) <= max_length:
        return input_ids, mask, {"truncated": 0, "assistant_turns_cut": 0}
    spans = assistant_spans(mask)
    if policy == "drop":
        return None
    if policy == "keep_start":
        cut = max_length
    else:  # "turn": end of the last assistant turn that fits
        ends = [end for _, end in spans if end <= max_length]
        if not ends:
            return None
        cut = ends[-1]
    lost = sum(1 for _, end in spans if end > cut)
    return input_ids[:cut], mask[:cut], {"truncated": 1, "assistant_turns_cut": lost}


class EmptyMaskError(FatalError):
    """A record has no supervised token: the template produced no assistant mask for it."""


def fit_example(
    input_ids: list[int], mask: list[int], *, max_length: int | None, policy: str = "turn", where: str = "record"
) -> tuple[list[int], list[int], dict[str, int]]:
    """The empty-mask check, then the truncation policy: (ids, mask, counts) with counts `truncated`, `dropped`
    and `assistant_turns_cut`; a dropped record comes back with empty ids and mask.

    Raises EmptyMaskError on an empty mask, before truncation: that is a template or data defect, not a length
    problem."""
    if not any(mask):
        raise EmptyMaskError(
            f"{where}: the chat template produced an empty assistant mask ({len(input_ids)} tokens, no "
            "supervised token). Check that the record has an assistant message and that the template wraps "
            "assistant output in {% generation %}...{% endgeneration %}"
        )
    result = truncate(input_ids, mask, max_length, policy)
    if result is None:
        return [], [], {"truncated": 0, "dropped": 1, "assistant_turns_cut": len(assistant_spans(mask))}
    input_ids, mask, counts = result
    return input_ids, mask, {**counts, "dropped": 0}


def build_example(
    tokenizer,
    record: dict[str, Any],
    *,
    max_length: int | None,
    policy: str = "turn",
    assistant_only_loss: bool = True,
    stop_ids: Sequence[int] = (),
    where: str = "record",
    encoded: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """One training row: `input_ids`, `labels` (IGNORE_INDEX off the mask) and per-record counts.

    `keep` is False when the truncation policy drops the record. Raises EmptyMaskError on an empty mask
    (`fit_example`). The data phase's workers build the labels of a whole batch at once instead
    (`beam_sft.dataset.workers`), by the same rule.
    """
    input_ids, mask = encoded if encoded is not None else encode(tokenizer, record)
    input_ids, mask, counts = fit_example(input_ids, mask, max_length=max_length, policy=policy, where=where)
    if counts["dropped"]:
        return {"input_ids": [], "labels": [], "keep": False, **counts, "n_supervised_return": 0,
                "n_supervised_call": 0}
    # Slices per assistant span rather than a loop per token: this runs once per training record.
    if assistant_only_loss:
        spans = _one_runs(mask)
        labels = [IGNORE_INDEX] * len(input_ids)
        for start, end in spans:
            labels[start:end] = input_ids[start:end]
    else:
        spans = [(0, len(input_ids))]
        labels = list(input_ids)
    n_return = n_call = 0
    for start, end in spans:
        supervised = input_ids[start:end]
        n_return += supervised.count(stop_ids[0]) if stop_ids else 0
        n_call += supervised.count(stop_ids[1]) if len(stop_ids) > 1 else 0
    return {
        "input_ids": input_ids,
        "labels": labels,
        "keep": True,
        **counts,
        "n_supervised_return": n_return,
        "n_supervised_call": n_call,
    }


_ONES = re.compile(b"[^\x00]+")


def _one_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """`assistant_spans` (runs of nonzero entries) found by the regex engine over the mask's bytes."""
    try:
        raw = bytes(mask)
    except (TypeError, ValueError):  # not small non-negative ints: the plain loop
        return assistant_spans([1 if bit else 0 for bit in mask])
    return [match.span() for match in _ONES.finditer(raw)]


def check_stop_tokens_trained(tokenizer) -> None:
    """Fail unless the template puts both `<|return|>` and `<|call|>` inside the assistant mask.

    Run once per training run: a template that leaves the stop token outside `{% generation %}` trains a
    model that never stops, and the loss curve does not show it.
    """
    input_ids, mask = encode(tokenizer, STOP_PROBE)
    trained = {tok for tok, bit in zip(input_ids, mask, strict=True) if bit}
    missing = [m for m, tid in zip(STOP_MARKERS, stop_token_ids(tokenizer), strict=True) if tid not in trained]
    if missing:
        raise FatalError(
            f"the chat template does not train {', '.join(missing)}: the assistant mask must cover each "
            "assistant turn through its stop token, or the model never learns to stop"
        )
