"""`beam-sft inspect DATASET`: see which tokens will be trained, before spending GPU hours on them.

Render records of DATASET with the chat template, tokenize them with the training encoder (the conversion,
validation and truncation of training) and show every token as trained or not (colours: docs/inspect.md);
--stats adds dataset-level numbers (trained fraction, lengths, empty masks, truncation, untrained stop tokens).

    beam-sft inspect data/samples/openai.jsonl                   # the first record
    beam-sft inspect data/samples/sharegpt.json -n 3             # the first three
    beam-sft inspect data/samples/harmony.jsonl --index 7        # input record 7 (0-based)
    beam-sft inspect data/samples/openai.jsonl --stats --max_length 256
    beam-sft inspect my.parquet --html /tmp/masks.html --stats   # a self-contained page
"""

from __future__ import annotations

import argparse
import os
import sys

from beam_sft.cli import add_command, check_local, command_main, data_option, nearest, quiet_datasets
from beam_sft.errors import EXIT_INTERNAL_ERRORS, Reason, RecordError, UsageError, reject_where


def register(subparsers) -> None:
    from beam_sft.dataset.examples import TRUNCATION_POLICIES
    from beam_sft.validate import reasoning
    from beam_sft.validate.calls import TOOL_CALL_CHECKS_CHOICES, TOOL_CALL_CHECKS_HELP
    from beam_sft.validate.rules import MISSING_REASONING_CHOICES

    parser = add_command(
        subparsers, "inspect", run, "Show which tokens of a dataset are trained (terminal colours, HTML, statistics).",
        *__doc__.split("\n\n", 2)[1:])
    parser.add_argument("dataset", metavar="DATASET",
                        help="JSONL/JSON/Parquet file, glob, directory or save_to_disk dataset")
    data_option(parser, "tokenizer_name_or_path", metavar="PATH",
                help="tokenizer directory (default: the bundled data/tokenizer)")
    parser.add_argument("-n", type=int, default=1, metavar="N", help="show the first N records (default: 1)")
    parser.add_argument("--index", type=int, action="append", metavar="I",
                        help="show input record I (0-based, counting rejected ones; repeatable); overrides -n")
    parser.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page")
    data_option(parser, "max_length", type=int, metavar="L",
                help="truncate like training does (--truncation_policy) and report what the cut removes")
    data_option(parser, "truncation_policy", choices=TRUNCATION_POLICIES, default="turn",
                help="how --max_length cuts, as in training: turn (back to the end of the last whole assistant "
                     "turn; drop the record if none fits), drop (drop longer records), keep_start (keep the first L "
                     "tokens). Default: turn, training's default")
    parser.add_argument("--stats", action="store_true", help="print the dataset-level table")
    data_option(parser, "dataset_format", default="auto", metavar="FMT",
                help="input format: auto (default), openai, sharegpt, harmony, hermes, glaive, xlam, or beam "
                     "(Beam records, validated as training validates them)")
    data_option(parser, "dataset_train_split", default="train", metavar="NAME",
                help="split of a dataset directory or hub dataset (default: train)")
    data_option(parser, "missing_reasoning", choices=MISSING_REASONING_CHOICES, default=reasoning.DEFAULT,
                help="as training: " + reasoning.HELP)
    data_option(parser, "tool_call_checks", choices=TOOL_CALL_CHECKS_CHOICES, default="reject",
                help=TOOL_CALL_CHECKS_HELP)
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="ANSI colours: auto (when stdout is a terminal), always, never")


