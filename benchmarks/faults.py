"""Faults injected into real training runs and resumed with `--resume_from_checkpoint last`: what each costs.

    python -m benchmarks faults                               # 2 injections per kind (1 per rank death), 8 steps
    python -m benchmarks faults --injections 3 --kinds sigkill sigterm --seed 1
    python -m benchmarks faults --kinds rank-death-ddp rank-death-fsdp2 --rank-injections 2

The tiny model on the OpenAI samples, one process, the setup of tests/test_faults.py (a global batch of 4,
checkpoints every 2 steps, save_total_limit 1), driven by tests/fault_driver.py, whose hooks pause a run at a
chosen step end or inside a chosen save so that the fault lands exactly there. First an uninterrupted run (the
reference losses), then per kind, each injection its own output_dir, a run with the fault followed by
`--resume_from_checkpoint last` runs until one finishes (exit 0):

* `sigkill`: SIGKILL at a seeded random point; every other injection inside a save (after the weights and
  optimizer of that checkpoint are written, before its trainer state: a half checkpoint), the others at a step
  end before that step's save;
* `sigterm`: SIGTERM at a seeded random step end (the run saves a complete checkpoint and exits 75);
* `disk-full`: the output_dir on a tmpfs (mounted here, needs root; the kind is skipped with the reason when
  the mount fails) too small for a checkpoint (the first save fails writing: exit 74, nothing to resume) or
  for a second one (refused before writing: exit 74, the previous one kept); the tmpfs is then grown (space
  freed) and the run resumed;
* `rank-death-ddp`, `rank-death-fsdp2`: two CPU ranks (gloo) under `accelerate launch --max_restarts 1`
  (configs/accelerate/cpu_ddp.yaml; fsdp2.yaml with `--num_processes 2 --mixed_precision no` and
  BEAM_SFT_FSDP_ON_CPU=1), a per-device batch of 2 (the same global batch of 4), checkpoints every 2 steps,
  `--resume_from_checkpoint last` from the start: SIGKILL to rank 1 at a seeded random step end after the first
  checkpoint; the launcher restarts both workers, which resume from the newest complete checkpoint, and the
  chain is that one launch (finished: it exits 0). Compared with an uninterrupted 2-rank run of the same
  strategy (rank 0's losses); steps lost: what the dead attempt trained past the checkpoint the restart resumed
  from.

Per kind: injections, resumes that went on from a checkpoint (or from scratch when none was complete), chains
that finished, steps lost (work since the last complete checkpoint that had to be redone, summed), steps
repeated in the chain's loss curve (each run's steps up to the step the next run went on from, then the last
run's: a step there twice means a resume went back before its checkpoint, or past it), and the largest
relative difference of a logged loss from the uninterrupted run's loss at that step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "fault_driver.py"
SINGLE = ("sigkill", "sigterm", "disk-full")
RANK_DEATH = ("rank-death-ddp", "rank-death-fsdp2")
KINDS = (*SINGLE, *RANK_DEATH)
CPU_DDP = REPO / "configs" / "accelerate" / "cpu_ddp.yaml"
FSDP2 = REPO / "configs" / "accelerate" / "fsdp2.yaml"
SAVE_STEPS = 2


def _common(steps: int, seed: int) -> list[str]:
    return [
        "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
        "--max_records", "25", "--max_length", "512", "--packing", "false",
        "--max_steps", str(steps), "--learning_rate", "3e-3", "--warmup_steps", "0",
        "--logging_steps", "1", "--disable_tqdm", "true", "--seed", str(seed), "--report_to", "none",
        "--per_device_train_batch_size", "4",
    ]


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(kind: str) -> tuple[list[str], dict]:
    """`accelerate launch` options and extra environment of a 2-rank kind (DDP or FSDP2 on 2 CPU ranks)."""
    if kind.endswith("fsdp2"):
        return (["--config_file", str(FSDP2), "--num_processes", "2", "--mixed_precision", "no"],
                {"BEAM_SFT_FSDP_ON_CPU": "1"})
    return ["--config_file", str(CPU_DDP)], {}


class Runs:
    """Driver runs in one scratch directory, each named, each logging its losses to NAME.losses.jsonl."""

    def __init__(self, tmp: Path, timeout: float) -> None:
        self.tmp, self.timeout = tmp, timeout

    def start(self, name: str, argv: list[str], launch: list[str] | None = None, extra_env: dict | None = None,
              **hooks) -> tuple[subprocess.Popen, Path]:
        """One driver run; with `launch` (accelerate launch options) a multi-rank one, in its own session."""
        spec = {"losses": str(self.tmp / f"{name}.losses.jsonl"), "ready": str(self.tmp / f"{name}.ready"),
                **hooks}
        (self.tmp / f"{name}.json").write_text(json.dumps(spec))
        err = open(self.tmp / f"{name}.stderr", "w", encoding="utf-8")  # noqa: SIM115 - closed by wait()
        cmd = [sys.executable, str(DRIVER), str(self.tmp / f"{name}.json"), "--", *argv]
        if launch is not None:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch, "--main_process_port",
                   str(_free_port()), *cmd[1:]]
        proc = subprocess.Popen(cmd, env={**_env(), **(extra_env or {})}, cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=err, text=True, start_new_session=launch is not None)
        proc._err = err  # type: ignore[attr-defined]
        proc._group = launch is not None  # type: ignore[attr-defined]
        return proc, Path(spec["ready"])

    def wait(self, name: str, proc: subprocess.Popen) -> tuple[int, str]:
        try:
            code = proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            if proc._group:  # type: ignore[attr-defined] # the launcher and its workers
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            code = proc.wait()
        proc._err.close()  # type: ignore[attr-defined]
        return code, (self.tmp / f"{name}.stderr").read_text(encoding="utf-8", errors="replace")

    def run(self, name: str, argv: list[str], **kw) -> tuple[int, str]:
        proc, _ = self.start(name, argv, **kw)
        return self.wait(name, proc)

    def until_ready(self, ready: Path, proc: subprocess.Popen) -> bool:
        deadline = time.monotonic() + self.timeout
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def losses(self, name: str) -> list[tuple[int, float]]:
        """(step, loss) in the order logged, rank 0's (a multi-rank run logs every rank's)."""
        path = self.tmp / f"{name}.losses.jsonl"
        if not path.exists():
            return []
        return [(e["step"], e["loss"]) for e in map(json.loads, path.read_text().splitlines())
                if e.get("rank", 0) == 0]


def _resumed_from(stderr: str) -> int | None:
    """The step the run went on from (0: from scratch), None when it said neither."""
    found = re.search(r"(?<!not )resuming from \S*checkpoint-(\d+)", stderr)
    if found:
        return int(found.group(1))
    return 0 if "starting from scratch" in stderr else None


def _status_step(out: Path) -> int | None:
    try:
        return int(json.loads((out / "run_status.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tail(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _error(stderr: str) -> str:
    """The run's own error line (`error: ...`, the first rank's) when it wrote one, else its last line."""
    named = [line for line in stderr.splitlines() if line.startswith("error: ")]
    return named[0][:300] if named else _tail(stderr)


def _chain(runs: Runs, name: str, argv: list[str], fault, max_resumes: int = 3) -> dict:
    """One injection: `fault(name)` -> (exit status, steps trained when it hit), then resumes until exit 0."""
    first = f"{name}.0"
    code, trained, note = fault(first)
    names, resumes, resumed_from, lost = [first], [], None, None
    finished = False
    for i in range(1, max_resumes + 1):
        run = f"{name}.{i}"
        rc, err = runs.run(run, [*argv, "--resume_from_checkpoint", "last"])
        names.append(run)
        start = _resumed_from(err)
        resumes.append({"exit": rc, "from_step": start, "last_line": _tail(err),
                        "incomplete_named": [line.split("not resuming from ", 1)[1][:200]
                                             for line in err.splitlines() if "not resuming from " in line]})
        if i == 1:
            resumed_from = start
            if trained is not None and start is not None:
                lost = max(0, trained - start)
        if rc == 0:
            finished = True
            break
    # The chain's loss curve: each run's steps up to the step the next run went on from (what a killed run
    # trained past its last complete checkpoint is lost work, counted above, not a repeat), then the last run's.
    starts = [r["from_step"] or 0 for r in resumes]
    logged = []
    for j, run in enumerate(names):
        cut = starts[j] if j < len(starts) else None
        logged += [entry for entry in runs.losses(run) if cut is None or entry[0] <= cut]
    return {"fault_exit": code, "trained_before_fault": trained, "note": note, "resumed_from": resumed_from,
            "resumes": resumes, "finished": finished, "steps_lost": lost, "logged": logged}


def _sigkill(runs: Runs, argv: list[str], steps: int, rng: random.Random, i: int):
    inside_save = i % 2 == 0
    save_steps = list(range(SAVE_STEPS, steps, SAVE_STEPS))
    at = rng.choice(save_steps) if inside_save else rng.randint(1, steps - 1)

    def fault(name: str):
        hooks = {"save_pause": at, "pause_s": 60} if inside_save else {"pause_step": at, "pause_s": 60}
        proc, ready = runs.start(name, argv, **hooks)
        hit = runs.until_ready(ready, proc)
        if hit:
            proc.send_signal(signal.SIGKILL)
        code, _ = runs.wait(name, proc)
        where = f"inside the save of checkpoint-{at}" if inside_save else f"at the end of step {at}"
        return code, at if hit else None, where if hit else "the run ended before the kill point"

    return fault


def _sigterm(runs: Runs, argv: list[str], steps: int, rng: random.Random, out: Path):
    at = rng.randint(1, steps - 1)

    def fault(name: str):
        proc, ready = runs.start(name, argv, pause_step=at, pause_s=3)
        hit = runs.until_ready(ready, proc)
        if hit:
            proc.send_signal(signal.SIGTERM)
        code, _ = runs.wait(name, proc)
        stopped = _status_step(out)
        return code, stopped if hit else None, (f"at the end of step {at}; stopped at step {stopped}" if hit
                                                else "the run ended before the signal")

    return fault


def _mount(directory: Path, size: int) -> str | None:
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exit {done.returncode}")


def _disk_full(runs: Runs, argv: list[str], out: Path, size: int):
    def fault(name: str):
        code, err = runs.run(name, argv)
        # the user frees space: here the tmpfs grows
        subprocess.run(["mount", "-o", "remount,size=512m", str(out)], check=True)
        trained = _status_step(out) if code == 74 else None
        return code, trained, f"tmpfs of {size / 2**20:.1f} MiB: {_tail(err)}"

    return fault


def _rank_death(runs: Runs, name: str, argv: list[str], kind: str, steps: int, rng: random.Random,
                pause_s: float = 5) -> dict:
    """One injection: a 2-rank launch with `--max_restarts 1`; SIGKILL to rank 1 at the end of a seeded random step
    after the first checkpoint (its save not begun); the restarted workers resume and finish in the same launch."""
    at = rng.randint(SAVE_STEPS + 1, steps - 1)
    launch, extra_env = _launch(kind)
    pids = runs.tmp / f"{name}.pids"
    proc, ready = runs.start(name, [*argv, "--resume_from_checkpoint", "last"], launch=[*launch, "--max_restarts", "1"],
                             extra_env=extra_env, pids=str(pids), pause_step=at, pause_rank=1, pause_s=pause_s)
    hit, victim, split = runs.until_ready(ready, proc), None, None
    if hit:
        victim = int((pids / "rank1.pid").read_text())
        rank0 = (pids / "rank0.pid").read_text()
        os.kill(victim, signal.SIGKILL)
        # The dead attempt's log ends where the restarted rank 0 begins (it writes its pid at train begin, after
        # the launcher stopped the old workers and before its first step): count rank 0's lines then.
        deadline = time.monotonic() + runs.timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if (pids / "rank0.pid").read_text() != rank0:
                split = len(runs.losses(name))
                break
            time.sleep(0.02)
    code, err = runs.wait(name, proc)
    start = _resumed_from(err) if hit else None
    logged = runs.losses(name)
    if split is None:  # no restart began: everything is the first attempt's
        split = len(logged)
    # The chain's curve: the dead attempt's steps up to the checkpoint the restart went on from, then the restart's.
    curve = [e for e in logged[:split] if start is None or e[0] <= start] + logged[split:]
    resume = {"exit": code, "from_step": start, "last_line": _error(err),
              "incomplete_named": [line.split("not resuming from ", 1)[1][:200]
                                   for line in err.splitlines() if "not resuming from " in line]}
    note = (f"SIGKILL to rank 1 (pid {victim}) at the end of step {at}, one launch with --max_restarts 1"
            if hit else f"the run ended before the kill point (the end of step {at}): {_error(err)}")
    return {"fault_exit": code, "trained_before_fault": at if hit else None, "note": note, "resumed_from": start,
            "resumes": [resume], "finished": hit and code == 0,
            "steps_lost": max(0, at - start) if hit and start is not None else None, "logged": curve}


def _summary(kind: str, chains: list[dict], reference: dict[int, float]) -> dict:
    repeated, max_rel = 0, 0.0
    for chain in chains:
        seen: dict[int, int] = {}
        for step, loss in chain["logged"]:
            seen[step] = seen.get(step, 0) + 1
            if step in reference:
                max_rel = max(max_rel, abs(loss - reference[step]) / abs(reference[step]))
        repeated += sum(n - 1 for n in seen.values())
        chain["steps_repeated"] = sum(n - 1 for n in seen.values())
        chain["steps_logged"] = sorted(seen)
        chain["steps_missing"] = sorted(set(reference) - set(seen)) if chain["finished"] else None
    return {
        "kind": kind, "injected": len(chains),
        "resumed": sum(1 for c in chains if c["resumed_from"] is not None),
        "finished": sum(1 for c in chains if c["finished"]),
        "steps_lost": sum(c["steps_lost"] or 0 for c in chains),
        "steps_repeated": repeated,
        "steps_missing": sum(len(c["steps_missing"] or []) for c in chains),
        "max_rel_loss_diff": max_rel,
        "chains": [{k: v for k, v in c.items() if k != "logged"} for c in chains],
    }


def bench(kinds: list[str], injections: int, steps: int, seed: int, timeout: float, rank_injections: int = 1) -> dict:
    rng = random.Random(seed)
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="beam-faults-"))
    runs = Runs(tmp, timeout)
    cache = tmp / "cache"  # one prepared dataset for every run
    common = [*_common(steps, seed), "--prepared_cache_dir", str(cache)]
    # 2 ranks x 2 records: the same global batch of 4 (the dataset prepared once for the 2-rank runs)
    common2 = [*_common(steps, seed)[:-1], "2", "--prepared_cache_dir", str(tmp / "cache2")]
    mounted: list[Path] = []
    try:
        references: dict[str, dict[int, float]] = {}
        if any(kind in SINGLE for kind in kinds):
            code, err = runs.run("reference", [*common, "--output_dir", str(tmp / "reference"),
                                               "--save_strategy", "no"])
            if code != 0:
                raise RuntimeError(f"the uninterrupted run failed (exit {code}): {_tail(err)}")
            references["single"] = dict(runs.losses("reference"))
        checkpoint_bytes = None
        rows, skipped = [], {}
        for kind in kinds:
            chains = []
            if kind in RANK_DEATH:
                # the uninterrupted 2-rank run of the same strategy, saving as the injected runs do
                launch, extra_env = _launch(kind)
                ref = f"reference-{kind}"
                code, err = runs.run(ref, [*common2, "--output_dir", str(tmp / ref), "--save_strategy", "steps",
                                           "--save_steps", str(SAVE_STEPS)], launch=launch, extra_env=extra_env)
                references[kind] = dict(runs.losses(ref))
                # a failed reference does not hide the kind: its injections run all the same, the row says why
                failed = None if code == 0 else f"the uninterrupted 2-rank run failed (exit {code}) after step " \
                    f"{max(references[kind], default=0)}: {_error(err)}"
                for i in range(rank_injections):
                    argv = [*common2, "--output_dir", str(tmp / f"{kind}-{i}"), "--save_strategy", "steps",
                            "--save_steps", str(SAVE_STEPS)]
                    print(f"[faults] {kind} {i + 1}/{rank_injections} ...", file=sys.stderr, flush=True)
                    chains.append(_rank_death(runs, f"{kind}-{i}", argv, kind, steps, rng))
                rows.append({**_summary(kind, chains, {} if failed else references[kind]), "reference_failed": failed})
                continue
            reference = references["single"]
            for i in range(injections):
                out = tmp / f"{kind}-{i}"
                argv = [*common, "--output_dir", str(out), "--save_strategy", "steps",
                        "--save_steps", str(SAVE_STEPS), "--save_total_limit", "1"]
                if kind == "sigkill":
                    fault = _sigkill(runs, argv, steps, rng, i)
                elif kind == "sigterm":
                    fault = _sigterm(runs, argv, steps, rng, out)
                else:
                    if checkpoint_bytes is None:
                        checkpoint_bytes = _checkpoint_bytes(runs, common, tmp)
                    # even injections: room for less than one checkpoint (the first save fails writing);
                    # odd: for one and a half (the second save is refused before writing)
                    size = int(checkpoint_bytes * (0.6 if i % 2 == 0 else 1.6)) + 2 * 2**20
                    why = _mount(out, size)
                    if why:
                        skipped[kind] = f"cannot mount a tmpfs: {why}"
                        break
                    mounted.append(out)
                    fault = _disk_full(runs, argv, out, size)
                print(f"[faults] {kind} {i + 1}/{injections} ...", file=sys.stderr, flush=True)
                chains.append(_chain(runs, f"{kind}-{i}", argv, fault))
            if kind in skipped:
                continue
            rows.append(_summary(kind, chains, reference))
        return {"steps": steps, "seed": seed, "injections_per_kind": injections,
                "injections_per_rank_death_kind": rank_injections, "save_steps": SAVE_STEPS,
                "reference_losses": {name: [ref[s] for s in sorted(ref)] for name, ref in references.items()},
                "kinds": rows, "skipped": skipped,
                "seconds": round(time.time() - started, 1)}
    finally:
        for path in mounted:
            subprocess.run(["umount", str(path)], capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _checkpoint_bytes(runs: Runs, common: list[str], tmp: Path) -> int:
    """The size of one checkpoint of this setup (a 2-step run saving once)."""
    out = tmp / "size-probe"
    argv = [*common, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]
    code, err = runs.run("size-probe", argv)
    if code != 0:
        raise RuntimeError(f"the size probe failed (exit {code}): {_tail(err)}")
    return sum(f.stat().st_size for f in (out / "checkpoint-2").rglob("*") if f.is_file())


def table(figures: dict) -> str:
    lines = ["| kind | injected | resumed | finished | steps lost | steps repeated | steps missing | max rel. loss diff |",
             "|---|---|---|---|---|---|---|---|"]
    for row in figures["kinds"]:
        lines.append(f"| {row['kind']} | {row['injected']} | {row['resumed']} | {row['finished']} | "
                     f"{row['steps_lost']} | {row['steps_repeated']} | {row['steps_missing']} | "
                     f"{'-' if row.get('reference_failed') else format(row['max_rel_loss_diff'], '.2e')} |")
    for kind, why in figures["skipped"].items():
        lines.append(f"| {kind} | skipped: {why} | | | | | | |")
    lines += [f"\n{row['kind']}: {row['reference_failed']}" for row in figures["kinds"] if row.get("reference_failed")]
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks faults", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="fault kinds (default: all)")
    parser.add_argument("--injections", type=int, default=2, help="injections per kind (default: 2)")
    parser.add_argument("--rank-injections", type=int, default=1,
                        help="injections per rank-death kind (2-rank launches; default: 1)")
    parser.add_argument("--steps", type=int, default=8, help="max_steps of every run (default: 8)")
    parser.add_argument("--seed", type=int, default=0, help="the fault points and the training seed (default: 0)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default: 300)")
    parser.add_argument("--json", help="write the figures here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    figures = bench(args.kinds, args.injections, args.steps, args.seed, args.timeout, args.rank_injections)
    print(table(figures))
    for row in figures["kinds"]:
        for chain in row["chains"]:
            print(f"  {row['kind']}: {chain['note']}; exit {chain['fault_exit']}, resumed from step "
                  f"{chain['resumed_from']}, lost {chain['steps_lost']}, repeated {chain['steps_repeated']}, "
                  f"finished {chain['finished']}; passed over: {chain['resumes'][0]['incomplete_named'] or 'none'}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    ok = all(row["finished"] == row["injected"] and not row["steps_repeated"] and not row["steps_missing"]
             and not row.get("reference_failed") for row in figures["kinds"]) and not any(kind in RANK_DEATH for kind in figures["skipped"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
