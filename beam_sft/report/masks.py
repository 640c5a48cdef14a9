"""See what will be trained, record by record: token-by-token mask views (docs/inspect.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

from beam_sft.dataset.examples import truncate
from beam_sft.errors import FatalError, where
from beam_sft.render.encoder import MaskedEncoder
from beam_sft.template.tokenizer import stop_token_ids

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"

# ANSI: trained tokens alternate two green backgrounds so token boundaries show; untrained tokens
# alternate two greys; markers are bold magenta on either.
_ANSI_TRAINED = ("\x1b[30;42m", "\x1b[30;102m")
_ANSI_UNTRAINED = ("\x1b[37m", "\x1b[90m")
_ANSI_MARKER = "\x1b[1;35m"
_ANSI_RESET = "\x1b[0m"


@dataclass
class Loaded:
    """Beam records of a dataset, where each came from, and what was rejected (nothing is lost)."""

    records: list[dict]
    positions: list[int]  # index of each record among all input records (0-based, input order)
    sources: list[str]
    rejects: list[dict]  # `beam_sft.errors.reject_entry` + "position" (among all input records, like `positions`)
    total: int

    def index_of(self, position: int) -> int | None:
        return self.positions.index(position) if position in self.positions else None


def load_records(path: str, *, format: str = "auto", limit: int | None = None, split: str = "train",
                 missing_reasoning: str = "mask", tool_call_checks: str = "reject") -> Loaded:
    """Read a dataset and convert every record to Beam as training does; rejects listed with their reason."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    options = Options(missing_reasoning=missing_reasoning, tool_call_checks=tool_call_checks)
    records, positions, sources, rejects = [], [], [], []
    for position, item in enumerate(read_items([str(path)], split, limit=limit)):
        record, _, reject = convert_item(item, format, options)
        if reject is not None:
            reject["position"] = position
            rejects.append(reject)
            continue
        records.append(record)
        positions.append(position)
        sources.append(where(item.source, item.position, item.by_line))
    return Loaded(records, positions, sources, rejects, len(records) + len(rejects))


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
    group: str  # role, with the assistant's channel: "assistant:analysis", "assistant:final", "assistant:call"
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
    dropped: bool = False  # the truncation policy drops the whole record

    @property
    def group_counts(self) -> dict[str, tuple[int, int]]:
        """role group -> (trained tokens, all tokens)."""
        out: dict[str, list[int]] = {}
        for message in self.messages:
            entry = out.setdefault(message.group, [0, 0])
            entry[0] += message.trained
            entry[1] += message.tokens
        return {key: (a, b) for key, (a, b) in out.items()}


def marker_ids(tokenizer) -> dict[int, str]:
    """id -> text of every added token (the Harmony markers, in a Beam tokenizer)."""
    return {tokenizer.convert_tokens_to_ids(token): token for token in tokenizer.get_added_vocab()}


def turn_end_ids(tokenizer) -> set[int]:
    """The tokens that end a turn: `<|return|>` and `<|call|>` where they are single tokens, and EOS."""
    try:
        ids = set(stop_token_ids(tokenizer))
    except FatalError:  # inspect shows any tokenizer, Beam's or not
        ids = set()
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


def token_messages(ids: Sequence[int], mask: Sequence[int], markers: dict[int, str],
                   decode) -> tuple[list[int], list[Message]]:
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
    out, done = [], 0
    for _, end in encoding.offsets:
        end = max(end, done)
        out.append(text[done:end])
        done = end
    if out:
        out[-1] += text[done:]
    return out


