"""Input sources as users configure them (beam_sft.records.files, beam_sft.dataset.settings.source_identity):
hub options on local repositories laid out like hub ones, eval split names, a cache that can't go stale,
column mapping. No network: HF_HUB_OFFLINE=1 (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import orjson
import pytest
import yaml

from beam_sft.dataset.mixture import read_mixture
from beam_sft.dataset.prepare import PrepareRun, prepare_data
from beam_sft.dataset.settings import DataSettings, PhaseOptions, source_identity
from beam_sft.errors import FatalError, UsageError
from beam_sft.records.files import Source, data_sources, iter_items, parse_columns

README = """---
configs:
- config_name: tools
  data_files:
  - split: train
    path: tools/train-*.jsonl
  - split: validation
    path: tools/validation.jsonl
- config_name: chat
  default: true
  data_files:
  - split: train
    path: chat/train.jsonl
---
# A dataset laid out like a hub repository
"""


def _chat(tag: str, i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"{tag}-{i}: what is {i} + 2?"},
                         {"role": "assistant", "content": f"{i + 2}.", "reasoning_content": f"{i} plus two."}]}


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _repo(tmp_path: Path) -> Path:
    """Two subsets: tools (train: 6 rows in two files, validation: 3) and chat (the default; train: 4)."""
    repo = tmp_path / "org_repo"
    _write(repo / "tools" / "train-00000.jsonl", [_chat("T", i) for i in range(3)])
    _write(repo / "tools" / "train-00001.jsonl", [_chat("T", i) for i in range(3, 6)])
    _write(repo / "tools" / "validation.jsonl", [_chat("V", i) for i in range(3)])
    _write(repo / "chat" / "train.jsonl", [_chat("C", i) for i in range(4)])
    (repo / "README.md").write_text(README)
    return repo


def _tags(sources) -> list[str]:
    return [item.payload["messages"][0]["content"].split(":")[0] for item in iter_items(sources)]


def test_a_hub_layout_directory_is_read_by_subset_and_split(tmp_path):
    repo = _repo(tmp_path)
    [src] = data_sources([str(repo)])
    assert src.kind == "hub"  # not "every file inside": the README's configs decide
    assert _tags([src]) == [f"C-{i}" for i in range(4)]  # the default subset
    tools = data_sources([str(repo)], "train", {"config": "tools"})
    assert _tags(tools) == [f"T-{i}" for i in range(6)]
    assert _tags(data_sources([str(repo)], "validation", {"config": "tools"})) == [f"V-{i}" for i in range(3)]
    assert _tags(data_sources([str(repo)], "train", {"data_dir": "tools"})) == [f"T-{i}" for i in range(6)]
    assert _tags(data_sources([str(repo)], "train", {"data_files": ["tools/validation.jsonl"]})) == [
        f"V-{i}" for i in range(3)]
    with pytest.raises(FatalError, match="BuilderConfig 'nope' not found"):
        list(iter_items(data_sources([str(repo)], "train", {"config": "nope"})))
    with pytest.raises(FatalError, match=r"Bad split: test. Available splits: \[.train., .validation.\]"):
        list(iter_items(data_sources([str(repo)], "test", {"config": "tools"})))
    with pytest.raises(UsageError, match="apply to a hub dataset"):
        data_sources([str(repo / "chat" / "train.jsonl")], "train", {"config": "tools"})


def test_mixture_takes_name_data_dir_and_columns(tmp_path, tok):
    repo = _repo(tmp_path)
    odd = tmp_path / "odd.jsonl"  # an unfamiliar layout: `dialog` holds the messages
    _write(odd, [{"dialog": _chat("O", i)["messages"], "id": i} for i in range(5)])
    config = tmp_path / "mix.yaml"
    config.write_text(yaml.safe_dump({"datasets": [
        {"path": str(repo), "name": "tools", "split": "validation", "fraction": 0.5},
        {"path": str(repo), "data_dir": "chat", "fraction": 0.25},
        {"path": str(odd), "columns": {"messages": "dialog"}, "fraction": 0.25},
    ]}))
    mixture = read_mixture(config)
    assert [p.rows for p in mixture.plans] == [3, 4, 5]
    assert [p.taken for p in mixture.plans] == [3, 2, 2]  # N = 6: 3 / 0.5
    manifest = PrepareRun(mixture, tok, DataSettings(), tmp_path / "p").build()
    assert manifest["counts"]["records_kept"] == 7 and manifest["counts"]["rejected_total"] == 0
    # the same file without the mapping is an unfamiliar layout: every row a reject
    bare = read_mixture(_config(tmp_path, [{"path": str(odd)}]))
    with pytest.raises(UsageError, match="no usable training records"):
        PrepareRun(bare, tok, DataSettings(), tmp_path / "q").build()
    with pytest.raises(UsageError, match="unknown target key"):
        read_mixture(_config(tmp_path, [{"path": str(odd), "columns": {"mesages": "dialog"}}]))
    with pytest.raises(UsageError, match="`name` and `revision` apply"):
        read_mixture(_config(tmp_path, [{"path": "json", "data_files": str(odd), "name": "x"}]))


def _config(tmp_path: Path, entries: list[dict]) -> Path:
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"datasets": entries}))
    return path


def test_trl_columns_list_keeps_only_those_columns(tmp_path):
    data = tmp_path / "d.jsonl"
    _write(data, [{**_chat("A", 0), "extra": 1}])
    [item] = iter_items(data_sources([str(data)], "train", {"columns": ["messages"]}))
    assert set(item.payload) == {"messages"}


def test_column_mapping_option_and_errors(tmp_path):
    assert parse_columns("messages=conversations, tools=functions") == {"messages": "conversations",
                                                                         "tools": "functions"}
    with pytest.raises(UsageError, match="unknown target key.*mesages"):
        parse_columns("mesages=conversations")
    with pytest.raises(UsageError, match="KEY=COLUMN"):
        parse_columns("messages")
    data = tmp_path / "d.jsonl"
    data.write_bytes(orjson.dumps({"turns": _chat("A", 0)["messages"], "functions": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}) + b"\n{bad\n")
    good, bad = iter_items(data_sources([str(data)], "train", {"columns": parse_columns("messages=turns,tools=functions")}))
    assert set(good.payload) == {"messages", "tools"} and good.payload["tools"][0]["function"]["name"] == "f"
    assert bad.error is not None and bad.error.code.value == "malformed_json" and bad.position == 2


def test_prepare_cli_hub_options_and_eval_split(tmp_path, capsys):
    from datasets import load_from_disk

    from beam_sft.cli import main

    repo = _repo(tmp_path)
    out = tmp_path / "prep"
    assert main(["prepare", str(repo), "--dataset_config", "tools", "--dataset_test_split", "validation", "-o",
                 str(out), "-q", "--dataset_num_proc", "1"]) == 0
    manifest = json.loads((out / "beam_sft_manifest.json").read_text())
    assert manifest["splits"]["train"]["records_kept"] == 6 and manifest["splits"]["eval"]["records_kept"] == 3
    assert len(load_from_disk(str(out / "eval"))) == 3
    capsys.readouterr()
    assert main(["prepare", str(repo / "chat" / "train.jsonl"), "--dataset_test_split", "validation", "-o",
                 str(tmp_path / "x"), "-q"]) == 2
    assert "has no splits (files)" in capsys.readouterr().err


def test_train_options_dataset_config_and_test_split(tmp_path, tok):
    from beam_sft.train.config import ScriptArguments
    from beam_sft.train.data_phase import eval_inputs, training_datasets, training_inputs
    from beam_sft.train.options import make_parser

    repo = _repo(tmp_path)
    args = make_parser().parse_args_and_config([
        "--dataset_name", str(repo), "--dataset_config", "tools", "--dataset_test_split", "validation",
        "--output_dir", str(tmp_path / "o")])[0]
    inputs, held = training_inputs(args), eval_inputs(args)
    assert [(s.kind, s.config, s.split) for s in inputs] == [("hub", "tools", "train")]
    assert [(s.kind, s.config, s.split) for s in held] == [("hub", "tools", "validation")]
    train, eval_ds, _ = training_datasets(inputs, tok, DataSettings(), eval_dataset_name=held,
                                              cache_dir=str(tmp_path / "cache"))
    assert (len(train), len(eval_ds)) == (6, 3)
    # eval_dataset_name reads its `dataset_test_split`; the default stays TRL's "test"
    other = tmp_path / "other"
    shutil.copytree(repo, other)
    args = ScriptArguments(dataset_name=str(repo), eval_dataset_name=str(other), dataset_test_split="validation")
    assert [s.split for s in eval_inputs(args)] == ["validation"]
    assert [s.split for s in eval_inputs(ScriptArguments(dataset_name=str(repo), eval_dataset_name=str(other)))] == [
        "test"]
    with pytest.raises(UsageError, match="has no splits"):
        eval_inputs(ScriptArguments(dataset_name=str(repo / "chat" / "train.jsonl"), dataset_test_split="validation"))


# ------------------------------------------------------------------------------------------ the cache


def test_a_changed_source_file_is_rebuilt_an_unchanged_one_reused(tmp_path, tok):
    data = tmp_path / "train.jsonl"
    rows = [_chat("A", i) for i in range(8)]
    _write(data, rows)
    cache, settings = tmp_path / "cache", DataSettings()
    first = prepare_data(str(data), tok, settings, cache_dir=cache)
    assert first.action == "tokenized"
    assert prepare_data(str(data), tok, settings, cache_dir=cache).action == "loaded"
    stat = data.stat()
    # same size, same mtime (as `cp -p` or a rewrite within the timestamp granularity leaves it): the bytes decide
    text = data.read_bytes().replace(b"A-3: what is 3", b"A-3: what is 7")
    data.write_bytes(text)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    second = prepare_data(str(data), tok, settings, cache_dir=cache)
    assert second.action == "tokenized" and second.path != first.path
    assert second.train["input_ids"] != first.train["input_ids"]
    assert prepare_data(str(data), tok, settings, cache_dir=cache).action == "loaded"


def test_large_files_are_identified_by_size_and_mtime_not_hashed(tmp_path, monkeypatch):
    from beam_sft.dataset import settings as settings_module

    data = tmp_path / "big.jsonl"
    _write(data, [_chat("A", i) for i in range(50)])
    [small] = source_identity(data_sources([str(data)]))
    assert len(small["files"][0]) == 4  # name, size, mtime_ns, hash
    monkeypatch.setattr(settings_module, "HASH_FILE_BYTES", 100)
    [big] = source_identity(data_sources([str(data)]))
    assert big["files"][0] == [data.name, data.stat().st_size, data.stat().st_mtime_ns]


def _cached_hub_copy(tmp_path: Path, cache: Path, repo_id: str, commit: str, tag: str) -> None:
    """What `load_dataset(repo_id)` leaves in the `datasets` cache once downloaded at `commit` (an offline load
    reads the newest such copy): built from a local file by the json builder, named as the hub's."""
    import datasets

    src = tmp_path / f"{tag}.jsonl"
    _write(src, [_chat(tag, i) for i in range(3)])
    build = tmp_path / f"build-{tag}"
    datasets.load_dataset("json", data_files={"train": str(src)}, cache_dir=str(build))
    [built] = [p for p in build.glob("json/*/*/*") if p.is_dir()]
    org, name = repo_id.split("/")
    target = cache / f"{org}___{name}" / "default" / "0.0.0" / commit
    shutil.copytree(built, target)
    for f in target.glob("json-*.arrow"):
        f.rename(target / f.name.replace("json-", f"{name}-"))


