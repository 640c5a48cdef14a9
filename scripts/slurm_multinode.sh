#!/usr/bin/env bash
# Multi-node fine-tuning on Slurm: one `accelerate launch` per node, each starting one process per GPU.
#
#   sbatch --nodes 2 scripts/slurm_multinode.sh configs/beam_full.yaml --model_name_or_path $BEAM_MODEL_ID
#
# The first argument is the training config; the rest go to scripts/train.py as overrides. Set
# ACCELERATE_CONFIG to use FSDP2 (configs/accelerate/fsdp2.yaml) instead of DDP. Run from the repo root.
#SBATCH --job-name=beam-sft
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
set -euo pipefail

TRAIN_CONFIG=${1:?usage: sbatch scripts/slurm_multinode.sh CONFIG.yaml [train.py overrides...]}
shift
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate/multi_node.yaml}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi -L | wc -l)}
MAIN_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MAIN_PORT=${MAIN_PORT:-29500}
# Quoted once here so overrides with spaces survive the inner bash -c.
EXTRA_ARGS=$(printf ' %q' "$@")
mkdir -p logs

# Compute nodes are often offline: read models and datasets from the local cache only.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# srun starts one task per node; SLURM_NODEID (evaluated on each node) is that node's rank.
srun --kill-on-bad-exit=1 bash -c "accelerate launch \
    --config_file $ACCELERATE_CONFIG \
    --num_machines $SLURM_NNODES \
    --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
    --machine_rank \$SLURM_NODEID \
    --main_process_ip $MAIN_HOST \
    --main_process_port $MAIN_PORT \
    --rdzv_backend c10d \
    scripts/train.py --config $TRAIN_CONFIG$EXTRA_ARGS"
