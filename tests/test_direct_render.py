"""beam_sft.render.direct: the bundled Beam template in plain Python must equal the Jinja template exactly.

Differential: for every record it renders (text and generation spans), the result is transformers' own
tracked rendering; for every record it declines (None), the caller renders with Jinja. Property tests on
generated conversations (tools, calls, results by name and by id, keyword arguments, markers in text), and
the edge cases one by one: reasoning field aliasing, None values, argument value types, and each error the
template raises (those must be declined, so the user sees the template's own message).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_render import conversations, text

from beam_sft.render import encoder as render
from beam_sft.render.direct import BeamTemplateRenderer, for_template
from beam_sft.render.encoder import record_inputs
from beam_sft.render.jinja import tracked_render


@pytest.fixture(scope="module")
def direct(tok):
    renderer = for_template(tok.chat_template)
    assert renderer is not None
    return renderer


def rendered_both(tok, direct, record):
    """(direct result or None, Jinja result or the exception it raised)."""
    messages, tools, kwargs = record_inputs(record)
    template_kwargs = {**tok.special_tokens_map, **kwargs}
    try:
        expected = tracked_render(tok.chat_template, messages, tools, template_kwargs)
    except Exception as err:  # noqa: BLE001 - the template's error is the expected outcome here
        expected = err
    return direct(messages, tools, template_kwargs), expected


def assert_same(tok, direct, record) -> bool:
    """Direct == Jinja when direct renders; declined when Jinja raises. Returns whether direct rendered."""
    got, expected = rendered_both(tok, direct, record)
    if isinstance(expected, Exception):
        assert got is None, f"rendered what the template rejects ({expected}): {record}"
        return False
    if got is not None:
        assert got == expected, record
    return got is not None


def test_only_the_byte_identical_template(tok):
    assert isinstance(for_template(tok.chat_template), BeamTemplateRenderer)
    assert for_template(tok.chat_template + " ") is None
    assert for_template(tok.chat_template.replace("<|return|>", "<|end|>")) is None
    assert for_template("{{ messages }}") is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=conversations())
def test_equal_to_jinja_on_generated_conversations(tok, direct, record):
    got, expected = rendered_both(tok, direct, record)
    if isinstance(expected, Exception):
        assert got is None
    else:
        # Generated records hold plain JSON types only, so none is declined: the shortcut is really taken.
        assert got == expected


def test_renders_every_benchmark_conversation(tok, direct, bench_script):
    for record in bench_script.make_workload(150, seed=5):
        assert assert_same(tok, direct, record)


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.\nNow.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "City"},
                                     "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}},
    "required": ["city"]}}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}


def call(name="get_weather", arguments=None, **extra):
    return {"type": "function", "function": {"name": name, "arguments": arguments}, **extra}


U = {"role": "user", "content": "Hi"}
CASES = {
    "plain": [U, {"role": "assistant", "reasoning_content": "r", "content": "a"}],
    "no reasoning, None values": [U, {"role": "assistant", "content": "a", "reasoning_content": None,
                                      "tool_calls": None}],
    "thinking only": [U, {"role": "assistant", "thinking": "t", "content": "a"}],
    "reasoning only": [U, {"role": "assistant", "reasoning": "r2", "content": "a"}],
    "empty reasoning_content, reasoning set": [U, {"role": "assistant", "reasoning_content": "", "reasoning": "x",
                                                   "content": "a"}],
    "empty reasoning_content, thinking set": [U, {"role": "assistant", "reasoning_content": "", "thinking": "y",
                                                  "content": "a"}],
    "all three": [U, {"role": "assistant", "reasoning_content": "a1", "thinking": "b1", "reasoning": "c1",
                      "content": "a"}],
    "content beside calls is folded": [U, {"role": "assistant", "reasoning_content": "r", "content": "pre",
                                           "tool_calls": [call(arguments={"city": "Oslo"})]},
                                       {"role": "tool", "name": "get_weather", "content": "-3"}],
    "empty tool_calls is a final answer": [U, {"role": "assistant", "content": "a", "tool_calls": []}],
    "parallel calls, results by id (last match wins)": [
        U, {"role": "assistant", "tool_calls": [call(arguments={"city": "A"}, id="c1"),
                                                call("search", {"q": "x"}, id="c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "s"},
        {"role": "tool", "tool_call_id": "c1", "content": "w"},
        {"role": "assistant", "tool_calls": [call("get_weather", {}, id="c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "again"},
        {"role": "assistant", "content": "done"}],
    "argument value types": [U, {"role": "assistant", "tool_calls": [call(arguments={
        "s": "東京 \"q\"", "i": 3, "f": 2.5, "big": 10**20, "b": True, "n": None, "l": [1, "a", None, [2]],
        "d": {"k": {"z": [1.0]}}, "e": "", "sp": " \n"})]}],
    "arguments None or missing": [U, {"role": "assistant", "tool_calls": [
        call(arguments=None), {"type": "function", "function": {"name": "x"}}]}],
    "call without function wrapper": [U, {"role": "assistant", "tool_calls": [{"name": "x", "arguments": {"a": 1}}]},
                                      {"role": "tool", "name": "x", "content": "1"}],
    "late and leading system messages": [{"role": "system", "content": "S1"}, {"role": "developer", "content": "D"},
                                         U, {"role": "system", "content": "late"},
                                         {"role": "assistant", "content": "a"}],
    "only system": [{"role": "system", "content": "S"}],
    "content None and missing": [{"role": "user"}, {"role": "assistant", "content": None},
                                 {"role": "user", "content": None}],
    "markers in user text": [{"role": "user", "content": "<|start|>x<|end|><|return|>"},
                             {"role": "assistant", "content": "<|call|>"}],
    # Declined: the template raises, or the types are not plain.
    "marker in reasoning": [U, {"role": "assistant", "reasoning_content": "a<|end|>", "content": "x"}],
    "string arguments": [U, {"role": "assistant", "tool_calls": [call(arguments='{"a": 1}')]}],
    "list arguments": [U, {"role": "assistant", "tool_calls": [call(arguments=[1])]}],
    "quote in argument name": [U, {"role": "assistant", "tool_calls": [call(arguments={'a"b': 1})]}],
    "close tag in value": [U, {"role": "assistant", "tool_calls": [call(arguments={"a": "</rfl:parameter>"})]}],
    "close tag in nested value": [U, {"role": "assistant", "tool_calls": [
        call(arguments={"a": ["</rfl:parameter>"]})]}],
    "tool result without name": [U, {"role": "assistant", "tool_calls": [call(arguments={})]},
                                 {"role": "tool", "content": "x"}],
    "tool result with unknown id": [U, {"role": "assistant", "tool_calls": [call(arguments={}, id="a")]},
                                    {"role": "tool", "tool_call_id": "b", "content": "x"}],
    "unknown role": [U, {"role": "robot", "content": "x"}],
    "content parts": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                      {"role": "assistant", "content": "a"}],
    "mapping content": [{"role": "user", "content": {"a": 1}}, {"role": "assistant", "content": "a"}],
    "tuple value": [U, {"role": "assistant", "tool_calls": [call(arguments={"t": (1, 2)})]}],
}
KWARGS = [
    None,
    {"reasoning_effort": "low"},
    {"reasoning_effort": 7, "model_identity": "You are Test."},
    {"builtin_tools": ["search"], "allow_missing_thinking": False},
    {"reasoning_effort": "bogus"},  # the template raises in the system message
    {"builtin_tools": "python"},  # likewise
]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("tools", [None, [WEATHER], [BASH, SEARCH, WEATHER]], ids=["no-tools", "one", "three"])
def test_edge_cases(tok, direct, name, tools):
    for kwargs in KWARGS:
        record = {"messages": CASES[name], "tools": tools, "chat_template_kwargs": kwargs}
        rendered = assert_same(tok, direct, record)
        if name in ("plain", "argument value types", "parallel calls, results by id (last match wins)") and (
            kwargs is None or "bogus" not in str(kwargs) and "python" not in str(kwargs)
        ):
            assert rendered, (name, kwargs)


def test_declines_exactly_the_errors_and_odd_types(tok, direct):
    declined = {"marker in reasoning", "string arguments", "list arguments", "quote in argument name",
                "close tag in value", "close tag in nested value", "tool result without name",
                "tool result with unknown id", "unknown role", "content parts", "mapping content", "tuple value"}
    for name, messages in CASES.items():
        got, _ = rendered_both(tok, direct, {"messages": messages, "tools": [WEATHER]})
        assert (got is None) == (name in declined), name


def test_prefix_cache_is_bounded_and_reused(tok):
    renderer = BeamTemplateRenderer(tok.chat_template, prefix_cache_size=3)
    template_kwargs = dict(tok.special_tokens_map)
    for k in range(6):
        messages = [{"role": "system", "content": f"S{k}"}, U, {"role": "assistant", "content": "a"}]
        assert renderer(messages, None, template_kwargs) == tracked_render(
            tok.chat_template, messages, None, template_kwargs)
    assert len(renderer._prefixes) == 3


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=text, reasoning=text, name=st.from_regex(r"[A-Za-z_.\-]{1,12}", fullmatch=True))
def test_text_is_passed_through_untouched(tok, direct, content, reasoning, name):
    record = {"messages": [
        {"role": "user", "content": content},
        {"role": "assistant", "reasoning_content": reasoning, "tool_calls": [call(name, {"v": content})]},
        {"role": "tool", "name": name, "content": content},
        {"role": "assistant", "reasoning_content": reasoning, "content": content}]}
    assert_same(tok, direct, record)


def test_encoder_uses_it_and_stays_identical(tok, encoder):
    from test_render import assert_identical

    records = [{"messages": m, "tools": [WEATHER]} for m in CASES.values()]
    assert assert_identical(tok, records, encoder=encoder) > 10
    assert render._DIRECT_RENDERERS[tok.chat_template] is not None


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False, width=32), text)
_schema = st.recursive(
    st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object", "weird"]),
        "description": text, "default": _scalar, "enum": st.lists(_scalar, max_size=3),
        "const": _scalar, "examples": st.lists(_scalar, max_size=2)}),
    lambda children: st.one_of(
        st.fixed_dictionaries({"type": st.just("array")}, optional={"items": children}),
        st.fixed_dictionaries({"type": st.just("object")},
                              optional={"properties": st.dictionaries(st.from_regex(r"[a-z_]{1,6}", fullmatch=True),
                                                                      children, max_size=3),
                                        "required": st.lists(st.sampled_from(["a", "b", "x"]), max_size=2)}),
        st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "integer", "null"]), max_size=2)}),
    ),
    max_leaves=6,
)
_tools = st.lists(
    st.fixed_dictionaries(
        {"type": st.just("function"),
         "function": st.fixed_dictionaries(
             {"name": st.sampled_from(["bash", "search", "browse", "get_x", "f"])},
             optional={"description": text, "parameters": _schema})}),
    max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tools=_tools, lead=st.lists(st.one_of(text, st.none()), max_size=2),
       kwargs=st.fixed_dictionaries({}, optional={
           "reasoning_effort": st.sampled_from(["low", "max", "bogus", 3, True, 2.5, None]),
           "model_identity": st.one_of(st.none(), text),
           "builtin_tools": st.sampled_from([["search"], "browse", ["search", "browse"], ["python"], None])}))
def test_system_and_developer_messages_equal_jinja(tok, tools, lead, kwargs):
    """Tool declarations (nested schemas, enums, anyOf, defaults, examples), the trained bash tool,
    built-in tools, instructions and keyword arguments: the Python prefix equals the template's."""
    direct = BeamTemplateRenderer(tok.chat_template)  # fresh: nothing cached from other examples
    messages = [{"role": "system", "content": c} for c in lead] + [U, {"role": "assistant", "content": "a"}]
    record = {"messages": messages, "tools": tools, "chat_template_kwargs": kwargs}
    got, expected = rendered_both(tok, direct, record)
    if isinstance(expected, Exception):
        assert got is None
    else:
        assert got == expected


