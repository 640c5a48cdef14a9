"""Lost data is loud (issue 53): every command that drops records ends with the drops by reason, as counts and
shares of the input, each with the switch that keeps them; the reasoning coverage is the input's; a run that
writes nothing, or drops more than --max_reject_share, exits non-zero after writing its outputs and rejects.

On small files written here: 30 OpenAI records with tools of which 10 have no reasoning, an Alpaca-shaped file,
a file of a shape no converter reads.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from beam_sft.cli.convert import main as convert_main
from beam_sft.cli.prepare import main as prepare_main
from beam_sft.dataset.drops import DroppedTooMuch
from beam_sft.dataset.settings import DataSettings
from beam_sft.errors import UsageError
from beam_sft.validate.convert import format_shapes

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _tool_record(i: int, reasoning: bool) -> dict:
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": f"City{i}"})}}]}
    final = {"role": "assistant", "content": f"It is sunny in City{i}."}
    if reasoning:
        call["reasoning_content"] = f"The user asks about City{i}: look it up."
        final["reasoning_content"] = "The tool says sunny."
    return {"messages": [{"role": "user", "content": f"Weather in City{i}?"}, call,
                         {"role": "tool", "tool_call_id": f"c{i}", "content": "sunny"}, final], "tools": TOOLS}


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def tools30(tmp_path) -> Path:
    """30 tool-calling records, two assistant turns each; every third (10) without reasoning."""
    return _write(tmp_path / "tools30.jsonl", [_tool_record(i, reasoning=i % 3 != 0) for i in range(30)])


def _run(main, argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


# --- beam-sft convert -----------------------------------------------------------------------------------------


def test_convert_says_what_it_dropped_and_counts_the_input_coverage(tmp_path, tools30, capsys):
    out, rejects, stats = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "stats.json"
    code, _, err = _run(convert_main, [tools30, "-o", out, "--rejects", rejects, "--stats", stats, "-q"], capsys)
    assert code == 0, err  # a third dropped: loud, but under the default share (0.5)
    assert _lines(out) == 20 and _lines(rejects) == 10
    assert f"dropped: 10 of 30 input records (33.3%) by reason, and what keeps them (each one, with its line and " \
           f"what is wrong: {rejects}):" in err
    line = next(x for x in err.splitlines() if x.strip().startswith("nothing_to_train") and "keep them" in x)
    assert "10" in line and "33.3%" in line and "--missing_reasoning keep" in line and "beam-sft backfill" in line
    # 60 assistant turns in the input, 20 of them (the rejected records') without reasoning; the kept: all 40
    assert "40/60 (66.7%) of the input's assistant turns; 40/40 (100.0%) of the kept records'" in err
    st = json.loads(stats.read_text())
    assert st["input_reasoning_coverage"] == round(40 / 60, 4) and st["reasoning_coverage"] == 1.0
    assert (st["rejected_assistant_turns"], st["rejected_without_reasoning"]) == (20, 20)


def test_convert_over_the_share_exits_2_after_writing_everything(tmp_path, tools30, capsys):
    out, rejects = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    code, _, err = _run(convert_main, [tools30, "-o", out, "--rejects", rejects, "-q", "--max_reject_share", "0.2"],
                        capsys)
    assert code == 2
    assert err.rstrip().splitlines()[-1] == (
        f"error: {tools30}: 10 of 30 input records dropped (33.3%: nothing_to_train 10), more than "
        "--max_reject_share 0.2; the lines above say what keeps each reason (--max_reject_share 1.0 accepts any "
        "share; the outputs and rejects are written)")
    assert _lines(out) == 20 and _lines(rejects) == 10  # nothing lost
    code, _, err = _run(convert_main, [tools30, "-o", out, "-q", "--max_reject_share", "1.5"], capsys)
    assert code == 2 and "--max_reject_share 1.5: a share of the input records, 0 to 1" in err


def test_a_shape_no_converter_reads_lists_the_shapes_and_the_keys(tmp_path, capsys):
    src = _write(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": f"a{i}"} for i in range(3)]
                 + [{"question": "q", "answer": "a", "id": 7}])
    out, rejects = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    # a real process: the exit status as a shell sees it
    proc = subprocess.run([sys.executable, "-m", "beam_sft.cli.convert", str(src), "-o", str(out), "--rejects",
                           str(rejects), "-q", "--max_reject_share", "1.0"], capture_output=True, text=True, cwd=ROOT,
                          check=False)
    assert proc.returncode == 2, proc.stderr  # nothing written fails whatever the share
    err = proc.stderr
    assert out.read_text() == "" and _lines(rejects) == 4
    assert re.search(r"unknown_format +4 +100\.0% +keep them: give them a shape listed below", err)
    assert "keys the input had: {answer, question} (3 records); {answer, id, question} (1 record)" in err
    for shape in format_shapes():
        assert f"      {shape}\n" in err
    assert err.rstrip().splitlines()[-1] == (
        f"error: no usable records in {src}: all 4 input records were dropped (unknown_format 4); the lines above "
        "say what keeps each reason")


def test_an_alpaca_file_without_reasoning_writes_nothing_and_fails(tmp_path, capsys):
    src = _write(tmp_path / "alpaca.jsonl", [{"instruction": f"Add {i} and 2.", "input": "", "output": str(i + 2)}
                                             for i in range(5)])
    out = tmp_path / "out.jsonl"
    code, _, err = _run(convert_main, [src, "-o", out, "-q"], capsys)
    assert code == 2 and out.read_text() == ""
    assert f"error: no usable records in {src}: all 5 input records were dropped (" in err
    assert "dropped: 5 of 5 input records (100.0%)" in err and "(--rejects PATH lists each one)" in err
    table = [x for x in err.splitlines() if re.match(r"  \S+ +5 +100\.0% +keep them: ", x)]
    assert len(table) == 1  # one reason, with what keeps it


def test_duplicates_name_the_switch_that_keeps_them(tmp_path, capsys):
    rows = [_tool_record(i, reasoning=True) for i in range(8)]
    src = _write(tmp_path / "dups.jsonl", rows + rows[:2])
    code, _, err = _run(convert_main, [src, "-o", tmp_path / "out.jsonl", "-q"], capsys)
    assert code == 0, err
    assert "dropped: 2 of 10 input records (20.0%)" in err
    assert re.search(r"duplicate +2 +20\.0% +keep them: --dedup false", err)
    code, _, err = _run(convert_main, [src, "-o", tmp_path / "out.jsonl", "-q", "--dedup", "false"], capsys)
    assert code == 0 and "dropped: nothing (all 10 input records kept)" in err


# --- beam-sft prepare -----------------------------------------------------------------------------------------


def test_prepare_reports_drops_and_refuses_over_the_share_on_cached_runs_too(tmp_path, tools30, capsys):
    out = tmp_path / "prepared"
    code, stdout, err = _run(prepare_main, [tools30, "-o", out, "-q"], capsys)
    assert code == 0 and stdout.strip() == str(out)
    assert f"dropped: 10 of 30 input records (33.3%) by reason, and what keeps them (each one, with its line and " \
           f"what is wrong: {out / 'rejects.jsonl'}):" in err
    assert "40/60 (66.7%) of the input's assistant turns; 40/40 (100.0%) of the kept records'" in err
    manifest = json.loads((out / "beam_sft_manifest.json").read_text())
    assert manifest["counts"]["reasoning"]["rejected_assistant_turns"] == 20
    # the same directory, now up to date: the share is checked again (it is no part of the fingerprint)
    code, stdout, err = _run(prepare_main, [tools30, "-o", out, "-q", "--max_reject_share", "0.3"], capsys)
    assert code == 2 and stdout == "" and "is up to date" in err
    assert err.rstrip().endswith("more than --max_reject_share 0.3; the lines above say what keeps each reason "
                                 "(--max_reject_share 1.0 accepts any share; the outputs and rejects are written)")
    assert _lines(out / "rejects.jsonl") == 10


def test_prepare_max_length_below_every_record_names_the_shortest(tmp_path, tools30, capsys):
    out = tmp_path / "p40"
    code, _, err = _run(prepare_main, [tools30, "-o", out, "-q", "--max_length", "40"], capsys)
    assert code == 2
    last = err.rstrip().splitlines()[-1]
    found = re.fullmatch(rf"error: {re.escape(str(tools30))}: no training records left: all 20 converted records "
                         r"are longer than --max_length 40 \(10 others rejected: nothing_to_train 10\); the "
                         r"shortest is (\d+) tokens: raise --max_length to at least \1, or use --truncation_policy "
                         r"keep_start", last)
    assert found, last
    assert (out / "beam_sft_manifest.json").is_file() and _lines(out / "rejects.jsonl") == 10  # written
    assert re.search(r"too_long +20 +66\.7% +keep them: a larger --max_length", err)
    # the length named is the shortest record's: it keeps one whole, one token less keeps none
    shortest = int(found.group(1))
    common = [tools30, "-q", "--truncation_policy", "drop", "--max_reject_share", "1.0"]
    assert _run(prepare_main, [*common, "-o", tmp_path / "a", "--max_length", shortest], capsys)[0] == 0
    assert json.loads((tmp_path / "a" / "beam_sft_manifest.json").read_text())["counts"]["records_kept"] >= 1
    code, _, err = _run(prepare_main, [*common, "-o", tmp_path / "b", "--max_length", shortest - 1], capsys)
    assert code == 2 and "no training records left" in err


# --- training's data phase ------------------------------------------------------------------------------------


def test_the_data_phase_logs_the_drops_and_holds_to_the_share(tok, tmp_path, tools30, caplog):
    from beam_sft.dataset.prepare import prepare_data

    caplog.set_level(logging.WARNING, logger="beam_sft.dataset.prepare")
    with pytest.raises(DroppedTooMuch, match=r"10 of 30 input records dropped \(33\.3%: nothing_to_train 10\), "
                                             r"more than --max_reject_share 0\.2"):
        prepare_data(str(tools30), tok, DataSettings(max_reject_share=0.2), cache_dir=tmp_path / "cache")
    assert any("dropped: 10 of 30 input records (33.3%)" in r.message for r in caplog.records)
    built = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("prepared-")]
    assert len(built) == 1 and _lines(built[0] / "rejects.jsonl") == 10  # written before the refusal
    caplog.clear()
    prepared = prepare_data(str(tools30), tok, DataSettings(), cache_dir=tmp_path / "cache")  # the same cache
    assert prepared.action == "loaded" and len(prepared.train) == 20
    assert any(re.search(r"nothing_to_train +10 +33\.3% +keep them: --missing_reasoning keep", r.message)
               for r in caplog.records)


def test_the_share_is_a_checked_data_setting():
    with pytest.raises(UsageError, match="--max_reject_share -0.1: a share of the input records, 0 to 1"):
        DataSettings(max_reject_share=-0.1).check()
    DataSettings(max_reject_share=1.0).check()


def test_inspect_stats_say_what_training_would_drop(tools30, capsys):
    from beam_sft.cli.inspect import main as inspect_main

    code, out, err = _run(inspect_main, [tools30, "--stats", "--max_length", "1000"], capsys)
    assert code == 0, err
    assert "dropped: 10 of 30 input records (33.3%) by reason, and what keeps them:" in out
    assert re.search(r"nothing_to_train +10 +33\.3% +keep them: --missing_reasoning keep", out)


def test_prepare_of_a_shape_no_converter_reads_writes_its_rejects_and_fails(tok, tmp_path, capsys):
    from beam_sft.dataset.prepare import prepare_data

    src = _write(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": f"a{i}"} for i in range(3)]
                 + [{"question": "q", "answer": "a", "id": 7}])
    out = tmp_path / "prepared"
    code, stdout, err = _run(prepare_main, [src, "-o", out, "-q"], capsys)
    assert code == 2 and stdout == ""
    assert err.rstrip().splitlines()[-1] == (
        f"error: no usable training records in {src}: all 4 input records were dropped (unknown_format 4); the "
        "lines above say what keeps each reason")
    assert all(f"      {shape}\n" in err for shape in format_shapes())
    manifest = json.loads((out / "beam_sft_manifest.json").read_text())
    assert manifest["counts"]["unknown_format_keys"] == {"answer, question": 3, "answer, id, question": 1}
    assert _lines(out / "rejects.jsonl") == 4
    # the directory it wrote cannot train: training says so in one line, not with an empty dataset
    with pytest.raises(DroppedTooMuch, match="no usable training records"):
        prepare_data(str(out), tok, DataSettings(max_length=1024), cache_dir=tmp_path / "cache")
