"""Does a fine-tune keep its reasoning when half the data has none? `mask` (the default) against `keep`.

The experiment of docs/reasoning.md, as a new user would run it:

1. convert the bundled samples (data/samples: OpenAI, ShareGPT, Harmony) with `convert-dataset`;
2. remove the reasoning from every assistant turn of every second record (the "without" half; the others are
   the "with" half) and write the mix as Beam records;
3. for each `--missing-reasoning` policy, train the quickstart config (configs/quickstart.yaml: the tiny
   model, 12 epochs) on the mix with `scripts/train.py --missing_reasoning POLICY`;
4. generate the first turn of `--num-prompts` records of each half with `beam_sft.eval.run.evaluate` (what
   `beam-sft eval` runs) and report, per half: has_reasoning, empty_analysis, mean analysis tokens,
   well_formed. `full` trains on the samples as converted (no reasoning removed): the reference.

```bash
python -m benchmarks reasoning                          # mask and keep, 40 prompts per half
python -m benchmarks reasoning --policies full mask keep --json /tmp/reasoning.json
python -m benchmarks reasoning --skip-train             # only evaluate the models trained before
```
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = ("openai.jsonl", "sharegpt.json", "harmony.jsonl")
POLICIES = ("full", "mask", "keep", "reject")
HALVES = ("with", "without")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks reasoning", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Steps: convert data/samples -> strip reasoning from every second "
                                            "record -> train per policy -> evaluate the first turns of each half.")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=["mask", "keep"],
                        help="what to train: a --missing-reasoning policy on the mix, or 'full' (the samples "
                             "with all their reasoning) (default: mask keep)")
    parser.add_argument("--output-dir", default=str(REPO / "outputs" / "bench_reasoning"),
                        help="data/ and one model directory per policy (default: outputs/bench_reasoning)")
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"),
                        help="training config (default: configs/quickstart.yaml)")
    parser.add_argument("--num-prompts", type=int, default=40, help="records per half to prompt (default: 40)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation bound (default: 256)")
    parser.add_argument("--skip-train", action="store_true", help="evaluate the models already in OUTPUT_DIR")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here as JSON")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="anything after this goes to scripts/train.py, e.g. --num_train_epochs 2")
    return parser


def make_data(data_dir: Path) -> tuple[Path, Path, list[dict]]:
    """The converted samples (full.jsonl) and the mix (mixed.jsonl); returns them and the mixed records."""
    from beam_sft.cli.convert import main as convert_main

    data_dir.mkdir(parents=True, exist_ok=True)
    full = data_dir / "full.jsonl"
    if convert_main([*(str(REPO / "data" / "samples" / name) for name in SAMPLES), "-o", str(full), "-q"]) != 0:
        raise SystemExit("convert-dataset failed")
    records = [json.loads(line) for line in full.read_text(encoding="utf-8").splitlines() if line]
    for k, record in enumerate(records):
        if k % 2:
            for message in record["messages"]:
                if message["role"] == "assistant":
                    message["reasoning_content"] = ""
    mixed = data_dir / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return full, mixed, records


def train(policy: str, dataset: Path, model_dir: Path, config: str, extra: list[str]) -> dict:
    """scripts/train.py in its own process (one clean training per policy); returns its data counts."""
    argv = [sys.executable, str(REPO / "scripts" / "train.py"), "--config", config, "--dataset_name", str(dataset),
            "--dataset_format", "beam", "--output_dir", str(model_dir), "--report_to", "none",
            "--missing_reasoning", "keep" if policy == "full" else policy, *extra]
    print(f"== train [{policy}]: {' '.join(argv[1:])}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    subprocess.run(argv, check=True, env=env)
    return {"train_seconds": round(time.monotonic() - start, 1), **data_counts(model_dir)}


def data_counts(model_dir: Path) -> dict:
    """Records trained and rejected, from the data_stats.json scripts/train.py writes."""
    stats_file = model_dir / "data_stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
    return {"records_trained": stats.get("train", {}).get("records_kept"),
            "rejected": stats.get("data", {}).get("rejected")}


def pick(items: list, n: int) -> list:
    if n >= len(items):
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def evaluate(model_dir: Path, records: list[dict], num_prompts: int, max_new_tokens: int) -> dict:
    """has_reasoning & co. on the first turns of `num_prompts` records of each half."""
    from beam_sft.eval.backends import TransformersBackend
    from beam_sft.eval.run import EvalOptions, load_model
    from beam_sft.eval.run import evaluate as run_eval

    model, tokenizer = load_model(str(model_dir), device="cpu")
    chosen = [(r, half) for half in HALVES
              for r in pick([r for k, r in enumerate(records) if (k % 2) == HALVES.index(half)], num_prompts)]
    backend = TransformersBackend(model, tokenizer, max_new_tokens=max_new_tokens)
    result = run_eval(backend, tokenizer, chosen, EvalOptions(total=len(chosen)))
    by_half = result.summary()["by_format"]
    return {half: {key: by_half[half][key] for key in ("turns", "has_reasoning", "empty_analysis",
                                                        "mean_analysis_tokens", "well_formed")}
            for half in HALVES}


def table(rows: list[dict]) -> str:
    head = ["policy", "half", "records trained", "has_reasoning", "empty_analysis", "mean analysis tokens",
            "well_formed"]
    lines = [head]
    for row in rows:
        for half in HALVES:
            fig = row["eval"][half]
            lines.append([row["policy"], f"{half} reasoning ({fig['turns']} prompts)", str(row["records_trained"]),
                          f"{100 * fig['has_reasoning']:.1f}%", f"{100 * fig['empty_analysis']:.1f}%",
                          f"{fig['mean_analysis_tokens']:.1f}", f"{100 * fig['well_formed']:.1f}%"])
    widths = [max(len(line[k]) for line in lines) for k in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(REPO))
    out = Path(args.output_dir)
    full, mixed, records = make_data(out / "data")
    rows = []
    for policy in args.policies:
        model_dir = out / policy / "model"
        info = {"policy": policy, "records_trained": None}
        if not args.skip_train:
            info.update(train(policy, full if policy == "full" else mixed, model_dir, args.config, args.train_args))
        else:
            info.update(data_counts(model_dir))
        print(f"== evaluate [{policy}] {model_dir}", flush=True)
        info["eval"] = evaluate(model_dir, records, args.num_prompts, args.max_new_tokens)
        rows.append(info)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
