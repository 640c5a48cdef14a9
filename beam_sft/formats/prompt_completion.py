"""TRL's prompt/completion rows (conversational or plain) → Beam records; the prompt's assistant turns get
weight 0, as TRL trains only the completion (docs/formats.md#alpaca-and-trl-promptcompletion-records)."""

from __future__ import annotations

from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import convert_messages, finish, record_object
from beam_sft.records.messages import normalize_tools
from beam_sft.records.types import BeamRecord, Message, wrong_type


def _part(rec: dict, key: str, role: str) -> list:
    """The prompt or completion as a list of input messages (a string is one message of `role`)."""
    value = rec.get(key)
    if type(value) is str:
        return [{"role": role, "content": value}]
    if type(value) is dict and "role" in value:  # one message, not in a list
        return [value]
    if type(value) is not list:
        raise wrong_type(Reason.BAD_CONTENT if value is not None else Reason.UNKNOWN_FORMAT, f"{key!r}", value,
                         "a string or a list of messages")
    return value


def _check_completion(completion: list[Message], first: int) -> None:
    """The completion's messages: the assistant's turns and the results of its calls, with something to train."""
    if not completion:
        raise RecordError(Reason.EMPTY_COMPLETION, "'completion' is empty: nothing to train")
    for k, m in enumerate(completion):
        if m["role"] not in ("assistant", "tool"):
            raise RecordError(Reason.COMPLETION_NOT_ASSISTANT, f"completion[{k}] is a {m['role']} message; the "
                              "completion holds the assistant's turns (move the others into 'prompt')",
                              message_index=first + k)
    if completion[0]["role"] != "assistant":
        raise RecordError(Reason.COMPLETION_NOT_ASSISTANT, "the completion starts with a tool result, not the "
                          "assistant's turn", message_index=first)
    if not any(m.get("tool_calls") or (m["role"] == "assistant" and m["content"].strip()) for m in completion):
        raise RecordError(Reason.EMPTY_COMPLETION, "the completion's assistant turns are empty: nothing to train",
                          message_index=first)


def convert(rec: Any) -> BeamRecord:
    """One prompt/completion row → a Beam record; message indexes count the prompt's messages, then the
    completion's."""
    rec = record_object(rec)
    if "prompt" not in rec or "completion" not in rec:
        raise RecordError(Reason.UNKNOWN_FORMAT, "a prompt/completion row needs 'prompt' and 'completion'")
    prompt, completion = _part(rec, "prompt", "user"), _part(rec, "completion", "assistant")
    tools = normalize_tools(rec.get("tools"))
    no_text: list[int] = []
    messages, tools, src = convert_messages([*prompt, *completion], tools, no_text)
    first = len(prompt) if src is None else src.index(len(prompt)) if len(prompt) in src else len(messages)
    for m in messages[:first]:
        if m["role"] == "assistant" and m.get("weight") is None:
            m["weight"] = 0  # TRL's completion_only_loss: the prompt is context
    _check_completion(messages[first:], len(prompt))
    return finish(rec, messages, tools, src, no_text)
