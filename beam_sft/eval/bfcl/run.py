"""Generate BFCL entries with any `beam-sft eval` backend, decode, score with BFCL's checker; write and re-score
the per-entry outputs.

    from beam_sft.eval.bfcl.run import evaluate_bfcl
    result = evaluate_bfcl(backend, tokenizer, ["simple_python", "irrelevance"], style="beam", max_records=50)
    result.summary()["bfcl"]["simple_python"]["accuracy"]

Each outputs line, `{"id", "category", "calls": [{"name", "arguments"}], "text", "well_formed", "valid", ...}`, holds
what BFCL's checker was given: `rescore(path)` runs the checker again on it and gives the same figures.

well_formed: in the `beam` style the held-out metric's definition (`beam_sft.eval.metrics.is_well_formed`: a stop
token, reasoning, a final answer or calls to declared tools with JSON-object arguments, no marker leak); in the
`prompt` style, the model stopped on its own and its text is either a call list BFCL's decoder reads or no call at
all (it does not start with `[`); in the `json` style, it stopped on its own and every `<tool_call>` block it wrote
is a JSON list of `{"name", "arguments"}` calls (or it wrote none).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from beam_sft.errors import UsageError
from beam_sft.eval.bfcl import checker, prompts

KEEP_FAILURES = 300


@dataclass
class BfclTurn:
    """One entry to generate, shaped as the backends' `Turn` (prompt, messages, tools, template kwargs)."""

    entry: checker.Entry
    prompt: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scored:
    """One entry's outputs line (`to_json`) and BFCL's verdict on it."""

    id: str
    category: str
    calls: list[dict[str, Any]]
    text: str
    well_formed: bool
    valid: bool
    decode_error: str = ""
    error_type: str = ""
    error: list[str] = field(default_factory=list)
    stop: str | None = None
    style: str = "beam"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "category": self.category, "calls": self.calls, "text": self.text,
                "well_formed": self.well_formed, "valid": self.valid, "decode_error": self.decode_error,
                "error_type": self.error_type, "error": self.error, "stop": self.stop, "style": self.style}


@dataclass
class BfclResult:
    """Counts per category, the kept failures, generation time."""

    backend: str = ""
    style: str = "beam"
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    error_types: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[Scored] = field(default_factory=list)
    generation_seconds: float = 0.0
    generation_tokens: int = 0

    def add(self, scored: Scored, keep: int = KEEP_FAILURES) -> None:
        c = self.counts.setdefault(scored.category, {"n": 0, "valid": 0, "well_formed": 0, "called": 0})
        c["n"] += 1
        c["valid"] += scored.valid
        c["well_formed"] += scored.well_formed
        c["called"] += bool(scored.calls)
        if not scored.valid:
            kinds = self.error_types.setdefault(scored.category, {})
            kinds[scored.error_type or "unknown"] = kinds.get(scored.error_type or "unknown", 0) + 1
            if len(self.failures) < keep:
                self.failures.append(scored)

    def summary(self) -> dict[str, Any]:
        per = {cat: {"accuracy": c["valid"] / c["n"], "n": c["n"], "well_formed": c["well_formed"] / c["n"],
                     "called": c["called"] / c["n"],
                     "error_types": dict(sorted(self.error_types.get(cat, {}).items()))}
               for cat, c in self.counts.items() if c["n"]}
        n = sum(c["n"] for c in self.counts.values())
        return {"bfcl": per, "bfcl_summary": checker.summary(per), "style": self.style, "backend": self.backend,
                "entries": n, "well_formed": (sum(c["well_formed"] for c in self.counts.values()) / n) if n else None,
                "called": self.called(),
                "generation_tokens": self.generation_tokens,
                "tokens_per_second": (self.generation_tokens / self.generation_seconds
                                      if self.generation_seconds else None)}

    def called(self) -> dict[str, dict[str, int]]:
        """Entries answered with at least one call, split by whether a call is right (AST, relevance) or none is
        (irrelevance): accuracy alone hides a model that never calls, or always does."""
        out = {"call_expected": {"called": 0, "n": 0}, "no_call_expected": {"called": 0, "n": 0}}
        for cat, c in self.counts.items():
            side = out["no_call_expected" if checker.expects_no_call(cat) else "call_expected"]
            side["called"] += c["called"]
            side["n"] += c["n"]
        return out


REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def make_turn(tokenizer, entry: checker.Entry, style: str) -> BfclTurn:
    conversation = prompts.messages(entry, style)
    declared = prompts.tools(entry) if style == "beam" else None
    # BFCL's history turns (8 live_irrelevance entries) are the benchmark's, with no reasoning to send back: a
    # server that refuses missing reasoning by default (our vLLM recipe) is told so, and renders what offline does.
    kwargs = {"allow_missing_thinking": True} if style == "beam" and any(
        m.get("role") == "assistant" and not any(m.get(k) for k in REASONING_KEYS) for m in conversation) else {}
    try:
        prompt = tokenizer.apply_chat_template(conversation, tools=declared, tokenize=False, add_generation_prompt=True,
                                               **kwargs)
    except Exception as err:
        raise UsageError(f"BFCL {entry.id}: the chat template cannot render this entry: {err}") from err
    return BfclTurn(entry, prompt, conversation, declared, kwargs)


def _plain_text(generation) -> str:
    """The generated text without the stop token: what BFCL's prompting decoder reads."""
    parsed = getattr(generation, "parsed", None)
    if parsed is not None:
        return parsed.get("content") or ""
    text = generation.text
    if generation.stop and text.endswith(generation.stop):
        text = text[: -len(generation.stop)]
    return text


def _score_prompt(turn: BfclTurn, generation, tokenizer) -> Scored:
    text = _plain_text(generation)
    if getattr(generation, "error", ""):
        decoded, why = None, generation.error
    else:
        decoded, why = prompts.decode_prompt(text, turn.entry.category)
    stripped = text.strip("`\n ")
    decodes_as_calls = decoded is not None and bool(bfcl_format(decoded))
    well_formed = generation.stop is not None and (decodes_as_calls or not stripped.startswith("["))
    return _verdict(turn, decoded, why, text, well_formed, generation.stop, "prompt")


def _score_json(turn: BfclTurn, generation, tokenizer) -> Scored:
    text = _plain_text(generation)
    if getattr(generation, "error", ""):
        decoded, why, malformed = None, generation.error, True
    else:
        decoded, why, malformed = prompts.decode_json(text)
    return _verdict(turn, decoded, why, text, generation.stop is not None and not malformed, generation.stop, "json")


def bfcl_format(decoded: Any) -> bool:
    return checker.bfcl().utils.is_function_calling_format_output(decoded)


def _score_beam(turn: BfclTurn, generation, tokenizer) -> Scored:
    from beam_sft.eval.metrics import is_well_formed
    from beam_sft.eval.run import _parse, raw_text

    parsed, why = _parse(tokenizer, turn, generation)  # the held-out eval's parse: served, refused or offline
    names = {t["function"]["name"] for t in turn.tools or []}
    ok, _ = is_well_formed(parsed, generation.stop is not None, names, raw_text(generation))
    decoded, decode_why = prompts.decode_beam(parsed)
    text = generation.text if getattr(generation, "parsed", None) is None else json.dumps(parsed, ensure_ascii=False)
    return _verdict(turn, decoded, why or decode_why, text, ok, generation.stop, "beam")


def _verdict(turn: BfclTurn, decoded, why: str, text: str, well_formed: bool, stop, style: str) -> Scored:
    verdict = checker.check(turn.entry, decoded, why, raw=text, style=style)
    calls = [{"name": name, "arguments": args} for call in decoded or [] if isinstance(call, dict)
             for name, args in call.items()]
    return Scored(turn.entry.id, turn.entry.category, _jsonable(calls), text, bool(well_formed), verdict["valid"],
                  why if decoded is None else "", verdict.get("error_type", ""), verdict.get("error", []), stop, style)