def test_hub_source_identity_is_its_commit_offline_and_unknown_means_rebuild(tmp_path, tok, monkeypatch, caplog):
    import datasets

    cache = tmp_path / "hf_datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    _cached_hub_copy(tmp_path, cache, "org/chats", "a" * 40, "A")
    prep = tmp_path / "prep"
    first = prepare_data("org/chats", tok, DataSettings(), cache_dir=prep)
    assert first.action == "tokenized" and first.manifest["sources"]["train"][0]["commit"] == "a" * 40
    assert prepare_data("org/chats", tok, DataSettings(), cache_dir=prep).action == "loaded"
    # the dataset changed upstream and was downloaded again: a newer cached commit, a new prepared entry
    _cached_hub_copy(tmp_path, cache, "org/chats", "b" * 40, "B")
    newer = cache / "org___chats" / "default" / "0.0.0" / ("b" * 40)
    os.utime(newer, (newer.stat().st_atime + 10, newer.stat().st_mtime + 10))
    second = prepare_data("org/chats", tok, DataSettings(), cache_dir=prep)
    assert second.action == "tokenized" and second.manifest["sources"]["train"][0]["commit"] == "b" * 40
    # a full sha as the revision is the identity as given
    assert source_identity([Source("hub", "org/other", "train", revision="c" * 40)])[0]["commit"] == "c" * 40
    # not established offline: said, and never served from the cache
    unknown = [Source("hub", "org/never-downloaded", "train")]
    with caplog.at_level("WARNING"):
        one, two = source_identity(unknown), source_identity(unknown)
    assert one[0]["commit"] is None and one != two
    assert "cannot establish which commit" in caplog.text and "org/never-downloaded" in caplog.text


