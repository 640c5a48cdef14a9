"""`beam-sft backfill`: fill missing reasoning with a teacher model, so non-reasoning data trains Beam properly.

    # Beam itself served by vLLM as the teacher (any OpenAI-compatible endpoint works)
    vllm serve $BEAM_MODEL_ID --port 8000
    beam-sft backfill data/chats.jsonl -o data/chats_reasoned.jsonl \\
        --base-url http://127.0.0.1:8000/v1 --model $BEAM_MODEL_ID --concurrency 32
    beam-sft backfill data/chats.jsonl -o /tmp/x.jsonl --base-url ... --model ... --dry-run   # show the prompts
    beam-sft backfill data/chats.jsonl -o out.jsonl --backend transformers --model ./my-teacher

Mode `rationalize`: for each assistant turn without reasoning, the teacher writes the reasoning that leads to the
turn's reference reply, which is never changed; answers its filters refuse leave the turn without reasoning (then
masked by the default `--missing_reasoning mask`). Run the same command again after a crash or Ctrl-C and it
continues from --cache. Filters, prompts and why: docs/reasoning.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from beam_sft.cli import add_command, add_rewrite_arguments, command_main, committed, progress_bar
from beam_sft.errors import FatalError, UsageError


def expected_records(inputs: list[str], limit: int | None) -> int | None:
    """The records the run will read, for the ETA: --max_records or the lines of .jsonl inputs, else None."""
    from pathlib import Path

    total = 0
    for name in inputs:
        path = Path(name)
        if path.suffix != ".jsonl" or not path.is_file():
            return limit
        with path.open("rb") as f:
            total += sum(1 for line in f if line.strip())
        if limit is not None and total >= limit:
            return limit
    return total


def _records(args: argparse.Namespace):
    """(record, None) or (None, reject) per input row, converted with turns without reasoning kept."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    keep = Options(missing_reasoning="keep")
    for item in read_items(args.inputs, args.dataset_train_split, limit=args.max_records):
        record, _, reject = convert_item(item, args.dataset_format, keep)
        yield record, reject


def _dry_run(args: argparse.Namespace) -> int:
    from beam_sft.backfill.prompt import teacher_messages

    shown = 0
    for record, _ in _records(args):
        if record is None:
            continue
        for index, message in enumerate(record["messages"]):
            if message["role"] == "assistant" and not message.get("reasoning_content"):
                print(f"--- prompt {shown + 1} (messages[{index}]) ---")
                for m in teacher_messages(record, index):
                    print(f"[{m['role']}]\n{m['content']}\n")
                shown += 1
                break  # later turns' prompts depend on the teacher's answer to this one
        if shown >= args.dry_run:
            break
    print(json.dumps({"prompts_shown": shown}))
    return 0


def make_teacher(args: argparse.Namespace):
    from beam_sft.backfill.prompt import STOP
    from beam_sft.backfill.run import generation_bound
    from beam_sft.backfill.teachers import OpenAITeacher, TransformersTeacher

    max_tokens = generation_bound(args.max_tokens, args.max_reasoning_tokens)
    if args.backend == "transformers":
        return TransformersTeacher(args.model, max_tokens=max_tokens, batch_size=args.batch_size, stop=STOP)
    if not args.base_url:
        raise UsageError("--base-url is required with --backend openai (e.g. http://127.0.0.1:8000/v1)")
    if not args.base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {args.base_url!r} is not an http(s) URL; give the server's API root, e.g. "
                         "http://127.0.0.1:8000/v1")
    return OpenAITeacher(args.base_url, args.model, api_key=os.environ.get(args.api_key_env), timeout=args.timeout,
                         max_tokens=max_tokens, temperature=args.temperature, stop=STOP)


