"""Did the fine-tune learn Beam? Generate held-out assistant turns and score their format, stops and tool calls.

For each chosen assistant turn of each record, the prompt is the conversation up to that turn rendered by the
tokenizer's chat template (with the record's `tools` and `chat_template_kwargs`). The model generates greedily
until `<|return|>` or `<|call|>` or `max_new_tokens`, the output is parsed with
`tokenizer.parse_response(generated, prefix=prompt, tools=tools)`, and the parse is scored against the
reference turn (see `score_turn` for each metric). Work is streamed: records are read, generated and scored
in chunks, so memory stays flat however many records there are; only failures kept for the report (capped)
are held.

    from beam_sft.eval.evaluate import load_model, TransformersBackend, evaluate
    model, tokenizer = load_model("outputs/quickstart/model")
    result = evaluate(TransformersBackend(model, tokenizer), tokenizer, records)   # [(record, format), ...]
    print(summary_table(result)); result.summary()["well_formed"]

`beam-sft eval` (beam_sft/cli/eval.py) is the command over this module; `scripts/quickstart.py` and
`scripts/train.py --eval_beam true` call it too.
"""

from __future__ import annotations

import html
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beam_sft.errors import Reason, RecordError, UsageError
from beam_sft.eval.reasoning_figures import analysis_tokens, empty_analysis
from beam_sft.records.messages import HARMONY_MARKERS

logger = logging.getLogger(__name__)

RETURN, CALL = "<|return|>", "<|call|>"
STOP_MARKERS = (RETURN, CALL)
TURN_CHOICES = ("first", "last", "all")
BACKENDS = ("transformers", "vllm")
# Key order of the summary (and of `--json`); every value is a fraction of the turns it applies to, or None.
METRICS = (
    "well_formed",
    "stopped",
    "has_reasoning",
    "empty_analysis",
    "action_match",
    "tool_name_accuracy",
    "tool_args_exact",
    "tool_args_valid",
    "marker_leak",
    "answer_exact",
)
# Which turns each metric is computed on (the denominator), for the table and the README.
APPLIES_TO = {
    "well_formed": "all turns",
    "stopped": "all turns",
    "has_reasoning": "all turns",
    "empty_analysis": "all turns (lower is better)",
    "action_match": "all turns",
    "tool_name_accuracy": "turns whose reference calls tools",
    "tool_args_exact": "turns whose reference calls tools",
    "tool_args_valid": "turns where the model called tools",
    "marker_leak": "all turns (lower is better)",
    "answer_exact": "turns whose reference answers",
}
_LOWER_IS_BETTER = ("empty_analysis", "marker_leak")  # metrics a turn fails when True
DEFAULT_EFFORT = "default"
PROMPT_TAIL_CHARS = 800


# --------------------------------------------------------------------------------------------------------
# Data


def _load_records(
    path: str | Sequence[str], fmt: str = "auto", split: str = "test", max_records: int | None = None
) -> Iterator[tuple[dict | None, dict | None, str]]:
    """Read `path` lazily: yields `(record, None, format)` for each Beam record, `(None, reject, format)` for
    each rejected input row (the converters' reason codes), in input order; at most `max_records` rows.

    The records go through the data phase's own per-record conversion (`beam_sft.dataset.phase.convert_one`, with
    its `internal_error` barrier and reject entries), one at a time: an evaluation reads a few hundred rows
    of what may be a large file, and stops there. `format` is the source format of the row: `fmt` when
    given, else what `beam_sft.formats.detect` says (a Beam record read under "auto" detects as "openai").
    """
    import orjson

    from beam_sft.dataset.phase import convert_one, reject_entry
    from beam_sft.errors import internal_error
    from beam_sft.formats import detect
    from beam_sft.records.files import expand_inputs, iter_items, parse_line

    specs = [path] if isinstance(path, str) else list(path)
    # As for training: a rejects file next to convert-dataset's output is not data.
    sources = [s for s in expand_inputs(specs, split) if "rejects" not in Path(s.name).name or s.name in specs]
    for item in iter_items(sources, limit=max_records):
        source_format = fmt
        try:
            if item.error is not None:
                raise item.error
            payload = item.payload if item.raw else orjson.dumps(item.payload, default=str)
            if fmt == "auto":
                try:
                    source_format = detect(parse_line(payload)) or "unknown"
                except RecordError:
                    source_format = "unknown"
            yield convert_one(payload, fmt), None, source_format
        except RecordError as err:
            yield None, reject_entry(err, item.source, item.position, item.by_line), source_format
        except Exception as exc:  # noqa: BLE001 - a converter bug: this row is a reject, the evaluation goes on
            yield None, reject_entry(internal_error(exc), item.source, item.position, item.by_line), source_format