# ------------------------------------------------------------------------------------------ CSV and Arrow


def test_csv_rows_with_json_cells_convert_and_bad_rows_are_counted_rejects(tmp_path, tok):
    import csv

    path = tmp_path / "chats.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["messages", "tools", "note"])
        for i in range(4):
            w.writerow([json.dumps(_chat("S", i)["messages"]), "", f"[row {i}, not JSON"])
        w.writerow(["only one field"])  # fewer fields than the header
    with open(path, "ab") as f:
        f.write(b'"' + json.dumps(_chat("S", 9)["messages"]).replace('"', '""').encode() + b'",,\xff\n')
    items = list(iter_items(data_sources([str(tmp_path / "chats.csv")])))
    assert [(i.position, i.error.code.value if i.error else None) for i in items] == [
        (2, None), (3, None), (4, None), (5, None), (6, "malformed_row"), (7, "invalid_utf8")]
    assert items[0].payload["messages"][1]["content"] == "2." and items[0].payload["tools"] is None
    assert items[0].payload["note"] == "[row 0, not JSON"  # a bracket that is not JSON stays text
    manifest = PrepareRun([str(path)], tok, DataSettings(), tmp_path / "p").build()
    assert manifest["counts"]["records_kept"] == 4
    assert manifest["counts"]["rejected"] == {"malformed_row": 1, "invalid_utf8": 1}


