"""ShareGPT-shaped records → Beam records: role vocabularies, glaive-style tools and calls, think tags, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.sharegpt import ASSISTANT_ROLES, RESULT_ROLES, USER_ROLES
from beam_sft.records.files import expand_inputs, iter_items
from beam_sft.validate.convert import convert, detect
from beam_sft.validate.rules import make_render_check


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """These tests are about what the converters make; the missing-reasoning policy (default `mask`) has its
    own tests (test_validate.py, test_reasoning_policy.py), so here turns without reasoning are kept."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep"))

REALDATA = Path(__file__).parent / "data" / "realdata" / "sharegpt"
RENDER = make_render_check()


def conv(rec):
    out = convert(rec, "sharegpt")[0]
    RENDER(out)
    return out


def rejected(rec) -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, "sharegpt")
    return info.value


@pytest.mark.parametrize("user", sorted(USER_ROLES))
@pytest.mark.parametrize("assistant", sorted(ASSISTANT_ROLES))
def test_every_role_name_maps(user, assistant):
    out = conv({"conversations": [{"from": user.upper() if user == "human" else user, "value": "hi"},
                                  {"from": assistant, "value": "<think>greet</think>hello"}]})
    assert out["messages"] == [{"role": "user", "content": "hi"},
                               {"role": "assistant", "reasoning_content": "greet", "content": "hello"}]


def test_role_content_keys_and_messages_column_and_top_level_system():
    rec = {"system": "Be kind.", "messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "<thinking>x</thinking>hey"}]}
    out = conv(rec)
    assert out["messages"][0] == {"role": "system", "content": "Be kind."}
    assert out["messages"][2]["reasoning_content"] == "x"


def test_glaive_tools_string_function_call_and_observation():
    tools = [{"name": "get_rate", "description": "rate", "parameters": {"type": "object", "properties": {
        "base": {"type": "string"}}, "required": ["base"]}}]
    rec = {"tools": json.dumps(tools), "conversations": [
        {"from": "human", "value": "USD rate?"},
        {"from": "gpt", "value": "<think>look it up</think>"},
        {"from": "function_call", "value": json.dumps({"name": "get_rate", "arguments": {"base": "USD"}})},
        {"from": "observation", "value": json.dumps({"rate": 0.9})},
        {"from": "gpt", "value": "<think>report</think>It is 0.9."},
    ]}
    out = conv(rec)
    assert out["tools"] == [{"type": "function", "function": tools[0]}]
    m = out["messages"]
    # the reasoning turn and the call turn are one assistant message
    assert m[1] == {"role": "assistant", "reasoning_content": "look it up", "tool_calls": [
        {"type": "function", "function": {"name": "get_rate", "arguments": {"base": "USD"}}}]}
    assert m[2] == {"role": "tool", "name": "get_rate", "content": '{"rate": 0.9}'}
    assert len(m) == 4


@pytest.mark.parametrize("result_role", sorted(RESULT_ROLES))
def test_parallel_calls_as_a_list_and_result_roles(result_role):
    calls = [{"name": "w", "arguments": {"city": "A"}}, {"name": "w", "arguments": json.dumps({"city": "B"})}]
    rec = {"conversations": [
        {"from": "human", "value": "A and B?"},
        {"from": "function_call", "value": calls},  # already decoded, not a string
        {"from": result_role, "value": "1"},
        {"from": result_role, "value": {"t": 2}},
        {"from": "gpt", "value": "<think>r</think>1 and 2"},
    ], "tools": [{"name": "w"}]}
    m = conv(rec)["messages"]
    assert [c["function"]["arguments"] for c in m[1]["tool_calls"]] == [{"city": "A"}, {"city": "B"}]
    assert [(t["name"], t["content"]) for t in m[2:4]] == [("w", "1"), ("w", '{"t":2}')]


def test_rejections_name_the_turn():
    err = rejected({"conversations": [{"from": "human", "value": "x"}, {"from": "narrator", "value": "y"}]})
    assert err.code is Reason.UNKNOWN_ROLE and err.message_index == 1
    err = rejected({"conversations": []})
    assert err.code is Reason.EMPTY_CONVERSATION
    err = rejected({"conversations": [{"from": "human", "value": "x"}, {"from": "observation", "value": "{}"},
                                      {"from": "gpt", "value": "y"}]})
    assert err.code is Reason.TOOL_RESULT_WITHOUT_CALL and err.message_index == 1
    err = rejected({"conversations": [{"from": "human", "value": "x"},
                                      {"from": "function_call", "value": "{\"name\": \"f\", \"arguments\": "}]})
    assert err.code is Reason.BAD_ARGUMENTS_JSON and err.message_index == 1
    # with a record-level system prompt, indexes still name the turn in `conversations`
    err = rejected({"system": "s", "conversations": [{"from": "human", "value": "x"}, {"from": "human", "value": "y"},
                                                     {"from": "tool", "value": "z"}]})
    assert err.code is Reason.TOOL_RESULT_WITHOUT_CALL and err.message_index == 2
    err = rejected({"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": ""}]})
    assert err.code is Reason.BAD_CONTENT and err.message_index == 1