def run(args) -> int:
    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.report.masks import load_records
    from beam_sft.report.pages import html_page
    from beam_sft.report.stats import stats_table
    from beam_sft.storage import write_text_atomic
    from beam_sft.template.tokenizer import load_tokenizer
    from beam_sft.validate.convert import INPUT_FORMATS

    if args.dataset_format not in INPUT_FORMATS:
        raise UsageError(f"unknown --dataset_format {args.dataset_format!r}; choose from {', '.join(INPUT_FORMATS)}"
                         f"{nearest(args.dataset_format, INPUT_FORMATS)}")
    if args.n < 0:
        raise UsageError("-n must be >= 0")
    if args.max_length is not None and args.max_length < 1:
        raise UsageError("--max_length must be >= 1")
    if args.tokenizer_name_or_path is not None:
        check_local(args.tokenizer_name_or_path, "--tokenizer_name_or_path",
                    "pass a tokenizer directory, or leave the option out for the bundled data/tokenizer")
    try:
        tokenizer = load_tokenizer(args.tokenizer_name_or_path)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load tokenizer {args.tokenizer_name_or_path!r}: {err}") from err

    # Only the records to show are read here; --stats reads the whole dataset through the data phase below.
    limit = max(args.index) + 1 if args.index else args.n
    loaded = load_records(args.dataset, format=args.dataset_format, limit=limit, split=args.dataset_train_split,
                          missing_reasoning=args.missing_reasoning, tool_call_checks=args.tool_call_checks)
    for position in args.index or ():
        if position < 0 or position >= loaded.total:  # loaded.total < limit: the dataset ended first
            raise UsageError(f"--index {position}: the dataset has {loaded.total} records")
    wanted = args.index or loaded.positions[: args.n]

    encoder = MaskedEncoder(tokenizer)
    # input positions of records that hit an unexpected exception (a bug): they decide the exit status
    internal = {r["position"] for r in loaded.rejects if r["reason"] == Reason.INTERNAL_ERROR.value}
    views = _show(args, tokenizer, encoder, loaded, wanted, internal)

    stats = None
    if args.stats:
        stats, stats_internal = _dataset_stats(args, tokenizer, encoder)
        internal.update(stats_internal)
        print(stats_table(stats))
    if args.html:
        write_text_atomic(args.html, html_page(views, title=f"beam-sft inspect {args.dataset}", stats=stats))
        print(f"wrote {args.html}", file=sys.stderr)
    if loaded.rejects and not args.stats:
        print(f"{len(loaded.rejects)} of the {loaded.total} records read were rejected by the converters",
              file=sys.stderr)
    if internal:
        shown = ", ".join(str(p) for p in sorted(internal)[:12])
        print(f"warning: {len(internal)} record(s) hit an unexpected error (internal_error, a bug in beam-sft; "
              f"please report it): records {shown}. Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
        return EXIT_INTERNAL_ERRORS
    return 0


def _show(args, tokenizer, encoder, loaded, wanted, internal: set[int]) -> list:
    """Print the records at input positions `wanted`; returns their views. A record that hits an unexpected
    exception is reported and its position added to `internal`."""
    from beam_sft.errors import internal_error
    from beam_sft.report.masks import ansi_view, inspect_record, plain_view

    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    views = []
    for position in wanted:
        k = loaded.index_of(position)
        if k is None:
            reject = next(r for r in loaded.rejects if r["position"] == position)
            print(f"record {position} ({reject_where(reject)}): rejected [{reject['reason']}] {reject['message']}",
                  file=sys.stderr)
            continue
        try:
            view = inspect_record(tokenizer, loaded.records[k], max_length=args.max_length, encoder=encoder,
                                  label=f"record {position} ({loaded.sources[k]})", policy=args.truncation_policy)
        except RecordError as err:
            print(f"record {position}: {err}", file=sys.stderr)
            continue
        except Exception as exc:  # one record's bug must not hide the others
            if os.environ.get("BEAM_SFT_DEBUG"):
                raise
            print(f"record {position}: {internal_error(exc)}", file=sys.stderr)
            internal.add(position)
            continue
        views.append(view)
        print(ansi_view(view) if color else plain_view(view))
        print()
    return views


def _dataset_stats(args, tokenizer, encoder):
    """--stats over the whole dataset, converted as training does: (stats, positions of internal errors)."""
    import tempfile

    from beam_sft.dataset.arguments import DataArguments, data_settings
    from beam_sft.dataset.pipeline import convert_records
    from beam_sft.report.stats import dataset_stats

    quiet_datasets()  # its Map/Filter/Saving bars are noise beside ours ("reading")
    with tempfile.TemporaryDirectory(prefix="beam_inspect_") as work:
        data = DataArguments(dataset_format=args.dataset_format, dataset_train_split=args.dataset_train_split,
                             missing_reasoning=args.missing_reasoning, tool_call_checks=args.tool_call_checks)
        settings = data_settings(data, argparse.Namespace(max_length=None, assistant_only_loss=True, seed=0))
        converted = convert_records(args.dataset, work, settings, progress=sys.stderr.isatty())
        positions = converted.rows
        stats = dataset_stats(tokenizer, converted, max_length=args.max_length, encoder=encoder,
                              labels=lambda i: f"record {positions[i]}", policy=args.truncation_policy)
        stats.rejected += sum(converted.rejected.values())
        stats.rejected_reasons.update(converted.rejected)
        # Indices in the table are input positions, like --index takes them.
        for name in ("empty_mask", "truncated", "cut_inside_assistant", "dropped", "stop_untrained",
                     "internal_errors"):
            setattr(stats, name, [int(positions[i]) for i in getattr(stats, name)])
        internal = [*(int(row) for row, entry in zip(converted.reject_rows, converted.iter_rejects(), strict=True)
                      if entry["reason"] == Reason.INTERNAL_ERROR.value), *stats.internal_errors]
        del converted  # closes the memory maps before the work directory goes
    return stats, internal


main = command_main(__name__, register, "inspect")
