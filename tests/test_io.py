"""beam_sft.records.files: readers with provenance, size limits, atomic writers, and Arrow storage without null-filled keys."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from beam_sft.errors import Reason, UsageError
from beam_sft.records.files import (
    ArrowWriter,
    JsonlWriter,
    arrow_row,
    beam_features,
    expand_inputs,
    iter_items,
    open_writer,
    parse_line,
)
from beam_sft.validate.rules import make_render_check


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """These tests are about what the converters make; the missing-reasoning policy (default `mask`) has its
    own tests (test_validate.py, test_reasoning_policy.py), so here turns without reasoning are kept."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep"))

RENDER = make_render_check()


def test_jsonl_lines_are_1_based_and_bad_lines_become_rejections(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"messages": []}\n\n{broken\n' + b'{"x": "\xff"}\n' + b'{"big": "' + b"y" * 100 + b'"}\n')
    items = list(iter_items(expand_inputs([str(p)]), max_bytes=80))
    assert [(i.position, i.by_line) for i in items] == [(1, True), (3, True), (4, True), (5, True)]
    assert items[0].raw and parse_line(items[0].payload) == {"messages": []}
    with pytest.raises(Exception) as info:
        parse_line(items[1].payload)
    assert info.value.code is Reason.MALFORMED_JSON
    with pytest.raises(Exception) as info:
        parse_line(items[2].payload)
    assert info.value.code is Reason.INVALID_UTF8
    assert items[3].error.code is Reason.RECORD_TOO_LARGE


def test_json_array_object_and_bare_message_list(tmp_path):
    (tmp_path / "arr.json").write_text(json.dumps([{"conversations": []}, {"conversations": [1]}]))
    (tmp_path / "obj.json").write_text(json.dumps({"conversations": []}))
    (tmp_path / "msgs.json").write_text(json.dumps([{"role": "user", "content": "x"}]))
    (tmp_path / "bad.json").write_text("[{")
    got: dict[str, list] = {}
    for i in iter_items(expand_inputs([str(tmp_path)])):
        got.setdefault(Path(i.source).name, []).append(i)
    assert [i.position for i in got["arr.json"]] == [0, 1] and not got["arr.json"][0].by_line
    assert got["obj.json"][0].payload == {"conversations": []}
    assert got["msgs.json"][0].payload == {"messages": [{"role": "user", "content": "x"}]}
    assert got["bad.json"][0].error.code is Reason.MALFORMED_JSON


def test_text_files_globs_limits_and_usage_errors(tmp_path):
    (tmp_path / "h.txt").write_text("<|start|>user<|message|>x<|end|>")
    (tmp_path / "z.txt").write_bytes(b"\xff\xfe")
    items = list(iter_items(expand_inputs([str(tmp_path / "*.txt")])))
    assert items[0].payload == {"text": "<|start|>user<|message|>x<|end|>"}
    assert items[1].error.code is Reason.INVALID_UTF8
    assert len(list(iter_items(expand_inputs([str(tmp_path / "*.txt")]), limit=1))) == 1
    with pytest.raises(UsageError):
        expand_inputs([str(tmp_path / "nope.jsonl")])
    with pytest.raises(UsageError):
        expand_inputs([str(tmp_path / "*.parquet")])
    assert expand_inputs(["someone/some-dataset"])[0].kind == "hub"


def test_atomic_jsonl_writer_commit_and_abort(tmp_path):
    target = tmp_path / "out.jsonl"
    w = JsonlWriter(target)
    w.write_raw(b'{"a":1}')
    assert not target.exists()  # nothing visible before commit
    w.commit()
    assert target.read_bytes() == b'{"a":1}\n'
    w = JsonlWriter(target)
    w.write_raw(b'{"a":2}')
    w.abort()
    assert target.read_bytes() == b'{"a":1}\n'  # the old file survives a failed run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp files left


def test_output_kinds(tmp_path):
    with pytest.raises(UsageError):
        open_writer(str(tmp_path / "out.csv"))
    w = open_writer(str(tmp_path / "missing_dir" / "out.jsonl"))  # a new directory is created (issue 18)
    w.write_raw(b'{"a":1}')
    w.commit()
    assert (tmp_path / "missing_dir" / "out.jsonl").read_bytes() == b'{"a":1}\n'
    assert isinstance(open_writer(str(tmp_path / "o.parquet")), ArrowWriter)


HETEROGENEOUS = [
    {"messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "reasoning_content": "r", "tool_calls": [
                      {"id": "1", "type": "function", "function": {"name": "a", "arguments": {"x": 1}}}]},
                  {"role": "tool", "name": "a", "tool_call_id": "1", "content": "ok"},
                  {"role": "assistant", "reasoning_content": "r", "content": "done"}],
     "tools": [{"type": "function", "function": {"name": "a", "parameters": {
         "type": "object", "properties": {"x": {"type": "integer"}}}}}],
     "chat_template_kwargs": {"reasoning_effort": "low"}},
    {"messages": [{"role": "user", "content": "q2"},
                  {"role": "assistant", "reasoning_content": "r2", "tool_calls": [
                      {"type": "function", "function": {"name": "b", "arguments": {
                          "query": "s", "opts": {"deep": [1, "two", None]}, "flag": False}}}]}],
     "tools": [{"type": "function", "function": {"name": "b", "description": "B", "parameters": {
         "type": "object", "properties": {"query": {"type": "string", "enum": ["s", "t"]}}}}}]},
    {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q3"},
                  {"role": "assistant", "reasoning_content": "", "content": "a3"}]},
]


