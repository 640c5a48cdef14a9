"""Exact deduplication (beam_sft.records.dedup) in the data phase, `beam-sft prepare` and `convert-dataset`:
within a source, across sources and across formats, train -> eval, counted, the first occurrence kept."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from beam_sft.dataset.prepare import PrepareRun
from beam_sft.dataset.settings import REJECTS, DataSettings
from beam_sft.records.dedup import Seen, record_key


def _openai(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                         {"role": "assistant", "content": f"{2 * i}.", "reasoning_content": f"Add {i} twice."}]}


def _sharegpt(i: int) -> dict:
    """The same conversation as `_openai(i)`, in ShareGPT's shape."""
    return {"conversations": [{"from": "human", "value": f"What is {i} + {i}?"},
                              {"from": "gpt", "value": f"<think>Add {i} twice.</think>{2 * i}."}]}


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return str(path)


def _inputs(tmp_path: Path) -> tuple[list[str], int, int]:
    """Three files: a.jsonl with repeats inside it, b.jsonl repeating some of a.jsonl's, c.json (ShareGPT)
    repeating others in another format, plus a few unique records each. Returns (inputs, records, unique)."""
    a = [_openai(i) for i in range(20)] + [_openai(i) for i in range(0, 20, 4)]  # 5 repeats inside a
    b = [_openai(i) for i in range(15, 30)]  # 15..19 repeat a
    c = [_sharegpt(i) for i in range(25, 35)]  # 25..29 repeat b, in another format
    (tmp_path / "c.json").write_text(json.dumps(c))
    inputs = [_write_jsonl(tmp_path / "a.jsonl", a), _write_jsonl(tmp_path / "b.jsonl", b), str(tmp_path / "c.json")]
    return inputs, len(a) + len(b) + len(c), 35


def _rejects(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / REJECTS).read_text().splitlines()]


def _rows(path: Path, sub: str = "") -> list[tuple[int, ...]]:
    from datasets import load_from_disk

    return [tuple(ids) for ids in load_from_disk(str(path / sub))["input_ids"]]


def test_seen_keeps_the_first_and_names_it():
    seen = Seen()
    key = record_key(_openai(1))
    assert seen.check(key, "a.jsonl", 3) is None
    err = seen.check(key, "b.json", 7, by_line=False)
    assert err.code.value == "duplicate" and "a.jsonl:3" in err.message
    assert seen.check(record_key(_openai(2)), "b.json", 8, by_line=False) is None and len(seen) == 2
    # key order inside the record does not matter (two converters need not agree on it)
    assert record_key({"messages": _openai(1)["messages"]}) == record_key(dict(reversed(list(_openai(1).items()))))


@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_duplicates_within_across_sources_and_formats_are_removed_and_counted(tok, tmp_path, chunk_rows):
    inputs, n_in, n_unique = _inputs(tmp_path)
    manifest = PrepareRun(inputs, tok, DataSettings(), tmp_path / "p", chunk_rows=chunk_rows).build()
    counts = manifest["counts"]
    assert counts["records_in"] == n_in
    assert counts["records_kept"] == n_unique
    assert counts["rejected"] == {"duplicate": n_in - n_unique}
    rows = _rows(tmp_path / "p")
    assert len(set(rows)) == len(rows) == n_unique
    rejects = _rejects(tmp_path / "p")
    assert len(rejects) == n_in - n_unique
    by_source = {}
    for entry in rejects:
        by_source.setdefault(Path(entry["source"]).name, []).append(entry.get("line", entry.get("index")))
    # a.jsonl: its lines 21-25 repeat lines 1, 5, 9, 13, 17; b.jsonl: lines 1-5 repeat a; c.json: rows 0-4 repeat b
    assert by_source == {"a.jsonl": [21, 22, 23, 24, 25], "b.jsonl": [1, 2, 3, 4, 5], "c.json": [0, 1, 2, 3, 4]}
    first = next(e for e in rejects if e["source"].endswith("c.json"))
    assert "b.jsonl:11" in first["message"]  # _sharegpt(25) is b.jsonl's line 11
    # the kept rows' token counts are the rows' own (the duplicates were taken out of every count)
    assert counts["total_tokens"] == sum(len(r) for r in rows)
    assert counts["reasoning"]["assistant_turns"] == n_unique


