"""Properties of the Beam chat and response templates on the bundled tokenizer.

The page's own examples are in test_spec_examples.py; this file covers what the page states as rules:
render → parse_response gives back the assistant message, the mask covers exactly the assistant output,
prompts are prefixes of full conversations, and every bad input named by the page raises a clear error.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError

from beam_sft.template import chat_template, response_template

MARKERS = ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"]


# ---------- strategies ----------

_alphabet = st.characters(codec="utf-8", exclude_categories=("Cs",))
# Text is anything a user could write except the seven markers (validation rejects those); code-like
# fragments and newlines are over-represented, as they are what XML arguments exist for.
_fragments = st.sampled_from(
    ["\n", "\n\n", "  ", "{", "}", '"', "'", "<", ">", "</", "def f(x):\n    return x\n", "<|", "|>", "to=",
     "<rfl:parameter", "analysis", "final", "```", "\t", "é", "日本語", "🙂", "\\n"]
)
text = st.lists(st.one_of(st.text(_alphabet, max_size=12), _fragments), max_size=8).map("".join).filter(
    lambda s: not any(m in s for m in MARKERS)
)
nonempty_text = text.filter(bool)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True)

_value_by_type = {
    "string": text.filter(lambda s: "</rfl:parameter>" not in s),
    "integer": st.integers(-(10**9), 10**9),
    "number": st.integers(-(10**6), 10**6).map(lambda n: n / 8 + 0.125),
    "boolean": st.booleans(),
    "array": st.lists(st.one_of(st.integers(-100, 100), text.filter(lambda s: "</rfl:parameter>" not in s)),
                      max_size=3),
    "object": st.dictionaries(names, st.integers(-5, 5), max_size=3),
}


@st.composite
def tool_and_call(draw):
    """A tool schema and one call of it whose arguments match the schema's types."""
    name = draw(names)
    params = draw(st.dictionaries(names, st.sampled_from(sorted(_value_by_type)), min_size=1, max_size=4))
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": draw(text),
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in params.items()},
                "required": [p for p in params if draw(st.booleans())],
            },
        },
    }
    args = {p: draw(_value_by_type[t]) for p, t in params.items() if draw(st.integers(0, 4))}
    return schema, {"type": "function", "function": {"name": name, "arguments": args}}


@st.composite
def assistant_turn(draw):
    reasoning = draw(nonempty_text)
    if draw(st.booleans()):
        return {"role": "assistant", "reasoning_content": reasoning, "content": draw(text)}, []
    # Tool names are unique in a tools list: the parser casts arguments by name.
    pairs = draw(st.lists(tool_and_call(), min_size=1, max_size=3, unique_by=lambda p: p[0]["function"]["name"]))
    tools = [schema for schema, _ in pairs]
    return {"role": "assistant", "reasoning_content": reasoning, "tool_calls": [c for _, c in pairs]}, tools


def _expected_parse(message):
    out = {"role": "assistant", "thinking": message["reasoning_content"]}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    elif message.get("content"):
        out["content"] = message["content"]
    return out


