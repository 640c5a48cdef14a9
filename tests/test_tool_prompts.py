"""The call-syntax instructions of tool-calling datasets' prompts (Hermes, Qwen, glaive) are removed once the tools
are taken out of the prompt, the dataset's own instructions stay, and data-genie's JSON call lists are calls.

The prompt texts are the public templates, copied verbatim into tests/data/tool_prompts/ (SOURCES.md there says
from where); the rows around them are shaped like the datasets' rows."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from sample_tools import TIME, WEATHER

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.toolmarkup import PROMPT_PATTERNS, json_calls, result_wrapper, strip_tool_prompt
from beam_sft.validate.convert import convert, convert_raw
from beam_sft.validate.rules import STRIPPED_PREFIX, make_render_check, validate


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """These tests are about what the converters make of tool-calling prompts; the missing-reasoning policy
    (default `mask`) has its own tests (test_validate.py, test_reasoning_policy.py), so here turns without
    reasoning are kept."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep"))


DATA = Path(__file__).parent / "data"
PROMPTS = DATA / "tool_prompts"
RENDER = make_render_check()

# The tool list and the call / result that Hermes-Function-Calling's README prints with its prompts.
README_TOOLS = [{"type": "function", "function": {
    "name": "get_stock_fundamentals", "description": "Get fundamental data for a given stock symbol using yfinance API.",
    "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}, "required": ["symbol"]}}}]
README_CALL = "<tool_call>\n{'arguments': {'symbol': 'TSLA'}, 'name': 'get_stock_fundamentals'}\n</tool_call>"
README_RESULT = ("<tool_response>\n{\"name\": \"get_stock_fundamentals\", \"content\": {'symbol': 'TSLA', "
                 "'company_name': 'Tesla, Inc.', 'dividend_yield': None}}\n</tool_response>")
TAGS = ("<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "<functioncall>")


def prompt(name: str) -> str:
    return (PROMPTS / name).read_text(encoding="utf-8")


def hermes_row(system: str) -> dict:
    """A hermes-function-calling-v1 style ShareGPT row around `system`."""
    return {"conversations": [
        {"from": "system", "value": system},
        {"from": "human", "value": "Fetch the stock fundamentals data for Tesla (TSLA)"},
        {"from": "gpt", "value": README_CALL},
        {"from": "tool", "value": README_RESULT},
        {"from": "gpt", "value": "Tesla, Inc. pays no dividend."},
    ]}


def qwen_record(system: str) -> dict:
    """An OpenAI record exported from a Qwen pipeline: the rendered system prompt holds the tools."""
    return {"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
         "</tool_call>"},
        {"role": "user", "content": "<tool_response>\n{\"temp\": 18}\n</tool_response>"},
        {"role": "assistant", "content": "18 °C."},
    ]}


def converted(rec, fmt="auto") -> tuple[dict, dict]:
    """(validated record, stripped_tool_prompt counts) — the record is rendered with the Beam template too."""
    counters: dict = {}
    beam, _ = convert_raw(rec, fmt)
    out = validate(beam, None, counters)
    RENDER(out)
    assert out == convert(rec, fmt)[0]
    return out, {k[len(STRIPPED_PREFIX):]: n for k, n in counters.items() if k.startswith(STRIPPED_PREFIX)}


def texts(value) -> list[str]:
    """Every string anywhere in a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *texts(v))]
    if isinstance(value, list):
        return [s for v in value for s in texts(v)]
    return []


def no_tags(out: dict) -> None:
    found = [(t, tag) for t in texts(out) for tag in TAGS if tag in t]
    assert not found, found


# --- Hermes -----------------------------------------------------------------------------------------------------


HERMES2_COUNTS = {"hermes_role": 1, "tools_intro": 2, "may_call": 1, "no_assumptions": 1, "pydantic_schema": 1,
                  "call_format": 1, "call_template": 1, "tool_list": 1}


def test_hermes2pro_function_calling_prompt_leaves_no_system_message():
    out, counts = converted(hermes_row(prompt("hermes2pro_function_calling.txt")))
    assert out["tools"] == README_TOOLS
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert out["messages"][1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_stock_fundamentals", "arguments": {"symbol": "TSLA"}}}]
    assert out["messages"][2]["content"] == '{"symbol":"TSLA","company_name":"Tesla, Inc.","dividend_yield":null}'
    assert counts == HERMES2_COUNTS
    no_tags(out)


@pytest.mark.parametrize("fmt", ["auto", "sharegpt", "hermes"])
def test_the_datasets_own_instructions_survive_around_the_hermes_prompt(fmt):
    own_before = "You are Tessa, a cautious financial analyst.\nAlways cite the figures you use."
    own_after = "Answer in French. Never give investment advice."
    system = f"{own_before}\n\n{prompt('hermes2pro_function_calling.txt')}\n{own_after}"
    out, counts = converted(hermes_row(system), fmt)
    assert out["messages"][0] == {"role": "system", "content": f"{own_before}\n\n{own_after}"}
    assert counts == HERMES2_COUNTS


def test_own_sentence_on_the_same_line_as_the_boilerplate_keeps_its_spacing():
    system = ("Be terse. You are a function calling AI model. You may call one or more functions to assist with the "
              "user query. Reply in English.\n<tools>\n" + json.dumps(README_TOOLS) + "\n</tools>")
    out, counts = converted(hermes_row(system))
    assert out["messages"][0]["content"] == "Be terse. Reply in English."
    assert counts == {"hermes_role": 1, "may_call": 1, "tool_list": 1}


def test_hermes3_prompt_loses_its_call_syntax_and_keeps_its_other_instructions():
    out, counts = converted(hermes_row(prompt("hermes3_tool_use.txt")))
    system = out["messages"][0]["content"]
    assert system.startswith("If available tools are not relevant in assisting with user query, just respond in "
                             "natural conversational language.\n\nYou must use <scratch_pad> </scratch_pad> XML tags")
    assert system.endswith("</scratch_pad>")  # the scratch pad is Hermes 3's reasoning, not its call syntax
    for gone in ("function calling AI model", "pydantic", "FunctionCall", "<tool_call>", "<tool_response>",
                 "Each function call should be enclosed"):
        assert gone not in system
    assert counts == {"hermes_role": 1, "tools_intro": 1, "may_call": 1, "no_assumptions": 1, "results_format": 1,
                      "pydantic_schema": 1, "call_format": 1, "call_template": 1, "tool_list": 1}
    no_tags(out)


def test_the_issue_func_calling_row_with_a_placeholder_template_is_no_longer_rejected():
    # hermes-function-calling-v1's func_calling prompt as issue 20 quotes it ("{tool_call}" placeholder).
    system = ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
              "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
              "about what values to plug into functions.\n<tools>\n" + repr(README_TOOLS) + "\n</tools>\nFor each "
              "function call return a json object with function name and arguments within <tool_call></tool_call> "
              "XML tags as follows:\n<tool_call>\n{tool_call}\n</tool_call>")
    out, counts = converted(hermes_row(system))
    assert out["messages"][0]["role"] == "user"
    assert counts == {"hermes_role": 1, "tools_intro": 1, "may_call": 1, "no_assumptions": 1, "call_format": 1,
                      "call_template": 1, "tool_list": 1}


def test_hermes_json_mode_prompt_is_the_datasets_own_instruction_and_stays():
    schema = '{"title": "Character", "type": "object", "properties": {"name": {"type": "string"}}}'
    system = prompt("hermes_json_mode.txt").replace("{schema}", schema)
    rec = {"conversations": [{"from": "system", "value": system},
                             {"from": "human", "value": "Return Goku as JSON."},
                             {"from": "gpt", "value": '{"name": "Goku"}'}]}
    out, counts = converted(rec)
    assert out["messages"][0] == {"role": "system", "content": system}
    assert out["messages"][2]["content"] == '{"name": "Goku"}'  # JSON, but no call list: content
    assert counts == {}


def test_markup_left_after_removal_is_still_rejected():
    # a real call written in the prompt (an example, not a placeholder) is not a known paragraph
    system = (prompt("hermes2pro_function_calling.txt") + "\nExample:\n<tool_call>\n"
              '{"arguments": {"symbol": "AAPL"}, "name": "get_stock_fundamentals"}\n</tool_call>')
    with pytest.raises(RecordError) as info:
        convert(hermes_row(system))
    assert info.value.code is Reason.TOOL_MARKUP_IN_TEXT and info.value.message_index == 0


def test_instructions_are_removed_when_the_tools_come_from_the_record_and_kept_without_tools():
    system = ("Be brief. For each function call return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
              "{'arguments': <args-dict>, 'name': <function-name>}\n</tool_call>")
    rec = {**hermes_row(system), "tools": README_TOOLS}
    out, counts = converted(rec)
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}
    assert counts == {"call_format": 1, "call_template": 1}
    # no tools anywhere: nothing was taken out of the prompt, so its markup is markup
    bare = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello"}]}
    with pytest.raises(RecordError) as info:
        convert(bare)
    assert info.value.code is Reason.TOOL_MARKUP_IN_TEXT


# --- Qwen -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, system", [
    ("qwen2_5_rendered.txt", "You are a weather bot. Answer in metric units."),
    ("qwen3_rendered.txt", "You are a weather bot. Answer in metric units."),
    # Qwen2.5's default identity is not call syntax: it stays
    ("qwen2_5_rendered_no_system.txt", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    ("qwen3_rendered_no_system.txt", None),
])
def test_qwen_rendered_prompts(name, system):
    out, counts = converted(qwen_record(prompt(name)))
    msgs = out["messages"]
    assert out["tools"] == [WEATHER, TIME]
    if system is None:
        assert msgs[0]["role"] == "user"
    else:
        assert msgs[0] == {"role": "system", "content": system}
    assert counts == {"qwen_header": 1, "may_call": 1, "tools_intro": 1, "call_format": 1, "call_template": 1,
                      "tool_list": 1}
    no_tags(out)


# --- glaive -----------------------------------------------------------------------------------------------------


def test_glaive_v2_row():
    row = json.loads(prompt("glaive_v2_row.json"))
    out, counts = converted(row, "glaive")
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [t["function"]["name"] for t in out["tools"]] == ["search_books", "calculate_tip"]
    assert out["messages"][1]["tool_calls"][0]["function"] == {
        "name": "search_books", "arguments": {"query": "", "author": "George Orwell"}}
    assert counts == {"glaive_preamble": 1, "tool_list": 1}
    no_tags(out)


def test_glaive_v1_preamble_with_an_own_instruction():
    card = prompt("glaive_v1_card_format.txt")
    preamble = card.split("\n", 1)[0]  # the card's SYSTEM line
    fn = json.dumps(README_TOOLS[0]["function"], indent=2)
    row = {"system": f"{preamble} Reply in one sentence.\n{fn}\n", "chat": "USER: Hi\n\n\nASSISTANT: Hello! <|endoftext|>"}
    out, counts = converted(row, "glaive")
    assert out["messages"][0] == {"role": "system", "content": "Reply in one sentence."}
    assert counts == {"glaive_preamble": 1, "tool_list": 1}


@pytest.mark.parametrize("k", [0, 1])
def test_hermes_few_shot_glaive_like_preambles(k):
    """The SYSTEM lines of Hermes-Function-Calling's few_shot.json ("… access to functions. Use them if required")."""
    example = orjson.loads((DATA / "realdata" / "hermes" / "NousResearch_Hermes-Function-Calling__few_shot.json")
                           .read_bytes())[k]["example"]
    system = example.split("SYSTEM: ", 1)[1].split("\nUSER:", 1)[0]
    row = hermes_row(system.replace("calculate_distance", "get_stock_fundamentals", 1))
    # the call fits the schema it now names (a call against its schema is rejected: test_tool_call_checks.py)
    row["conversations"][2]["value"] = README_CALL.replace("{'symbol': 'TSLA'}",
                                                           "{'origin': 'a', 'destination': 'b', 'mode': 'car'}")
    out, counts = converted(row)
    assert out["messages"][0]["role"] == "user"
    assert counts == {"glaive_preamble": 1, "tool_list": 1}


# --- data-genie: OpenAI-style calls as JSON text ------------------------------------------------------------------


def test_data_genie_sharegpt_example_converts_with_its_calls_and_results():
    recs = orjson.loads((DATA / "realdata" / "hermes" / "data-genie__sharegpt_example.json").read_bytes())
    first, counts = converted(recs[0])
    msgs = first["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert msgs[1]["tool_calls"] == [
        {"id": "call_ur6F46uLbvxHgpOuoSMqURF9", "type": "function", "function": {
            "name": "get_current_weather", "arguments": {"location": "San Francisco, CA", "unit": "fahrenheit"}}},
        {"id": "call_PHxjfJx29UbQXSQS5G3ZXoLz", "type": "function", "function": {
            "name": "get_n_day_weather_forecast",
            "arguments": {"location": "San Francisco, CA", "format": "fahrenheit", "num_days": 5}}}]
    # the tool turns' JSON is broken (no quote closes the id): read anyway, and paired by id
    assert msgs[2] == {"role": "tool", "name": "get_current_weather", "tool_call_id": "call_ur6F46uLbvxHgpOuoSMqURF9",
                       "content": '{"location":"San Francisco","temperature":"72","unit":"fahrenheit"}'}
    assert msgs[3]["tool_call_id"] == "call_PHxjfJx29UbQXSQS5G3ZXoLz"
    assert json.loads(msgs[3]["content"])["forecast"][4] == {
        "date": "2023-12-31", "temperature": "74", "unit": "fahrenheit", "description": "Partly Cloudy"}
    assert msgs[4]["content"].startswith("The current weather in San Francisco is 72°F.")
    assert [t["function"]["name"] for t in first["tools"]] == ["get_current_weather", "get_n_day_weather_forecast"]
    assert counts == {"tool_list": 1}
    second, _ = converted(recs[1])
    assert [c["function"]["name"] for c in second["messages"][1]["tool_calls"]] == ["search_duckduckgo"]
    assert second["messages"][2]["tool_call_id"] == "call_01"
    assert [t["function"]["name"] for t in second["tools"]] == ["search_duckduckgo", "get_related_topics",
                                                                  "get_instant_answer"]


@pytest.mark.parametrize("text, calls", [
    # type outside function, arguments as a JSON string, one object instead of a list
    ('[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]',
     [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]),
    ('{"function": {"name": "f", "arguments": {}, "type": "function"}}',
     [{"type": "function", "function": {"name": "f", "arguments": {}}}]),
    ('  [{"function": {"name": "f", "arguments": {"a": [1]}}}, {"function": {"name": "g", "arguments": {}}}]\n',
     [{"type": "function", "function": {"name": "f", "arguments": {"a": [1]}}},
      {"type": "function", "function": {"name": "g", "arguments": {}}}]),
])
def test_json_call_lists(text, calls):
    assert json_calls(text, 0) == calls


@pytest.mark.parametrize("text", [
    '[{"name": "f", "arguments": {}}]',  # bare calls: an answer that happens to be JSON
    '[{"function": "f"}]',
    '[{"function": {"name": "f"}}]',  # no arguments
    '[{"function": {"name": "f", "arguments": 1}}]',
    '[{"function": {"name": "f", "arguments": {}}, "score": 0.9}]',  # a key no call has
    '[{"type": "tool", "function": {"name": "f", "arguments": {}}}]',
    '[{"function": {"name": "f", "arguments": {}}}, 3]',
    "[]", '{"function": {}}', "The function [x] {y}", '[{"function": {"name": "", "arguments": {}}}]',
    'Here: [{"function": {"name": "f", "arguments": {}}}]',  # not the whole text
])
def test_json_that_only_looks_like_calls_stays_content(text):
    assert json_calls(text, 0) is None
    rec = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": text}]}
    assert convert(rec)[0]["messages"][1]["content"] == text


def test_result_wrappers():
    assert result_wrapper('{"tool_call_id": "c1", "name": "f", "content": {"a": 1}}') == ('{"a":1}', "f", "c1")
    assert result_wrapper('{"tool_call_id": "c1", "content": "ok"}') == ("ok", None, "c1")
    assert result_wrapper('{"tool_call_id": "c1, "name": "f", "content": "x"}') == ("x", "f", "c1")
    assert result_wrapper('{"name": "f", "content": "x"}') is None  # a tool's own JSON result: no id, kept
    assert result_wrapper('{"tool_call_id": "c1", "content": 1, "status": 200}') is None


def test_a_bad_call_in_a_json_call_list_is_rejected():
    rec = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "gpt", "value": '[{"function": {"name": "f", "arguments": "{bad"}}]'}]}
    with pytest.raises(RecordError) as info:
        convert(rec)
    assert info.value.code is Reason.BAD_ARGUMENTS_JSON and info.value.message_index == 1


