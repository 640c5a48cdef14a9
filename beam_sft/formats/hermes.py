"""Hermes / Qwen tool-call tags, in ShareGPT (``conversations``) or OpenAI (``messages``) records.

The shape (NousResearch hermes-function-calling-v1, data exported from Qwen2.5/Qwen3 pipelines): the system
prompt lists the tools inside ``<tools>…</tools>``; the assistant writes
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (several tags = parallel calls); results
come back in ``<tool_response>…</tool_response>`` blocks, in a ``tool`` turn or a user turn. The fenced
variants (```` ```tools ````, ```` ```tool_call ````, ```` ```tool_response ````) too.

The OpenAI and ShareGPT converters recognise the tags themselves (so ``--dataset_format openai`` / ``sharegpt`` on
such records give the same result, and count them as ``hermes``); this entry point is what ``--dataset_format
hermes`` runs. The parsing rules are in `beam_sft.formats.toolmarkup`.
"""

from __future__ import annotations

from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats import openai, sharegpt
from beam_sft.records.types import BeamRecord


def is_sharegpt(rec: dict) -> bool:
    if "conversations" in rec:
        return True
    msgs = rec.get("messages")
    return type(msgs) is list and bool(msgs) and type(msgs[0]) is dict and "from" in msgs[0] \
        and "role" not in msgs[0]


def convert(rec: Any) -> BeamRecord:
    """One Hermes-tagged record (ShareGPT or OpenAI turns) → a Beam record (not yet validated)."""
    if isinstance(rec, list):
        rec = {"conversations": rec} if rec and type(rec[0]) is dict and "from" in rec[0] else {"messages": rec}
    if not isinstance(rec, dict):
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is a {type(rec).__name__}, not an object")
    beam = sharegpt.convert(rec) if is_sharegpt(rec) else openai.convert(rec)
    beam["_format"] = "hermes"
    return beam
