"""Hermes / Qwen tool-call tags in ShareGPT or OpenAI records: what ``--dataset_format hermes`` runs. The OpenAI and
ShareGPT converters recognise the tags themselves; the parsing rules are in `beam_sft.formats.toolmarkup`.
See docs/formats.md#tool-calling-datasets-hermes--qwen-tags-glaive-v2-xlam."""

from __future__ import annotations

from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats import openai, sharegpt
from beam_sft.records.types import BeamRecord, json_type


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
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is {json_type(rec)}, not an object")
    beam = sharegpt.convert(rec) if is_sharegpt(rec) else openai.convert(rec)
    beam["_format"] = "hermes"
    return beam
