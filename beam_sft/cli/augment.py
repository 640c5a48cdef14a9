"""`beam-sft augment`: derive tool-calling records that teach a model *when* to call a tool and *which* one.

    beam-sft augment train.jsonl -o aug.jsonl --transform irrelevance=0.2 --transform distractors=2 \\
        --transform mask-names=0.25 --transform ask-missing=0.1 --seed 0 --stats stats.json
    beam-sft augment data/samples/openai.jsonl -o /tmp/aug.jsonl --transform mask-names=1 --provenance /tmp/prov.jsonl
    beam-sft augment raw_glaive.json --dataset_format glaive -o aug.jsonl --transform irrelevance=0.3 --rejects rej.jsonl

Transforms (each `--transform NAME=VALUE`, each at most once): irrelevance=P and ask-missing=P add records,
distractors=K and mask-names=P rewrite them; what each does and why: docs/tool-calling.md.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from beam_sft.cli import add_command, add_rewrite_arguments, command_main, committed, progress_bar
from beam_sft.errors import EXIT_INTERNAL_ERRORS, FatalError, Reason, UsageError


class RunCounts:
    """What the run wrote: records in = kept (written from the input) + rejected; written = kept + added."""

    def __init__(self) -> None:
        self.records_in = self.kept = self.added = 0
        self.rejected: Counter[str] = Counter()

    @property
    def written(self) -> int:
        return self.kept + self.added

    def to_dict(self) -> dict[str, Any]:
        return {"records_in": self.records_in, "records_kept": self.kept, "rejected": sum(self.rejected.values()),
                "rejected_by_reason": dict(self.rejected.most_common()), "added": self.added,
                "records_written": self.written}


def _records(sources: list, args: argparse.Namespace, options):
    """(item, record, None) or (item, None, reject entry) per input record, converted."""
    from beam_sft.records.files import iter_items
    from beam_sft.validate.convert import convert_item

    for item in iter_items(sources, limit=args.max_records):
        record, _, reject = convert_item(item, args.dataset_format, options)
        yield item, record, reject


def _collect(sources: list, args: argparse.Namespace, augmenter, total: int | None) -> int:
    """First pass: the pool of tools distractors and irrelevance draw from; returns the records read."""
    with progress_bar("collecting tools", args.quiet, total=total) as bar:
        for _, record, _ in _records(sources, args, augmenter.options):
            if record is not None:
                augmenter.collect(record)
            bar.update()
        return bar.n


def _augment(sources: list, args: argparse.Namespace, augmenter, sinks: dict, total: int | None) -> RunCounts:
    """Second pass: every input record converted, transformed and written, with its additions after it."""
    import orjson

    from beam_sft.validate.convert import to_row

    counts = RunCounts()
    with progress_bar("augmenting", args.quiet, total=total) as bar:
        for position, (item, record, reject) in enumerate(_records(sources, args, augmenter.options)):
            counts.records_in += 1
            bar.update()
            if reject is not None:
                counts.rejected[reject["reason"]] += 1
                if "rejects" in sinks:
                    sinks["rejects"].write(reject)
                continue
            for out in augmenter.apply(record, position):
                sinks["output"].write_raw(orjson.dumps(to_row(out.record), option=orjson.OPT_APPEND_NEWLINE))
                counts.kept += out.added_by is None
                counts.added += out.added_by is not None
                if out.touched and "provenance" in sinks:
                    sinks["provenance"].write({
                        "output_line": counts.written, "source": item.source,
                        ("line" if item.by_line else "index"): item.position, "input": out.position,
                        "added_by": out.added_by, "rewrites": out.rewrites})
    return counts


def run(args: argparse.Namespace) -> int:
    from beam_sft.augment.pipeline import Augmenter, parse_specs
    from beam_sft.cli import sources_besides
    from beam_sft.eval.turns import held_out_total
    from beam_sft.records.files import JsonlSink, open_writer
    from beam_sft.storage import write_json_atomic

    specs = parse_specs(args.transform or [])
    if args.pool_size < 1 or (args.max_records is not None and args.max_records < 0):
        raise UsageError("--pool-size must be at least 1 and --max_records at least 0")
    sources = sources_besides(args.inputs, args.output, split=args.dataset_train_split)
    augmenter = Augmenter(specs, seed=args.seed, pool_size=args.pool_size)
    # the bars' totals (and so their ETAs): counted where cheap, else the first pass's count for the second
    total = None if args.quiet else held_out_total(sources, max_records=args.max_records)
    if augmenter.needs_pool:
        total = _collect(sources, args, augmenter, total)
    sinks = {"output": open_writer(args.output),
             **{key: JsonlSink(getattr(args, key)) for key in ("rejects", "provenance") if getattr(args, key)}}
    with committed(*sinks.values()):
        counts = _augment(sources, args, augmenter, sinks, total)
        if counts.records_in != counts.kept + sum(counts.rejected.values()):
            raise FatalError(f"bookkeeping error: {counts.records_in} in != {counts.kept} kept + "
                             f"{sum(counts.rejected.values())} rejected")
    stats = {"inputs": [s.name for s in sources], "output": args.output, "seed": args.seed,
             "specs": list(args.transform), **counts.to_dict(), **augmenter.summary()}
    print(summary(stats))
    if args.stats:
        write_json_atomic(args.stats, stats)
    print("\n".join(drop_report(stats, args.rejects)), file=sys.stderr)
    internal = counts.rejected["internal_error"] + sum(c.skipped["internal_error"] for c in augmenter.counts.values())
    if internal:
        print(f"warning: {internal} record(s) or transform(s) hit an unexpected error (a bug in beam-sft; please "
              f"report it; BEAM_SFT_DEBUG=1 shows the traceback). Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
        return EXIT_INTERNAL_ERRORS
    return 0


def summary(stats: dict[str, Any]) -> str:
    """The run's counts as text: the invariant, then one line per transform."""
    lines = [(f"augment: {stats['records_in']} records in = {stats['records_kept']} written from the input + "
              f"{stats['rejected']} rejected; {stats['added']} added; {stats['records_written']} records written "
              f"to {stats['output']}")]
    if (pool := stats["pool"]) is not None:
        lines.append(f"  tool pool: {pool['tools']} tools (at most {pool['size']}; {pool['refused']} refused)")
    for name, c in stats["transforms"].items():
        done = f"added {c['added']}" if c["kind"] == "adds" else f"changed {c['changed']}"
        skipped = ", ".join(f"{reason} {n}" for reason, n in c["skipped"].items()) or "-"
        lines.append(f"  {name}: {done} of {c['seen']}; skipped: {skipped}")
    return "\n".join(lines)


