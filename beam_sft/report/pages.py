"""Self-contained HTML pages (inline CSS, no scripts): record views, the dataset table, other pages' frame."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from itertools import groupby

from beam_sft.report.masks import RecordView, summary_line
from beam_sft.report.stats import DatasetStats, stats_rows

# HTML colours (also what the screenshot test looks for).
HTML_TRAINED = "#9be9a8"
HTML_TRAINED_ALT = "#7ddc8d"
HTML_UNTRAINED = "#e4e4e4"
HTML_UNTRAINED_ALT = "#d2d2d2"
HTML_MARKER = "#8a2be2"

_PAGE_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #1f2328;
       background: #ffffff; }
h1 { font-size: 20px; }
"""
# Everything else is scoped to the .bi container, so the fragment can sit inside a notebook page.
_CSS = f"""
.bi h2 {{ font-size: 16px; margin-top: 28px; }}
.bi .legend span, .bi .tok {{ font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; font-size: 13px; }}
.bi .msg {{ border-left: 4px solid #57606a; margin: 6px 0; padding: 2px 0 2px 8px; white-space: pre-wrap;
        word-break: break-all; line-height: 1.7; text-align: left; }}
.bi .msg .who {{ display: inline-block; min-width: 150px; font-size: 11px; color: #57606a;
             font-family: Helvetica, Arial, sans-serif; }}
.bi .t0 {{ background: {HTML_TRAINED}; }} .bi .t1 {{ background: {HTML_TRAINED_ALT}; }}
.bi .u0 {{ background: {HTML_UNTRAINED}; }} .bi .u1 {{ background: {HTML_UNTRAINED_ALT}; }}
.bi .mk {{ color: {HTML_MARKER}; font-weight: bold; outline: 1px solid {HTML_MARKER}; }}
.bi .nl {{ color: #8c959f; }}
.bi table {{ border-collapse: collapse; margin: 8px 0; font-size: 13px; }}
.bi td, .bi th {{ border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; }}
.bi .warn {{ color: #cf222e; font-weight: bold; }}
"""


def html_record(view: RecordView) -> str:
    rows = "".join(f"<tr><td>{html.escape(g)}</td><td>{a}</td><td>{b}</td></tr>"
                   for g, (a, b) in view.group_counts.items())
    warn = ' class="warn"' if not view.trained or view.stop_tokens_untrained or view.cut_inside_assistant else ""
    summary = summary_line(dataclasses.replace(view, label=""))
    parts = [(f"<h2>{html.escape(view.label or 'record')}</h2><p{warn}>{html.escape(summary)}</p>"
              f"<table><tr><th>role</th><th>trained</th><th>tokens</th></tr>{rows}</table>")]
    for message, tokens in groupby(enumerate(view.tokens), key=lambda kt: kt[1].message):
        parts.append(f'<div class="msg"><span class="who">[{message}] {html.escape(view.messages[message].group)}</span>')
        for k, token in tokens:
            cls = ("t" if token.trained else "u") + str(k % 2) + (" mk" if token.marker else "")
            text = html.escape(token.text).replace("\n", '<span class="nl">\u21b5</span>\n')
            title = f"id {token.token_id}, {'trained' if token.trained else 'not trained'}"
            parts.append(f'<span class="tok {cls}" title="{title}">{text}</span>')
        parts.append("</div>")
    return "".join(parts)


_LEGEND = (
    '<p class="legend"><span class="tok t0">trained</span> <span class="tok u0">not trained</span> '
    '<span class="tok u0 mk">&lt;|marker|&gt;</span> &nbsp; one box per rendered message; '
    "alternating shades show token boundaries; hover a token for its id.</p>"
)


def html_fragment(views: Sequence[RecordView], *, stats: DatasetStats | None = None) -> str:
    """The views as an HTML fragment with its own (scoped) styles, e.g. for a notebook."""
    parts = [_LEGEND]
    if stats is not None:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
                       for k, v in stats_rows(stats))
        parts.append(f"<h2>Dataset</h2><table>{rows}</table>")
    parts += map(html_record, views)
    return f'<style>{_CSS}</style>\n<div class="bi">\n' + "\n".join(parts) + "\n</div>"


def html_page(views: Sequence[RecordView], *, title: str = "beam-sft inspect", stats: DatasetStats | None = None) -> str:
    """A self-contained page: inline CSS, no scripts, no external resources."""
    return _page(title, html_fragment(views, stats=stats))


def _page(title: str, fragment: str) -> str:
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_PAGE_CSS}</style></head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n{fragment}\n</body></html>\n")


def html_document(title: str, body: str) -> str:
    """A self-contained page in this module's style around `body` (e.g. the `beam-sft eval --report` page)."""
    return _page(title, f'<style>{_CSS}</style>\n<div class="bi">\n{body}\n</div>')

