"""See what will be trained: token-by-token mask views and dataset statistics.

Everything here goes through `beam_sft.render.encoder` (the encoder training uses), so what you see is what
trains. Three views of one record:

* `ansi_view`: the terminal, every token coloured trained (green background) or not (grey), Harmony
  markers in bold magenta, one line per rendered message;
* `plain_view`: the same without colours, for pipes and logs: trained text between `{+` and `+}`,
  markers as they are, one line per rendered message;
* `html_page`: a self-contained HTML page (inline CSS, no scripts) with the same colours, a per-role
  table for each record, and optionally the dataset table.

`dataset_stats` covers a whole dataset: trained fraction, lengths (and a histogram), records with an
empty mask, records cut by `max_length` (and whether the cut fell inside an assistant turn), records
whose stop tokens (`<|return|>`, `<|call|>`) are not trained.

    from beam_sft.report.views import load_records, inspect_record, ansi_view, dataset_stats, stats_table
    loaded = load_records("data/samples/openai.jsonl")
    print(ansi_view(inspect_record(tokenizer, loaded.records[0])))
    print(stats_table(dataset_stats(tokenizer, loaded.records, max_length=512)))
"""

from __future__ import annotations

import dataclasses
import html
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from beam_sft.errors import Reason, RecordError, internal_error
from beam_sft.render.encoder import MaskedEncoder

STOP_MARKERS = ("<|return|>", "<|call|>")
START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"

# ANSI: trained tokens alternate two green backgrounds so token boundaries show; untrained tokens
# alternate two greys; markers are bold magenta on either.
_ANSI_TRAINED = ("\x1b[30;42m", "\x1b[30;102m")
_ANSI_UNTRAINED = ("\x1b[37m", "\x1b[90m")
_ANSI_MARKER = "\x1b[1;35m"
_ANSI_RESET = "\x1b[0m"
# HTML colours (also what the screenshot test looks for).
HTML_TRAINED = "#9be9a8"
HTML_TRAINED_ALT = "#7ddc8d"
HTML_UNTRAINED = "#e4e4e4"
HTML_UNTRAINED_ALT = "#d2d2d2"
HTML_MARKER = "#8a2be2"


# -------------------------------------------------------------------------------------------------
# Loading


@dataclass
class Loaded:
    """Beam records of a dataset, where each came from, and what was rejected (nothing is lost)."""

    records: list[dict]
    positions: list[int]  # index of each record among all input records (0-based, input order)
    sources: list[str]
    rejects: list[dict]  # RecordError.to_dict() + "index"
    total: int

    def index_of(self, position: int) -> int | None:
        try:
            return self.positions.index(position)
        except ValueError:
            return None


def load_records(
    path: str, *, format: str = "auto", limit: int | None = None, split: str = "train",
    missing_reasoning: str = "mask",
) -> Loaded:
    """Read a dataset (JSONL/JSON/Parquet/`save_to_disk` dir/...) and convert every record to Beam.

    `format` is a converter name or "auto" (detect per record); "beam" takes records as they are.
    Records the converters or the validator reject are listed in `rejects` with their reason.
    `missing_reasoning`: the validator's policy (default `mask`, as training: turns without reasoning show as
    context, and records left with nothing to train are rejects).
    """
    from beam_sft.records.files import expand_inputs, iter_items, parse_line

    records, positions, sources, rejects = [], [], [], []
    total = 0
    for position, item in enumerate(iter_items(expand_inputs([str(path)], split=split), limit=limit)):
        total += 1
        try:
            if item.error is not None:
                raise item.error
            payload = parse_line(item.payload) if item.raw else item.payload
            record = _to_beam(payload, format, missing_reasoning)
        except RecordError as err:
            reject = err.with_provenance(item.source, item.position).to_dict()
            reject["index"] = position
            rejects.append(reject)
            continue
        except Exception as exc:  # a converter bug costs this record, not the whole view
            if os.environ.get("BEAM_SFT_DEBUG"):
                raise
            reject = internal_error(exc).with_provenance(item.source, item.position).to_dict()
            reject["index"] = position
            rejects.append(reject)
            continue
        records.append(record)
        positions.append(position)
        sources.append(f"{item.source}:{item.position}")
    return Loaded(records, positions, sources, rejects, total)


