"""data/real (scripts/build_real_data.py): the held-out split never shares a tool with training, nothing is lost
between the sources and the two halves, and the back-fill only added reasoning."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizer_factories import script_module

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (REAL / name).read_text(encoding="utf-8").splitlines()]


def _tools(records: list[dict]) -> set[str]:
    return {t.get("function", t).get("name") for r in records for t in r.get("tools") or []}


def test_heldout_tools_are_never_trained_and_nothing_is_lost():
    split = json.loads((REAL / "split.json").read_text())
    held, raw, train = _records("heldout.jsonl"), _records("train.raw.jsonl"), _records("train.jsonl")
    assert not _tools(held) & _tools(raw)
    assert sorted(_tools(held)) == split["heldout_tools"]
    assert len(held) == split["heldout"] and len(raw) == split["train"]
    assert split["records"] == len(held) + len(raw) == sum(s["converted"] for s in split["sources"].values())
    stats = split["backfill_stats"]
    assert stats["records_in"] == stats["records_out"] == len(train)


def test_backfill_changed_reasoning_only():
    # records in back-fill order: each output record is its raw record with some reasoning filled in
    split = json.loads((REAL / "split.json").read_text())
    raw, train = _records("train.raw.jsonl"), _records("train.jsonl")
    bound = split["limit"] + (split["first_turns"] if split["first_turns"] is not None else len(raw))
    assert len(train) == min(len(raw), split["limit"] if split["rest"] == "skip" else bound)
    filled = 0
    for before, after in zip(raw, train, strict=False):
        assert [m["role"] for m in before["messages"]] == [m["role"] for m in after["messages"]]
        for a, b in zip(before["messages"], after["messages"], strict=True):
            strip = lambda m: {k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning_source")}
            assert strip(a) == strip(b)
            if b.get("reasoning_source") and not a.get("reasoning_content"):
                filled += 1
    assert filled == split["backfill_stats"]["filled"] > 0


def test_records_after_the_limit_keep_their_first_call_or_first_turn():
    build = script_module("build_real_data")
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}
    record = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                           {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}, call,
                           {"role": "tool", "content": "r"}, {"role": "assistant", "content": "b"}], "source": "x#0"}
    cut = build.first_turn(record)
    assert [m.get("content") for m in cut["messages"]] == ["s", "u", "a"] and cut["source"] == "x#0"
    # an ask for a missing argument keeps the call that follows the user's reply
    assert build.first_turn(record, through_call=True)["messages"] == record["messages"][:5]
    answers = {**record, "messages": record["messages"][:4] + [{"role": "assistant", "content": "b"}]}
    assert build.first_turn(answers, through_call=True)["messages"] == answers["messages"][:3]
    split = json.loads((REAL / "split.json").read_text())
    assert split["rest"] == "first-call"  # what make demo-real trains on
    rest = _records("train.raw.jsonl")[split["limit"]:]
    # each is already cut: cutting again changes nothing, and some keep an ask before their call
    assert rest and all(build.first_turn(r, through_call=True) == r for r in rest)
    assert any(sum(m["role"] == "assistant" for m in r["messages"]) > 1 for r in rest)


def test_training_only_records_never_declare_a_heldout_tool_and_backfill_changed_reasoning_only():
    split = json.loads((REAL / "split.json").read_text())
    extra = split["extra"]
    raw, train = _records("train.extra.raw.jsonl"), _records("train.extra.jsonl")
    assert not _tools(raw) & set(split["heldout_tools"])
    assert extra["records"] == len(raw) == sum(s["converted"] for s in extra["sources"].values())
    stats = extra["backfill_stats"]
    assert stats["records_in"] == stats["records_out"] == len(train) == len(raw)
    filled = 0
    for before, after in zip(raw, train, strict=True):
        strip = lambda r: [{k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning_source")}
                           for m in r["messages"]]
        assert strip(before) == strip(after) and before["tools"] == after["tools"]
        filled += sum(bool(m.get("reasoning_source")) and not a.get("reasoning_content")
                      for a, m in zip(before["messages"], after["messages"], strict=True))
    assert filled == stats["filled"] > 0


def test_a_part_keeps_what_the_other_part_recorded(tmp_path, monkeypatch):
    # --part extra rebuilds only the training-only files: the split's records and its back-fill record stay
    build = script_module("build_real_data")
    out = tmp_path / "real"
    out.mkdir()
    recorded = {"heldout_tools": ["only_held_out"], "backfill_command": "beam-sft backfill ...", "train": 1}
    (out / "split.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(build, "OUT", out)
    assert build.main(["--part", "extra", "--split-only"]) == 0
    info = json.loads((out / "split.json").read_text())
    assert {k: info[k] for k in recorded} == recorded
    assert info["extra"]["records"] == len((out / "train.extra.raw.jsonl").read_text().splitlines()) > 0
    assert not (out / "heldout.jsonl").exists() and not (out / "train.raw.jsonl").exists()


def test_demo_real_trains_the_training_only_records_unless_told_not_to(tmp_path):
    demo = script_module("demo_real")
    assert demo.make_parser().parse_args([]).extra and not demo.make_parser().parse_args(["--no-extra"]).extra
    plain, extra = demo.data(tmp_path / "plain", extra=False), demo.data(tmp_path / "extra")
    assert sorted(p.name for p in plain.glob("real.*")) == ["real.train.jsonl"]
    assert sorted(p.name for p in extra.glob("real.*")) == ["real.train.extra.jsonl", "real.train.jsonl"]
    assert (extra / "real.train.extra.jsonl").read_bytes() == (REAL / "train.extra.jsonl").read_bytes()


def test_vllm_does_not_inherit_the_training_thread_count(monkeypatch, tmp_path):
    # demo_real.py sets OMP_NUM_THREADS for training; vLLM's CPU worker binds its own cores and keeps an
    # inherited count (its log warns of spin-wait contention)
    serving = script_module("serving_test")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    cmd, env = serving.server_command("vllm", tmp_path / "venv", tmp_path / "served", 8000)
    assert "OMP_NUM_THREADS" not in env and "MKL_NUM_THREADS" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and cmd[cmd.index("--port") + 1] == "8000"


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object"}}}


def _record(user: str, tools: list[str], reasoning: str = "The user wants it.") -> dict:
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "reasoning_content": reasoning, "content": "Sorry, I can't."}],
            "tools": [_tool(n) for n in tools]}


def test_distractor_tools_never_serve_the_request_nor_falsify_reasoning():
    from beam_sft.augment.distractors import add_distractors
    from beam_sft.augment.words import tool_name

    pizza = _record("Can you please order a pizza for me?", ["get_song_lyrics"])
    listed = _record("Find schools near me.", ["getwebsite"], "The tools provided are getwebsite. None fits.")
    donors = [_record("x", [n]) for n in ("order_pizza", "get_pizza_menu", "getSongLyricsByArtist", "calculate_tip",
                                           "convert_currency", "is_palindrome")]
    bare = {"messages": [{"role": "user", "content": "hi"}]}
    records = [pizza, listed, bare, *donors]
    out, changed = add_distractors(records, 2, seed=0)
    assert len(out) == len(records) and out[1] is listed and out[2] is bare
    names = [tool_name(t) for t in out[0]["tools"]]
    assert len(names) == 3 and "get_song_lyrics" in names
    # a pizza tool would serve the request; a song-lyrics one shares a word with the declared tool
    assert not {"order_pizza", "get_pizza_menu", "getSongLyricsByArtist"} & set(names)
    assert changed == 1 + len(donors)
    for before, after in zip(records[3:], out[3:], strict=True):
        assert tool_name(before["tools"][0]) in {tool_name(t) for t in after["tools"]}
        assert len(after["tools"]) == 3 and after["messages"] == before["messages"]


def test_demo_real_distractors_keep_every_record_and_no_heldout_tool(tmp_path):
    demo = script_module("demo_real")
    data = demo.data(tmp_path, distractors=2)
    for name in ("train.jsonl", "train.extra.jsonl"):
        before, after = _records(name), [json.loads(line) for line in (data / f"real.{name}").read_text().splitlines()]
        assert [r["messages"] for r in after] == [r["messages"] for r in before]
        added = [len(a.get("tools") or []) - len(b.get("tools") or []) for b, a in zip(before, after, strict=True)]
        assert set(added) <= {0, 2} and added.count(2) > len(after) // 2
        assert not _tools(after) & _tools(_records("heldout.jsonl"))


def test_two_training_records_call_against_their_schema_and_nothing_else_breaks_the_call_checks():
    """The rules eval scores by, checked at conversion (docs/data.md#calls-checked-against-their-tools): of data/real,
    two training records are rejected, each for a real mismatch, and the held-out and extra records pass."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    new = {"undeclared_tool", "no_tools_declared", "arguments_break_schema", "turn_without_text", "assistant_first"}
    found = {}
    for name in ("heldout.jsonl", "train.raw.jsonl", "train.jsonl", "train.extra.raw.jsonl", "train.extra.jsonl"):
        rejects = (convert_item(item, "auto", Options(missing_reasoning="keep"))[2]
                   for item in read_items([str(REAL / name)]))
        found[name] = [(r["line"], r["reason"], r["message"]) for r in rejects if r and r["reason"] in new]
    for name in ("train.raw.jsonl", "train.jsonl"):
        (line1, reason1, message1), (line2, reason2, message2) = found.pop(name)
        assert (line1, reason1, line2, reason2) == (34, "arguments_break_schema", 49, "arguments_break_schema")
        # ToolAlpaca's optional countyCode, made required by the xLAM mapping data/real was built with; API-Bank's
        # health_data, a string where the schema says array
        assert "lacks the required 'countyCode'" in message1 and "health_data is a string" in message2
    assert not any(found.values()), found
