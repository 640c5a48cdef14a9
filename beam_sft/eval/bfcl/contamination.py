"""Is BFCL in the training data? Question text and function names against BFCL v4, through hashes."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from beam_sft.errors import where
from beam_sft.eval.bfcl import checker

NGRAM = 13
MIN_WORDS = 6  # a shorter question ("What is 2+2?") matches by chance, not because it leaked
QUESTION_ROLES = ("system", "developer", "user")
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _key(tokens: Sequence[str]) -> bytes:
    return hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).digest()


def grams(tokens: Sequence[str], n: int = NGRAM) -> Iterable[bytes]:
    for k in range(len(tokens) - n + 1):
        yield _key(tokens[k:k + n])


@dataclass
class BfclIndex:
    """Hashes of BFCL's questions (whole and as n-grams) and its function names, each pointing at one entry id."""

    questions: dict[bytes, str] = field(default_factory=dict)
    ngrams: dict[bytes, str] = field(default_factory=dict)
    names: dict[str, set[str]] = field(default_factory=dict)
    lengths: set[int] = field(default_factory=set)  # word counts of the whole questions, to look them up
    categories: tuple[str, ...] = ()

    @classmethod
    def build(cls, categories: Sequence[str] = checker.CATEGORIES) -> BfclIndex:
        index = cls(categories=tuple(categories))
        for category in categories:
            for entry in checker.load_entries(category):
                index.add(entry)
        return index

    def add(self, entry: checker.Entry) -> None:
        for message in entry.question:
            if message.get("role") != "user" or not isinstance(message.get("content"), str):
                continue  # BFCL's system prompts are shared instructions, not questions
            tokens = words(message["content"])
            if len(tokens) >= MIN_WORDS:
                self.questions.setdefault(_key(tokens), entry.id)
                self.lengths.add(len(tokens))
            for gram in grams(tokens):
                self.ngrams.setdefault(gram, entry.id)
        for function in entry.check_functions:
            name = str(function.get("name", ""))
            for form in {name.lower(), name.replace(".", "_").lower()}:
                self.names.setdefault(form, set()).add(entry.id)

    def question_hit(self, text: str) -> tuple[str, str] | None:
        """(BFCL entry id, "whole" or "13-gram") for the first overlap of `text`, else None."""
        tokens = words(text)
        for n in sorted(self.lengths):
            if n > len(tokens):
                break
            for gram in grams(tokens, n):
                if hit := self.questions.get(gram):
                    return hit, "whole"
        for gram in grams(tokens):
            if hit := self.ngrams.get(gram):
                return hit, f"{NGRAM}-gram"
        return None


def _record_names(record: dict[str, Any]) -> set[str]:
    names = {str((t.get("function") or t).get("name", "")).lower() for t in record.get("tools") or []
             if isinstance(t, dict)}
    for message in record.get("messages") or []:
        for call in message.get("tool_calls") or []:
            names.add(str((call.get("function") or call).get("name", "")).lower())
    return names - {""}


def scan(items: Iterable[tuple[Any, str]], index: BfclIndex, *, keep: int = 50) -> dict[str, Any]:
    """Every record of `items` ((Item, format) pairs) against `index`: counts, overlaps and function names."""
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    options = Options(missing_reasoning="keep")  # a turn that is context, not target, is checked too
    records = rejected = overlapping = with_names = 0
    overlaps: list[dict[str, Any]] = []
    names: Counter = Counter()
    for item, fmt in items:
        record, _, reject = convert_item(item, fmt, options)
        records += 1
        if reject is not None:
            rejected += 1
            continue
        if (hit := _first_question_hit(record, index)) is not None:
            overlapping += 1
            if len(overlaps) < keep:
                overlaps.append({"source": item.source, "position": item.position,
                                 "where": where(item.source, item.position, item.by_line), **hit})
        shared = _record_names(record) & index.names.keys()
        with_names += bool(shared)
        names.update(shared)
    return {"records": records, "rejected": rejected, "bfcl_categories": list(index.categories),
            "records_with_question_overlap": overlapping, "question_overlaps": overlaps,
            "records_with_a_bfcl_function_name": with_names,
            "function_names": {name: {"records": n, "bfcl_entries": len(index.names[name])}
                               for name, n in names.most_common()}}


def _first_question_hit(record: dict[str, Any], index: BfclIndex) -> dict[str, Any] | None:
    for k, message in enumerate(record.get("messages") or []):
        content = message.get("content")
        if (message.get("role") in QUESTION_ROLES and isinstance(content, str)
                and (hit := index.question_hit(content)) is not None):
            return {"message_index": k, "bfcl_id": hit[0], "match": hit[1]}
    return None
