"""`convert-dataset` / `beam-sft convert`: end to end on the bundled samples and the real files.

Every run must account for every record (in = out + rejected), write outputs atomically, keep input order
with any --dataset_num_proc, and exit 0 / 1 / 2 with one clean line on errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from beam_sft.cli import main as beam_sft_main
from beam_sft.cli.convert import main
from beam_sft.errors import EXIT_INTERNAL_ERRORS
from beam_sft.validate.rules import make_render_check

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "samples"
REALDATA = Path(__file__).parent / "data" / "realdata"
RENDER = make_render_check()


def run(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_jsonl(path: Path) -> list:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_samples_convert_with_rejects_stats_and_every_output_renders(tmp_path, capsys):
    out, rej, stats = tmp_path / "beam.jsonl", tmp_path / "rej.jsonl", tmp_path / "stats.json"
    code, _, err = run([*sorted(SAMPLES.iterdir()), "-o", out, "--rejects", rej, "--stats", stats, "-q"], capsys)
    assert code == 0, err
    records, rejects, st = read_jsonl(out), read_jsonl(rej), json.loads(stats.read_text())
    assert st["records_in"] == len(records) + len(rejects) == st["records_out"] + st["rejected_total"]
    # 144 valid records, 3 of them exact copies of another (two in harmony.jsonl, one shared by ShareGPT and
    # OpenAI): rejected as `duplicate`, the first kept (tests/test_dedup.py)
    assert st["records_out"] == len(records) == 141 and st["rejected"]["duplicate"] == 3
    # every sample file holds 2-4 deliberately bad records, each rejected for a different reason
    by_file: dict[str, set] = {}
    for r in rejects:
        if r["reason"] != "duplicate":
            by_file.setdefault(Path(r["source"]).name, set()).add(r["reason"])
        assert r["message"] and ("line" in r or "index" in r)
    assert {k: len(v) for k, v in by_file.items()} == {"openai.jsonl": 4, "sharegpt.json": 3, "harmony.jsonl": 3}
    # the good records teach the format: reasoning on every assistant turn, tool calls, several efforts
    assert st["reasoning_coverage"] == 1.0 and st["tool_calls"] > 50 and st["parallel_call_turns"] > 5
    assert len(st["efforts"]) >= 5
    for rec in records:
        RENDER(rec)
    assert "records in" in err and "harmony.jsonl: harmony 51" in err and st["detected"]["openai"] == 52


def test_num_proc_keeps_input_order_and_limit(tmp_path, capsys):
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    args = [*sorted(SAMPLES.iterdir()), "-q", "--render-check", "sample"]
    assert run([*args, "-o", one], capsys)[0] == 0
    assert run([*args, "-o", two, "--dataset_num_proc", "2"], capsys)[0] == 0
    assert one.read_bytes() == two.read_bytes()
    lim = tmp_path / "lim.jsonl"
    stats = tmp_path / "s.json"
    assert run([SAMPLES / "openai.jsonl", "-o", lim, "--max_records", "10", "--stats", stats, "-q"], capsys)[0] == 0
    st = json.loads(stats.read_text())
    assert st["records_in"] == 10 and len(read_jsonl(lim)) == st["records_out"]


def test_real_data_every_file_accounted_for(tmp_path, capsys):
    out, rej, stats = tmp_path / "real.parquet", tmp_path / "rej.jsonl", tmp_path / "s.json"
    for policy in ("keep", "mask"):
        code, _, err = run([REALDATA / "openai", REALDATA / "sharegpt", REALDATA / "harmony", "-o", out,
                            "--rejects", rej, "--stats", stats, "-q", "--missing_reasoning", policy,
                            "--max_reject_share", "1.0"], capsys)  # most real records lack reasoning
        assert code == 0, err
        st = json.loads(stats.read_text())
        rejects = read_jsonl(rej)
        assert st["records_in"] == st["records_out"] + len(rejects)
        assert all(r["reason"] and r["message"] for r in rejects)
        assert "render_failed" not in st["rejected"]  # validation catches everything before the safety net
        if policy == "keep":
            kept = st["records_out"] + st["rejected"].get("duplicate", 0)
            assert kept > 700 and "nothing_to_train" not in st["rejected"]
    # Most third-party data has no reasoning: under the default those records have nothing to train (and a
    # record rejected as nothing_to_train is no longer there to be a duplicate).
    assert st["records_out"] + st["rejected"]["nothing_to_train"] + st["rejected"].get("duplicate", 0) == kept
    assert "beam-sft backfill" in err


def test_policies_from_the_command_line(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                          {"role": "system", "content": "late"}, {"role": "user", "content": "q"},
                          {"role": "assistant", "content": "b", "reasoning_content": "r"}]}]
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    out, stats = tmp_path / "o.jsonl", tmp_path / "s.json"
    run([src, "-o", out, "--stats", stats, "-q"], capsys)
    assert json.loads(stats.read_text())["rejected"] == {"late_system": 1}
    run([src, "-o", out, "--stats", stats, "-q", "--late-system", "move"], capsys)
    st = json.loads(stats.read_text())
    assert st["records_out"] == 1 and st["policy"] == {"moved_system": 1, "masked_missing_reasoning": 1}
    assert [m.get("weight") for m in json.loads(out.read_text())["messages"] if m["role"] == "assistant"] == [0, None]
    _, _, err = run([src, "-o", out, "--stats", stats, "-q", "--late-system", "move", "--missing_reasoning", "keep"],
                    capsys)
    assert json.loads(stats.read_text())["policy"] == {"moved_system": 1, "missing_reasoning": 1}
    assert "Beam never writes an empty analysis message" in err
    run([src, "-o", out, "--stats", stats, "-q", "--late-system", "move", "--missing_reasoning", "reject"], capsys)
    assert json.loads(stats.read_text())["rejected"] == {"missing_reasoning": 1}
    run([src, "-o", out, "--stats", stats, "-q", "--max-record-bytes", "50"], capsys)
    assert json.loads(stats.read_text())["rejected"] == {"record_too_large": 1}


def test_arrow_outputs_from_the_cli(tmp_path, capsys):
    import datasets

    d = tmp_path / "ds"
    assert run([SAMPLES / "openai.jsonl", "-o", d, "-q", "--render-check", "none"], capsys)[0] == 0
    ds = datasets.load_from_disk(str(d))
    ref = read_jsonl_from_cli(tmp_path, capsys)
    assert len(ds) == len(ref)
    for row, rec in zip(ds, ref, strict=True):
        assert RENDER(row) == RENDER(rec)


def read_jsonl_from_cli(tmp_path, capsys):
    out = tmp_path / "ref.jsonl"
    assert run([SAMPLES / "openai.jsonl", "-o", out, "-q"], capsys)[0] == 0
    return read_jsonl(out)


def test_usage_errors_exit_2_and_leave_nothing(tmp_path, capsys):
    code, _, err = run([tmp_path / "missing.jsonl", "-o", tmp_path / "o.jsonl"], capsys)
    assert code == 2 and err.strip().startswith("error:") and len(err.strip().splitlines()) == 1
    code, _, err = run([SAMPLES / "openai.jsonl", "-o", tmp_path / "o.csv"], capsys)
    assert code == 2 and "Traceback" not in err
    code, _, err = run([SAMPLES / "openai.jsonl", "-o", SAMPLES / "openai.jsonl"], capsys)
    assert code == 2 and "also an input" in err
    with pytest.raises(SystemExit) as info:
        main(["--dataset_format", "nope", str(SAMPLES / "openai.jsonl"), "-o", str(tmp_path / "o.jsonl")])
    assert info.value.code == 2
    assert list(tmp_path.iterdir()) == []


def _fault_every_third(monkeypatch):
    """Make every third record raise an unexpected exception inside the converters (a simulated bug)."""
    from beam_sft.validate import convert as formats

    calls = {"n": 0}
    real = formats.FORMATS["openai"]

    def flaky(rec):
        calls["n"] += 1
        if calls["n"] % 3 == 1:
            raise AttributeError("converter bug")
        return real(rec)

    monkeypatch.setitem(formats.FORMATS, "openai", flaky)


def test_an_unexpected_exception_rejects_one_record_as_internal_error_and_the_run_goes_on(tmp_path, capsys,
                                                                                          monkeypatch):
    clean, rej0 = tmp_path / "clean.jsonl", tmp_path / "rej0.jsonl"
    assert run([SAMPLES / "openai.jsonl", "-o", clean, "--rejects", rej0, "--dataset_format", "openai", "-q"], capsys)[0] == 0
    _fault_every_third(monkeypatch)
    out, rej, stats = tmp_path / "o.jsonl", tmp_path / "rej.jsonl", tmp_path / "stats.json"
    code, _, err = run([SAMPLES / "openai.jsonl", "-o", out, "--rejects", rej, "--stats", stats, "--dataset_format",
                        "openai", "-q"], capsys)
    assert code == EXIT_INTERNAL_ERRORS == 3
    n_in = len([line for line in (SAMPLES / "openai.jsonl").read_bytes().splitlines() if line.strip()])
    internal = [r for r in read_jsonl(rej) if r["reason"] == "internal_error"]
    assert len(internal) == (n_in + 2) // 3
    assert internal[0] == {"source": str(SAMPLES / "openai.jsonl"), "line": 1, "reason": "internal_error",
                           "message_index": None, "message": "AttributeError: converter bug"}
    st = json.loads(stats.read_text())
    assert st["rejected"]["internal_error"] == len(internal)
    assert st["records_in"] == n_in == st["records_out"] + st["rejected_total"]
    # the records that did not hit the fault come out exactly as in a clean run
    survivors = {r["line"] for r in internal} | {r["line"] for r in read_jsonl(rej0)}
    assert len(read_jsonl(out)) == n_in - len(survivors)
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"{len(internal)} record(s)" in warning[0] and "openai.jsonl:1:" in warning[0]
    assert "internal_error" in err and "Traceback" not in err
    # with BEAM_SFT_DEBUG the first one stops the run with its traceback, and nothing is written
    monkeypatch.setenv("BEAM_SFT_DEBUG", "1")
    debug_out = tmp_path / "debug.jsonl"
    with pytest.raises(AttributeError):
        main([str(SAMPLES / "openai.jsonl"), "-o", str(debug_out), "--dataset_format", "openai", "-q"])
    assert not debug_out.exists() and not [p for p in tmp_path.iterdir() if "beam-tmp" in p.name]


def test_internal_error_exit_status_from_the_command_line(tmp_path):
    """The same barrier through a real process: exit status 3, the warning on stderr, outputs complete."""
    out, rej = tmp_path / "o.jsonl", tmp_path / "rej.jsonl"
    code = f"""
