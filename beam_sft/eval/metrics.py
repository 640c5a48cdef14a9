"""Scoring a generated turn against its reference (`score_turn`), and the tallies of an evaluation."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from beam_sft.eval.degenerate import degenerate
from beam_sft.records.messages import CALL, HARMONY_MARKERS, RETURN

if TYPE_CHECKING:
    from beam_sft.eval.backends import Generation
    from beam_sft.eval.turns import Turn


# Which turns each metric is computed on (the denominator); the key order is the summary's (and `--json`'s).
APPLIES_TO = {
    "well_formed": "all turns",
    "stopped": "all turns",
    "has_reasoning": "all turns",
    "empty_analysis": "all turns (lower is better)",
    "degenerate_reasoning": "turns with reasoning (lower is better)",
    "action_match": "all turns",
    "tool_name_accuracy": "turns whose reference calls tools",
    "tool_args_exact": "turns whose reference calls tools",
    "tool_args_valid": "turns where the model called tools",
    "marker_leak": "all turns (lower is better)",
    "answer_exact": "turns whose reference answers",
}
METRICS = tuple(APPLIES_TO)
_LOWER_IS_BETTER = tuple(m for m, turns in APPLIES_TO.items() if "lower is better" in turns)  # fail when True


_START = "<|start|>assistant"
_CLOSES = ("<|end|>", RETURN, CALL)


def structure_error(text: str | None) -> str:
    """What is wrong with the shape of a generated turn's raw text, or "": text after a final answer, or after
    a call closed by `<|end|>`, which parse without error (docs/evaluation.md)."""
    messages = (text or "").split(_START)
    for k, message in enumerate(messages):
        header, _, body = message.partition("<|message|>")
        closer = min(((body.find(m), m) for m in _CLOSES if m in body), default=(0, None))[1]
        last = k == len(messages) - 1
        if "<|channel|>final" in header and not last:
            return f"the final answer is closed by {closer}, not {RETURN}: the turn goes on after its answer"
        if header.startswith(" to=") and closer == "<|end|>" and not (not last and messages[k + 1].startswith(" to=")):
            return f"a tool call closed by <|end|> is followed by something other than a call, not {CALL}"
    return ""


def is_well_formed(parsed: dict[str, Any] | None, stopped: bool, tool_names: set[str] | None = None,
                   text: str | None = None) -> tuple[bool, str]:
    """(ok, reason when not): the `well_formed` rule of docs/evaluation.md."""
    if not stopped:
        return False, "no stop token before max_new_tokens"
    if not parsed:
        return False, "nothing parsed"
    if shape := structure_error(text):
        return False, shape
    if not (thinking := reasoning_of(parsed)):
        return False, "no thinking"
    content = parsed.get("content")
    calls = parsed.get("tool_calls") or []
    for call in calls:
        function = call.get("function") or {}
        if not function.get("name") or not isinstance(function.get("arguments"), dict):
            return False, "malformed tool call"
        if tool_names is not None and function["name"] not in tool_names:
            return False, f"unknown tool {function['name']!r}"
    if not calls and (not isinstance(content, str) or not content.strip()):
        return False, "neither content nor tool_calls"
    if _has_marker(thinking) or _has_marker(content if isinstance(content, str) else ""):
        return False, "Harmony marker inside a text field"
    return True, ""


def _has_marker(text: str) -> bool:
    return any(marker in text for marker in HARMONY_MARKERS)


def has_marker_leak(parsed: dict[str, Any] | None) -> bool:
    """A Harmony marker inside any parsed text: thinking, content, tool names, argument keys and values."""
    if not parsed:
        return False
    calls = [c.get("function") for c in parsed.get("tool_calls") or [] if isinstance(c, dict)]
    # one JSON text of them all: JSON escapes no character of a marker, and quotes keep strings apart
    return _has_marker(json.dumps([parsed.get("thinking"), parsed.get("content"), calls], ensure_ascii=False,
                                  default=str))


def _calls(message: dict[str, Any] | None) -> list[tuple[Any, Any]]:
    """[(name, arguments)] of a message's tool calls."""
    functions = [call.get("function") if isinstance(call, dict) else None
                 for call in (message or {}).get("tool_calls") or []]
    return [(f.get("name"), f.get("arguments")) if isinstance(f, dict) else (None, None) for f in functions]


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True != 1 and "1" != 1; dict key order ignored."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _normalise(text: Any) -> str | None:
    return " ".join(text.split()) if isinstance(text, str) else None


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def schema_errors(value: Any, schema: Any, path: str = "arguments") -> list[str]:
    """Why `value` does not validate against `schema` (empty when it does). Unlike JSON Schema, an object
    schema with `properties` accepts no other keys unless `additionalProperties` says so."""
    if not isinstance(schema, dict) or not schema:
        return []
    errors: list[str] = []
    if (kinds := schema.get("type")) is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return [f"{path}: expected {'/'.join(map(str, kinds))}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and not any(same_json(value, option) for option in schema["enum"] or []):
        errors.append(f"{path}: {value!r:.60} not in enum {schema['enum']!r:.80}")
    if "const" in schema and not same_json(value, schema["const"]):
        errors.append(f"{path}: {value!r:.60} is not {schema['const']!r:.60}")
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and all(schema_errors(value, s, path) for s in options):
            errors.append(f"{path}: matches none of {key}")
    for sub in schema.get("allOf") or []:
        errors += schema_errors(value, sub, path)
    if isinstance(value, dict):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for key in schema.get("required") or []:
            if key not in value:
                errors.append(f"{path}: missing required {key!r}")
        extra = schema.get("additionalProperties", None if properties else True)
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif extra is False or (extra is None and properties):
                errors.append(f"{path}: unknown argument {key!r}")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, f"{path}.{key}")
    elif isinstance(value, list):
        if isinstance(items := schema.get("items"), dict):
            for k, item in enumerate(value):
                errors += schema_errors(item, items, f"{path}[{k}]")
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", math.inf):
            errors.append(f"{path}: {len(value)} items, outside minItems/maxItems")
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", math.inf):
            errors.append(f"{path}: length {len(value)} outside minLength/maxLength")
    elif _TYPES["number"](value) and not schema.get("minimum", -math.inf) <= value <= schema.get("maximum", math.inf):
        errors.append(f"{path}: {value} outside minimum/maximum")
    return errors


