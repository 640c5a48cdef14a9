"""Tool-calling dataset shapes → Beam records: Hermes / Qwen tags (in OpenAI and ShareGPT records, with the
fenced variants), glaive-function-calling-v2, xLAM / APIGen, and the rule that no call or result markup is
ever kept as text. Real samples: tests/data/realdata/{hermes,xlam_like,toolbench,reasoning} (SOURCES.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sample_tools import TIME, WEATHER

from beam_sft.errors import Reason, RecordError
from beam_sft.records.files import expand_inputs, iter_items, parse_line
from beam_sft.records.markup import find_markup
from beam_sft.records.schema_types import json_type, standardize
from beam_sft.validate.convert import FORMATS, convert, convert_raw, detect
from beam_sft.validate.rules import make_render_check


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """These tests are about what the converters make; the missing-reasoning policy (default `mask`) has its
    own tests (test_validate.py, test_reasoning_policy.py), so here turns without reasoning are kept."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep"))

REALDATA = Path(__file__).parent / "data" / "realdata"
RENDER = make_render_check()
NEW_FORMATS = ("hermes", "glaive", "xlam")



def call(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid:
        c["id"] = cid
    return c


def conv(rec, fmt="auto"):
    out = convert(rec, fmt)[0]
    RENDER(out)
    return out


def rejected(rec, fmt="auto") -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, fmt)
    return info.value


# --- hand-written records of each canonical shape ----------------------------------------------------------------

QWEN_SYSTEM = (
    "You are a weather bot. Answer in metric units.\n\n# Tools\n\nYou may call one or more functions to assist with "
    "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n</tools>\n\nFor each function call, return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

QWEN_OPENAI = {"messages": [
    {"role": "system", "content": QWEN_SYSTEM},
    {"role": "user", "content": "Weather and time in Paris and Oslo?"},
    {"role": "assistant", "content": "<think>\nTwo cities, two tools.\n</think>\n\nLet me look that up.\n"
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"arguments": "{\\"city\\": \\"Oslo\\", \\"days\\": 2}", "name": "get_weather"}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'},
    # Qwen2.5/3 templates send results back as a user turn of <tool_response> blocks
    {"role": "user", "content": "<tool_response>\n{\"temp\": 18}\n</tool_response>\n<tool_response>\n"
     "{\"temp\": 9}\n</tool_response>\n<tool_response>\n14:05\n</tool_response>"},
    {"role": "assistant", "content": "<think>\nAll in.\n</think>\n\nParis 18 °C; Oslo 9 °C, 14:05 there."},
]}

HERMES_V1_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> XML "
    "tags. You may call one or more functions to assist with the user query. Don't make assumptions about what "
    "values to plug into functions.\n<tools>\n" + repr([WEATHER]) + "\n</tools>\nUse the following pydantic model "
    "json schema for each tool call you will make: {'title': 'FunctionCall', 'type': 'object', 'properties': "
    "{'arguments': {'title': 'Arguments', 'type': 'object'}, 'name': {'title': 'Name', 'type': 'string'}}, "
    "'required': ['arguments', 'name']} For each function call return a json object with function name and "
    "arguments within <tool_call> </tool_call> XML tags as follows:\n<tool_call>\n{'arguments': <args-dict>, "
    "'name': <function-name>}\n</tool_call>\nAlways be polite."
)

HERMES_V1_SHAREGPT = {"conversations": [
    {"from": "system", "value": HERMES_V1_SYSTEM},
    {"from": "human", "value": "Weather in Rome for 3 days?"},
    {"from": "gpt", "value": "<tool_call>\n{'arguments': {'city': 'Rome', 'days': 3}, 'name': 'get_weather'}\n"
     "</tool_call>"},
    {"from": "tool", "value": "<tool_response>\n{'name': 'get_weather', 'content': {'temp': 21, 'sky': 'clear', "
     "'rain': None, 'windy': False}}\n</tool_response>"},
    {"from": "gpt", "value": "Rome: 21 °C and clear."},
]}