import sys
from beam_sft.validate import convert as formats
real = formats.FORMATS["openai"]
def flaky(rec):
    if isinstance(rec, dict) and len(rec.get("messages") or ()) % 2:
        raise KeyError("injected")
    return real(rec)
formats.FORMATS["openai"] = flaky
from beam_sft.cli import main
sys.exit(main(["convert", {str(SAMPLES / "openai.jsonl")!r}, "-o", {str(out)!r}, "--rejects", {str(rej)!r},
               "--dataset_format", "openai", "-q", "--render-check", "none"]))
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BEAM_SFT_DEBUG": "", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 3, proc.stderr
    assert "warning:" in proc.stderr and "KeyError: 'injected'" in proc.stderr
    rejects = read_jsonl(rej)
    n_in = len([line for line in (SAMPLES / "openai.jsonl").read_bytes().splitlines() if line.strip()])
    assert any(r["reason"] == "internal_error" for r in rejects)
    assert len(read_jsonl(out)) + len(rejects) == n_in


def test_register_adds_the_same_command_as_a_subcommand(tmp_path, capsys):
    import argparse

    from beam_sft.cli import run_guarded
    from beam_sft.cli.convert import register

    parser = argparse.ArgumentParser(prog="beam-sft")
    register(parser.add_subparsers(dest="command"))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    args = parser.parse_args(["convert", str(SAMPLES / "sharegpt.json"), "-o", str(a), "-q"])
    assert run_guarded(args.func, args) == 0
    assert main([str(SAMPLES / "sharegpt.json"), "-o", str(b), "-q"]) == 0
    assert a.read_bytes() == b.read_bytes()