@pytest.mark.parametrize("suffix", [".parquet", ""])
def test_arrow_outputs_keep_heterogeneous_arguments_and_schemas_exactly(tmp_path, suffix):
    import datasets

    target = tmp_path / f"out{suffix}"
    w = open_writer(str(target))
    for rec in HETEROGENEOUS:
        w.write_raw(orjson.dumps(rec))
    w.commit()
    if suffix:
        ds = datasets.Dataset.from_parquet(str(target), cache_dir=str(tmp_path / "cache"))
    else:
        ds = datasets.load_from_disk(str(target))
    assert ds.features == beam_features()
    assert len(ds) == len(HETEROGENEOUS)
    for row, rec in zip(ds, HETEROGENEOUS, strict=True):
        # arguments and tools come back exactly: no keys borrowed from other records, no null padding
        calls = [c for m in rec["messages"] for c in m.get("tool_calls") or []]
        got = [c for m in row["messages"] for c in m["tool_calls"] or []]
        assert [c["function"]["arguments"] for c in got] == [c["function"]["arguments"] for c in calls]
        assert row["tools"] == rec.get("tools")
        assert row["chat_template_kwargs"] == rec.get("chat_template_kwargs", {})
        # and the row renders exactly like the JSONL record
        assert RENDER(row) == RENDER(rec)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("cache")) == [target.name]


def test_arrow_row_is_json_strings_only_for_free_form_parts():
    row = arrow_row(HETEROGENEOUS[1])
    assert row["messages"][1]["tool_calls"][0]["function"]["arguments"] == \
        '{"query":"s","opts":{"deep":[1,"two",null]},"flag":false}'
    assert row["tools"] == [orjson.dumps(HETEROGENEOUS[1]["tools"][0]).decode()]
    assert row["chat_template_kwargs"] == "{}"


def test_parquet_and_saved_dataset_inputs_round_trip(tmp_path):
    from beam_sft.validate.convert import convert

    out = tmp_path / "o.parquet"
    w = open_writer(str(out))
    for rec in HETEROGENEOUS:
        w.write_raw(orjson.dumps(rec))
    w.commit()
    items = list(iter_items(expand_inputs([str(out)])))
    assert [i.position for i in items] == [0, 1, 2]
    again = [convert(i.payload, "openai")[0] for i in items]
    assert [RENDER(r) for r in again] == [RENDER(r) for r in HETEROGENEOUS]
    d = tmp_path / "ds"
    w = open_writer(str(d))
    for rec in HETEROGENEOUS:
        w.write_raw(orjson.dumps(rec))
    w.commit()
    srcs = expand_inputs([str(d)])
    assert [s.kind for s in srcs] == ["disk"]
    again = [convert(i.payload, "auto")[0] for i in iter_items(srcs)]
    assert [RENDER(r) for r in again] == [RENDER(r) for r in HETEROGENEOUS]


def test_hub_ids_go_through_load_dataset_with_the_split(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, split=None, streaming=False):
        calls.append((name, split, streaming))
        return datasets.Dataset.from_list([{"conversations": [{"from": "human", "value": "x"}]}] * 3)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    items = list(iter_items(expand_inputs(["org/chats"], split="validation")))
    assert calls == [("org/chats", "validation", False)]  # prepared: the whole split, through datasets' cache
    [src] = expand_inputs(["org/chats"], split="validation")
    src.streaming = True  # what the training stream sets: rows as they download
    assert len(list(iter_items([src]))) == 3 and calls[-1] == ("org/chats", "validation", True)
    assert [(i.source, i.position, i.by_line) for i in items] == [("org/chats", k, False) for k in range(3)]
    assert items[0].payload == {"conversations": [{"from": "human", "value": "x"}]}


def test_json_lines_under_a_json_name_are_read_as_lines(tmp_path):
    p = tmp_path / "chats.json"
    p.write_text('{"conversations": []}\n{"conversations": [1]}\n')
    items = list(iter_items(expand_inputs([str(p)])))
    assert [(i.position, i.by_line, parse_line(i.payload)) for i in items] == [
        (1, True, {"conversations": []}), (2, True, {"conversations": [1]})]
