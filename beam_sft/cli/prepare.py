"""`beam-sft prepare`: convert and tokenize training data once, train on it many times (and on many nodes).

    beam-sft prepare data/samples/openai.jsonl -o /tmp/prepared --max_length 1024
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --tokenizer_name_or_path ./my-beam-model \\
        --dataset_num_proc 16 --truncation_policy turn --stats /tmp/prepare_stats.json
    beam-sft prepare --config configs/beam_full.yaml -o /shared/prepared   # the data a training config reads
    python scripts/train.py --config configs/beam_full.yaml --dataset_name /shared/prepared   # no tokenizing
    beam-sft prepare 'raw/*.jsonl' -o /shared/shard-0 --shard 0/2      # on machine 0 (and 1/2 on machine 1)
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --merge /shared/shard-0 /shared/shard-1

The data options are training's (one name each, in a `--config` YAML or on the command line); the data is
INPUT arguments, or dataset_name, or a `datasets:` mixture. DIR holds `input_ids` + `labels` (a `save_to_disk`
dataset), `rejects.jsonl` and `beam_sft_manifest.json`, checked by training against its own tokenizer and
settings. Exit status: 0 finished (rejections included), 3 some records hit an internal_error, 2 usage error or a
run that kept no training record or dropped more than --max_reject_share of its input (DIR written all the same),
1 fatal error; BEAM_SFT_DEBUG=1 for tracebacks. See docs/training.md and docs/cli.md#beam-sft-prepare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, replace

from beam_sft.cli import quiet_datasets, run_guarded, sources_besides
from beam_sft.errors import EXIT_INTERNAL_ERRORS, Reason, UsageError
from beam_sft.storage import atomic_output, short_hash, write_json_atomic


def _print_summary(manifest: dict, rejects: str) -> None:
    """The summary table, the missing-reasoning notes, the drops by reason (`rejects`: the file of them)."""
    from beam_sft.dataset.drops import aligned_rows, drop_lines
    from beam_sft.dataset.prepare import drop_counts
    from beam_sft.dataset.reasoning_stats import notes
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
    print("\n".join(aligned_rows(rows)), file=sys.stderr)
    for note in notes(counts.get("reasoning"), manifest.get("missing_reasoning"), counts["rejected"]):
        print(note, file=sys.stderr)
    print("\n".join(drop_lines(drop_counts(manifest), rejects)), file=sys.stderr)


def _tokenizer(name: str | None, settings):
    """The tokenizer to encode with, warm-started (`beam_sft.render.warm`), checked to train both stops."""
    from beam_sft.dataset.examples import check_stop_tokens_trained
    from beam_sft.render.warm import load_for_encoding

    try:
        tokenizer = load_for_encoding(name)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot load tokenizer {name!r}: {err}") from err
    if settings.assistant_only_loss:
        check_stop_tokens_trained(tokenizer)
    return tokenizer


def _inputs(data, names: list[str], seed: int, base):
    """The training data: the INPUT arguments, else dataset_name or the `datasets:` mixture as training reads
    them (`beam_sft.train.data_phase.training_inputs`)."""
    from beam_sft.records.files import data_sources, source_options
    from beam_sft.train.data_phase import training_inputs

    if names and (data.dataset_name or data.datasets):
        raise UsageError("give the data as INPUT arguments or as dataset_name / a `datasets:` list (--config), "
                         "not both")
    if not names:
        if not data.dataset_name and not data.datasets:
            raise UsageError("no data: give INPUT files, --dataset_name, or a --config with dataset_name or a "
                             "`datasets:` list")
        found = training_inputs(data, seed=seed, base=base)
        return [found] if isinstance(found, str) else found
    options = source_options(data)
    return data_sources(names, data.dataset_train_split, options) if options else names


def _eval_inputs(data, names: list[str]):
    """The separate eval data (eval_dataset_name, or the dataset_test_split of the inputs) as training reads it
    (`beam_sft.train.data_phase.eval_inputs`), prepared as DIR/eval; None when there is none."""
    from beam_sft.train.data_phase import eval_inputs

    if data.eval_dataset_name or len(names) < 2:
        return eval_inputs(replace(data, dataset_name=names[0]) if names else data)
    found = [eval_inputs(replace(data, dataset_name=name)) for name in names]
    return [src for sources in found for src in sources or ()] or None


def parse(argv: list[str]):
    """(data options, prepare's options, the INPUT arguments, the directory relative mixture paths may be
    found in) from a command line; a `UsageError` for anything wrong, before anything loads."""
    parser = make_parser()
    data, options, extra = parser.parse_args_and_config(argv)
    base = parser.config_path.parent if parser.config_path is not None else "."
    return data, options, list(extra.inputs), base


def run(data, options, names: list[str], base=".") -> int:
    """Prepare (or shard, or merge) and report; the exit status."""
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.dataset.drops import DroppedTooMuch
    from beam_sft.dataset.prepare import SHARD_MANIFEST, PrepareRun, train_identity
    from beam_sft.dataset.settings import MANIFEST, fingerprint, read_manifest, source_identity

    if options.dataset_num_proc is None:
        from beam_sft.dataset.pipeline import default_num_proc

        options.dataset_num_proc = default_num_proc()
    if options.dataset_num_proc < 1:
        raise UsageError("--dataset_num_proc must be at least 1")
    shard = parse_shard(options.shard) if options.shard else None
    if shard and options.merge:
        raise UsageError("--shard prepares one shard, --merge joins them: not both")
    inputs = _inputs(data, names, options.seed, base)
    eval_inputs = _eval_inputs(data, names)
    if eval_inputs and data.eval_split_size:
        raise UsageError("eval_dataset_name / dataset_test_split read separate eval data; eval_split_size draws "
                         "it: not both")
    settings = data_settings(data, options)
    out = os.path.abspath(options.output)
    kind = SHARD_MANIFEST if shard else MANIFEST
    if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out) and not os.path.isfile(
            os.path.join(out, kind)))):
        raise UsageError(f"{options.output}: exists and is not a {'shard directory' if shard else 'prepared dataset'}"
                         "; refusing to replace it")
    sources_besides(inputs if isinstance(inputs, list) else inputs.sources, options.output,
                    split=data.dataset_train_split)
    identity = train_identity(inputs, settings)
    if eval_inputs:
        identity["eval"] = source_identity(eval_inputs)
    quick = _quick_fingerprint(identity, settings, data.tokenizer_name_or_path)
    existing = read_manifest(out) if os.path.isdir(out) and not (shard or options.merge) else None
    if existing is not None and quick is not None and existing.get("inputs_fingerprint") == quick and not options.force:
        print(f"prepare: {options.output} is up to date (same files, tokenizer and settings; --force rebuilds it)",
              file=sys.stderr)
        return _report(options, out, existing, settings.max_reject_share)
    tokenizer = _tokenizer(data.tokenizer_name_or_path, settings)
    if options.quiet:
        quiet_datasets()
    prepare = PrepareRun(inputs, tokenizer, settings, out, eval_inputs, identity,
                         fingerprint(identity, tokenizer, settings), {"inputs_fingerprint": quick},
                         options.dataset_num_proc, progress=not options.quiet)
    if shard:
        manifest = prepare.shard(shard)
        print(f"prepare: wrote shard {shard[0]}/{shard[1]} ({len(manifest['own'])} of {manifest['chunks']} chunks) "
              f"to {options.output} ({manifest['seconds']:.1f} s); join the {shard[1]} shards with --merge",
              file=sys.stderr)
        print(options.output)
        return 0
    try:
        manifest = prepare.merge(options.merge) if options.merge else prepare.build()
    except DroppedTooMuch as err:  # the directory is written: reported below, then refused by _report
        manifest = err.manifest
    done = f"merged {len(options.merge)} shards: {manifest['counts']['records_kept']} tokenized records in" \
        if options.merge else f"wrote {manifest['counts']['records_kept']} tokenized records to"
    print(f"prepare: {done} {options.output} ({manifest['seconds']:.1f} s)", file=sys.stderr)
    return _report(options, out, manifest, settings.max_reject_share)


def _quick_fingerprint(identity, settings, tokenizer_name: str | None) -> str | None:
    """Up to date? Decided from the tokenizer's files, before paying for loading transformers and the tokenizer
    (None: a hub tokenizer, not decidable so)."""
    from beam_sft.dataset.settings import DATA_VERSION, tokenizer_files_hash
    from beam_sft.render.encoder import RENDER_VERSION

    files = tokenizer_files_hash(tokenizer_name)
    if files is None:
        return None
    decides = {k: v for k, v in asdict(settings).items() if k != "max_reject_share"}  # checked on every run
    return short_hash(json.dumps([DATA_VERSION, RENDER_VERSION, identity, decides, files], sort_keys=True,
                                 default=str))


def parse_shard(text: str) -> tuple[int, int]:
    """`--shard I/N` -> (I, N), 0 <= I < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text}: expected I/N, e.g. 0/4 (shard 0 of 4)") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text}: I/N needs 0 <= I < N")
    return index, count