# --------------------------------------------------------------------------------------------------------
# Turns and prompts


@dataclass
class Turn:
    """One assistant turn to generate: the prompt is the conversation before it."""

    record: int  # 0-based position of the record among the records evaluated
    message_index: int  # index of the reference assistant message in the record
    reference: dict[str, Any]
    tools: list[dict] | None
    format: str
    effort: str
    prompt: str = ""

    @property
    def expects_call(self) -> bool:
        return bool(self.reference.get("tool_calls"))


def assistant_indices(record: dict[str, Any], turns: str = "first") -> list[int]:
    """Indices of the assistant messages to evaluate. A message at index 0 has no prompt and is skipped."""
    if turns not in TURN_CHOICES:
        raise UsageError(f"--turns must be one of {', '.join(TURN_CHOICES)}, not {turns!r}")
    found = [i for i, m in enumerate(record.get("messages") or []) if m.get("role") == "assistant" and i > 0]
    if turns == "all" or not found:
        return found
    return [found[0]] if turns == "first" else [found[-1]]


def effort_label(record: dict[str, Any]) -> str:
    effort = (record.get("chat_template_kwargs") or {}).get("reasoning_effort")
    return DEFAULT_EFFORT if effort is None else str(effort)


def record_turns(tokenizer, record: dict[str, Any], index: int, source_format: str, turns: str) -> list[Turn]:
    """The record's chosen turns with their rendered prompts. A record the template cannot render raises
    RecordError(render_failed), so the caller counts it as rejected."""
    tools = record.get("tools") or None
    kwargs = record.get("chat_template_kwargs") or {}
    out = []
    for i in assistant_indices(record, turns):
        try:
            prompt = tokenizer.apply_chat_template(
                record["messages"][:i], tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as err:  # noqa: BLE001  (a template error on one record rejects that record only)
            raise RecordError(Reason.RENDER_FAILED, f"chat template failed on the prompt: {err}",
                              message_index=i) from None
        out.append(Turn(index, i, record["messages"][i], tools, source_format, effort_label(record), prompt))
    return out


# --------------------------------------------------------------------------------------------------------
# Generation backends


@dataclass
class Generation:
    text: str  # decoded output, stop token included, special tokens kept
    n_tokens: int
    stop: str | None  # "<|return|>" / "<|call|>", or None when cut at max_new_tokens


def stop_ids(tokenizer) -> dict[int, str]:
    """{token id: marker} of `<|return|>` and `<|call|>` (each must be one token)."""
    from beam_sft.dataset.examples import stop_token_ids

    return dict(zip(stop_token_ids(tokenizer), STOP_MARKERS, strict=True))


def _finish(tokenizer, ids: Sequence[int], stops: dict[int, str]) -> Generation:
    """Cut generated ids after the first stop token (what follows in a batch is padding) and decode."""
    ids = list(ids)
    stop = None
    for k, token in enumerate(ids):
        if token in stops:
            stop, ids = stops[token], ids[: k + 1]
            break
    return Generation(tokenizer.decode(ids, skip_special_tokens=False), len(ids), stop)


class TransformersBackend:
    """`model.generate`, greedy, batched with left padding, stopping at `<|return|>` / `<|call|>`."""

    name = "transformers"

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 256, batch_size: int = 8):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.stops = stop_ids(tokenizer)
        if tokenizer.pad_token_id is None:
            raise UsageError("the tokenizer has no pad token; batched generation needs one (beamify adds <|pad|>)")

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        import torch

        model, tok = self.model, self.tokenizer
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        side = tok.padding_side
        tok.padding_side = "left"  # new tokens must follow each prompt directly
        # MoE models trained with the router loss keep output_router_logits on in their config; generation
        # needs no router loss, and transformers' aux-loss code fails on left-padded batches with a cache.
        router_logits = getattr(model.config, "output_router_logits", None)
        if router_logits:
            model.config.output_router_logits = False
        out: list[Generation] = []
        try:
            for start in range(0, len(prompts), self.batch_size):
                batch = tok(list(prompts[start : start + self.batch_size]), add_special_tokens=False,
                            padding=True, return_tensors="pt").to(device)
                with torch.inference_mode():
                    ids = model.generate(
                        **batch,
                        max_new_tokens=self.max_new_tokens,
                        do_sample=False,
                        temperature=None,
                        top_p=None,
                        top_k=None,
                        eos_token_id=list(self.stops),
                        pad_token_id=tok.pad_token_id,
                        use_cache=True,
                    )
                width = batch["input_ids"].shape[1]
                out.extend(_finish(tok, row[width:].tolist(), self.stops) for row in ids)
        finally:
            tok.padding_side = side
            model.train(was_training)
            if router_logits:
                model.config.output_router_logits = router_logits
        return out