def test_detect_sharegpt_shapes():
    assert detect({"conversations": []}) == "sharegpt"
    assert detect({"messages": [{"from": "human", "value": "x"}]}) == "sharegpt"


# --- the real third-party files -------------------------------------------------------------------------


def _convert_file(path: Path):
    ok, rejects = [], []
    for item in iter_items(expand_inputs([str(path)])):
        try:
            out = convert(item.payload, "auto")[0]
            RENDER(out)
            ok.append((item.position, out))
        except RecordError as err:
            assert err.message
            rejects.append((item.position, err))
    return ok, rejects


@pytest.mark.parametrize("path", sorted(REALDATA.iterdir()), ids=lambda p: p.name)
def test_real_files_convert_or_reject_with_reason(path):
    n_in = sum(1 for _ in iter_items(expand_inputs([str(path)])))
    ok, rejects = _convert_file(path)
    assert len(ok) + len(rejects) == n_in > 0


def test_real_glaive_zh_malformed_tail_records_and_calls_against_their_schema_are_the_only_rejections():
    ok, rejects = _convert_file(REALDATA / "llamafactory_glaive_toolcall_zh_demo.json")
    # 5: calculate_area's dimensions without the schema's required radius (a rectangle); 21: search_books called
    # with an author only, where the schema requires keywords
    assert [(i, e.code, e.message_index) for i, e in rejects] == [
        (5, Reason.ARGUMENTS_BREAK_SCHEMA, 1), (21, Reason.ARGUMENTS_BREAK_SCHEMA, 5),
        (60, Reason.TOOL_RESULT_WITHOUT_CALL, 2), (61, Reason.TOOL_RESULT_WITHOUT_CALL, 2)]
    assert "lacks the required 'radius'" in rejects[0][1].message
    assert len(ok) == 58


def test_real_glaive_en_calls_and_empty_tool_lists():
    ok, rejects = _convert_file(REALDATA / "llamafactory_glaive_toolcall_en_demo.json")
    assert not rejects and len(ok) == 100
    with_tools = sum(1 for _, r in ok if "tools" in r)
    assert with_tools == 59  # 41 records carry the literal "[]"
    calls = [c for _, r in ok for m in r["messages"] for c in m.get("tool_calls") or []]
    assert calls and all(isinstance(c["function"]["arguments"], dict) for c in calls)


def test_real_preference_and_empty_turn_records_are_rejected():
    ok, rejects = _convert_file(REALDATA / "llamafactory_dpo_en_demo.json")
    assert not ok and len(rejects) == 30 and {e.code for _, e in rejects} == {Reason.UNKNOWN_FORMAT}
    ok, rejects = _convert_file(REALDATA / "axolotl_conversation.missingturns.json")
    assert [(e.code, e.message_index) for _, e in rejects] == [(Reason.BAD_CONTENT, 1)]


def test_real_fastchat_with_optional_system_key():
    ok, rejects = _convert_file(REALDATA / "fastchat_dummy_conversation_with_system.json")
    assert not rejects
    assert sum(1 for _, r in ok if r["messages"][0]["role"] == "system") == 6
