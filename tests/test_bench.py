"""benchmarks/data.py (its rows in benchmarks/rows/) and benchmarks/gpu.py: the workload, the goal table, and
smoke runs of both scripts."""

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _load(name: str):
    # The workload imports scripts/make_samples.py, a build helper: scripts/ on the path, as benchmarks/data.py puts it.
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    return importlib.import_module(f"benchmarks.{name.replace('/', '.')}")


@pytest.fixture(scope="module")
def workload():
    return _load("rows/workload")


@pytest.fixture(scope="module")
def goal_table():
    return _load("rows/goals")


@pytest.fixture(scope="module")
def bench_gpu():
    return _load("gpu")


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def test_workload_is_deterministic_and_has_reasoning_tools_and_turns(workload):
    a, b = workload.make_workload(200, seed=7), workload.make_workload(200, seed=7)
    assert a == b
    assert a != workload.make_workload(200, seed=8)
    assistants = [m for r in a for m in r["messages"] if m["role"] == "assistant"]
    assert all(m.get("reasoning_content") for m in assistants), "every assistant message reasons"
    assert sum(1 for m in assistants if m.get("tool_calls")) >= 50
    assert sum(1 for r in a if sum(m["role"] == "user" for m in r["messages"]) >= 2) >= 50
    assert sum(1 for m in assistants for c in m.get("tool_calls") or () if len(m["tool_calls"]) == 2) >= 5


def test_openai_rows_convert_back_to_the_generated_records(workload):
    from beam_sft.validate.convert import convert

    for i, record in enumerate(workload.make_workload(40, seed=3)):
        beam = convert(workload.to_openai(record, i), "openai")[0]
        for m in beam["messages"]:
            m.pop("tool_call_id", None)
            for call in m.get("tool_calls") or ():
                call.pop("id", None)
        assert beam == record, f"record {i}"


def test_written_jsonl_reaches_the_target_size(workload, tmp_path):
    path = tmp_path / "in.jsonl"
    rows = workload.write_openai_jsonl(path, 200_000, pool_size=20)
    lines = path.read_bytes().splitlines()
    assert len(lines) == rows
    assert 200_000 <= path.stat().st_size < 200_000 + max(map(len, lines)) + 1
    rows_read = [json.loads(line) for line in lines]
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows_read)
    assert rows_read[0] == rows_read[20]  # the pool of 20 conversations is cycled


