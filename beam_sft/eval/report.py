"""An evaluation for people: the summary table (stderr) and the HTML page of failing turns."""

from __future__ import annotations

import html
import json
import re
from typing import Any

from beam_sft.eval.metrics import METRICS, EvalResult, Tally, _by_effort
from beam_sft.records.messages import HARMONY_MARKERS

PROMPT_TAIL_CHARS = 800


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
    from beam_sft.report.pages import html_document

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
