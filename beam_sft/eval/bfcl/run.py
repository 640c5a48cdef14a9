"""Generate BFCL entries with any `beam-sft eval` backend, decode, score with BFCL's checker; re-score."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from beam_sft.errors import UsageError
from beam_sft.eval.backends import generate_sorted
from beam_sft.eval.bfcl import checker, prompts
from beam_sft.eval.metrics import Throughput, is_well_formed
from beam_sft.eval.report import html_table, message_html, text_table
from beam_sft.eval.run import EvalOptions

KEEP_FAILURES = 300


@dataclass
class BfclTurn:
    """One entry to generate, shaped as the backends' `Turn` (prompt, messages, tools, template kwargs)."""

    entry: checker.Entry
    prompt: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    style: str = "beam"


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
        return asdict(self)


@dataclass
class BfclResult(Throughput):
    """Counts per category, the kept failures, generation time."""

    style: str = "beam"
    counts: dict[str, Counter] = field(default_factory=dict)  # category -> n, valid, well_formed, called
    error_types: dict[str, Counter] = field(default_factory=dict)
    failures: list[Scored] = field(default_factory=list)

    def add(self, scored: Scored, keep: int = KEEP_FAILURES) -> None:
        self.counts.setdefault(scored.category, Counter()).update(  # ints: an empty Counter keeps bools as given
            n=1, valid=int(scored.valid), well_formed=int(scored.well_formed), called=int(bool(scored.calls)))
        if not scored.valid:
            self.error_types.setdefault(scored.category, Counter())[scored.error_type or "unknown"] += 1
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
                "generation_tokens": self.generation_tokens, "tokens_per_second": self.tokens_per_second}

    def called(self) -> dict[str, dict[str, int]]:
        """Entries answered with a call, by whether one is expected: accuracy hides one that never calls."""
        out = {"call_expected": Counter(called=0, n=0), "no_call_expected": Counter(called=0, n=0)}
        for cat, c in self.counts.items():
            out["no_call_expected" if checker.expects_no_call(cat) else "call_expected"].update(called=c["called"],
                                                                                                 n=c["n"])
        return {side: dict(c) for side, c in out.items()}


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
    return BfclTurn(entry, prompt, conversation, declared, kwargs, style)


def _plain_text(generation) -> str:
    """The generated text without the stop token: what BFCL's prompting decoder reads."""
    if generation.parsed is not None:
        return generation.parsed.get("content") or ""
    return generation.text.removesuffix(generation.stop or "")


def _score_text(turn: BfclTurn, generation, tokenizer) -> Scored:
    """The `prompt` and `json` styles: the text decoded by BFCL's prompting decoder or from `<tool_call>` tags."""
    text = _plain_text(generation)
    if generation.error:  # a served turn the server refused: no stop token, so not well-formed
        return _verdict(turn, generation, None, generation.error, text, False)
    if turn.style == "json":
        decoded, why, malformed = prompts.decode_json(text)
        shaped = not malformed
    else:
        decoded, why = prompts.decode_prompt(text, turn.entry.category)
        shaped = (decoded is not None and bool(checker.bfcl().utils.is_function_calling_format_output(decoded))
                  or not text.strip("`\n ").startswith("["))
    return _verdict(turn, generation, decoded, why, text, generation.stop is not None and shaped)


def _score_beam(turn: BfclTurn, generation, tokenizer) -> Scored:
    from beam_sft.eval.run import parse_generation, raw_text

    parsed, why = parse_generation(tokenizer, turn, generation)  # the held-out eval's parse: served, refused or offline
    names = {t["function"]["name"] for t in turn.tools or []}
    ok, _ = is_well_formed(parsed, generation.stop is not None, names, raw_text(generation))
    decoded, decode_why = prompts.decode_beam(parsed)
    text = generation.text if generation.parsed is None else json.dumps(parsed, ensure_ascii=False)
    return _verdict(turn, generation, decoded, why or decode_why, text, ok)


def _verdict(turn: BfclTurn, generation, decoded, why: str, text: str, well_formed: bool) -> Scored:
    verdict = checker.check(turn.entry, decoded, why, raw=text, style=turn.style)
    calls = [{"name": name, "arguments": args} for call in decoded or [] if isinstance(call, dict)
             for name, args in call.items()]
    # BFCL's prompting decoder can return tuples or other Python values; the outputs file holds JSON.
    calls = json.loads(json.dumps(calls, ensure_ascii=False, default=repr))
    return Scored(turn.entry.id, turn.entry.category, calls, text, bool(well_formed), verdict["valid"],
                  why if decoded is None else "", verdict.get("error_type", ""), verdict.get("error", []),
                  generation.stop, turn.style)


