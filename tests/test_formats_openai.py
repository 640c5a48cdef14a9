"""OpenAI-shaped records → Beam records: unit cases for every accepted shape, and the real third-party files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from beam_sft.errors import Reason, RecordError
from beam_sft.records.files import expand_inputs, iter_items, parse_line
from beam_sft.validate.convert import convert, detect
from beam_sft.validate.rules import Options, make_render_check


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """These tests are about what the converters make; the missing-reasoning policy (default `mask`) has its
    own tests (test_validate.py, test_reasoning_policy.py), so here turns without reasoning are kept."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep"))

REALDATA = Path(__file__).parent / "data" / "realdata" / "openai"
RENDER = make_render_check()


def conv(rec, **opts):
    out = convert(rec, "openai", Options(**{"missing_reasoning": "keep", **opts}) if opts else None)[0]
    RENDER(out)  # everything a test accepts must render
    return out


def rejected(rec, **opts) -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, "openai", Options(**{"missing_reasoning": "keep", **opts}) if opts else None)
    return info.value


def call(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid:
        c["id"] = cid
    return c


def test_plain_conversation_keeps_order_and_reasoning_field_variants():
    for key in ("reasoning_content", "reasoning", "thinking"):
        rec = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello!", key: "Greeting."}]}
        out = conv(rec)
        assert out == {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                    {"role": "assistant", "reasoning_content": "Greeting.", "content": "Hello!"}]}


def test_content_parts_are_joined_and_other_parts_rejected():
    rec = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": [{"type": "output_text", "text": "c"}], "reasoning": "r"}]}
    out = conv(rec)
    assert out["messages"][0]["content"] == "ab"
    assert out["messages"][1]["content"] == "c"
    bad = {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                     {"type": "image_url", "image_url": {"url": "x"}}]},
                        {"role": "assistant", "content": "ok", "reasoning": "r"}]}
    err = rejected(bad)
    assert err.code is Reason.UNSUPPORTED_CONTENT_PART and err.message_index == 0
    assert "image_url" in err.message


def test_think_tags_in_content_become_reasoning():
    rec = {"messages": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}]}
    assert conv(rec)["messages"][1] == {"role": "assistant", "reasoning_content": "add them", "content": "4"}
    err = rejected({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>x"}]})
    assert err.code is Reason.BAD_CONTENT and err.message_index == 1


def test_tool_calls_with_string_or_dict_arguments_and_results_reordered_by_id():
    rec = {
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}}],
        "messages": [
            {"role": "user", "content": "London and Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "both",
             "tool_calls": [call("w", '{"city": "London"}', "a"), call("w", {"city": "Paris"}, "b")]},
            # results arrive out of order: the format matches by position, so they must be reordered
            {"role": "tool", "tool_call_id": "b", "content": "18 C"},
            {"role": "tool", "tool_call_id": "a", "content": "14 C"},
            {"role": "assistant", "content": "London 14, Paris 18.", "reasoning_content": "report"},
        ],
    }
    out = conv(rec)
    m = out["messages"]
    assert m[1]["tool_calls"] == [call("w", {"city": "London"}, "a"), call("w", {"city": "Paris"}, "b")]
    assert "content" not in m[1]
    assert [(t["tool_call_id"], t["name"], t["content"]) for t in m[2:4]] == [("a", "w", "14 C"), ("b", "w", "18 C")]
    assert out["tools"] == rec["tools"]


def test_content_with_tool_calls_is_folded_into_reasoning_and_counted():
    rec = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "need tool",
         "tool_calls": [call("w", "{}", "1")]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "say it"},
    ], "tools": [{"type": "function", "function": {"name": "w"}}]}
    counters: dict = {}
    from beam_sft.validate.convert import convert_raw
    from beam_sft.validate.rules import validate

    out = validate(convert_raw(rec, "openai")[0], None, counters)
    assert out["messages"][1]["reasoning_content"] == "need tool\n\nLet me check."
    assert "content" not in out["messages"][1]
    assert counters == {"folded_content": 1}
    RENDER(out)


def test_legacy_function_call_and_function_role():
    rec = {"functions": [{"name": "get_price", "parameters": {"type": "object", "properties": {}}}],
           "messages": [{"role": "user", "content": "price?"},
                        {"role": "assistant", "function_call": {"name": "get_price", "arguments": '{"s": "X"}'}},
                        {"role": "function", "name": "get_price", "content": "{\"p\": 1}"},
                        {"role": "assistant", "content": "It is 1."}]}
    out = conv(rec)
    assert out["tools"] == [{"type": "function", "function": rec["functions"][0]}]
    assert out["messages"][1]["tool_calls"] == [call("get_price", {"s": "X"})]
    assert out["messages"][2] == {"role": "tool", "name": "get_price", "content": "{\"p\": 1}"}
    assert out["messages"][1]["reasoning_content"] == ""  # kept, counted as missing reasoning


