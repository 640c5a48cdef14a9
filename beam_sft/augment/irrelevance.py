"""`irrelevance=P`: for a share P of the records that call tools, a new record where no declared tool fits and
the target says so (BFCL's "irrelevance" category; docs/tool-calling.md)."""

from __future__ import annotations

import random

from beam_sft.augment.base import Skip, Transform, sampled
from beam_sft.augment.distractors import unrelated_tools
from beam_sft.augment.words import (
    conversation_words,
    first_call,
    general_purpose,
    name_words,
    names_pattern,
    short_description,
    texts,
    tool_name,
)
from beam_sft.records.types import BeamRecord, Message, ToolSpec

REPLACEMENTS = 2  # pool tools put in place of the called ones
LISTED = 5  # tools named in the reasoning; more are counted

REASONING = (
    ("The user wants something that needs a tool, so I check what I have: {tools}. None of these can do what "
     "is asked, and calling one that does not fit would only give a wrong result. I'll tell the user I can't do "
     "this with the available tools."),
    ("Which of my tools could handle this request? The declared tools are {tools}. None of them matches what the "
     "user is asking for, so there is nothing to call. I should say so plainly instead of guessing."),
    ("Looking at the available tools: {tools}. None of them can serve this request; calling one anyway would be "
     "wrong. I'll explain that I can't do it with these tools."),
)
ANSWER = (
    "I'm sorry, but I can't help with that: none of the tools I have access to can do it.",
    ("Unfortunately, I don't have a tool for this request. The tools available to me are {names}, and none of "
     "them can handle it."),
    ("I can't do this with the tools I have ({names}). If you have a request one of them can handle, I'm happy "
     "to help."),
)


def listing(tools: list[ToolSpec], describe: bool) -> str:
    """The tools as prose: "a (what a does), b and c", at most `LISTED` of them named."""
    parts = []
    for tool in tools[:LISTED]:
        name = tool_name(tool)
        what = short_description(tool.get("function", tool).get("description")) if describe else ""
        parts.append(f"{name} ({what})" if what else name)
    if len(tools) > LISTED:
        parts.append(f"{len(tools) - LISTED} more")
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


class Irrelevance(Transform):
    name = "irrelevance"
    adds = True
    needs_pool = True

    def __call__(self, record: BeamRecord, rng: random.Random) -> BeamRecord:
        messages = record["messages"]
        if (at := first_call(messages)) is None:
            raise Skip("no_tool_call")
        sampled(rng, self.value)
        if at == 0 or messages[at - 1]["role"] != "user":
            raise Skip("no_user_before_call")
        called = {c["function"]["name"] for c in messages[at]["tool_calls"]}
        prefix = messages[:at]
        if any(m["role"] == "assistant" for m in prefix):
            raise Skip("earlier_assistant_turn")
        if names_pattern(sorted(called)).search("\n".join(texts({"messages": prefix}))):
            raise Skip("context_names_called_tool")
        tools = self._tools(record, called, rng)
        target: Message = {"role": "assistant",
                  "reasoning_content": rng.choice(REASONING).format(tools=listing(tools, describe=True)),
                  "content": rng.choice(ANSWER).format(names=listing(tools, describe=False))}
        return {**record, "messages": [*prefix, target], "tools": tools}

    def _tools(self, record: BeamRecord, called: set[str], rng: random.Random) -> list[ToolSpec]:
        """The declared tools that cannot serve the request and up to `REPLACEMENTS` pool tools, or Skip."""
        taken = set().union(*map(name_words, called)) | conversation_words(record)
        kept = [t for t in record.get("tools") or [] if tool_name(t) not in called
                and not name_words(tool_name(t)) & taken and not general_purpose(t)]
        declared = called | {tool_name(t) for t in kept}
        candidates = unrelated_tools(self.pool, record, declared)
        for name in rng.sample(candidates, min(REPLACEMENTS, len(candidates))):
            kept.insert(rng.randrange(len(kept) + 1), self.pool[name])
        if not kept:
            raise Skip("no_unrelated_tool")
        return kept
