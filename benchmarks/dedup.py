"""The dedup table in bounded memory: `beam_sft.records.dedup.Seen` (two flat arrays) against the dict of
Python ints it replaced, at two sizes, in one run.

    python -m benchmarks dedup                              # 10^5 and 10^6 records
    python -m benchmarks dedup --records 100000 1000000 10000000

For each size: the bytes each table holds once every record is in (tracemalloc: what Python allocated for it),
bytes per record, and the CPU time of `check` per record (a first pass: every key is new; then a second pass
where every key is a duplicate). Keys are random 64-bit words, what BLAKE2b digests look like; hashing the
records is not timed here (`python -m benchmarks prepare` times the whole data phase).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class DictSeen:
    """The table before: a dict of key -> packed position (what `Seen` replaced), for comparison."""

    def __init__(self) -> None:
        self.first: dict[int, int] = {}

    def check(self, key: int, source: str, position: int, by_line: bool = True):
        if key in self.first:
            return True
        self.first[key] = (int(by_line) << 40) | position
        return None


def _measure(make, keys: list[int]) -> dict:
    tracemalloc.start()  # memory on one build, time on another: tracemalloc slows every allocation
    table = make()
    for position, key in enumerate(keys):
        table.check(key, "bench.jsonl", position)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del table
    table = make()
    start = time.process_time()
    for position, key in enumerate(keys):
        table.check(key, "bench.jsonl", position)
    first_pass = time.process_time() - start
    start = time.process_time()
    duplicates = sum(1 for position, key in enumerate(keys) if table.check(key, "bench.jsonl", position) is not None)
    second_pass = time.process_time() - start
    assert duplicates == len(keys), "every key of the second pass is a duplicate"
    return {"bytes": held, "bytes_per_record": round(held / len(keys), 1),
            "first_pass_us_per_record": round(1e6 * first_pass / len(keys), 3),
            "duplicate_pass_us_per_record": round(1e6 * second_pass / len(keys), 3)}


def bench(records: list[int], seed: int = 0) -> dict:
    from beam_sft.records.dedup import Seen

    rows = []
    for n in records:
        rng = random.Random(seed)
        keys = [rng.getrandbits(64) for _ in range(n)]
        arrays, dicts = _measure(Seen, keys), _measure(DictSeen, keys)
        rows.append({"records": n, "arrays": arrays, "dict": dicts,
                     "memory_ratio": round(arrays["bytes"] / dicts["bytes"], 3),
                     "time_ratio": round(arrays["first_pass_us_per_record"] / dicts["first_pass_us_per_record"], 3)})
        print(f"{n:>10,} records: arrays {arrays['bytes'] / 2**20:8.1f} MiB ({arrays['bytes_per_record']} B/rec, "
              f"{arrays['first_pass_us_per_record']} us/rec) | dict {dicts['bytes'] / 2**20:8.1f} MiB "
              f"({dicts['bytes_per_record']} B/rec, {dicts['first_pass_us_per_record']} us/rec)", file=sys.stderr)
    return {"sizes": rows}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks dedup", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="table sizes (default: 100000 1000000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    figures = bench(args.records, args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
