#!/usr/bin/env bash
# Multi-node fine-tuning on Slurm: one `beam-sft train` launcher (accelerate launch) per node, each starting one
# process per GPU; preempted jobs save, requeue themselves and resume.
#
#   sbatch --nodes 2 scripts/slurm_multinode.sh configs/beam_full.yaml --model_name_or_path $BEAM_MODEL_ID
#
# The first argument is the training config; the rest go to `beam-sft train` (scripts/train.py's options) as
# overrides. Set ACCELERATE_CONFIG to use FSDP2 (configs/accelerate/fsdp2.yaml) instead of DDP. Run from the repo
# root.
#
# Preemption (docs/training.md#when-a-job-fails): Slurm sends SIGUSR1 to every process of the job step
# SIGNAL_SECONDS (300) before the time limit or a preemption's kill; torchrun's agent forwards it to its workers
# instead of dying on it, every rank saves a complete checkpoint at the same step end and the job exits 75; this
# script then requeues the job, and the requeued job goes on from the newest complete checkpoint
# (`--resume_from_checkpoint last` is always passed: a fresh job starts from scratch, a finished one does
# nothing). Keep the save well under SIGNAL_SECONDS and TORCH_ELASTIC_SHUTDOWN_TIMEOUT.
#SBATCH --job-name=beam-sft
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=USR1@300
#SBATCH --requeue
set -euo pipefail

TRAIN_CONFIG=${1:?usage: sbatch scripts/slurm_multinode.sh CONFIG.yaml [beam-sft train overrides...]}
shift
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate/multi_node.yaml}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi -L | wc -l)}
# sed reads the whole list: `head -n 1` would close the pipe early and, under pipefail, fail the job (SIGPIPE)
MAIN_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
MAIN_PORT=${MAIN_PORT:-29500}
PYTHON=${PYTHON:-python}
# Quoted once here so overrides with spaces survive the inner bash -c.
EXTRA_ARGS=$(printf ' %q' "$@")
mkdir -p logs

# Compute nodes are often offline: read models and datasets from the local cache only.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# torchrun's agent handles these signals by sending the same one to its workers (and SIGKILL after
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds); without SIGUSR1 in the list the agent dies on Slurm's warning signal
# and takes the workers with it. Newer torch reads the list from PET_SIGNALS_TO_HANDLE (torchrun's
# --signals_to_handle) and overwrites TORCHELASTIC_SIGNALS_TO_HANDLE with it; older torch reads the latter.
export TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
export PET_SIGNALS_TO_HANDLE=$TORCHELASTIC_SIGNALS_TO_HANDLE
# Long enough for every rank to finish its step and write a checkpoint (less than --signal's 300 s).
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-280}

# srun starts one task per node; SLURM_NODEID (evaluated on each node) is that node's rank. `exec` leaves no
# shell in between (a shell would die on SIGUSR1). `beam-sft train` exits with the workers' status:
# 75 preempted (a complete checkpoint written), 65 non-finite loss, 74 disk full, 1 a failure.
status=0
srun --kill-on-bad-exit=1 bash -c "exec $PYTHON -m beam_sft.cli.train \
    --config_file $ACCELERATE_CONFIG \
    --num_machines $SLURM_NNODES \
    --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
    --machine_rank \$SLURM_NODEID \
    --main_process_ip $MAIN_HOST \
    --main_process_port $MAIN_PORT \
    --rdzv_backend c10d \
    --config $TRAIN_CONFIG$EXTRA_ARGS \
    --resume_from_checkpoint last" || status=$?

# 138 = 128 + SIGUSR1: the launcher was signalled and no worker wrote a status (e.g. still starting up, no
# checkpoint yet). Also a preemption: the requeued job starts again (beam-sft train itself returns 75 when the
# workers saved).
if [ "$status" -eq 138 ]; then
    status=75
fi
if [ "$status" -eq 75 ]; then
    echo "beam-sft: preempted at a complete checkpoint; requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