def test_bad_arguments_are_rejected_with_specific_codes():
    base = [{"role": "user", "content": "q"}]
    err = rejected({"messages": [*base, {"role": "assistant", "tool_calls": [call("f", "{not json")]}]})
    assert err.code is Reason.BAD_ARGUMENTS_JSON and err.message_index == 1
    err = rejected({"messages": [*base, {"role": "assistant", "tool_calls": [call("f", "[1, 2]")]}]})
    assert err.code is Reason.ARGUMENTS_NOT_OBJECT
    err = rejected({"messages": [*base, {"role": "assistant", "tool_calls": [call("f", json.dumps('{"a": 1}'))]}]})
    assert err.code is Reason.ARGUMENTS_NOT_OBJECT and "double-encoded" in err.message
    err = rejected({"messages": [*base, {"role": "assistant", "reasoning": "r",
                                         "tool_calls": [call("f", {"code": "x </rfl:parameter> y"})]}]})
    assert err.code is Reason.PARAMETER_CLOSE_TAG_IN_ARGUMENT


def test_preference_kto_and_image_records_are_rejected_not_half_converted():
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert rejected({"chosen_messages": msgs, "rejected_messages": msgs}).code is Reason.UNKNOWN_FORMAT
    assert rejected({"messages": msgs, "label": False}).code is Reason.UNKNOWN_FORMAT
    assert conv({"messages": msgs, "label": True})["messages"][1]["content"] == "a"
    assert rejected({"messages": msgs, "images": ["1.jpg"]}).code is Reason.UNSUPPORTED_CONTENT_PART


def test_llamafactory_v1_parts_with_parallel_calls_and_result_list():
    rec = {"tools": json.dumps([{"type": "function", "function": {"name": "area", "parameters": {
        "type": "object", "properties": {"r": {"type": "number"}}}}}]),
           "messages": [
               {"role": "user", "content": [{"type": "text", "value": "areas for 1 and 2"}]},
               {"role": "assistant", "content": [
                   {"type": "reasoning", "value": "two calls"},
                   {"type": "tool_call", "value": json.dumps({"name": "area", "arguments": {"r": 1}})},
                   {"type": "tool_call", "value": json.dumps({"name": "area", "arguments": {"r": 2}})}]},
               {"role": "tool", "content": [{"type": "text", "value": json.dumps([
                   {"tool_call_id": "x", "name": "area", "content": "3.14"}, {"r": 2, "area": 12.57}])}]},
               {"role": "assistant", "content": [{"type": "reasoning", "value": "done"},
                                                 {"type": "text", "value": "3.14 and 12.57"}]}]}
    out = conv(rec)
    m = out["messages"]
    assert [c["function"]["arguments"] for c in m[1]["tool_calls"]] == [{"r": 1}, {"r": 2}]
    assert [t["content"] for t in m[2:4]] == ["3.14", '{"r":2,"area":12.57}']
    assert m[4] == {"role": "assistant", "reasoning_content": "done", "content": "3.14 and 12.57"}


def test_detect_openai_shapes():
    assert detect({"messages": [{"role": "user", "content": "x"}]}) == "openai"
    assert detect({"history": [{"role": "user", "content": "x"}]}) == "openai"
    assert detect([{"role": "user", "content": "x"}]) == "openai"


# --- the real third-party files -------------------------------------------------------------------------


def _convert_file(path: Path):
    ok, rejects = [], []
    for item in iter_items(expand_inputs([str(path)])):
        try:
            rec = parse_line(item.payload) if item.raw else item.payload
            out = convert(rec, "auto")[0]
            RENDER(out)
            ok.append((item.position, out))
        except RecordError as err:
            assert err.code in Reason.__members__.values() and err.message
            rejects.append((item.position, err))
    return ok, rejects


@pytest.mark.parametrize("path", sorted(p for p in REALDATA.iterdir()), ids=lambda p: p.name)
def test_real_files_convert_or_reject_with_reason_and_everything_renders(path):
    n_in = sum(1 for _ in iter_items(expand_inputs([str(path)])))
    ok, rejects = _convert_file(path)
    assert len(ok) + len(rejects) == n_in > 0