class VLLMBackend:
    """vLLM, with the same greedy decoding, bound and stop tokens as `TransformersBackend`.

    Needs vLLM installed and a CUDA GPU. Prompts go in as the HF tokenizer's token ids and outputs come back as
    ids decoded by the same tokenizer, so both backends feed the parser the same text. NOTE: written against
    vLLM's documented API (LLM, SamplingParams, TokensPrompt, LoRARequest) but not run in this project's CI,
    which has neither vLLM nor a GPU.
    """

    name = "vllm"

    def __init__(self, model: str, tokenizer, *, max_new_tokens: int = 256, adapter: str | None = None,
                 tokenizer_path: str | None = None):
        try:
            import torch
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise UsageError("--backend vllm: vLLM is not installed (pip install 'beam-sft[vllm]')") from err
        if not torch.cuda.is_available():
            raise UsageError("--backend vllm needs a CUDA GPU; use --backend transformers on CPU")
        self.tokenizer = tokenizer
        self.stops = stop_ids(tokenizer)
        lora_rank = {}
        if adapter is not None:
            config = Path(adapter) / "adapter_config.json"
            # vLLM refuses adapters above max_lora_rank (16 by default); configs/beam_lora.yaml uses r=32.
            rank = json.loads(config.read_text()).get("r", 16) if config.is_file() else 16
            lora_rank = {"max_lora_rank": max(16, int(rank))}
        self.llm = LLM(model=model, tokenizer=tokenizer_path or model, enable_lora=adapter is not None,
                       seed=0, **lora_rank)
        self.params = SamplingParams(
            temperature=0.0,  # greedy
            max_tokens=max_new_tokens,
            stop_token_ids=list(self.stops),
            skip_special_tokens=False,
            detokenize=False,  # decoded here, by the HF tokenizer, like the transformers backend
        )
        self.lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("beam-eval-adapter", 1, adapter)

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=self.tokenizer(p, add_special_tokens=False)["input_ids"])
                  for p in prompts]
        outputs = self.llm.generate(inputs, self.params, lora_request=self.lora, use_tqdm=False)
        result = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            # vLLM reports which stop id ended the sequence (None for the model's EOS, <|return|>); make sure
            # it is in the ids we decode, whether or not vLLM kept it in token_ids.
            if completion.finish_reason == "stop" and (not ids or ids[-1] not in self.stops):
                stop_id = completion.stop_reason if isinstance(completion.stop_reason, int) else None
                if stop_id is None and completion.stop_reason is None:
                    stop_id = self.tokenizer.eos_token_id
                if stop_id is not None:
                    ids.append(stop_id)
            result.append(_finish(self.tokenizer, ids, self.stops))
        return result


# --------------------------------------------------------------------------------------------------------
# Scoring


