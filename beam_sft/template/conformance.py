"""The check-template suite: does a tokenizer's chat and response template follow the Beam Harmony page
(shipped in the package)? See docs/template.md#checking-a-tokenizer-beam-sft-check-template."""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from beam_sft.records.messages import STOP_MARKERS
from beam_sft.template.tokenizer import EOS_TOKEN, MARKERS, save_tokenizer

SPEC_PATH = Path(__file__).resolve().parent / "spec" / "beam-harmony-format.md"


@dataclass
class RuleResult:
    name: str
    ok: bool
    reason: str = ""
    # For page examples: expected and actual output, so a caller can show a diff.
    expected: str | None = None
    actual: str | None = None

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}" + (f": {self.reason}" if self.reason else "")

    def diff(self) -> str:
        if self.expected is None or self.actual is None or self.ok:
            return ""
        return "".join(difflib.unified_diff(self.expected.splitlines(keepends=True),
                                            self.actual.splitlines(keepends=True), fromfile="page", tofile="template"))


class RuleFailure(AssertionError):
    """Raised inside a format rule to fail it with a one-line reason."""


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise RuleFailure(reason)


def _diverge(a: str, b: str) -> int:
    """Where `a` and `b` first differ (the shorter one's length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass
class PageExample:
    """One python block of an accordion and the text block that shows its output."""

    accordion: str  # the accordion title
    index: int  # 1-based position among the accordion's python/text pairs
    count: int  # number of pairs in the accordion
    code: str
    expected: str
    line: int  # 1-based line of the python block's fence in the page

    @property
    def name(self) -> str:
        suffix = f" ({self.index}/{self.count})" if self.count > 1 else ""
        return f"page: {self.accordion}{suffix}"


@dataclass
class SpecPage:
    setup: str
    examples: list[PageExample] = field(default_factory=list)
    # text blocks outside accordions (format snippets), by the heading of their section
    snippets: dict[str, list[str]] = field(default_factory=dict)


_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)")
_ACCORDION_OPEN = re.compile(r'^\s*<Accordion\s+title="(?P<title>[^"]*)"\s*>')
_ACCORDION_CLOSE = re.compile(r"^\s*</Accordion>")
_HEADING = re.compile(r"^#{1,6} (?P<title>.+)$")


def _code_blocks(text: str) -> Iterator[tuple[int, str, str, str | None, str]]:
    """Yield (fence line, language, dedented content, enclosing accordion title or None, section heading)."""
    lines = text.split("\n")
    accordion = None
    heading = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _HEADING.match(line):
            heading = m.group("title").strip()
        elif m := _ACCORDION_OPEN.match(line):
            accordion = m.group("title")
        elif _ACCORDION_CLOSE.match(line):
            accordion = None
        elif m := _FENCE_OPEN.match(line):
            indent, start = m.group("indent"), i
            i = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
            body = lines[start + 1 : i]
            short = next((n for n, code in enumerate(body, start + 2) if code.strip() and not code.startswith(indent)),
                         0)
            assert not short, f"spec line {short}: code line is indented less than its fence"
            assert i < len(lines), f"spec line {start + 1}: code block is never closed"
            yield start + 1, m.group("lang"), "\n".join(code[len(indent) :] for code in body), accordion, heading
        i += 1


def parse_spec(text: str) -> SpecPage:
    """Find the page's setup block and its accordion examples (python block + following text block)."""
    setup = None
    blocks_of: dict[str, list[tuple[int, str, str]]] = {}  # accordion title -> [(line, lang, body)], page order
    snippets: dict[str, list[str]] = {}
    for line, lang, body, accordion, heading in _code_blocks(text):
        if accordion is not None:
            blocks_of.setdefault(accordion, []).append((line, lang, body))
        elif lang == "python" and setup is None and "BEAM_MODEL_ID" in body:
            setup = body
        elif lang == "text":
            snippets.setdefault(heading, []).append(body)
    assert setup is not None, "spec page has no setup block (a python block using BEAM_MODEL_ID)"
    page = SpecPage(setup=setup, snippets=snippets)
    for title, blocks in blocks_of.items():
        pairs = [(line, body, k) for k, (line, lang, body) in enumerate(blocks, start=1) if lang == "python"]
        for index, (line, code, k) in enumerate(pairs, start=1):
            assert k < len(blocks) and blocks[k][1] == "text", \
                f"spec line {line}: python block in accordion {title!r} is not followed by a text block"
            page.examples.append(PageExample(title, index, len(pairs), code, blocks[k][2], line))
    assert page.examples, "spec page has no accordion examples"
    return page


