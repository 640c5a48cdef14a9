"""Build `data/real/`: real third-party tool-calling records for `make demo-real`, split so that the held-out
records *and their tools* are never trained, the training half's missing reasoning filled in by a real teacher.

Sources (copied unchanged in tests/data/realdata/, licenses in its SOURCES.md): LLaMA-Factory's glaive tool-call
demo (100 ShareGPT records, no reasoning), LLaMA-Factory's reason-tool-use demo (50 OpenAI records with real
reasoning), Hammer's ToolAlpaca and API-Bank samples (xLAM-like), data-genie's Hermes samples.

1. **convert**: every source through the one per-record conversion (`--missing_reasoning keep`, so turns
   without reasoning survive until the teacher fills them); rejects counted.
2. **split by tool**: records that declare a common tool name are joined (union-find over names); whole
   groups go to the held-out side, seeded, until it has `--heldout` records, so no held-out tool name is
   declared by any training record (checked). Tool-less records always train.
3. **back-fill** (`--teacher DIR`): `beam-sft backfill` with a local transformers teacher on the training
   half; filled turns carry `reasoning_source`, filtered ones stay without reasoning (masked in training).
   The first `--limit` training records are filled whole; the others (glaive's) are cut after their first
   assistant turn that calls a tool, or their first turn when none does (`--rest first-call`, what data/real/
   holds): their later turns would cost the teacher ~3 calls each and, unfilled, are masked anyway, while the
   first turn — call the tool or answer — is what held-out evaluation measures. `--rest first-turn` cuts after
   the first turn even when it only asks for a missing argument, which trains the ask without the call that
   follows the user's reply (both measured: docs/real-model.md). `--first-turns M` bounds how many records
   (the teacher's time), the others are left out of train.jsonl; `--rest skip` leaves them all out.

```bash
python scripts/build_base_model.py smollm2 -o outputs/base/smollm2
python scripts/build_real_data.py --teacher outputs/base/smollm2        # writes data/real/
python scripts/build_real_data.py --split-only                          # steps 1-2 only (no teacher)
```

Outputs: `data/real/heldout.jsonl` (Beam records, reference turns as the sources wrote them),
`data/real/train.raw.jsonl` (training half before back-fill), `data/real/train.jsonl` (after),
`data/real/split.json` (sources, counts, the held-out tool names, the back-fill command and its stats).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REAL = REPO / "tests" / "data" / "realdata"
SOURCES = (
    "sharegpt/llamafactory_glaive_toolcall_en_demo.json",
    "openai/llamafactory_v1_reason_tool_use_demo_50.jsonl",
    "xlam_like/Hammer__test_original_toolalpaca.first10.json",
    "xlam_like/Hammer__test_original_apibank_l1.first8.json",
    "hermes/data-genie__sharegpt_example.json",
    "hermes/data-genie__sharegpt_new_format.json",
    "hermes/data-genie__weather_api_example.json",
)
# Training-only: Azure's stock-price fine-tuning sample, 96 records on two tools whose system prompt says not to
# guess arguments; 55 of its replies ask for the ticker or say the tools can't answer. It teaches what the held-out
# eval found missing (the model called on all 9 records whose reference asks or declines). Appended after the
# split, so the held-out records stay the same; its tools are checked against the held-out ones.
TRAIN_ONLY = ("openai/azure_stock_train_hallucination.jsonl",)
OUT = REPO / "data" / "real"


def tool_names(record: dict) -> set[str]:
    return {t.get("function", t).get("name") for t in record.get("tools") or []}


def convert_sources(sources: tuple[str, ...] = SOURCES) -> tuple[list[dict], dict]:
    """(records with `source` provenance, counts per source: read, converted, rejected by reason)."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    options = Options(missing_reasoning="keep")
    records, counts = [], {}
    for rel in sources:
        tally = counts.setdefault(rel, {"read": 0, "converted": 0, "rejected": {}})
        for item in read_items([str(REAL / rel)]):
            tally["read"] += 1
            record, _fmt, error = convert_item(item, "auto", options)
            if record is None:
                reason = str(error.get("reason", "error"))
                tally["rejected"][reason] = tally["rejected"].get(reason, 0) + 1
                continue
            tally["converted"] += 1
            records.append({**record, "source": f"{rel}#{tally['read'] - 1}"})
    return records, counts