def test_qwen_openai_record_parallel_calls_results_in_a_user_turn_and_boilerplate_dropped():
    out = conv(QWEN_OPENAI)
    msgs = out["messages"]
    # the boilerplate and both tag blocks are gone; the operator's own instruction stays
    assert msgs[0] == {"role": "system", "content": "You are a weather bot. Answer in metric units."}
    assert out["tools"] == [WEATHER, TIME]
    a = msgs[2]
    assert a["reasoning_content"] == "Two cities, two tools.\n\nLet me look that up."
    assert a["tool_calls"] == [call("get_weather", {"city": "Paris"}),
                               call("get_weather", {"city": "Oslo", "days": 2}),  # JSON-string arguments
                               call("get_time", {"city": "Oslo"})]
    assert [(m["role"], m["name"], m["content"]) for m in msgs[3:6]] == [
        ("tool", "get_weather", '{"temp": 18}'), ("tool", "get_weather", '{"temp": 9}'), ("tool", "get_time", "14:05")]
    assert msgs[6] == {"role": "assistant", "reasoning_content": "All in.", "content": "Paris 18 °C; Oslo 9 °C, 14:05 there."}
    assert convert_raw(QWEN_OPENAI)[1] == "hermes"


def test_hermes_v1_sharegpt_python_literals_wrapper_unwrapped_other_instructions_kept():
    out = conv(HERMES_V1_SHAREGPT)
    msgs = out["messages"]
    assert msgs[0] == {"role": "system", "content": "Always be polite."}
    assert out["tools"] == [WEATHER]  # a Python-literal list, single quotes
    assert msgs[2]["tool_calls"] == [call("get_weather", {"city": "Rome", "days": 3})]  # arguments before name
    # {"name", "content"} wrapper unwrapped; the Python literal's None/False become JSON
    assert msgs[3] == {"role": "tool", "name": "get_weather",
                       "content": '{"temp":21,"sky":"clear","rain":null,"windy":false}'}
    assert convert_raw(HERMES_V1_SHAREGPT)[1] == "hermes"


def test_a_result_wrapper_nested_deeper_than_orjson_writes_is_kept_as_written_not_an_internal_error():
    # orjson writes at most 255 levels; the wrapper's content used to reach orjson.dumps unguarded (internal_error)
    body = '{"name": "get_weather", "content": ' + "[" * 300 + "1" + "]" * 300 + "}"
    rec = copy.deepcopy(HERMES_V1_SHAREGPT)
    rec["conversations"][3]["value"] = f"<tool_response>\n{body}\n</tool_response>"
    msgs = conv(rec)["messages"]
    assert msgs[3]["role"] == "tool" and msgs[3]["content"] == body


@pytest.mark.parametrize("rec", [QWEN_OPENAI, HERMES_V1_SHAREGPT], ids=["openai", "sharegpt"])
def test_every_format_name_that_accepts_the_record_gives_the_same_result(rec):
    plain = "sharegpt" if "conversations" in rec else "openai"
    results = [convert(rec, fmt)[0] for fmt in ("auto", plain, "hermes")]
    assert results[0] == results[1] == results[2]


def test_fenced_variants_and_bare_tools_in_a_sharegpt_record():
    rec = {"conversations": [
        {"from": "system", "value": "```tools\n[{'name': 'get_time', 'description': 'Local time.', 'parameters': "
         "{'type': 'object', 'properties': {'city': {'type': 'string'}}}}]\n```"},
        {"from": "human", "value": "Time in Lima and Quito?"},
        {"from": "gpt", "value": "```tool_call\n{'arguments': '{\"city\": \"Lima\"}', 'name': 'get_time'}```\n"
         "```tool_call\n{'arguments': '{\"city\": \"Quito\"}', 'name': 'get_time'}```\n"},
        {"from": "tool", "value": "```tool_response\n{\"name\": \"get_time\", \"content\": {'t': '09:00'}}\n"
         "{\"name\": \"get_time\", \"content\": {'t': '09:00'}}\n```"},
        {"from": "gpt", "value": "09:00 in both."},
    ]}
    out = conv(rec)
    assert "system" not in [m["role"] for m in out["messages"]]  # it held only the tools
    assert out["tools"][0]["function"]["name"] == "get_time"  # bare schema, wrapped
    assert out["messages"][1]["tool_calls"] == [call("get_time", {"city": "Lima"}), call("get_time", {"city": "Quito"})]
    assert [m["content"] for m in out["messages"][2:4]] == ['{"t":"09:00"}'] * 2


