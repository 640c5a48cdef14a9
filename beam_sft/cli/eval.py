"""`beam-sft eval MODEL --data PATH`: did the fine-tune learn Beam? Format, stop tokens and tool calls.

For each chosen assistant turn the model generates greedily from the conversation before it (with the
record's tools and reasoning effort) until <|return|>/<|call|> or --max-new-tokens; the output is parsed with
the tokenizer's response template and scored against the reference turn.

    beam-sft eval outputs/quickstart/model --data data/samples/openai.jsonl
    beam-sft eval outputs/quickstart/model --data 'data/samples/*' --max_records 50 --turns all \\
        --json eval.json --report eval.html
    beam-sft eval ./base-model --adapter ./lora-out --data held_out.jsonl --min-well-formed 0.9
    beam-sft eval my-org/beam-ft --data my-org/chats --dataset_test_split test --backend vllm --batch-size 64
    beam-sft eval --backend openai --base-url http://127.0.0.1:8000/v1 --model beam \
        --tokenizer_name_or_path outputs/quickstart/served --data data/samples/openai.jsonl     # a running server

BFCL v4, scored by BFCL's own checker (`make install` installs it); a base model that does not speak Beam is
scored with --bfcl-style prompt or json. Metrics, styles and categories: docs/evaluation.md.

    beam-sft eval outputs/demo-real/model --bfcl simple_python,multiple,irrelevance --max_records 50 \\
        --json bfcl.json --outputs bfcl.jsonl --report bfcl.html
    beam-sft eval ~/.cache/beam_sft/base_models/smollm2-* --bfcl all --bfcl-style prompt --max_records 50
    beam-sft eval ~/.cache/beam_sft/base_models/smollm2-* --bfcl all --bfcl-style json --max_records 50
    beam-sft eval --rescore bfcl.jsonl --json again.json        # BFCL's checker again on the outputs file
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from beam_sft.cli import add_command, check_local, command_main, data_option, nearest
from beam_sft.errors import UsageError, reject_where
from beam_sft.storage import atomic_output, write_json_atomic, write_text_atomic


def register(subparsers) -> None:
    from beam_sft.eval.backends import BACKENDS
    from beam_sft.eval.turns import TURN_CHOICES

    parser = add_command(subparsers, "eval", run,
                         "Generate held-out assistant turns and score format, stop tokens and tool calls.",
                         *__doc__.split("\n\n", 2)[1:])
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help="a saved model directory (scripts/train.py output; a LoRA-only output is applied to "
                             "the base model its adapter_config.json names), a base model for --adapter, or a hub "
                             "id (read from the local cache when HF_HUB_OFFLINE=1); with --backend openai, the "
                             "directory the server loaded (for its tokenizer) unless --tokenizer_name_or_path is given")
    parser.add_argument("--data", metavar="PATH", default=None,
                        help="Beam records or raw OpenAI/ShareGPT/Harmony data: a .jsonl/.json/.parquet file, a "
                             "glob, a directory, a save_to_disk dataset or a hub dataset id (required unless "
                             "--bfcl or --rescore)")
    parser.add_argument("--bfcl", metavar="CATEGORIES", default=None,
                        help="evaluate on BFCL v4 instead of --data: a comma list of categories or all ("
                             "simple_python, simple_java, simple_javascript, multiple, parallel, parallel_multiple, "
                             "irrelevance, live_simple, live_multiple, live_parallel, live_parallel_multiple, "
                             "live_irrelevance, live_relevance)")
    parser.add_argument("--bfcl-style", choices=("beam", "prompt", "json"), default="beam",
                        help="--bfcl: beam (default: the functions as Beam developer tools, the output parsed with "
                             "the response template; with --backend openai, the server's tool parser), prompt "
                             "(BFCL's own prompt and decoder, the model's own chat template: a base model's "
                             "zero-shot row) or json (the functions as JSON in a system message, the calls asked "
                             "for as a JSON list in <tool_call> tags, the model's own chat template)")
    parser.add_argument("--seed", type=int, default=0,
                        help="--bfcl: which --max_records entries of each category run (default: 0)")
    parser.add_argument("--outputs", metavar="PATH.jsonl", default=None,
                        help="--bfcl: one line per entry (id, category, calls, text, well_formed, valid, BFCL's "
                             "error type), re-scorable with --rescore")
    parser.add_argument("--rescore", metavar="PATH.jsonl", default=None,
                        help="run BFCL's checker again on an --outputs file (no model needed)")
    data_option(parser, "dataset_format", default="auto", metavar="FMT",
                help="input format: auto (default, detected per record), beam, openai, sharegpt, harmony")
    data_option(parser, "tokenizer_name_or_path", metavar="PATH", default=None,
                help="tokenizer with both Beam templates (default: the adapter's, else the model's)")
    data_option(parser, "dataset_test_split", default="test", metavar="NAME",
                help="split of a dataset directory or hub dataset (default: test)")
    data_option(parser, "max_records", type=int, default=None, metavar="N",
                help="read at most N input records (rejected ones included); reading stops there; with --bfcl, "
                     "N entries of each category (seeded by --seed)")
    parser.add_argument("--turns", choices=TURN_CHOICES, default="first",
                        help="which assistant turns of each record to generate (default: first)")
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                        help="generation bound per turn (default: 256)")
    parser.add_argument("--batch-size", type=int, default=8, metavar="N",
                        help="prompts per generate call, left-padded; with --backend openai, requests in flight "
                             "(default: 8)")
    parser.add_argument("--backend", choices=BACKENDS, default="transformers",
                        help="transformers (CPU or GPU; default), vllm (needs vLLM and a CUDA GPU), or openai "
                             "(a running OpenAI-compatible server: --base-url, --model; scored on what its parsers "
                             "return)")
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="--backend openai: the server's API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", dest="served_model", metavar="NAME", default=None,
                        help="--backend openai: the served model name (default: MODEL)")
    parser.add_argument("--api-key", default=None,
                        help="--backend openai: API key (default: $OPENAI_API_KEY, else 'EMPTY')")
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="--backend openai: how long one request may take (default: 600); on a CPU a long "
                             "generation with --batch-size requests in flight can take longer")
    parser.add_argument("--adapter", metavar="PATH", default=None, help="a LoRA adapter (peft) to apply to MODEL")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the metrics as JSON")
    parser.add_argument("--report", metavar="PATH.html", default=None,
                        help="write a self-contained HTML page listing the failing turns")
    parser.add_argument("--min-well-formed", type=float, default=None, metavar="F",
                        help="exit with status 1 when the well-formed share is below F (0-1), for CI gates")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    from beam_sft.validate.convert import FORMAT_NAMES

    if args.dataset_format not in (*FORMAT_NAMES, "beam"):
        raise UsageError(f"unknown --dataset_format {args.dataset_format!r}; choose from {', '.join((*FORMAT_NAMES, 'beam'))}"
                         f"{nearest(args.dataset_format, (*FORMAT_NAMES, 'beam'))}")
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size),
                        ("--max_records", args.max_records)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1")
    if args.min_well_formed is not None and not 0 <= args.min_well_formed <= 1:
        raise UsageError(f"--min-well-formed {args.min_well_formed}: a fraction between 0 and 1 (0.9: 90% well formed)")
    if sum(x is not None for x in (args.data, args.bfcl, args.rescore)) != 1:
        raise UsageError("give one of --data (held-out records), --bfcl CATEGORIES or --rescore PATH.jsonl")
    if args.rescore is not None:
        from beam_sft.eval.bfcl.run import rescore

        if not Path(args.rescore).is_file():
            raise UsageError(f"--rescore {args.rescore!r}: no such file; pass the --outputs file of an earlier "
                             "`beam-sft eval MODEL --bfcl ... --outputs PATH.jsonl` run")
        return _bfcl_results(args, rescore(args.rescore))
    if args.bfcl is None and (args.outputs or args.bfcl_style != "beam"):
        raise UsageError("--outputs and --bfcl-style go with --bfcl")
    if args.data is not None:  # a missing --data file is said before a model is loaded for it
        from beam_sft.records.files import data_sources

        data_sources([args.data], args.dataset_test_split)
    backend, tokenizer = _backend(args)
    if args.bfcl is not None:
        return _bfcl(args, backend, tokenizer)
    return _held_out(args, backend, tokenizer)


def _backend(args):
    """(backend, tokenizer); a model scored in its own format (--bfcl-style prompt, json) stops at its EOS."""
    from beam_sft.eval.backends import TransformersBackend, VLLMBackend, eos_stops
    from beam_sft.eval.run import SAVED_MODEL_HINT, load_eval_tokenizer, load_model, resolve_adapter

    beam = args.bfcl_style == "beam"
    for option, value, hint in (
            ("--tokenizer_name_or_path", args.tokenizer_name_or_path,
             "pass a tokenizer directory with both Beam templates (a saved model directory has one)"),
            ("--adapter", args.adapter, "pass the directory scripts/train.py --use_peft saved"),
            ("MODEL", None if args.backend == "openai" else args.model, SAVED_MODEL_HINT)):
        if value is not None:
            check_local(value, option, hint)
    if args.backend == "openai":
        from beam_sft.eval.openai_backend import backend_from_args

        if not (args.tokenizer_name_or_path or args.model):
            raise UsageError("--backend openai needs --tokenizer_name_or_path (or MODEL): the served model's tokenizer directory")
        tokenizer, _ = load_eval_tokenizer(args.tokenizer_name_or_path or args.model, beam=beam)
        backend = backend_from_args(args, tokenizer, None if beam else eos_stops(tokenizer))
        args.model = args.served_model or args.model
        return backend, tokenizer
    if args.model is None:
        raise UsageError("MODEL is required: the directory scripts/train.py saved (beam-sft eval "
                         "outputs/quickstart/model --data held_out.jsonl), or a hub id")
    args.model, args.adapter = resolve_adapter(args.model, args.adapter)
    if args.backend == "vllm":
        tokenizer, source = load_eval_tokenizer(args.model, tokenizer=args.tokenizer_name_or_path, adapter=args.adapter,
                                                beam=beam)
        return VLLMBackend(args.model, tokenizer, max_new_tokens=args.max_new_tokens, adapter=args.adapter,
                           tokenizer_path=source, stops=None if beam else eos_stops(tokenizer)), tokenizer
    model, tokenizer = load_model(args.model, tokenizer=args.tokenizer_name_or_path, adapter=args.adapter, beam=beam)
    return TransformersBackend(model, tokenizer, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                               stops=None if beam else eos_stops(tokenizer)), tokenizer


def _bfcl(args, backend, tokenizer) -> int:
    """--bfcl: the entries generated and scored; --outputs written line by line, renamed into place."""
    from beam_sft.eval.bfcl.checker import parse_categories
    from beam_sft.eval.bfcl.run import evaluate_bfcl
    from beam_sft.eval.run import EvalOptions

    categories = parse_categories(args.bfcl)
    with contextlib.ExitStack() as stack:
        write = None
        if args.outputs:
            handle = stack.enter_context(open(stack.enter_context(atomic_output(args.outputs)), "w",
                                              encoding="utf-8"))

            def write(scored) -> None:
                handle.write(json.dumps(scored.to_json(), ensure_ascii=False) + "\n")

        # chunks of a few batches: the bar moves every few minutes on a CPU, each chunk still sorted by length
        result = evaluate_bfcl(backend, tokenizer, categories, EvalOptions(
            style=args.bfcl_style, max_records=args.max_records, seed=args.seed,
            chunk_size=max(16, 4 * args.batch_size), progress=not args.quiet, on_result=write))
    if args.outputs:
        print(f"wrote {args.outputs}", file=sys.stderr)
    return _bfcl_results(args, result)


def _bfcl_results(args, result) -> int:
    from beam_sft.eval.bfcl.run import report_html, summary_table

    print(summary_table(result), file=sys.stderr)
    summary = result.summary()
    _write(args, summary, lambda: report_html(result, title=f"beam-sft eval {args.model or args.rescore} on BFCL"))
    print(json.dumps({"bfcl": {c: v["accuracy"] for c, v in summary["bfcl"].items()},
                      "bfcl_summary": summary["bfcl_summary"], "well_formed": summary["well_formed"]}))
    if args.min_well_formed is not None and (summary["well_formed"] or 0.0) < args.min_well_formed:
        print(f"well_formed {summary['well_formed']} is below --min-well-formed {args.min_well_formed}", file=sys.stderr)
        return 1
    return 0


def _write(args, summary: dict, page) -> None:
    """--json and --report (`page()` builds the HTML only when asked for), each written atomically."""
    if args.json:
        write_json_atomic(args.json, summary)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.report:
        write_text_atomic(args.report, page())
        print(f"wrote {args.report}", file=sys.stderr)


def _held_out(args, backend, tokenizer) -> int:
    from beam_sft.eval.metrics import METRICS
    from beam_sft.eval.report import report_html, summary_table
    from beam_sft.eval.run import EvalOptions, evaluate
    from beam_sft.eval.turns import held_out_total, read_held_out

    records = read_held_out(args.data, args.dataset_format, args.dataset_test_split, args.max_records)
    total = held_out_total(args.data, args.dataset_test_split, args.max_records)
    result = evaluate(backend, tokenizer, records, EvalOptions(
        turns=args.turns, progress=not args.quiet, chunk_size=max(64, 8 * args.batch_size), total=total))
    print(summary_table(result), file=sys.stderr)
    for reject in result.rejects[:5]:
        print(f"rejected: {reject_where(reject)} [{reject.get('reason')}] {reject.get('message')}", file=sys.stderr)
    if result.rejected > 5:
        print(f"... and {result.rejected - 5} more rejected records", file=sys.stderr)
    summary = result.summary()
    _write(args, summary, lambda: report_html(result, title=f"beam-sft eval {args.model} on {args.data}"))
    print(json.dumps({k: summary[k] for k in ("records", "turns", *METRICS, "mean_analysis_tokens")}))
    if result.overall.turns == 0:
        print("no assistant turn to evaluate", file=sys.stderr)
    well_formed = summary["well_formed"] or 0.0
    if args.min_well_formed is not None and well_formed < args.min_well_formed:
        print(f"well_formed {well_formed:.3f} is below --min-well-formed {args.min_well_formed}", file=sys.stderr)
        return 1
    return 0


main = command_main(__name__, register, "eval")