# --- the patterns on their own, and the counts in convert-dataset ------------------------------------------------


def test_strip_tool_prompt_leaves_other_text_alone():
    own = "  Indented code stays:\n    def f():  return 1\n\n\n\nThree blank lines stay when nothing is removed. "
    counts: dict = {}
    assert strip_tool_prompt(own, counts) == own and counts == {}
    names = {name for name, _ in PROMPT_PATTERNS}
    assert names == {"hermes_role", "tools_intro", "may_call", "no_assumptions", "results_format", "call_format",
                     "call_template", "qwen_header", "glaive_preamble"}


def test_convert_cli_counts_stripped_tool_prompt(tmp_path, capsys):
    from beam_sft.cli import convert as cli

    src = tmp_path / "tools.jsonl"
    rows = [hermes_row(prompt("hermes2pro_function_calling.txt")), qwen_record(prompt("qwen3_rendered.txt")),
            json.loads(prompt("glaive_v2_row.json")),
            # rejected: its counts must not be added
            hermes_row(prompt("hermes2pro_function_calling.txt") + "\n<tool_call>\n{\"name\": \"f\", "
                       "\"arguments\": {}}\n</tool_call>")]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = tmp_path / "stats.json"
    assert cli.main([str(src), "-o", str(tmp_path / "out.jsonl"), "--stats", str(stats),
                     "--missing_reasoning", "keep"]) == 0
    got = json.loads(stats.read_text())
    assert got["records_out"] == 3 and got["rejected"] == {"tool_markup_in_text": 1}
    assert got["stripped_tool_prompt"] == {
        "tool_list": 3, "call_format": 2, "call_template": 2, "may_call": 2, "tools_intro": 3, "hermes_role": 1,
        "no_assumptions": 1, "pydantic_schema": 1, "qwen_header": 1, "glaive_preamble": 1}
    assert "stripped_tool_prompt" not in json.dumps(got["policy"])
    assert "tool prompt removed" in capsys.readouterr().err
    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        no_tags(json.loads(line))