def load_spec(path: str | Path | None = None) -> SpecPage:
    return parse_spec(Path(path or SPEC_PATH).read_text(encoding="utf-8"))


def _run_block(code: str, namespace: dict[str, Any], filename: str) -> str:
    """Exec `code` in `namespace`; return its stdout, plus `TypeName: message` if it raised."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, filename, "exec"), namespace)  # noqa: S102 -- running the page's examples is the point
        except Exception as err:  # noqa: BLE001 -- the page shows raised errors as their output
            print(f"{type(err).__name__}: {err}")
    return out.getvalue()


def run_page_examples(model_id: str, page: SpecPage | None = None) -> list[RuleResult]:
    """Run every page example against `model_id` (a tokenizer dir or hub id), one result per example."""
    page = page or load_spec()
    setup_ns: dict[str, Any] = {"__name__": "__beam_spec__"}
    with mock.patch.dict(os.environ, {"BEAM_MODEL_ID": str(model_id)}):
        setup_out = _run_block(page.setup, setup_ns, "<spec setup>")
    if "tokenizer" not in setup_ns or "render" not in setup_ns:
        reason = f"the page's setup block failed: {setup_out.strip().splitlines()[-1] if setup_out.strip() else '?'}"
        return [RuleResult(ex.name, False, reason) for ex in page.examples]
    results = []
    namespace: dict[str, Any] = {}
    for ex in page.examples:
        if ex.index == 1:
            # Examples mutate the inputs they build on (e.g. history[1][...] = ...); data gets copied, the
            # tokenizer, modules and functions are shared.
            namespace = {k: copy.deepcopy(v) if isinstance(v, (list, dict)) and not k.startswith("__") else v
                         for k, v in setup_ns.items()}
        actual = _run_block(ex.code, namespace, f"<spec line {ex.line}>")
        expected = ex.expected + "\n"
        reason = "" if actual == expected else _first_difference(expected, actual)
        results.append(RuleResult(ex.name, actual == expected, reason, expected, actual))
    return results


def _first_difference(expected: str, actual: str) -> str:
    exp_lines, act_lines = expected.splitlines(), actual.splitlines()
    for n, (e, a) in enumerate(zip(exp_lines, act_lines), start=1):
        if e != a:
            col = _diverge(e, a)
            return f"output line {n} differs at column {col + 1}: page {e[col : col + 60]!r}, got {a[col : col + 60]!r}"
    if len(exp_lines) != len(act_lines):
        return f"page shows {len(exp_lines)} line(s), got {len(act_lines)}"
    return "outputs differ in trailing whitespace"


GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {
        "type": "integer", "description": "Forecast length in days"}}, "required": ["city"]}}}


def _call(city: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city, **arguments}}}


USER = {"role": "user", "content": "What is 2 + 2?"}
ANSWER = {"role": "assistant", "reasoning_content": "Simple arithmetic.", "content": "4"}
CALL_LONDON = {"role": "assistant", "reasoning_content": "I should check the weather tool.",
               "tool_calls": [_call("London")]}
PARALLEL_CALLS = {"role": "assistant", "reasoning_content": "I need both cities.",
                  "tool_calls": [{"id": "c1", **_call("London")}, {"id": "c2", **_call("Paris", days=3)}]}
AFTER_TOOL = {"role": "assistant", "reasoning_content": "It is cloudy.", "content": "London: 14 C, cloudy."}
LONDON_RESULT = {"role": "tool", "name": "get_weather", "content": "14 C, cloudy"}
ASK_LONDON = {"role": "user", "content": "Weather in London?"}
# Text that trips tokenizers that normalise or add spaces: leading/trailing/multiple spaces, tabs, CRLF,
# code, emoji, CJK, combining characters.
ODD_TEXT = "  two leading spaces\tand a tab,\r\nCRLF, trailing  \n```py\ndef f(x):\n    return x  # ok\n```\n😀 中文 e\u0301"
ODD_ANSWER = {"role": "assistant", "reasoning_content": ODD_TEXT, "content": ODD_TEXT}

CONVERSATIONS: dict[str, tuple[list[dict], list[dict] | None]] = {
    "answer": ([USER, ANSWER], None),
    "multi-turn": ([USER, ANSWER, {"role": "user", "content": "And 3 + 3?"}, {**ANSWER, "content": "6"}], None),
    "tool-loop": (
        [{"role": "user", "content": "What's the weather in London?"}, CALL_LONDON, LONDON_RESULT, AFTER_TOOL],
        [GET_WEATHER],
    ),
    "parallel-calls": (
        [{"role": "user", "content": "Compare London and Paris."}, PARALLEL_CALLS,
         {"role": "tool", "tool_call_id": "c1", "content": "14 C, cloudy"},
         {"role": "tool", "tool_call_id": "c2", "content": "18 C, sunny"},
         {**AFTER_TOOL, "content": "Paris is warmer."}],
        [GET_WEATHER],
    ),
    "odd-text": ([{"role": "system", "content": ODD_TEXT}, {"role": "user", "content": ODD_TEXT}, ODD_ANSWER], None),
}

_MESSAGE_RE = re.compile(r"<\|start\|>(?P<header>(?:(?!<\|start\|>).)*?)(?P<body><\|channel\|>|<\|message\|>)"
                         r"(?:(?!<\|start\|>).)*?(?P<stop><\|end\|>|<\|call\|>|<\|return\|>)", re.DOTALL)


def expected_assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans the page says the mask covers: each assistant turn (messages from `assistant` up to
    `<|return|>` or `<|call|>`), first `<|channel|>` to stop (no body here holds a marker)."""
    spans = []
    turn_start = None
    for m in _MESSAGE_RE.finditer(text):
        speaker = m.group("header").split(" ", 1)[0]
        if speaker != "assistant":
            _require(turn_start is None, f"a {speaker!r} message at char {m.start()} interrupts an assistant turn")
            continue
        if turn_start is None:
            turn_start = m.start("body")
        if m.group("stop") != "<|end|>":
            spans.append((turn_start, m.end()))
            turn_start = None
    _require(turn_start is None, "an assistant turn never ends with <|return|> or <|call|>")
    return spans