def is_well_formed(parsed: dict[str, Any] | None, stopped: bool, tool_names: set[str] | None = None) -> tuple[bool, str]:
    """Whether a parsed generation is a proper Beam assistant turn; (ok, reason when not).

    Proper: generation stopped on `<|return|>` / `<|call|>` (not at max_new_tokens), non-empty thinking, and
    either non-empty content or at least one tool call with a known name (when `tool_names` is given) and dict
    arguments; no Harmony marker leaked into any text field.
    """
    if not stopped:
        return False, "no stop token before max_new_tokens"
    if not parsed:
        return False, "nothing parsed"
    thinking = parsed.get("thinking")
    if not isinstance(thinking, str) or not thinking.strip():
        return False, "no thinking"
    content = parsed.get("content")
    calls = parsed.get("tool_calls") or []
    if calls:
        for call in calls:
            function = call.get("function") or {}
            if not function.get("name") or not isinstance(function.get("arguments"), dict):
                return False, "malformed tool call"
            if tool_names is not None and function["name"] not in tool_names:
                return False, f"unknown tool {function['name']!r}"
    elif not isinstance(content, str) or not content.strip():
        return False, "neither content nor tool_calls"
    for text in (thinking, content if isinstance(content, str) else ""):
        if any(marker in text for marker in HARMONY_MARKERS):
            return False, "Harmony marker inside a text field"
    return True, ""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def has_marker_leak(parsed: dict[str, Any] | None) -> bool:
    """A Harmony marker inside any parsed text: thinking, content, tool names, argument keys and values."""
    if not parsed:
        return False
    texts = _strings([parsed.get("thinking"), parsed.get("content"),
                      [c.get("function") for c in parsed.get("tool_calls") or [] if isinstance(c, dict)]])
    return any(marker in text for text in texts for marker in HARMONY_MARKERS)


def _calls(message: dict[str, Any] | None) -> list[tuple[Any, Any]]:
    """[(name, arguments)] of a message's tool calls."""
    out = []
    for call in (message or {}).get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        out.append((function.get("name"), function.get("arguments")))
    return out


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


# --- A small JSON Schema validator for tool arguments -----------------------------------------------------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def schema_errors(value: Any, schema: Any, path: str = "arguments") -> list[str]:
    """Why `value` does not validate against `schema` (empty when it does).

    Covers what tool schemas use: `type` (one or a list), `enum`, `const`, `required`, `properties`,
    `additionalProperties`, `items`, `anyOf`/`oneOf`/`allOf`, `minimum`/`maximum`, `minLength`/`maxLength`,
    `minItems`/`maxItems`. One rule differs from plain JSON Schema on purpose: an object schema that lists
    `properties` accepts no other keys unless `additionalProperties` says so, because a tool-call argument
    the tool does not declare is a made-up parameter, not a valid call.
    """
    if not isinstance(schema, dict) or not schema:
        return []
    errors: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
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
        items = schema.get("items")
        if isinstance(items, dict):
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


def call_errors(parsed: dict[str, Any] | None, tools: Sequence[dict] | None) -> list[str]:
    """Why the parsed tool calls are not valid calls of the record's tools (empty when all are)."""
    schemas = tool_schemas(tools)
    errors = []
    for name, arguments in _calls(parsed):
        if name not in schemas:
            errors.append(f"unknown tool {name!r}")
        elif not isinstance(arguments, dict):
            errors.append(f"{name}: arguments are not an object")
        else:
            errors += [f"{name}: {e}" for e in schema_errors(arguments, schemas[name])]
    return errors


def score_turn(
    reference: dict[str, Any],
    parsed: dict[str, Any] | None,
    stop: str | None,
    tools: Sequence[dict] | None = None,
) -> tuple[dict[str, bool | None], str]:
    """Every metric for one generated turn against its reference: ({metric: True/False/None}, why not
    well-formed). None means the metric does not apply to this turn (see APPLIES_TO).

    * well_formed: `is_well_formed` (any stop token, thinking, content or known tool calls, no marker leak)
    * stopped: ended on the *right* stop token: `<|call|>` when the reference calls, `<|return|>` when it answers
    * has_reasoning: non-empty thinking
    * action_match: called tools exactly when the reference does
    * tool_name_accuracy: the called tool names, in order, equal the reference's
    * tool_args_exact: names and arguments, in order, equal the reference's (JSON equality)
    * tool_args_valid: every generated call names a declared tool and its arguments validate against its schema
    * marker_leak: a Harmony marker inside any parsed text (lower is better)
    * answer_exact: the final content equals the reference's, whitespace normalised
    """
    ref_calls = _calls(reference)
    expects_call = bool(ref_calls)
    gen_calls = _calls(parsed)
    well_formed, reason = is_well_formed(parsed, stop is not None, set(tool_schemas(tools)))
    thinking = (parsed or {}).get("thinking")
    metrics: dict[str, bool | None] = {
        "well_formed": well_formed,
        "stopped": stop == (CALL if expects_call else RETURN),
        "has_reasoning": isinstance(thinking, str) and bool(thinking.strip()),
        "action_match": bool(gen_calls) == expects_call,
        "tool_name_accuracy": None,
        "tool_args_exact": None,
        "tool_args_valid": None,
        "marker_leak": has_marker_leak(parsed),
        "answer_exact": None,
    }
    if expects_call:
        metrics["tool_name_accuracy"] = [n for n, _ in gen_calls] == [n for n, _ in ref_calls]
        metrics["tool_args_exact"] = len(gen_calls) == len(ref_calls) and all(
            g[0] == r[0] and same_json(g[1], r[1]) for g, r in zip(gen_calls, ref_calls, strict=False)
        )
    else:
        ref_content = _normalise(reference.get("content"))
        metrics["answer_exact"] = ref_content is not None and _normalise((parsed or {}).get("content")) == ref_content
    if gen_calls:
        metrics["tool_args_valid"] = not call_errors(parsed, tools)
    return metrics, reason


