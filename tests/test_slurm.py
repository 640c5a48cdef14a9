"""scripts/slurm_multinode.sh without a cluster (docs/training.md#on-slurm-signal-save-requeue-resume): its syntax,
shellcheck where installed, and a run with stub `srun`, `scontrol`, `nvidia-smi` and `python` on PATH, checking
what each node would run, the signal torchrun's agent forwards, and the requeue on exit 75 only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_multinode.sh"
JOB_ID = "4242"

STUBS = {
    # srun: record what it got and the environment, then run the task as node 0 (its own options dropped)
    "srun": """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_LOG/srun.args"
env > "$STUB_LOG/srun.env"
while [ "${1#--}" != "$1" ]; do shift; done
SLURM_NODEID=0 exec "$@"
""",
    "scontrol": """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG/scontrol.calls"
if [ "$1 $2" = "show hostnames" ]; then printf 'node1\\nnode2\\n'; fi
""",
    "nvidia-smi": """#!/usr/bin/env bash
printf 'GPU 0: stub\\nGPU 1: stub\\n'
""",
    # the training process on each node: its argv one per line, then the status the test asks for
    "python": """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$STUB_LOG/python.args"
exit "${STUB_EXIT:-0}"
""",
}


def run_script(tmp_path: Path, status: int) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / f"log{status}"
    bin_dir.mkdir(exist_ok=True)
    log.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_", "TORCH_ELASTIC"))}
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "STUB_LOG": str(log), "STUB_EXIT": str(status),
                "PYTHON": str(bin_dir / "python"), "SLURM_JOB_ID": JOB_ID, "SLURM_NNODES": "2",
                "SLURM_JOB_NODELIST": "node[1-2]"})
    done = subprocess.run(["bash", str(SCRIPT), "configs/beam_full.yaml", "--run_name", "a run name"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    return done, log


def test_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_slurm_asks_for_a_signal_before_the_kill_and_allows_a_requeue():
    directives = re.findall(r"^#SBATCH (\S+)", SCRIPT.read_text(), re.MULTILINE)
    assert "--requeue" in directives
    signal = [d for d in directives if d.startswith("--signal=")]
    assert len(signal) == 1 and re.fullmatch(r"--signal=USR1@\d+", signal[0]), signal  # every step process, not B:


def test_each_node_runs_beam_sft_train_resuming_with_the_signal_forwarded(tmp_path):
    from beam_sft.cli.train import LAUNCH_OPTIONS, split_launch_args

    done, log = run_script(tmp_path, 0)
    assert done.returncode == 0, done.stderr
    srun_args = (log / "srun.args").read_text().splitlines()
    command = srun_args[srun_args.index("-c") + 1]
    assert "beam_sft.cli.train" in command and "--resume_from_checkpoint last" in command, command

    argv = (log / "python.args").read_text().splitlines()
    assert argv[:2] == ["-m", "beam_sft.cli.train"], argv
    launch, train = split_launch_args(argv[2:])
    # every option before the training config is one beam-sft train passes to accelerate launch
    assert all(a in LAUNCH_OPTIONS for a in argv[2:argv.index("--config")] if a.startswith("--")), argv
    assert dict(zip(launch[::2], launch[1::2])) == {
        "--config_file": "configs/accelerate/multi_node.yaml", "--num_machines": "2", "--num_processes": "4",
        "--machine_rank": "0", "--main_process_ip": "node1", "--main_process_port": "29500", "--rdzv_backend": "c10d"}
    assert train == ["--config", "configs/beam_full.yaml", "--run_name", "a run name",
                     "--resume_from_checkpoint", "last"], train

    env = dict(line.split("=", 1) for line in (log / "srun.env").read_text().splitlines() if "=" in line)
    for name in ("TORCHELASTIC_SIGNALS_TO_HANDLE", "PET_SIGNALS_TO_HANDLE"):
        assert "SIGUSR1" in env[name].split(","), env.get(name)
        assert {"SIGTERM", "SIGINT"} <= set(env[name].split(","))
    seconds = int(re.search(r"--signal=USR1@(\d+)", SCRIPT.read_text()).group(1))
    assert 60 <= int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < seconds  # a save fits, and ends before the kill
    assert "requeue" not in (log / "scontrol.calls").read_text()


# 138: the launcher itself got SIGUSR1 (accelerate exits 128 + the signal after torchrun's agent forwarded it
# and the workers saved), which beam-sft train does not yet turn into the workers' 75
@pytest.mark.parametrize("status,requeued,exit_", [(75, True, 75), (138, True, 75), (0, False, 0), (1, False, 1)])
def test_a_preempted_job_requeues_itself_and_no_other(tmp_path, status, requeued, exit_):
    done, log = run_script(tmp_path, status)
    assert done.returncode == exit_, done.stderr
    calls = (log / "scontrol.calls").read_text().splitlines()
    requeues = [c for c in calls if c.startswith("requeue")]
    assert requeues == ([f"requeue {JOB_ID}"] if requeued else []), calls
