"""`beam-sft prepare`: convert and tokenize training data once, train on it many times (and on many nodes).

    beam-sft prepare data/samples/openai.jsonl -o /tmp/prepared --max-length 1024
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --tokenizer ./my-beam-model --num-proc 16 \\
        --truncation-policy turn --stats /tmp/prepare_stats.json
    python scripts/train.py --config configs/beam_full.yaml --dataset_name /shared/prepared   # no tokenizing
    beam-sft prepare 'raw/*.jsonl' -o /shared/shard-0 --shard 0/2      # on machine 0 (and 1/2 on machine 1)
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --merge /shared/shard-0 /shared/shard-1

Reads the inputs (files, globs, directories, save_to_disk dirs, hub ids; any format `convert-dataset`
reads), converts and validates every record, tokenizes it with the tokenizer's chat template (the same
encoder, masks and truncation policy as training), and writes DIR: a `save_to_disk` dataset with
`input_ids` and `labels` (-100 off the assistant mask), `rejects.jsonl` (every rejected record with its
source, line or index, reason and message) and `beam_sft_manifest.json` (tokenizer and template hashes,
max_length, policy, sources, counts). `scripts/train.py --dataset_name DIR` checks the manifest against
its own tokenizer and settings and refuses a mismatch, naming the field. `datasets.load_from_disk(DIR)`
gives a plain pre-tokenized dataset that TRL's SFTTrainer takes as is.

Many machines: `--shard I/N` converts and tokenizes chunks I, I+N, I+2N, ... of the input (each machine
still reads all of it, to number the chunks) into a shard directory; `--merge SHARD...`, with the same
INPUTs and options, writes DIR from the N shards: the same bytes one run writes (duplicates across shards
decided there, first occurrence kept). An eval split drawn among the records (--eval-split-size) needs all
of them, so shards refuse it: use --eval-split, or train with eval_split_size on the merged DIR.

Records in = kept + rejected + dropped by truncation, checked at the end of every run. DIR appears only
when the run finishes. Run again on the same files (path, size, mtime), tokenizer, template and settings,
it says DIR is up to date and does nothing (--force rebuilds). Exit status: 0 when the run finished
(rejections included), 3 when it finished but some records hit an unexpected error (`internal_error`
rejects: a converter bug), 2 for usage errors, 1 for fatal errors (e.g. a record whose assistant mask is
empty: the template trains nothing of it); set BEAM_SFT_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict


def summary_rows(manifest: dict) -> list[tuple[str, object]]:
    from beam_sft.dataset.reasoning_stats import summary_rows as reasoning_rows

    counts = manifest["counts"]
    share = f"{100 * counts['supervised_tokens'] / counts['total_tokens']:.1f}%" if counts["total_tokens"] else "-"
    rows: list[tuple[str, object]] = [
        ("records in", counts["records_in"]),
        ("records kept", counts["records_kept"]),
        ("rejected", counts["rejected_total"]),
        *((f"  {code}", n) for code, n in counts["rejected"].items()),
        ("dropped (too long)", counts["dropped_too_long"]),
        ("truncated", f"{counts['truncated']} ({counts['assistant_turns_cut']} assistant turns lost or cut)"),
        ("tokens", counts["total_tokens"]),
        ("supervised tokens", f"{counts['supervised_tokens']} ({share})"),
        ("trained <|return|>", counts["supervised_return"]),
        ("trained <|call|>", counts["supervised_call"]),
        ("max length", manifest["max_length"]),
        ("truncation policy", manifest["truncation_policy"]),
        *reasoning_rows(counts.get("reasoning"), manifest.get("missing_reasoning")),
    ]
    for name, split in manifest.get("splits", {}).items():
        if name != "train" or len(manifest["splits"]) > 1:
            rows.append((f"{name} split", f"{split['records_kept']} records, {split['total_tokens']} tokens"))
    return rows


def table(manifest: dict) -> str:
    rows = summary_rows(manifest)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _print_summary(manifest: dict) -> None:
    """The summary table, then the missing-reasoning notes (`beam_sft.dataset.reasoning_stats.notes`)."""
    from beam_sft.dataset.reasoning_stats import notes

    print(table(manifest), file=sys.stderr)
    counts = manifest["counts"]
    for note in notes(counts.get("reasoning"), manifest.get("missing_reasoning"), counts["rejected"]):
        print(note, file=sys.stderr)


def _tokenizer(args: argparse.Namespace, settings):
    """The tokenizer to encode with: warm-started where an earlier run left a snapshot of its setup
    (`beam_sft.render.warm`), and checked to train both stop tokens."""
    from beam_sft.dataset.examples import check_stop_tokens_trained
    from beam_sft.errors import UsageError
    from beam_sft.render.warm import load_for_encoding

    try:
        tokenizer = load_for_encoding(args.tokenizer)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load tokenizer {args.tokenizer!r}: {err}") from err
    if settings.assistant_only_loss:
        check_stop_tokens_trained(tokenizer)
    return tokenizer


def _inputs(args: argparse.Namespace):
    """The INPUT list, or the `datasets:` mixture of --config (beam_sft.dataset.mixture); not both."""
    from beam_sft.errors import UsageError

    if args.config and args.inputs:
        raise UsageError("give INPUT files or --config, not both")
    from beam_sft.cli import source_options

    if not args.config:
        if not args.inputs:
            raise UsageError("no INPUT: give data files, or a --config with a `datasets:` list")
        options = source_options(args)
        if not options:
            return args.inputs
        from beam_sft.records.files import data_sources

        return data_sources(args.inputs, args.split, options)
    if source_options(args):
        raise UsageError("--dataset-config/--revision/--data-dir/--data-files/--columns describe INPUTs; with "
                         "--config, give them per dataset (name, revision, data_dir, data_files, columns)")
    from beam_sft.dataset.mixture import read_mixture

    return read_mixture(args.config, seed=args.seed)


def _eval_inputs(args: argparse.Namespace, inputs):
    """`--eval-split NAME`: that split of the INPUTs (hub datasets or dataset directories), as DIR/eval."""
    from beam_sft.errors import UsageError

    if not args.eval_split:
        return None
    if not isinstance(inputs, list):
        raise UsageError("--eval-split picks a split of the INPUTs; a --config mixture draws its eval split "
                         "(test_split_size, --eval-split-size)")
    from beam_sft.cli import source_options
    from beam_sft.records.files import data_sources

    sources = data_sources(args.inputs, args.eval_split, source_options(args))
    if not all(src.kind in ("hub", "disk") for src in sources):
        raise UsageError(f"--eval-split {args.eval_split}: some INPUTs are files, which have no splits")
    if args.eval_split == args.split:
        raise UsageError(f"--eval-split {args.eval_split} is the training split (--split)")
    return sources


def _settings(args: argparse.Namespace, inputs):
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.errors import UsageError

    if args.eval_split and args.eval_split_size:
        raise UsageError("--eval-split reads separate eval data; --eval-split-size draws it: not both")
    # TRL's mixture key `test_split_size`, unless --eval-split-size says otherwise
    eval_size = args.eval_split_size or (0.0 if isinstance(inputs, list) or args.eval_split else
                                         float(inputs.settings.get("test_split_size") or 0.0))
    settings = DataSettings(format=args.format, max_length=args.max_length or None,
                            truncation_policy=args.truncation_policy, assistant_only_loss=not args.full_sequence_loss,
                            split=args.split, max_records=args.limit, eval_split_size=eval_size, seed=args.seed,
                            missing_reasoning=args.missing_reasoning, dedup=not args.keep_duplicates)
    settings.check()
    return settings


def run(args: argparse.Namespace) -> int:
    from beam_sft.dataset.prepare import build_prepared
    from beam_sft.dataset.settings import (
        DATA_VERSION,
        MANIFEST,
        fingerprint,
        read_manifest,
        tokenizer_files_hash,
    )
    from beam_sft.errors import UsageError
    from beam_sft.records.files import data_sources
    from beam_sft.template.tokenizer import short_hash

    if args.num_proc is None:
        from beam_sft.dataset.workers import default_num_proc

        args.num_proc = default_num_proc()
    if args.num_proc < 1:
        raise UsageError("--num-proc must be at least 1")
    shard = parse_shard(args.shard) if args.shard else None
    if shard and args.merge:
        raise UsageError("--shard prepares one shard, --merge joins them: not both")
    inputs = _inputs(args)
    settings = _settings(args, inputs)
    out = os.path.abspath(args.output)
    from beam_sft.dataset.prepare import SHARD_MANIFEST

    kind = SHARD_MANIFEST if shard else MANIFEST
    if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out) and not os.path.isfile(
            os.path.join(out, kind)))):
        raise UsageError(f"{args.output}: exists and is not a {'shard directory' if shard else 'prepared dataset'}; "
                         "refusing to replace it")
    from beam_sft.dataset.prepare import train_identity

    sources = inputs.sources if not isinstance(inputs, list) else data_sources(inputs, args.split)
    eval_inputs = _eval_inputs(args, inputs)
    for src in sources:
        if os.path.abspath(src.name) == out:
            raise UsageError(f"{args.output}: output is also an input")
    identity = train_identity(inputs, settings)
    if eval_inputs:
        from beam_sft.dataset.settings import source_identity

        identity["eval"] = source_identity(eval_inputs)
    # Up to date? Decided from the tokenizer's files, before paying for loading transformers and the tokenizer.
    files = tokenizer_files_hash(args.tokenizer)
    quick = None
    if files is not None:
        from beam_sft.render.encoder import RENDER_VERSION

        quick = short_hash(json.dumps([DATA_VERSION, RENDER_VERSION, identity, asdict(settings), files],
                                      sort_keys=True, default=str))
    if shard or args.merge:
        return _sharded(args, inputs, eval_inputs, settings, identity, quick, shard, out)
    existing = read_manifest(out) if os.path.isdir(out) else None
    if existing is not None and quick is not None and existing.get("inputs_fingerprint") == quick and not args.force:
        manifest = existing
        print(f"prepare: {args.output} is up to date (same files, tokenizer and settings; --force rebuilds it)",
              file=sys.stderr)
    else:
        tokenizer = _tokenizer(args, settings)
        if args.quiet:
            import datasets

            datasets.disable_progress_bars()
        manifest = build_prepared(inputs, tokenizer, settings, out, eval_inputs=eval_inputs, num_proc=args.num_proc,
                                  progress=not args.quiet, identity=identity,
                                  fingerprint=fingerprint(identity, tokenizer, settings),
                                  extra_manifest={"inputs_fingerprint": quick})
        print(f"prepare: wrote {manifest['counts']['records_kept']} tokenized records to {args.output} "
              f"({manifest['seconds']:.1f} s)", file=sys.stderr)
    return _report(args, out, manifest)


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard I/N` -> (I, N), 0 <= I < N."""
    from beam_sft.errors import UsageError

    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text}: expected I/N, e.g. 0/4 (shard 0 of 4)") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text}: I/N needs 0 <= I < N")
    return index, count


