"""Alpaca instruction rows and TRL's prompt/completion rows → Beam records (beam_sft.formats.alpaca,
beam_sft.formats.prompt_completion): detection, the reject reasons of each, the real Alpaca samples
(tests/data/realdata/alpaca, LLaMA-Factory's demos; Hammer's masking example), `format_shapes`, and
`beam-sft convert` / `beam-sft prepare` reading them by `auto` and by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from beam_sft.errors import Reason, RecordError
from beam_sft.records.files import read_items
from beam_sft.validate.convert import FORMATS, convert, convert_item, detect, format_shapes
from beam_sft.validate.rules import Options, make_render_check

REPO = Path(__file__).resolve().parents[1]
REALDATA = REPO / "tests" / "data" / "realdata"
RENDER = make_render_check()
KEEP = Options(missing_reasoning="keep")  # Alpaca data has no reasoning: kept here, masked by default
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def conv(rec, fmt="auto", options=KEEP):
    out, name = convert(json.loads(json.dumps(rec)), fmt, options)
    RENDER(out)
    return out, name


def rejected(rec, fmt="auto", options=KEEP) -> RecordError:
    with pytest.raises(RecordError) as info:
        convert(rec, fmt, options)
    return info.value


# --- Alpaca --------------------------------------------------------------------------------------------------------


def test_alpaca_row_with_input_system_history_and_think_block():
    rec = {"system": "Be brief.", "instruction": "Translate.", "input": "Bonjour",
           "output": "<think>French greeting.</think>Hello", "history": [["Hi", "Hello!"]]}
    out, name = conv(rec)
    assert name == "alpaca" and detect(rec) == "alpaca"
    assert out["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "", "content": "Hello!"},
        {"role": "user", "content": "Translate.\nBonjour"},  # LLaMA-Factory's join
        {"role": "assistant", "reasoning_content": "French greeting.", "content": "Hello"}]
    # by default the turn without reasoning is masked, the reasoned one trains
    out, _ = conv(rec, "alpaca", None)
    assert [m.get("weight") for m in out["messages"] if m["role"] == "assistant"] == [0, None]


def test_alpaca_history_is_not_taken_for_openai_messages():
    # an empty `history` used to make the row an (empty) OpenAI conversation
    assert detect({"instruction": "q", "input": "", "output": "a", "history": []}) == "alpaca"


@pytest.mark.parametrize(("rec", "code", "words"), [
    ({"instruction": "q", "output": "   "}, Reason.EMPTY_COMPLETION, "'output' is empty"),
    ({"instruction": "q", "output": ["good", "bad"]}, Reason.UNKNOWN_FORMAT, "a preference pair"),
    ({"instruction": "", "input": "", "output": "a"}, Reason.BAD_CONTENT, "no prompt for the output"),
    ({"instruction": 5, "output": "a"}, Reason.BAD_CONTENT, "'instruction' is an integer, not a string"),
    ({"instruction": "q", "output": "a", "history": [["only one"]]}, Reason.BAD_CONTENT,
     "history[0] is a list (['only one']), not an [instruction, answer] pair"),
    ({"instruction": "q", "output": "a", "history": [["q0", ""]]}, Reason.EMPTY_COMPLETION,
     "the answer of history[0] is empty"),
])
def test_alpaca_rejects_name_what_is_wrong(rec, code, words):
    err = rejected(rec)
    assert err.code is code and words in err.message, err


def test_alpaca_named_format_on_a_row_without_instruction_lists_its_keys():
    err = rejected({"question": "q", "answer": "a"}, "alpaca")
    assert err.code is Reason.UNKNOWN_FORMAT and "needs 'instruction' (keys: answer, question)" in err.message


# --- TRL prompt/completion ----------------------------------------------------------------------------------------


def test_conversational_prompt_completion_with_tools_trains_only_the_completion():
    rec = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Weather in Oslo?"}],
           "completion": [{"role": "assistant", "reasoning_content": "Need the tool.",
                           "tool_calls": [{"type": "function", "function": {"name": "weather",
                                                                            "arguments": '{"city": "Oslo"}'}}]},
                          {"role": "tool", "content": "cold"},
                          {"role": "assistant", "reasoning_content": "Say it.", "content": "Cold."}],
           "tools": [WEATHER]}
    out, name = conv(rec, options=None)
    assert name == "prompt_completion" and detect(rec) == "prompt_completion"
    m = out["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert m[2]["weight"] == 0  # the prompt's answer is context, as TRL's completion_only_loss has it
    assert "weight" not in m[4] and m[4]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert m[5] == {"role": "tool", "name": "weather", "content": "cold"}
    assert out["tools"][0]["function"]["name"] == "weather"


def test_plain_prompt_completion_is_one_user_and_one_assistant_turn():
    out, name = conv({"prompt": "2+2?", "completion": "<think>add</think>4"}, options=None)
    assert name == "prompt_completion"
    assert out["messages"] == [{"role": "user", "content": "2+2?"},
                               {"role": "assistant", "reasoning_content": "add", "content": "4"}]


@pytest.mark.parametrize(("rec", "code", "index", "words"), [
    ({"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "user", "content": "a"}]},
     Reason.COMPLETION_NOT_ASSISTANT, 1, "completion[0] is a user message"),
    ({"prompt": [{"role": "user", "content": "q"}],
      "completion": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "more?"}]},
     Reason.COMPLETION_NOT_ASSISTANT, 2, "completion[1] is a user message"),
    ({"prompt": "q", "completion": []}, Reason.EMPTY_COMPLETION, None, "'completion' is empty"),
    ({"prompt": "q", "completion": ""}, Reason.EMPTY_COMPLETION, 1, "assistant turns are empty"),
    ({"prompt": "q", "completion": 7}, Reason.BAD_CONTENT, None,
     "'completion' is an integer, not a string or a list of messages"),
    ({"prompt": "q", "completion": "a", "label": False}, Reason.UNKNOWN_FORMAT, None, "undesirable"),
])
def test_prompt_completion_rejects_name_what_is_wrong(rec, code, index, words):
    err = rejected(rec)
    assert (err.code, err.message_index) == (code, index) and words in err.message, err


# --- real samples ----------------------------------------------------------------------------------------------------


def _read(path: Path, options: Options | None) -> list[tuple]:
    return [convert_item(item, "auto", options) for item in read_items([str(path)])]


def test_real_alpaca_samples_convert_as_alpaca():
    results = _read(REALDATA / "alpaca", KEEP)
    assert len(results) == 30 and {name for _, name, _ in results} == {"alpaca"}
    crepes = results[0][0]["messages"]  # alpaca_en_demo's first row: no input
    assert crepes[0] == {"role": "user", "content": "Describe a process of making crepes."}
    assert crepes[1]["content"].startswith("Making crepes is an easy and delicious process!")
    with_input = [r for r, _, _ in results if "\n" in r["messages"][0]["content"]]
    assert len(with_input) >= 5  # the 5 rows with an `input`: instruction, newline, input
    for rec, _, _ in results:
        RENDER(rec)
    # as training reads them by default: no reasoning anywhere, so nothing to train (backfill fills it in)
    assert {err["reason"] for _, _, err in _read(REALDATA / "alpaca", None)} == {"nothing_to_train"}
    hammer = _read(REALDATA / "xlam_like" / "Hammer__train_masking_sft_data_example.json", KEEP)
    assert len(hammer) == 10 and {name for _, name, _ in hammer} == {"alpaca"}


def test_format_shapes_name_every_format_once():
    lines = format_shapes()
    assert [line.split(":", 1)[0] for line in lines] == list(FORMATS)
    by_name = dict(line.split(": ", 1) for line in lines)
    assert "instruction" in by_name["alpaca"] and '"completion"' in by_name["prompt_completion"]
    assert '"conversations"' in by_name["sharegpt"] and '"messages"' in by_name["openai"]


# --- the commands ------------------------------------------------------------------------------------------------


def test_convert_reads_both_formats_by_auto_and_by_name(tmp_path):
    src = tmp_path / "mine.jsonl"
    rows = [{"instruction": "Add.", "input": "2 2", "output": "<think>2+2</think>4"},
            {"prompt": [{"role": "user", "content": "Hi"}],
             "completion": [{"role": "assistant", "reasoning_content": "greet", "content": "Hello"}]},
            {"prompt": "q", "completion": [{"role": "user", "content": "not the assistant"}]}]
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    out, stats, rejects = tmp_path / "out.jsonl", tmp_path / "s.json", tmp_path / "rej.jsonl"
    cmd = [sys.executable, "-m", "beam_sft", "convert", str(src), "-o", str(out), "--stats", str(stats),
           "--rejects", str(rejects), "-q"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(stats.read_text())
    assert st["formats"] == {"alpaca": 1, "prompt_completion": 1}
    assert st["rejected"] == {"completion_not_assistant": 1}
    reject = json.loads(rejects.read_text())
    assert reject["line"] == 3 and reject["message_index"] == 1
    # by name: the Alpaca row alone
    (tmp_path / "a.jsonl").write_bytes(orjson.dumps(rows[0]) + b"\n")
    proc = subprocess.run([*cmd[:4], str(tmp_path / "a.jsonl"), "-o", str(out), "--dataset_format", "alpaca",
                           "--stats", str(stats), "-q"], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(stats.read_text())["formats"] == {"alpaca": 1}
    assert [json.loads(line)["messages"][1]["reasoning_content"] for line in out.read_text().splitlines()] == ["2+2"]


def test_prepare_trains_on_alpaca_rows_through_the_registry(tmp_path, capsys):
    from beam_sft.cli import main

    src = tmp_path / "alpaca.json"
    src.write_text(json.dumps([{"instruction": f"Add {i} and 1.", "input": "", "output": f"<think>sum</think>{i + 1}"}
                               for i in range(4)]))
    out = tmp_path / "prep"
    assert main(["prepare", str(src), "-o", str(out), "--dataset_format", "alpaca", "--max_length", "256", "-q"]) == 0
    counts = json.loads((out / "beam_sft_manifest.json").read_text())["counts"]
    assert counts["records_in"] == counts["records_kept"] == 4 and counts["supervised_tokens"] > 0
    capsys.readouterr()
