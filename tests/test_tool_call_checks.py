"""What eval scores as a failure is checked at conversion (beam_sft.validate.calls): a call to a tool the record does
not declare, a call in a record that declares none, arguments that break the tool's schema (type, required, enum),
a turn the source gave no text, a conversation the assistant opens. Each has its own reason; `tool_call_checks`
keeps them instead (`beam-sft convert --tool_call_checks keep`, DataArguments → DataSettings → the validator).
The real samples' counts are the table of docs/data.md#calls-checked-against-their-tools."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from beam_sft.errors import Reason, RecordError
from beam_sft.records.files import read_items
from beam_sft.validate.calls import schema_error
from beam_sft.validate.convert import convert, convert_item
from beam_sft.validate.rules import Options, make_render_check

REPO = Path(__file__).resolve().parents[1]
REALDATA = REPO / "tests" / "data" / "realdata"
RENDER = make_render_check()
NEW = {"undeclared_tool", "no_tools_declared", "arguments_break_schema", "turn_without_text", "assistant_first"}
SCHEMA = {"type": "object", "properties": {
    "x": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]},
    "where": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["x"]}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]


def record(args, name="f", tools=TOOLS):
    rec = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "reasoning_content": "r", "tool_calls": [
                            {"type": "function", "function": {"name": name, "arguments": args}}]},
                        {"role": "tool", "content": "ok"},
                        {"role": "assistant", "reasoning_content": "r", "content": "done"}]}
    if tools is not None:
        rec["tools"] = tools
    return rec


def rejected(rec, fmt="openai", **opts) -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, fmt, Options(**opts))
    return info.value


def test_a_call_that_fits_its_schema_is_kept():
    out, _ = convert(record({"x": 2, "unit": "c", "where": {"city": "Oslo"}, "tags": ["a"]}), "openai")
    RENDER(out)
    assert out["messages"][1]["tool_calls"][0]["function"]["arguments"]["x"] == 2
    convert(record({"x": 2.0}), "openai")  # eval's integer: 2.0 is one


@pytest.mark.parametrize(("args", "words"), [
    ({"x": "notint"}, "arguments.x is a string ('notint'), the schema says integer"),
    ({"x": True}, "arguments.x is a boolean (True), the schema says integer"),
    ({"x": 1.5}, "arguments.x is a number (1.5), the schema says integer"),
    ({}, "arguments lacks the required 'x'"),
    ({"x": 1, "unit": "k"}, "arguments.unit is 'k', not one of the enum ['c', 'f']"),
    ({"x": 1, "where": {}}, "arguments.where lacks the required 'city'"),
    ({"x": 1, "tags": ["a", 2]}, "arguments.tags[1] is an integer (2), the schema says string"),
])
def test_arguments_that_break_the_schema(args, words):
    err = rejected(record(args))
    assert err.code is Reason.ARGUMENTS_BREAK_SCHEMA and err.message_index == 1
    assert err.message == f"call 'f': {words}"


def test_schema_checker_reads_only_its_keywords():
    assert schema_error(3, {"type": ["string", "integer"]}, "a") is None
    assert schema_error(3, {"type": "number"}, "a") is None
    assert schema_error(None, {"type": "null"}, "a") is None
    assert schema_error("x", {"type": "any"}, "a") is None  # a type name JSON Schema does not have: any value
    assert schema_error(1.0, {"enum": [1]}, "a") is None and schema_error(True, {"enum": [1]}, "a")
    assert schema_error({"k": 1}, {"type": "object"}, "a") is None  # no properties: anything inside


def test_a_call_to_an_undeclared_tool():
    err = rejected(record({"x": 1}, name="g"))
    assert (err.code, err.message_index) == (Reason.UNDECLARED_TOOL, 1)
    assert err.message == "call 'g' names no declared tool (declared: f)"


def test_a_hermes_call_with_tools_null():
    rec = {"conversations": [
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "gpt", "value": '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'},
        {"from": "tool", "value": "<tool_response>\ncold\n</tool_response>"},
        {"from": "gpt", "value": "<think>say it</think>Cold."}], "tools": None}
    err = rejected(rec, "auto")
    assert (err.code, err.message_index) == (Reason.NO_TOOLS_DECLARED, 1)
    assert "call 'weather' in a record that declares no tools" in err.message


def test_a_sharegpt_turn_without_value_and_an_openai_message_without_content():
    rec = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "<think>r</think>Hello"},
                             {"from": "human"}, {"from": "gpt", "value": "<think>r</think>Yes?"}]}
    err = rejected(rec, "sharegpt")
    assert (err.code, err.message_index) == (Reason.TURN_WITHOUT_TEXT, 2)
    assert "no 'value' or 'content'" in err.message
    # an empty string is text the source gave: not this rule
    rec["conversations"][2]["value"] = ""
    assert convert(rec, "sharegpt")[0]["messages"][2] == {"role": "user", "content": ""}
    err = rejected({"messages": [{"role": "user", "content": None},
                                 {"role": "assistant", "reasoning_content": "r", "content": "a"}]})
    assert (err.code, err.message_index) == (Reason.TURN_WITHOUT_TEXT, 0)


def test_a_conversation_the_assistant_opens():
    err = rejected({"messages": [{"role": "system", "content": "s"},
                                 {"role": "assistant", "reasoning_content": "r", "content": "Hi, how can I help?"},
                                 {"role": "user", "content": "q"},
                                 {"role": "assistant", "reasoning_content": "r", "content": "a"}]})
    assert (err.code, err.message_index) == (Reason.ASSISTANT_FIRST, 1)


def test_keep_keeps_each_and_counts_it():
    cases = [record({"x": "notint"}), record({"x": 1}, name="g"), record({"x": 1}, tools=None),
             {"conversations": [{"from": "human"}, {"from": "gpt", "value": "<think>r</think>a"}]},
             {"messages": [{"role": "assistant", "reasoning_content": "r", "content": "a"}]}]
    counters: dict = {}
    for rec in cases:
        out, _ = convert(rec, "auto", Options(tool_call_checks="keep"), counters)
        RENDER(out)
    assert counters == {"kept:arguments_break_schema": 1, "kept:undeclared_tool": 1, "kept:no_tools_declared": 1,
                        "kept:turn_without_text": 1, "kept:assistant_first": 1}
    with pytest.raises(ValueError, match="tool_call_checks must be one of"):
        Options(tool_call_checks="warn")


def test_content_of_the_wrong_type_says_what_it_is():
    err = rejected({"messages": [{"role": "user", "content": 5},
                                 {"role": "assistant", "reasoning_content": "r", "content": "a"}]})
    assert err.message == "content is an integer, expected a string or a list of parts"
    err = rejected({"messages": {"role": "user"}})
    assert err.message == "messages is an object, not a list"


# --- the setting, from the command line and the data settings ----------------------------------------------------


def test_data_settings_carry_the_policy():
    from beam_sft.dataset.arguments import DataArguments, PrepareArguments, data_settings
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.errors import UsageError

    run = PrepareArguments(output="x")
    assert data_settings(DataArguments(), run).tool_call_checks == "reject"
    assert data_settings(DataArguments(tool_call_checks="keep"), run).tool_call_checks == "keep"
    with pytest.raises(UsageError, match="unknown tool_call_checks 'warn'; choose one of reject, keep"):
        DataSettings(tool_call_checks="warn").check()


def _mistakes(tmp_path: Path) -> Path:
    src = tmp_path / "mine.jsonl"
    rows = [record({"x": 1}), record({"x": "notint"}), record({"x": 1}, name="g"), record({"x": 1}, tools=None)]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return src


def test_convert_rejects_by_default_and_keeps_with_the_switch(tmp_path):
    src, out, stats = _mistakes(tmp_path), tmp_path / "out.jsonl", tmp_path / "s.json"
    cmd = [sys.executable, "-m", "beam_sft", "convert", str(src), "-o", str(out), "--stats", str(stats), "-q",
           "--max_reject_share", "1"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(stats.read_text())
    assert st["records_out"] == 1
    assert st["rejected"] == {"arguments_break_schema": 1, "undeclared_tool": 1, "no_tools_declared": 1}
    assert "--tool_call_checks keep" in proc.stderr  # the switch that keeps them, named where they are counted
    proc = subprocess.run([*cmd, "--tool_call_checks", "keep"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(stats.read_text())
    assert st["records_out"] == 4 and st["rejected"] == {}
    assert {k: v for k, v in st["policy"].items() if k.startswith("kept:")} == {
        "kept:arguments_break_schema": 1, "kept:undeclared_tool": 1, "kept:no_tools_declared": 1}


def test_prepare_takes_the_setting(tmp_path, capsys):
    from beam_sft.cli import main

    src = _mistakes(tmp_path)
    for policy, kept in (("reject", 1), ("keep", 4)):
        out = tmp_path / policy
        assert main(["prepare", str(src), "-o", str(out), "--max_length", "256", "-q", "--tool_call_checks", policy,
                     "--max_reject_share", "1"]) == 0
        counts = json.loads((out / "beam_sft_manifest.json").read_text())["counts"]
        assert counts["records_kept"] == kept, policy
    capsys.readouterr()


# --- the real samples, re-measured -------------------------------------------------------------------------------

# docs/data.md#calls-checked-against-their-tools: every file of tests/data/realdata, format auto, default options.
MEASURED = {
    "harmony/openai_harmony_format_md_examples.jsonl": {"assistant_first": 5, "undeclared_tool": 1},
    "harmony/openai_harmony_test-data/test_does_not_drop_if_ongoing_analysis.txt": {"no_tools_declared": 1},
    "harmony/openai_harmony_test-data/test_streamable_parser.txt": {"assistant_first": 1},
    "openai/ollama_tools_messages.json": {"no_tools_declared": 1},
    "openai/openai_cookbook_toy_chat_fine_tuning.jsonl": {"assistant_first": 1},
    "openai/swe_agent_function_calling_simple.traj": {"no_tools_declared": 1},
    "openai/swe_agent_marshmallow-1867_function_calling_replace.traj": {"no_tools_declared": 1},
    "sharegpt/llamafactory_glaive_toolcall_zh_demo.json": {"arguments_break_schema": 2},
    "xlam_like/Hammer__test_original_apibank_l1.first8.json": {"arguments_break_schema": 1},
}


def test_real_samples_new_rejects_per_file():
    found, checked = {}, 0
    for path in sorted(p for p in REALDATA.rglob("*") if p.is_file() and not p.name.endswith(".md")):
        items = list(read_items([str(path)]))
        by_reason = Counter()
        for item in items:
            _, _, reject = convert_item(item, "auto", Options())
            if reject and reject["reason"] in NEW:
                by_reason[reject["reason"]] += 1
                # with the checks off, the same record converts (its turns without reasoning kept, as eval reads
                # them): the new rule is the only thing wrong with it
                kept, _, other = convert_item(item, "auto", Options(tool_call_checks="keep", missing_reasoning="keep"))
                assert kept is not None, other
                checked += 1
        if by_reason:
            found[str(path.relative_to(REALDATA))] = dict(by_reason)
    assert found == MEASURED
    assert checked == 15


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": [[]]}, None), ({"required": [[]], "properties": {"x": {"type": {"a": 1}}}}, None),
    ({"properties": [], "items": 3}, None), ({"type": "object", "required": "x"}, None),
    ({"enum": [{}, []]}, "arguments is {'x': [1]}, not one of the enum [{}, []]"),
])
def test_a_schema_of_any_json_never_raises_anything_but_a_reject(schema, why):
    # keywords holding what no schema should (found by tests/test_fuzz.py): ignored where they cannot apply
    assert schema_error({"x": [1]}, schema, "arguments") == why