def _sharded(args: argparse.Namespace, inputs, eval_inputs, settings, identity, quick, shard, out: str) -> int:
    """--shard I/N (a shard directory) or --merge (the prepared directory from the shards)."""
    from beam_sft.dataset.prepare import build_prepared, merge_shards
    from beam_sft.dataset.settings import fingerprint

    tokenizer = _tokenizer(args, settings)
    if args.quiet:
        import datasets

        datasets.disable_progress_bars()
    fp = fingerprint(identity, tokenizer, settings)
    if shard:
        manifest = build_prepared(inputs, tokenizer, settings, out, eval_inputs=eval_inputs, num_proc=args.num_proc,
                                  progress=not args.quiet, identity=identity, fingerprint=fp, shard=shard)
        print(f"prepare: wrote shard {shard[0]}/{shard[1]} ({len(manifest['own'])} of {manifest['chunks']} chunks) "
              f"to {args.output} ({manifest['seconds']:.1f} s); join the {shard[1]} shards with --merge",
              file=sys.stderr)
        print(args.output)
        return 0
    manifest = merge_shards(args.merge, inputs, tokenizer, settings, out, eval_inputs=eval_inputs,
                            progress=not args.quiet, identity=identity, fingerprint=fp,
                            extra_manifest={"inputs_fingerprint": quick})
    print(f"prepare: merged {len(args.merge)} shards: {manifest['counts']['records_kept']} tokenized records in "
          f"{args.output} ({manifest['seconds']:.1f} s)", file=sys.stderr)
    return _report(args, out, manifest)