# --------------------------------------------------------------------------------------------------------
# Aggregation


@dataclass
class TurnResult:
    """One scored turn, as the report shows it."""

    turn: Turn
    generation: Generation
    parsed: dict[str, Any] | None
    parse_error: str
    metrics: dict[str, bool | None]
    reason: str
    analysis_tokens: int = 0  # of the parsed thinking (beam_sft.eval.reasoning_figures)

    @property
    def failed(self) -> list[str]:
        """The metrics this turn fails (empty_analysis and marker_leak fail when True)."""
        bad = [m for m, v in self.metrics.items() if v is False and m not in _LOWER_IS_BETTER]
        return bad + [m for m in _LOWER_IS_BETTER if self.metrics.get(m)]


@dataclass
class Tally:
    records: int = 0
    turns: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(METRICS, 0))
    applicable: dict[str, int] = field(default_factory=lambda: dict.fromkeys(METRICS, 0))
    analysis_tokens: int = 0

    def add(self, result: TurnResult) -> None:
        self.turns += 1
        self.analysis_tokens += result.analysis_tokens
        for name, value in result.metrics.items():
            if value is not None:
                self.applicable[name] += 1
                self.hits[name] += bool(value)

    def rate(self, name: str) -> float | None:
        return self.hits[name] / self.applicable[name] if self.applicable[name] else None

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "turns": self.turns, **{m: self.rate(m) for m in METRICS},
                "mean_analysis_tokens": self.mean_analysis_tokens}

    @property
    def mean_analysis_tokens(self) -> float | None:
        return round(self.analysis_tokens / self.turns, 2) if self.turns else None


@dataclass
class EvalResult:
    overall: Tally = field(default_factory=Tally)
    by_format: dict[str, Tally] = field(default_factory=dict)
    by_effort: dict[str, Tally] = field(default_factory=dict)
    rejects: list[dict] = field(default_factory=list)  # the first `keep` rejects
    rejected: int = 0
    records: int = 0  # records evaluated (records with no assistant turn to prompt count here too)
    generation_tokens: int = 0
    generation_seconds: float = 0.0
    failures: list[TurnResult] = field(default_factory=list)  # the first `keep` failing turns
    failed_turns: int = 0
    backend: str = ""

    def count_record(self, source_format: str, effort: str) -> None:
        self.records += 1
        for tally in (self.overall, self.by_format.setdefault(source_format, Tally()),
                      self.by_effort.setdefault(effort, Tally())):
            tally.records += 1

    def add(self, result: TurnResult, keep: int) -> None:
        self.overall.add(result)
        self.by_format.setdefault(result.turn.format, Tally()).add(result)
        self.by_effort.setdefault(result.turn.effort, Tally()).add(result)
        self.generation_tokens += result.generation.n_tokens
        if result.failed:
            self.failed_turns += 1
            if len(self.failures) < keep:
                self.failures.append(result)

    @property
    def tokens_per_second(self) -> float | None:
        return self.generation_tokens / self.generation_seconds if self.generation_seconds > 0 else None

    def summary(self) -> dict[str, Any]:
        """What `--json` writes: the records and turns evaluated, each metric overall (a fraction of the turns
        it applies to, None when it applies to none), then the same per source format and per reasoning
        effort; plus rejected records, generated tokens and tokens/s."""
        return {
            **self.overall.to_dict(),
            "by_format": {k: v.to_dict() for k, v in sorted(self.by_format.items())},
            "by_effort": {k: v.to_dict() for k, v in _by_effort(self).items()},
            "rejected": self.rejected,
            "generation_tokens": self.generation_tokens,
            "tokens_per_second": self.tokens_per_second,
        }