def _to_beam(payload: Any, format: str, missing_reasoning: str = "mask") -> dict:
    if format == "beam":
        if not isinstance(payload, dict) or "messages" not in payload:
            from beam_sft.errors import Reason

            raise RecordError(Reason.NOT_AN_OBJECT, "not a Beam record (an object with 'messages')")
        return payload
    from beam_sft.formats import convert_record
    from beam_sft.validate.rules import Options

    return convert_record(payload, format, Options(missing_reasoning=missing_reasoning))


# -------------------------------------------------------------------------------------------------
# One record


@dataclass
class Token:
    text: str  # the characters this token stands for in the rendered text (gaps go to the next token)
    token_id: int
    trained: bool
    marker: bool
    message: int  # index of the rendered message (one per <|start|>)


@dataclass
class Message:
    header: str  # e.g. "assistant to=get_weather<|channel|>analysis <|constrain|>xml"
    role: str  # system, developer, user, assistant, tool
    group: (
        str  # role, with the assistant's channel: "assistant:analysis", "assistant:final", "assistant:call"
    )
    tokens: int = 0
    trained: int = 0


@dataclass
class RecordView:
    tokens: list[Token]
    messages: list[Message]
    length: int  # tokens before truncation
    max_length: int | None
    trained: int
    truncated: bool
    cut_inside_assistant: bool
    stop_tokens: int  # stop tokens in the (truncated) sequence
    stop_tokens_untrained: int
    label: str = ""

    @property
    def group_counts(self) -> dict[str, tuple[int, int]]:
        """role group -> (trained tokens, all tokens)."""
        out: dict[str, list[int]] = {}
        for message in self.messages:
            entry = out.setdefault(message.group, [0, 0])
            entry[0] += message.trained
            entry[1] += message.tokens
        return {key: (a, b) for key, (a, b) in out.items()}


def _marker_ids(tokenizer) -> dict[int, str]:
    ids = {}
    for token in tokenizer.get_added_vocab():
        ids[tokenizer.convert_tokens_to_ids(token)] = token
    return ids


