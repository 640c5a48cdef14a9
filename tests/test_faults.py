"""Faults of a training run, with real processes and real signals (docs/training.md#when-a-job-fails).

One small setup for every run (the tiny model, 24 OpenAI-format sample records, a global batch of 4, one
thread), so a run that was killed, preempted or restarted can be compared step by step with the uninterrupted
one: a resumed run must log the same losses and repeat no step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "fault_driver.py"
pytestmark = pytest.mark.slow

STEPS = 8
COMMON = [
    "--config", str(REPO / "configs" / "quickstart.yaml"),
    "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
    "--max_records", "25", "--max_length", "512", "--packing", "false",
    "--max_steps", str(STEPS), "--learning_rate", "3e-3", "--warmup_steps", "0",
    "--logging_steps", "1", "--disable_tqdm", "true", "--seed", "0", "--report_to", "none",
    "--per_device_train_batch_size", "4",
]
RTOL = 1e-5  # a resumed run replays the same batches from the same RNG state: float noise only


def env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def start(tmp: Path, name: str, argv: list[str], **hooks) -> tuple[subprocess.Popen, Path]:
    spec = {"losses": str(tmp / f"{name}.losses.jsonl"), "ready": str(tmp / f"{name}.ready"), **hooks}
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(tmp / f"{name}.json"), "--", *argv], env=env(),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, Path(spec["ready"])


def run(tmp: Path, name: str, argv: list[str], timeout: int = 300, **hooks) -> subprocess.CompletedProcess:
    proc, _ = start(tmp, name, argv, **hooks)
    _, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def wait_for(path: Path, proc: subprocess.Popen, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, f"run ended first: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"{path.name} not reached in {limit} s"
        time.sleep(0.2)


def losses(tmp: Path, *names: str) -> dict[int, float]:
    """step -> rank 0's loss over the named runs' logs, each step logged once in all (a repeated step fails)."""
    out = {}
    for name in names:
        path = tmp / f"{name}.losses.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            entry = json.loads(line)
            if entry["rank"] == 0:
                assert entry["step"] not in out, f"step {entry['step']} trained twice"
                out[entry["step"]] = entry["loss"]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's losses."""
    tmp = tmp_path_factory.mktemp("reference")
    # `last` with nothing to resume starts from scratch, saying why (a script can always pass it)
    done = run(tmp, "ref", [*COMMON, "--output_dir", str(tmp / "out"), "--save_strategy", "no",
                            "--prepared_cache_dir", str(tmp / "cache"), "--resume_from_checkpoint", "last"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"no complete checkpoint in {tmp / 'out'} (save_strategy is 'no': only a preemption writes a "
            "checkpoint); starting from scratch") in done.stderr
    found = losses(tmp, "ref")
    assert sorted(found) == list(range(1, STEPS + 1))
    return found


def assert_same(found: dict[int, float], reference: dict[int, float]) -> None:
    assert sorted(found) == sorted(reference), (found, reference)  # no step lost, none repeated
    for step, loss in reference.items():
        assert found[step] == pytest.approx(loss, rel=RTOL), (step, found, reference)


def test_sigterm_saves_a_complete_checkpoint_and_the_resume_loses_nothing(reference, tmp_path):
    out = tmp_path / "out"
    argv = [*COMMON, "--output_dir", str(out), "--save_strategy", "no", "--prepared_cache_dir", str(tmp_path / "c")]
    proc, ready = start(tmp_path, "first", argv, pause_step=3, pause_s=5)
    wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGTERM)  # from outside, while the run sits at step 3's end
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "preempted" and status["exit_code"] == 75
    stopped = status["step"]
    assert stopped in (3, 4), status  # the step it was at, or the next one: never later
    assert (out / f"checkpoint-{stopped}" / "beam_checkpoint.json").is_file()
    assert not (out / "model.safetensors").exists()  # not finished: no final model
    assert f"saved {out / f'checkpoint-{stopped}'} (complete) at step {stopped}" in err.splitlines()[-1]

    done = run(tmp_path, "second", [*argv, "--resume_from_checkpoint", "last"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {out / f'checkpoint-{stopped}'}: step {stopped} done" in done.stderr
    assert "missing keys" not in done.stderr  # the tied lm_head is not missing
    assert_same(losses(tmp_path, "first", "second"), reference)
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"

    again = run(tmp_path, "third", [*argv, "--resume_from_checkpoint", "last"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "holds a run that finished at step 8" in again.stderr and not (tmp_path / "third.losses.jsonl").exists()
    assert not (out / f"checkpoint-{STEPS + 1}").exists()


def test_kill_inside_a_save_is_never_resumed(reference, tmp_path):
    out = tmp_path / "out"
    argv = [*COMMON, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2",
            "--save_total_limit", "1", "--prepared_cache_dir", str(tmp_path / "c")]
    proc, ready = start(tmp_path, "first", argv, save_pause=4)
    wait_for(ready, proc)
    os.kill(proc.pid, signal.SIGKILL)  # weights and optimizer of checkpoint-4 written, its trainer state not
    proc.wait(timeout=60)
    half = out / "checkpoint-4"
    assert (half / "model.safetensors").is_file() and not (half / "trainer_state.json").exists()
    assert (out / "checkpoint-2" / "beam_checkpoint.json").is_file()  # rotation waited for checkpoint-4

    done = run(tmp_path, "second", [*argv, "--resume_from_checkpoint", "last"])
    assert done.returncode == 0, done.stderr[-3000:]
    named = [line for line in done.stderr.splitlines() if "not resuming from" in line]
    assert len(named) == 1 and str(half) in named[0] and "lacks trainer_state.json" in named[0], named
    assert f"resuming from {out / 'checkpoint-2'}" in done.stderr
    first = {s: v for s, v in losses(tmp_path, "first").items() if s <= 2}  # steps 3-4 died with the process
    assert_same({**first, **losses(tmp_path, "second")}, reference)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{STEPS}"]  # limit 1, all complete


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_its_records(tmp_path):
    out = tmp_path / "out"
    argv = [*COMMON, "--output_dir", str(out), "--learning_rate", "1e4", "--max_grad_norm", "0",
            "--max_steps", "12", "--save_strategy", "steps", "--save_steps", "1",
            "--prepared_cache_dir", str(tmp_path / "c")]
    done = run(tmp_path, "nan", argv)
    assert done.returncode == 65, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: non-finite ") and " at step " in line, line
    step = int(line.split(" at step ")[1].split(";")[0].split()[0])
    # Named by source file and line (the samples are JSONL): four records, the batch of that step.
    records = line.split("the batch's records: ")[1].split(". ")[0].split(", ")
    source = str(REPO / "data" / "samples" / "openai.jsonl") + ":"
    assert len(records) == 4 and all(r.startswith(source) for r in records), records
    # Stopped before that step's optimizer step: no checkpoint after the last finite one.
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert saved and max(saved) == step - 1, (saved, step)
    assert json.loads((out / "run_status.json").read_text())["exit_code"] == 65
    for path in out.glob("checkpoint-*/model.safetensors"):
        from safetensors.torch import load_file

        assert all(t.isfinite().all() for t in load_file(str(path)).values()), path


def test_skip_drops_non_finite_steps_up_to_a_cap(tmp_path):
    argv = [*COMMON, "--output_dir", str(tmp_path / "out"), "--learning_rate", "1e4", "--max_grad_norm", "0",
            "--max_steps", "12", "--save_strategy", "no", "--on_nonfinite", "skip", "--nonfinite_max_skips", "2",
            "--prepared_cache_dir", str(tmp_path / "c")]
    done = run(tmp_path, "skip", argv)
    assert done.returncode == 65, done.stderr[-3000:]
    assert "after 2 skipped steps in a row (nonfinite_max_skips 2)" in done.stderr.splitlines()[-1]
    assert done.stderr.count("step skipped (") == 2


@pytest.fixture
def small_disk(tmp_path):
    """A real small filesystem (tmpfs, as root): 20 MiB, room for one checkpoint of the tiny model (~14 MiB)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_stops_the_save_and_keeps_the_previous_checkpoint(reference, small_disk, tmp_path):
    out = small_disk / "out"
    argv = [*COMMON, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2",
            "--prepared_cache_dir", str(tmp_path / "c")]
    done = run(tmp_path, "full", argv)
    assert done.returncode == 74, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: no space left for {out / 'checkpoint-4'}: a checkpoint needs about "), line
    assert "checkpoint-2 is the newest complete checkpoint and stays resumable" in line, line
    sizes = re.search(r"needs about ([\d,]+) bytes \([^)]*\), ([\d,]+) \(", line)
    needed, free = (int(group.replace(",", "")) for group in sizes.groups())
    assert needed > free, line
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert (out / "checkpoint-2" / "beam_checkpoint.json").is_file()

    # Freed space (the filesystem made larger), the same command resumes and finishes.
    grown = subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], capture_output=True, text=True,
                           check=False)
    assert grown.returncode == 0, grown.stderr
    resumed = run(tmp_path, "after", [*argv, "--resume_from_checkpoint", "last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first = {s: v for s, v in losses(tmp_path, "full").items() if s <= 2}
    assert_same({**first, **losses(tmp_path, "after")}, reference)


def test_a_write_that_fails_for_space_is_the_same_one_error(small_disk, tmp_path):
    # 8 MiB: the weights (4.6 MB) fit, the optimizer state (9.3 MB) does not: the first save fails mid-way.
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    out = small_disk / "out"
    argv = [*COMMON, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2",
            "--max_steps", "2", "--prepared_cache_dir", str(tmp_path / "c")]
    done = run(tmp_path, "mid", argv)
    assert done.returncode == 74, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: no space left for {out / 'checkpoint-2'}"), line
    assert "no complete checkpoint yet" in line
    assert not list(out.glob("checkpoint-*"))  # the partial save removed: its space back, nothing to mistake


def test_dry_run_prints_a_checkpoint_size_against_the_free_space_and_help_names_last(small_disk, tmp_path):
    argv = [*COMMON, "--output_dir", str(small_disk / "out"), "--prepared_cache_dir", str(tmp_path / "c"),
            "--dry_run", "true"]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *argv], env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.strip().startswith("checkpoints "))
    # The tiny model's checkpoint is ~14 MiB on disk (weights 4.6 MB + AdamW 9.3 MB); the tmpfs has 20 MiB.
    assert re.search(r"1[34]\.\d MiB each \(estimate\), every one kept \(no save_total_limit\); ", line), line
    assert re.search(r"has (19\.\d|20\.0) MiB free$", line), line
    assert not (small_disk / "out").exists()  # a dry run writes nothing
    full = subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], capture_output=True, check=False)
    assert full.returncode == 0
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *argv], env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert "NOT ENOUGH FOR ONE" in done.stdout

    helped = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), "--help"], env=env(), cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    text = " ".join(helped.stdout.split())
    assert "--resume_from_checkpoint" in text and "'last'" in text and "--preemption_signals" in text


def test_a_batch_without_trained_tokens_is_counted_not_a_nan(tmp_path):
    """Both loss paths (TRL's fused LM head and the plain one) give 0 for a batch whose labels are all -100,
    a step of such batches (num_items_in_batch 0) too, and the batch is counted and logged."""
    import torch
    from inmemory import prepare_dataset, read_rows, to_beam_records
    from trl import SFTConfig

    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer
    from beam_sft.train.trainer import make_trainer_class

    tok = load_tokenizer()
    records, _ = to_beam_records(read_rows(str(REPO / "data" / "samples" / "openai.jsonl"))[:4])
    dataset, _ = prepare_dataset(tok, records, max_length=512)
    for plain in (False, True):
        args = SFTConfig(output_dir=str(tmp_path / str(plain)), use_cpu=True, bf16=False, report_to="none",
                         per_device_train_batch_size=4, max_length=512)
        trainer = make_trainer_class()(model=build_tiny_model(tok, seed=0), args=args, train_dataset=dataset,
                                       processing_class=tok, plain_loss=plain)
        batch = trainer.data_collator([dataset[i] for i in range(4)])
        batch["labels"] = torch.full_like(batch["labels"], -100)
        trainer.model.train()
        for items in (None, torch.tensor(0)):
            loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=items)
            assert torch.isfinite(loss) and float(loss) == 0.0, (plain, items, loss)
        assert trainer.guard.empty_batches == 2
        logs = {}
        trainer._log_faults(logs)
        assert logs == {"batches_without_trained_tokens": 2.0}


# --- Two ranks (DDP over gloo, torchrun through accelerate launch), real processes, real signals ---------------

CPU_DDP = REPO / "configs" / "accelerate" / "cpu_ddp.yaml"
FSDP2 = REPO / "configs" / "accelerate" / "fsdp2.yaml"
TWO = [*COMMON[:-1], "2"]  # 2 ranks x 2 records = the same global batch of 4


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start2(tmp: Path, name: str, argv: list[str], launch: tuple = (), config: Path = CPU_DDP,
           extra_env: dict | None = None, port: int | None = None, **hooks) -> tuple[subprocess.Popen, Path]:
    spec = {"losses": str(tmp / f"{name}.losses.jsonl"), "ready": str(tmp / f"{name}.ready"), **hooks}
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
           "--main_process_port", str(port or free_port()), *launch, str(DRIVER), str(tmp / f"{name}.json"), "--", *argv]
    proc = subprocess.Popen(cmd, env={**env(), **(extra_env or {})}, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, Path(spec["ready"])


def run2(tmp: Path, name: str, argv: list[str], timeout: int = 120, **kw) -> subprocess.CompletedProcess:
    proc, _ = start2(tmp, name, argv, **kw)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{name}: no exit within {timeout} s (a rank hung): {err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.fixture(scope="module")
def reference2(tmp_path_factory):
    """The uninterrupted 2-rank run's losses (saving every 2 steps: saves do not change the losses)."""
    tmp = tmp_path_factory.mktemp("reference2")
    done = run2(tmp, "ref", [*TWO, "--output_dir", str(tmp / "out"), "--save_strategy", "steps", "--save_steps", "2",
                             "--prepared_cache_dir", str(tmp / "cache")])
    assert done.returncode == 0, done.stderr[-3000:]
    found = losses(tmp, "ref")
    assert sorted(found) == list(range(1, STEPS + 1))
    return found


def test_sigterm_to_one_rank_of_two_stops_both_at_one_step(reference2, tmp_path):
    out = tmp_path / "out"
    argv = [*TWO, "--output_dir", str(out), "--save_strategy", "no", "--prepared_cache_dir", str(tmp_path / "c")]
    proc, ready = start2(tmp_path, "first", argv, pids=str(tmp_path / "pids"), pause_step=3, pause_rank=1, pause_s=5)
    wait_for(ready, proc)
    os.kill(int((tmp_path / "pids" / "rank1.pid").read_text()), signal.SIGTERM)  # rank 1 only
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err[-3000:]  # the launcher's own status (1); beam-sft train returns 75 from:
    status = json.loads((out / "run_status.json").read_text())
    assert status["status"] == "preempted" and status["exit_code"] == 75, status
    stopped = status["step"]
    assert stopped in (3, 4), status
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stopped}"]
    from beam_sft.train.checkpoints import is_complete

    assert is_complete(out / f"checkpoint-{stopped}")
    # Both ranks stopped at the same step: each logged exactly the steps up to it.
    logged = [json.loads(line) for line in (tmp_path / "first.losses.jsonl").read_text().splitlines()]
    for rank in (0, 1):
        assert [e["step"] for e in logged if e["rank"] == rank] == list(range(1, stopped + 1)), logged
    assert err.count("preempted: saved ") == 1, err[-3000:]  # one line for the job, from rank 0

    done = run2(tmp_path, "second", [*argv, "--resume_from_checkpoint", "last"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {out / f'checkpoint-{stopped}'}: step {stopped} done" in done.stderr
    assert_same(losses(tmp_path, "first", "second"), reference2)


def test_beam_sft_train_returns_75_when_one_rank_of_two_is_preempted(tmp_path):
    """`python -m beam_sft.cli.train --num_processes 2 --config_file cpu_ddp`: the status the workers wrote."""
    out = tmp_path / "out"
    argv = [*TWO, "--max_steps", "30", "--output_dir", str(out), "--save_strategy", "no",
            "--prepared_cache_dir", str(tmp_path / "c")]
    cmd = [sys.executable, "-m", "beam_sft.cli.train", "--num_processes", "2", "--config_file", "cpu_ddp",
           "--main_process_port", str(free_port()), *argv]
    proc = subprocess.Popen(cmd, env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 100
    while not (out / "data_phase.rank1.json").exists():  # the data phase is over: the steps begin
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    time.sleep(4)  # into the steps
    # accelerate launch runs torchrun's agent in this process: the workers are its children
    worker = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True,
                            check=False).stdout.split()
    assert len(worker) == 2, worker
    os.kill(int(sorted(worker, key=int)[1]), signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert json.loads((out / "run_status.json").read_text())["status"] == "preempted"


def test_a_killed_rank_ends_the_job_soon_naming_it(tmp_path):
    out = tmp_path / "out"
    argv = [*TWO, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2",
            "--prepared_cache_dir", str(tmp_path / "c")]
    proc, ready = start2(tmp_path, "first", argv, pids=str(tmp_path / "pids"), pause_step=3, pause_rank=1, pause_s=60)
    wait_for(ready, proc)
    pid = int((tmp_path / "pids" / "rank1.pid").read_text())
    began = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - began
    print(f"killed rank: the job exited {proc.returncode} {took:.1f} s after the kill")
    assert proc.returncode != 0 and took < 20, (proc.returncode, took)
    named = [line for line in err.splitlines() if line.startswith("error: lost ")]
    assert len(named) == 1, err[-3000:]
    assert named[0].startswith(f"error: lost rank 1 (pid {pid}, gone) at step 4: "), named
    assert "checkpoint-2 is the newest complete checkpoint" in named[0], named


def test_max_restarts_resumes_from_the_newest_complete_checkpoint(reference2, tmp_path):
    out = tmp_path / "out"
    argv = [*TWO, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2",
            "--prepared_cache_dir", str(tmp_path / "c"), "--resume_from_checkpoint", "last"]
    proc, ready = start2(tmp_path, "first", argv, launch=("--max_restarts", "1"),
                         pids=str(tmp_path / "pids"), pause_step=3, pause_rank=1, pause_s=6)
    wait_for(ready, proc)
    os.kill(int((tmp_path / "pids" / "rank1.pid").read_text()), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "connectFullMesh" not in err, err[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}: step 2 done" in err, err[-3000:]
    # The first attempt's steps 3-4 died with it (rank 0 may have logged 3): the restart trained them again.
    found = {}
    for line in (tmp_path / "first.losses.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["rank"] == 0:
            found.setdefault(entry["step"], []).append(entry["loss"])
    assert sorted(found) == list(range(1, STEPS + 1))
    assert all(len(v) == 1 for s, v in found.items() if s not in (3,)), found
    assert_same({s: v[-1] for s, v in found.items()}, reference2)
    assert json.loads((out / "run_status.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("config", ["ddp", "fsdp2"])
def test_every_rank_of_a_finished_job_exits(config, tmp_path):
    launch = () if config == "ddp" else ("--num_processes", "2", "--mixed_precision", "no")
    extra = {} if config == "ddp" else {"BEAM_SFT_FSDP_ON_CPU": "1"}
    for attempt in range(3):
        argv = [*TWO, "--max_steps", "2", "--output_dir", str(tmp_path / f"out{attempt}"), "--save_strategy", "no",
                "--prepared_cache_dir", str(tmp_path / "c")]
        done = run2(tmp_path, f"run{attempt}", argv, timeout=120, launch=launch,
                    config=CPU_DDP if config == "ddp" else FSDP2, extra_env=extra)
        assert done.returncode == 0, (attempt, done.stderr[-3000:])


@pytest.mark.parametrize("layout", ["shared", "save_on_each_node"])
def test_two_nodes_on_one_machine_commit_every_checkpoint_and_resume_the_last(layout, tmp_path):
    """Two `accelerate launch` processes as two machines (one rank each): (a) one shared output_dir, (b)
    save_on_each_node with an output_dir per node. Every checkpoint directory ends committed; a second run
    resumes from the newest one on every node."""
    from beam_sft.train.checkpoints import is_complete, last_complete

    outs = [tmp_path / "out"] * 2 if layout == "shared" else [tmp_path / "node0", tmp_path / "node1"]
    extra = ["--save_on_each_node", "true"] if layout == "save_on_each_node" else []

    def both(name: str, steps: int) -> list[str]:
        port = free_port()
        procs = []
        for node in (0, 1):
            launch = ("--num_machines", "2", "--machine_rank", str(node), "--num_processes", "2",
                      "--main_process_ip", "127.0.0.1")
            argv = [*TWO, "--max_steps", str(steps), "--output_dir", str(outs[node]), "--save_strategy", "steps",
                    "--save_steps", "2", "--prepared_cache_dir", str(tmp_path / "c"), "--resume_from_checkpoint",
                    "last", *extra]
            procs.append(start2(tmp_path, f"{name}{node}", argv, launch=launch, port=port)[0])
        errs = [proc.communicate(timeout=120)[1] for proc in procs]
        for node, proc in enumerate(procs):
            assert proc.returncode == 0, (node, [e[-2500:] for e in errs])
        return errs

    both("first", 4)
    for out in set(outs):
        names = sorted(p.name for p in out.glob("checkpoint-*"))
        assert names == ["checkpoint-2", "checkpoint-4"], (out, names)
        assert all(is_complete(p) for p in out.glob("checkpoint-*")), out
    errs = both("second", 6)
    assert any(f"resuming from {outs[0] / 'checkpoint-4'}: step 4 done" in e for e in errs), errs[0][-3000:]
    for out in set(outs):
        assert last_complete(out) == str(out / "checkpoint-6"), out
        assert all(is_complete(p) for p in out.glob("checkpoint-*")), out


def test_a_hung_rank_ends_the_job_after_step_timeout(tmp_path):
    """A rank that stops answering (SIGSTOP: alive, not stepping) ends the job once a collective has waited
    step_timeout seconds (here 10), not ddp_timeout's 1800."""
    out = tmp_path / "out"
    argv = [*TWO, "--output_dir", str(out), "--save_strategy", "no", "--max_steps", "40", "--step_timeout", "10",
            "--prepared_cache_dir", str(tmp_path / "c")]
    proc, ready = start2(tmp_path, "hung", argv, pids=str(tmp_path / "pids"), pause_step=2, pause_rank=1,
                         pause_s=2, extra_env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    wait_for(ready, proc)
    pid = int((tmp_path / "pids" / "rank1.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = time.monotonic() - began
    print(f"hung rank: the job exited {proc.returncode} {took:.1f} s after SIGSTOP")
    assert proc.returncode != 0 and 8 < took < 90, (proc.returncode, took, err[-3000:])
    named = [line for line in err.splitlines() if line.startswith("error: lost ")]
    # Rank 0 stops after step_timeout; the launcher then gives the stopped rank its shutdown time (30 s in
    # torch 2.13 whatever TORCH_ELASTIC_SHUTDOWN_TIMEOUT says) before SIGKILL: measured 42 s in all.
    assert len(named) == 1 and " at step 3: " in named[0], err[-3000:]
    assert "hung" in named[0] and "Timed out" in named[0], named


def test_fsdp2_sharded_checkpoint_killed_inside_a_save_resumes_from_the_last_complete(tmp_path):
    """FSDP2 on 2 CPU ranks, each rank writing its own shards: the whole job SIGKILLed while checkpoint-4 is
    being written; the resume passes over it, goes on from checkpoint-2 and logs the uninterrupted losses."""
    fsdp = {"launch": ("--num_processes", "2", "--mixed_precision", "no"), "config": FSDP2,
            "extra_env": {"BEAM_SFT_FSDP_ON_CPU": "1"}}
    base = [*TWO, "--save_strategy", "steps", "--save_steps", "2", "--prepared_cache_dir", str(tmp_path / "c")]
    ref = run2(tmp_path, "ref", [*base, "--output_dir", str(tmp_path / "ref")], **fsdp)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "out"
    proc, ready = start2(tmp_path, "first", [*base, "--output_dir", str(out)], save_pause=4, pause_s=60, **fsdp)
    wait_for(ready, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, mid-save
    proc.wait(timeout=60)
    from beam_sft.train.checkpoints import is_complete

    assert is_complete(out / "checkpoint-2") and not is_complete(out / "checkpoint-4")
    done = run2(tmp_path, "second", [*base, "--output_dir", str(out), "--resume_from_checkpoint", "last"], **fsdp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"not resuming from {out / 'checkpoint-4'}: incomplete" in done.stderr
    assert f"resuming from {out / 'checkpoint-2'}: step 2 done" in done.stderr
    first = {s: v for s, v in losses(tmp_path, "first").items() if s <= 2}
    assert_same({**first, **losses(tmp_path, "second")}, losses(tmp_path, "ref"))


def test_a_non_finite_step_on_two_ranks_stops_both_at_that_step(tmp_path):
    out = tmp_path / "out"
    argv = [*TWO, "--output_dir", str(out), "--learning_rate", "1e4", "--max_grad_norm", "0", "--max_steps", "12",
            "--save_strategy", "steps", "--save_steps", "1", "--prepared_cache_dir", str(tmp_path / "c")]
    done = run2(tmp_path, "nan", argv)
    assert done.returncode != 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: non-finite ")]
    assert len(lines) == 1, done.stderr[-3000:]  # agreed on both ranks, said once (rank 0)
    step = int(lines[0].split(" at step ")[1].split(";")[0])
    records = lines[0].split("the batch's records: ")[1].split(". ")[0].split(", ")
    assert len(records) == 4, records  # both ranks' rows of that step: 2 + 2
    assert max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")) == step - 1
    assert json.loads((out / "run_status.json").read_text())["exit_code"] == 65


def test_a_misspelt_preemption_signal_is_refused_before_anything_loads(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *COMMON, "--output_dir",
                           str(tmp_path / "out"), "--preemption_signals", "SIGTERM,SIGFOO", "--dry_run", "true"],
                          env=env(), cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: preemption_signals: SIGFOO is not a signal a process can catch (e.g. SIGTERM,SIGUSR1)")
    from beam_sft.train.faults import parse_signals

    assert [s.name for s in parse_signals("TERM, usr1")] == ["SIGTERM", "SIGUSR1"] and parse_signals("none") == []


@pytest.mark.parametrize("config", ["cpu_ddp", "fsdp2"])
def test_slurm_style_sigusr1_to_every_process_saves_exits_75_and_resumes(config, tmp_path):
    """As `#SBATCH --signal=USR1@N` does: SIGUSR1 to every process of the job (the launcher and both ranks),
    with torchrun's agent told to forward it (scripts/slurm_multinode.sh's environment). `beam-sft train`
    exits 75 with one line; the same command with `--resume_from_checkpoint last` goes on from that checkpoint."""
    out = tmp_path / "out"
    argv = [*TWO, "--max_steps", "40", "--output_dir", str(out), "--save_strategy", "no",
            "--prepared_cache_dir", str(tmp_path / "c")]
    launch = ["--num_processes", "2", "--config_file", config, "--main_process_port", str(free_port())]
    if config == "fsdp2":
        launch += ["--mixed_precision", "no"]
    signals = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    extra = {"PET_SIGNALS_TO_HANDLE": signals, "TORCHELASTIC_SIGNALS_TO_HANDLE": signals,
             **({"BEAM_SFT_FSDP_ON_CPU": "1"} if config == "fsdp2" else {})}
    cmd = [sys.executable, "-m", "beam_sft.cli.train", *launch, *argv]
    proc = subprocess.Popen(cmd, env={**env(), **extra}, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 150
    while not (out / "data_phase.rank1.json").exists():  # the data phase is over: the steps begin
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    time.sleep(4)  # into the steps
    os.killpg(proc.pid, signal.SIGUSR1)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 75, err[-3000:]
    status = json.loads((out / "run_status.json").read_text())
    from beam_sft.train.checkpoints import is_complete

    assert status["status"] == "preempted" and is_complete(out / f"checkpoint-{status['step']}"), status
    assert sum(line.startswith("preempted: saved ") for line in err.splitlines()) == 1, err[-3000:]
    resumed = subprocess.run([*cmd, "--resume_from_checkpoint", "last"], env={**env(), **extra}, cwd=REPO,
                             capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    step = status["step"]
    assert f"resuming from {out / f'checkpoint-{step}'}: step {step} done" in resumed.stderr
    final = json.loads((out / "run_status.json").read_text())
    assert final["status"] == "finished" and final["step"] == 40, final


def test_lora_checkpoints_are_committed_and_resumed(reference, tmp_path):
    out = tmp_path / "out"
    argv = [*COMMON, "--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2", "--max_steps", "4",
            "--use_peft", "true", "--lora_r", "4", "--prepared_cache_dir", str(tmp_path / "c")]
    first = run(tmp_path, "first", argv)
    assert first.returncode == 0, first.stderr[-3000:]
    marker = json.loads((out / "checkpoint-4" / "beam_checkpoint.json").read_text())
    assert "adapter_model.safetensors" in marker["files"] and "model.safetensors" not in marker["files"]
    again = run(tmp_path, "second", [*argv, "--max_steps", "6", "--resume_from_checkpoint", "last"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-4'}: step 4 done, training goes on at step 5 of 6" in again.stderr
    assert sorted(losses(tmp_path, "second")) == [5, 6]
