"""`beam-sft prepare`: convert and tokenize training data once, train on it many times (and on many nodes).

    beam-sft prepare data/samples/openai.jsonl -o /tmp/prepared --max_length 1024
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --tokenizer_name_or_path ./my-beam-model \\
        --dataset_num_proc 16 --truncation_policy turn --stats /tmp/prepare_stats.json
    beam-sft prepare --config configs/beam_full.yaml -o /shared/prepared   # the data a training config reads
    python scripts/train.py --config configs/beam_full.yaml --dataset_name /shared/prepared   # no tokenizing
    beam-sft prepare 'raw/*.jsonl' -o /shared/shard-0 --shard 0/2      # on machine 0 (and 1/2 on machine 1)
    beam-sft prepare 'raw/*.jsonl' -o /shared/prepared --merge /shared/shard-0 /shared/shard-1

The data options are training's (`beam_sft.dataset.arguments`: one name each, in a `--config` YAML or on the
command line): the same YAML file serves both commands, each passing over the keys only the other one takes
(prepare over learning_rate, training over output). The data is INPUT arguments (files, globs, directories,
save_to_disk dirs, hub ids; any format `convert-dataset` reads), or dataset_name, or a `datasets:` mixture.
Every record is converted, validated and tokenized with the tokenizer's chat template (the same encoder, masks
and truncation policy as training) into DIR: a `save_to_disk` dataset with `input_ids` and `labels` (-100 off
the assistant mask), `rejects.jsonl` (every rejected record with its source, line or index, reason and
message) and `beam_sft_manifest.json` (tokenizer and template hashes, max_length, policy, sources, counts).
`scripts/train.py --dataset_name DIR` checks the manifest against its own tokenizer and settings and refuses
a mismatch, naming the field. `datasets.load_from_disk(DIR)` gives a plain pre-tokenized dataset that TRL's
SFTTrainer takes as is.

Many machines: `--shard I/N` converts and tokenizes chunks I, I+N, I+2N, ... of the input (each machine
still reads all of it, to number the chunks) into a shard directory; `--merge SHARD...`, with the same
inputs and options, writes DIR from the N shards: the same bytes one run writes (duplicates across shards
decided there, first occurrence kept). An eval split drawn among the records (eval_split_size) needs all
of them, so shards refuse it: use dataset_test_split, or train with eval_split_size on the merged DIR.

Records in = kept + rejected + dropped by truncation, checked at the end of every run. DIR appears only
when the run finishes. Run again on the same files (path, size, mtime), tokenizer, template and settings,
it says DIR is up to date and does nothing (--force rebuilds). Exit status: 0 when the run finished
(rejections included), 3 when it finished but some records hit an unexpected error (`internal_error`
rejects: a converter bug), 2 for usage errors (a renamed option: one line naming the new one), 1 for fatal
errors (e.g. a record whose assistant mask is empty: the template trains nothing of it); set
BEAM_SFT_DEBUG=1 for tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, replace


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


def _print_summary(manifest: dict) -> None:
    """The summary table, then the missing-reasoning notes (`beam_sft.dataset.reasoning_stats.notes`)."""
    from beam_sft.dataset.reasoning_stats import notes

    rows = summary_rows(manifest)
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows), file=sys.stderr)
    counts = manifest["counts"]
    for note in notes(counts.get("reasoning"), manifest.get("missing_reasoning"), counts["rejected"]):
        print(note, file=sys.stderr)


def _tokenizer(name: str | None, settings):
    """The tokenizer to encode with: warm-started where an earlier run left a snapshot of its setup
    (`beam_sft.render.warm`), and checked to train both stop tokens."""
    from beam_sft.dataset.examples import check_stop_tokens_trained
    from beam_sft.errors import UsageError
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
    from beam_sft.errors import UsageError
    from beam_sft.records.files import data_sources
    from beam_sft.train.data_phase import source_options, training_inputs

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
    from beam_sft.dataset.prepare import SHARD_MANIFEST, build_prepared, train_identity
    from beam_sft.dataset.settings import MANIFEST, fingerprint, read_manifest, source_identity
    from beam_sft.errors import UsageError
    from beam_sft.records.files import data_sources

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
    sources = inputs.sources if not isinstance(inputs, list) else data_sources(inputs, data.dataset_train_split)
    for src in sources:
        if os.path.abspath(src.name) == out:
            raise UsageError(f"{options.output}: output is also an input")
    identity = train_identity(inputs, settings)
    if eval_inputs:
        identity["eval"] = source_identity(eval_inputs)
    quick = _quick_fingerprint(identity, settings, data.tokenizer_name_or_path)
    if shard or options.merge:
        return _sharded(data, options, inputs, eval_inputs, settings, identity, quick, shard, out)
    existing = read_manifest(out) if os.path.isdir(out) else None
    if existing is not None and quick is not None and existing.get("inputs_fingerprint") == quick and not options.force:
        manifest = existing
        print(f"prepare: {options.output} is up to date (same files, tokenizer and settings; --force rebuilds it)",
              file=sys.stderr)
    else:
        tokenizer = _tokenizer(data.tokenizer_name_or_path, settings)
        _quiet(options)
        manifest = build_prepared(inputs, tokenizer, settings, out, eval_inputs=eval_inputs,
                                  num_proc=options.dataset_num_proc, progress=not options.quiet, identity=identity,
                                  fingerprint=fingerprint(identity, tokenizer, settings),
                                  extra_manifest={"inputs_fingerprint": quick})
        print(f"prepare: wrote {manifest['counts']['records_kept']} tokenized records to {options.output} "
              f"({manifest['seconds']:.1f} s)", file=sys.stderr)
    return _report(options, out, manifest)


def _quick_fingerprint(identity, settings, tokenizer_name: str | None) -> str | None:
    """Up to date? Decided from the tokenizer's files, before paying for loading transformers and the tokenizer
    (None: a hub tokenizer, not decidable so)."""
    from beam_sft.dataset.settings import DATA_VERSION, tokenizer_files_hash
    from beam_sft.render.encoder import RENDER_VERSION
    from beam_sft.storage import short_hash

    files = tokenizer_files_hash(tokenizer_name)
    if files is None:
        return None
    return short_hash(json.dumps([DATA_VERSION, RENDER_VERSION, identity, asdict(settings), files], sort_keys=True,
                                 default=str))


def _quiet(options) -> None:
    if options.quiet:
        # datasets reads this when it is imported: importing it here just to silence it would cost a second.
        os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
        if "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()


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


def _sharded(data, options, inputs, eval_inputs, settings, identity, quick, shard, out: str) -> int:
    """--shard I/N (a shard directory) or --merge (the prepared directory from the shards)."""
    from beam_sft.dataset.prepare import build_prepared, merge_shards
    from beam_sft.dataset.settings import fingerprint

    tokenizer = _tokenizer(data.tokenizer_name_or_path, settings)
    _quiet(options)
    fp = fingerprint(identity, tokenizer, settings)
    if shard:
        manifest = build_prepared(inputs, tokenizer, settings, out, eval_inputs=eval_inputs,
                                  num_proc=options.dataset_num_proc, progress=not options.quiet, identity=identity,
                                  fingerprint=fp, shard=shard)
        print(f"prepare: wrote shard {shard[0]}/{shard[1]} ({len(manifest['own'])} of {manifest['chunks']} chunks) "
              f"to {options.output} ({manifest['seconds']:.1f} s); join the {shard[1]} shards with --merge",
              file=sys.stderr)
        print(options.output)
        return 0
    manifest = merge_shards(options.merge, inputs, tokenizer, settings, out, eval_inputs=eval_inputs,
                            progress=not options.quiet, identity=identity, fingerprint=fp,
                            extra_manifest={"inputs_fingerprint": quick})
    print(f"prepare: merged {len(options.merge)} shards: {manifest['counts']['records_kept']} tokenized records in "
          f"{options.output} ({manifest['seconds']:.1f} s)", file=sys.stderr)
    return _report(options, out, manifest)


def _report(options, out: str, manifest: dict) -> int:
    """--rejects, --stats, the summary on stderr, the directory on stdout; the exit status."""
    from beam_sft.errors import EXIT_INTERNAL_ERRORS, Reason
    from beam_sft.records.files import REJECTS
    from beam_sft.storage import atomic_output, write_json_atomic

    if options.rejects:
        with atomic_output(options.rejects) as tmp:
            shutil.copyfile(os.path.join(out, REJECTS), tmp)
    if options.stats:
        write_json_atomic(options.stats, manifest)
    _print_summary(manifest)
    internal = manifest["counts"]["rejected"].get(Reason.INTERNAL_ERROR.value)
    if internal:
        print(f"WARNING: {internal} records hit an unexpected error (internal_error): a converter bug; they are "
              f"in {os.path.join(options.output, REJECTS)}. Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
    print(options.output)
    return EXIT_INTERNAL_ERRORS if internal else 0


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def make_parser(prog: str = "beam-sft prepare"):
    """The options: `DataArguments` and `PrepareArguments` (beam_sft.dataset.arguments), TRL's parser (YAML via
    --config), and the INPUT arguments."""
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
    from beam_sft.cli import run_guarded

    return run_guarded(lambda argv: run(*parse(argv)), argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