def _stop_ids(tokenizer) -> set[int]:
    vocab = tokenizer.get_vocab()
    ids = {vocab[m] for m in STOP_MARKERS if m in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _group(header: str) -> tuple[str, str]:
    speaker, _, rest = header.partition(CHANNEL)
    speaker = speaker.strip()
    channel = re.match(r"\s*(\w+)", rest)
    if speaker == "assistant" or speaker.startswith("assistant "):
        if " to=" in f" {speaker}":
            return "assistant", "assistant:call"
        return "assistant", f"assistant:{channel.group(1)}" if channel else "assistant"
    if speaker.endswith(" to=assistant"):
        return "tool", "tool"
    role = speaker.split(" ")[0] if speaker else "?"
    return role, role


def _messages_of(
    ids: Sequence[int], mask: Sequence[int], markers: dict[int, str], decode
) -> tuple[list[int], list[Message]]:
    """Which rendered message each token belongs to, and the messages with their headers and counts."""
    start_id = next((i for i, m in markers.items() if m == START), None)
    message_id = next((i for i, m in markers.items() if m == MESSAGE), None)
    owner: list[int] = []
    messages: list[Message] = []
    header_ids: list[int] | None = None
    for token_id, bit in zip(ids, mask, strict=True):
        if token_id == start_id:
            if header_ids is not None:
                messages[-1].header = decode(header_ids)
            messages.append(Message(header="", role="?", group="?"))
            header_ids = []
        elif token_id == message_id and header_ids is not None:
            messages[-1].header = decode(header_ids)
            header_ids = None
        elif header_ids is not None:
            header_ids.append(token_id)
        if not messages:  # text before the first <|start|> (a truncated head, or another template)
            messages.append(Message(header="", role="(before first message)", group="(before first message)"))
        owner.append(len(messages) - 1)
        messages[-1].tokens += 1
        messages[-1].trained += 1 if bit else 0
    if header_ids is not None and messages:
        messages[-1].header = decode(header_ids)
    for message in messages:
        if message.group == "?":
            message.role, message.group = _group(message.header) if message.header else ("?", "(header cut)")
    return owner, messages


def _token_texts(tokenizer, text: str, ids: Sequence[int]) -> list[str] | None:
    """The characters of `text` each token covers, or None if the tokenization does not line up."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        return None
    if backend.truncation is not None or backend.padding is not None:
        # transformers leaves the last call's truncation/padding on the shared backend: use a clean copy.
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(backend.to_str())
        backend.no_truncation()
        backend.no_padding()
    encoding = backend.encode(text, add_special_tokens=False)
    if encoding.ids != list(ids):
        return None
    out = []
    done = 0
    for _, end in encoding.offsets:
        end = max(end, done)
        out.append(text[done:end])
        done = end
    if out:
        out[-1] += text[done:]
    return out


def inspect_record(
    tokenizer,
    record: dict,
    *,
    max_length: int | None = None,
    encoder: MaskedEncoder | None = None,
    label: str = "",
) -> RecordView:
    """Encode one record the way training does and annotate every token. Raises `RecordError`."""
    encoder = encoder or MaskedEncoder(tokenizer)
    full = encoder.encode([record])[0]
    text, _ = encoder.render(record)
    texts = _token_texts(tokenizer, text, full["input_ids"])
    if texts is None:  # a tokenizer without offsets: per-token decoding (multi-byte characters may split)
        texts = [tokenizer.decode([i]) for i in full["input_ids"]]
    kept = encoder.encode([record], max_length)[0] if max_length is not None else full
    return _view(tokenizer, full, kept, texts, max_length, label)


def _kept_range(n: int, kept: int, side: str) -> range:
    return range(n - kept, n) if side == "left" else range(kept)


def _view(tokenizer, full, kept, texts, max_length, label) -> RecordView:
    ids, mask = kept["input_ids"], kept["assistant_masks"]
    n = len(full["input_ids"])
    side = tokenizer.truncation_side
    keep = _kept_range(n, len(ids), side)
    texts = [texts[i] for i in keep]
    markers = _marker_ids(tokenizer)
    owner, messages = _messages_of(ids, mask, markers, lambda h: tokenizer.decode(h))
    tokens = [
        Token(text=t, token_id=i, trained=bool(m), marker=i in markers, message=o)
        for t, i, m, o in zip(texts, ids, mask, owner, strict=True)
    ]
    stops = _stop_ids(tokenizer)
    truncated, inside = _cut(full["assistant_masks"], len(ids), side)
    return RecordView(
        tokens=tokens,
        messages=messages,
        length=n,
        max_length=max_length,
        trained=sum(mask),
        truncated=truncated,
        cut_inside_assistant=inside,
        stop_tokens=sum(1 for i in ids if i in stops),
        stop_tokens_untrained=sum(1 for i, m in zip(ids, mask, strict=True) if i in stops and not m),
        label=label,
    )


def _cut(full_mask: Sequence[int], kept: int, side: str) -> tuple[bool, bool]:
    """(truncated, the cut splits an assistant turn: trained tokens on both sides of it)."""
    n = len(full_mask)
    if kept >= n:
        return False, False
    cut = n - kept if side == "left" else kept
    return True, bool(full_mask[cut - 1] and full_mask[cut])


# -------------------------------------------------------------------------------------------------
# Views


def _summary_line(view: RecordView) -> str:
    parts = [f"{view.length} tokens", f"{view.trained} trained"]
    if view.truncated:
        parts.append(
            f"truncated to {view.max_length}"
            + (" inside an assistant turn" if view.cut_inside_assistant else "")
        )
    if view.stop_tokens_untrained:
        parts.append(f"{view.stop_tokens_untrained} stop token(s) not trained")
    if not view.trained:
        parts.append("EMPTY MASK: nothing trains")
    return (f"{view.label}: " if view.label else "") + ", ".join(parts)


def _group_line(view: RecordView) -> str:
    return "trained/total by role: " + ", ".join(
        f"{group} {trained}/{total}" for group, (trained, total) in view.group_counts.items()
    )


def ansi_view(view: RecordView) -> str:
    """Colours for a terminal: trained on green, untrained grey, markers bold magenta, a line per message."""
    legend = (
        f"legend: {_ANSI_TRAINED[0]} trained {_ANSI_RESET} {_ANSI_UNTRAINED[0]}not trained{_ANSI_RESET} "
        f"{_ANSI_MARKER}<|marker|>{_ANSI_RESET}"
    )
    out = [f"\x1b[1m{_summary_line(view)}{_ANSI_RESET}", _group_line(view), legend]
    line: list[str] = []
    current = None
    for k, token in enumerate(view.tokens):
        if token.message != current and line:
            out.append("".join(line) + _ANSI_RESET)
            line = []
        if token.message != current:
            line.append(f"\x1b[2m[{token.message}]{_ANSI_RESET} ")
            current = token.message
        colour = (_ANSI_TRAINED if token.trained else _ANSI_UNTRAINED)[k % 2]
        if token.marker:
            colour += _ANSI_MARKER
        line.append(f"{colour}{_visible(token.text)}{_ANSI_RESET}")
    if line:
        out.append("".join(line) + _ANSI_RESET)
    return "\n".join(out)


def plain_view(view: RecordView) -> str:
    """No colours: trained text between `{+` and `+}`, markers as they are, a line per rendered message."""
    out = [_summary_line(view), _group_line(view), "legend: {+trained+} not trained"]
    line: list[str] = []
    current = None
    in_trained = False
    for token in view.tokens:
        if token.message != current:
            if in_trained:
                line.append("+}")
                in_trained = False
            if line:
                out.append("".join(line))
            line = [f"[{token.message}] "]
            current = token.message
        if token.trained and not in_trained:
            line.append("{+")
            in_trained = True
        elif not token.trained and in_trained:
            line.append("+}")
            in_trained = False
        line.append(_visible(token.text))
    if in_trained:
        line.append("+}")
    if line:
        out.append("".join(line))
    return "\n".join(out)


def _visible(text: str) -> str:
    # One rendered message per line: line breaks inside text are shown, not obeyed.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


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


def _html_tokens(view: RecordView) -> str:
    parts: list[str] = []
    current = None
    for k, token in enumerate(view.tokens):
        if token.message != current:
            if current is not None:
                parts.append("</div>")
            message = view.messages[token.message]
            parts.append(
                f'<div class="msg"><span class="who">[{token.message}] {html.escape(message.group)}</span>'
            )
            current = token.message
        cls = ("t" if token.trained else "u") + str(k % 2) + (" mk" if token.marker else "")
        text = html.escape(token.text).replace("\n", '<span class="nl">\u21b5</span>\n')
        title = f"id {token.token_id}, {'trained' if token.trained else 'not trained'}"
        parts.append(f'<span class="tok {cls}" title="{title}">{text}</span>')
    if current is not None:
        parts.append("</div>")
    return "".join(parts)


def html_record(view: RecordView) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(g)}</td><td>{a}</td><td>{b}</td></tr>"
        for g, (a, b) in view.group_counts.items()
    )
    warn = (
        ' class="warn"' if not view.trained or view.stop_tokens_untrained or view.cut_inside_assistant else ""
    )
    summary = _summary_line(dataclasses.replace(view, label=""))
    return (
        f"<h2>{html.escape(view.label or 'record')}</h2><p{warn}>{html.escape(summary)}</p>"
        f"<table><tr><th>role</th><th>trained</th><th>tokens</th></tr>{rows}</table>{_html_tokens(view)}"
    )


_LEGEND = (
    '<p class="legend"><span class="tok t0">trained</span> <span class="tok u0">not trained</span> '
    '<span class="tok u0 mk">&lt;|marker|&gt;</span> &nbsp; one box per rendered message; '
    "alternating shades show token boundaries; hover a token for its id.</p>"
)


def html_fragment(views: Sequence[RecordView], *, stats: DatasetStats | None = None) -> str:
    """The views as an HTML fragment with its own (scoped) styles, e.g. for a notebook."""
    body = [f"<style>{_CSS}</style>", '<div class="bi">', _LEGEND]
    if stats is not None:
        body.append(stats_html(stats))
    body.extend(html_record(v) for v in views)
    body.append("</div>")
    return "\n".join(body)


def html_page(
    views: Sequence[RecordView], *, title: str = "beam-sft inspect", stats: DatasetStats | None = None
) -> str:
    """A self-contained page: inline CSS, no scripts, no external resources."""
    return _page(title, html_fragment(views, stats=stats))


def _page(title: str, fragment: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_PAGE_CSS}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n{fragment}\n</body></html>\n"
    )


def html_document(title: str, body: str) -> str:
    """A self-contained page in this module's style around `body` (HTML that may use the .msg, .who, .tok,
    .mk, .warn classes and tables), e.g. the `beam-sft eval --report` page."""
    return _page(title, f'<style>{_CSS}</style>\n<div class="bi">\n{body}\n</div>')


# -------------------------------------------------------------------------------------------------
# Dataset statistics


@dataclass
class DatasetStats:
    records: int = 0
    rejected: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    max_length: int | None = None
    tokens: int = 0  # after truncation
    trained: int = 0
    lengths: list[int] = field(default_factory=list)  # before truncation
    groups: dict[str, list[int]] = field(default_factory=dict)  # group -> [trained, tokens]
    empty_mask: list[int] = field(default_factory=list)  # record indices
    truncated: list[int] = field(default_factory=list)
    cut_inside_assistant: list[int] = field(default_factory=list)
    stop_untrained: list[int] = field(default_factory=list)
    internal_errors: list[int] = field(default_factory=list)  # records whose encoding raised unexpectedly
    labels: list[str] = field(default_factory=list)

    @property
    def trained_fraction(self) -> float:
        return self.trained / self.tokens if self.tokens else 0.0

    def histogram(self, bins: int = 10) -> list[tuple[int, int, int]]:
        """[(low, high, count)] of the untruncated lengths, equal-width bins."""
        if not self.lengths:
            return []
        low, high = min(self.lengths), max(self.lengths)
        width = max(1, math.ceil((high - low + 1) / bins))
        counts = Counter((n - low) // width for n in self.lengths)
        return [
            (low + b * width, low + (b + 1) * width - 1, counts.get(b, 0))
            for b in range(bins)
            if low + b * width <= high
        ]


def dataset_stats(
    tokenizer,
    records: Sequence[dict],
    *,
    max_length: int | None = None,
    encoder: MaskedEncoder | None = None,
    labels: Sequence[str] | Callable[[int], str] | None = None,
    rejected: Sequence[dict] = (),
    batch_size: int = 256,
) -> DatasetStats:
    """Statistics over `records` (Beam records), encoded by the training encoder in batches.

    `records` is any sequence that can be sliced, e.g. `beam_sft.dataset.phase.Converted`, which decodes each batch
    from memory-mapped Arrow only when it is encoded.

    A record the template rejects counts as rejected (its reason is kept), never silently dropped.
    """
    from tqdm import tqdm

    encoder = encoder or MaskedEncoder(tokenizer)
    stats = DatasetStats(max_length=max_length)
    stats.rejected = len(rejected)
    stats.rejected_reasons.update(r.get("reason", "?") for r in rejected)
    markers = _marker_ids(tokenizer)
    stops = _stop_ids(tokenizer)
    side = tokenizer.truncation_side
    # A callable or a sequence: for a large dataset the caller names records lazily.
    if labels is None:
        def label_of(i: int) -> str:
            return f"record {i}"
    else:
        label_of = labels if callable(labels) else labels.__getitem__
    decode_cache: dict[tuple[int, ...], str] = {}

    def decode(header_ids):
        key = tuple(header_ids)
        if key not in decode_cache:
            decode_cache[key] = tokenizer.decode(header_ids)
        return decode_cache[key]

    for start in tqdm(
        range(0, len(records), batch_size), desc="Encoding", unit="batch", disable=len(records) < 2000
    ):
        batch = list(records[start : start + batch_size])
        try:
            encoded = encoder.encode(batch)
        except Exception as batch_err:  # unexpected errors are isolated record by record too
            if os.environ.get("BEAM_SFT_DEBUG") and not isinstance(batch_err, RecordError):
                raise
            encoded = []
            for record in batch:  # find the culprits one by one; the rest still count
                try:
                    encoded.append(encoder.encode([record])[0])
                except RecordError as err:
                    encoded.append(err)
                except Exception as exc:  # noqa: BLE001 - an encoder bug costs this record only
                    encoded.append(internal_error(exc))
        for offset, full in enumerate(encoded):
            index = start + offset
            if isinstance(full, RecordError):
                stats.rejected += 1
                stats.rejected_reasons[full.code.value] += 1
                if full.code is Reason.INTERNAL_ERROR:
                    stats.internal_errors.append(index)
                continue
            stats.records += 1
            stats.labels.append(label_of(index))
            n = len(full["input_ids"])
            stats.lengths.append(n)
            kept = encoder._truncate(full, max_length) if max_length is not None else full
            ids, mask = kept["input_ids"], kept["assistant_masks"]
            stats.tokens += len(ids)
            stats.trained += sum(mask)
            _, messages = _messages_of(ids, mask, markers, decode)
            for message in messages:
                entry = stats.groups.setdefault(message.group, [0, 0])
                entry[0] += message.trained
                entry[1] += message.tokens
            if not any(mask):
                stats.empty_mask.append(index)
            truncated, inside = _cut(full["assistant_masks"], len(ids), side)
            if truncated:
                stats.truncated.append(index)
                if inside:
                    stats.cut_inside_assistant.append(index)
            if any(i in stops and not m for i, m in zip(ids, mask, strict=True)):
                stats.stop_untrained.append(index)
    return stats


def _indices(values: list[int], limit: int = 12) -> str:
    if not values:
        return "none"
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def stats_rows(stats: DatasetStats) -> list[tuple[str, str]]:
    rows = [
        ("records", str(stats.records)),
        (
            "rejected",
            f"{stats.rejected}"
            + (
                f" ({', '.join(f'{k}: {v}' for k, v in stats.rejected_reasons.most_common())})"
                if stats.rejected
                else ""
            ),
        ),
        ("tokens (after truncation)", str(stats.tokens)),
        ("trained tokens", f"{stats.trained} ({100 * stats.trained_fraction:.1f}%)"),
    ]
    if stats.lengths:
        lengths = sorted(stats.lengths)
        rows.append(
            ("length min / median / max", f"{lengths[0]} / {lengths[len(lengths) // 2]} / {lengths[-1]}")
        )
    rows.append(("max_length", str(stats.max_length) if stats.max_length is not None else "none"))
    for group, (trained, total) in sorted(stats.groups.items()):
        rows.append((f"  {group}: trained / tokens", f"{trained} / {total}"))
    rows += [
        ("empty mask (nothing trains)", f"{len(stats.empty_mask)}: {_indices(stats.empty_mask)}"),
        ("truncated by max_length", f"{len(stats.truncated)}: {_indices(stats.truncated)}"),
        (
            "  cut inside an assistant turn",
            f"{len(stats.cut_inside_assistant)}: {_indices(stats.cut_inside_assistant)}",
        ),
        ("stop tokens outside the mask", f"{len(stats.stop_untrained)}: {_indices(stats.stop_untrained)}"),
    ]
    return rows


def stats_table(stats: DatasetStats, *, histogram: bool = True) -> str:
    rows = stats_rows(stats)
    width = max(len(k) for k, _ in rows)
    out = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if histogram and stats.lengths:
        out.append("length histogram (tokens before truncation):")
        hist = stats.histogram()
        top = max(c for _, _, c in hist) or 1
        for low, high, count in hist:
            out.append(
                f"  {low:>7}-{high:<7} {count:>6} {'#' * math.ceil(40 * count / top) if count else ''}"
            )
    return "\n".join(out)


def stats_html(stats: DatasetStats) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in stats_rows(stats)
    )
    return f"<h2>Dataset</h2><table>{rows}</table>"


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (`beam_sft.records.files.atomic_output`: umask permissions, no partial file)."""
    from beam_sft.records.files import write_bytes_atomic

    write_bytes_atomic(path, text.encode("utf-8"))