def test_keep_duplicates_keeps_them(tok, tmp_path):
    inputs, n_in, _ = _inputs(tmp_path)
    manifest = PrepareRun(inputs, tok, DataSettings(dedup=False), tmp_path / "p", chunk_rows=7).build()
    assert manifest["counts"]["records_kept"] == n_in and manifest["counts"]["rejected_total"] == 0


@pytest.mark.parametrize("eval_split", [0.3, "inputs"])
def test_num_proc_1_and_2_give_the_same_bytes_with_duplicates(tok, tmp_path, eval_split):
    inputs, _, _ = _inputs(tmp_path)
    eval_inputs = [inputs[1]] if eval_split == "inputs" else None
    settings = DataSettings(eval_split_size=eval_split if isinstance(eval_split, float) else 0.0, seed=3)
    trees = []
    for procs in (1, 2):
        out = tmp_path / f"p{procs}"
        PrepareRun(inputs[::2], tok, settings, out, num_proc=procs, chunk_rows=6, eval_inputs=eval_inputs,
                   fingerprint="fp").build()
        trees.append({str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
                      if p.is_file() and p.name != "beam_sft_manifest.json"})
    assert trees[0] == trees[1]
    assert b"duplicate" in trees[0][REJECTS]


@pytest.mark.parametrize("eval_split", [0.3, "inputs"])
def test_no_eval_record_is_also_trained(tok, tmp_path, eval_split):
    """Drawn eval split: drawn among the records left after dedup. Separate eval data: its copies of training
    records go (the eval side loses them), and so do its own repeats."""
    inputs, _, _ = _inputs(tmp_path)
    eval_rows = [_openai(i) for i in range(10, 40)] + [_openai(39)]
    eval_inputs = [_write_jsonl(tmp_path / "eval.jsonl", eval_rows)] if eval_split == "inputs" else None
    settings = DataSettings(eval_split_size=eval_split if isinstance(eval_split, float) else 0.0, seed=1)
    manifest = PrepareRun(inputs, tok, settings, tmp_path / "p", chunk_rows=8, eval_inputs=eval_inputs).build()
    train, held = _rows(tmp_path / "p"), _rows(tmp_path / "p", "eval")
    assert held and not set(train) & set(held)
    assert len(set(train)) == len(train) and len(set(held)) == len(held)
    if eval_split == "inputs":
        assert len(held) == 5  # 35..39 are not training records
        assert manifest["splits"]["eval"]["records_kept"] == 5
    else:
        assert len(train) + len(held) == 35


def test_prepare_cli_keep_duplicates_and_default(tmp_path, capsys):
    from beam_sft.cli import main

    inputs, n_in, n_unique = _inputs(tmp_path)
    assert main(["prepare", *inputs, "-o", str(tmp_path / "d"), "-q", "--dataset_num_proc", "1"]) == 0
    assert "duplicate" in capsys.readouterr().err
    on = json.loads((tmp_path / "d" / "beam_sft_manifest.json").read_text())
    assert main(["prepare", *inputs, "-o", str(tmp_path / "k"), "-q", "--dataset_num_proc", "1", "--dedup", "false"]) == 0
    off = json.loads((tmp_path / "k" / "beam_sft_manifest.json").read_text())
    assert (on["counts"]["records_kept"], off["counts"]["records_kept"]) == (n_unique, n_in)


