# /// script
# dependencies = ["beam-sft", "trl>=1.16", "peft", "tensorboard"]
# ///
"""Supervised fine-tuning on Beam Harmony data with TRL's SFTTrainer, loss on assistant turns only.

Data: Beam records written by `convert-dataset` (.jsonl / .parquet / a directory / a `save_to_disk`
dataset / a hub id), or raw OpenAI, ShareGPT or Harmony files, converted on the fly by the same converters
(`--dataset_format auto|beam|openai|sharegpt|harmony|hermes|glaive|xlam`). Masks come from the chat template's generation
block; records longer than `--max_length` follow `--truncation_policy` (turn | drop | keep_start, see
beam_sft/dataset/examples.py), and every cut is counted in the log. The data phase is `beam_sft.dataset.prepare`: converted
and tokenized once per job (main process first) into memory-mapped Arrow, cached by fingerprint
(`--prepared_cache_dir`), every reject in `output_dir/rejects.jsonl`; or a directory from `beam-sft prepare`.
With packing on, the model is probed for attention across packed records before training and given explicit
masks or refused (beam_sft/train/packing.py). The options are `beam_sft/train/config.py`; the model sources
`beam_sft/model/load.py`; the steps around the trainer `beam_sft/train/run.py`.

# Quickstart: the embedded tiny random model and the bundled tokenizer, on CPU (about 100 s for 12 epochs).
# Its data is what `python scripts/quickstart.py` converts into outputs/quickstart/data/train.jsonl.
```bash
python scripts/train.py --config configs/quickstart.yaml
```

# Same, as two gloo processes on one machine (DDP on CPU)
```bash
accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train.py \
    --config configs/quickstart.yaml --output_dir outputs/quickstart-ddp
```

# FSDP2 on two CPU processes (gloo): test-only path, accelerate alone would train DDP (docs/fsdp.md)
```bash
BEAM_SFT_FSDP_ON_CPU=1 accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 \
    --mixed_precision no scripts/train.py --config configs/quickstart.yaml --output_dir outputs/quickstart-fsdp2 \
    --per_device_train_batch_size 4
```

# Full fine-tuning of a Beam checkpoint on converted data, 8 GPUs
```bash
convert-dataset data/samples/openai.jsonl -o data/converted/train.jsonl
accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train.py \
    --config configs/beam_full.yaml --model_name_or_path $BEAM_MODEL_ID --dataset_name data/converted/train.jsonl
```

# LoRA on a Beam checkpoint, straight from a raw ShareGPT file
```bash
python scripts/train.py --config configs/beam_lora.yaml --model_name_or_path $BEAM_MODEL_ID \
    --dataset_name data/samples/sharegpt.json --dataset_format sharegpt
```

# LoRA on a gpt-oss-shaped Beam checkpoint: attention + fused expert tensors, router loss, packing probed
# (add --mxfp4_dequantize true for an MXFP4 checkpoint; merge with scripts/merge_lora.py)
```bash
python scripts/train.py --config configs/beam_moe_lora.yaml --model_name_or_path $BEAM_MODEL_ID
```

# Any other base model: add the markers and both templates first (--beamify)
```bash
python scripts/train.py --config configs/beam_lora.yaml --model_name_or_path Qwen/Qwen2.5-0.5B --beamify
```

# Tokenize once with `beam-sft prepare`, then train on every node from shared storage without tokenizing
```bash
beam-sft prepare data/samples/openai.jsonl -o /shared/prepared --max_length 1024
accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train.py \
    --config configs/quickstart.yaml --dataset_name /shared/prepared --dataset_format auto
```

# Data larger than the disk: convert and tokenize on the fly (needs max_steps)
```bash
python scripts/train.py --config configs/quickstart.yaml --dataset_name data/samples/openai.jsonl \
    --dataset_format auto --streaming true --max_steps 50 --packing true
```

# Resume after a crash (same output_dir; same data order, same final step)
```bash
python scripts/train.py --config configs/quickstart.yaml --resume_from_checkpoint last
```
"""

from __future__ import annotations

import sys
from pathlib import Path

# Runnable as `python scripts/train.py` from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# The job itself lives in the package: `beam-sft train` runs the same main.
from beam_sft.train.sft import main, make_parser

__all__ = ["main", "make_parser"]


if __name__ == "__main__":
    from beam_sft.cli import run_guarded

    sys.exit(run_guarded(lambda _: main(*make_parser(prog="train.py").parse_args_and_config()) and 0, None))
