"""`beam-sft convert` / `convert-dataset`: turn OpenAI, ShareGPT, gpt-oss Harmony, Hermes/Qwen-tag, glaive-v2 or
xLAM datasets into Beam records.

    convert-dataset data/samples/openai.jsonl -o /tmp/beam.jsonl
    convert-dataset data/samples/*.json* --dataset_format auto -o /tmp/beam.parquet --rejects /tmp/rejects.jsonl \\
        --stats /tmp/stats.json
    convert-dataset big.jsonl -o /tmp/big_beam.jsonl --dataset_num_proc 8 --render-check sample
    beam-sft convert my/hub-dataset --dataset_train_split train -o /tmp/beam_ds     # a save_to_disk directory

Every input record is written or rejected (--rejects says why); the output appears when the run finishes. What
the summary counts, and exit status 3 (records rejected as internal_error, a bug to report): docs/formats.md. The
summary ends with the rejects by reason and what keeps each; a run that writes nothing, or rejects more than
--max_reject_share of its input, exits with status 2 after writing everything (docs/prepare.md#what-was-dropped).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

import orjson

from beam_sft.cli import add_command, committed, progress_bar, sources_besides
from beam_sft.dataset.examples import Counts
from beam_sft.dataset.reasoning_stats import REASONING_REJECTS, input_coverage, reasoning_counts
from beam_sft.errors import EXIT_INTERNAL_ERRORS, FatalError, Reason, RecordError, UsageError
from beam_sft.validate.rules import STRIPPED_PREFIX, Options, make_render_check

# Records per task: big enough that pickling and scheduling vanish next to conversion, small enough that
# the in-flight window (a few chunks per worker) stays a few MB.
CHUNK = 256
RENDER_CHECK_CHOICES = ("all", "sample", "none")
SAMPLE_HEAD, SAMPLE_EVERY = 1000, 100


def _joined(c: Counter, empty: str = "-") -> str:
    return ", ".join(f"{k} {v}" for k, v in c.most_common()) or empty


class Stats(Counts):
    """What a run did. Workers fill one per chunk; the main process adds them up in order."""

    def __init__(self) -> None:
        # In --stats' key order. formats: of accepted records; detected: what --dataset_format auto saw in each
        # parsed record; stripped_tool_prompt: foreign call syntax taken out of prompts, per pattern (toolmarkup).
        self.records_in = self.records_out = 0
        self.rejected, self.formats, self.detected, self.roles = Counter(), Counter(), Counter(), Counter()
        self.messages = self.assistant_turns = self.with_reasoning = self.tool_calls = self.parallel_call_turns = 0
        self.records_with_tools = 0
        self.efforts, self.policy, self.stripped_tool_prompt = Counter(), Counter(), Counter()
        # the assistant turns of the records rejected for want of reasoning (the input's coverage counts them),
        # and the key sets of the records no converter reads (beam_sft.dataset.drops)
        self.rejected_assistant_turns = self.rejected_without_reasoning = 0
        self.unknown_format_keys = Counter()

    def add_ok(self, rec: dict, fmt: str, counters: dict) -> None:
        self.records_in += 1
        self.records_out += 1
        self.formats[fmt] += 1
        msgs = rec["messages"]
        self.messages += len(msgs)
        roles = self.roles
        turns = reasoned = calls = parallel = 0
        for m in msgs:
            role = m["role"]
            roles[role] += 1
            if role == "assistant":
                turns += 1
                reasoned += bool(m["reasoning_content"])
                if tc := m.get("tool_calls"):
                    calls += len(tc)
                    parallel += len(tc) > 1
        self.assistant_turns += turns
        self.with_reasoning += reasoned
        self.tool_calls += calls
        self.parallel_call_turns += parallel
        self.records_with_tools += "tools" in rec
        kwargs = rec.get("chat_template_kwargs")
        if kwargs and "reasoning_effort" in kwargs:
            self.efforts[str(kwargs["reasoning_effort"])] += 1
        for key, n in counters.items():
            if key.startswith(STRIPPED_PREFIX):
                self.stripped_tool_prompt[key[len(STRIPPED_PREFIX):]] += n
            else:
                self.policy[key] += n

    def add_reject(self, code: str) -> None:
        self.records_in += 1
        self.rejected[code] += 1

    def add_rejected_turns(self, rec: dict) -> None:
        """A record rejected for want of reasoning, as `keep` converts it: its turns count in the coverage."""
        counts = reasoning_counts([rec])
        self.rejected_assistant_turns += counts["assistant_turns"]
        self.rejected_without_reasoning += counts["without_reasoning"]

    def drop_counts(self) -> dict[str, Any]:
        """The counts `beam_sft.dataset.drops` reads."""
        return {"records_in": self.records_in, "records_kept": self.records_out, "rejected": dict(self.rejected),
                "unknown_format_keys": dict(self.unknown_format_keys)}

    def take_back(self, payload: bytes, fmt: str) -> None:
        """Undo `add_ok` of a written record found to be a duplicate (its JSON line, as written), and count it
        as a `duplicate` reject. The conversion counters (policy, detected) stay: the conversion happened."""
        row = orjson.loads(payload)
        rec = {k: v for k, v in row.items() if k == "messages" or v}  # to_row's empty columns: absent in add_ok
        delta = Stats()
        delta.add_ok(rec, fmt, {})
        self.subtract(delta)
        self.add_reject(Reason.DUPLICATE.value)

    def to_dict(self) -> dict[str, Any]:
        d = {k: (dict(v.most_common()) if isinstance(v, Counter) else v) for k, v in vars(self).items()}
        d["rejected_total"] = sum(self.rejected.values())
        d["reasoning_coverage"] = round(self.with_reasoning / self.assistant_turns, 4) if self.assistant_turns else None
        turns = self.assistant_turns + self.rejected_assistant_turns
        with_reasoning = self.with_reasoning + self.rejected_assistant_turns - self.rejected_without_reasoning
        d["input_reasoning_coverage"] = round(with_reasoning / turns, 4) if turns else None
        return d

    def table(self) -> str:
        from beam_sft.dataset.drops import aligned_rows

        rej = sum(self.rejected.values())
        reasoning = {"assistant_turns": self.assistant_turns,
                     "without_reasoning": self.assistant_turns - self.with_reasoning,
                     "rejected_assistant_turns": self.rejected_assistant_turns,
                     "rejected_without_reasoning": self.rejected_without_reasoning}
        rows = [
            ("records in", self.records_in),
            ("records out", self.records_out),
            ("rejected", rej),
            *((f"  {code}", n) for code, n in self.rejected.most_common()),
            ("formats", _joined(self.formats)),
            ("messages", self.messages),
            ("roles", _joined(self.roles)),
            ("assistant turns", self.assistant_turns),
            ("reasoning coverage", input_coverage(reasoning)),
            ("tool calls", f"{self.tool_calls} ({self.parallel_call_turns} parallel-call turns)"),
            ("records with tools", self.records_with_tools),
            ("reasoning effort", _joined(self.efforts)),
            ("merged assistant msgs", self.policy["merged_assistant"]),
            ("content folded to reasoning", self.policy["folded_content"]),
            ("late system moved", self.policy["moved_system"]),
            ("kept without reasoning", self.policy["missing_reasoning"]),
            ("masked: no reasoning", self.policy["masked_missing_reasoning"]),
            ("masked: weight 0 in input", self.policy["masked_weight"]),
            ("tool prompt removed", _joined(self.stripped_tool_prompt)),
        ]
        return "\n".join(aligned_rows(rows))


# --- worker side ---------------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(fmt: str, late_system: str, missing_reasoning: str, render: str, chat_template: str | None,
                 tool_call_checks: str = "reject"):
    from dataclasses import replace

    plain = Options(late_system=late_system, missing_reasoning=missing_reasoning,
                    tool_call_checks=tool_call_checks)
    render_check = make_render_check(chat_template=chat_template) if render != "none" else None
    keep = replace(plain, missing_reasoning="keep")
    _WORKER.update(fmt=fmt, render_mode=render, opts=plain, opts_keep=keep,
                   opts_render=replace(plain, render_check=render_check))


def process_chunk(start: int, prov: list, chunk: list[tuple[Any, bool, tuple | None]]) -> tuple[list, list, Stats]:
    """Convert a chunk of (payload, raw, preset_error) → (prov, [(ok, json bytes | (code, index, message,
    keys), meta)], stats); `meta` of a written record: (its dedup key, the converter used), else None.
    `start`, the run-wide number of the chunk's first record, picks the render-check sample, the same with any
    --dataset_num_proc."""
    from beam_sft.records.dedup import record_key
    from beam_sft.records.files import parse_line
    from beam_sft.validate.convert import detect, to_row, try_convert

    fmt, plain, rendering, mode = _WORKER["fmt"], _WORKER["opts"], _WORKER["opts_render"], _WORKER["render_mode"]
    auto = fmt == "auto"
    stats = Stats()
    out: list[tuple[bool, Any]] = []
    for seq, (payload, raw, preset) in enumerate(chunk, start):
        if preset is not None:
            stats.add_reject(preset[0])
            out.append((False, preset, None))
            continue
        rec, name = payload, fmt
        if auto:  # detected here too, for the report of what each source held
            try:
                rec, raw = parse_line(payload) if raw else payload, False
            except RecordError as err:
                rec = err
            else:
                found = detect(rec)
                stats.detected[found or "unrecognized"] += 1
                name = found or "auto"
        counters: dict = {}
        render = mode == "all" or (mode == "sample" and (seq < SAMPLE_HEAD or seq % SAMPLE_EVERY == 0))
        result, used, err = try_convert(rec, name, rendering if render else plain, counters, raw=raw)
        if err is not None:
            stats.add_reject(err.code.value)
            if err.code.value in REASONING_REJECTS and (again := try_convert(rec, name, _WORKER["opts_keep"], {},
                                                                               raw=raw))[2] is None:
                stats.add_rejected_turns(again[0])
            out.append((False, (err.code.value, err.message_index, err.message, err.keys), None))
            continue
        # The on-disk row shape (README, "Beam records on disk"): all three keys on every row, so that
        # `load_dataset("json")` infers one schema and TRL can spread `chat_template_kwargs` with **.
        out.append((True, orjson.dumps(to_row(result), option=orjson.OPT_APPEND_NEWLINE),
                    (record_key(result), used)))
        stats.add_ok(result, used, counters)
    return prov, out, stats


# --- main side ------------------------------------------------------------------------------------------------


def _chunks(items, size: int):
    """Group items into chunks that never span two sources; yield (start, provenance list, work list)."""
    prov: list[tuple[str, int, bool]] = []
    work: list[tuple[Any, bool, tuple | None]] = []
    start = 0
    for item in items:
        if prov and (len(work) >= size or prov[-1][0] != item.source):
            yield start, prov, work
            start += len(work)
            prov, work = [], []
        prov.append((item.source, item.position, item.by_line))
        err = item.error
        preset = (err.code.value, err.message_index, err.message, None) if err else None
        work.append((item.payload, item.raw, preset))
    if work:
        yield start, prov, work


def _check_args(args: argparse.Namespace) -> str | None:
    """Usage errors of the command line; returns the text of --chat-template, if given."""
    if args.dataset_num_proc < 1:
        raise UsageError("--dataset_num_proc must be at least 1")
    if args.max_records is not None and args.max_records < 0:
        raise UsageError("--max_records must be >= 0")
    if not 0 <= args.max_reject_share <= 1:  # as DataSettings.check says it
        raise UsageError(f"--max_reject_share {args.max_reject_share}: a share of the input records, 0 to 1 (1.0 "
                         "accepts any share)")
    if args.max_record_bytes is not None and args.max_record_bytes < 1:
        raise UsageError("--max-record-bytes must be positive")
    if not args.chat_template:
        return None
    try:
        with open(args.chat_template, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise UsageError(f"--chat-template {args.chat_template}: {err.strerror}") from None


def run(args: argparse.Namespace) -> int:
    from beam_sft.dataset.drops import DroppedTooMuch, drop_lines, format_keys, verdict
    from beam_sft.dataset.pipeline import ordered_map
    from beam_sft.errors import reject_entry, where
    from beam_sft.records.dedup import Seen
    from beam_sft.records.files import JsonlSink, iter_items, open_writer, source_options
    from beam_sft.storage import write_json_atomic
    from beam_sft.validate.reasoning import keep_warning, majority_hint

    INTERNAL = Reason.INTERNAL_ERROR.value
    chat_template = _check_args(args)
    sources = sources_besides(args.inputs, args.output, split=args.dataset_train_split, options=source_options(args))
    writer = open_writer(args.output)
    rejects = JsonlSink(args.rejects) if args.rejects else None
    total = Stats()
    first_internal: list[str] = []  # where the first internal errors happened, for the warning
    per_source: dict[str, Counter] = {}
    init_args = (args.dataset_format, args.late_system, args.missing_reasoning, args.render_check, chat_template,
                 args.tool_call_checks)
    seen = Seen() if args.dedup else None  # first occurrences, in input order
    with progress_bar("converting", args.quiet) as bar, committed(writer, rejects):
        chunks = _chunks(iter_items(sources, max_bytes=args.max_record_bytes, limit=args.max_records), CHUNK)
        # the data pipeline's ordered pool: results in input order, a few chunks per worker in flight
        for prov, results, stats in ordered_map(process_chunk, chunks, args.dataset_num_proc,
                                                init=(_init_worker, init_args), ahead=4,
                                                start_method="forkserver" if sys.platform != "win32" else "spawn"):
            total.add(stats)
            per_source.setdefault(prov[0][0], Counter()).update(stats.detected)
            for (source, pos, by_line), (ok, payload, meta) in zip(prov, results, strict=True):
                if ok and seen is not None and (dup := seen.check(meta[0], source, pos, by_line)) is not None:
                    total.take_back(payload, meta[1])
                    ok, payload = False, (dup.code.value, None, dup.message, None)
                if ok:
                    writer.write_raw(payload)
                    continue
                code, index, message, keys = payload
                err = RecordError(code, message, message_index=index, keys=keys)
                entry = reject_entry(err, source, pos, by_line)
                if found := format_keys(entry):
                    total.unknown_format_keys[found] += 1
                if code == INTERNAL and len(first_internal) < 3:
                    first_internal.append(f"{where(source, pos, by_line)}: {message}")
                if rejects is not None:
                    rejects.write(entry)
            bar.update(len(results))
        rejected = sum(total.rejected.values())
        if total.records_in != total.records_out + rejected:
            raise FatalError(f"bookkeeping error: {total.records_in} in != {total.records_out} out + {rejected} "
                             "rejected")
    if args.dataset_format == "auto":
        _report_detection(per_source)
    print(f"convert-dataset: wrote {total.records_out} records to {args.output}", file=sys.stderr)
    print(total.table(), file=sys.stderr)
    # the keep warning and the majority-without-reasoning hint (docs/reasoning.md); a record rejected as
    # nothing_to_train had at least one turn, none with reasoning: counted as one
    untrained = total.rejected[Reason.NOTHING_TO_TRAIN.value]
    for note in (keep_warning(total.policy["missing_reasoning"]),
                 majority_hint(total.assistant_turns + untrained,
                               total.assistant_turns - total.with_reasoning + untrained)):
        if note:
            print(note, file=sys.stderr)
    print("\n".join(drop_lines(total.drop_counts(), args.rejects)), file=sys.stderr)
    if args.stats:
        write_json_atomic(args.stats, {"inputs": [s.name for s in sources], "output": args.output,
                                       "format": args.dataset_format, **total.to_dict()})
    n_internal = total.rejected[INTERNAL]
    if n_internal:
        print(f"warning: {n_internal} record(s) hit an unexpected error in the converter and were rejected as "
              f"{INTERNAL} (a bug in beam-sft; please report it). First: {'; '.join(first_internal)}. "
              f"Exit status {EXIT_INTERNAL_ERRORS}.", file=sys.stderr)
    # after the outputs and rejects are written: nothing is lost, but the run is not taken for a success
    if (line := verdict(total.drop_counts(), args.max_reject_share, [s.name for s in sources])) is not None:
        raise DroppedTooMuch(line, total.drop_counts())
    return EXIT_INTERNAL_ERRORS if n_internal else 0


def _report_detection(per_source: dict[str, Counter]) -> None:
    """What --dataset_format auto found: per source, or in total when there are many sources."""
    if len(per_source) <= 8:
        for source, found in per_source.items():
            print(f"auto: {source}: {_joined(found, 'no parsable records')}", file=sys.stderr)
        return
    total = sum(per_source.values(), Counter())
    odd = [s for s, found in per_source.items() if found.get("unrecognized")]
    print(f"auto: {len(per_source)} sources: {_joined(total, 'no parsable records')}", file=sys.stderr)
    if odd:
        print(f"auto: unrecognized records in {len(odd)} sources, e.g. {odd[0]}", file=sys.stderr)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from beam_sft.cli import add_source_arguments, boolean, data_option
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.validate import reasoning
    from beam_sft.validate.calls import TOOL_CALL_CHECKS_CHOICES, TOOL_CALL_CHECKS_HELP
    from beam_sft.validate.convert import FORMAT_NAMES
    from beam_sft.validate.rules import LATE_SYSTEM_CHOICES, MISSING_REASONING_CHOICES

    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="files (.jsonl, .json, .parquet, .txt), globs, directories, save_to_disk "
                             "dirs, or hub dataset ids")
    parser.add_argument("-o", "--output", required=True,
                        help="output: .jsonl, .parquet, or a directory (written with save_to_disk)")
    data_option(parser, "dataset_format", choices=FORMAT_NAMES, default="auto",
                help="input format; auto detects it per record and reports what it found (default: auto)")
    parser.add_argument("--rejects", metavar="PATH", help="write one JSON line per rejected record here")
    parser.add_argument("--stats", metavar="PATH", help="write the run's statistics here as JSON")
    data_option(parser, "dataset_num_proc", type=int, default=1, metavar="N",
                help="worker processes; output order is the same for any N (default: 1)")
    data_option(parser, "max_records", type=int, metavar="N", help="read at most N input records")
    data_option(parser, "dataset_train_split", default="train", metavar="NAME",
                help="split of a hub dataset or DatasetDict (default: train)")
    add_source_arguments(parser)
    parser.add_argument("--late-system", choices=LATE_SYSTEM_CHOICES, default="reject",
                        help="a system/developer message after other messages: reject the record, or move the "
                             "message up to the first instructions (default: reject)")
    data_option(parser, "missing_reasoning", choices=MISSING_REASONING_CHOICES, default=reasoning.DEFAULT,
                help=reasoning.HELP)
    data_option(parser, "tool_call_checks", choices=TOOL_CALL_CHECKS_CHOICES, default="reject",
                help=TOOL_CALL_CHECKS_HELP)
    data_option(parser, "dedup", type=boolean, nargs="?", const=True, default=True, metavar="BOOL",
                help="reject exact duplicates: a validated record equal to an earlier one (in any input, whatever "
                     "its format) is rejected as `duplicate`, the first kept; `--dedup false` writes them too "
                     "(default: true)")
    data_option(parser, "max_reject_share", type=float, default=DataSettings.max_reject_share, metavar="X",
                help="the share (0-1) of the input records the run may reject and still succeed: more, or nothing "
                     "written, exits with status 2 after writing the output and rejects; 1.0 accepts any share "
                     "(default: %(default)s)")
    parser.add_argument("--max-record-bytes", type=int, metavar="N",
                        help="reject records larger than N bytes of JSON (default: no limit)")
    parser.add_argument("--render-check", choices=RENDER_CHECK_CHOICES, default="all",
                        help="render accepted records with the Beam chat template and reject what fails: every "
                             "record, a sample (the first 1000 per run, then 1 in 100), or none. Validation "
                             "already rejects everything the template raises for, so this is a safety net; "
                             "rendering costs about 1 ms a record, far more than converting (default: all)")
    parser.add_argument("--chat-template", metavar="FILE",
                        help="Jinja chat template for the render check (default: the packaged Beam template)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def register(subparsers) -> None:
    add_arguments(add_command(subparsers, "convert", run, "convert OpenAI / ShareGPT / Harmony data to Beam records",
                              __doc__))


def main(argv: list[str] | None = None) -> int:
    """`convert-dataset`: the command under its own name."""
    from beam_sft.cli import ArgumentParser, parse_and_run

    parser = ArgumentParser(prog="convert-dataset", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parse_and_run(parser, "convert", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