def test_real_drone_double_encoded_arguments_rejected_exactly_on_lines_3_to_8():
    ok, rejects = _convert_file(REALDATA / "openai_cookbook_drone_training_2024-06-13.jsonl")
    assert sorted(line for line, _ in rejects) == [3, 4, 5, 6, 7, 8]
    assert {err.code for _, err in rejects} == {Reason.ARGUMENTS_NOT_OBJECT}
    assert len(ok) == 39
    # the trajectory ends at the call: the call itself is what gets trained
    assert all(r["messages"][-1]["tool_calls"] for _, r in ok)


def test_real_legacy_function_calls_and_swe_agent_trajectory():
    ok, rejects = _convert_file(REALDATA / "azure_stock_train_hallucination.jsonl")
    assert not rejects and len(ok) == 96
    assert sum(1 for _, r in ok if r["messages"][-1].get("tool_calls")) == 41
    assert all("tools" in r for _, r in ok)
    # the trajectory declares no tools: its calls are what eval scores as unknown tools
    ok, rejects = _convert_file(REALDATA / "swe_agent_function_calling_simple.traj")
    assert not ok and [(err.code, err.message_index) for _, err in rejects] == [(Reason.NO_TOOLS_DECLARED, 2)]
    from beam_sft.validate.rules import Options

    item = next(iter_items(expand_inputs([str(REALDATA / "swe_agent_function_calling_simple.traj")])))
    kept = convert(parse_line(item.payload) if item.raw else item.payload, "auto",
                   Options(missing_reasoning="keep", tool_call_checks="keep"))[0]
    msgs = kept["messages"]
    calls = [m for m in msgs if m.get("tool_calls")]
    assert len(calls) == 5
    # the agent's thought (its content next to the call) is kept as reasoning
    assert all(m["reasoning_content"] for m in calls)
    assert all(m["tool_call_id"] for m in msgs if m["role"] == "tool")


def test_real_llamafactory_v1_reasoning_tool_use_keeps_parallel_calls():
    ok, rejects = _convert_file(REALDATA / "llamafactory_v1_reason_tool_use_demo_50.jsonl")
    assert not rejects and len(ok) == 50
    parallel = [m for _, r in ok for m in r["messages"] if len(m.get("tool_calls") or []) > 1]
    assert len(parallel) == 12
    asst = [m for _, r in ok for m in r["messages"] if m["role"] == "assistant"]
    assert all(m["reasoning_content"] for m in asst)


def test_real_ollama_bare_message_list_is_one_conversation():
    ok, rejects = _convert_file(REALDATA / "ollama_tools_messages.json")
    # ollama's example declares its tool in the request, not in the messages: a call to no declared tool
    assert not ok and [(err.code, err.message_index) for _, err in rejects] == [(Reason.NO_TOOLS_DECLARED, 2)]
    from beam_sft.validate.rules import Options

    item = next(iter_items(expand_inputs([str(REALDATA / "ollama_tools_messages.json")])))
    msgs = convert(item.payload, "auto", Options(missing_reasoning="keep", tool_call_checks="keep"))[0]["messages"]
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"location": "Paris, France", "format": "celsius"}
    assert msgs[3] == {"role": "tool", "name": "get_current_weather",
                       "tool_call_id": "89a1e453-0bce-4de3-a456-c54bed09c520", "content": "22"}
    assert msgs[-1] == {"role": "user", "content": "What's the weather like today in San Francisco and Toronto?"}


def test_registry_works_inside_datasets_map(tmp_path):
    import datasets

    from beam_sft.records.files import beam_features
    from beam_sft.validate.convert import FORMATS, to_row, try_convert

    assert set(FORMATS) == {"openai", "sharegpt", "harmony", "hermes", "glaive", "xlam", "prompt_completion",
                            "alpaca"}
    rows = [{"messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "reasoning": "r", "tool_calls": [call("f", json.dumps(args))]}],
             "tools": tools}
            for args, tools in [({"a": 1}, [{"name": "f"}]), ({"b": {"c": [1]}}, [{"name": "f", "parameters": {}}])]]
    rows.append({"messages": [{"role": "user", "content": "no answer"}]})
    ds = datasets.Dataset.from_list([{"raw": json.dumps(r)} for r in rows])
    kept = ds.filter(lambda r: try_convert(json.loads(r["raw"]), "openai")[2] is None)
    out = kept.map(lambda r: to_row(convert(json.loads(r["raw"]), "openai")[0]), remove_columns=["raw"],
                   features=beam_features(), cache_file_name=str(tmp_path / "c.arrow"))
    assert len(out) == 2
    assert [row["messages"][1]["tool_calls"][0]["function"]["arguments"] for row in out] == [{"a": 1},
                                                                                           {"b": {"c": [1]}}]
    assert [row["tools"][0]["function"]["name"] for row in out] == ["f", "f"]
    for row in out:
        RENDER(row)


