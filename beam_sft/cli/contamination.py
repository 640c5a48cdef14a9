"""`beam-sft contamination INPUT... | --config FILE`: is BFCL v4 in the training data?

Question text (whole, or 13 words in a row) and tool names against BFCL v4's single-turn categories; a question
overlap means BFCL's scores measure memory (docs/evaluation.md#is-bfcl-in-the-training-data).

    beam-sft contamination data/real/train.jsonl data/real/train.extra.jsonl
    beam-sft contamination --config configs/demo_real.yaml --json contamination.json
    beam-sft contamination my_tools.jsonl --bfcl simple_python,live_simple --fail-on-overlap
"""

from __future__ import annotations

import json
import sys

from beam_sft.cli import add_command, command_main, data_option, nearest


def register(subparsers) -> None:
    parser = add_command(subparsers, "contamination", run,
                         "Check training data against BFCL v4: question text (whole or 13-gram) and function names.",
                         *__doc__.split("\n\n", 1))
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="training data: files, globs, directories, save_to_disk datasets or hub ids (any format "
                             "beam-sft converts)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="instead of INPUT: a YAML `datasets:` mixture (what train and prepare read); the rows "
                             "the mixture takes are checked")
    data_option(parser, "dataset_format", default="auto", metavar="FMT",
                help="input format: auto (default, detected per record), beam, openai, sharegpt, harmony, hermes, "
                     "glaive, xlam")
    data_option(parser, "dataset_train_split", default="train", metavar="NAME",
                help="split of a dataset directory or hub dataset (default: train)")
    parser.add_argument("--bfcl", metavar="CATEGORIES", default="all",
                        help="the BFCL categories to check against: a comma list or all (default)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON")
    parser.add_argument("--fail-on-overlap", action="store_true",
                        help="exit 1 when any record's question text overlaps a BFCL question")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _items(args):
    """(Item, format) pairs: the inputs in order, or the rows a mixture takes, each with its source's format."""
    from beam_sft.records.files import read_items

    if args.config is None:
        return ((item, args.dataset_format) for item in read_items(args.inputs, args.dataset_train_split))
    from beam_sft.dataset.mixture import read_mixture

    mixture = read_mixture(args.config)
    formats = dict(zip((s.name for s in mixture.sources), mixture.formats(args.dataset_format), strict=True))
    return ((item, formats.get(item.source, args.dataset_format)) for item in mixture.items())


def run(args) -> int:
    from tqdm.auto import tqdm

    from beam_sft.errors import UsageError
    from beam_sft.eval.bfcl.checker import parse_categories
    from beam_sft.eval.bfcl.contamination import BfclIndex, scan
    from beam_sft.eval.turns import held_out_total
    from beam_sft.storage import write_json_atomic
    from beam_sft.validate.convert import INPUT_FORMATS

    if bool(args.inputs) == (args.config is not None):
        raise UsageError("give INPUT files or --config FILE (one of them)")
    if args.dataset_format not in INPUT_FORMATS:
        raise UsageError(f"--dataset_format {args.dataset_format!r} is not one of {', '.join(INPUT_FORMATS)}"
                         f"{nearest(args.dataset_format, INPUT_FORMATS)}")
    index = BfclIndex.build(parse_categories(args.bfcl))
    total = held_out_total(args.inputs, args.dataset_train_split) if args.inputs else None
    items = tqdm(_items(args), desc="Checking", unit=" rec", total=total, disable=args.quiet)
    report = scan(items, index)
    overlaps = report["records_with_question_overlap"]
    print(f"{report['records']} records ({report['rejected']} rejected) against BFCL v4 "
          f"({len(report['bfcl_categories'])} categories): {overlaps} with a question overlap, "
          f"{report['records_with_a_bfcl_function_name']} declaring or calling a BFCL function name", file=sys.stderr)
    for hit in report["question_overlaps"][:10]:
        print(f"  question: {hit['where']} message {hit['message_index']} ~ {hit['bfcl_id']} "
              f"({hit['match']})", file=sys.stderr)
    for name, n in list(report["function_names"].items())[:10]:
        print(f"  name: {name} ({n['records']} records, {n['bfcl_entries']} BFCL entries)", file=sys.stderr)
    if args.json:
        write_json_atomic(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    print(json.dumps({k: report[k] for k in ("records", "rejected", "records_with_question_overlap",
                                             "records_with_a_bfcl_function_name")}))
    return 1 if args.fail_on_overlap and overlaps else 0


main = command_main(__name__, register, "contamination")