def test_beam_sft_dispatcher(tmp_path):
    import importlib.util

    from beam_sft.cli import COMMANDS

    missing = [m for m in COMMANDS.values() if importlib.util.find_spec(f"beam_sft.cli.{m}") is None]
    assert not missing, f"beam-sft registers commands without a module: {missing}"
    out = tmp_path / "a.jsonl"
    assert beam_sft_main(["convert", str(SAMPLES / "sharegpt.json"), "-o", str(out), "-q"]) == 0
    assert out.exists()


def test_console_script_runs(tmp_path):
    exe = Path(sys.executable).parent / "convert-dataset"
    if not exe.exists():
        pytest.skip("package not installed with its console scripts")
    proc = subprocess.run([str(exe), str(SAMPLES / "harmony.jsonl"), "-o", str(tmp_path / "o.jsonl"), "-q",
                           "--render-check", "none"], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "BEAM_SFT_DEBUG": ""})
    assert proc.returncode == 0, proc.stderr
    assert "records out" in proc.stderr and proc.stdout == ""


def test_samples_are_reproducible_from_the_generator(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_samples.py"), "--out", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for name in ("openai.jsonl", "sharegpt.json", "harmony.jsonl"):
        assert (tmp_path / name).read_bytes() == (SAMPLES / name).read_bytes(), name
    assert sum((SAMPLES / n).stat().st_size for n in ("openai.jsonl", "sharegpt.json", "harmony.jsonl")) < 300_000


def test_missing_reasoning_counts_nothing_to_train_and_points_to_backfill(tmp_path, capsys):
    from beam_sft.validate.reasoning import majority_hint

    src = tmp_path / "in.jsonl"
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 3 + \
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"},
                       {"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]},
         {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0},
                       {"role": "user", "content": "q"}, {"role": "assistant", "content": "b", "reasoning": "r"}]}]
    src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    out, stats = tmp_path / "o.jsonl", tmp_path / "s.json"
    _, _, err = run([src, "-o", out, "--stats", stats, "-q"], capsys)
    st = json.loads(stats.read_text())
    assert st["records_in"] == 5 and st["records_out"] == 2 and st["rejected"] == {"nothing_to_train": 3}
    assert st["policy"] == {"masked_missing_reasoning": 1, "masked_weight": 1}
    assert "beam-sft backfill" in err  # 5 of 7 turns lack reasoning (3 in the rejected records)
    assert majority_hint(4, 2) is None and majority_hint(0, 0) is None and "backfill" in majority_hint(4, 3)
    _, _, err = run([src, "-o", out, "--stats", stats, "-q", "--missing_reasoning", "keep", "--dedup", "false"],
                    capsys)
    st = json.loads(stats.read_text())
    assert st["records_out"] == 5 and st["policy"] == {"missing_reasoning": 4, "masked_weight": 1}
    assert "beam-sft backfill" in err  # 5 of 7 turns lack reasoning
