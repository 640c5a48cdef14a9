"""benchmarks/prepare.py end to end on the bundled tokenizer, tiny sizes: every row runs, the workload is
real-sample-derived and unique, and the figures it reports are consistent (same bytes across --num-proc)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_prepare_smoke(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, "-m", "benchmarks", "--no-record", "prepare", "--tokenizer", str(REPO / "data" / "tokenizer"),
                    "--records", "120", "--num-proc", "1", "2", "--encoder-records", "60", "--trl-records", "30",
                    "--breakdown-records", "60", "--repeat", "2", "--rows", "setup", "encoder", "trl", "breakdown", "prepare", "convert", "shards",
                    "--json", str(out), "--work-dir", str(tmp_path)], check=True, capture_output=True, cwd=REPO)
    fig = json.loads(out.read_text())
    assert fig["pool"] > 100
    assert fig["trl"]["mismatches_vs_ours"] == 0
    # TRL's whole preparation ran on every record (the baseline of the "8x TRL" goal)
    assert fig["trl_prepare"]["records"] == 30 and fig["trl_prepare"]["tokens"] > 30 * 20
    assert any("x TRL's dataset preparation" in line for line in fig["summary"])
    runs = {run["num_proc"]: run for run in fig["prepare"]}
    assert runs[1]["records"] == runs[2]["records"] == 120
    assert runs[1]["data_sha256"] == runs[2]["data_sha256"] and runs[1]["fingerprint"] == runs[2]["fingerprint"]
    assert len(fig["prepare_runs"]) == 4 and len(runs[2]["wall_ratios"]) == 2  # two repeats, round robin
    assert len({r["data_sha256"] for r in fig["prepare_runs"]}) == 1
    assert len(fig["encoder_shared_tools"]["rates"]) == 2
    # the ratio to the encoder is taken within each repeat (encoder and prepare run side by side)
    assert len(fig["prepare_vs_encoder"]["120"]["ratios"]) == 2
    # and TRL's per-example call beside the encoder in each repeat: one ratio per repeat, by records and tokens
    assert len(fig["trl"]["rates"]) == 2 and fig["trl"]["records"] == 30
    assert all(len(fig["encoder_vs_trl"][unit]["ratios"]) == 2 for unit in ("records_per_s", "tokens_per_s"))
    assert any(line.startswith("encoder vs TRL per-example, within each repeat") for line in fig["summary"])
    b = fig["breakdown"]
    assert b["records"] == 60 and 0 < b["encode_s"] < b["cpu_s"] and 0 < b["convert_s"] < b["cpu_s"]
    assert any("same bytes in every run: True" in line for line in fig["summary"])
    conv = {run["num_proc"]: run for run in fig["convert"]}
    assert conv[1]["records"] == 120 and conv[1]["output_sha256"] == conv[2]["output_sha256"]
    shards = fig["shards"]  # 2 shards + merge: the single run's bytes
    assert shards["same_bytes"] and shards["merged_sha256"] == shards["one_run"]["data_sha256"]
    assert [step["step"] for step in shards["steps"]] == ["shard 0/2", "shard 1/2", "merge"]


def test_derived_records_are_unique_and_keep_the_tools():
    from benchmarks import prepare as bench_prepare

    pool = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
             "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]}]
    shared = bench_prepare.derived(pool, 3, 0, unique_tools=False)
    texts = [m["content"] for r in shared for m in r["messages"]]
    assert len(set(texts)) == len(texts)
    assert all(r["tools"] == pool[0]["tools"] for r in shared)
    unique = bench_prepare.derived(pool, 3, 0, unique_tools=True)
    assert len({r["tools"][0]["function"]["description"] for r in unique}) == 3
    assert pool[0]["tools"][0]["function"]["description"] == "d"  # the pool itself is untouched