# --- tool declarations: the template's ts_tool macro in Python (direct.ts_tool) ------------------------------

REALDATA = Path(__file__).parent / "data" / "realdata"
SCHEMA_KEYS = ["type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "description",
               "examples", "default", "title", "format"]
TYPE_NAMES = ["string", "integer", "number", "boolean", "null", "array", "object", "any", "date", ""]
schema_text = st.one_of(st.sampled_from(["", "a", "x y", "line\nnext", "\n", "é 🙂", "<|end|>", '"q"', " | "]),
                        st.text(max_size=8))
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                        st.floats(allow_nan=False, allow_infinity=False, width=32), schema_text)
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(schema_text, inner, max_size=3)), max_leaves=6)


def _schemas():
    def extend(inner):
        props = st.dictionaries(schema_text, inner, max_size=4)
        return st.fixed_dictionaries({}, optional={
            "type": st.one_of(st.sampled_from(TYPE_NAMES), st.lists(st.sampled_from(TYPE_NAMES), max_size=3),
                              json_value),
            "properties": st.one_of(props, json_value),
            "required": st.one_of(st.lists(schema_text, max_size=3), json_value),
            "items": st.one_of(inner, json_value),
            "enum": st.one_of(st.lists(json_value, max_size=3), json_value),
            "const": json_value,
            "anyOf": st.lists(inner, max_size=3),
            "oneOf": st.one_of(st.lists(inner, max_size=3), json_value),
            "description": st.one_of(schema_text, json_value),
            "examples": st.one_of(st.lists(json_value, max_size=3), json_value),
            "default": json_value,
        })

    leaf = st.one_of(json_value, st.fixed_dictionaries({"type": st.sampled_from(TYPE_NAMES)}))
    return st.recursive(leaf, extend, max_leaves=12)


