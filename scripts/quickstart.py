"""The main job, end to end on a fresh machine: convert -> train -> save -> generate -> parse.

1. converts the bundled samples (data/samples: OpenAI, ShareGPT and Harmony files, each with a few bad
   records) with `convert-dataset`, writing the Beam records, the rejects and the statistics;
2. trains the embedded tiny random model (configs/models/tiny) with the bundled tokenizer on them, as
   configured in configs/quickstart.yaml (CPU, assistant-only loss, unpacked);
3. saves the model and the tokenizer, with the chat template and the response template;
4. evaluates the trained model on the first turn of some training records with `beam_sft.eval.run.evaluate` (what
   `beam-sft eval` runs): greedy generation stopping at `<|return|>` or `<|call|>`, `tokenizer.parse_response`,
   the parsed turns, the metrics table, and the share of well-formed Beam turns (thinking plus content or
   tool calls).

```bash
python scripts/quickstart.py                      # everything, into outputs/quickstart/
python scripts/quickstart.py --skip-train         # only step 4, on the model trained before
python scripts/quickstart.py --min-well-formed 0.9   # exit 1 below 90% well-formed
```
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

SAMPLES = ("openai.jsonl", "sharegpt.json", "harmony.jsonl")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickstart.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Steps: convert data/samples -> train configs/quickstart.yaml -> save -> generate + parse_response.",
    )
    parser.add_argument("--output-dir", default=str(REPO / "outputs" / "quickstart"),
                        help="where data/, model/ and generations.jsonl go (default: outputs/quickstart)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"),
                        help="training config (default: configs/quickstart.yaml)")
    parser.add_argument("--num-prompts", type=int, default=24,
                        help="training records to prompt with, spread evenly over the data (default: 24)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation bound (default: 256)")
    parser.add_argument("--skip-train", action="store_true", help="reuse the model already in OUTPUT_DIR/model")
    parser.add_argument("--min-well-formed", type=float, default=None, metavar="FRACTION",
                        help="exit with status 1 when fewer outputs than this parse well-formed")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="anything after this goes to scripts/train.py as overrides, e.g. --num_train_epochs 2")
    return parser


def convert(data_dir: Path) -> Path:
    from beam_sft.cli.convert import main as convert_main
    from beam_sft.errors import reject_where

    data_dir.mkdir(parents=True, exist_ok=True)
    out = data_dir / "train.jsonl"
    argv = [*(str(REPO / "data" / "samples" / name) for name in SAMPLES), "-o", str(out),
            "--rejects", str(data_dir / "rejects.jsonl"), "--stats", str(data_dir / "stats.json")]
    print(f"== 1. convert-dataset {' '.join(argv)}", flush=True)
    status = convert_main(argv)
    if status != 0:
        raise SystemExit(f"convert-dataset failed with status {status}")
    rejects = [json.loads(line) for line in (data_dir / "rejects.jsonl").read_text().splitlines() if line]
    print(f"   {len(rejects)} rejected records (see {data_dir / 'rejects.jsonl'}):")
    for reject in rejects:  # a JSONL line as name:LINE, a JSON array's record as name[INDEX]
        where = reject_where({**reject, "source": Path(reject["source"]).name})
        print(f"   - {where} [{reject['reason']}] {reject['message'][:90]}")
    return out


def train(config: str, dataset: Path, model_dir: Path, extra: list[str]) -> None:
    import train as train_script

    argv = ["--config", config, "--dataset_name", str(dataset), "--dataset_format", "beam",
            "--output_dir", str(model_dir), *extra]
    print(f"== 2. scripts/train.py {' '.join(argv)}", flush=True)
    args = train_script.make_parser().parse_args_and_config(args=argv)
    train_script.main(*args)


def pick(records: list[dict], n: int) -> list[dict]:
    """`n` records spread evenly over the file (it holds the three source formats one after another)."""
    if n >= len(records):
        return records
    step = len(records) / n
    return [records[int(i * step)] for i in range(n)]


def describe(parsed: dict | None) -> str:
    if not parsed:
        return "(nothing parsed)"
    parts = [f"thinking={parsed.get('thinking', '')[:60]!r}"]
    if parsed.get("tool_calls"):
        calls = [f"{c['function']['name']}({json.dumps(c['function']['arguments'], ensure_ascii=False)[:50]})"
                 for c in parsed["tool_calls"]]
        parts.append("tool_calls=" + ", ".join(calls))
    if parsed.get("content"):
        parts.append(f"content={parsed['content'][:60]!r}")
    return " ".join(parts)


def generate(model_dir: Path, out_dir: Path, num_prompts: int, max_new_tokens: int) -> float:
    from beam_sft.eval.backends import TransformersBackend
    from beam_sft.eval.report import summary_table
    from beam_sft.eval.run import EvalOptions, evaluate, load_model
    from beam_sft.eval.turns import read_held_out

    print(f"== 3. load {model_dir} (model + tokenizer with both templates)", flush=True)
    model, tokenizer = load_model(str(model_dir), device="cpu")
    # The training records, read from the samples step 1 converted (same converters, same order, same
    # rejects), so each keeps its source format for the per-format figures.
    loaded = read_held_out([str(REPO / "data" / "samples" / name) for name in SAMPLES])
    chosen = pick([(record, fmt) for record, _, fmt in loaded if record is not None], num_prompts)
    print(f"== 4. beam_sft.eval.run.evaluate on the first turn of {len(chosen)} training records (greedy, stop at "
          f"<|return|>/<|call|>, max_new_tokens={max_new_tokens}, parse_response)", flush=True)
    results: list = []
    backend = TransformersBackend(model, tokenizer, max_new_tokens=max_new_tokens)
    result = evaluate(backend, tokenizer, chosen, EvalOptions(on_result=results.append, total=len(chosen)))
    results.sort(key=lambda r: r.turn.record)
    with open(out_dir / "generations.jsonl", "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps({"generated": r.generation.text, "parsed": r.parsed, "format": r.turn.format,
                                "metrics": r.metrics, "reason": r.reason}, ensure_ascii=False))
            f.write("\n")
    for r in results:
        ok = r.metrics["well_formed"]
        reason = "" if ok else f"  <- {r.reason}"
        print(f"   [{'ok ' if ok else 'BAD'}] #{r.turn.record:02d} {r.turn.format:8s} {describe(r.parsed)}{reason}")
    print(summary_table(result))
    good, total = result.overall.hits["well_formed"], result.overall.turns
    fraction = good / total if total else 0.0
    print(f"well-formed Beam turns: {good}/{total} = {100 * fraction:.1f}% "
          f"(generations in {out_dir / 'generations.jsonl'})")
    return fraction


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out_dir = Path(args.output_dir)
    model_dir = out_dir / "model"
    start = time.monotonic()
    dataset = out_dir / "data" / "train.jsonl"
    if not args.skip_train:
        dataset = convert(out_dir / "data")
        train(args.config, dataset, model_dir, args.train_args)
    elif not (model_dir / "config.json").is_file():
        raise SystemExit(f"--skip-train: no trained model in {model_dir}")
    fraction = generate(model_dir, out_dir, args.num_prompts, args.max_new_tokens)
    print(f"quickstart done in {time.monotonic() - start:.0f} s")
    if args.min_well_formed is not None and fraction < args.min_well_formed:
        print(f"below --min-well-formed {args.min_well_formed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