# --------------------------------------------------------------------------------------------------------
# The loop


def _parse(tokenizer, turn: Turn, generation: Generation) -> tuple[dict | None, str]:
    try:
        return tokenizer.parse_response(generation.text, prefix=turn.prompt, tools=turn.tools), ""
    except Exception as err:  # noqa: BLE001  (a parser error is a malformed output, not a crash)
        return None, f"parse error: {type(err).__name__}: {err}"


def evaluate(
    backend,
    tokenizer,
    records: Iterable[tuple[dict | None, dict | None, str] | tuple[dict, str]],
    *,
    turns: str = "first",
    chunk_size: int = 64,
    keep: int = 200,
    progress: bool = True,
    total: int | None = None,
    on_result: Callable[[TurnResult], None] | None = None,
) -> EvalResult:
    """Generate and score the chosen turns of `records` with `backend` (`TransformersBackend`/`VLLMBackend`).

    `records` yields `(record, format)` pairs, or `(record, reject, format)` triples as `_load_records`
    does (rejects are counted and kept, up to `keep`). Records are processed `chunk_size` at a time, each
    chunk's prompts sorted by length so batches pad little. At most `keep` failing turns are kept for the
    report; `on_result` sees every scored turn (in generation order, not input order).
    """
    from tqdm.auto import tqdm

    if getattr(tokenizer, "response_template", None) is None:
        raise UsageError("the tokenizer has no response_template; install it with beam_sft.template.tokenizer.beamify")
    if turns not in TURN_CHOICES:
        raise UsageError(f"--turns must be one of {', '.join(TURN_CHOICES)}, not {turns!r}")
    result = EvalResult(backend=getattr(backend, "name", type(backend).__name__))
    bar = tqdm(total=total, desc="Evaluating", unit="rec", disable=not progress)
    pending: list[Turn] = []

    def flush() -> None:
        if not pending:
            return
        pending.sort(key=lambda t: len(t.prompt))
        start = time.perf_counter()
        generations = backend.generate([t.prompt for t in pending])
        result.generation_seconds += time.perf_counter() - start
        for turn, generation in zip(pending, generations, strict=True):
            parsed, error = _parse(tokenizer, turn, generation)
            metrics, reason = score_turn(turn.reference, parsed, generation.stop, turn.tools)
            metrics["empty_analysis"] = empty_analysis(generation.text)
            scored = TurnResult(turn, generation, parsed, error, metrics, error or reason,
                                analysis_tokens(tokenizer, parsed))
            result.add(scored, keep)
            if on_result is not None:
                on_result(scored)
        pending.clear()

    n_in_chunk = 0
    for entry in records:
        record, reject, fmt = entry if len(entry) == 3 else (entry[0], None, entry[1])
        bar.update(1)
        if reject is None:
            try:
                pending.extend(record_turns(tokenizer, record, result.records, fmt, turns))
            except RecordError as err:
                reject = err.to_dict()
            else:
                result.count_record(fmt, effort_label(record))
        if reject is not None:
            result.rejected += 1
            if len(result.rejects) < keep:
                result.rejects.append(reject)
            continue
        n_in_chunk += 1
        if n_in_chunk >= chunk_size:
            flush()
            n_in_chunk = 0
    flush()
    bar.close()
    return result


# --------------------------------------------------------------------------------------------------------
# Models