def test_tool_turn_with_several_blocks_and_no_tools_record():
    rec = {"messages": [
        {"role": "user", "content": "Ping a and b"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "ping", "arguments": {"host": "a"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "ping", "arguments": {"host": "b"}}\n</tool_call>'},
        {"role": "tool", "content": "<tool_response>\nok a\n</tool_response>\n<tool_response>\nok b\n</tool_response>"},
        {"role": "assistant", "content": "Both up."},
    ]}
    # no <tools> anywhere: eval scores every call as an unknown tool, so the record is rejected by default
    err = rejected(rec, "openai")
    assert err.code is Reason.NO_TOOLS_DECLARED and err.message_index == 1 and "'ping'" in err.message
    from beam_sft.validate.rules import Options

    out = convert(rec, "openai", Options(missing_reasoning="keep", tool_call_checks="keep"))[0]
    assert "tools" not in out  # kept by policy, calls without declared tools are still calls
    assert [m["content"] for m in out["messages"] if m["role"] == "tool"] == ["ok a", "ok b"]


@pytest.mark.parametrize("text,code", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>', Reason.BAD_TOOL_CALL),
    ("<tool_call>\nget_weather(city='Paris')\n</tool_call>", Reason.BAD_TOOL_CALL),
    ('<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', Reason.BAD_TOOL_CALL),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{city: Paris}"}\n</tool_call>', Reason.BAD_ARGUMENTS_JSON),
    ('<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>', Reason.ARGUMENTS_NOT_OBJECT),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', Reason.BAD_TOOL_CALL),  # unclosed
    ("<tool_call>\n\n</tool_call>", Reason.BAD_TOOL_CALL),
    ("<tool_call>\n[]\n</tool_call>", Reason.BAD_TOOL_CALL),
])
@pytest.mark.parametrize("fmt", ["auto", "openai", "hermes"])
def test_a_tagged_call_that_does_not_parse_is_rejected_never_kept_as_text(text, code, fmt):
    rec = {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": text}]}
    err = rejected(rec, fmt)
    assert err.code is code and err.message_index == 1


def test_the_same_broken_call_in_a_sharegpt_record_under_sharegpt():
    rec = {"conversations": [{"from": "human", "value": "Hi"},
                             {"from": "gpt", "value": "<tool_call>\n{'name': 'x', 'arguments': {\n</tool_call>"}]}
    assert rejected(rec, "sharegpt").code is Reason.BAD_TOOL_CALL
    assert rejected(rec, "auto").code is Reason.BAD_TOOL_CALL


# --- markup left as text, and quoted tags in prose --------------------------------------------------------------

@pytest.mark.parametrize("role,text,tag", [
    ("assistant", 'I will call it. <functioncall> {"name": "f", "arguments": "{}"}', "<functioncall>"),
    ("user", "FUNCTION RESPONSE: {\"ok\": true}", "FUNCTION RESPONSE:"),
    ("user", 'Call this:\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "<tool_call>"),
    ("assistant", 'Done.\n</tool_response>', "</tool_response>"),
    ("system", "Tools follow.\n<tools>", "<tools>"),  # an opening tag without its end: no tools to lift
])
def test_markup_left_in_a_text_is_rejected(role, text, tag):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    msgs.insert(0 if role == "system" else 1 if role == "user" else 2, {"role": role, "content": text})
    if role == "assistant":
        msgs.append({"role": "user", "content": "ok"})
        msgs.append({"role": "assistant", "content": "ok"})
    with pytest.raises(RecordError) as info:
        convert({"messages": msgs}, "openai")
    if tag == "<tools>":
        assert info.value.code is Reason.BAD_TOOL_CALL  # `<tools>` opened, never closed
    else:
        assert info.value.code is Reason.TOOL_MARKUP_IN_TEXT and tag in info.value.message


@pytest.mark.parametrize("text", [
    "Hermes wraps each call in <tool_call> tags and each result in <tool_response> tags.",
    "The tag `<tool_call>` starts a call; glaive uses `<functioncall>` instead.",
    'Example:\n```xml\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n```\nThat is the format.',
    "Qwen lists tools between <tools></tools> tags in the system prompt.",
    "In glaive data, results start with FUNCTION RESPONSE: at the start of a line.",
])
def test_tags_quoted_in_prose_are_text(text):
    assert find_markup(text) is None
    out = conv({"messages": [{"role": "user", "content": "How does it work?"},
                             {"role": "assistant", "content": text}]})
    assert out["messages"][1]["content"] == text


def test_markup_rule_on_its_own():
    assert find_markup('<tool_call>\n{"name": "f"}\n</tool_call>') == "<tool_call>"
    assert find_markup('text <tool_call>{"name": "f"}</tool_call>') == "<tool_call>"  # JSON follows: a call
    assert find_markup("ASSISTANT: x\nFUNCTION RESPONSE: {}") == "FUNCTION RESPONSE:"
    assert find_markup("```tool_call\n{}\n```") == "```tool_call"
    assert find_markup("wrap it in <tool_call></tool_call>, then stop") is None


# --- glaive-function-calling-v2 --------------------------------------------------------------------------------

GLAIVE_SYSTEM = ("SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
                 + json.dumps(WEATHER["function"], indent=4) + "\n\n" + json.dumps(TIME["function"], indent=4) + "\n")
GLAIVE = {
    "system": GLAIVE_SYSTEM,
    "chat": "USER: What's the weather in Ann's town, Paris?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\", "
            "\"arguments\": '{\"city\": \"Paris\", \"days\": 1}'} <|endoftext|>\n\n\nFUNCTION RESPONSE: {\"temp\": 18}"
            "\n\n\nASSISTANT: It is 18 degrees in Paris. <|endoftext|>\n\n\nUSER: And in Ann's town? Use 'Lyon'.\n\n\n"
            "ASSISTANT: Checking. <functioncall> {\"name\": \"get_weather\", \"arguments\": '{\"city\": \"L'Isle\"}'}"
            " <|endoftext|>\n\n\nFUNCTION RESPONSE: {\"temp\": 16}\n\n\nASSISTANT: 16 degrees. <|endoftext|>\n\n\n",
}


def test_glaive_functions_calls_results_and_endoftext():
    assert detect(GLAIVE) == "glaive"
    out = conv(GLAIVE)
    assert out["tools"] == [WEATHER, TIME]
    assert "system" not in [m["role"] for m in out["messages"]]  # only boilerplate was left
    msgs = out["messages"]
    assert msgs[1]["tool_calls"] == [call("get_weather", {"city": "Paris", "days": 1})]
    assert msgs[2] == {"role": "tool", "name": "get_weather", "content": '{"temp": 18}'}
    assert msgs[3]["content"] == "It is 18 degrees in Paris."
    # an apostrophe inside the single-quoted arguments breaks the Python literal; the fallback reads it
    assert msgs[5]["reasoning_content"] == "Checking." and msgs[5]["tool_calls"] == [call("get_weather", {"city": "L'Isle"})]
    assert not any("<|endoftext|>" in (m.get("content") or "") for m in msgs)


def test_glaive_without_functions_keeps_its_instruction():
    rec = {"system": "SYSTEM: You are a helpful assistant, with no access to external functions.\n\n",
           "chat": "USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>\n\n\n"}
    out = conv(rec, "glaive")
    assert out["messages"] == [
        {"role": "system", "content": "You are a helpful assistant, with no access to external functions."},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "reasoning_content": "", "content": "Hello!"}]
    assert "tools" not in out


@pytest.mark.parametrize("chat,code", [
    ("USER: x\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\", \"arguments\": '{city: x}'} <|endoftext|>",
     Reason.BAD_ARGUMENTS_JSON),
    ("USER: x\n\n\nASSISTANT: <functioncall> get_weather(city=x) <|endoftext|>", Reason.BAD_TOOL_CALL),
    ("USER: x\n\n\nASSISTANT: <functioncall> {\"arguments\": '{}'} <|endoftext|>", Reason.BAD_TOOL_CALL),
    ("USER: x\n\n\nFUNCTION RESPONSE: {}\n\n\nASSISTANT: ok", Reason.TOOL_RESULT_WITHOUT_CALL),
    ("hello\nUSER: x\n\n\nASSISTANT: ok", Reason.BAD_CONTENT),
])
def test_glaive_broken_rows(chat, code):
    assert rejected({"system": GLAIVE_SYSTEM, "chat": chat}).code is code


def test_glaive_bad_function_block_is_a_schema_error():
    err = rejected({"system": "SYSTEM: functions -\n{\"name\": \"f\",\n", "chat": "USER: x\nASSISTANT: y"})
    assert err.code is Reason.BAD_TOOL_SCHEMA


# --- xLAM / APIGen ------------------------------------------------------------------------------------------------

XLAM_TOOLS = [
    {"name": "live_giveaways_by_type", "description": "Giveaways by type.",
     "parameters": {"type": {"description": "beta or game", "type": "str", "default": "game"}}},
    {"name": "top_n", "description": "Top n.",
     "parameters": {"nums": {"description": "Numbers.", "type": "List[int]"},
                    "n": {"description": "How many.", "type": "int, optional", "default": 3},
                    "opts": {"description": "Options.", "type": "Dict[str, Any]"},
                    "ratio": {"description": "Ratio.", "type": "float"},
                    "flag": {"description": "Flag.", "type": "bool, optional"}}},
]


def test_xlam_row_with_json_strings_parallel_calls_and_type_mapping():
    rec = {"id": 7, "query": "Beta giveaways, and the top 2 of [3, 1, 2]?",
           "tools": json.dumps(XLAM_TOOLS),
           "answers": json.dumps([{"name": "live_giveaways_by_type", "arguments": {"type": "beta"}},
                                  {"name": "top_n", "arguments": {"nums": [3, 1, 2], "n": 2, "opts": {}, "ratio": 0.5}}])}
    assert detect(rec) == "xlam"
    out = conv(rec)
    assert out["messages"][0] == {"role": "user", "content": rec["query"]}
    assert out["messages"][1]["tool_calls"] == [call("live_giveaways_by_type", {"type": "beta"}),
                                                call("top_n", {"nums": [3, 1, 2], "n": 2, "opts": {}, "ratio": 0.5})]
    first, second = (t["function"]["parameters"] for t in out["tools"])
    assert first == {"type": "object", "properties": {"type": {"type": "string", "description": "beta or game",
                                                               "default": "game"}}}  # a default: not required
    assert second["properties"]["nums"]["type"] == "array" and second["properties"]["nums"]["items"] == {"type": "integer"}
    assert second["properties"]["n"] == {"type": "integer", "description": "How many.", "default": 3}
    assert second["properties"]["opts"]["type"] == "object" and second["properties"]["ratio"]["type"] == "number"
    assert second["required"] == ["nums", "opts", "ratio"]  # "optional" or a default → not required
    assert convert({**rec, "tools": XLAM_TOOLS, "answers": json.loads(rec["answers"])})[0] == out  # native values


@pytest.mark.parametrize("spec,schema,optional", [
    ("str", {"type": "string"}, False), ("string", {"type": "string"}, False), ("int", {"type": "integer"}, False),
    ("float", {"type": "number"}, False), ("bool", {"type": "boolean"}, False),
    ("List[int]", {"type": "array", "items": {"type": "integer"}}, False), ("list", {"type": "array"}, False),
    ("List[Dict[str, Any]]", {"type": "array", "items": {"type": "object"}}, False),
    ("Dict[str, Any]", {"type": "object"}, False), ("Tuple[int, int]", {"type": "array"}, False),
    ("str, optional", {"type": "string"}, True), ("Optional[int]", {"type": "integer"}, True),
    ("Union[int, float]", {"type": ["integer", "number"]}, False), ("int | None", {"type": "integer"}, True),
    ("Any", {}, False), ("callable", {}, False),
])
def test_xlam_type_mapping(spec, schema, optional):
    assert json_type(spec) == (schema, optional)


def test_xlam_rejections():
    base = {"query": "q", "tools": XLAM_TOOLS}
    assert rejected({**base, "answers": "[]"}).code is Reason.BAD_CONTENT  # nothing to train
    assert rejected({**base, "answers": "[{\"name\": \"top_n\""}).code is Reason.BAD_TOOL_CALL
    assert rejected({**base, "answers": [{"name": "top_n", "arguments": "{x}"}]}).code is Reason.BAD_ARGUMENTS_JSON
    assert rejected({**base, "tools": "[{", "answers": []}).code is Reason.BAD_TOOL_SCHEMA
    assert rejected({**base, "tools": [{"name": "t", "parameters": {"p": "str"}}],
                     "answers": [{"name": "t", "arguments": {}}]}).code is Reason.BAD_TOOL_SCHEMA
    assert rejected({"query": 3, "tools": [], "answers": [{"name": "t"}]}).code is Reason.BAD_CONTENT


# --- hostile input: only RecordError, on any JSON value ------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)
_KEYS = ("query", "answers", "tools", "chat", "system", "messages", "conversations", "role", "content", "from",
         "value", "name", "arguments", "parameters", "type", "function")
shaped = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30) | st.sampled_from(
        ["<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<tools>[]</tools>", "<tool_response>x",
         "```tool_call\n{'name': 'f'}```", "USER: a\nASSISTANT: <functioncall> {\"name\": \"f\"}", "[{\"name\": 1}]",
         "str, optional", "List[", "Dict[str, List[int]]", "{'a': (1, 2)}", "<tool_call>{1: 2}</tool_call>"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rec=st.one_of(json_values, shaped))
def test_new_converters_raise_only_record_error_on_any_json(rec):
    for name in NEW_FORMATS:
        try:
            FORMATS[name](rec)
        except RecordError:
            pass
    try:
        convert(rec, "auto")
    except RecordError:
        pass


@pytest.mark.parametrize("rec", [
    None, [], {}, {"query": None, "answers": None}, {"query": "q", "answers": {"name": None}},
    {"query": [None], "answers": []}, {"query": [{"role": "assistant", "content": None}], "answers": []},
    {"query": "q", "tools": [{"name": "t", "parameters": {"p": {"type": 5}}}], "answers": [{"name": "t"}]},
    {"query": "q", "tools": {"name": "t", "parameters": None}, "answers": [{"name": "t", "arguments": 1.5}]},
    {"query": "q", "tools": [{"name": "t", "parameters": {"p": {"type": "List[" * 500}}}], "answers": [{"x": 1}]},
    {"chat": None}, {"chat": "", "system": 5}, {"chat": "ASSISTANT: <functioncall>", "system": None},
    {"chat": "USER: " + "[" * 5000}, {"system": "{" * 5000, "chat": "USER: a"},
    {"messages": [{"role": "assistant", "content": "<tool_call>" + "[" * 5000 + "</tool_call>"}]},
    {"messages": [{"role": "assistant", "content": "<tool_call>(" * 3000 + "</tool_call>"}]},
    {"messages": [{"role": "system", "content": "<tools>{'a': {1, 2}}</tools>"}]},
    {"conversations": [{"from": "gpt", "value": "<tool_call>{'name': 'f', 'arguments': b'x'}</tool_call>"}]},
    {"conversations": [{"from": "tool", "value": "<tool_response>" + "{" * 3000 + "</tool_response>"}]},
])
def test_hostile_records_are_rejected_cleanly(rec):
    for name in NEW_FORMATS:
        with pytest.raises(RecordError):
            convert(rec, name)


# --- real samples ----------------------------------------------------------------------------------------------


def _convert_folder(folder: str) -> tuple[list, dict, int]:
    ok, rejects, n_in = [], {}, 0
    for item in iter_items(expand_inputs([str(REALDATA / folder)])):
        n_in += 1
        key = f"{Path(item.source).name}:{item.position}"
        try:
            if item.error is not None:
                raise item.error
            rec = parse_line(item.payload) if item.raw else item.payload
            beam, fmt = convert_raw(rec)
            from beam_sft.validate.rules import validate

            out = validate(beam)
            RENDER(out)
            ok.append((key, fmt, out))
        except RecordError as err:
            rejects[key] = err.code.value
    return ok, rejects, n_in


def _round_trip(tok, rec: dict) -> int:
    """Render each call turn with the Beam template and parse it back: the same calls must come out."""
    msgs, tools = rec["messages"], rec.get("tools")
    n = 0
    for k, m in enumerate(msgs):
        if m["role"] != "assistant" or not m.get("tool_calls"):
            continue
        prompt = tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(msgs[:k + 1], tools=tools, tokenize=False)
        parsed = tok.parse_response(full[len(prompt):], prefix=prompt, tools=tools)
        assert [c["function"] for c in parsed["tool_calls"]] == [c["function"] for c in m["tool_calls"]]
        n += 1
    return n


def test_real_hermes_folder(tok):
    ok, rejects, n_in = _convert_folder("hermes")
    assert n_in == len(ok) + len(rejects) == 6
    assert {(k, fmt) for k, fmt, _ in ok} == {
        ("data-genie__sharegpt_new_format.json:0", "hermes"),  # ```tools / ```tool_call / ```tool_response fences
        ("data-genie__weather_api_example.json:0", "openai"),
        # the calls are a JSON list of OpenAI-style calls in the gpt text (tests/test_tool_prompts.py)
        ("data-genie__sharegpt_example.json:0", "hermes"),
        ("data-genie__sharegpt_example.json:1", "hermes"),
    }
    assert rejects == {
        # a prompt asset, not a record: {"example": "```\nSYSTEM: ... ASSISTANT: <tool_call>...```"}
        "NousResearch_Hermes-Function-Calling__few_shot.json:0": "unknown_format",
        "NousResearch_Hermes-Function-Calling__few_shot.json:1": "unknown_format",
    }
    fenced = {k: out for k, _, out in ok}["data-genie__sharegpt_new_format.json:0"]
    assert [t["function"]["name"] for t in fenced["tools"]] == ["deploy_smart_contract", "execute_contract_automation"]
    assert [m["role"] for m in fenced["messages"]] == ["user", "assistant", "tool", "tool", "assistant"]
    assert sum(_round_trip(tok, out) for _, _, out in ok) == 4


def test_real_xlam_like_folder(tok):
    ok, rejects, n_in = _convert_folder("xlam_like")
    assert n_in == len(ok) + len(rejects) == 28
    # Hammer's masking SFT example is Alpaca text ({"instruction", "input", "output"}), not an xLAM row
    assert [fmt for _, fmt, _ in ok].count("alpaca") == 10
    assert [fmt for _, fmt, _ in ok].count("xlam") == 17  # apibank_l1 7 of 8 + toolalpaca 10
    # API-Bank's 7th row passes health_data as a string where its schema says array
    assert rejects == {"Hammer__test_original_apibank_l1.first8.json:7": "arguments_break_schema"}
    by_key = {k: out for k, _, out in ok}
    # API-Bank history: agent → assistant text, fenced earlier call → a call, its result → a tool message;
    # the "Generate API Request:" prompt suffix is gone
    hist = by_key["Hammer__test_original_apibank_l1.first8.json:1"]["messages"]
    assert [m["role"] for m in hist] == ["user", "assistant", "user", "assistant", "tool", "assistant", "user",
                                         "assistant", "user", "assistant"]
    assert hist[-1]["reasoning_content"] == "Got it." and hist[-1]["tool_calls"][0]["function"]["name"] == "QueryHealthData"
    alpaca = by_key["Hammer__test_original_toolalpaca.first10.json:0"]
    params = alpaca["tools"][0]["function"]["parameters"]
    assert params["required"] == ["countryCode"] and params["properties"]["countryCode"]["type"] == "string"
    # ToolAlpaca flags its required parameters: an unflagged one (countyCode) is optional
    assert alpaca["tools"][0]["function"]["name"] == "CountryCountryInfo"
    holiday = next(t["function"]["parameters"] for t in alpaca["tools"]
                   if t["function"]["name"] == "PublicHolidayIsTodayPublicHoliday")
    assert holiday["required"] == ["countryCode"] and "countyCode" in holiday["properties"]
    assert sum(_round_trip(tok, out) for _, _, out in ok) == 21  # 24 before API-Bank's row 7 (3 calls) was rejected


def test_real_toolbench_and_reasoning_folders(tok):
    ok, rejects, n_in = _convert_folder("toolbench")
    # ToolBench's DFS answer trees and its query file are not conversations; the query file has `query`
    # but no `answers`, so it must not be taken for xLAM
    assert n_in == 7 and not ok and set(rejects.values()) == {"unknown_format"}
    ok, rejects, n_in = _convert_folder("reasoning")
    assert n_in == 13 and len(ok) == 12 and {fmt for _, fmt, _ in ok} == {"openai"}
    assert rejects == {"camel_star_r1_output.json:0": "unknown_format"}
    assert sum(_round_trip(tok, out) for _, _, out in ok) == 14


def test_real_sharegpt_glaive_demos_unchanged():
    """LLaMA-Factory's glaive demos (function_call / observation turns, no tags) convert as before."""
    from beam_sft.formats import sharegpt as _  # noqa: F401

    # zh: 2 of its 62 rows have a tool result without a call, 2 call against their schema (test_formats_sharegpt)
    for name, n_ok in (("llamafactory_glaive_toolcall_en_demo.json", 100), ("llamafactory_glaive_toolcall_zh_demo.json", 58)):
        items = list(iter_items(expand_inputs([str(REALDATA / "sharegpt" / name)])))
        fmts = []
        for item in items:
            try:
                fmts.append(convert_raw(item.payload)[1])
                convert(item.payload)
            except RecordError:
                fmts.pop()
        assert len(fmts) == n_ok and set(fmts) == {"sharegpt"}


def test_cli_stats_count_every_new_format(tmp_path, capsys):
    from beam_sft.cli.convert import main

    src = tmp_path / "mixed.jsonl"
    rows = [QWEN_OPENAI, HERMES_V1_SHAREGPT, GLAIVE,
            {"query": "q", "tools": XLAM_TOOLS,
             "answers": [{"name": "top_n", "arguments": {"nums": [1], "opts": {}, "ratio": 0.5}}]},
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]},
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<functioncall> {}"}]}]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main([str(src), "-o", str(out), "--stats", str(stats), "-q", "--missing_reasoning", "keep"]) == 0
    st = json.loads(stats.read_text())
    assert st["formats"] == {"hermes": 2, "glaive": 1, "xlam": 1, "openai": 1}
    assert st["rejected"] == {"tool_markup_in_text": 1} and st["records_in"] == 6
    capsys.readouterr()