def inspect_record(tokenizer, record: dict, *, max_length: int | None = None, encoder: MaskedEncoder | None = None,
                   label: str = "", policy: str = "turn") -> RecordView:
    """Encode one record the way training does (cut by the truncation `policy`) and annotate every token."""
    encoder = encoder or MaskedEncoder(tokenizer)
    full = encoder.encode([record])[0]
    text, _ = encoder.render(record)
    texts = _token_texts(tokenizer, text, full["input_ids"])
    if texts is None:  # a tokenizer without offsets: per-token decoding (multi-byte characters may split)
        texts = [tokenizer.decode([i]) for i in full["input_ids"]]
    kept = kept_by_truncation(full, max_length, policy)
    ids, mask = kept or ([], [])
    texts = texts[: len(ids)]  # training truncation keeps the start
    markers = marker_ids(tokenizer)
    owner, messages = token_messages(ids, mask, markers, lambda h: tokenizer.decode(h))
    tokens = [Token(text=t, token_id=i, trained=bool(m), marker=i in markers, message=o)
              for t, i, m, o in zip(texts, ids, mask, owner, strict=True)]
    stops = turn_end_ids(tokenizer)
    truncated, inside = truncation_cut(full["assistant_masks"], len(ids))
    return RecordView(tokens=tokens, messages=messages, length=len(full["input_ids"]), max_length=max_length,
                      trained=sum(mask), truncated=truncated, cut_inside_assistant=inside,
                      stop_tokens=sum(1 for i in ids if i in stops),
                      stop_tokens_untrained=sum(1 for i, m in zip(ids, mask, strict=True) if i in stops and not m),
                      label=label, dropped=kept is None)


def kept_by_truncation(full: dict, max_length: int | None, policy: str) -> tuple[list, list] | None:
    """(ids, mask) that training keeps of an encoded record under the truncation `policy`; None: dropped."""
    if max_length is None:
        return full["input_ids"], full["assistant_masks"]
    result = truncate(full["input_ids"], full["assistant_masks"], max_length, policy)
    return None if result is None else result[:2]


def truncation_cut(full_mask: Sequence[int], kept: int) -> tuple[bool, bool]:
    """(truncated, the cut splits an assistant turn: trained tokens on both sides of it)."""
    if kept >= len(full_mask):
        return False, False
    return True, bool(kept and full_mask[kept - 1] and full_mask[kept])


def summary_line(view: RecordView) -> str:
    """One line on a record: its tokens, how many train, and whether truncation cut or dropped it."""
    parts = [f"{view.length} tokens", f"{view.trained} trained"]
    if view.dropped:
        parts.append(f"DROPPED: longer than {view.max_length} and the truncation policy keeps no whole turn")
    elif view.truncated:
        parts.append(f"truncated to {view.max_length}" + (" inside an assistant turn" if view.cut_inside_assistant
                                                           else ""))
    if view.stop_tokens_untrained:
        parts.append(f"{view.stop_tokens_untrained} stop token(s) not trained")
    if not view.trained and not view.dropped:
        parts.append("EMPTY MASK: nothing trains")
    return (f"{view.label}: " if view.label else "") + ", ".join(parts)


def _group_line(view: RecordView) -> str:
    return "trained/total by role: " + ", ".join(f"{group} {trained}/{total}"
                                                  for group, (trained, total) in view.group_counts.items())


def ansi_view(view: RecordView) -> str:
    """Colours for a terminal: trained on green, untrained grey, markers bold magenta, a line per message."""
    legend = (f"legend: {_ANSI_TRAINED[0]} trained {_ANSI_RESET} {_ANSI_UNTRAINED[0]}not trained{_ANSI_RESET} "
              f"{_ANSI_MARKER}<|marker|>{_ANSI_RESET}")
    out = [f"\x1b[1m{summary_line(view)}{_ANSI_RESET}", _group_line(view), legend]
    for message, tokens in groupby(enumerate(view.tokens), key=lambda kt: kt[1].message):
        line = [f"\x1b[2m[{message}]{_ANSI_RESET} "]
        for k, token in tokens:
            colour = (_ANSI_TRAINED if token.trained else _ANSI_UNTRAINED)[k % 2]
            line.append(f"{colour}{_ANSI_MARKER if token.marker else ''}{_visible(token.text)}{_ANSI_RESET}")
        out.append("".join(line) + _ANSI_RESET)
    return "\n".join(out)


def plain_view(view: RecordView) -> str:
    """No colours: trained text between `{+` and `+}`, markers as they are, a line per rendered message."""
    out = [summary_line(view), _group_line(view), "legend: {+trained+} not trained"]
    for message, tokens in groupby(view.tokens, key=attrgetter("message")):
        line = [f"[{message}] "]
        for trained, run in groupby(tokens, key=attrgetter("trained")):
            text = "".join(_visible(token.text) for token in run)
            line.append("{+" + text + "+}" if trained else text)
        out.append("".join(line))
    return "\n".join(out)


def _visible(text: str) -> str:
    # One rendered message per line: line breaks inside text are shown, not obeyed.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