# ---------- render → parse round trip ----------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turn=assistant_turn(), user=nonempty_text)
def test_render_then_parse_gives_back_the_assistant_message(tok, turn, user):
    message, tools = turn
    history = [{"role": "user", "content": user}]
    prompt = tok.apply_chat_template(history, tools=tools or None, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(history + [message], tools=tools or None, tokenize=False)
    assert full.startswith(prompt), "the generation prompt must be a prefix of the rendered turn"
    generated = full[len(prompt):]
    assert tok.parse_response(generated, prefix=prompt, tools=tools or None) == _expected_parse(message)
    # What a server returns: the new tokens decoded without special tokens (no <|return|>).
    ids = tok(generated, add_special_tokens=False)["input_ids"]
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert tok.parse_response(decoded, prefix=prompt, tools=tools or None) == _expected_parse(message)


@settings(max_examples=60, deadline=None)
@given(turn=assistant_turn())
def test_streaming_parse_matches_one_shot_parse(tok, turn):
    message, tools = turn
    history = [{"role": "user", "content": "go"}]
    prompt = tok.apply_chat_template(history, tools=tools or None, tokenize=False, add_generation_prompt=True)
    generated = tok.apply_chat_template(history + [message], tools=tools or None, tokenize=False)[len(prompt):]
    parser = tok.get_response_parser(prefix=prompt, tools=tools or None)
    streamed = {}
    for char in generated:  # one character at a time: every marker arrives split, the hardest chunking
        for event in parser.feed(char):
            if event["type"] == "region_chunk" and not event["dirty"]:
                streamed[event["field"]] = streamed.get(event["field"], "") + event["text"]
    parsed, _ = parser.finalize()
    assert parsed == _expected_parse(message)
    assert streamed.get("thinking") == message["reasoning_content"]
    if parsed.get("content"):
        assert streamed["content"] == parsed["content"]


# ---------- masks ----------


def _reference_assistant_output(message):
    """The page's rule, written independently of the template: what one assistant turn trains on."""
    reasoning = message.get("reasoning_content") or ""
    out = f"<|channel|>analysis<|message|>{reasoning}<|end|>"
    calls = message.get("tool_calls") or []
    for k, call in enumerate(calls):
        fn = call["function"]
        params = "\n".join(
            f'<rfl:parameter name="{key}">\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}'
            "\n</rfl:parameter>"
            for key, v in fn["arguments"].items()
        )
        end = "<|call|>" if k == len(calls) - 1 else "<|end|>"
        out += f"<|start|>assistant to={fn['name']}<|channel|>analysis <|constrain|>xml<|message|>{params}{end}"
    if not calls:
        out += f"<|start|>assistant<|channel|>final<|message|>{message.get('content') or ''}<|return|>"
    return out


@st.composite
def conversation(draw):
    messages = [{"role": draw(st.sampled_from(["system", "developer"])), "content": draw(text)}
                for _ in range(draw(st.integers(0, 2)))]
    all_tools = []
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        message, tools = draw(assistant_turn())
        messages.append(message)
        all_tools += tools
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "name": call["function"]["name"], "content": draw(text)})
        if message.get("tool_calls"):
            final, _ = draw(assistant_turn().filter(lambda t: not t[1]))
            messages.append(final)
    return messages, all_tools


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversation())
def test_mask_covers_exactly_the_assistant_output(tok, conv):
    messages, tools = conv
    enc = tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assistants = [m for m in messages if m["role"] == "assistant"]
    # One contiguous trained run per assistant message, each preceded by `<|start|>assistant`.
    runs, start = [], None
    for k, m in enumerate(mask + [0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append((start, k))
            start = None
    assert len(runs) == len(assistants), f"{len(runs)} trained runs for {len(assistants)} assistant messages"
    for (a, b), message in zip(runs, assistants):
        assert tok.decode(ids[a:b]) == _reference_assistant_output(message)
        assert tok.decode(ids[a - 2:a]) == "<|start|>assistant", "the mask starts at the turn's first <|channel|>"
        assert tok.convert_ids_to_tokens(ids[b - 1]) in ("<|return|>", "<|call|>")
    # Nothing else is trained: user, system, developer and tool text all fall outside the runs.
    untrained = tok.decode([i for i, m in zip(ids, mask) if not m])
    for message in messages:
        if message["role"] in ("user", "tool") and message["content"]:
            assert message["content"] in untrained


def test_stop_tokens_are_single_tokens_inside_the_mask(tok):
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "reasoning_content": "call it",
         "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "name": "w", "content": "cold"},
        {"role": "assistant", "reasoning_content": "answer", "content": "Cold."},
    ]
    enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = {tok.convert_ids_to_tokens(i) for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m}
    assert {"<|call|>", "<|return|>"} <= trained


# ---------- bad input ----------

_user = {"role": "user", "content": "q"}


def _call(arguments, name="f"):
    return {"role": "assistant", "reasoning_content": "r",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize(
    ("messages", "kwargs", "pattern"),
    [
        ([_user, _call('{"a": 1}')], {}, r"messages\[1\] has string arguments; function.arguments must be a dict"),
        ([_user, _call([1, 2])], {}, r"messages\[1\] has arguments that are not a dict"),
        ([_user, _call({"s": "x</rfl:parameter>y"})], {}, r'argument "s" .* messages\[1\] contains </rfl:parameter>'),
        ([_user, _call({"s": {"nested": "</rfl:parameter>"}})], {}, r"messages\[1\] contains </rfl:parameter>"),
        ([_user, _call({'a"b': 1})], {}, r"argument name \"a\\\"b\""),
        ([_user, {"role": "tool", "content": "x"}], {}, r"tool message at messages\[1\] needs a 'name'"),
        ([_user, _call({}), {"role": "tool", "tool_call_id": "nope", "content": "x"}], {},
         r"tool message at messages\[2\] needs a 'name', or a 'tool_call_id'"),
        ([_user, {"role": "assistant", "reasoning_content": "a<|end|>b", "content": "c"}], {},
         r"reasoning of the assistant turn at messages\[1\] contains the Harmony marker <\|end\|>"),
        ([_user, {"role": "assistant", "thinking": "<|start|>assistant<|channel|>analysis", "content": "c"}], {},
         r"messages\[1\] contains the Harmony marker"),
        ([{"role": "system", "content": "s"}, _user, {"role": "assistant", "content": "c"}, _user],
         {"allow_missing_thinking": False, "add_generation_prompt": True},
         r"^The assistant turn at messages\[2\] is missing its reasoning\."),
        ([_user, {"role": "function", "content": "x"}], {}, r'messages\[1\] has role "function"'),
        ([_user], {"reasoning_effort": "none"},
         r"^reasoning_effort must be an int or one of: minimal, low, medium, high, xhigh, max$"),
        ([_user], {"reasoning_effort": 1.5}, r"^reasoning_effort must be an int"),
        ([_user], {"reasoning_effort": True}, r"^reasoning_effort must be an int"),
        ([_user], {"builtin_tools": ["bash"]}, r'builtin_tools only accepts "search" and "browse"; got "bash"'),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], {},
         r"Only text content parts can be rendered"),
    ],
)
def test_bad_input_raises_a_clear_error(tok, messages, kwargs, pattern):
    with pytest.raises(TemplateError, match=pattern):
        tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_missing_thinking_check_only_runs_with_a_generation_prompt(tok):
    history = [_user, {"role": "assistant", "content": "c"}]
    rendered = tok.apply_chat_template(history, tokenize=False, allow_missing_thinking=False)
    assert "<|channel|>analysis<|message|><|end|>" in rendered


