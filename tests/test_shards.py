"""`beam-sft prepare --shard I/N` + `--merge`: many machines prepare one dataset; the merge writes what one run
writes, byte for byte (duplicates across shards included), and refuses shards that do not belong together."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from beam_sft.dataset.settings import DataSettings
from beam_sft.errors import UsageError
from tests.test_data import OPENAI, SAMPLES, _hostile_file, _rejects

MANIFEST = "beam_sft_manifest.json"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST}


def _manifest(root: Path) -> dict:
    data = json.loads((root / MANIFEST).read_text())
    data.pop("seconds")
    return data


def _inputs(tmp_path: Path) -> list[str]:
    """Bad lines, and a copy of a file in another place: duplicates that fall in other chunks, hence other
    shards, than their first occurrences."""
    path, _ = _hostile_file(tmp_path)
    again = tmp_path / "again.jsonl"
    shutil.copyfile(OPENAI, again)
    return [str(path), OPENAI, str(SAMPLES / "sharegpt.json"), str(again)]


@pytest.mark.parametrize("n,eval_data", [(2, False), (3, True), (1, False)])
def test_merged_shards_equal_one_run_byte_for_byte(tok, tmp_path, n, eval_data):
    from beam_sft.dataset.prepare import PrepareRun

    inputs = _inputs(tmp_path)
    eval_inputs = [str(SAMPLES / "harmony.jsonl"), OPENAI] if eval_data else None  # OPENAI: eval dups of train
    settings = DataSettings(max_length=200, seed=1)
    one = PrepareRun(inputs, tok, settings, tmp_path / "one", chunk_rows=9, eval_inputs=eval_inputs,
                     fingerprint="fp", extra_manifest={"inputs_fingerprint": "q"}).build()
    shards = []
    for i in range(n):
        shard = PrepareRun(inputs, tok, settings, tmp_path / f"shard{i}", chunk_rows=9, eval_inputs=eval_inputs,
                           fingerprint="fp", num_proc=2 if i == 0 else None).shard((i, n))
        assert shard["shard"] == i and shard["of"] == n and shard["own"] == list(range(i, shard["chunks"], n))
        shards.append(tmp_path / f"shard{i}")
    before = [_tree(d) for d in shards]
    merged = PrepareRun(inputs, tok, settings, tmp_path / "merged", eval_inputs=eval_inputs,
                        fingerprint="fp", extra_manifest={"inputs_fingerprint": "q"}).merge(shards[::-1])
    assert _tree(tmp_path / "one") == _tree(tmp_path / "merged")
    assert _manifest(tmp_path / "one") == _manifest(tmp_path / "merged")
    assert [_tree(d) for d in shards] == before  # the shards are read, not changed
    counts = merged["counts"]
    assert counts["rejected"]["duplicate"] >= 6 and counts["rejected_total"] > 10
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]
    assert len(_rejects(tmp_path / "merged")) == counts["rejected_total"]
    assert one["counts"] == counts
    assert sum(name.endswith(".arrow") for name in _tree(tmp_path / "merged")) > 3


def test_shards_that_do_not_belong_together_are_refused(tok, tmp_path):
    from beam_sft.dataset.prepare import PrepareRun

    inputs = _inputs(tmp_path)
    settings = DataSettings(max_length=200)
    for i in range(3):
        PrepareRun(inputs, tok, settings, tmp_path / f"s{i}", chunk_rows=9, fingerprint="fp").shard((i, 3))
    PrepareRun(inputs, tok, settings, tmp_path / "other", chunk_rows=9, fingerprint="other").shard((1, 3))

    def merge(dirs, fingerprint="fp", **kw):
        PrepareRun(inputs, tok, kw.pop("settings", settings), tmp_path / "m",
                   fingerprint=fingerprint, **kw).merge([tmp_path / d for d in dirs])

    with pytest.raises(UsageError, match=r"shard\(s\) 2 of 3 missing"):
        merge(["s0", "s1"])
    with pytest.raises(UsageError, match="are both shard 1"):
        merge(["s0", "s1", "s1", "s2"])
    with pytest.raises(UsageError, match="another run's shard"):
        merge(["s0", "other", "s2"])
    with pytest.raises(UsageError, match="fingerprint fp, here zz"):
        merge(["s0", "s1", "s2"], fingerprint="zz")
    with pytest.raises(UsageError, match="not a shard directory"):
        merge(["s0", "s1", "s2", "."])
    (tmp_path / "s2" / "results" / "part-00002.json").unlink()
    with pytest.raises(UsageError, match="chunk 2's result is missing"):
        merge(["s0", "s1", "s2"])
    assert not (tmp_path / "m").exists()
    with pytest.raises(UsageError, match="needs all of them first"):
        PrepareRun(inputs, tok, DataSettings(eval_split_size=0.2), tmp_path / "x").shard((0, 2))
    with pytest.raises(UsageError, match="0 <= I < N"):
        PrepareRun(inputs, tok, settings, tmp_path / "x").shard((2, 2))


def test_the_prepare_command_shards_and_merges(tmp_path, monkeypatch, capsys):
    """`beam-sft prepare --shard I/N` twice, then `--merge`: DIR as one `beam-sft prepare` writes it (then up to
    date for it); usage errors named."""
    from beam_sft.cli.prepare import main

    monkeypatch.setattr("beam_sft.dataset.prepare.CHUNK_ROWS", 9)  # several chunks from the small samples
    inputs = _inputs(tmp_path)
    common = ["--max_length", "200", "-q", "--max_reject_share", "1.0"]  # built to drop: duplicates, bad lines
    assert main([*inputs, "-o", str(tmp_path / "one"), *common]) == 0
    for i in range(2):
        assert main([*inputs, "-o", str(tmp_path / f"s{i}"), "--shard", f"{i}/2", *common]) == 0
        assert (tmp_path / f"s{i}" / "beam_sft_shard.json").is_file()
    capsys.readouterr()
    assert main([*inputs, "-o", str(tmp_path / "merged"), "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--stats", str(tmp_path / "stats.json"), *common]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(tmp_path / "merged") and "merged 2 shards" in err
    assert _tree(tmp_path / "one") == _tree(tmp_path / "merged")
    assert _manifest(tmp_path / "one") == _manifest(tmp_path / "merged")
    assert json.loads((tmp_path / "stats.json").read_text())["counts"]["rejected"]["duplicate"] > 0
    assert main([*inputs, "-o", str(tmp_path / "merged"), *common]) == 0
    assert "is up to date" in capsys.readouterr().err
    # the same shards merged under other options: refused, naming why
    assert main([*inputs, "-o", str(tmp_path / "m2"), "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--max_length", "300", "-q"]) == 2
    assert "merge with the arguments the shards were prepared with" in capsys.readouterr().err
    for bad, message in ((["--shard", "2/2"], "0 <= I < N"), (["--shard", "x"], "expected I/N"),
                         (["--shard", "0/2", "--merge", "a"], "not both"),
                         (["--shard", "0/2", "--eval_split_size", "0.2"], "needs all of them first")):
        assert main([*inputs, "-o", str(tmp_path / "bad"), *bad, *common]) == 2
        assert message in capsys.readouterr().err
    assert main([*inputs, "-o", str(tmp_path / "one"), "--shard", "0/2", *common]) == 2  # a prepared DIR, not a shard
    assert "not a shard directory; refusing" in capsys.readouterr().err


def test_a_mixture_prepared_in_shards_equals_one_run(tok, tmp_path):
    """A `datasets:` mixture (fractions, a seeded sample, per-source formats) in 2 shards + merge: the manifest's
    per-source counts and the bytes of one run."""
    import orjson

    from beam_sft.dataset.mixture import resolve
    from beam_sft.dataset.prepare import PrepareRun

    a, c = tmp_path / "a.jsonl", tmp_path / "c.jsonl"
    a.write_bytes(b"".join(orjson.dumps({"messages": [
        {"role": "user", "content": f"A-{i % 40}: {i % 40} + 1?"},
        {"role": "assistant", "content": f"{i % 40 + 1}.", "reasoning_content": "add one"}]}) + b"\n"
        for i in range(60)))  # 20 copies
    c.write_bytes(b"".join(orjson.dumps({"conversations": [
        {"from": "human", "value": f"C-{i}: name {i}"}, {"from": "gpt", "value": f"<think>{i}.</think>it is {i}."}]})
        + b"\n" for i in range(50)))
    entries = [{"path": str(a), "fraction": 0.5}, {"path": str(c), "fraction": 0.5, "format": "sharegpt",
                                                    "shuffle": 3}]
    settings = DataSettings(max_length=200)
    one = PrepareRun(resolve(entries), tok, settings, tmp_path / "one", chunk_rows=8, fingerprint="fp").build()
    for i in range(2):
        PrepareRun(resolve(entries), tok, settings, tmp_path / f"s{i}", chunk_rows=8, fingerprint="fp").shard((i, 2))
    merged = PrepareRun(resolve(entries), tok, settings, tmp_path / "m",
                        fingerprint="fp").merge([tmp_path / "s0", tmp_path / "s1"])
    assert _tree(tmp_path / "one") == _tree(tmp_path / "m")
    assert _manifest(tmp_path / "one") == _manifest(tmp_path / "m")
    assert merged["mixture"] == one["mixture"] and merged["mixture"][0]["duplicates"] > 0