def tool_schemas(tools: Sequence[dict] | None) -> dict[str, dict]:
    """{tool name: parameters schema} of a record's tools (OpenAI `{"type": "function", "function": ...}`)."""
    out = {}
    for tool in tools or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = function.get("parameters") or {}
    return out


def reasoning_of(parsed: dict[str, Any] | None) -> str:
    """The parsed `thinking` when it says anything (not empty, not whitespace), else ""."""
    thinking = (parsed or {}).get("thinking")
    return thinking if isinstance(thinking, str) and thinking.strip() else ""


# `empty_analysis`: what a model trained on turns without reasoning learns (docs/reasoning.md).
ANALYSIS_OPEN = "<|channel|>analysis<|message|>"


def empty_analysis(text: str) -> bool:
    """Whether the first analysis message of a generated turn is empty (or whitespace only)."""
    if (start := text.find(ANALYSIS_OPEN)) < 0:
        return False
    return not re.split(r"<\|(?:end|start|call|return)\|>", text[start + len(ANALYSIS_OPEN):], maxsplit=1)[0].strip()


def turn_empty_analysis(generation: Generation, parsed: dict[str, Any] | None) -> bool:
    """`empty_analysis` of one generated turn: from its text, or a served turn's empty parsed `thinking`."""
    if getattr(generation, "parsed", None) is not None:
        return not reasoning_of(parsed)
    return empty_analysis(generation.text)


def analysis_tokens(tokenizer, parsed: dict[str, Any] | None) -> int:
    """The length of the parsed `thinking` in tokens (0 when there is none)."""
    thinking = (parsed or {}).get("thinking")
    if not isinstance(thinking, str) or not thinking:
        return 0
    return len(tokenizer.encode(thinking, add_special_tokens=False))


def degenerate_reasoning(parsed: dict[str, Any] | None, stop: str | None) -> bool | None:
    """The analysis loops (`beam_sft.eval.degenerate`), or was cut by the bound; None without reasoning."""
    if not (thinking := reasoning_of(parsed)):
        return None
    cut_inside = stop is None and not (parsed or {}).get("content") and not (parsed or {}).get("tool_calls")
    return degenerate(thinking, stopped=False if cut_inside else None) is not None