def _keep_untransformed(code: str) -> str:
    if code.startswith("invalid_"):
        return "none: the result fails validation (the record is written unchanged)"
    if code == Reason.INTERNAL_ERROR.value:
        return "none: a bug in beam-sft, please report it"
    return "none: the transform does not fit such records (written unchanged; docs/tool-calling.md)"


def drop_report(stats: dict[str, Any], rejects: str | None) -> list[str]:
    """The input records rejected, then per transform the records it could not transform, by reason
    (`not_sampled` is the share P at work, not a drop)."""
    from beam_sft.dataset.drops import drop_lines, rewrite_rejected_lines

    lines = rewrite_rejected_lines(Counter(stats["rejected_by_reason"]), stats["records_in"], rejects)
    for name, c in stats["transforms"].items():
        if skipped := Counter({code: n for code, n in c["skipped"].items() if code != "not_sampled"}):
            lines += drop_lines({"records_in": c["seen"], "rejected": skipped}, rejects_hint=None,
                                keep=_keep_untransformed, head=f"{name} did not transform",
                                noun="records it was given")
    return lines


def register(subparsers) -> None:
    add_rewrite_arguments(add_command(subparsers, "augment", run, "derive records that teach when and which tool to call",
                                      __doc__), add_arguments)


def add_arguments(parser) -> None:
    """augment's own options (`add_rewrite_arguments` adds the rest)."""
    from beam_sft.augment.pipeline import TRANSFORMS
    from beam_sft.augment.pool import POOL_SIZE

    parser.add_argument("--transform", action="append", metavar="NAME=VALUE",
                        help=f"a transform and its value (repeatable, each once): {', '.join(TRANSFORMS)}; "
                             "irrelevance, mask-names and ask-missing take a share P in [0, 1], distractors a "
                             "count K")
    parser.add_argument("--seed", type=int, default=0, help="seed of every choice, per record (default: 0)")
    parser.add_argument("--pool-size", type=int, default=POOL_SIZE, metavar="N",
                        help=f"at most N distinct tools in the pool of distractors and irrelevance (default: "
                             f"{POOL_SIZE})")
    parser.add_argument("--provenance", metavar="PATH",
                        help="one JSON line per record a transform changed or added: its output line, the input "
                             "record it comes from, the transforms")


main = command_main(__name__, register, "augment")
