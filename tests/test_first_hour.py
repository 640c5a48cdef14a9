"""A user's first hour (issue 53): the README's tour on a small dataset of one's own, with the mistakes people make
planted in it, each answered by a message that says what happened and what to do, with the right exit status.

The user's data: 30 OpenAI records with a declared tool, 22 with reasoning and 8 plain tool calls without it
(two of those with reasoning call a tool the record never declares, or break its schema); and a ShareGPT file (a
JSON array) with a turn that has no `value` and a conversation the assistant opens. Then: convert, a file of a
shape no converter reads, inspect, prepare with a `--max_length` nothing fits in, train with an option typo and
with 4-bit loading on the CPU, a short real training, and eval of a path that does not exist, then of the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}


def _call(name: str, arguments: dict) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _tool_record(i: int, reasoning: bool, name: str = "get_weather", arguments: dict | None = None) -> dict:
    city = f"City{i}"
    call = {"role": "assistant", "content": None, "tool_calls": [_call(name, arguments or {"city": city})]}
    answer = {"role": "assistant", "content": f"It is sunny in {city}."}
    if reasoning:
        call["reasoning_content"] = f"The user asks about {city}; call the weather tool."
        answer["reasoning_content"] = "The tool says sunny; answer briefly."
    return {"tools": [WEATHER], "messages": [
        {"role": "user", "content": f"Weather in {city}?"}, call,
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"city": city, "sky": "sunny"})}, answer]}


def _user_data(tmp: Path) -> tuple[Path, Path]:
    records = [_tool_record(i, reasoning=i < 20) for i in range(28)]
    records.append(_tool_record(28, True, name="get_forecast"))  # a tool the record does not declare
    records.append(_tool_record(29, True, arguments={"city": "Oslo", "days": "three"}))  # not an integer
    tools = tmp / "my_tools.jsonl"
    tools.write_text("".join(json.dumps(r) + "\n" for r in records))
    turn = [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "<think>Greet.</think>Hi!"}]
    sharegpt = [{"conversations": turn}, {"conversations": [{"from": "human"}, turn[1]]},  # a turn without value
                {"conversations": [turn[1], *turn]},  # the assistant opens the conversation
                {"conversations": [{"from": "human", "value": "Count to 2."},
                                   {"from": "gpt", "value": "<think>Easy.</think>1, 2."}]}]
    shared = tmp / "my_sharegpt.json"
    shared.write_text(json.dumps(sharegpt))
    return tools, shared


def run(tmp: Path, *argv: str, module: str = "beam_sft") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=tmp, env=env, capture_output=True, text=True,
                          check=False, timeout=600)


def test_the_tour_on_my_own_data_with_planted_mistakes(tmp_path):
    tools, shared = _user_data(tmp_path)

    # 1. convert: every drop counted by reason, as a share of the input, with what keeps it
    out = run(tmp_path, str(tools), str(shared), "-o", "train.jsonl", "--rejects", "rejects.jsonl",
              module="beam_sft.cli.convert")
    assert out.returncode == 0, out.stderr[-3000:]
    rejects = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    reasons = sorted(r["reason"] for r in rejects)
    assert reasons == sorted(["nothing_to_train"] * 8 + ["undeclared_tool", "arguments_break_schema",
                                                            "turn_without_text", "assistant_first"]), reasons
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 34 - len(rejects)
    assert "dropped: 12 of 34 input records" in out.stderr, out.stderr[-3000:]
    assert "--missing_reasoning keep" in out.stderr and "--tool_call_checks keep" in out.stderr
    assert "of the input's assistant turns" in out.stderr
    # a record of a JSON array is named by its index, not read as a line number
    where = {r["reason"]: r for r in rejects}
    assert where["assistant_first"]["source"].endswith("my_sharegpt.json") and where["assistant_first"]["index"] == 2
    assert "line" not in where["assistant_first"]

    # 2. a file of a shape no converter reads: exit 2, the keys it had and the shapes that are read
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    out = run(tmp_path, "qa.jsonl", "-o", "qa_beam.jsonl", module="beam_sft.cli.convert")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "answer, question" in out.stderr and "alpaca:" in out.stderr and "openai:" in out.stderr

    # 3. inspect what will train
    out = run(tmp_path, "inspect", "train.jsonl", "--dataset_format", "beam", "--index", "0", "--color", "never")
    assert out.returncode == 0 and "<|call|>" in out.stdout, out.stderr[-3000:]

    # 4. prepare with a --max_length nothing fits in: the shortest record's length and the flag to change
    out = run(tmp_path, "prepare", "train.jsonl", "--dataset_format", "beam", "-o", "prepared", "--max_length", "40")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "the shortest is" in out.stderr and "raise --max_length to at least" in out.stderr
    out = run(tmp_path, "prepare", "train.jsonl", "--dataset_format", "beam", "-o", "prepared", "--max_length", "1024")
    assert out.returncode == 0, out.stderr[-3000:]

    # 5. train: a typo gets the option's name with its dashes; 4-bit on the CPU is refused in one line, first
    common = ["train", "--config", "quickstart", "--dataset_name", "prepared", "--output_dir", "model",
              "--report_to", "none"]
    out = run(tmp_path, *common, "--max_lenght", "512", "--dry_run", "true")
    assert out.returncode == 2 and "--max_length" in out.stderr, out.stderr[-3000:]
    out = run(tmp_path, *common, "--load_in_4bit", "true", "--dry_run", "true")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr[-3000:]
    assert not (tmp_path / "model").exists()
    out = run(tmp_path, *common, "--max_steps", "2", "--save_strategy", "no")
    assert out.returncode == 0, out.stderr[-3000:]

    # 6. eval: a path that does not exist is named as such (not a failed download); the model itself evaluates
    out = run(tmp_path, "eval", "runs/m3", "--data", "train.jsonl", "--dataset_format", "beam")
    assert out.returncode == 2 and "no such directory" in out.stderr and "huggingface.co" not in out.stderr
    out = run(tmp_path, "eval", "model", "--data", "train.jsonl", "--dataset_format", "beam", "--max_records", "2",
              "--max-new-tokens", "16")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "well_formed" in out.stdout + out.stderr