def score_turn(reference: dict[str, Any], parsed: dict[str, Any] | None, stop: str | None,
               tools: Sequence[dict] | None = None, text: str | None = None) -> tuple[dict[str, bool | None], str]:
    """({metric: True/False/None}, why not well-formed) for one generated turn (docs/evaluation.md)."""
    ref_calls = _calls(reference)
    expects_call = bool(ref_calls)
    gen_calls = _calls(parsed)
    well_formed, reason = is_well_formed(parsed, stop is not None, set(tool_schemas(tools)), text)
    metrics: dict[str, bool | None] = {
        "well_formed": well_formed, "stopped": stop == (CALL if expects_call else RETURN),
        "has_reasoning": bool(reasoning_of(parsed)), "degenerate_reasoning": degenerate_reasoning(parsed, stop),
        "action_match": bool(gen_calls) == expects_call, "tool_name_accuracy": None, "tool_args_exact": None,
        "tool_args_valid": None, "marker_leak": has_marker_leak(parsed), "answer_exact": None}
    if expects_call:
        metrics["tool_name_accuracy"] = [n for n, _ in gen_calls] == [n for n, _ in ref_calls]
        metrics["tool_args_exact"] = len(gen_calls) == len(ref_calls) and all(
            g[0] == r[0] and same_json(g[1], r[1]) for g, r in zip(gen_calls, ref_calls, strict=False)
        )
    else:
        ref_content = _normalise(reference.get("content"))
        metrics["answer_exact"] = ref_content is not None and _normalise((parsed or {}).get("content")) == ref_content
    if gen_calls:  # every call names one of the record's tools, with arguments its schema accepts
        schemas = tool_schemas(tools)
        metrics["tool_args_valid"] = all(
            name in schemas and isinstance(arguments, dict) and not schema_errors(arguments, schemas[name])
            for name, arguments in gen_calls
        )
    return metrics, reason


@dataclass
class TurnResult:
    """One scored turn, as the report shows it."""

    turn: Turn
    generation: Generation
    parsed: dict[str, Any] | None
    parse_error: str
    metrics: dict[str, bool | None]
    reason: str
    analysis_tokens: int = 0  # of the parsed thinking (`analysis_tokens`)

    @property
    def failed(self) -> list[str]:
        """The metrics this turn fails (empty_analysis and marker_leak fail when True)."""
        bad = [m for m, v in self.metrics.items() if v is False and m not in _LOWER_IS_BETTER]
        return bad + [m for m in _LOWER_IS_BETTER if self.metrics.get(m)]


@dataclass
class Tally:
    records: int = 0
    turns: int = 0
    hits: Counter = field(default_factory=Counter)  # metric -> turns it holds on
    applicable: Counter = field(default_factory=Counter)  # metric -> turns it applies to
    analysis_tokens: int = 0

    def add(self, result: TurnResult) -> None:
        self.turns += 1
        self.analysis_tokens += result.analysis_tokens
        self.applicable.update(m for m, v in result.metrics.items() if v is not None)
        self.hits.update(m for m, v in result.metrics.items() if v)

    def rate(self, name: str) -> float | None:
        return self.hits[name] / self.applicable[name] if self.applicable[name] else None

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "turns": self.turns, **{m: self.rate(m) for m in METRICS},
                "mean_analysis_tokens": self.mean_analysis_tokens}

    @property
    def mean_analysis_tokens(self) -> float | None:
        return round(self.analysis_tokens / self.turns, 2) if self.turns else None


@dataclass
class Throughput:
    """What a run generated, with which backend, and how fast (generation time only)."""

    backend: str = ""
    generation_tokens: int = 0
    generation_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float | None:
        return self.generation_tokens / self.generation_seconds if self.generation_seconds > 0 else None


@dataclass
class EvalResult(Throughput):
    overall: Tally = field(default_factory=Tally)
    by_format: dict[str, Tally] = field(default_factory=dict)
    by_effort: dict[str, Tally] = field(default_factory=dict)
    rejects: list[dict] = field(default_factory=list)  # the first `keep` rejects
    rejected: int = 0
    records: int = 0  # records evaluated (records with no assistant turn to prompt count here too)
    failures: list[TurnResult] = field(default_factory=list)  # the first `keep` failing turns
    failed_turns: int = 0

    def _tallies(self, source_format: str, effort: str) -> tuple[Tally, ...]:
        return self.overall, self.by_format.setdefault(source_format, Tally()), self.by_effort.setdefault(effort, Tally())

    def count_record(self, source_format: str, effort: str) -> None:
        self.records += 1
        for tally in self._tallies(source_format, effort):
            tally.records += 1

    def add(self, result: TurnResult, keep: int) -> None:
        for tally in self._tallies(result.turn.format, result.turn.effort):
            tally.add(result)
        self.generation_tokens += result.generation.n_tokens
        if result.failed:
            self.failed_turns += 1
            if len(self.failures) < keep:
                self.failures.append(result)

    def summary(self) -> dict[str, Any]:
        """What `--json` writes: the metrics overall, per source format and per reasoning effort."""
        return {**self.overall.to_dict(), "by_format": {k: v.to_dict() for k, v in sorted(self.by_format.items())},
                "by_effort": {k: v.to_dict() for k, v in sorted_by_effort(self).items()}, "rejected": self.rejected,
                "generation_tokens": self.generation_tokens, "tokens_per_second": self.tokens_per_second}


def sorted_by_effort(result: EvalResult) -> dict[str, Tally]:
    """Integer budgets in numeric order, then the named levels."""
    return dict(sorted(result.by_effort.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit()
                                                                   else 0, kv[0])))