FormatRule = Callable[[Any], str | None]
FORMAT_RULES: dict[str, FormatRule] = {}


def rule(name: str) -> Callable[[FormatRule], FormatRule]:
    """Register a format rule: it returns an optional note, or raises RuleFailure."""
    return lambda func: FORMAT_RULES.setdefault(name, func)


def _render(tokenizer, messages, tools=None, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@rule("markers-single-token")
def _markers_single_token(tokenizer) -> str | None:
    for marker in MARKERS:
        ids = _ids(tokenizer, marker)
        _require(len(ids) == 1, f"{marker} encodes to {len(ids)} tokens {ids}")
        _require(tokenizer.convert_ids_to_tokens(ids[0]) == marker, f"{marker} id {ids[0]} is not the marker")
        in_text = _ids(tokenizer, f"x{marker}y z{marker}")
        _require(in_text.count(ids[0]) == 2, f"{marker} is not a single token inside text (ids {in_text})")
    return f"{len(MARKERS)} markers"


@rule("only-return-special")
def _only_return_special(tokenizer) -> str | None:
    decoder = tokenizer.backend_tokenizer.get_added_tokens_decoder() if hasattr(tokenizer, "backend_tokenizer") else {}
    flags = {tok.content: tok.special for tok in decoder.values()}
    for marker in (m for m in MARKERS if m in flags):
        want = marker == EOS_TOKEN
        _require(flags[marker] == want, f"{marker} has special={flags[marker]}, the page says {want}")
    text = "".join(f"{m}t{i}" for i, m in enumerate(MARKERS))
    kept = tokenizer.decode(_ids(tokenizer, text), skip_special_tokens=True)
    want_text = text.replace(EOS_TOKEN, "")
    _require(kept == want_text,
             f"decode(skip_special_tokens=True) gives {kept!r}, expected {want_text!r} (only {EOS_TOKEN} dropped)")


@rule("eos-is-return")
def _eos_is_return(tokenizer) -> str | None:
    _require(tokenizer.eos_token == EOS_TOKEN, f"eos_token is {tokenizer.eos_token!r}, not {EOS_TOKEN}")
    _require(tokenizer.eos_token_id == _ids(tokenizer, EOS_TOKEN)[0], "eos_token_id is not the id of <|return|>")


@rule("pad-token")
def _pad_token(tokenizer) -> str | None:
    pad = tokenizer.pad_token
    _require(pad is not None, "no pad token (batching needs one; beamify adds <|pad|>)")
    _require(pad not in MARKERS, f"pad token is the marker {pad}: masking padding would mask it too")
    return f"pad is {pad!r}"


@rule("templates-installed")
def _templates_installed(tokenizer) -> str | None:
    from transformers.utils.chat_parsing.response_templates import load_response_template

    _require(isinstance(tokenizer.chat_template, str) and tokenizer.chat_template, "no chat template")
    _require(re.search(r"\{%-?\s*generation\s*-?%\}", tokenizer.chat_template) is not None,
             "chat template has no {% generation %} block, so there are no assistant masks")
    response_template = getattr(tokenizer, "response_template", None)
    _require(response_template is not None, "no response_template")
    try:
        load_response_template(response_template)
    except ValueError as err:
        raise RuleFailure(f"response_template does not load: {err}") from err


@rule("round-trip")
def _round_trip(tokenizer) -> str | None:
    for name, (messages, tools) in CONVERSATIONS.items():
        text = _render(tokenizer, messages, tools)
        back = tokenizer.decode(_ids(tokenizer, text))
        if back != text:
            at = _diverge(text, back)
            raise RuleFailure(f"{name}: decode(encode(prompt)) != prompt from char {at}: "
                              f"{text[at : at + 30]!r} became {back[at : at + 30]!r}")
    return f"{len(CONVERSATIONS)} conversations"


def _masked_tokens(tokenizer, messages, tools) -> tuple[str, list[int], list[int], list[tuple[int, int]]]:
    """Rendered text, ids, assistant mask and character offsets of one conversation."""
    text = _render(tokenizer, messages, tools)
    encoded = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
    plain = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    _require(list(encoded["input_ids"]) == list(plain["input_ids"]),
             "apply_chat_template(tokenize=True) ids differ from tokenizing the rendered text")
    return text, list(plain["input_ids"]), list(encoded["assistant_masks"]), list(plain["offset_mapping"])


@rule("mask-spans")
def _mask_spans(tokenizer) -> str | None:
    for name, (messages, tools) in CONVERSATIONS.items():
        text, ids, mask, offsets = _masked_tokens(tokenizer, messages, tools)
        spans = expected_assistant_spans(text)
        _require(spans, f"{name}: rendered text has no assistant turn")
        tokens = tokenizer.convert_ids_to_tokens(ids)
        for s, e in spans:
            # The turn must start and end on token boundaries, or the mask takes in part of the prompt.
            _require(any(a == s for a, _ in offsets), f"{name}: no token starts where the turn does (char {s})")
            _require(any(b == e for _, b in offsets), f"{name}: no token ends where the turn does (char {e})")
        # Offsets may be trimmed of whitespace (GPT-2's trim_offsets), so test containment, not coverage.
        want = [int(any(s <= a and b <= e for s, e in spans)) for a, b in offsets]
        if mask != want:
            wrong = [f"token {i} {tokens[i]!r} ({'masked' if m else 'not masked'})"
                     for i, (m, w) in enumerate(zip(mask, want)) if m != w]
            raise RuleFailure(f"{name}: mask disagrees with the assistant turns {spans} at {len(wrong)} token(s): "
                              + ", ".join(wrong[:4]))
    return f"{len(CONVERSATIONS)} conversations"


@rule("mask-stop-tokens")
def _mask_stop_tokens(tokenizer) -> str | None:
    stop_ids = {_ids(tokenizer, m)[0]: m for m in STOP_MARKERS}
    seen = set()
    for name, (messages, tools) in CONVERSATIONS.items():
        _, ids, mask, _ = _masked_tokens(tokenizer, messages, tools)
        for pos, (tid, m) in enumerate(zip(ids, mask)):
            if tid in stop_ids:
                seen.add(stop_ids[tid])
                _require(m == 1, f"{name}: {stop_ids[tid]} at token {pos} is outside the assistant mask")
    _require(seen == set(stop_ids.values()), f"fixtures rendered only {sorted(seen)}")


def _prompt_and_full(tokenizer, history, turn, tools) -> tuple[str, str]:
    """The generation prompt after `history`, and the conversation with `turn` rendered after it."""
    return _render(tokenizer, history, tools, add_generation_prompt=True), _render(tokenizer, [*history, turn], tools)


def _prefix_check(tokenizer, history, turn, tools, label) -> None:
    prompt, full = _prompt_and_full(tokenizer, history, turn, tools)
    if not full.startswith(prompt):
        at = _diverge(prompt, full)
        raise RuleFailure(f"{label}: the generation prompt is not a prefix of the conversation: from char {at} prompt "
                          f"has {prompt[at : at + 40]!r}, conversation has {full[at : at + 40]!r}")
    prompt_ids, full_ids = _ids(tokenizer, prompt), _ids(tokenizer, full)
    _require(full_ids[: len(prompt_ids)] == prompt_ids, f"{label}: prompt ids are not a prefix of conversation ids")


@rule("prefix-answer")
def _prefix_answer(tokenizer) -> str | None:
    _prefix_check(tokenizer, [USER], ANSWER, None, "answer")
    _prefix_check(tokenizer, [USER, ANSWER, {"role": "user", "content": "And 3 + 3?"}], ANSWER, None, "second turn")


@rule("prefix-tool-call")
def _prefix_tool_call(tokenizer) -> str | None:
    _prefix_check(tokenizer, [ASK_LONDON], CALL_LONDON, [GET_WEATHER], "tool call")
    _prefix_check(tokenizer, [ASK_LONDON], PARALLEL_CALLS, [GET_WEATHER], "parallel calls")
    _prefix_check(tokenizer, [ASK_LONDON, CALL_LONDON, LONDON_RESULT], AFTER_TOOL, [GET_WEATHER],
                  "answer after tool result")


def _check_parsed(parsed: dict, turn: dict, label: str) -> None:
    _require(parsed.get("role") == "assistant", f"{label}: role is {parsed.get('role')!r}")
    _require(parsed.get("thinking") == turn["reasoning_content"],
             f"{label}: thinking is {parsed.get('thinking')!r}, rendered {turn['reasoning_content']!r}")
    if "tool_calls" in turn:
        want = [{"type": "function", "function": c["function"]} for c in turn["tool_calls"]]
        _require(parsed.get("tool_calls") == want,
                 f"{label}: tool_calls are {parsed.get('tool_calls')!r}, want {want!r}")
        _require(not parsed.get("content"), f"{label}: a tool-call turn parsed with content {parsed.get('content')!r}")
    else:
        _require(parsed.get("content") == turn["content"], f"{label}: content is {parsed.get('content')!r}")
        _require(not parsed.get("tool_calls"), f"{label}: an answer parsed with tool_calls")


PARSE_CASES = [
    ("answer", [USER], ANSWER, None),
    ("tool call", [ASK_LONDON], CALL_LONDON, [GET_WEATHER]),
    ("parallel calls", [{"role": "user", "content": "London and Paris?"}], PARALLEL_CALLS, [GET_WEATHER]),
    ("odd text", [USER], ODD_ANSWER, None),
]


def _generated(tokenizer) -> Iterator[tuple[str, dict, list[dict] | None, str, str]]:
    """(label, turn, tools, generation prompt, the turn's text after it) of each of PARSE_CASES."""
    for label, history, turn, tools in PARSE_CASES:
        prompt, full = _prompt_and_full(tokenizer, history, turn, tools)
        _require(full.startswith(prompt), "generation prompt is not a prefix (see prefix rules)")
        yield label, turn, tools, prompt, full[len(prompt) :]


@rule("parse-rendered")
def _parse_rendered(tokenizer) -> str | None:
    for label, turn, tools, prompt, generated in _generated(tokenizer):
        _check_parsed(tokenizer.parse_response(generated, prefix=prompt, tools=tools), turn, label)
    return f"{len(PARSE_CASES)} turns"


@rule("parse-decoded-ids")
def _parse_decoded_ids(tokenizer) -> str | None:
    # What a server does: decode the new token ids, dropping special tokens (<|return|>), then parse.
    for label, turn, tools, prompt, generated in _generated(tokenizer):
        prompt_ids = _ids(tokenizer, prompt)
        full_ids = _ids(tokenizer, prompt + generated)
        new_text = tokenizer.decode(full_ids[len(prompt_ids) :], skip_special_tokens=True)
        parsed = tokenizer.parse_response(new_text, prefix=prompt_ids, tools=tools)
        _check_parsed(parsed, turn, f"{label} (skip_special_tokens=True)")


def _stream_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Text as a streaming server sends it: one piece per token, holding back a piece that ends inside a
    multi-byte character (decoded as U+FFFD) until the character is complete."""
    pieces, sent = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        if text.endswith("\ufffd") and i + 1 < len(ids):
            continue
        pieces.append(text[len(sent) :])
        sent = text
    return pieces


@rule("parse-stream")
def _parse_stream(tokenizer) -> str | None:
    for label, turn, tools, prompt, generated in _generated(tokenizer):
        parser = tokenizer.get_response_parser(prefix=prompt, tools=tools)
        pieces = _stream_pieces(tokenizer, _ids(tokenizer, generated))
        _require("".join(pieces) == generated, f"{label}: token-by-token decode does not rebuild the text")
        for piece in pieces:
            parser.feed(piece)
        message, _ = parser.finalize()
        _check_parsed(message, turn, f"{label} (streamed)")


def run_format_rules(tokenizer) -> list[RuleResult]:
    results = []
    for name, func in FORMAT_RULES.items():
        try:
            note = func(tokenizer)
            results.append(RuleResult(name, True, note or ""))
        except RuleFailure as err:
            results.append(RuleResult(name, False, str(err)))
        except Exception as err:  # noqa: BLE001 -- a rule that crashes fails, with the error as reason
            results.append(RuleResult(name, False, f"raised {type(err).__name__}: {err}"))
    return results


# Snippet rules: render the conversation a snippet (a text block outside examples) shows and find it in the
# output, after removing the line breaks the page puts between messages "for readability".

HELLO = [{"role": "user", "content": "Hello!"}]
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

# heading -> (how to find it: "prefix" or "contains", messages, tools)
SNIPPETS: dict[str, tuple[str, list[dict], list[dict] | None]] = {
    "Messages": ("contains", [USER, ANSWER], None),
    "System message": ("prefix", HELLO, None),
    # The page's placeholders, used as the message texts.
    "Instructions": ("contains", [{"role": "system", "content": "{first message}"},
                                  {"role": "developer", "content": "{second message}"}, *HELLO], None),
    "Tools": ("contains", HELLO, [GET_WEATHER]),
    "Built-in tools": ("contains", HELLO, [BASH]),
    "Tool calls": ("contains", [ASK_LONDON,
                                {"role": "assistant", "reasoning_content": "Check.", "tool_calls": [_call("London")]},
                                LONDON_RESULT], [GET_WEATHER]),
    "Parallel calls": ("contains", [{"role": "user", "content": "London and Paris?"},
                                    {"role": "assistant", "reasoning_content": "Both.",
                                     "tool_calls": [_call("London"), _call("Paris")]},
                                    LONDON_RESULT, {"role": "tool", "name": "get_weather", "content": "18 C, sunny"}],
                       [GET_WEATHER]),
}


def _snippet_rule(tokenizer, heading: str, blocks: list[str] | None) -> RuleResult:
    how, messages, tools = SNIPPETS[heading]
    name = f"snippet: {heading}"
    if not blocks:
        return RuleResult(name, False, f"the page has no text block under the heading {heading!r}")
    expected = blocks[0].replace("\n<|start|>", "<|start|>")
    try:
        text = _render(tokenizer, messages, tools, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 -- a template error fails the rule, with the error as reason
        return RuleResult(name, False, f"render raised {type(err).__name__}: {err}")
    found = text.startswith(expected) if how == "prefix" else expected in text
    if found:
        return RuleResult(name, True)
    # Show the closest stretch of the render: from where the snippet's first line starts, if anywhere.
    at = text.find(expected.split("\n", 1)[0][:30]) if how == "contains" else 0
    actual = text[at : at + len(expected)] if at >= 0 else text
    reason = f"the render does not {'start with' if how == 'prefix' else 'contain'} the page's snippet"
    return RuleResult(name, False, f"{reason}; {_first_difference(expected, actual)}", expected, actual)


def run_snippet_rules(tokenizer, page: SpecPage) -> list[RuleResult]:
    return [_snippet_rule(tokenizer, heading, page.snippets.get(heading)) for heading in SNIPPETS]


def run_suite(tokenizer, model_id: str | Path | None = None, *, page: SpecPage | None = None) -> list[RuleResult]:
    """Run format rules on `tokenizer`, and the page examples on `model_id` (what the page's setup loads;
    None: the tokenizer saved to a temporary directory, which also checks that both templates survive it)."""
    page = page or load_spec()
    results = run_format_rules(tokenizer) + run_snippet_rules(tokenizer, page)
    if model_id is not None:
        return results + run_page_examples(str(model_id), page)
    with tempfile.TemporaryDirectory(prefix="beam-check-") as tmp:
        save_tokenizer(tokenizer, tmp)
        return results + run_page_examples(tmp, page)