def split(records: list[dict], heldout: int, seed: int) -> tuple[list[dict], list[dict], list[str]]:
    """(train, held-out, held-out tool names): whole tool-sharing groups held out, tool-less records trained."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for record in records:
        names = sorted(tool_names(record))
        for name in names[1:]:
            parent[find(name)] = find(names[0])
    groups: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        names = tool_names(record)
        if names:
            groups.setdefault(find(next(iter(names))), []).append(i)
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    held: set[int] = set()
    for root in order:
        members = groups[root]
        if len(held) >= heldout:
            break
        if len(members) <= 3:  # big groups (glaive's shared tools) teach the most; small ones test unseen tools
            held.update(members)
    train = [r for i, r in enumerate(records) if i not in held]
    # Records that already reason everywhere first (back-fill passes them through), then the small sources, then
    # glaive's: `--limit` bounds the teacher's work from the end of this order.
    train.sort(key=lambda r: (not all(m.get("reasoning_content") for m in r["messages"] if m["role"] == "assistant"),
                              r["source"].startswith("sharegpt/")))
    test = [r for i, r in enumerate(records) if i in held]
    held_tools = sorted(set().union(*(tool_names(r) for r in test)))
    overlap = set(held_tools) & set().union(*(tool_names(r) for r in train))
    assert not overlap, f"held-out tools also declared in training records: {sorted(overlap)}"
    return train, test, held_tools


def first_turn(record: dict, *, through_call: bool = False) -> dict:
    """`record` up to and including its first assistant message, or with `through_call` its first assistant
    message that calls a tool (the first assistant message when none does)."""
    messages = record["messages"]
    turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    calls = [k for k in turns if messages[k].get("tool_calls")] if through_call else []
    end = (calls or turns or [len(messages) - 1])[0]
    return {**record, "messages": messages[: end + 1]}


def write_jsonl(path: Path, records: list[dict]) -> None:
    from beam_sft.storage import atomic_output

    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def backfill(teacher: str, extra: list[str], name: str = "train") -> list[str]:
    """`beam-sft backfill` of `{name}.raw.jsonl` into `{name}.jsonl`, run from the repository root with relative
    paths, so the command recorded in split.json rebuilds the file anywhere."""
    rel = lambda p: str(Path(p).resolve().relative_to(REPO)) if Path(p).resolve().is_relative_to(REPO) else str(p)
    stats = f"backfill_stats{name.removeprefix('train')}.json"  # train -> backfill_stats.json, train.extra -> .extra
    cmd = [sys.executable, "-m", "beam_sft", "backfill", rel(OUT / f"{name}.raw.jsonl"), "-o", rel(OUT / f"{name}.jsonl"),
           "--dataset_format", "beam", "--backend", "transformers", "--model", rel(teacher),
           "--stats", rel(OUT / stats), "--cache", "outputs/real-backfill-cache.jsonl", *extra]
    subprocess.run(cmd, check=True, cwd=REPO)
    return ["beam-sft", *cmd[3:]]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="a local teacher model directory (transformers backend)")
    parser.add_argument("--split-only", action="store_true", help="convert and split; no back-fill")
    parser.add_argument("--part", choices=("all", "split", "extra"), default="all",
                        help="what to (re)build: everything (default), only the split sources (train.jsonl), or "
                             "only the training-only sources (train.extra.jsonl), keeping the other part as it is")
    parser.add_argument("--heldout", type=int, default=24, help="held-out records to aim for (default: 24)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=58,
                        help="back-fill the first N training records whole (default: 58, all but glaive and its first 5; the teacher "
                             "on 2 CPU cores fills ~5-12 s a turn); see --rest for the others")
    parser.add_argument("--rest", choices=("first-call", "first-turn", "skip"), default="first-call",
                        help="the training records after --limit: cut after their first assistant turn that "
                             "calls a tool, the first turn when none does (first-call, default), or after their "
                             "first assistant turn (first-turn), and filled; or left out (skip)")
    parser.add_argument("--first-turns", type=int, default=None, metavar="M",
                        help="with --rest first-call or first-turn: fill only the first M records after --limit (default: all)")
    parser.add_argument("backfill_args", nargs=argparse.REMAINDER, help="after --: more beam-sft backfill options")
    return parser


def build_split(args: argparse.Namespace, info: dict) -> list[str]:
    """Steps 1-3 for the split sources; returns the held-out tool names."""
    records, counts = convert_sources()
    train, test, held_tools = split(records, args.heldout, args.seed)
    write_jsonl(OUT / "heldout.jsonl", test)
    if args.rest != "skip":
        through_call = args.rest == "first-call"
        train = train[: args.limit] + [first_turn(r, through_call=through_call) for r in train[args.limit:]]
    write_jsonl(OUT / "train.raw.jsonl", train)
    info.update({"sources": counts, "records": len(records), "train": len(train), "heldout": len(test),
                 "heldout_tools": held_tools, "seed": args.seed,
                 "limit": args.limit, "rest": args.rest, "first_turns": args.first_turns})
    if not args.split_only:
        bound = args.limit if args.rest == "skip" else None if args.first_turns is None else args.limit + args.first_turns
        limit = [] if bound is None else ["--max_records", str(bound)]
        extra = [*limit, *(a for a in args.backfill_args if a != "--")]
        info["backfill_command"] = " ".join(backfill(args.teacher, extra))
        info["backfill_stats"] = json.loads((OUT / "backfill_stats.json").read_text())
    print(f"{len(records)} records: {len(train)} train, {len(test)} held out ({len(held_tools)} tools never "
          f"trained) -> {OUT}", file=sys.stderr)
    return held_tools


def build_extra(args: argparse.Namespace, info: dict, held_tools: list[str]) -> None:
    """The training-only sources, whole (single-turn), converted and back-filled into train.extra.jsonl."""
    records, counts = convert_sources(TRAIN_ONLY)
    overlap = set(held_tools) & set().union(*(tool_names(r) for r in records))
    assert not overlap, f"held-out tools also declared in training-only records: {sorted(overlap)}"
    write_jsonl(OUT / "train.extra.raw.jsonl", records)
    extra = {"sources": counts, "records": len(records)}
    if not args.split_only:
        extra["backfill_command"] = " ".join(backfill(args.teacher, [a for a in args.backfill_args if a != "--"],
                                                      "train.extra"))
        extra["backfill_stats"] = json.loads((OUT / "backfill_stats.extra.json").read_text())
    info["extra"] = extra
    print(f"{len(records)} training-only records -> {OUT / 'train.extra.raw.jsonl'}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not args.split_only and not args.teacher:
        parser.error("--teacher DIR is required unless --split-only")
    OUT.mkdir(parents=True, exist_ok=True)
    split_json = OUT / "split.json"
    # --part keeps what the other part recorded: its teacher's work is not redone
    info = json.loads(split_json.read_text()) if args.part != "all" and split_json.is_file() else {}
    if args.part in ("all", "split"):
        held_tools = build_split(args, info)
    else:
        held_tools = info.get("heldout_tools") or parser.error("--part extra needs the split's data/real/split.json")
    if args.part in ("all", "extra"):
        build_extra(args, info, held_tools)
    from beam_sft.storage import write_json_atomic

    write_json_atomic(str(split_json), info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
