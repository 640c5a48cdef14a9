"""The drop reports `beam-sft augment` and `beam-sft backfill` end with: by reason, counts and shares of the
input, each with what keeps it (issue 53)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
from test_backfill import MISSING, LocalServer, _run

from beam_sft.cli.augment import main as augment_main

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "samples" / "openai.jsonl"


def _report(err: str, head: str) -> list[str]:
    lines = err.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(head))
    end = next((k for k in range(start + 1, len(lines)) if not lines[k].startswith("  ")), len(lines))
    return lines[start:end]


def test_augment_ends_with_its_drops_by_reason(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    assert augment_main([str(SAMPLES), "-o", str(out), "--transform", "mask-names=1", "-q",
                         "--stats", str(tmp_path / "s.json")]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    err = capsys.readouterr().err
    dropped = _report(err, "dropped:")
    n_in, rejected = stats["records_in"], stats["rejected"]
    share = f"{100 * rejected / n_in:.1f}%"
    assert dropped[0] == (f"dropped: {rejected} of {n_in} input records ({share}) by reason, and what keeps "
                          "them (--rejects PATH lists each one):")
    assert len(dropped) == 1 + len(stats["rejected_by_reason"])
    for code, n in stats["rejected_by_reason"].items():
        assert any(line.split()[:3] == [code, str(n), f"{100 * n / n_in:.1f}%"]
                   and line.endswith("keep them: no switch: fix the records") for line in dropped)
    masked = stats["transforms"]["mask-names"]
    untouched = _report(err, "mask-names did not transform:")
    assert untouched[0].startswith(f"mask-names did not transform: {masked['skipped']['no_tools']} of "
                                   f"{masked['seen']} records it was given")
    assert untouched[1].split()[:2] == ["no_tools", str(masked["skipped"]["no_tools"])]
    assert "keep them: none: the transform does not fit such records" in untouched[1]


def test_augment_names_the_rejects_file_and_never_counts_not_sampled(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    data.write_bytes(orjson.dumps(row) + b"\n{\"shape\": 1}\n")
    assert augment_main([str(data), "-o", str(tmp_path / "o.jsonl"), "--transform", "irrelevance=0", "-q",
                         "--rejects", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    assert ("dropped: 1 of 2 input records (50.0%) by reason, and what keeps them (each one, with its line and what is "
            f"wrong: {tmp_path / 'r.jsonl'}):") in err
    assert "unknown_format       1   50.0%  keep them: name the format with --dataset_format" in err
    assert "not_sampled" not in err.split("dropped:")[1]  # the share P at work, not a drop


def test_augment_says_when_nothing_was_dropped(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    data.write_bytes(orjson.dumps(row) + b"\n")
    out = str(tmp_path / "o.jsonl")
    assert augment_main([str(data), "-o", out, "--transform", "irrelevance=1", "-q"]) == 0
    err = capsys.readouterr().err
    assert "dropped: nothing (all 1 input records kept)" in err
    assert "irrelevance did not transform: 1 of 1 records it was given (100.0%)" in err


def test_backfill_ends_with_the_rejected_records_and_refused_turns(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Hello {k}"},
                          {"role": "assistant", "content": f"Hi {k}!"}]} for k in range(3)]
    data.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n{not json\n")
    server = LocalServer(text="The assistant's next reply is: " * 20)  # repetitive: every answer refused
    try:
        assert _run(data, tmp_path / "out.jsonl", server.url) == 0
    finally:
        server.close()
    err = capsys.readouterr().err
    assert ("dropped: 1 of 4 input records (25.0%) by reason, and what keeps them (each one, with its line and what is "
            "wrong:") in err
    refused = _report(err, "refused by the filters:")
    assert refused[0] == ("refused by the filters: 3 of 3 turns without reasoning (100.0%) by reason, and "
                          "what keeps them:")
    assert refused[1].split()[:3] == ["repetitive", "3", "100.0%"]
    assert refused[1].endswith("keep them: no switch: a stronger teacher (--model); the turn trains without "
                               "reasoning (masked)")


def test_backfill_filters_with_a_switch_name_it(tmp_path, capsys):
    from test_backfill import _rows

    data = tmp_path / "in.jsonl"
    data.write_bytes(b"\n".join(orjson.dumps(r) for r in _rows()) + b"\n")
    server = LocalServer(text="The user asks about the weather, so I look it up for Paris.")
    try:
        assert _run(data, tmp_path / "out.jsonl", server.url, "--max-reasoning-tokens", "3") == 0
    finally:
        server.close()
    err = capsys.readouterr().err
    assert "dropped: nothing (all 6 input records kept)" in err
    refused = _report(err, "refused by the filters:")
    assert refused[0].startswith(f"refused by the filters: {MISSING} of {MISSING} turns without reasoning")
    assert refused[1].split()[:2] == ["too_long", str(MISSING)]
    assert refused[1].endswith("keep them: a larger --max-reasoning-tokens (0: no limit)")
