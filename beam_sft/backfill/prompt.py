"""What the teacher is asked, in mode `rationalize`: the reasoning that leads to a known reply.

The teacher sees the conversation so far (with the reasoning of earlier turns, filled or original), the
tools, and the reference reply (answer or tool calls); it writes only the reasoning. The reference reply is
never changed. `PROMPT_VERSION` is part of every cache key: change it whenever the words below change, so a
cache never mixes answers to different prompts.
"""

from __future__ import annotations

import json
from typing import Any

PROMPT_VERSION = "rationalize-1"
MODES = ("rationalize",)

SYSTEM = (
    "You write the private reasoning of an AI assistant. You are shown a conversation, the tools the assistant "
    "may call, and the assistant's next reply. Write the reasoning the assistant would think through right "
    "before that reply and that leads to exactly that reply: what the user needs, what is known, which tool to "
    "call with which arguments or what to answer, and why. Write plain text in the first person, as thoughts, "
    "without headings. Do not write the reply itself, do not address the user, and do not mention that you "
    "were shown the reply."
)


def _calls_text(calls: list[dict]) -> str:
    return "\n".join(f"call {c['function']['name']}({json.dumps(c['function'].get('arguments'), ensure_ascii=False)})"
                     for c in calls)


def _message_text(message: dict) -> str:
    role = message["role"]
    if role == "assistant":
        parts = []
        if message.get("reasoning_content"):
            parts.append(f"[assistant reasoning]\n{message['reasoning_content']}")
        if message.get("tool_calls"):
            parts.append(f"[assistant tool calls]\n{_calls_text(message['tool_calls'])}")
        if message.get("content"):
            parts.append(f"[assistant]\n{message['content']}")
        return "\n\n".join(parts)
    if role == "tool":
        return f"[result of {message.get('name') or 'tool'}]\n{message.get('content', '')}"
    return f"[{role}]\n{message.get('content', '')}"


def reply_text(message: dict) -> str:
    """The reference reply as the teacher sees it."""
    if message.get("tool_calls"):
        return "The assistant calls tools:\n" + _calls_text(message["tool_calls"])
    return "The assistant answers:\n" + (message.get("content") or "")


def teacher_messages(record: dict[str, Any], index: int) -> list[dict[str, str]]:
    """The chat messages sent to the teacher for the assistant turn at `record["messages"][index]`."""
    messages = record["messages"]
    parts = []
    tools = record.get("tools")
    if tools:
        parts.append("## Tools\n" + json.dumps([t.get("function", t) for t in tools], ensure_ascii=False, indent=1))
    history = "\n\n".join(_message_text(m) for m in messages[:index])
    parts.append("## Conversation so far\n" + (history or "(empty)"))
    parts.append("## The assistant's next reply\n" + reply_text(messages[index]))
    parts.append("Write only the reasoning that leads to this reply.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