# --- tool markup and schemas in OpenAI rows --------------------------------------------------------------------------

PLAIN = {"messages": [{"role": "user", "content": "Hi"},
                      {"role": "assistant", "reasoning_content": "Greet.", "content": "Hello."}]}


@pytest.mark.parametrize("where,text", [
    ("user", "```tool_response\n{\"ok\": 1}\n```"), ("user", "FUNCTION RESPONSE: {}"),
    ("assistant", "```tool_call\n{\"name\": \"f\", \"arguments\": {}}\n```"),
])
def test_tool_markup_without_angle_brackets_is_lifted_or_rejected(where, text):
    rec = json.loads(json.dumps(PLAIN))
    rec["messages"][0 if where == "user" else 1]["content"] = text
    if where == "assistant":  # the general path lifts the fence into a call, or rejects the text
        rec["tools"] = [{"name": "f"}]
        assert convert(rec, "openai")[0]["messages"][1]["tool_calls"] == [call("f", {})]
    else:
        assert rejected(rec, "openai").code in (Reason.TOOL_MARKUP_IN_TEXT, Reason.TOOL_RESULT_WITHOUT_CALL)


def test_python_type_names_in_openai_schemas_are_mapped():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "dict", "properties": {"n": {"type": "int"}, "xs": {"type": "List[str]"}}, "required": ["n"]}}}
    xlam_map = {"type": "function", "function": {"name": "g", "parameters": {"q": {"type": "str", "default": ""}}}}
    for t in (tool, xlam_map):
        rec = {**json.loads(json.dumps(PLAIN)), "tools": [t]}
        params = conv(rec, "openai")["tools"][0]["function"]["parameters"]
        blob = json.dumps(params)
        assert params["type"] == "object" and not any(f'"type": "{t}"' in blob for t in ("int", "str", "dict"))
    assert conv({**PLAIN, "tools": [tool]})["tools"][0]["function"]["parameters"] == {
        "type": "object", "properties": {"n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "string"}}},
        "required": ["n"]}
    assert standardize(WEATHER["function"]["parameters"]) is WEATHER["function"]["parameters"]  # untouched, no copy


def test_validate_alone_names_the_message_with_markup_and_ignores_matches_across_texts():
    from beam_sft.validate.rules import validate

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "reasoning_content": "x", "content": "ok"}, {"role": "user", "content": "more"},
            {"role": "assistant", "reasoning_content": "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "content": "ok"}]
    with pytest.raises(RecordError) as info:
        validate({"messages": json.loads(json.dumps(msgs))})
    assert info.value.code is Reason.TOOL_MARKUP_IN_TEXT and info.value.message_index == 4
    assert "reasoning" in info.value.message
    # "``" ending one text and "`tool_call" starting the next make "```tool_call" only once joined
    split = [{"role": "user", "content": "Quote ``"}, {"role": "assistant", "reasoning_content": "r",
                                                      "content": "`tool_call` is a word"}]
    assert validate({"messages": split})["messages"][1]["content"] == "`tool_call` is a word"


def test_required_next_to_parameters_moves_inside():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}, "required": ["q"]}}
    rec = {**json.loads(json.dumps(PLAIN)), "tools": [tool]}
    fn = conv(rec, "openai")["tools"][0]["function"]
    assert fn == {"name": "f", "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                              "required": ["q"]}}
