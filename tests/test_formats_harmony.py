"""gpt-oss Harmony (rendered text and openai-harmony JSON) → Beam records.

Covers both recipient positions, preambles, tool results, reasoning effort, developer instructions, the
TypeScript tool declarations, built-in tools, and strictness: a cut-off or malformed call is rejected, never
turned into a call (the weak spot of regex parsers, see the prior-art page in the brief).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.harmony import parse_text
from beam_sft.formats.typescript import TypeScriptError, parse_namespaces
from beam_sft.records.files import expand_inputs, iter_items, parse_line
from beam_sft.validate.convert import convert, detect
from beam_sft.validate.rules import Options, make_render_check

REALDATA = Path(__file__).parent / "data" / "realdata" / "harmony"
RENDER = make_render_check()

SYSTEM = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
          "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: {effort}\n\n"
          "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
          "Calls to these tools must go to the commentary channel: 'functions'.<|end|>")
DEVELOPER = ("<|start|>developer<|message|># Instructions\n\nAnswer in French.\n\n# Tools\n\n## functions\n\n"
             "namespace functions {\n\n// Gets the weather.\ntype get_weather = (_: {\n// City name\n"
             "location: string,\nformat?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n"
             "} // namespace functions<|end|>")


def conv(rec, checks: str = "reject"):
    """`checks="keep"`: a completion without its prompt, or calls without the tools' declarations (what
    `beam_sft.validate.calls` rejects by default), converted all the same."""
    out = convert(rec, "harmony", Options(tool_call_checks=checks))[0]
    RENDER(out)
    return out


def rejected(rec) -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, "harmony")
    return info.value


def tool_loop(header_style: str) -> str:
    call_head = ("<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
                 if header_style == "role" else
                 "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json")
    return (SYSTEM.format(effort="low") + DEVELOPER
            + "<|start|>user<|message|>Weather in Paris?<|end|>"
            + "<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
            + call_head + '<|message|>{"location": "Paris"}<|call|>'
            + "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
            + '{"temp": 18}<|end|>'
            + "<|start|>assistant<|channel|>analysis<|message|>It is 18.<|end|>"
            + "<|start|>assistant<|channel|>final<|message|>Il fait 18 degrés.<|return|>")


EXPECTED_LOOP = {
    "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the tool.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 18}'},
        {"role": "assistant", "reasoning_content": "It is 18.", "content": "Il fait 18 degrés."},
    ],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Gets the weather.",
        "parameters": {"type": "object", "properties": {
            "location": {"description": "City name", "type": "string"},
            "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["location"]}}}],
    "chat_template_kwargs": {"reasoning_effort": "low"},
}


@pytest.mark.parametrize("header_style", ["role", "channel"])
def test_tool_loop_with_recipient_in_either_header_position(header_style):
    assert conv({"text": tool_loop(header_style)}) == EXPECTED_LOOP
    assert detect({"text": tool_loop(header_style)}) == "harmony"


def test_preamble_becomes_reasoning_and_completion_without_start():
    text = ("<|channel|>analysis<|message|>Plan.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>I'll generate the file.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.gen <|constrain|>json<|message|>"
            '{"path": "a.html"}<|call|>')
    assert rejected(text).code is Reason.ASSISTANT_FIRST  # a completion alone has no prompt to train it on
    out = conv(text, "keep")
    assert out["messages"] == [{"role": "assistant", "reasoning_content": "Plan.\n\nI'll generate the file.",
                                "tool_calls": [{"type": "function", "function": {
                                    "name": "gen", "arguments": {"path": "a.html"}}}]}]


def test_parallel_calls_and_results_by_position():
    text = ("<|start|>user<|message|>A and B<|end|><|start|>assistant<|channel|>analysis<|message|>both<|end|>"
            '<|start|>assistant to=functions.w<|channel|>commentary <|constrain|>json<|message|>{"c": "A"}<|call|>'
            '<|start|>assistant to=functions.w<|channel|>commentary <|constrain|>json<|message|>{"c": "B"}<|call|>'
            "<|start|>functions.w to=assistant<|channel|>commentary<|message|>1<|end|>"
            "<|start|>functions.w to=assistant<|channel|>commentary<|message|>2<|end|>"
            "<|start|>assistant<|channel|>analysis<|message|>ok<|end|>"
            "<|start|>assistant<|channel|>final<|message|>1, 2<|return|>")
    m = conv(text, "keep")["messages"]
    assert [c["function"]["arguments"] for c in m[1]["tool_calls"]] == [{"c": "A"}, {"c": "B"}]
    assert [t["content"] for t in m[2:4]] == ["1", "2"]


def test_generation_prompt_and_whitespace_between_messages_are_ignored():
    text = ("<|start|>user<|message|>2+2?<|end|>\n<|start|>assistant<|channel|>analysis<|message|>4<|end|>\n"
            "<|start|>assistant<|channel|>final<|message|>4<|end|>\n<|start|>user<|message|>thanks<|end|>"
            "<|start|>assistant")
    out = conv(text)
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("effort", ["low", "medium", "high", "HIGH"])
def test_reasoning_effort_labels(effort):
    text = SYSTEM.format(effort=effort) + ("<|start|>user<|message|>x<|end|><|start|>assistant<|channel|>analysis"
                                           "<|message|>y<|end|><|start|>assistant<|channel|>final<|message|>z<|return|>")
    assert conv(text)["chat_template_kwargs"] == {"reasoning_effort": effort.lower()}


def test_unknown_effort_and_other_identity():
    text = SYSTEM.format(effort="extreme") + "<|start|>user<|message|>x<|end|>"
    assert rejected(text).code is Reason.BAD_TEMPLATE_KWARGS
    text = ("<|start|>system<|message|>You are Pirate Bot.\nReasoning: low<|end|><|start|>user<|message|>x<|end|>"
            "<|start|>assistant<|channel|>analysis<|message|>y<|end|><|start|>assistant<|channel|>final"
            "<|message|>arr<|return|>")
    assert conv(text)["chat_template_kwargs"] == {"model_identity": "You are Pirate Bot.", "reasoning_effort": "low"}


# --- strictness ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("header_style", ["role", "channel"])
def test_no_prefix_of_a_conversation_yields_a_partial_call(header_style):
    """Cut the text at every position: the result is rejected, or every call in it is one of the full calls."""
    text = tool_loop(header_style)
    full_args = [{"location": "Paris"}]
    outcomes = set()
    for cut in range(len(text) + 1):
        try:
            out = convert(text[:cut], "harmony")[0]
        except RecordError as err:
            outcomes.add(err.code)
            continue
        RENDER(out)
        for m in out["messages"]:
            for c in m.get("tool_calls") or []:
                assert c["function"]["arguments"] in full_args, (cut, c)
                assert c["function"]["name"] == "get_weather"
        outcomes.add("ok")
    assert {Reason.UNTERMINATED_CALL, Reason.TRUNCATED_MESSAGE, "ok"} <= outcomes


@pytest.mark.parametrize(("body", "code"), [
    ('{"location": "Par', Reason.UNTERMINATED_CALL),                  # cut off
    ('{"location": "Paris"<|call|>', Reason.BAD_ARGUMENTS_JSON),      # cut inside, then a terminator
    ('location=Paris<|call|>', Reason.BAD_ARGUMENTS_JSON),
    ('["Paris"]<|call|>', Reason.ARGUMENTS_NOT_OBJECT),
    ('{"location": "Paris"}<|return|>', Reason.BAD_HARMONY),          # a call must hand over with <|call|>
    ('{"location": "Paris"}<|channel|>final<|message|>x<|return|>', Reason.BAD_HARMONY),
    ('{"location": "Paris"}<|start|>user<|message|>x<|end|>', Reason.TRUNCATED_MESSAGE),
])
def test_malformed_calls_are_rejected(body, code):
    text = ("<|start|>user<|message|>q<|end|><|start|>assistant<|channel|>analysis<|message|>r<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + body)
    err = rejected(text)
    assert err.code is code, err


def test_other_malformed_text():
    assert rejected("just some text").code is Reason.BAD_HARMONY
    assert rejected("hello <|start|>user<|message|>x<|end|>").code is Reason.BAD_HARMONY
    assert rejected("<|start|>{header}<|message|>{content}<|end|>").code is Reason.UNKNOWN_ROLE
    assert rejected("<|start|>user<|message|>x<|end|> stray <|start|>assistant").code is Reason.BAD_HARMONY
    err = rejected("<|start|>user<|message|>x<|end|><|start|>assistant<|channel|>weird<|message|>y<|end|>")
    assert err.code is Reason.BAD_HARMONY and err.message_index == 1
    err = rejected("<|start|>user<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>half")
    assert err.code is Reason.TRUNCATED_MESSAGE


def test_builtin_browser_and_python_tools_rule():
    text = (REALDATA / "openai_harmony_test-data" / "test_browser_and_python_tool.txt").read_text()
    hm = parse_text(text)
    assert hm[0].author == "system"
    text += ("<|start|>user<|message|>Compute 2**10<|end|><|start|>assistant<|channel|>analysis<|message|>"
             "Use python.<|end|><|start|>assistant<|channel|>analysis to=python code<|message|>print(2**10)<|call|>"
             "<|start|>python to=assistant<|channel|>analysis<|message|>1024<|end|>"
             "<|start|>assistant<|channel|>final<|message|>1024<|return|>")
    out = conv(text.replace("<|start|>assistant<|start|>user", "<|start|>user"))
    names = [t["function"]["name"] for t in out["tools"]]
    assert names == ["browser.search", "browser.open", "browser.find", "python"]
    call = out["messages"][1]["tool_calls"][0]["function"]
    assert call == {"name": "python", "arguments": {"code": "print(2**10)"}}
    assert out["messages"][2] == {"role": "tool", "name": "python", "content": "1024"}


# --- TypeScript tool declarations ----------------------------------------------------------------------------


def test_typescript_kitchensink_parses_exactly():
    text = (REALDATA / "openai_harmony_test-data" / "test_render_functions_with_parameters.txt").read_text()
    start = text.index("namespace functions")
    end = text.index("} // namespace functions") + len("} // namespace functions")
    tools = {t["function"]["name"]: t["function"] for t in parse_namespaces(text[start:end])}
    assert tools["get_location"]["parameters"] == {"type": "object", "properties": {}}
    assert tools["get_multiple_weathers"]["parameters"]["properties"]["locations"] == {
        "description": 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]',
        "type": "array", "items": {"type": "string"}}
    ks = tools["kitchensink"]["parameters"]["properties"]
    assert ks["string"] == {"description": "STRING\n\nA string", "type": "string", "examples": ["hello", "world"]}
    assert ks["string_nullable"] == {"description": "A nullable string", "type": ["string", "null"],
                                     "default": "the default"}
    assert ks["string_enum"] == {"type": "string", "enum": ["a", "b", "c"]}
    assert ks["oneof_string_or_number"] == {
        "description": "a oneof", "default": 20,
        "anyOf": [{"type": "string", "default": "default_string_in_oneof"},
                  {"type": "number", "description": "numbers can happen too"}]}
    assert "required" not in tools["kitchensink"]["parameters"]


def test_typescript_nested_objects_arrays_and_errors():
    src = ("namespace functions {\n// Book.\ntype book = (_: {\nitems: {\nname: string,\nqty?: number,\n}[],\n"
           "mode: \"a\" | \"b\" | null,\nflags?: Array<boolean>,\n}) => any;\n} // namespace functions")
    p = parse_namespaces(src)[0]["function"]["parameters"]
    assert p["properties"]["items"] == {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "qty": {"type": "number"}}, "required": ["name"]}}
    assert p["properties"]["mode"] == {"type": ["string", "null"], "enum": ["a", "b", None]}
    assert p["properties"]["flags"] == {"type": "array", "items": {"type": "boolean"}}
    with pytest.raises(TypeScriptError, match="line 3"):
        parse_namespaces("namespace functions {\ntype f = (_: {\nx: Map<string>,\n}) => any;\n}")
    with pytest.raises(TypeScriptError):
        parse_namespaces("namespace functions {\ntype f = (_: {\nx: string,\n")


def test_unparseable_tool_declaration_rejects_the_record_with_the_reason():
    text = ("<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\ntype f = (_: {\n"
            "x: Weird<Thing>,\n}) => any;\n} // namespace functions<|end|><|start|>user<|message|>q<|end|>"
            "<|start|>assistant<|channel|>final<|message|>a<|return|>")
    err = rejected(text)
    assert err.code is Reason.BAD_TOOL_SCHEMA and "Weird" in err.message and err.message_index == 0


# --- openai-harmony JSON (Conversation.to_json) ----------------------------------------------------------------


def harmony_conversation():
    weather = ToolDescription.new("get_weather", "Gets the weather.", parameters={
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]})
    return Conversation.from_messages([
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort.HIGH)),
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions("Be terse.")
                                      .with_function_tools([weather])),
        Message.from_role_and_content(Role.USER, "Weather in Oslo?"),
        Message.from_role_and_content(Role.ASSISTANT, "Call the tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, '{"location": "Oslo"}').with_channel("commentary")
        .with_recipient("functions.get_weather").with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), "-3 C, snow")
        .with_channel("commentary").with_recipient("assistant"),
        Message.from_role_and_content(Role.ASSISTANT, "Report it.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "-3 °C and snowing.").with_channel("final"),
    ])


def test_openai_harmony_conversation_json():
    rec = json.loads(harmony_conversation().to_json())
    assert detect(rec) == "harmony"
    out = conv(rec)
    assert out == {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "reasoning_content": "Call the tool.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}}]},
            {"role": "tool", "name": "get_weather", "content": "-3 C, snow"},
            {"role": "assistant", "reasoning_content": "Report it.", "content": "-3 °C and snowing."},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Gets the weather.",
                                                    "parameters": {"type": "object", "properties": {
                                                        "location": {"type": "string"}}, "required": ["location"]}}}],
        "chat_template_kwargs": {"reasoning_effort": "high"},
    }
    # the JSON string form (a column holding Conversation.to_json()) converts the same way
    assert conv({"messages": harmony_conversation().to_json()}) == out


def test_openai_harmony_json_bad_call_is_rejected():
    convo = harmony_conversation()
    rec = json.loads(convo.to_json())
    rec["messages"][4]["content"][0]["text"] = '{"location": '
    err = rejected(rec)
    assert err.code is Reason.BAD_ARGUMENTS_JSON and err.message_index == 4


def test_samples_file_mixes_text_and_json_records():
    path = Path(__file__).parents[1] / "data" / "samples" / "harmony.jsonl"
    kinds = {"text": 0, "json": 0}
    for item in iter_items(expand_inputs([str(path)])):
        rec = parse_line(item.payload)
        kinds["text" if "text" in rec else "json"] += 1
    assert kinds["text"] > 10 and kinds["json"] > 5


# --- the real third-party files -------------------------------------------------------------------------------


def _all_real_items():
    for item in iter_items(expand_inputs([str(REALDATA)])):
        rec = parse_line(item.payload) if item.raw else item.payload
        yield f"{Path(item.source).name}:{item.position}", rec


def test_real_harmony_files_convert_or_reject_with_reason():
    results = {}
    for where, rec in _all_real_items():
        try:
            out = convert(rec, "auto")[0]
            RENDER(out)
            results[where] = "ok"
        except RecordError as err:
            assert err.message
            results[where] = err.code.value
    assert len(results) == 23 + 19 + 2
    # a tool call with no tool declared (the test renders a call alone), a completion without its prompt
    assert results["test_does_not_drop_if_ongoing_analysis.txt:0"] == "no_tools_declared"
    assert results["test_streamable_parser.txt:0"] == "assistant_first"
    # the format guide's examples of a model's output alone; its 14th calls get_weather, declaring
    # get_current_weather
    examples = {int(k.rsplit(":", 1)[1]): v for k, v in results.items()
                if k.startswith("openai_harmony_format_md_examples.jsonl:")}
    assert {k for k, v in examples.items() if v == "assistant_first"} == {3, 6, 8, 11, 15}
    assert examples[14] == "undeclared_tool"
    assert results["test_tool_response_parsing.txt:0"] == "truncated_message"
    assert results["test_simple_tool_call.txt:0"] == "unknown_format"  # token ids, not text
    assert results["gpt_oss_rft_notebook_cell37_output.txt:0"] == "ok"
    assert results["openai_harmony_format_md_examples.jsonl:1"] == "unknown_role"  # "{header}" placeholder


def test_real_gpt_oss_output_and_tool_call_without_channel_on_result():
    text = (REALDATA / "gpt_oss_rft_notebook_cell56_output.txt").read_text()
    out = conv(text)
    m = out["messages"]
    assert [x["role"] for x in m] == ["user", "assistant"]
    assert m[1]["reasoning_content"] and m[1]["content"].startswith("```python")
    assert out["chat_template_kwargs"] == {"reasoning_effort": "low"}
    out = conv((REALDATA / "openai_harmony_test-data" / "test_does_not_drop_if_ongoing_analysis.txt").read_text(),
               "keep")
    assert out["messages"][1]["tool_calls"][0]["function"] == {"name": "lookup_weather",
                                                               "arguments": {"location": "San Francisco"}}
    assert out["messages"][2] == {"role": "tool", "name": "lookup_weather",
                                  "content": '{"temperature": 20, "description": "sunny"}'}
    out = conv((REALDATA / "openai_harmony_test-data" / "test_streamable_parser.txt").read_text(), "keep")
    assert out["messages"][0]["tool_calls"][0]["function"]["name"] == "browser.search"