SCORERS = {"beam": _score_beam, "prompt": _score_text, "json": _score_text}


def evaluate_bfcl(backend, tokenizer, categories: Sequence[str], options: EvalOptions | None = None) -> BfclResult:
    """Generate and score `options.max_records` seeded entries of each category in `options.style`."""
    from tqdm.auto import tqdm

    opts = options or EvalOptions()
    if opts.style not in prompts.STYLES:
        raise UsageError(f"--bfcl-style must be one of {', '.join(prompts.STYLES)}, not {opts.style!r}")
    if opts.style == "beam" and getattr(tokenizer, "response_template", None) is None:
        raise UsageError("the tokenizer has no Beam response template: a model that does not speak Beam is scored "
                         "with --bfcl-style prompt (BFCL's own prompt and decoder) or json (a JSON call list in "
                         "<tool_call> tags)")
    entries = [e for c in categories for e in checker.load_entries(c, opts.max_records, opts.seed)]
    result = BfclResult(backend=getattr(backend, "name", type(backend).__name__), style=opts.style)
    score = SCORERS[opts.style]
    with tqdm(total=len(entries), desc="BFCL", unit="entry", disable=not opts.progress) as bar:
        for start in range(0, len(entries), opts.chunk_size):
            chunk = [make_turn(tokenizer, e, opts.style) for e in entries[start:start + opts.chunk_size]]
            generated, seconds = generate_sorted(backend, chunk)
            result.generation_seconds += seconds
            for turn, generation in generated:
                result.generation_tokens += generation.n_tokens
                scored = score(turn, generation, tokenizer)
                result.add(scored)
                if opts.on_result is not None:
                    opts.on_result(scored)
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
        if (entry := by_id.get(row["id"])) is None:
            raise UsageError(f"{path}: no BFCL entry {row['id']!r} in {row['category']}")
        decode_error = row.get("decode_error") or ""
        decoded = None if decode_error else [{c["name"]: c["arguments"]} for c in row["calls"]]
        verdict = checker.check(entry, decoded, decode_error, raw=row.get("text", ""), style=row.get("style", "beam"))
        result.add(Scored(row["id"], row["category"], row["calls"], row.get("text", ""), bool(row.get("well_formed")),
                          verdict["valid"], decode_error, verdict.get("error_type", ""), verdict.get("error", []),
                          row.get("stop"), result.style))
    return result


def _rows(summary: dict[str, Any]) -> list[list[str]]:
    return [["category", "n", "accuracy", "well_formed", "called"]] + [
        [c, str(v["n"]), f"{v['accuracy']:.3f}", f"{v['well_formed']:.3f}", f"{v['called']:.3f}"]
        for c, v in summary["bfcl"].items()]


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_table(result: BfclResult) -> str:
    """The stderr table: one row per category, then BFCL's summary columns."""
    s = result.summary()
    rows = _rows(s) + [[f"[{k}]", "", _fraction(v), "", ""] for k, v in s["bfcl_summary"].items()]
    rows += [[f"[called, {k.replace('_', ' ')}]", str(v["n"]), "", "", str(v["called"])]
             for k, v in s["called"].items() if v["n"]]
    head = f"BFCL v4, {s['entries']} entries, style {result.style} ({result.backend})"
    return "\n".join([head, *text_table(rows)])


def report_html(result: BfclResult, *, title: str = "beam-sft eval --bfcl") -> str:
    """A self-contained page: the per-category table with BFCL's error types, then each kept failure."""
    import html

    from beam_sft.report.pages import html_document

    s = result.summary()
    rows = [r + [json.dumps(v["error_types"])] for r, v in zip(_rows(s)[1:], s["bfcl"].values(), strict=True)]
    columns = [["column", "accuracy"], *([k, _fraction(v)] for k, v in s["bfcl_summary"].items())]
    parts = [f"<p>{html.escape(summary_table(result).splitlines()[0])}</p>",
             html_table([[*_rows(s)[0], "BFCL error types"], *rows]), f"<h2>BFCL summary</h2>{html_table(columns)}",
             f"<h2>Failures ({len(result.failures)} shown)</h2>"]
    for f in result.failures:
        parts.append(f"<h2>{html.escape(f.id)}: {html.escape(f.error_type)}</h2>"
                     f'<p class="warn">{html.escape("; ".join(f.error) or f.decode_error)}</p>'
                     + message_html("generation", html.escape(f.text))
                     + message_html("calls", html.escape(json.dumps(f.calls))))
    return html_document(title, "\n".join(parts))