def _report(args: argparse.Namespace, out: str, manifest: dict) -> int:
    """--rejects, --stats, the summary on stderr, the directory on stdout; the exit status."""
    from beam_sft.errors import EXIT_INTERNAL_ERRORS, Reason
    from beam_sft.records.files import REJECTS, atomic_output, write_json_atomic

    if args.rejects:
        with atomic_output(args.rejects) as tmp:
            shutil.copyfile(os.path.join(out, REJECTS), tmp)
    if args.stats:
        write_json_atomic(args.stats, manifest)
    _print_summary(manifest)
    internal = manifest["counts"]["rejected"].get(Reason.INTERNAL_ERROR.value)
    if internal:
        print(f"WARNING: {internal} records hit an unexpected error (internal_error): a converter bug; they are "
              f"in {os.path.join(args.output, REJECTS)}. Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
    print(args.output)
    return EXIT_INTERNAL_ERRORS if internal else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from beam_sft.dataset.examples import TRUNCATION_POLICIES
    from beam_sft.validate import reasoning
    from beam_sft.validate.convert import INPUT_FORMATS
    from beam_sft.validate.rules import MISSING_REASONING_CHOICES

    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="files (.jsonl, .json, .parquet, .txt), globs, directories, save_to_disk dirs, or "
                             "hub dataset ids (or --config)")
    parser.add_argument("--config", metavar="FILE",
                        help="a YAML file with a `datasets:` list (TRL's mixture: path, data_files, data_dir, split, "
                             "fraction; plus format, max_records, missing_reasoning, shuffle per source), e.g. the "
                             "config scripts/train.py trains with; the manifest counts every source")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="the prepared dataset directory (replaced if it already holds one)")
    parser.add_argument("--tokenizer", metavar="PATH_OR_ID", default=None,
                        help="tokenizer with the Beam templates, the one training will use (default: the bundled "
                             "data/tokenizer)")
    parser.add_argument("--format", choices=INPUT_FORMATS, default="auto",
                        help="input format: beam (convert-dataset output), a converter's name, or auto (detect "
                             "per record) (default: auto)")
    parser.add_argument("--max-length", type=int, default=1024, metavar="N",
                        help="tokens per record, as training's --max_length; 0 for no limit (default: 1024)")
    parser.add_argument("--truncation-policy", choices=TRUNCATION_POLICIES, default="turn",
                        help="records longer than --max-length: cut back to the last whole assistant turn "
                             "(turn), drop them (drop), or cut at N (keep_start) (default: turn)")
    parser.add_argument("--missing-reasoning", choices=MISSING_REASONING_CHOICES, default=reasoning.DEFAULT,
                        help=reasoning.HELP)
    parser.add_argument("--keep-duplicates", action="store_true",
                        help="keep exact duplicates; by default a validated record equal to an earlier one (in any "
                             "input, whatever its format; an eval record equal to a training one) is rejected as "
                             "`duplicate`, the first kept")
    parser.add_argument("--full-sequence-loss", action="store_true",
                        help="label every token (training's --assistant_only_loss false); default: assistant "
                             "turns only")
    parser.add_argument("--eval-split-size", type=float, default=0.0, metavar="X",
                        help="hold out this share (0-1) or number (>=1) of records as DIR/eval (default: 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the eval split (default: 0)")
    parser.add_argument("--num-proc", type=int, default=None, metavar="N",
                        help="worker processes, each converting and tokenizing whole chunks of 5,000 records; the "
                             "output is the same for any N (default: the cores this process may use, at most 32)")
    parser.add_argument("--rejects", metavar="PATH",
                        help="also copy the rejects here (they are always in DIR/rejects.jsonl)")
    parser.add_argument("--stats", metavar="PATH", help="write the manifest (counts included) here as JSON")
    parser.add_argument("--split", default="train", help="split of a hub dataset or DatasetDict (default: train)")
    parser.add_argument("--eval-split", metavar="NAME",
                        help="also prepare this split of the INPUTs (hub datasets or dataset directories, e.g. "
                             "validation) as DIR/eval, deduplicated against the training split")
    from beam_sft.cli import add_source_arguments

    add_source_arguments(parser)
    parser.add_argument("--limit", type=int, metavar="N", help="read at most N input records")
    parser.add_argument("--force", action="store_true",
                        help="rebuild DIR even when it was prepared from the same files, tokenizer and settings")
    parser.add_argument("--shard", metavar="I/N",
                        help="prepare only shard I of N (chunks I, I+N, ...; 0 <= I < N) into DIR, a shard "
                             "directory; run all N (on as many machines), then --merge them")
    parser.add_argument("--merge", nargs="+", metavar="SHARD",
                        help="write DIR from the N shard directories of --shard runs with these same INPUTs and "
                             "options: the same bytes a single run writes")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def register(subparsers) -> None:
    parser = subparsers.add_parser("prepare", help="convert + tokenize training data once (for many runs / nodes)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    from beam_sft.cli import run_command

    return run_command(register, "prepare", argv)


if __name__ == "__main__":
    sys.exit(main())
