"""`beam-sft backfill` against real servers on the loopback interface.

The teacher is the tiny random model behind `tests/loopback_server.py` (a real OpenAI-compatible HTTP
server in its own process, on 127.0.0.1 and a free port, stopped by its pid at the end): `transformers
serve` would need FastAPI and Uvicorn, which the project does not install. Flaky and slow servers (5xx
answers, answers later than the client's timeout) are real `http.server` servers in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from loopback_server import make_handler

from beam_sft.backfill.filters import check
from beam_sft.cli.backfill import main as backfill_main

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _rows() -> list:
    """OpenAI-format rows without reasoning (one with some), and one line that is not JSON."""
    rows = []
    for k in range(5):
        rows.append({"messages": [{"role": "user", "content": f"Hello {k}"},
                                  {"role": "assistant", "content": f"Hi {k}!"},
                                  {"role": "user", "content": f"Weather in Paris {k}?"},
                                  {"role": "assistant", "tool_calls": [
                                      {"id": f"c{k}", "type": "function",
                                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                                  {"role": "tool", "tool_call_id": f"c{k}", "content": "sunny"},
                                  {"role": "assistant", "content": f"Sunny {k}."}],
                     "tools": [WEATHER, TIME]})
    rows.append({"messages": [{"role": "user", "content": "Q"},
                              {"role": "assistant", "content": "A", "reasoning_content": "Known already."},
                              {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]})
    return rows


MISSING = 5 * 3 + 1  # assistant turns without reasoning in _rows()


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [orjson.dumps(r) for r in _rows()]
    lines.insert(3, b"{not json")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _server(model_dir, tmp_path_factory, *extra):
    """tests/loopback_server.py over a model, in its own process; (base_url, request log)."""
    log = tmp_path_factory.mktemp("server") / "requests.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "loopback_server.py"), "--model",
                             str(model_dir), "--port", "0", "--log", str(log), *extra],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1", log
    finally:
        proc.kill()  # by its pid, even when a test failed
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def model_server(tiny_model_dir, tmp_path_factory):
    """The tiny model behind the loopback server, saying `finish_reason: stop` (it never ends a text itself;
    these tests are about the transport)."""
    yield from _server(tiny_model_dir, tmp_path_factory, "--delay", "0.3", "--finish-reason", "stop")


@pytest.fixture(scope="module")
def honest_server(tiny_model_dir, tmp_path_factory):
    """The tiny model behind the loopback server reporting the real `finish_reason` (`length`: it never
    writes its end-of-sequence token)."""
    yield from _server(tiny_model_dir, tmp_path_factory)


class LocalServer:
    """A real loopback HTTP server in a thread, answering canned text (after `fail_first` errors)."""

    def __init__(self, fail_first=0, fail_status=500, delay=0.0, text="The user asks; I answer from the result.",
                 finish_reason="stop"):
        args = SimpleNamespace(fail_first=fail_first, fail_status=fail_status, delay=delay, log=None,
                               max_new_tokens=16, finish_reason=finish_reason)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(lambda m, n: text, "canned", args))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.is_file() else 0


def _run(data, out, url, *extra):
    return backfill_main([str(data), "-o", str(out), "--base-url", url, "--model", "tiny", "-q",
                          "--stats", str(out) + ".stats.json", "--rejects", str(out) + ".rejects.jsonl", *extra])


def _read(path: Path) -> list:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_fills_missing_turns_in_order_against_a_real_server(model_server, data, tmp_path):
    url, log = model_server
    before = _requests(log)
    out = tmp_path / "out.jsonl"
    assert _run(data, out, url, "--concurrency", "3") == 0
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    records = _read(out)
    assert stats["records_in"] == 7 and stats["records_out"] == len(records) == 6
    assert stats["rejected"] == {"malformed_json": 1} and len(_read(Path(str(out) + ".rejects.jsonl"))) == 1
    assert [r["messages"][0]["content"] for r in records] == [r["messages"][0]["content"] for r in _rows()]
    assert stats["turns_missing"] == MISSING and stats["filled"] + sum(stats["filtered"].values()) == MISSING
    assert stats["filled"] > 0 and stats["requests"] == _requests(log) - before == MISSING
    for rec in records:
        for m in rec["messages"]:
            if m["role"] == "assistant" and m.get("reasoning_source"):
                assert m["reasoning_content"] and m["reasoning_source"].startswith("openai:tiny")
    assert records[5]["messages"][1]["reasoning_content"] == "Known already."  # untouched
    assert records[0]["messages"][3]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}  # reference kept
    # Later turns see the reasoning filled into earlier ones.
    prompts = [json.loads(line)["last"] for line in log.read_text().splitlines()[before:]]
    assert any("Assistant thinks: " in p for p in prompts)


def test_killed_mid_run_resumes_with_no_duplicate_or_lost_record(model_server, data, tmp_path):
    url, log = model_server
    out, cache = tmp_path / "out.jsonl", tmp_path / "cache.jsonl"
    before = _requests(log)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "beam_sft", "backfill", str(data), "-o", str(out), "--base-url",
                             url, "--model", "tiny", "--cache", str(cache), "--concurrency", "1", "-q"], env=env)
    try:
        deadline = time.monotonic() + 300
        while (not cache.is_file() or len(cache.read_bytes().splitlines()) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    cached = len(cache.read_bytes().splitlines())
    assert 4 <= cached < MISSING and not out.exists()  # killed before the end: no partial output
    first = _requests(log) - before
    assert _run(data, out, url, "--cache", str(cache)) == 0
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    resumed = _requests(log) - before - first
    assert stats["from_cache"] == cached and resumed == MISSING - cached  # each finished turn asked once
    assert first - cached <= 1  # at most the one call in flight when it was killed was lost
    keys = [json.loads(line)["key"] for line in cache.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == MISSING
    records = _read(out)
    assert [r["messages"][0]["content"] for r in records] == [r["messages"][0]["content"] for r in _rows()]


def test_5xx_answers_are_retried_with_backoff(data, tmp_path):
    server = LocalServer(fail_first=3, fail_status=503)
    try:
        out = tmp_path / "out.jsonl"
        assert _run(data, out, server.url, "--retry-wait", "0.01", "--concurrency", "1") == 0
        stats = json.loads(Path(str(out) + ".stats.json").read_text())
        assert stats["retried"] == 3 and stats["requests"] == MISSING + 3 and stats["failed"] == {}
        assert stats["filled"] == MISSING
    finally:
        server.close()


def test_a_server_that_keeps_failing_leaves_turns_unfilled_and_uncached(data, tmp_path, capsys):
    server = LocalServer(fail_first=10**6, fail_status=500)
    out, cache = tmp_path / "out.jsonl", tmp_path / "cache.jsonl"
    try:
        assert _run(data, out, server.url, "--retries", "1", "--retry-wait", "0.01", "--cache", str(cache)) == 0
    finally:
        server.close()
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["failed"] == {"http_500": MISSING} and stats["filled"] == 0 and stats["records_out"] == 6
    assert "run the same command again" in capsys.readouterr().err
    assert not cache.read_bytes().strip()  # failures are not cached: the next run asks again
    good = LocalServer()
    try:
        assert _run(data, out, good.url, "--cache", str(cache)) == 0
    finally:
        good.close()
    assert json.loads(Path(str(out) + ".stats.json").read_text())["filled"] == MISSING


def test_timeouts_are_counted_and_retried(data, tmp_path):
    server = LocalServer(delay=3.0)
    try:
        out = tmp_path / "out.jsonl"
        assert _run(data, out, server.url, "--timeout", "0.2", "--retries", "1", "--retry-wait", "0.01",
                    "--max_records", "1", "--concurrency", "1") == 0
    finally:
        server.close()
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["failed"] == {"timeout": 3} and stats["retried"] == 3 and stats["requests"] == 6


def test_filters_each_have_a_reason():
    ref_call = {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]}
    ref_answer = {"role": "assistant", "content": "Hi"}

    def count(text):
        return len(text.split())

    def run(text, ref=ref_call, max_tokens=5):
        return check(text, ref, [WEATHER, TIME], max_tokens=max_tokens, count_tokens=count)

    assert run("") == run("  \n") == run(None) == "empty"
    assert run("see <|channel|>final") == "harmony_marker"
    assert run("one two three four five six") == "too_long"
    assert run("I should use get_time here.") == "names_other_tool"
    assert run("I call get_weather for Paris.") is None
    assert run("No need for get_time.", ref=ref_answer) is None  # only checked against calls


def test_a_canned_filter_failure_is_cached_and_counted(data, tmp_path):
    server = LocalServer(text="Let me call get_time first.")
    try:
        out = tmp_path / "out.jsonl"
        assert _run(data, out, server.url) == 0
    finally:
        server.close()
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["filtered"] == {"names_other_tool": 5} and stats["filled"] == MISSING - 5
    assert stats["samples"] == {"names_other_tool": ["Let me call get_time first."] * 3}  # the first three
    call_turns = [r["messages"][3] for r in _read(out)[:5]]
    assert all(not m["reasoning_content"] and "reasoning_source" not in m for m in call_turns)


def test_review_prints_filled_turns_with_context_and_reference(data, tmp_path, capsys):
    server = LocalServer(text="The user asks about the weather, so I look it up for Paris.")
    try:
        assert _run(data, tmp_path / "out.jsonl", server.url, "--review", "2") == 0
    finally:
        server.close()
    printed = capsys.readouterr().out
    assert printed.count("=== filled turn") == 2 and "=== filled turn 2 of 2 ===" in printed
    first = printed.split("=== filled turn 2")[0]
    from beam_sft.backfill.prompt import PROMPT_VERSION

    assert "[user] Hello 0" in first and f"reasoning (openai:tiny (rationalize, {PROMPT_VERSION})):" in first
    assert "I look it up for Paris." in first and "reference:\n  Answer: Hi 0!" in first


def test_a_looping_teacher_is_filtered_counted_and_sampled(data, tmp_path, capsys):
    loop = "The assistant's next reply is: " * 20
    server = LocalServer(text=loop)
    try:
        out = tmp_path / "out.jsonl"
        assert _run(data, out, server.url) == 0
    finally:
        server.close()
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["filtered"] == {"repetitive": MISSING} and stats["filled"] == 0
    assert stats["samples"]["repetitive"][0].startswith("The assistant's next reply is: The assistant's")
    assert "repetitive" in capsys.readouterr().err  # the summary table, with an example


def test_the_generation_bound_follows_the_reasoning_bound(model_server, data, tmp_path):
    from beam_sft.backfill.run import generation_bound

    url, log = model_server
    asked = []
    for extra in ([], ["--max-reasoning-tokens", "100"], ["--max-tokens", "20"], ["--max-reasoning-tokens", "0"]):
        before = _requests(log)
        assert _run(data, tmp_path / "out.jsonl", url, "--max_records", "1", "--cache", str(tmp_path / f"c{len(asked)}"),
                    *extra) == 0
        asked.append({json.loads(line)["max_tokens"] for line in log.read_text().splitlines()[before:]})
    assert asked == [{352}, {157}, {20}, {4096}]  # 256 + 64 + 32 by default
    assert generation_bound(None, 256) == 352 and generation_bound(7, 256) == 7


def test_a_teacher_cut_at_its_bound_is_filtered_as_truncated(honest_server, data, tmp_path):
    url, _ = honest_server
    out = tmp_path / "out.jsonl"
    assert _run(data, out, url, "--max_records", "1", "--max-tokens", "6") == 0
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["filtered"] == {"truncated": 3} and stats["filled"] == 0  # finish_reason: length, each turn
    assert all(not m.get("reasoning_content") for m in _read(out)[0]["messages"])


def test_finish_reasons_read_as_stopped_or_cut():
    from beam_sft.backfill.teachers import stopped_from_finish_reason

    assert [stopped_from_finish_reason(r) for r in ("stop", "tool_calls", "length", "content_filter", None)] == [
        True, True, False, False, None]


def test_dry_run_prints_prompts_and_calls_nothing(data, tmp_path, capsys):
    assert backfill_main([str(data), "-o", str(tmp_path / "o.jsonl"), "--base-url", "http://127.0.0.1:9/v1",
                          "--model", "x", "--dry-run", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("--- prompt") == 2 and "Thoughts before this reply?" in printed
    assert "Hi 0!" in printed and not (tmp_path / "o.jsonl").exists()


def test_local_transformers_teacher(tiny_model_dir, data, tmp_path):
    out = tmp_path / "out.jsonl"
    assert backfill_main([str(data), "-o", str(out), "--backend", "transformers", "--model", str(tiny_model_dir),
                          "--max-tokens", "8", "--max_records", "1", "-q", "--stats", str(tmp_path / "s.json")]) == 0
    stats = json.loads((tmp_path / "s.json").read_text())
    # The random tiny model never writes its end-of-sequence token: every answer is cut at the 8 tokens.
    assert stats["turns_missing"] == 3 and stats["filtered"] == {"truncated": 3}


def test_the_progress_bar_knows_its_total_when_it_is_cheap(tmp_path):
    """An ETA needs a total: --max_records, or the non-empty lines of .jsonl inputs; unknown for a JSON array."""
    from beam_sft.cli.backfill import expected_records

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"x": 1}\n\n{"x": 2}\n')
    b.write_text('{"x": 3}\n')
    assert expected_records([str(a), str(b)], None) == 3
    assert expected_records([str(a), str(b)], 2) == 2
    array = tmp_path / "c.json"
    array.write_text("[]")
    assert expected_records([str(array)], None) is None
    assert expected_records([str(array)], 5) == 5