def run(args: argparse.Namespace) -> int:
    if args.batch_size is None:  # 1 on a CPU, where a batch runs until its longest row (docs/benchmarks.md#backfill)
        import torch

        args.batch_size = 8 if torch.cuda.is_available() else 1
    if args.concurrency < 1 or args.batch_size < 1 or args.retries < 0:
        raise UsageError("--concurrency and --batch-size must be at least 1 and --retries at least 0")
    if args.max_tokens is not None and args.max_tokens < 1 or args.max_reasoning_tokens < 0:
        raise UsageError("--max-tokens must be at least 1 and --max-reasoning-tokens at least 0")
    if args.dry_run:
        return _dry_run(args)
    import orjson

    from beam_sft.backfill.cache import TurnCache
    from beam_sft.backfill.run import Output, Settings, backfill
    from beam_sft.records.files import JsonlSink, open_writer
    from beam_sft.storage import write_json_atomic
    from beam_sft.template.tokenizer import load_tokenizer
    from beam_sft.validate.convert import to_row

    tokenizer = load_tokenizer(args.tokenizer_name_or_path)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    teacher = make_teacher(args)
    settings = Settings(mode=args.mode, max_reasoning_tokens=args.max_reasoning_tokens or None,
                        concurrency=args.batch_size if args.backend == "transformers" else args.concurrency,
                        retries=args.retries, retry_wait=args.retry_wait)
    cache = TurnCache(args.cache or f"{args.output}.backfill-cache.jsonl")
    writer = open_writer(args.output)
    rejects = JsonlSink(args.rejects) if args.rejects else None
    # records, not turns: a teacher's time goes by turn, but turns per record vary; with a total, tqdm shows the ETA
    bar = progress_bar("backfill", args.quiet, total=expected_records(args.inputs, args.max_records))
    review: list[str] = []

    def write(record: dict[str, Any]) -> None:
        if len(review) < args.review:
            review.extend(review_texts(record, args.review - len(review)))
        writer.write_raw(orjson.dumps(to_row(record)))

    # Outputs committed (or aborted) first, then the bar and the cache closed, whatever happened.
    with contextlib.closing(cache), bar, committed(writer, rejects):
        stats = backfill(_records(args), teacher, cache, settings, count_tokens,
                         Output(write, rejects.write if rejects is not None else lambda _: None, bar.update))
        if stats.records_in != stats.records_out + sum(stats.rejected.values()):
            raise FatalError(f"bookkeeping error: {stats.records_in} in != {stats.records_out} out + "
                             f"{sum(stats.rejected.values())} rejected")
    print(f"backfill: wrote {stats.records_out} records to {args.output} (teacher {teacher.id})", file=sys.stderr)
    print(stats.table(), file=sys.stderr)
    for k, text in enumerate(review, 1):
        print(f"=== filled turn {k} of {len(review)} ===\n{text}\n")
    if args.stats:
        write_json_atomic(args.stats, {"teacher": teacher.id, "mode": args.mode, **stats.to_dict()})
    print("\n".join(drop_report(stats, args.rejects)), file=sys.stderr)
    if stats.failed:
        print(failure_warning(args, stats), file=sys.stderr)
    return 0


# Filter -> what keeps the answers it refuses; the rest need a better teacher (docs/reasoning.md).
KEEP_ANSWERS = {"too_long": "a larger --max-reasoning-tokens (0: no limit)",
                "truncated": "a larger --max-tokens"}


def drop_report(stats, rejects: str | None) -> list[str]:
    """The input records rejected, then the turns whose teacher answer a filter refused, by filter."""
    from beam_sft.dataset.drops import drop_lines, rewrite_rejected_lines

    def keep(code: str) -> str:
        return KEEP_ANSWERS.get(code, "no switch: a stronger teacher (--model); the turn trains without "
                                      "reasoning (masked)")

    return rewrite_rejected_lines(stats.rejected, stats.records_in, rejects) + drop_lines(
        {"records_in": stats.turns_missing, "rejected": stats.filtered}, rejects_hint=None, keep=keep,
        head="refused by the filters", noun="turns without reasoning")


def failure_warning(args: argparse.Namespace, stats) -> str:
    """The warning for turns the teacher never answered, naming --base-url when no request reached it."""
    why = ", ".join(f"{kind} {n}" for kind, n in sorted(stats.failed.items()))
    unreachable = args.backend == "openai" and not stats.filled and set(stats.failed) <= {"connection"}
    where = (f"no request reached the teacher at --base-url {args.base_url}: start its server (docs/reasoning.md) "
             "or fix --base-url, then " if unreachable else "")
    return (f"warning: {sum(stats.failed.values())} turn(s) got no answer after {args.retries} retries ({why}); "
            f"{where}run the same command again to ask for them (finished turns come from the cache)")