def resolve_adapter(model: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter): a MODEL directory that holds only a LoRA adapter (what scripts/train.py
    --use_peft saves) is evaluated on the base model its adapter_config.json names."""
    config = Path(model) / "adapter_config.json"
    if adapter is not None or not config.is_file() or (Path(model) / "config.json").is_file():
        return model, adapter
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise UsageError(f"{model} holds a LoRA adapter whose adapter_config.json names no base model; pass the "
                         "base model as MODEL and this directory as --adapter")
    return base, model


def load_eval_tokenizer(model: str, *, tokenizer: str | None = None, adapter: str | None = None):
    """(tokenizer, where it came from): `tokenizer`, else the adapter directory when it holds one
    (scripts/train.py saves it there), else the model's. It must carry both Beam templates."""
    from transformers import AutoTokenizer

    source = tokenizer or (adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else model)
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load the tokenizer {source!r}: {err}") from err
    if not tok.chat_template or getattr(tok, "response_template", None) is None:
        raise UsageError(
            f"{source}: the tokenizer lacks the Beam chat template or response_template "
            "(save it with beam_sft.template.tokenizer.save_tokenizer, or beamify it)"
        )
    return tok, source


def load_model(model: str, *, tokenizer: str | None = None, adapter: str | None = None, device: str | None = None):
    """(model, tokenizer) for evaluation: a saved directory or a hub id (the local cache when offline),
    optionally with a LoRA adapter (peft) merged in; the tokenizer as `load_eval_tokenizer` finds it."""
    import torch
    from transformers import AutoModelForCausalLM

    tok, _ = load_eval_tokenizer(model, tokenizer=tokenizer, adapter=adapter)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load the model {model!r}: {err}") from err
    if adapter is not None:
        from peft import PeftModel

        try:
            lm = PeftModel.from_pretrained(lm, adapter).merge_and_unload()
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot load the LoRA adapter {adapter!r}: {err}") from err
    if len(tok) > lm.get_input_embeddings().weight.shape[0]:
        raise UsageError(f"the tokenizer has {len(tok)} tokens but the model only {lm.get_input_embeddings().weight.shape[0]} "
                         "embeddings: wrong tokenizer for this model?")
    return lm.to(device).eval(), tok


def evaluate_trainer(trainer, tokenizer, records: Sequence[dict], *, max_new_tokens: int = 256,
                     batch_size: int = 8, turns: str = "first") -> dict[str, Any] | None:
    """`scripts/train.py --eval_beam true`: evaluate the trained model on the eval records (main process only;
    other ranks pass no records), log the overall metrics next to the loss as `eval_beam/<metric>`, and return
    the summary."""
    accelerator = trainer.accelerator
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        logger.warning("--eval_beam: the model is sharded (FSDP/DeepSpeed); run `beam-sft eval %s --data ...` "
                       "on the saved model instead", trainer.args.output_dir)
        return None
    summary = None
    # Only the main process has the records (the others pass none); every rank still meets the barrier below.
    if accelerator.is_main_process and not records:
        logger.warning("--eval_beam: no eval split (set --eval_dataset_name or --eval_split_size); skipped")
    elif accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        backend = TransformersBackend(model, tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size)
        # The records are already converted: their source format is not known here, so one group.
        result = evaluate(backend, tokenizer, ((r, "eval_split") for r in records), turns=turns,
                          progress=not trainer.args.disable_tqdm, total=len(records))
        summary = result.summary()
        logger.info("Beam eval on %d eval records:\n%s", len(records), summary_table(result))
        trainer.log({f"eval_beam/{k}": float(v) for k in (*METRICS, "turns", "tokens_per_second")
                     if (v := summary.get(k)) is not None})
    accelerator.wait_for_everyone()
    return summary


# --------------------------------------------------------------------------------------------------------
# Output


def _cell(tally: Tally | None, name: str) -> str:
    if tally is None or not tally.applicable[name]:
        return "n/a"
    return f"{100 * tally.hits[name] / tally.applicable[name]:.1f}% {tally.hits[name]}/{tally.applicable[name]}"


def _grid(title: str, groups: dict[str, Tally]) -> list[str]:
    names = list(groups)
    rows = [[title, *names], ["turns", *(str(groups[n].turns) for n in names)]]
    rows += [[m, *(_cell(groups[n], m) for n in names)] for m in METRICS]
    rows.append(["mean analysis tokens", *(str(groups[n].mean_analysis_tokens) for n in names)])
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def _by_effort(result: EvalResult) -> dict[str, Tally]:
    """Integer budgets in numeric order, then the named levels."""
    return dict(sorted(result.by_effort.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit()
                                                                   else 0, kv[0])))