def test_error_indexes_name_the_input_message_after_a_result_list_was_split():
    rec = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "reasoning", "value": "r"},
                                          {"type": "tool_call", "value": json.dumps({"name": "f", "arguments": {}})},
                                          {"type": "tool_call", "value": json.dumps({"name": "f", "arguments": {}})}]},
        {"role": "tool", "content": [{"type": "text", "value": json.dumps(["1", "2"])}]},
        {"role": "assistant", "content": "ok", "reasoning": "r"},
        {"role": "user", "content": "bad <|end|>"},
    ]}
    err = rejected(rec)
    assert err.code is Reason.HARMONY_MARKER_IN_TEXT and err.message_index == 4


def test_a_plain_row_comes_out_as_it_went_in():
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    assert convert({"messages": copy.deepcopy(base)}, "openai")[0] == {"messages": base}


def test_the_missing_reasoning_policy_on_openai_rows():
    from beam_sft.validate.convert import convert
    from beam_sft.validate.rules import Options

    q = {"role": "user", "content": "q"}
    reasoned = {"role": "assistant", "content": "a", "reasoning_content": "r"}
    bare = {"role": "assistant", "content": "b"}
    called = {"role": "assistant", "content": None, "tool_calls": [call("f", "{}", "1")]}
    result = {"role": "tool", "tool_call_id": "1", "content": "x"}
    rec = {"messages": [q, bare, q, called, result, q, reasoned], "tools": [{"name": "f"}]}
    counts: dict = {}
    out = convert(copy.deepcopy(rec), "openai", Options(missing_reasoning="mask"), counts)[0]
    assert [m.get("weight") for m in out["messages"] if m["role"] == "assistant"] == [0, 0, None]
    assert [m["reasoning_content"] for m in out["messages"] if m["role"] == "assistant"] == ["", "", "r"]
    assert counts == {"masked_missing_reasoning": 2}
    counts = {}
    out = convert(copy.deepcopy(rec), "openai", Options(missing_reasoning="keep"), counts)[0]
    assert all("weight" not in m for m in out["messages"]) and counts == {"missing_reasoning": 2}
    with pytest.raises(RecordError) as info:
        convert(copy.deepcopy(rec), "openai", Options(missing_reasoning="reject"))
    assert info.value.code == Reason.MISSING_REASONING and info.value.message_index == 1
    # every turn masked: nothing to train
    with pytest.raises(RecordError) as info:
        convert({"messages": [q, bare]}, "openai", Options(missing_reasoning="mask"))
    assert info.value.code == Reason.NOTHING_TO_TRAIN
    # reasoning under another field name is read as reasoning
    out = convert({"messages": [q, {**bare, "thinking": "t"}]}, "openai", Options(missing_reasoning="keep"))[0]
    assert out["messages"][1]["reasoning_content"] == "t"


def test_auto_reads_each_record_as_the_format_detect_names():
    from beam_sft.validate.convert import convert, detect

    harmony_like = {"messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "channel": "final", "reasoning_content": "r", "content": "x"}]}
    sharegpt_like = {"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]}
    plain = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "reasoning_content": "r", "content": "x"}]}
    assert detect(harmony_like) != "openai" and detect(sharegpt_like) != "openai" and detect(plain) == "openai"
    for rec in (harmony_like, sharegpt_like, plain):
        try:
            assert convert(copy.deepcopy(rec), "auto")[1] == detect(rec)
        except RecordError:
            pass


def test_openai_fine_tuning_weights_are_kept_and_checked():
    rec = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a", "reasoning_content": "r", "weight": 0},
                        {"role": "user", "content": "q2"},
                        {"role": "assistant", "content": "b", "reasoning_content": "r", "train": True}]}
    out = convert(copy.deepcopy(rec), "openai")[0]
    assert [m.get("weight") for m in out["messages"] if m["role"] == "assistant"] == [0, 1]
    assert all("train" not in m for m in out["messages"])
    rec["messages"][0]["weight"] = 1
    with pytest.raises(RecordError) as info:
        convert(rec, "openai")
    assert info.value.code == Reason.BAD_WEIGHT and info.value.message_index == 0
