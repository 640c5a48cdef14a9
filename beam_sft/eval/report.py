"""An evaluation for people: the summary table (stderr) and the HTML page of failing turns."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from typing import Any

from beam_sft.errors import reject_where
from beam_sft.eval.metrics import METRICS, EvalResult, Tally, sorted_by_effort
from beam_sft.records.messages import HARMONY_MARKERS

PROMPT_TAIL_CHARS = 800


def _cell(tally: Tally | None, name: str) -> str:
    if tally is None or not tally.applicable[name]:
        return "n/a"
    return f"{100 * tally.hits[name] / tally.applicable[name]:.1f}% {tally.hits[name]}/{tally.applicable[name]}"


def _rows(title: str, groups: dict[str, Tally]) -> list[list[str]]:
    names = list(groups)
    rows = [[title, *names], ["turns", *(str(groups[n].turns) for n in names)]]
    rows += [[m, *(_cell(groups[n], m) for n in names)] for m in METRICS]
    return [*rows, ["mean analysis tokens", *(str(groups[n].mean_analysis_tokens) for n in names)]]


def text_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned lines: the first column left-aligned (a label), the others right-aligned (figures)."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def html_table(rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table whose first row is the header; every cell escaped."""
    def line(row, tag):
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in row) + "</tr>"

    return "<table>" + line(rows[0], "th") + "".join(line(r, "td") for r in rows[1:]) + "</table>"


def message_html(who: str, body: str) -> str:
    """One block of a failure: a label, then `body` (HTML)."""
    return f'<div class="msg"><span class="who">{who}</span>{body}</div>'


def summary_table(result: EvalResult) -> str:
    """The stderr table: one line of counts, then every metric overall and per source format, then per effort."""
    tps = result.tokens_per_second
    head = (f"{result.records} records ({result.rejected} rejected), {result.overall.turns} turns, "
            f"{result.generation_tokens} generated tokens, "
            f"{'n/a' if tps is None else f'{tps:.1f}'} tokens/s ({result.backend})")
    lines = [head, *text_table(_rows("metric", _overall(result)))]
    if result.by_effort:
        lines += ["", *text_table(_rows("reasoning effort", sorted_by_effort(result)))]
    return "\n".join(lines)


def _overall(result: EvalResult) -> dict[str, Tally]:
    return {"all": result.overall, **dict(sorted(result.by_format.items()))}


_MARKER_RE = re.compile("(" + "|".join(re.escape(m) for m in HARMONY_MARKERS) + ")")


def _marked(text: str) -> str:
    """HTML-escaped text with the Harmony markers styled as in `beam-sft inspect --html`."""
    return "".join(f'<span class="tok u0 mk">{html.escape(part)}</span>' if k % 2 else html.escape(part)
                   for k, part in enumerate(_MARKER_RE.split(text)))


def _json_html(value: Any) -> str:
    return _marked(json.dumps(value, ensure_ascii=False, indent=1))


def report_html(result: EvalResult, *, title: str = "beam-sft eval") -> str:
    """A self-contained page: the summary table, then every kept failing turn."""
    from beam_sft.report.pages import html_document

    tables = [f"<h2>{label}</h2>{html_table(_rows('metric', groups))}" for label, groups in (
        ("Overall and by source format", _overall(result)), ("By reasoning effort", sorted_by_effort(result)))]
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
            + message_html("prompt tail", cut + _marked(tail)) + message_html("generation", _marked(r.generation.text))
            + message_html("parse", _json_html(r.parsed)) + message_html("reference", _json_html(t.reference))
        )
    if result.rejects:
        rows = [[reject_where(r), r.get("reason"), r.get("message")] for r in result.rejects]
        parts.append(f"<h2>Rejected records: {result.rejected}</h2>{html_table([['record', 'reason', 'message'], *rows])}")
    return html_document(title, "\n".join(parts))
