"""Measure OpenAI → Beam conversion speed against an orjson load+dump floor, on a synthetic JSONL file.

The floor is what any converter must pay: parse each line and serialize a record. The ratio printed is
floor time / conversion time (higher is better); the CLI figure also includes reading, writing and
statistics, with the render check off (it costs ~1 ms a record and is measured separately).

    python -m benchmarks convert                          # 50k records, ~1.5 KB of text per message
    python -m benchmarks convert --records 200000 --text-bytes 200 --cli
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson


def make_file(path: Path, n: int, text_bytes: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "tool", "reason", "answer", "value", "city", "number"]

    def text() -> str:
        out, size = [], 0
        while size < text_bytes:
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look something up.",
                                               "parameters": {"type": "object", "properties": {
                                                   "q": {"type": "string"}, "n": {"type": "integer"}},
                                                   "required": ["q"]}}}]
    with open(path, "wb") as f:
        for i in range(n):
            msgs = [{"role": "system", "content": text()}, {"role": "user", "content": text()}]
            if i % 2:
                msgs += [{"role": "assistant", "content": None, "reasoning_content": text(), "tool_calls": [
                             {"id": f"c{i}", "type": "function",
                              "function": {"name": "lookup", "arguments": orjson.dumps({"q": text()[:80], "n": i}).decode()}}]},
                         {"role": "tool", "tool_call_id": f"c{i}", "content": text()}]
            msgs += [{"role": "assistant", "content": text(), "reasoning_content": text()}]
            rec = {"messages": msgs, **({"tools": tools} if i % 2 else {})}
            f.write(orjson.dumps(rec) + b"\n")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--text-bytes", type=int, default=1500, help="approximate bytes of text per message")
    parser.add_argument("--cli", action="store_true", help="also time the convert-dataset command end to end")
    parser.add_argument("--json", help="write the figures here")
    return parser


def main(argv=None) -> None:
    args = make_parser().parse_args(argv)

    from beam_sft.validate.convert import convert_raw
    from beam_sft.validate.rules import validate

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        make_file(src, args.records, args.text_bytes)
        lines = src.read_bytes().splitlines()
        size_mb = src.stat().st_size / 1e6
        loads, dumps = orjson.loads, orjson.dumps
        t = time.perf_counter()
        for line in lines:
            dumps(loads(line))
        floor = time.perf_counter() - t
        t = time.perf_counter()
        for line in lines:
            dumps(validate(convert_raw(loads(line), "openai")[0]))
        conv = time.perf_counter() - t
        print(f"{len(lines)} records, {size_mb:.1f} MB")
        print(f"orjson load+dump floor: {floor:.2f} s ({size_mb / floor:.0f} MB/s)")
        print(f"convert_raw + validate: {conv:.2f} s ({size_mb / conv:.0f} MB/s), ratio {floor / conv:.0%}")
        if args.cli:
            out = Path(tmp) / "out.jsonl"
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "beam_sft.cli.convert", str(src), "-o", str(out), "--dataset_format",
                            "openai", "-q", "--render-check", "none"], check=True, capture_output=True)
            cli = time.perf_counter() - t
            print(f"convert-dataset (process start included): {cli:.2f} s, ratio {floor / cli:.0%}")
        figures = {"records": len(lines), "mb": round(size_mb, 2), "floor_s": round(floor, 3), "convert_s": round(conv, 3),
                   "convert_mb_s": round(size_mb / conv, 1), "ratio_to_floor": round(floor / conv, 3)}
        if args.cli:
            figures.update(cli_s=round(cli, 3), cli_ratio_to_floor=round(floor / cli, 3))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