@pytest.mark.parametrize("eval_split", [0.3, "inputs"])
def test_eval_records_are_the_deduplicated_eval_split(tok, tmp_path, eval_split):
    """`eval_records` (scripts/train.py --eval_beam) holds out the same records as the prepared eval split."""
    from beam_sft.dataset.prepare import eval_records
    from beam_sft.render.encoder import encode_record

    inputs, _, _ = _inputs(tmp_path)
    eval_file = _write_jsonl(tmp_path / "eval.jsonl", [_openai(i) for i in range(30, 40)]) \
        if eval_split == "inputs" else None
    settings = DataSettings(eval_split_size=eval_split if isinstance(eval_split, float) else 0.0, seed=2)
    PrepareRun(inputs, tok, settings, tmp_path / "p", eval_inputs=[eval_file] if eval_file else None).build()
    records = list(eval_records(inputs, settings, tmp_path / "w", eval_dataset_name=eval_file))
    assert sorted(tuple(encode_record(tok, r)["input_ids"]) for r in records) == sorted(_rows(tmp_path / "p", "eval"))


@pytest.mark.parametrize("num_proc", [1, 2])
def test_convert_dataset_drops_duplicates_in_input_order(tmp_path, num_proc):
    from beam_sft.cli.convert import main

    inputs, n_in, n_unique = _inputs(tmp_path)
    out, rejects, stats = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "stats.json"
    args = [*inputs, "-o", str(out), "--rejects", str(rejects), "--stats", str(stats), "-q", "--dataset_num_proc",
            str(num_proc), "--render-check", "none"]
    assert main(args) == 0
    rows = out.read_text().splitlines()
    assert len(rows) == len(set(rows)) == n_unique
    counts = json.loads(stats.read_text())
    assert (counts["records_in"], counts["records_out"], counts["rejected"]) == (n_in, n_unique,
                                                                               {"duplicate": n_in - n_unique})
    assert counts["assistant_turns"] == counts["with_reasoning"] == n_unique  # the duplicates' taken back
    assert [json.loads(line)["reason"] for line in rejects.read_text().splitlines()] == ["duplicate"] * 15
    assert main([*args[:-4], "--dedup", "false", "--render-check", "none", "-o", str(tmp_path / "all.jsonl")]) == 0
    assert len((tmp_path / "all.jsonl").read_text().splitlines()) == n_in


def test_per_row_token_counts_match_the_rows_empty_ones_included():
    """With dedup each kept row carries its own token counts (taken back out when it turns out a duplicate):
    they are the sums over that row alone, whatever rows around it are empty."""
    import numpy as np

    from beam_sft.dataset.examples import label_batch

    rng = np.random.default_rng(0)
    stops = [7, 9]
    for _ in range(50):
        lengths = rng.integers(0, 6, rng.integers(1, 9))
        ids = [rng.choice([1, 2, 7, 9], n).tolist() for n in lengths]
        masks = [rng.integers(0, 2, n).tolist() for n in lengths]
        _, _, counts, rows = label_batch(ids, masks, True, stops, per_row=True)
        want = [{"total_tokens": len(i), "supervised_tokens": sum(m),
                 "supervised_return": sum(t == 7 and b for t, b in zip(i, m, strict=True)),
                 "supervised_call": sum(t == 9 and b for t, b in zip(i, m, strict=True))} for i, m in zip(ids, masks,
                                                                                                        strict=True)]
        assert rows == want, (ids, masks)
        assert counts == {k: sum(r[k] for r in want) for k in counts}


def test_seen_agrees_with_a_dict_through_many_grows():
    """The array table keeps exactly what a dict of first occurrences keeps, key 0 and collisions included."""
    import random

    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(20_000)]
    keys += [0, 0, 1, 4096, 8192, 1 << 63]  # 0 is stored as 1; equal low bits collide and probe
    stream = keys + rng.sample(keys, 5_000)
    rng.shuffle(stream)
    seen, first = Seen(), {}
    for position, key in enumerate(stream):
        err = seen.check(key, "s.jsonl", position)
        stored = key or 1
        if stored in first:
            assert err is not None and f"s.jsonl:{first[stored]} " in err.message, (position, key)
        else:
            assert err is None, (position, key)
            first[stored] = position
    assert len(seen) == len(first)
    assert seen.nbytes <= 16 * len(first) * 8 / 5 * 2  # at most 5/8 full after a doubling: < 52 bytes a record
