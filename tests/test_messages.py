"""Every message says what to do (issue 53): each error names the input, what is wrong and the next command or
flag, in one line with its exit status; a record of a JSON array is never written as if its index were a line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizer_factories import script_module

from beam_sft.cli import main as cli
from beam_sft.cli import train as train_cli
from beam_sft.errors import Reason, RecordError, reject_entry, reject_where, where

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"


def run(argv: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "beam_sft", *argv], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env})


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_eval_of_a_missing_model_directory_says_so_not_that_the_hub_is_unreachable(tmp_path):
    (tmp_path / "runs" / "m2").mkdir(parents=True)
    proc = run(["eval", "runs/m3", "--data", str(SAMPLES / "openai.jsonl")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        ("error: MODEL 'runs/m3': no such directory (runs holds m2); pass the directory scripts/train.py saved (its "
         "--output_dir, e.g. outputs/quickstart/model)")]


def test_eval_of_an_uncached_hub_id_offline_names_the_switch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli(["eval", "my-org/beam-ft", "--data", str(SAMPLES / "openai.jsonl")]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: MODEL 'my-org/beam-ft': no such directory, and as a hub id it is not in the "
                           "local cache while HF_HUB_OFFLINE=1 forbids downloading it (unset HF_HUB_OFFLINE")
    assert "huggingface.co" not in line
    (tmp_path / "runs" / "model-final").mkdir(parents=True)
    assert cli(["eval", "runs/model-fnal", "--data", str(SAMPLES / "openai.jsonl")]) == 2
    assert "no such directory (did you mean 'runs/model-final'?)" in errors(capsys.readouterr().err)[0]
    assert cli(["eval", "runs/model-final", "--adapter", "./lora", "--data", str(SAMPLES / "openai.jsonl")]) == 2
    assert errors(capsys.readouterr().err)[0].startswith("error: --adapter './lora': no such directory;")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--dataset_name", "a.jsonl", "b.json"],
     ("error: --dataset_name takes one dataset, and 'b.json' is a second: for several files give a glob "
      "(--dataset_name 'data/*.jsonl') or a directory, or list them under `datasets:` in a --config YAML")),
    (["--config", "quickstart", "--config", "quickstart"], "error: --config is given 2 times: one config per run"),
    (["--config", "quickstart", "--max_lenght", "64"],
     "error: unknown option '--max_lenght' (did you mean '--max_length'?)"),
    (["--config", "quickstart", "--learning_rate", "1e-4", "2e-4"],
     "error: --learning_rate takes one value, and '2e-4' is a second"),
])
def test_train_option_mistakes_say_what_was_meant(capsys, argv, expected):
    assert train_cli.main([*argv, "--dry_run", "true"]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(expected), line
    assert "fsdp_config" not in line


def test_a_json_array_record_is_named_by_its_index_a_jsonl_record_by_its_line():
    assert where("my_sharegpt.json", 4, by_line=False) == "my_sharegpt.json[4]"
    assert where("my.jsonl", 5) == "my.jsonl:5"
    err = RecordError(Reason.BAD_CONTENT, "content is an integer").with_provenance("my_sharegpt.json", 4, False)
    assert str(err) == "my_sharegpt.json[4]: [bad_content] content is an integer"
    # the rejects file keeps its fields: `index` for an array's record, `line` for a JSONL line
    entry = reject_entry(err, err.source, err.line, err.by_line)
    assert entry == {"source": "my_sharegpt.json", "index": 4, "reason": "bad_content", "message_index": None,
                     "message": "content is an integer"}
    assert reject_where(entry) == "my_sharegpt.json[4]"
    assert reject_where(reject_entry(err, "my.jsonl", 5)) == "my.jsonl:5"


def broken_sharegpt(tmp_path: Path) -> Path:
    ok = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    path = tmp_path / "my_sharegpt.json"
    path.write_text(json.dumps([ok, ok, {"conversations": [{"from": "human", "value": "hi"}]}, ok]))
    return path


def test_eval_and_inspect_name_a_json_record_by_its_index(tmp_path, tiny_model_dir, capsys):
    data = broken_sharegpt(tmp_path)
    assert cli(["eval", str(tiny_model_dir), "--data", str(data), "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert f"rejected: {data}[2] [no_assistant_turn]" in err
    assert f"{data}:2" not in err
    # the bar has the total (every record of the file) and reaches it; transformers' loading bar is not shown
    assert "Evaluating: 100%" in err and "4/4" in err and "Loading weights" not in err
    assert cli(["inspect", str(data), "--index", "1", "--index", "2", "--color", "never", "--missing_reasoning",
                "keep"]) == 0
    shown = capsys.readouterr()
    assert f"record 1 ({data}[1])" in shown.out
    assert f"record 2 ({data}[2]): rejected [no_assistant_turn]" in shown.err


def test_eval_progress_total_counts_what_will_be_read(tmp_path):
    from beam_sft.eval.turns import held_out_total

    arrays = len(json.loads((SAMPLES / "sharegpt.json").read_text()))
    lines = sum(1 for line in (SAMPLES / "openai.jsonl").read_text().splitlines() if line.strip())
    assert held_out_total(str(SAMPLES / "sharegpt.json")) == arrays
    assert held_out_total([str(SAMPLES / "sharegpt.json"), str(SAMPLES / "openai.jsonl")]) == arrays + lines
    assert held_out_total(str(SAMPLES / "openai.jsonl"), max_records=7) == 7
    assert held_out_total(str(tmp_path / "missing.jsonl"), max_records=3) == 3  # the reader says what is wrong
    from beam_sft.records.files import data_sources  # augment counts its sources for its two bars

    assert held_out_total(data_sources([str(SAMPLES / "sharegpt.json")])) == arrays


def test_contamination_names_a_json_record_by_its_index(tmp_path, capsys):
    pytest.importorskip("bfcl_eval")
    from beam_sft.eval.bfcl import checker

    question = checker.load_entries("simple_python")[0].question[0]["content"]
    rows = [{"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}
            for text in ("What is the weather like today in the hills?", question)]
    data = tmp_path / "train.json"
    data.write_text(json.dumps(rows))
    out = tmp_path / "c.json"
    assert cli(["contamination", str(data), "--bfcl", "simple_python", "--quiet", "--json", str(out)]) == 0
    assert f"question: {data}[1] message 0 ~ simple_python_0 (whole)" in capsys.readouterr().err
    hit = json.loads(out.read_text())["question_overlaps"][0]
    assert (hit["source"], hit["position"], hit["where"]) == (str(data), 1, f"{data}[1]")


def test_bfcl_install_hint_is_the_command_docs_give(tmp_path):
    docs = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    command = re.search(r"^# installed by `make install`; elsewhere: (pip install .+)$", docs, re.MULTILINE).group(1)
    shim = tmp_path / "shim" / "bfcl_eval"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'bfcl_eval'\")\n")
    proc = run(["contamination", str(SAMPLES / "openai.jsonl"), "--quiet"], tmp_path,
               PYTHONPATH=os.pathsep.join([str(tmp_path / "shim"), str(REPO)]))
    assert proc.returncode == 2, proc.stderr
    (line,) = errors(proc.stderr)
    assert command in line and "make install" in line, line
    assert "'beam-sft[bfcl]'" not in line  # `--no-deps` on the extra would skip the packages BFCL's checker needs


def test_demo_real_stops_at_the_failed_step_naming_it_and_its_log(tmp_path, tiny_model_dir, monkeypatch, capsys):
    demo = script_module("demo_real")
    out = tmp_path / "demo"
    with pytest.raises(demo.StepFailed) as failed, demo.step(out, "contamination", "3b (beam-sft contamination)"):
        demo.contamination(tmp_path / "no-data", out)  # no training files: the command refuses
    log = out / "logs" / "contamination.log"
    assert str(failed.value) == ("demo-real stopped at step 3b (beam-sft contamination): beam-sft contamination "
                                 f"exited with status 2; its log: {log}")
    assert "give INPUT files or --config" in log.read_text()
    assert not (out / "contamination.json").exists()

    # the whole script: --skip-train with no model trained before stops at step 5, in one line, exit 1
    monkeypatch.setattr(demo, "beam_base", lambda out, init: tiny_model_dir)
    assert demo.main(["--output-dir", str(out), "--skip-train", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last == ("demo-real stopped at step 5 (beam-sft eval on the held-out records): beam-sft eval exited with "
                    f"status 2; its log: {out / 'logs' / 'eval.log'}")
    assert "Traceback" not in err and "no such directory" in (out / "logs" / "eval.log").read_text()


def test_inspect_stats_shows_no_library_bars(tmp_path):
    proc = run(["inspect", str(SAMPLES / "openai.jsonl"), "--stats", "-n", "0"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"^(Map|Filter|Saving the dataset|Generating)", proc.stderr.replace("\r", "\n"), re.MULTILINE)


@pytest.mark.parametrize(("argv", "expected"), [
    (["convert", str(SAMPLES / "openai.jsonl"), "-o", "o.jsonl", "--dataset_format", "shargpt"],
     ("error: --dataset_format 'shargpt' is not one of auto, openai, sharegpt,", "(did you mean 'sharegpt'?)")),
    (["convert", str(SAMPLES / "openai.jsonl"), "-o", "o.jsonl", "--max_record", "3"],
     "error: unknown option '--max_record' (did you mean '--max_records'?); see beam-sft convert --help"),
    (["export", "model"], "error: beam-sft export needs -o/--output; see beam-sft export --help"),
    (["inspect", str(SAMPLES / "openai.jsonl"), "b.jsonl"], "error: unexpected argument 'b.jsonl': a second value"),
    (["eval", "m", "--data", "x.jsonl", "--turns", "second"], "error: --turns 'second' is not one of first, last, all"),
])
def test_argument_errors_are_one_line_with_the_nearest_and_the_help(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        cli(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.strip().splitlines() == [err.strip()], err
    first, *parts = (expected,) if isinstance(expected, str) else expected
    assert err.startswith(first) and all(part in err for part in parts), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "expected"), [
    (["contamination", str(SAMPLES / "openai.jsonl"), "--dataset_format", "opneai"],
     "(did you mean 'openai'?)"),
    (["contamination", str(SAMPLES / "openai.jsonl"), "--bfcl", "simple_pyhton"],
     "error: unknown BFCL category 'simple_pyhton' (did you mean 'simple_python'?)"),
    (["eval", "model", "--data", "missing.jsonl"], "error: missing.jsonl: no such file or directory"),
    (["export", "runs/nowhere", "-o", "served"], "error: CHECKPOINT 'runs/nowhere': no such directory"),
    (["beamify", "my-org/base", "-o", "beam-base"], "error: BASE 'my-org/base': no such directory, and as a hub id"),
    (["inspect", str(SAMPLES / "openai.jsonl"), "--tokenizer_name_or_path", "tok"],
     "error: --tokenizer_name_or_path 'tok': no such directory"),
    (["prepare", str(SAMPLES / "openai.jsonl")], "error: beam-sft prepare needs --output/-o; see beam-sft prepare --help"),
])
def test_a_mistaken_input_is_named_before_anything_loads(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli(argv) == 2
    err = capsys.readouterr().err
    (line,) = errors(err)
    assert expected in line and "huggingface.co" not in err and "Evaluating" not in err, err


def test_eval_rescore_and_gate_mistakes_say_what_to_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["eval", "--rescore", "bfcl.jsonl"]) == 2
    assert errors(capsys.readouterr().err) == [
        ("error: --rescore 'bfcl.jsonl': no such file; pass the --outputs file of an earlier `beam-sft eval MODEL "
         "--bfcl ... --outputs PATH.jsonl` run")]
    assert cli(["eval", "m", "--data", "x.jsonl", "--min-well-formed", "90"]) == 2
    assert errors(capsys.readouterr().err) == [
        "error: --min-well-formed 90.0: a fraction between 0 and 1 (0.9: 90% well formed)"]


def test_a_hub_lookup_of_a_missing_path_is_one_line_that_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert cli(["train", "--config", "quickstart", "--model_name_or_path", "nowhere/model", "--output_dir",
                str(tmp_path / "out"), "--dry_run", "true"]) == 1
    err = capsys.readouterr().err
    (line,) = errors(err)
    assert "looked up as a hub id: check the paths given; HF_HUB_OFFLINE=1 forbids downloading" in line
    assert "Check your internet connection" not in err


def test_backfill_says_when_no_request_reached_the_teacher(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = broken_sharegpt(tmp_path)
    out = tmp_path / "filled.jsonl"
    url = f"http://127.0.0.1:{port}/v1"
    assert cli(["backfill", str(data), "-o", str(out), "--base-url", url, "--model", "m", "--retries", "0", "-q"]) == 0
    err = capsys.readouterr().err
    assert (f"warning: 3 turn(s) got no answer after 0 retries (connection 3); no request reached the teacher at "
            f"--base-url {url}: start its server (docs/reasoning.md) or fix --base-url, then run the same command "
            "again") in err
    assert cli(["backfill", str(data), "-o", str(out), "--base-url", "127.0.0.1:8000", "--model", "m"]) == 2
    assert errors(capsys.readouterr().err) == [
        ("error: --base-url '127.0.0.1:8000' is not an http(s) URL; give the server's API root, e.g. "
         "http://127.0.0.1:8000/v1")]