def _jsonable(value: Any) -> Any:
    """BFCL's prompting decoder can return tuples or other Python values; the outputs file holds JSON."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=repr))


SCORERS = {"beam": _score_beam, "prompt": _score_prompt, "json": _score_json}


def evaluate_bfcl(backend, tokenizer, categories: Sequence[str], *, style: str = "beam",
                  max_records: int | None = None, seed: int = 0, chunk_size: int = 64, progress: bool = True,
                  on_result=None) -> BfclResult:
    """Generate and score `max_records` entries (seeded, the same every run) of each category."""
    from tqdm.auto import tqdm

    if style not in prompts.STYLES:
        raise UsageError(f"--bfcl-style must be one of {', '.join(prompts.STYLES)}, not {style!r}")
    if style == "beam" and getattr(tokenizer, "response_template", None) is None:
        raise UsageError("the tokenizer has no Beam response template: a model that does not speak Beam is scored "
                         "with --bfcl-style prompt (BFCL's own prompt and decoder) or json (a JSON call list in "
                         "<tool_call> tags)")
    entries = [e for c in categories for e in checker.load_entries(c, max_records, seed)]
    result = BfclResult(backend=getattr(backend, "name", type(backend).__name__), style=style)
    score = SCORERS[style]
    with tqdm(total=len(entries), desc="BFCL", unit="entry", disable=not progress) as bar:
        for start in range(0, len(entries), chunk_size):
            turns = sorted((make_turn(tokenizer, e, style) for e in entries[start:start + chunk_size]),
                           key=lambda t: len(t.prompt))
            began = time.perf_counter()
            generations = (backend.generate_turns(turns) if hasattr(backend, "generate_turns")
                           else backend.generate([t.prompt for t in turns]))
            result.generation_seconds += time.perf_counter() - began
            for turn, generation in zip(turns, generations, strict=True):
                result.generation_tokens += generation.n_tokens
                scored = score(turn, generation, tokenizer)
                result.add(scored)
                if on_result is not None:
                    on_result(scored)
                bar.update(1)
    return result


def read_outputs(path: str) -> Iterable[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UsageError(f"{path}:{k}: not a JSON line: {err}") from err
                if not isinstance(row, dict) or not {"id", "category", "calls"} <= row.keys():
                    raise UsageError(f"{path}:{k}: not a `beam-sft eval --outputs` line (needs id, category, calls)")
                yield row


def rescore(path: str) -> BfclResult:
    """BFCL's checker run again on an outputs file: the same figures as the run that wrote it."""
    rows = list(read_outputs(path))
    by_id: dict[str, checker.Entry] = {}
    for category in dict.fromkeys(r["category"] for r in rows):
        if category not in checker.CATEGORIES:
            raise UsageError(f"{path}: unknown BFCL category {category!r}")
        by_id.update((e.id, e) for e in checker.load_entries(category))
    result = BfclResult(backend="rescore", style=rows[0].get("style", "beam") if rows else "beam")
    for row in rows:
        entry = by_id.get(row["id"])
        if entry is None:
            raise UsageError(f"{path}: no BFCL entry {row['id']!r} in {row['category']}")
        decode_error = row.get("decode_error") or ""
        decoded = None if decode_error else [{c["name"]: c["arguments"]} for c in row["calls"]]
        verdict = checker.check(entry, decoded, decode_error, raw=row.get("text", ""), style=row.get("style", "beam"))
        result.add(Scored(row["id"], row["category"], row["calls"], row.get("text", ""), bool(row.get("well_formed")),
                          verdict["valid"], decode_error, verdict.get("error_type", ""), verdict.get("error", []),
                          row.get("stop"), result.style))
    return result


def summary_table(result: BfclResult) -> str:
    """The stderr table: one row per category, then BFCL's summary columns."""
    s = result.summary()
    rows = [("category", "n", "accuracy", "well_formed", "called")]
    rows += [(c, str(v["n"]), f"{v['accuracy']:.3f}", f"{v['well_formed']:.3f}", f"{v['called']:.3f}")
             for c, v in s["bfcl"].items()]
    rows += [(f"[{k}]", "", "n/a" if v is None else f"{v:.3f}", "", "") for k, v in s["bfcl_summary"].items()]
    rows += [(f"[called, {k.replace('_', ' ')}]", str(v["n"]), "", "", str(v["called"]))
             for k, v in s["called"].items() if v["n"]]
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    head = f"BFCL v4, {s['entries']} entries, style {result.style} ({result.backend})"
    return "\n".join([head, *("  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in
                                        enumerate(zip(r, widths, strict=True))) for r in rows)])


def report_html(result: BfclResult, *, title: str = "beam-sft eval --bfcl") -> str:
    """A self-contained page: the per-category table with BFCL's error types, then each kept failure."""
    import html

    from beam_sft.report.pages import html_document

    s = result.summary()
    rows = "".join(f"<tr><td>{html.escape(c)}</td><td>{v['n']}</td><td>{v['accuracy']:.3f}</td>"
                   f"<td>{v['well_formed']:.3f}</td><td>{v['called']:.3f}</td>"
                   f"<td>{html.escape(json.dumps(v['error_types']))}</td></tr>"
                   for c, v in s["bfcl"].items())
    cols = "".join(f"<tr><td>{k}</td><td>{'n/a' if v is None else f'{v:.3f}'}</td></tr>"
                   for k, v in s["bfcl_summary"].items())
    parts = [f"<p>{html.escape(summary_table(result).splitlines()[0])}</p>",
             ("<table><tr><th>category</th><th>n</th><th>accuracy</th><th>well_formed</th><th>called</th>"
              f"<th>BFCL error types</th></tr>{rows}</table>"), f"<h2>BFCL summary</h2><table>{cols}</table>",
             f"<h2>Failures ({len(result.failures)} shown)</h2>"]
    for f in result.failures:
        parts.append(f"<h2>{html.escape(f.id)}: {html.escape(f.error_type)}</h2>"
                     f'<p class="warn">{html.escape("; ".join(f.error) or f.decode_error)}</p>'
                     f'<div class="msg"><span class="who">generation</span>{html.escape(f.text)}</div>'
                     f'<div class="msg"><span class="who">calls</span>{html.escape(json.dumps(f.calls))}</div>')
    return html_document(title, "\n".join(parts))
