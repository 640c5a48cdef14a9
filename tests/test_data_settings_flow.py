"""Issue 52/53 leftovers of the data area: the data-phase options carried by objects, `tool_call_checks` recorded
in the manifest and checked, `inspect --tool_call_checks`, unknown_format keys carried as data, a streamed run's
drop report, and Parquet files whose `messages` column holds JSON text."""

from __future__ import annotations

import json
import logging

import orjson
import pytest

from beam_sft.dataset.settings import DataSettings, PhaseOptions
from beam_sft.errors import UsageError

GOOD = {"messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "reasoning_content": "think", "content": "hello"}]}
UNDECLARED = {"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "reasoning_content": "r", "tool_calls": [
                               {"type": "function", "function": {"name": "g", "arguments": {}}}]},
                           {"role": "tool", "content": "ok"},
                           {"role": "assistant", "reasoning_content": "r", "content": "done"}]}


def _jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_tool_call_checks_is_in_the_manifest_and_a_mismatch_names_it(tok, tmp_path):
    from beam_sft.dataset.prepare import PrepareRun, load_prepared, prepare_data

    src = _jsonl(tmp_path / "d.jsonl", [GOOD, GOOD | {"messages": GOOD["messages"][:1] + [
        {"role": "assistant", "reasoning_content": "x", "content": "other"}]}, UNDECLARED])
    out = tmp_path / "prep"
    manifest = PrepareRun([str(src)], tok, DataSettings(tool_call_checks="keep"), out).build()
    assert manifest["tool_call_checks"] == "keep"
    assert len(load_prepared(out, tok, DataSettings(tool_call_checks="keep")).train) == 3
    with pytest.raises(UsageError, match=r"manifest field 'tool_call_checks' is 'keep', this run has 'reject'"):
        prepare_data(str(out), tok, DataSettings())


def test_convert_records_takes_the_settings(tmp_path):
    from beam_sft.dataset.pipeline import convert_records

    src = _jsonl(tmp_path / "d.jsonl", [GOOD, UNDECLARED, {"question": "q", "answer": "a"}])
    for name in "abc":
        (tmp_path / name).mkdir()
    strict = convert_records(str(src), tmp_path / "a", DataSettings())
    assert len(strict) == 1 and strict.rejected == {"no_tools_declared": 1, "unknown_format": 1}
    kept = convert_records(str(src), tmp_path / "b", DataSettings(tool_call_checks="keep", max_records=2))
    assert len(kept) == 2 and not kept.rejected
    with pytest.raises(UsageError, match="unknown format 'nope'"):
        convert_records(str(src), tmp_path / "c", DataSettings(format="nope"))


def test_inspect_takes_tool_call_checks(tmp_path, capsys):
    from beam_sft.cli import main

    src = _jsonl(tmp_path / "d.jsonl", [GOOD, UNDECLARED])
    assert main(["inspect", str(src), "--stats", "--color", "never"]) == 0
    strict = capsys.readouterr().out
    assert main(["inspect", str(src), "--stats", "--color", "never", "--tool_call_checks", "keep"]) == 0
    kept = capsys.readouterr().out
    assert "no_tools_declared" in strict and "no_tools_declared" not in kept
    assert main(["inspect", str(src), "--index", "1", "--color", "never"]) == 0  # the record view too
    assert "rejected [no_tools_declared]" in capsys.readouterr().err
    assert main(["inspect", str(src), "--index", "1", "--color", "never", "--tool_call_checks", "keep"]) == 0
    shown = capsys.readouterr()
    assert "assistant to=g" in shown.out and "rejected" not in shown.err
    with pytest.raises(SystemExit):
        main(["inspect", str(src), "--tool_call_checks", "maybe"])
    capsys.readouterr()


def test_unknown_format_keys_travel_as_data():
    from beam_sft.dataset.drops import format_keys
    from beam_sft.errors import RecordError, reject_entry
    from beam_sft.validate.convert import try_convert

    _, _, err = try_convert({"question": "q", "answer": "a"})
    assert err.keys == ["answer", "question"]
    assert err.message == "record fits no known format (keys: answer, question)"  # the words are the same
    entry = reject_entry(err, "f.jsonl", 3)
    assert entry["keys"] == ["answer", "question"] and format_keys(entry) == "answer, question"
    # the keys come from the entry, not from its message text
    assert format_keys({**entry, "message": "something else"}) == "answer, question"
    other = reject_entry(RecordError("bad_content", "x (keys: a, b)"), "f.jsonl", 1)
    assert "keys" not in other and format_keys(other) is None