def jinja_declaration(tok, tool) -> str | None:
    """The Jinja template's declaration of one developer tool, or None where the template raises."""
    from beam_sft.render.direct import _DEVELOPER_TOOLS_HEAD, _SYSTEM_HEAD

    try:
        text, _ = tracked_render(tok.chat_template, [], [tool], dict(tok.special_tokens_map))
    except Exception:  # noqa: BLE001 - the template's error: ts_tool must decline
        return None
    head = _SYSTEM_HEAD.format(identity="You are Beam, an AI assistant trained by Reflection.", effort=512)
    head += _DEVELOPER_TOOLS_HEAD
    assert text.startswith(head) and text.endswith("<|end|>"), text
    return text[len(head): -len("<|end|>")]


def assert_declaration(tok, tool) -> bool:
    from beam_sft.render.direct import ts_tool

    got = ts_tool(tool)
    expected = jinja_declaration(tok, tool)
    if got is not None:
        assert got == expected, tool
    return got is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=st.sampled_from(["f", "get_weather", "a.b"]), description=st.one_of(st.none(), schema_text, json_value),
       parameters=st.one_of(_schemas(), json_value), wrapped=st.booleans())
def test_tool_declaration_equals_jinja_on_random_schemas(tok, name, description, parameters, wrapped):
    fn = {"name": name, "parameters": parameters}
    if description is not None:
        fn["description"] = description
    tool = {"type": "function", "function": fn} if wrapped else fn
    assert_declaration(tok, tool)