def _report(options, out: str, manifest: dict, max_reject_share: float) -> int:
    """--rejects, --stats, the summary on stderr, the directory on stdout; the exit status (`check_drops`
    refuses a run that kept nothing or dropped too much, after its directory and rejects are written)."""
    from beam_sft.dataset.prepare import check_drops
    from beam_sft.records.files import REJECTS

    if options.rejects:
        with atomic_output(options.rejects) as tmp:
            shutil.copyfile(os.path.join(out, REJECTS), tmp)
    if options.stats:
        write_json_atomic(options.stats, manifest)
    _print_summary(manifest, os.path.join(options.output, REJECTS))
    internal = manifest["counts"]["rejected"].get(Reason.INTERNAL_ERROR.value)
    if internal:
        print(f"WARNING: {internal} records hit an unexpected error (internal_error): a converter bug; they are "
              f"in {os.path.join(options.output, REJECTS)}. Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
    check_drops(manifest, max_reject_share)
    print(options.output)
    return EXIT_INTERNAL_ERRORS if internal else 0


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def make_parser(prog: str = "beam-sft prepare"):
    """The options: `DataArguments`, `PrepareArguments` (YAML via --config) and the INPUT arguments."""
    from beam_sft.dataset.arguments import DataArguments, PrepareArguments
    from beam_sft.train.options import BeamTrlParser

    def training_keys() -> set[str]:  # only for a YAML with keys prepare does not take: SFTConfig loads torch
        from beam_sft.train.options import make_parser as training_parser

        return training_parser().option_names()

    parser = BeamTrlParser((DataArguments, PrepareArguments), prog=prog, description=__doc__,
                           formatter_class=_Formatter, allow_abbrev=False, other_keys=training_keys)
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="the data: files (.jsonl, .json, .parquet, .txt), globs, directories, save_to_disk "
                             "dirs, or hub dataset ids (or dataset_name, or a `datasets:` list in --config)")
    return parser


def register(subparsers) -> None:
    # Parsed by TRL's parser in `main`, as `beam-sft train` is: the subcommand only dispatches.
    parser = subparsers.add_parser("prepare", help="convert + tokenize training data once (for many runs / nodes)",
                                   add_help=False, prefix_chars="\0")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: run(*parse(args.argv)))


def main(argv: list[str] | None = None) -> int:
    return run_guarded(lambda argv: run(*parse(argv)), argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