def test_arrow_files_as_datasets_writes_them_stream_and_file_format(tmp_path, tok):
    import datasets
    import pyarrow as pa

    ds = datasets.Dataset.from_list([_chat("W", i) for i in range(5)])
    saved = tmp_path / "saved"
    ds.save_to_disk(str(saved))
    [shard] = saved.glob("*.arrow")  # the IPC stream format
    copy = tmp_path / "shard.arrow"
    shutil.copy(shard, copy)
    table = pa.Table.from_pylist([_chat("F", i) for i in range(3)])
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    assert _tags(data_sources([str(copy)])) == [f"W-{i}" for i in range(5)]
    assert _tags(data_sources([str(tmp_path / "file.arrow")])) == [f"F-{i}" for i in range(3)]
    [junk] = iter_items(data_sources([str(tmp_path / "junk.arrow")]))
    assert junk.error.code.value == "malformed_row"
    manifest = PrepareRun([str(copy), str(tmp_path / "file.arrow"), str(tmp_path / "junk.arrow")], tok,
                          DataSettings(), tmp_path / "p").build()
    assert manifest["counts"]["records_kept"] == 8 and manifest["counts"]["rejected"] == {"malformed_row": 1}


# ------------------------------------------------------------------------------------------ streaming shuffle


def test_stream_shuffle_buffer_is_seeded_and_keeps_every_record(tmp_path, tok):
    from beam_sft.dataset.stream import stream_training_data

    data = tmp_path / "d.jsonl"
    _write(data, [_chat("R", i) for i in range(40)])

    def order(seed: int, buffer: int | None) -> list[str]:
        options = PhaseOptions(shuffle_buffer=buffer)
        stream = stream_training_data(str(data), tok, DataSettings(seed=seed), options)
        return [re.search(r"R-(\d+):", tok.decode(row["input_ids"])).group(1) for row in stream]

    plain = order(0, None)
    assert plain == [str(i) for i in range(40)]
    one, again, other = order(1, 8), order(1, 8), order(2, 8)
    assert one == again and one != plain and one != other
    assert sorted(one, key=int) == plain == sorted(other, key=int)
    # a buffer of N only moves a record up to N places early: memory is N records, not the input
    assert all(int(r) <= i + 8 for i, r in enumerate(one))
    with pytest.raises(UsageError, match="at least 1"):
        stream_training_data(str(data), tok, DataSettings(), PhaseOptions(shuffle_buffer=-1))


def test_hub_like_directories_are_streamed_never_served_from_a_stale_arrow_cache(tmp_path, tok):
    # datasets' Arrow cache keys a local hub-like directory by its name and layout: before, a second directory
    # named org_repo, or the first one edited, came back with the rows cached the first time. Streamed, each read
    # is its files, and nothing is written to the cache (also what --streaming does for a hub id).
    import uuid

    import datasets

    from beam_sft.dataset.stream import stream_training_data

    cache = Path(datasets.config.HF_DATASETS_CACHE)

    def cached_files() -> int:
        return sum(1 for _ in cache.rglob("*.arrow")) if cache.exists() else 0

    before = cached_files()
    repos = []
    for k in range(2):
        repo = _repo(tmp_path / f"copy{k}")
        tag = f"U{uuid.uuid4().hex[:8]}"
        _write(repo / "chat" / "train.jsonl", [_chat(tag, i) for i in range(4)])
        assert _tags(data_sources([str(repo)], "train")) == [f"{tag}-{i}" for i in range(4)]
        repos.append(repo)
    edited = f"E{uuid.uuid4().hex[:8]}"
    _write(repos[0] / "chat" / "train.jsonl", [_chat(edited, i) for i in range(3)])
    assert _tags(data_sources([str(repos[0])], "train")) == [f"{edited}-{i}" for i in range(3)]
    stream = stream_training_data(str(repos[0]), tok, DataSettings(split="train"))
    rows = [re.search(rf"{edited}-(\d+):", tok.decode(row["input_ids"])).group(1) for row in stream]
    assert rows == ["0", "1", "2"] and cached_files() == before