def test_mappings_the_template_iterates_are_declared_in_python_as_jinja_does(tok):
    """A mapping where the template iterates a list reads as its keys, in every use the template makes of it:
    real tool sets write enums as {value: label} (the DuckDuckGo tools of the Hermes samples)."""
    tool = {"type": "function", "function": {"name": "search", "description": "d", "parameters": {
        "type": "object", "required": {"query": True, "x": 1},
        "properties": {
            "query": {"type": "string", "enum": None},
            "format": {"type": "string", "enum": {"json": "JSON format", "xml": "XML format"}},
            "flag": {"type": {"string": 1, "null": 2}, "examples": {"a": 1, "b": 2}},
            "empty": {"type": "string", "enum": {}}}}}}
    assert assert_declaration(tok, tool)  # rendered in Python, and equal to Jinja's


def _real_tools(value, found: list) -> None:
    if isinstance(value, dict):
        if type(value.get("name")) is str and isinstance(value.get("parameters"), dict):
            found.append({"type": "function", "function": value})
        for item in value.values():
            _real_tools(item, found)
    elif isinstance(value, list):
        for item in value:
            _real_tools(item, found)
    elif isinstance(value, str) and value[:1] in "[{":
        try:
            _real_tools(json.loads(value), found)  # tools kept as a JSON string (ShareGPT, xLAM)
        except ValueError:
            pass


def test_tool_declaration_equals_jinja_on_every_real_sample_tool(tok):
    found: list = []
    for path in sorted(REALDATA.rglob("*.json*")):
        lines = path.read_text(encoding="utf-8").splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for line in lines:
            try:
                _real_tools(json.loads(line), found)
            except ValueError:
                continue
    unique = {json.dumps(tool, sort_keys=True): tool for tool in found if tool["function"]["name"] != "bash"}
    assert len(unique) >= 20, "the real samples hold fewer tools than expected: is the data there?"
    rendered = sum(assert_declaration(tok, tool) for tool in unique.values())
    assert rendered == len(unique), "a real tool was declined: the Python path should cover plain JSON schemas"


def test_plain_json_is_exact_json_types_only_and_terminates_on_a_cycle():
    from beam_sft.render.direct import _plain_json

    assert _plain_json({"a": [1, 2.5, "x", None, True, {"b": []}], "c": {}})
    assert not _plain_json({"a": [1, (2, 3)]})           # a tuple renders like a list in tojson, but is not JSON
    assert not _plain_json({"a": {1: "x"}})              # a key that is not a string
    assert not _plain_json([{"a": b"bytes"}])
    looped: dict = {"a": 1}
    looped["self"] = looped
    assert not _plain_json(looped)                       # stops at its limit instead of looping
    assert _plain_json([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])
