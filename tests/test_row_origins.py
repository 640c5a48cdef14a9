"""Every prepared row's origin (beam_sft.dataset.origins): the sidecar `row_origins.arrow` of each split names
the source file and line (JSONL) or index (JSON array) of the record each row was encoded from, through
deduplication, truncation drops, eval splits, mixtures, worker pools and shard merges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest
from inmemory import prepare_dataset, read_rows, to_beam_records

from beam_sft.dataset.origins import ORIGINS_FILE, row_origins
from beam_sft.dataset.settings import REJECTS, DataSettings

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"
OPENAI = str(SAMPLES / "openai.jsonl")
SHAREGPT = str(SAMPLES / "sharegpt.json")  # a JSON array: rows named by index
HARMONY = str(SAMPLES / "harmony.jsonl")
# drop-policy truncation at this length drops some sample records whole and keeps the others unchanged
MAX_LENGTH = 300


def _settings(**kw) -> DataSettings:
    return DataSettings(max_length=MAX_LENGTH, truncation_policy="drop", seed=3, **kw)


def _again(tmp_path: Path) -> str:
    """A copy of the OpenAI samples: every record a duplicate of one in another chunk."""
    path = tmp_path / "again.jsonl"
    shutil.copyfile(OPENAI, path)
    return str(path)


@pytest.fixture(scope="module")
def encoded(tok):
    """source -> {line or index: input_ids} of every record that converts, each source encoded on its own
    (the in-memory path of tests/inmemory.py, no truncation)."""
    cache: dict[str, dict[int, list[int]]] = {}

    def of(source: str) -> dict[int, list[int]]:
        if source not in cache:
            positions, records = [], []
            for item in read_rows(source):
                converted, _ = to_beam_records([item])
                if converted:
                    positions.append(item.position)
                    records.append(converted[0])
            dataset, _ = prepare_dataset(tok, records, max_length=None)
            cache[source] = dict(zip(positions, dataset["input_ids"], strict=True))
        return cache[source]

    return of


def _reject_places(path: Path) -> set[tuple[str, int]]:
    entries = [json.loads(line) for line in (path / REJECTS).read_text().splitlines()]
    return {(e["source"], e["line"] if "line" in e else e["index"]) for e in entries}


def _check_every_row(path: Path, manifest: dict, encoded) -> dict[str, list[str]]:
    """Each split's rows against their named records; every input record in exactly one place. Returns the
    descriptions per split."""
    from datasets import load_from_disk

    places, described = [], {}
    splits = ["train", *(["eval"] if (path / "eval").is_dir() else [])]
    for split in splits:
        dataset = load_from_disk(str(path if split == "train" else path / "eval"))
        origins = row_origins(dataset)
        assert origins is not None and len(origins) == len(dataset) == manifest["splits"][split]["records_kept"]
        rows = list(range(len(dataset)))
        located = origins.locate(rows)
        for ids, (source, pos, by_line) in zip(dataset["input_ids"], located, strict=True):
            assert by_line == source.endswith(".jsonl")
            assert encoded(source)[pos] == ids, (split, source, pos)
        places += [(source, pos) for source, pos, _ in located]
        described[split] = origins.describe(rows)
    counts = manifest["counts"]
    assert len(set(places)) == len(places)  # no record twice (dedup, train -> eval)
    assert not set(places) & _reject_places(path)  # nor both kept and rejected
    assert len(places) + counts["rejected_total"] + counts["dropped_too_long"] == counts["records_in"]
    assert counts["rejected"].get("duplicate", 0) > 0 and counts["dropped_too_long"] > 0
    return described


@pytest.mark.parametrize("case", ["drawn eval", "eval inputs"])
def test_every_row_names_the_record_it_was_encoded_from(tok, tmp_path, encoded, case):
    """Dedup on, an eval split (drawn among the records: duplicates skipped before tokenizing; or separate eval
    data: duplicates across chunks and train -> eval taken out of written shards), truncation drops, several
    chunks; one process and two give the same sidecar bytes."""
    from beam_sft.dataset.prepare import PrepareRun

    again = _again(tmp_path)
    if case == "drawn eval":
        inputs, eval_inputs, settings = [OPENAI, SHAREGPT, again], None, _settings(eval_split_size=0.25)
    else:  # sharegpt.json holds a record equal to an OpenAI one: its eval copy goes
        inputs, eval_inputs, settings = [OPENAI, again], [SHAREGPT, HARMONY], _settings()
    runs = {}
    for procs in (1, 2):
        runs[procs] = PrepareRun(inputs, tok, settings, tmp_path / f"p{procs}", eval_inputs=eval_inputs,
                                 chunk_rows=9, num_proc=procs, fingerprint="fp").build()
    described = _check_every_row(tmp_path / "p1", runs[1], encoded)
    assert any(d.startswith(f"{SHAREGPT}[") for d in described["train" if eval_inputs is None else "eval"])
    assert any(d.startswith(f"{OPENAI}:") for d in described["train"])
    for sub in ("", "eval"):
        assert (tmp_path / "p1" / sub / ORIGINS_FILE).read_bytes() == (tmp_path / "p2" / sub / ORIGINS_FILE).read_bytes()
    assert not list((tmp_path / "p1").rglob("*.origins.arrow"))  # the chunks' files are gone


def test_shards_and_merge_give_one_runs_sidecar(tok, tmp_path, encoded):
    from beam_sft.dataset.prepare import PrepareRun

    inputs, eval_inputs, settings = [OPENAI, _again(tmp_path)], [SHAREGPT], _settings()
    one = PrepareRun(inputs, tok, settings, tmp_path / "one", eval_inputs=eval_inputs, chunk_rows=7,
                     fingerprint="fp").build()
    shards = []
    for i in range(3):
        PrepareRun(inputs, tok, settings, tmp_path / f"s{i}", eval_inputs=eval_inputs, chunk_rows=7,
                   fingerprint="fp").shard((i, 3))
        shards.append(tmp_path / f"s{i}")
    merged = PrepareRun(inputs, tok, settings, tmp_path / "merged", eval_inputs=eval_inputs,
                        fingerprint="fp").merge(shards)
    assert merged["counts"] == one["counts"]
    for sub in ("", "eval"):
        assert (tmp_path / "merged" / sub / ORIGINS_FILE).read_bytes() == \
            (tmp_path / "one" / sub / ORIGINS_FILE).read_bytes()
    _check_every_row(tmp_path / "merged", merged, encoded)


def test_a_mixture_names_each_taken_row(tok, tmp_path):
    """Shuffled, capped and duplicated mixture sources, an eval split drawn: each row's named line is the row
    the text came from (every row says which one it is)."""
    import yaml
    from datasets import load_from_disk

    from beam_sft.dataset.mixture import read_mixture
    from beam_sft.dataset.prepare import PrepareRun

    files = {}
    for tag, n in (("A", 30), ("B", 20)):
        files[tag] = tmp_path / f"{tag}.jsonl"
        files[tag].write_bytes(b"".join(orjson.dumps({"messages": [
            {"role": "user", "content": f"{tag}-{i}: what is {i} + 1?"},
            {"role": "assistant", "content": f"{i + 1}.", "reasoning_content": "plus one."}]}) + b"\n"
            for i in range(n)))
    files["D"] = tmp_path / "D.jsonl"  # rows 3.. of A again
    files["D"].write_bytes(b"".join(files["A"].read_bytes().splitlines(keepends=True)[3:8]))
    config = tmp_path / "mix.yaml"
    config.write_text(yaml.safe_dump({"datasets": [
        {"path": str(files["A"]), "max_records": 25, "shuffle": 5}, {"path": str(files["B"]), "max_records": 15},
        {"path": str(files["D"])}]}))
    manifest = PrepareRun(read_mixture(config), tok, DataSettings(eval_split_size=0.2), tmp_path / "p",
                          chunk_rows=8).build()
    lines = {tag: path.read_bytes().splitlines() for tag, path in files.items()}
    kept = 0
    for sub in ("", "eval"):
        dataset = load_from_disk(str(tmp_path / "p" / sub))
        origins = row_origins(dataset)
        for ids, (source, line, by_line) in zip(dataset["input_ids"], origins.locate(list(range(len(dataset)))),
                                                 strict=True):
            text = orjson.loads(lines[Path(source).stem][line - 1])["messages"][0]["content"]
            assert by_line and text in tok.decode(ids)
        kept += len(dataset)
    assert kept == manifest["counts"]["records_kept"] and manifest["mixture"][2]["duplicates"] > 0


def test_the_reader_follows_the_dataset_or_declines(tok, tmp_path):
    """A path or a loaded split; a split reordered by train_test_split or select (as training splits a prepared
    directory) is followed through its indices; no sidecar (older data), an in-memory, mapped or streamed dataset: None."""
    from datasets import Dataset, load_from_disk

    from beam_sft.dataset.prepare import PrepareRun

    PrepareRun([SHAREGPT], tok, DataSettings(), tmp_path / "p").build()
    train = load_from_disk(str(tmp_path / "p"))
    whole = row_origins(tmp_path / "p")
    assert row_origins(tmp_path / "p" / ORIGINS_FILE).describe([0, 1]) == whole.describe([0, 1]) == \
        [f"{SHAREGPT}[0]", f"{SHAREGPT}[1]"]
    assert whole.names == [SHAREGPT] and len(whole) == len(train)
    parts = train.train_test_split(test_size=5, seed=0)  # indices in cache files after the split's own
    picked = train.select([7, 2, 5], keep_in_memory=True)  # indices in memory
    position = {tuple(ids): where for ids, where in zip(train["input_ids"], whole.describe(list(range(len(train)))),
                                                        strict=True)}
    assert row_origins(picked).describe([0, 1, 2]) == whole.describe([7, 2, 5])
    for part in parts.values():
        origins = row_origins(part)
        assert len(origins) == len(part)
        assert origins.describe(list(range(len(part)))) == [position[tuple(ids)] for ids in part["input_ids"]]
    with pytest.raises(IndexError):
        whole.describe([len(train)])
    assert row_origins(train.map(lambda row: {"n": len(row["input_ids"])})) is None
    assert row_origins(Dataset.from_dict({"input_ids": [[1]], "labels": [[1]]})) is None
    assert row_origins(train.to_iterable_dataset()) is None
    (tmp_path / "p" / ORIGINS_FILE).unlink()
    assert row_origins(tmp_path / "p") is None and row_origins(load_from_disk(str(tmp_path / "p"))) is None
