"""One conversion path (issue 18): `inspect`, the data phase, `eval` and `convert-dataset` read, convert and reject
every record the same way, because they all call `beam_sft.records.files.read_items` and
`beam_sft.validate.convert`.

Checked on the bundled samples (data/samples) and on every real third-party sample (tests/data/realdata).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from beam_sft.dataset.settings import DataSettings
from beam_sft.records.files import data_sources, normalize_record, read_items
from beam_sft.validate.convert import INPUT_FORMATS, convert_item

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted(str(p) for p in (REPO / "data" / "samples").iterdir())
REALDATA = sorted(str(p) for p in (REPO / "tests" / "data" / "realdata").iterdir() if p.is_dir())


def _where(reject: dict) -> tuple:
    return reject["source"], reject.get("line"), reject.get("index")


def _why(reject: dict) -> tuple:
    return reject["reason"], reject["message_index"], reject["message"]


@pytest.mark.parametrize("path", SAMPLES + REALDATA, ids=lambda p: Path(p).name)
def test_inspect_and_the_data_phase_reject_the_same_records_for_the_same_reasons(path, tmp_path):
    from beam_sft.dataset.pipeline import convert_records
    from beam_sft.eval.turns import read_held_out
    from beam_sft.report.masks import load_records

    phase = convert_records(path, tmp_path, DataSettings())
    loaded = load_records(path)
    assert loaded.total == phase.records_in > 0
    phase_rejects = {_where(r): _why(r) for r in phase.iter_rejects()}
    inspect_rejects = {_where(r): _why(r) for r in loaded.rejects}
    assert inspect_rejects == phase_rejects
    assert [int(p) for p in phase.rows] == loaded.positions
    # what they keep is the same record, byte for byte
    assert [orjson.dumps(r) for r in phase.iter_records()] == [orjson.dumps(r) for r in loaded.records]
    # eval reads its test data the same way, with one difference: a reference turn needs no reasoning to be
    # scored, so eval reads as `--missing_reasoning keep` does (nothing is `nothing_to_train` there)
    evaluated = list(read_held_out(path, split="train"))
    kept = load_records(path, missing_reasoning="keep")
    assert {_where(r): _why(r) for _, r, _ in evaluated if r is not None} == \
        {_where(r): _why(r) for r in kept.rejects}
    assert {_where(r): _why(r) for r in kept.rejects} == \
        {k: v for k, v in phase_rejects.items() if v[0] != "nothing_to_train"}
    assert [orjson.dumps(r) for r, _, _ in evaluated if r is not None] == \
        [orjson.dumps(r) for r in kept.records]
    del phase


def test_convert_dataset_rejects_the_same_records_for_the_same_reasons(tmp_path):
    from beam_sft.cli.convert import main
    from beam_sft.dataset.pipeline import convert_records

    for i, path in enumerate(SAMPLES + REALDATA):
        out, rejects = tmp_path / "out.jsonl", tmp_path / "rejects.jsonl"
        # (convert_records is the per-record stage: no deduplication, which is the data phase's and the CLI's)
        code = main([path, "-o", str(out), "--rejects", str(rejects), "-q", "--dedup", "false",
                     "--max_reject_share", "1"])
        assert code == (0 if out.read_bytes() else 2), path  # exit 2: a run that writes nothing (outputs kept)
        (tmp_path / f"work{i}").mkdir()
        phase = convert_records(path, tmp_path / f"work{i}", DataSettings())
        cli = [orjson.loads(line) for line in rejects.read_bytes().splitlines()]
        assert {_where(r): _why(r) for r in cli} == {_where(r): _why(r) for r in phase.iter_rejects()}, path
        # convert-dataset writes every row with all three keys; the records are the same
        written = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        kept = list(phase.iter_records())
        assert len(written) == len(kept), path
        for row, rec in zip(written, kept, strict=True):
            assert row["messages"] == rec["messages"] and row["tools"] == rec.get("tools"), path
        del phase


def test_beam_format_validates_what_convert_dataset_wrote_and_changes_nothing(tmp_path):
    """Records written by convert-dataset, read back with --dataset_format beam (what training does with them),
    are accepted unchanged by the same entry."""
    from beam_sft.cli.convert import main

    out = tmp_path / "beam.jsonl"
    assert main([*SAMPLES, "-o", str(out), "-q"]) == 0
    for item in read_items([str(out)]):
        record, name, reject = convert_item(item, "beam")
        assert reject is None and name == "beam"
        row = orjson.loads(item.payload)
        assert record["messages"] == row["messages"] and record.get("tools") == row["tools"]


def test_validated_records_need_no_second_normalisation():
    """The data phase used to run `normalize_record` over what validation returned; it changes nothing, so
    the one entry does not (the fuzz tests check the same on generated records)."""
    n = 0
    for item in read_items(SAMPLES + REALDATA):
        record, _, reject = convert_item(item, "auto")
        if reject is None:
            blob = orjson.dumps(record)
            assert orjson.dumps(normalize_record(orjson.loads(blob))) == blob, item.source
            n += 1
    assert n > 100


def test_rejects_files_are_skipped_by_every_reader(tmp_path):
    """A rejects file convert-dataset or the data phase wrote beside its output is not data — found in a
    directory or by a glob; named on its own it is read."""
    from beam_sft.errors import UsageError

    data = (REPO / "data" / "samples" / "openai.jsonl").read_bytes()
    (tmp_path / "train.jsonl").write_bytes(data)
    (tmp_path / "rejects.jsonl").write_bytes(b'{"source": "x", "line": 1, "reason": "bad_content"}\n')
    names = [Path(s.name).name for s in data_sources([str(tmp_path)])]
    assert names == ["train.jsonl"]
    assert [Path(s.name).name for s in data_sources([str(tmp_path / "*.jsonl")])] == ["train.jsonl"]
    assert [Path(s.name).name for s in data_sources([str(tmp_path / "rejects.jsonl")])] == ["rejects.jsonl"]
    only = tmp_path / "only"
    only.mkdir()
    (only / "rejects.jsonl").write_bytes(b"{}\n")
    with pytest.raises(UsageError, match="only rejects files"):
        data_sources([str(only)])


def test_input_formats_are_the_converters_and_beam():
    from beam_sft.validate.convert import FORMAT_NAMES

    assert INPUT_FORMATS == ("beam", *FORMAT_NAMES)


def test_a_record_that_cannot_be_stored_is_a_reject_not_a_crash(tmp_path, monkeypatch):
    """The data phase stores each kept record as JSON; one that will not serialise (a converter bug) is an
    `internal_error` reject with its provenance, and the run keeps the others: records in = out + rejected."""
    from beam_sft.dataset.pipeline import convert_records
    from beam_sft.validate import convert as conversion

    real = conversion.try_convert
    calls = {"n": 0}

    def leaky(payload, fmt="auto", *args, **kwargs):
        record, used, err = real(payload, fmt, *args, **kwargs)
        calls["n"] += 1
        if record is not None and calls["n"] == 2:
            record = {**record, "oops": {1, 2}}  # a set: no JSON for it
        return record, used, err

    monkeypatch.setattr(conversion, "try_convert", leaky)
    path = str(REPO / "data" / "samples" / "openai.jsonl")
    converted = convert_records(path, tmp_path, DataSettings())
    rejects = list(converted.iter_rejects())
    internal = [r for r in rejects if r["reason"] == "internal_error"]
    assert len(internal) == 1 and internal[0]["source"].endswith("openai.jsonl") and internal[0]["line"] == 2
    assert converted.records_in == len(list(converted.iter_records())) + len(rejects)
