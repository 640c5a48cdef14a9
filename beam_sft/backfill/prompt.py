"""What the teacher is asked in mode `rationalize`: the reasoning to a known reply (docs/reasoning.md).
`PROMPT_VERSION` is part of every cache key: change it whenever the words below change."""

from __future__ import annotations

import json
from typing import Any

PROMPT_VERSION = "rationalize-2"
MODES = ("rationalize",)

SYSTEM = (
    "You write the private thoughts of an AI assistant. You are given a conversation and the reply the "
    "assistant gave next. Write the thoughts the assistant had just before that reply, in the first person: "
    "what the user wants, what is known, and why this reply (which tool to call with which arguments, or "
    "what to answer). Two to four sentences. Do not copy the reply and do not address the user."
)

# Where a small teacher goes on to write the next prompt of the pattern; at most four (the OpenAI API's limit).
STOP = ("\nThoughts before this reply", "\nUser:", "\nReply:", "\nConversation:")

RESULT_CHARS = 600  # a tool result longer than this is clipped in the prompt

# The worked examples: (tools, conversation, reply, thoughts), in other domains than the data's.
EXAMPLES = (
    ("- get_exchange_rate(base, target): the exchange rate between two currencies",
     "User: How many euros is 100 dollars?",
     'call get_exchange_rate({"base": "USD", "target": "EUR"})',
     ("The user wants 100 US dollars in euros. I do not know today's rate, and get_exchange_rate gives it, so "
     "I call it with base USD and target EUR and will multiply the rate by 100.")),
    ("- get_exchange_rate(base, target): the exchange rate between two currencies",
     ('User: How many euros is 100 dollars?\nAssistant calls: get_exchange_rate({"base": "USD", "target": '
     '"EUR"})\nResult of get_exchange_rate: {"rate": 0.92}'),
     "Answer: 100 US dollars are about 92 euros at today's rate of 0.92.",
     ("The tool says one dollar is 0.92 euros. 100 times 0.92 is 92, so I tell the user it is about 92 euros "
     "and mention the rate I used.")),
)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + " ..."


def _calls_text(calls: list[dict]) -> str:
    return "\n".join(f"{c['function']['name']}({json.dumps(c['function'].get('arguments'), ensure_ascii=False)})"
                     for c in calls)


def _message_text(message: dict) -> str:
    if (role := message["role"]) == "assistant":
        parts = (
            f"Assistant thinks: {message['reasoning_content']}" if message.get("reasoning_content") else "",
            "Assistant calls: " + _calls_text(message["tool_calls"]) if message.get("tool_calls") else "",
            f"Assistant: {message['content']}" if message.get("content") else "")
        return "\n".join(p for p in parts if p)
    if role == "tool":
        return f"Result of {message.get('name') or 'the tool'}: {_clip(message.get('content') or '', RESULT_CHARS)}"
    if role in ("system", "developer"):
        return f"{role.capitalize()}: {_clip(message.get('content') or '', RESULT_CHARS)}"
    return f"{role.capitalize()}: {message.get('content', '')}"


def _tool_line(tool: dict) -> str:
    fn = tool.get("function", tool)
    params = ", ".join((fn.get("parameters") or {}).get("properties") or {})
    description = " ".join(str(fn.get("description") or "").split())
    return f"- {fn.get('name')}({params})" + (f": {description}" if description else "")


def reply_text(message: dict) -> str:
    """The reference reply as the teacher sees it."""
    if message.get("tool_calls"):
        return "call " + "\ncall ".join(_calls_text(message["tool_calls"]).splitlines())
    return "Answer: " + (message.get("content") or "")


def _task(tools: str, conversation: str, reply: str) -> str:
    return f"Tools:\n{tools}\n\nConversation:\n{conversation}\n\nReply:\n{reply}\n\nThoughts before this reply?"


def teacher_messages(record: dict[str, Any], index: int) -> list[dict[str, str]]:
    """The chat messages sent to the teacher for the assistant turn at `record["messages"][index]`."""
    messages = record["messages"]
    tools = "\n".join(_tool_line(t) for t in record.get("tools") or []) or "(none)"
    history = "\n".join(_message_text(m) for m in messages[:index]) or "(empty)"
    chat = [{"role": "system", "content": SYSTEM}]
    for example_tools, conversation, reply, thoughts in EXAMPLES:
        chat += [{"role": "user", "content": _task(example_tools, conversation, reply)},
                 {"role": "assistant", "content": thoughts}]
    chat.append({"role": "user", "content": _task(tools, history, reply_text(messages[index]))})
    return chat