def test_a_json_call_list_in_an_openai_assistant_message_is_calls():
    said = '[{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}}]'
    rec = {"messages": [{"role": "user", "content": "Oslo?"},
                        {"role": "assistant", "reasoning_content": "Look it up.", "content": said},
                        {"role": "tool", "tool_call_id": "c1", "content": "9 C"},
                        {"role": "assistant", "reasoning_content": "Done.", "content": "9 °C."}],
           "tools": [WEATHER]}
    out, _ = converted(rec, "openai")
    assert out["messages"][1] == {"role": "assistant", "reasoning_content": "Look it up.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}
    assert out["messages"][2] == {"role": "tool", "name": "get_weather", "tool_call_id": "c1", "content": "9 C"}
    rec["messages"][1]["content"] = "\n " + said  # blanks around the list: still the whole text
    assert converted(rec, "openai")[0] == out


def test_a_json_call_turn_keeps_its_reasoning_field_and_validate_ignores_a_foreign_stripped_key():
    rec = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "gpt", "reasoning_content": "Call f.",
                              "value": '[{"function": {"name": "f", "arguments": {}}}]'}], "tools": [{"name": "f"}]}
    assert convert(rec)[0]["messages"][1] == {"role": "assistant", "reasoning_content": "Call f.", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}]}
    counters: dict = {}
    beam = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "_stripped": ["not", "a", "dict"]}
    assert validate(beam, None, counters)["messages"][1]["content"] == "a"
    assert not any(k.startswith(STRIPPED_PREFIX) for k in counters)