REVIEW_CONTEXT = 3  # messages shown before a filled turn
REVIEW_CHARS = 500


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= REVIEW_CHARS else text[:REVIEW_CHARS] + " ..."


def review_texts(record: dict[str, Any], n: int) -> list[str]:
    """Up to `n` turns this run filled, as text to read: the messages before, the reasoning, the reply."""
    from beam_sft.backfill.prompt import reply_text

    texts = []
    messages = record["messages"]
    for index, message in enumerate(messages):
        if len(texts) == n:
            break
        if message["role"] != "assistant" or not message.get("reasoning_source"):
            continue
        context = "\n".join(f"  [{m['role']}] {_short(m.get('content') or reply_text(m))}"
                            for m in messages[max(0, index - REVIEW_CONTEXT):index])
        texts.append(f"context (messages {max(0, index - REVIEW_CONTEXT)}-{index - 1}):\n{context}\n"
                     f"reasoning ({message['reasoning_source']}):\n  {message['reasoning_content']}\n"
                     f"reference:\n  {_short(reply_text(message))}")
    return texts


def register(subparsers) -> None:
    add_rewrite_arguments(add_command(subparsers, "backfill", run, "fill missing reasoning with a teacher model",
                                      __doc__), add_arguments)


def add_arguments(parser) -> None:
    """backfill's own options (`add_rewrite_arguments` adds the rest)."""
    from beam_sft.backfill.prompt import MODES
    from beam_sft.backfill.run import MAX_REASONING_TOKENS, UNBOUNDED_GENERATION
    from beam_sft.cli import data_option

    parser.add_argument("--backend", choices=("openai", "transformers"), default="openai",
                        help="openai: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, ...); "
                             "transformers: a local model (default: openai)")
    parser.add_argument("--base-url", help="the endpoint, e.g. http://127.0.0.1:8000/v1 (--backend openai)")
    parser.add_argument("--model", required=True, help="the teacher: the served model's name, or a local path")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the API key (default: OPENAI_API_KEY)")
    parser.add_argument("--mode", choices=MODES, default="rationalize",
                        help="rationalize: the reasoning that leads to the reference reply (default)")
    parser.add_argument("--max-reasoning-tokens", type=int, default=MAX_REASONING_TOKENS, metavar="N",
                        help="filter out longer reasoning, counted with --tokenizer_name_or_path; 0: no limit "
                             f"(default: {MAX_REASONING_TOKENS})")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="the teacher's generation budget per turn (default: --max-reasoning-tokens plus a "
                             f"quarter and 32; {UNBOUNDED_GENERATION} when that is 0)")
    parser.add_argument("--temperature", type=float, default=0.0, help="teacher sampling temperature (default: 0)")
    parser.add_argument("--concurrency", type=int, default=8, metavar="N",
                        help="records in flight at once (openai backend) (default: 8)")
    parser.add_argument("--batch-size", type=int, metavar="N",
                        help="prompts generated at once by the local model, one record each (--backend "
                             "transformers); greedy answers are the same as one at a time (default: 8 on a "
                             "GPU, 1 on a CPU, where a batch waits for its longest row: docs/benchmarks.md)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds per request before it counts as failed and is retried (default: 300)")
    parser.add_argument("--retries", type=int, default=4, help="retries per call, with backoff (default: 4)")
    parser.add_argument("--retry-wait", type=float, default=1.0, metavar="S",
                        help="seconds before the first retry, doubled each time (default: 1)")
    parser.add_argument("--cache", metavar="PATH", help="resumable cache (default: OUTPUT.backfill-cache.jsonl)")
    data_option(parser, "tokenizer_name_or_path", metavar="PATH",
                help="counts reasoning tokens (default: the bundled one)")
    parser.add_argument("--dry-run", type=int, nargs="?", const=3, default=0, metavar="N",
                        help="print the teacher prompts of the first N records (default 3) and stop")
    parser.add_argument("--review", type=int, default=0, metavar="N",
                        help="print N filled turns (the messages before, the reasoning, the reference reply) on "
                             "stdout when the run ends, to read before training")


main = command_main(__name__, register, "backfill")