def summary_table(result: EvalResult) -> str:
    """The stderr table: one line of counts, then every metric overall and per source format, then per effort."""
    tps = result.tokens_per_second
    head = (f"{result.records} records ({result.rejected} rejected), {result.overall.turns} turns, "
            f"{result.generation_tokens} generated tokens, "
            f"{'n/a' if tps is None else f'{tps:.1f}'} tokens/s ({result.backend})")
    lines = [head, *_grid("metric", {"all": result.overall, **dict(sorted(result.by_format.items()))})]
    if result.by_effort:
        lines += ["", *_grid("reasoning effort", _by_effort(result))]
    return "\n".join(lines)


_MARKER_RE = re.compile("|".join(re.escape(m) for m in HARMONY_MARKERS))


def _marked(text: str) -> str:
    """HTML-escaped text with the Harmony markers styled as in `beam-sft inspect --html`."""
    out, last = [], 0
    for match in _MARKER_RE.finditer(text):
        out.append(html.escape(text[last : match.start()]))
        out.append(f'<span class="tok u0 mk">{html.escape(match.group())}</span>')
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _json_html(value: Any) -> str:
    return _marked(json.dumps(value, ensure_ascii=False, indent=1))


def report_html(result: EvalResult, *, title: str = "beam-sft eval") -> str:
    """A self-contained page (the `beam-sft inspect --html` styles): the summary table, then every kept
    failing turn with the prompt tail, the raw generation, the parse and the reference."""
    from beam_sft.report.views import html_document

    tables = []
    for label, groups in (("Overall and by source format", {"all": result.overall, **result.by_format}),
                          ("By reasoning effort", _by_effort(result))):
        names = list(groups)
        rows = "".join(
            f"<tr><td>{m}</td>" + "".join(f"<td>{_cell(groups[n], m)}</td>" for n in names) + "</tr>"
            for m in METRICS
        )
        head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
        turns = "".join(f"<td>{groups[n].turns}</td>" for n in names)
        tables.append(f"<h2>{label}</h2><table><tr><th>metric</th>{head}</tr><tr><td>turns</td>{turns}</tr>"
                      f"{rows}</table>")
    parts = [f"<p>{html.escape(summary_table(result).splitlines()[0])}</p>", *tables]
    shown = len(result.failures)
    parts.append(f"<h2>Failures: {result.failed_turns} turns"
                 + (f" (the first {shown} shown)" if shown < result.failed_turns else "") + "</h2>")
    for k, r in enumerate(sorted(result.failures, key=lambda r: (r.turn.record, r.turn.message_index))):
        t = r.turn
        tail = t.prompt[-PROMPT_TAIL_CHARS:]
        cut = "\u2026" if len(t.prompt) > PROMPT_TAIL_CHARS else ""
        parts.append(
            f"<h2>#{k} record {t.record}, message {t.message_index} ({html.escape(t.format)}, effort "
            f"{html.escape(t.effort)}, expected {'a call' if t.expects_call else 'an answer'})</h2>"
            f'<p class="warn">fails: {html.escape(", ".join(r.failed))}'
            + (f" \u2014 {html.escape(r.reason)}" if r.reason else "")
            + f"; stop: {html.escape(str(r.generation.stop))}, {r.generation.n_tokens} tokens</p>"
            f'<div class="msg"><span class="who">prompt tail</span>{cut}{_marked(tail)}</div>'
            f'<div class="msg"><span class="who">generation</span>{_marked(r.generation.text)}</div>'
            f'<div class="msg"><span class="who">parse</span>{_json_html(r.parsed)}</div>'
            f'<div class="msg"><span class="who">reference</span>{_json_html(t.reference)}</div>'
        )
    if result.rejects:
        rows = "".join(f"<tr><td>{html.escape(str(r.get('source')))}:{r.get('line', r.get('index'))}</td>"
                       f"<td>{html.escape(str(r.get('reason')))}</td><td>{html.escape(str(r.get('message')))}</td></tr>"
                       for r in result.rejects)
        parts.append(f"<h2>Rejected records: {result.rejected}</h2><table>{rows}</table>")
    return html_document(title, "\n".join(parts))


__all__ = [
    "METRICS",
    "EvalResult",
    "Generation",
    "TransformersBackend",
    "VLLMBackend",
    "call_errors",
    "evaluate",
    "evaluate_trainer",
    "is_well_formed",
    "load_model",
    "report_html",
    "schema_errors",
    "score_turn",
    "summary_table",
]