# ---------- decisions where the page is silent (DECISIONS.md) ----------


def _tools_section(tok, tool):
    prompt = tok.apply_chat_template([_user], tools=[tool], tokenize=False)
    return prompt[prompt.index("# Tools\n\n") + len("# Tools\n\n"): prompt.index("<|end|><|start|>user")]


def test_silent_cases_render_as_decided(tok):
    tool = {"type": "function", "function": {
        "name": "f", "description": "Line one.\n\nLine three.",
        "parameters": {"type": "object", "required": ["rows"], "properties": {
            "rows": {"type": "array", "items": {"type": "object", "required": ["x"], "properties": {
                "x": {"type": "integer", "description": "the x"},
                "deep": {"type": "object", "properties": {"z": {"type": "string"}}}}}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "maybe": {"type": "array", "items": {"type": ["string", "null"]}},
            "blob": {"type": "object"},
            "fixed": {"const": "v"},
            "free": {},
            "bag": {"type": "array"},
            "opts": {"type": "array", "items": {"type": "integer"}, "default": [1, 2]},
        }}}}
    assert _tools_section(tok, tool) == (
        "// Line one.\n//\n// Line three.\n"
        "type f = (_: {\n"
        "rows: {\n    // the x\n    x: number,\n    deep?: {\n        z?: string,\n        },\n    }[],\n"
        "either?: string | number,\n"
        "maybe?: (string | null)[],\n"
        "blob?: object,\n"
        'fixed?: "v",\n'
        "free?: any,\n"
        "bag?: any[],\n"
        "opts?: number[], // default: [1, 2]\n"
        "}) => any;"
    )
    assert _tools_section(tok, {"type": "function", "function": {"name": "now"}}) == "type now = () => any;"


def test_content_beside_tool_calls_is_folded_into_the_analysis(tok):
    message = _call({"a": 1})
    message["content"] = "Let me look."
    rendered = tok.apply_chat_template([_user, message], tokenize=False)
    assert "<|channel|>analysis<|message|>r\n\nLet me look.<|end|><|start|>assistant to=f" in rendered
    assert "<|channel|>final" not in rendered


def test_constrained_bash_stays_in_the_developer_message(tok):
    bash = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {
        "command": {"type": "string", "enum": ["ls", "pwd"]}}}}}
    prompt = tok.apply_chat_template([_user], tools=[bash], tokenize=False)
    system = prompt[: prompt.index("<|end|>")]
    assert "type bash" not in system
    assert 'command?: "ls" | "pwd",' in prompt


def test_late_system_messages_are_not_rendered(tok):
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": "early"}, _user, {"role": "developer", "content": "LATE"}], tokenize=False
    )
    assert "early" in prompt and "LATE" not in prompt


def test_shipped_templates_are_the_ones_in_the_tokenizer(tok):
    assert tok.chat_template == chat_template()
    assert tok.response_template == response_template()
    # Declared key order survives save_pretrained (see DECISIONS.md): the page prints this order.
    fields = list(tok.response_template["fields"]["tool_calls"]["transform"])
    assert fields == ["type", "function"]
    # The turn's text is built once; the generation block wraps it unless the message has weight 0.
    assert re.search(r"\{%- else -%\}\s*\{%- generation -%\}\{\{- turn -\}\}\{%- endgeneration -%\}",
                     tok.chat_template)
