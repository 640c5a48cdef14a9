"""`ask-missing=P`: for a share P of the records whose first call fills a required argument with a value the
user wrote, a new record where the user did not and the assistant asks for it (docs/tool-calling.md)."""

from __future__ import annotations

import random
import re
from typing import Any

from beam_sft.augment.base import Skip, Transform, sampled
from beam_sft.augment.words import declared, first_call, short_description, texts
from beam_sft.records.types import BeamRecord, Message

PREPOSITIONS = ("in", "for", "to", "at", "of", "on", "from", "near", "about", "with", "by", "into", "called", "named",
                "titled")
# words that may follow the removed phrase and still leave a sentence ("weather in Cairo right now")
CLAUSE_WORDS = ("please", "right", "now", "today", "tomorrow", "tonight", "this", "next", "within", "using",
                "because", "since", "but")
# words a prepositional phrase or a quoted value may complete: dropping the phrase after them leaves "I was born."
COMPLEMENT_VERBS = frozenset({"is", "am", "are", "was", "were", "be", "been", "being", "born", "currently", "located",
                              "based", "live", "lives", "living", "stay", "staying", "called", "named", "titled",
                              "say", "says", "said", "read", "reads"})
_QUOTES = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
_CLAUSE_END = rf"(?=\s*$|[!?;:)]|[.,](?:\s|$)|\s+(?:{'|'.join(CLAUSE_WORDS)})\b)"
_PREP = rf"(?:\b(?:{'|'.join(PREPOSITIONS)})\s+)"

REASONING = (
    ("To call {tool} I need {param} ({what}), and the user has not said what it should be. Guessing would be "
     "wrong, so I'll ask for it first."),
    ("The request needs {tool}, whose required argument {param} is {what}. The user didn't give it, so I "
     "can't make the call yet; I'll ask."),
    ("{tool} requires {param}: {what}. Nothing in the conversation tells me its value, and I must not invent "
     "one. I'll ask the user for it."),
)
ASK = (
    "Sure, I can help with that. Could you tell me {what}?",
    "I need one more detail before I can do this: {what}. What should I use?",
    "Happy to help. What is {what}?",
)


def value_text(value: Any) -> str | None:
    """The value as the user would write it: a string of three or more characters, or a number."""
    if type(value) is str:
        return value if len(value.strip()) >= 3 else None
    if type(value) is float and value.is_integer():
        return str(int(value))
    if type(value) in (int, float):
        return str(value)
    return None


def _edges(value: str) -> tuple[str, str]:
    """Lookarounds that make `value` a whole token: not inside a word, nor a number inside a longer one."""
    before = r"(?<![\w.])" if value[:1].isdigit() else r"(?<!\w)" if value[:1].isalnum() else ""
    after = r"(?!\w|\.\d)" if value[-1:].isalnum() else ""
    return before, after


def written(value: str, text: str) -> bool:
    before, after = _edges(value)
    return re.search(f"{before}{re.escape(value)}{after}", text, re.IGNORECASE) is not None


def _after_verb(text: str, start: int) -> bool:
    """Whether the phrase at `start` completes a verb ("I was born *on 1990-05-15*", "the subject is *"X"*"):
    without it the sentence would stop short."""
    if (word := re.search(r"([\w']+)\s*$", text[:start])) is None:
        return False
    w = word.group(1).lower()
    return w in COMPLEMENT_VERBS or w.rpartition("'")[2] in ("s", "m", "re")


def drop_phrase(text: str, value: str) -> str | None:
    """`text` without the phrase that holds `value` (a preposition and the value, the value quoted or not), tidied;
    None when no such phrase ends a clause, or one completes a verb."""
    before, after = _edges(value)
    escaped = re.escape(value)
    quoted = "|".join(f"{re.escape(a)}{escaped}{re.escape(b)}" for a, b in _QUOTES)
    for pattern in (rf"\s*{_PREP}?(?:{quoted}){_CLAUSE_END}", rf"\s*{_PREP}{before}{escaped}{after}{_CLAUSE_END}"):
        if not (found := list(re.finditer(pattern, text))):
            continue
        if any(_after_verb(text, m.start()) for m in found):
            return None
        new = re.sub(pattern, "", text)
        new = re.sub(r"[ \t]{2,}", " ", new)
        new = re.sub(r"\s+([.,!?;:])", r"\1", new)
        return re.sub(r",([.!?])", r"\1", new).strip()
    return None


_EXAMPLES = re.compile(r",?\s*\(?\b(?:e\.g\.|i\.e\.|for example|such as|like)\s.*$", re.IGNORECASE)
_DETERMINERS = ("the", "a", "an", "your", "their", "its", "which", "what", "whether", "how", "when", "where", "who")


def describe(name: str, schema: dict) -> str:
    """How to ask for a parameter: its description's first sentence without examples ("the currency to convert
    to"), "the" put before a bare noun phrase ("the city name"); else its name as words ("the to currency")."""
    what = short_description(schema.get("description")) if type(schema) is dict else ""
    what = _EXAMPLES.sub("", what).strip(" ,;:")
    first = what.split(" ", 1)[0]
    if first and not (first.lower().endswith("s") and len(what.split()) > 1 and first.lower() not in ("its",)):
        what = what if what[1:2].isupper() else what[0].lower() + what[1:]
        return what if what.split(" ", 1)[0] in _DETERMINERS else f"the {what}"
    return "the " + re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").lower()


class AskMissing(Transform):
    name = "ask-missing"
    adds = True

    def __call__(self, record: BeamRecord, rng: random.Random) -> BeamRecord:
        messages = record["messages"]
        if (at := first_call(messages)) is None:
            raise Skip("no_tool_call")
        call = messages[at]["tool_calls"][0]["function"]
        if (fn := declared(record).get(call["name"])) is None:
            raise Skip("undeclared_call")
        params = fn.get("parameters") or {}
        required = [r for r in params.get("required") or () if type(r) is str and r in call["arguments"]]
        if not required:
            raise Skip("no_required_argument")
        user = next((m for m in reversed(messages[:at]) if m["role"] == "user"), None)
        found = [(r, v) for r in required if (v := value_text(call["arguments"][r])) is not None and user is not None
                 and written(v, user["content"])]
        if not found:
            raise Skip("value_not_in_message")
        sampled(rng, self.value)
        if messages[at - 1] is not user:
            raise Skip("no_user_before_call")
        rng.shuffle(found)
        reason = "no_removable_phrase"
        for param, value in found:
            schema = (params.get("properties") or {}).get(param)
            if type(schema) is dict and "default" in schema:
                reason = "has_default"
                continue
            try:
                return self._ask(record, at, value, {"tool": call["name"], "param": param,
                                                     "what": describe(param, schema)}, rng)
            except Skip as skip:
                reason = skip.reason
        raise Skip(reason)

    @staticmethod
    def _ask(record: BeamRecord, at: int, value: str, words: dict[str, str], rng: random.Random) -> BeamRecord:
        """The record cut before its call at `at`, `value` dropped from the user's message, asking for it."""
        messages = record["messages"]
        if (text := drop_phrase(messages[at - 1]["content"], value)) is None:
            raise Skip("no_removable_phrase")
        if len(text.split()) < 3:
            raise Skip("nothing_left")
        prefix = [*messages[:at - 1], {**messages[at - 1], "content": text}]
        if written(value, "\n".join(texts({"messages": prefix}))):
            raise Skip("value_elsewhere")
        target: Message = {"role": "assistant", "reasoning_content": rng.choice(REASONING).format(**words),
                           "content": rng.choice(ASK).format(what=words["what"])}
        return {**record, "messages": [*prefix, target]}
