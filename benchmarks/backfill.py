"""The local teacher of `beam-sft backfill` on real tool-calling turns: speed batched vs one at a time, and
the share of turns whose answer the filters keep.

The turns are the assistant turns without reasoning of the first records of a real file (default: the glaive
tool-calling demo in tests/data/realdata), each prompted as `beam-sft backfill` prompts it
(`beam_sft.backfill.prompt`, from the record as it is: no reasoning filled into earlier turns, so every
prompt is known before any answer). The teacher is `beam_sft.backfill.teachers.TransformersTeacher`, greedy.

```bash
OMP_NUM_THREADS=1 python -m benchmarks backfill --model outputs/base/smollm2 --turns 8 --batch-size 8 \\
    --max-new-tokens 160 --speed            # turns/s one at a time vs batched; the answers must be equal
OMP_NUM_THREADS=1 python -m benchmarks backfill --model outputs/base/smollm2 --turns 16 --json kept.json
```

Without --speed it generates batched only and reports, per filter (`beam_sft.backfill.filters.check`, the
run's default bounds), how many answers it refused, the share kept and one example per filter.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GLAIVE = REPO / "tests" / "data" / "realdata" / "sharegpt" / "llamafactory_glaive_toolcall_en_demo.json"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks backfill", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the local teacher (a model directory)")
    parser.add_argument("--input", default=str(GLAIVE), help="real records (default: the glaive tool-call demo)")
    parser.add_argument("--turns", type=int, default=16, help="assistant turns to prompt (default: 16)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts generated at once (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, help="generation bound (default: the run's, from "
                                                            "--max-reasoning-tokens)")
    parser.add_argument("--max-reasoning-tokens", type=int, default=None,
                        help="the too_long bound (default: the run's default)")
    parser.add_argument("--speed", action="store_true", help="also generate one at a time: turns/s both ways")
    parser.add_argument("--json", metavar="PATH", help="also write the figures (and every answer) here")
    return parser


def real_turns(path: str, n: int) -> list[tuple[list[dict], dict, list | None]]:
    """(teacher messages, reference message, tools) for the first `n` turns without reasoning."""
    from beam_sft.backfill.prompt import teacher_messages
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    turns = []
    for item in read_items([path], "train"):
        record, _, _ = convert_item(item, "auto", Options(missing_reasoning="keep"))
        for index, message in enumerate((record or {}).get("messages", [])):
            if message["role"] == "assistant" and not message.get("reasoning_content"):
                turns.append((teacher_messages(record, index), message, record.get("tools")))
                if len(turns) == n:
                    return turns
    return turns


def timed(teacher, prompts: list[list[int]], batch_size: int) -> tuple[list, float, float]:
    """The answers, the wall seconds and the CPU seconds of this process (on a shared machine the CPU time
    is the steadier figure: one torch thread, so it is the work done)."""
    start, cpu = time.perf_counter(), time.process_time()
    answers = []
    for k in range(0, len(prompts), batch_size):
        answers += teacher.generate(prompts[k:k + batch_size])
    return answers, time.perf_counter() - start, time.process_time() - cpu


def kept_figures(answers, turns, max_reasoning_tokens: int | None) -> dict:
    from beam_sft.backfill.filters import check
    from beam_sft.template.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    reasons: Counter = Counter()
    examples: dict[str, str] = {}
    for answer, (_, reference, tools) in zip(answers, turns):
        text = (answer.text or "").strip()
        reason = check(text, reference, tools, max_tokens=max_reasoning_tokens, stopped=answer.stopped,
                       count_tokens=lambda t: len(tokenizer.encode(t, add_special_tokens=False))) or "kept"
        reasons[reason] += 1
        examples.setdefault(reason, text[:300])
    return {"kept": reasons["kept"], "turns": len(answers), "share_kept": reasons["kept"] / max(1, len(answers)),
            "by_filter": dict(reasons.most_common()), "examples": examples}


def main(argv: list[str] | None = None) -> int:
    import torch

    from beam_sft.backfill.prompt import PROMPT_VERSION, STOP
    from beam_sft.backfill.run import MAX_REASONING_TOKENS, generation_bound
    from beam_sft.backfill.teachers import TransformersTeacher

    args = make_parser().parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    reasoning_bound = MAX_REASONING_TOKENS if args.max_reasoning_tokens is None else args.max_reasoning_tokens
    bound = generation_bound(args.max_new_tokens, reasoning_bound)
    teacher = TransformersTeacher(args.model, max_tokens=bound, device="cpu", batch_size=args.batch_size,
                                 stop=STOP)
    turns = real_turns(args.input, args.turns)
    prompts = [teacher.encode(messages) for messages, _, _ in turns]
    teacher.max_tokens = 2
    teacher.generate(prompts[:2])  # first-call costs out of the timings
    teacher.max_tokens = bound
    batched, batched_s, batched_cpu = timed(teacher, prompts, args.batch_size)
    figures = {"prompt_version": PROMPT_VERSION, "turns": len(turns), "batch_size": args.batch_size,
               "max_new_tokens": bound, "threads": torch.get_num_threads(),
               "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
               "batched_s": round(batched_s, 1), "batched_cpu_s": round(batched_cpu, 1),
               "batched_turns_per_s": round(len(turns) / batched_s, 3),
               "new_tokens": sum(a.tokens for a in batched)}
    if args.speed:
        single, single_s, single_cpu = timed(teacher, prompts, 1)
        figures.update(single_s=round(single_s, 1), single_cpu_s=round(single_cpu, 1),
                       single_turns_per_s=round(len(turns) / single_s, 3), speedup=round(single_s / batched_s, 2),
                       cpu_speedup=round(single_cpu / batched_cpu, 2), same_answers=single == batched,
                       different=[k for k, (a, b) in enumerate(zip(single, batched)) if a != b])
    figures.update(kept_figures(batched, turns, reasoning_bound or None))
    print(json.dumps({k: v for k, v in figures.items() if k != "examples"}, indent=1))
    for reason, text in figures["examples"].items():
        print(f"--- {reason}: {text[:200]!r}")
    if args.json:
        figures["answers"] = [{"text": a.text, "stopped": a.stopped} for a in batched]
        Path(args.json).write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
