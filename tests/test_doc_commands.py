"""No documented command is one the code refuses: every command in README.md and docs/ that calls beam-sft,
convert-dataset, scripts/*.py or make, checked against the real parsers and the run's own checks
(`tests/doc_commands.py` says how)."""

from __future__ import annotations

import textwrap

import doc_commands as dc
import pytest

PAGE = textwrap.dedent("""\
    # A page

    Run `beam-sft convert in.jsonl -o out.jsonl --format openai` first.

    ```bash
    # a comment line, then a command with a continuation and an env prefix
    HF_HUB_OFFLINE=1 python scripts/train.py --config configs/quickstart.yaml \\
        --max_steps 3 && beam-sft inspect data/samples/openai.jsonl --limit 2
    make test
    ```

    ```python
    beam-sft would not be a command here
    ```
    """)


def test_commands_are_found_in_shell_blocks_and_inline_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    found = [(c.line, c.argv[:2], c.inline) for c in dc.commands(page)]
    assert found == [
        (3, ("beam-sft", "convert"), True),
        (7, ("python", "scripts/train.py"), False),
        (7, ("beam-sft", "inspect"), False),
        (9, ("make", "test"), False),
    ], found
    train = next(c for c in dc.commands(page) if "scripts/train.py" in c.argv)
    assert train.argv[-2:] == ("--max_steps", "3"), train.argv


STALE = [
    ("python scripts/train.py --config configs/quickstart.yaml --lora_modules_to_savee embed_tokens", "unknown option"),
    # the tied-model refusal, made before training: the embedded tiny model ties its embeddings
    ("python scripts/train.py --config configs/quickstart.yaml --use_peft --lora_modules_to_save embed_tokens lm_head",
     "tied to 'embed_tokens'"),
    (("accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train.py --config configs/quickstart.yaml"
     " --max_step 3"), "did you mean '--max_steps'"),
    ("beam-sft train --config quickstart --num_epochs 2", "unknown option"),
    ("beam-sft eval outputs/model --bfcl-categories simple_python", "unknown option '--bfcl-categories'"),
    ("convert-dataset in.jsonl -o out.jsonl --fromat openai", "unknown option '--fromat'"),
    ("python scripts/demo_real.py --peft --distractor 2", "full name"),
    ("python scripts/no_such_script.py --help", "no such script"),
    ("make demo-reall", "no make target"),
    ("beam-sft frobnicate x", "no beam-sft command"),
    ("python -m benchmarks data --quik", "unrecognized arguments"),
    ("python -m benchmarks bench_gpu --json x.json", "names no benchmark"),
]


@pytest.mark.parametrize("text,why", STALE, ids=[s[0][:48] for s in STALE])
def test_a_planted_stale_command_fails(tmp_path, text, why):
    page = tmp_path / "stale.md"
    page.write_text(f"```bash\n{text}\n```\n")
    (command,) = dc.commands(page)
    problem = dc.problem(command)
    assert problem is not None and why in problem, (text, problem)


def test_every_documented_command_is_accepted():
    found = [c for page in dc.pages() for c in dc.commands(page)]
    # the pages name a few hundred commands; an extractor that found none would pass anything
    assert len(found) > 200, len(found)
    assert {c.argv[0] for c in found} >= {"beam-sft", "make", "python", "convert-dataset", "accelerate"}
    problems = [f"{c.where()}\n    -> {p}" for c in found if (p := dc.problem(c))]
    assert not problems, "\n".join(problems)