def _items(path):
    from beam_sft.records.files import data_sources, iter_items
    from beam_sft.validate.convert import convert_item

    return [convert_item(item) for item in iter_items(data_sources([str(path)]))]


def test_parquet_with_json_text_messages_is_read_as_records(tmp_path):
    """`datasets.Dataset.to_parquet` of a ``Json`` column writes the arrow.json extension type: its cells read
    back as JSON text. Every record was rejected unknown_format; they are records now."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [GOOD, {"messages": GOOD["messages"] + [{"role": "user", "content": "again"},
                                                   {"role": "assistant", "reasoning_content": "t", "content": "x"}]}]
    path = tmp_path / "json.parquet"
    datasets.Dataset.from_list(rows, features=datasets.Features({"messages": datasets.Json()})).to_parquet(path)
    assert isinstance(pq.read_schema(path).field("messages").type, pa.JsonType)
    assert isinstance(pq.read_table(path).to_pylist()[0]["messages"], str)  # what made them unknown_format
    got = _items(path)
    assert [reject for _, _, reject in got] == [None, None]
    assert [len(rec["messages"]) for rec, _, _ in got] == [2, 4]
    saved = tmp_path / "saved"  # the same column in an Arrow file (a `save_to_disk` shard, read as a file)
    datasets.Dataset.from_list(rows, features=datasets.Features({"messages": datasets.Json()})).save_to_disk(saved)
    [shard] = saved.glob("*.arrow")
    assert [reject for _, _, reject in _items(shard)] == [None, None]
    # a plain string column of JSON text (json.dumps'd turns), and a text that is not a JSON list
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"messages": [json.dumps(GOOD["messages"]), "[not json"]}), plain)
    (rec, _, ok), (_, _, bad) = _items(plain)
    assert ok is None and rec["messages"][1]["content"] == "hello"
    assert bad["reason"] != "internal_error"


def test_stream_reports_its_drops_when_exhausted(tok, tmp_path, caplog):
    from beam_sft.dataset.stream import stream_training_data

    src = _jsonl(tmp_path / "d.jsonl", [GOOD, UNDECLARED, {"question": "q"}, GOOD])
    stream = stream_training_data(str(src), tok, DataSettings(), PhaseOptions(output_dir=tmp_path / "rej"))
    with caplog.at_level(logging.INFO, logger="beam_sft.dataset.stream"):
        assert len(list(stream)) == 2
        assert len(list(stream)) == 2  # a second pass (epoch) is not counted again
    report = [r.getMessage() for r in caplog.records if "dropped:" in r.getMessage()]
    assert len(report) == 1, report
    assert "dropped: 2 of 4 input records (50.0%)" in report[0]
    assert "no_tools_declared" in report[0] and "unknown_format" in report[0]
    assert "keys the input had: {question} (1 record)" in report[0]


def test_stream_logs_the_first_rejects_and_writes_each_once(tok, tmp_path, caplog):
    """Rejects one by one in the log only up to LOGGED_REJECTS (a stream of 10^6 records must not print one line
    per reject); the rejects file gets each reject once, whatever the number of epochs."""
    from beam_sft.dataset.stream import LOGGED_REJECTS, stream_training_data

    rows = [GOOD] + [{"question": f"q{i}"} for i in range(LOGGED_REJECTS + 3)]
    src = _jsonl(tmp_path / "d.jsonl", rows)
    stream = stream_training_data(str(src), tok, DataSettings(max_reject_share=1.0),
                                  PhaseOptions(output_dir=tmp_path / "rej"))
    with caplog.at_level(logging.INFO, logger="beam_sft.dataset.stream"):
        for _ in range(3):
            assert len(list(stream)) == 1
    logged = [r for r in caplog.records if r.getMessage().startswith("rejected: ")]
    assert len(logged) == LOGGED_REJECTS
    written = (tmp_path / "rej" / "rejects.rank0.jsonl").read_text().splitlines()
    assert len(written) == len(rows) - 1 == len(set(written))