def _figures(**over):
    fig = {
        "masked_tokenization": {"ours": 150.0, "trl": 100.0, "floor": 160.0, "floor_raw": 170.0,
                                "encode_dataset": {"1": {"conv_per_s": 100.0, "speedup": 1.0, "efficiency": 1.0},
                                                   "2": {"conv_per_s": 170.0, "speedup": 1.7, "efficiency": 0.85}}},
        "conversion": {"ours": 4000.0, "floor": 10000.0},
        "training": {"padded_tokens_per_s": 900.0, "packed_tokens_per_s": 1000.0, "packed_real_token_fraction": 1.0,
                     "packed_bin_fill": 0.96, "padded_real_token_fraction": 0.7},
        "memory": {"input_mb": 2048.0, "cli_rows_per_s": 3000.0, "cli_mb_per_s": 9.0},
        "peak_rss_mb": 1023.0,
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            fig[section][field] = value
        else:
            fig[section] = value
    return fig


def test_goals_pass_at_their_thresholds(goal_table):
    goals = {g["name"].strip(): g["ok"] for g in goal_table.evaluate_goals(_figures())}
    assert goals["masked tokenization vs TRL (1 process)"] is True  # exactly 1.5x
    assert goals["masked tokenization vs floor (1 process)"] is True  # 94%
    assert goals["encode_dataset num_proc=2"] is True
    assert goals["encode_dataset num_proc=1"] is None  # no goal for the baseline
    assert goals["conversion OpenAI -> Beam vs orjson load+dump"] is True  # exactly 40%
    assert goals["training tiny model: real tokens/s, packed vs padded"] is True
    assert goals["training: packed real-token fraction (min of computed, bin fill)"] is True
    assert goals["peak RSS converting a 2,048 MiB JSONL"] is True


@pytest.mark.parametrize(
    ("override", "goal"),
    [
        ({"masked_tokenization__trl": 101.0}, "masked tokenization vs TRL (1 process)"),
        ({"masked_tokenization__floor": 167.0}, "masked tokenization vs floor (1 process)"),
        ({"conversion__floor": 10001.0}, "conversion OpenAI -> Beam vs orjson load+dump"),
        ({"training__packed_tokens_per_s": 900.0}, "training tiny model: real tokens/s, packed vs padded"),
        ({"training__packed_bin_fill": 0.94}, "training: packed real-token fraction (min of computed, bin fill)"),
        ({"peak_rss_mb": 1024.0}, "peak RSS converting a 2,048 MiB JSONL"),
    ],
)
def test_goals_fail_just_past_their_thresholds(goal_table, override, goal):
    goals = {g["name"].strip(): g["ok"] for g in goal_table.evaluate_goals(_figures(**override))}
    assert goals[goal] is False


def test_scaling_goal_fails_below_80_percent_of_linear(goal_table):
    fig = _figures()
    fig["masked_tokenization"]["encode_dataset"]["2"] = {"conv_per_s": 150.0, "speedup": 1.5, "efficiency": 0.75}
    goals = {g["name"].strip(): g["ok"] for g in goal_table.evaluate_goals(fig)}
    assert goals["encode_dataset num_proc=2"] is False


def test_pack_bfd_fills_bins_within_max_length(bench_gpu):
    examples = [([0] * n, [0] * n) for n in (700, 300, 500, 500, 1000, 24, 999, 1)]
    bins = bench_gpu.pack_bfd(examples, 1024)
    assert sorted(i for b in bins for i in b) == list(range(len(examples)))
    assert all(sum(len(examples[i][0]) for i in b) <= 1024 for b in bins)
    assert len(bins) == 4  # 1000+24, 999+1, 700+300, 500+500


@pytest.mark.slow
def test_bench_smoke_writes_every_figure(tmp_path):
    """Through the one entry (`python -m benchmarks data`): the figures, and the run's row in the results file."""
    out, results = tmp_path / "bench.json", tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--results", str(results), "data", "--smoke", "--json", str(out),
         "--tmp_dir", str(tmp_path)],
        check=False, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fig = json.loads(out.read_text())
    (row,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["benchmark"] == "data" and row["exit"] == 0 and row["figures"] == fig
    assert row["args"][:1] == ["--smoke"] and row["versions"]["torch"] and row["machine"]["cores"] >= 1
    assert row["git"]["commit"]
    for row, keys in {
        "masked_tokenization": ("ours", "trl", "floor"),
        "conversion": ("ours", "floor"),
        "training": ("padded_tokens_per_s", "packed_tokens_per_s", "packed_real_token_fraction"),
    }.items():
        for key in keys:
            assert _positive(fig[row][key]), f"{row}.{key} = {fig[row].get(key)!r}"
    assert _positive(fig["peak_rss_mb"])
    assert fig["masked_tokenization"]["mismatches_vs_trl"] == 0
    assert fig["conversion"]["rejected"] == 0 and fig["conversion"]["roundtrip_ok"] is True
    assert fig["training"]["packed_real_token_fraction"] <= 1.0
    assert 0 < fig["training"]["padded_real_token_fraction"] <= 1.0
    assert fig["memory"]["output_rows"] == fig["memory"]["rows"] > 0
    assert "| masked tokenization vs TRL (1 process) |" in proc.stdout
    assert not any(p.name.startswith("beam-sft-bench-") for p in tmp_path.iterdir()), "work dir left behind"


@pytest.mark.slow
def test_bench_gpu_cpu_tiny_smoke(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--no-record", "gpu", "--device", "cpu", "--tiny", "--dtype", "fp32",
         "--max_length", "512", "--json", str(out)],
        check=False, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fig = json.loads(out.read_text())
    for mode in ("padded", "packed"):
        r = fig[mode]
        assert r["steps"] == 3
        for key in ("tokens_per_s", "mfu", "mfu_with_attention", "real_tokens", "params", "final_loss"):
            assert _positive(r[key]), f"{mode}.{key} = {r[key]!r}"
        assert r["mfu_with_attention"] > r["mfu"]
        assert 0 < r["real_token_fraction"] <= 1.0
    assert fig["padded"]["real_token_fraction"] < 1.0  # the generated conversations differ in length
    assert "| packed" in proc.stdout
