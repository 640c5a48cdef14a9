"""`--missing_reasoning mask|keep|reject` in the data phase (`beam-sft prepare`, scripts/train.py), its counts
and hints, and the experiment script (benchmarks/reasoning.py) that measures why `mask` is the default."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from beam_sft.cli import main as cli_main
from beam_sft.dataset.settings import DataSettings, fingerprint
from beam_sft.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


def _write(path: Path, rows: list) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


def _rows() -> list:
    """Five records: all turns with reasoning; one of two turns without; no reasoning (two turns, one, one)."""
    def turn(content, reasoning=""):
        return {"role": "assistant", "content": content, "reasoning_content": reasoning}

    user = {"role": "user", "content": "q"}
    return [{"messages": [user, turn("a", "r"), user, turn("b", "r")]},
            {"messages": [user, turn("a", "r"), user, turn("b")]},
            {"messages": [user, turn("a"), user, turn("b")]},
            {"messages": [user, turn("a")]}, {"messages": [user, turn("c")]}]


@pytest.mark.parametrize(("policy", "kept", "rejected", "turns", "without", "masked"), [
    ("mask", 2, {"nothing_to_train": 3}, 4, 1, 1),
    ("keep", 5, {}, 8, 5, 0),
    ("reject", 1, {"missing_reasoning": 4}, 2, 0, 0),
])
def test_prepare_applies_the_policy_and_counts_turns(tmp_path, capsys, policy, kept, rejected, turns, without,
                                                      masked):
    src = _write(tmp_path / "in.jsonl", _rows())
    out = tmp_path / "prepared"
    # most of these five records are rejected on purpose: --max_reject_share 1.0 lets the run pass
    assert cli_main(["prepare", str(src), "-o", str(out), "-q", "--missing_reasoning", policy,
                     "--max_reject_share", "1.0"]) == 0
    err = capsys.readouterr().err
    manifest = json.loads((out / "beam_sft_manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["missing_reasoning"] == policy
    assert counts["records_in"] == 5 and counts["records_kept"] == kept and counts["rejected"] == rejected
    assert counts["reasoning"]["without_reasoning"] == without and counts["reasoning"]["masked_turns"] == masked
    assert counts["reasoning"]["assistant_turns"] == turns
    assert "missing reasoning" in err and ("Beam never writes an empty analysis message" in err) == (policy == "keep")
    # 5 of the input's 8 turns have no reasoning, the rejected records' counted too (converted again as `keep`
    # would): the coverage says so, and the hint comes whatever the policy
    assert "3/8 (37.5%) of the input's assistant turns" in err
    assert "note: 5/8 assistant turns (62%) have no reasoning" in err


def test_policies_are_part_of_the_cache_fingerprint(tok):
    fps = {fingerprint("src", tok, DataSettings(missing_reasoning=p)) for p in ("mask", "keep", "reject")}
    assert len(fps) == 3
    with pytest.raises(UsageError, match="missing_reasoning"):
        DataSettings(missing_reasoning="drop").check()


def test_train_script_takes_the_option():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), "--help"], capture_output=True,
                         text=True, check=True, cwd=REPO).stdout
    assert "--missing_reasoning {mask,keep,reject}" in out


def _bench():
    return importlib.import_module("benchmarks.reasoning")


def test_bench_reasoning_mixes_the_samples_and_prints_a_table(tmp_path):
    bench = _bench()
    full, mixed, records = bench.make_data(tmp_path)
    originals = [json.loads(line) for line in full.read_text().splitlines()]
    assert len(records) == len(originals) > 100
    for k, (orig, rec) in enumerate(zip(originals, records, strict=True)):
        before = [m["reasoning_content"] for m in orig["messages"] if m["role"] == "assistant"]
        after = [m["reasoning_content"] for m in rec["messages"] if m["role"] == "assistant"]
        assert all(before)  # the samples have reasoning in every turn
        assert after == ([""] * len(before) if k % 2 else before)
    assert mixed.read_text().count("\n") == len(records)
    fig = {"turns": 40, "has_reasoning": 1.0, "empty_analysis": 0.0, "mean_analysis_tokens": 30.0,
           "well_formed": 0.8}
    table = bench.table([{"policy": "mask", "records_trained": 72, "eval": {"with": fig, "without": fig}}])
    assert "with reasoning (40 prompts)" in table and "100.0%" in table and len(table.splitlines()) == 3
    assert "--policies" in bench.make_parser().format_help()
