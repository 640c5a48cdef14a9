"""Marker-row init, side by side: beamify's `mean` (every new row the mean of the old ones) against `semantic`
(each row from what its marker means), on the real SmolLM2-135M-Instruct, same data, same seed, same steps.

For each init: beamify the base, fully fine-tune it on the bundled samples (configs/demo_real.yaml's
optimisation), saving a checkpoint every `--save-steps`; then for step 0 (the beamified base) and every
checkpoint, on held-out records the training never saw (`scripts/make_samples.py --seed 777`, first-turn
prompts absent from the training file):

* **marker loss**: mean cross-entropy of the marker tokens inside the assistant turns (teacher-forced);
* **well-formed**: `beam-sft eval`'s share of well-formed first turns (greedy, stop at <|return|> / <|call|>).

```bash
python -m benchmarks marker-init --json outputs/bench-marker-init.json          # 2 epochs, both inits
python -m benchmarks marker-init --epochs 1 --save-steps 12   # docs/real-model.md's table, ~28 min
```
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def heldout_records(work: Path, train_file: Path, n: int) -> Path:
    """`n` generated records (seed 777) whose first user prompt is not in the training file."""
    import subprocess

    from beam_sft.cli.convert import main as convert_main

    subprocess.run([sys.executable, str(REPO / "scripts" / "make_samples.py"), "--out", str(work / "samples777"),
                    "--seed", "777"], check=True, capture_output=True)
    convert_main([str(work / "samples777" / "openai.jsonl"), "-o", str(work / "held.all.jsonl"), "-q"])
    seen = {json.dumps(_first_user(json.loads(line))) for line in train_file.read_text().splitlines()}
    kept = [line for line in (work / "held.all.jsonl").read_text().splitlines()
            if json.dumps(_first_user(json.loads(line))) not in seen][:n]
    out = work / "heldout.jsonl"
    out.write_text("\n".join(kept) + "\n")
    return out


def _first_user(record: dict) -> str | None:
    return next((m.get("content") for m in record["messages"] if m["role"] == "user"), None)


def marker_loss(model_dir: Path, records: Path) -> float:
    """Mean loss of the marker tokens the assistant turns train (teacher-forced)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.records.messages import HARMONY_MARKERS

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    markers = torch.tensor([tokenizer.convert_tokens_to_ids(m) for m in HARMONY_MARKERS])
    total, count = 0.0, 0
    for line in records.read_text().splitlines():
        record = json.loads(line)
        enc = tokenizer.apply_chat_template(record["messages"], tools=record.get("tools"), return_dict=True,
                                            return_assistant_tokens_mask=True,
                                            **record.get("chat_template_kwargs", {}))
        ids = torch.tensor(enc["input_ids"])
        with torch.no_grad():
            logp = model(input_ids=ids[None]).logits[0, :-1].log_softmax(-1)
        target, mask = ids[1:], torch.tensor(enc["assistant_masks"][1:]).bool()
        pick = mask & torch.isin(target, markers)
        total += -logp[pick.nonzero()[:, 0], target[pick]].sum().item()
        count += int(pick.sum())
    return total / count if count else math.nan


def well_formed(model_dir: Path, records: Path, out: Path) -> dict:
    from beam_sft.cli.eval import main as eval_main

    eval_main([str(model_dir), "--data", str(records), "--dataset_format", "beam", "--batch-size", "6",
               "--max-new-tokens", "200", "--json", str(out), "--quiet"])
    figures = json.loads(out.read_text())  # beam-sft eval --json: the overall figures at the top level
    return {k: figures[k] for k in ("well_formed", "stopped", "has_reasoning", "marker_leak")}


def run_init(init: str, base: Path, train_file: Path, held: Path, work: Path, args) -> list[dict]:
    import train as train_script

    from beam_sft.model.beamify import beamify_directory

    beam = work / f"beam-{init}"
    beamify_directory(str(base), beam, init=init)
    out = work / f"run-{init}"
    argv = ["--config", str(REPO / "configs" / "demo_real.yaml"), "--model_name_or_path", str(beam),
            "--dataset_name", str(train_file), "--output_dir", str(out), "--num_train_epochs", str(args.epochs),
            "--save_strategy", "steps", "--save_steps", str(args.save_steps), "--save_only_model", "true",
            "--disable_tqdm", "true", "--prepared_cache_dir", str(work / "prepared")]
    start = time.process_time()
    train_script.main(*train_script.make_parser().parse_args_and_config(args=argv))
    cpu = time.process_time() - start
    points = [(0, beam)] + sorted((int(p.name.split("-")[1]), p) for p in out.glob("checkpoint-*"))
    rows = []
    for step, model_dir in points:
        row = {"init": init, "step": step, "marker_loss": marker_loss(model_dir, held),
               **well_formed(model_dir, held, work / f"eval-{init}-{step}.json"), "train_cpu_s": round(cpu)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks marker-init", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inits", nargs="+", default=["mean", "semantic"], choices=["mean", "semantic"])
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--save-steps", type=int, default=18)
    parser.add_argument("--heldout", type=int, default=12, help="held-out records (default: 12)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the rows here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from build_base_model import cached_build

    torch.set_num_threads(args.threads)
    base = cached_build("smollm2")
    with tempfile.TemporaryDirectory(prefix="bench-marker-init-") as tmp:
        work = Path(tmp)
        from beam_sft.cli.convert import main as convert_main

        train_file = work / "train.jsonl"
        convert_main([*(str(REPO / "data" / "samples" / n) for n in ("openai.jsonl", "sharegpt.json", "harmony.jsonl")),
                      "-o", str(train_file), "-q"])
        held = heldout_records(work, train_file, args.heldout)
        rows = [row for init in args.inits for row in run_init(init, base, train_file, held, work, args)]
    print(f"{'init':<9} {'step':>4} {'marker loss':>11} {'well-formed':>11} {'stopped':>8} {'leak':>6}")
    for r in rows:
        print(f"{r['init']:<9} {r['step']:>4} {r['marker_loss']:>11.3f} {r['well_formed']:>11.1%} "
              f"{r['stopped']:>8.1%} {r['marker_leak']:>6.1%}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
