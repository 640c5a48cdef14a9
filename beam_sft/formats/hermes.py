"""Hermes / Qwen tool-call tags in ShareGPT or OpenAI records (``--dataset_format hermes``); both converters
lift the tags themselves, by `beam_sft.formats.toolmarkup` (docs/formats.md)."""

from __future__ import annotations

from typing import Any

from beam_sft.formats import openai, sharegpt
from beam_sft.records.types import BeamRecord


def is_sharegpt(rec: dict) -> bool:
    msgs = rec.get("messages")
    return "conversations" in rec or (type(msgs) is list and bool(msgs) and type(msgs[0]) is dict
                                      and "from" in msgs[0] and "role" not in msgs[0])


def convert(rec: Any) -> BeamRecord:
    """One Hermes-tagged record (ShareGPT or OpenAI turns) → a Beam record (not yet validated)."""
    if isinstance(rec, list):
        rec = {"conversations": rec} if rec and type(rec[0]) is dict and "from" in rec[0] else {"messages": rec}
    rec = openai.record_object(rec)
    beam = sharegpt.convert(rec) if is_sharegpt(rec) else openai.convert(rec)
    beam["_format"] = "hermes"
    return beam
