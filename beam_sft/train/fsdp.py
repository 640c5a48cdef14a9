"""FSDP2 in the training job (docs/fsdp.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from beam_sft.storage import write_json_atomic

logger = logging.getLogger(__name__)

CPU_FSDP_ENV = "BEAM_SFT_FSDP_ON_CPU"


def allow_fsdp_on_cpu() -> bool:
    """Let accelerate apply an FSDP plugin over CPU processes (gloo) when `BEAM_SFT_FSDP_ON_CPU=1`; whether
    the opt-in is active. Call before the Trainer (hence the Accelerator) is built. Idempotent."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":  # set by accelerate launch for FSDP
        return False
    if os.environ.get(CPU_FSDP_ENV, "") not in ("1", "true", "True"):
        import torch

        if not torch.cuda.is_available():
            logger.warning("FSDP was requested (ACCELERATE_USE_FSDP) on a machine without GPUs: accelerate trains "
                           "DDP here and ignores the FSDP settings. Set %s=1 to shard over CPU processes (gloo; for "
                           "tests, see docs/fsdp.md)", CPU_FSDP_ENV)
        return False
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, "_beam_fsdp_on_cpu", False):
        return True

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is None or self.distributed_type != DistributedType.MULTI_CPU:
            return
        # What accelerate does for a multi-accelerator type (AcceleratorState.__init__), applied to MULTI_CPU.
        self.distributed_type = DistributedType.FSDP
        if self._mixed_precision != "no":
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._beam_fsdp_on_cpu = True
    AcceleratorState.__init__ = __init__
    return True


def sharding_summary(model) -> dict:
    """How `model`'s parameters are held on this rank: counts, each sharded one's shapes and placements."""
    from torch.distributed.tensor import DTensor

    params = list(model.named_parameters())
    shards = {name: {"shape": list(p.shape), "local_shape": list(p.to_local().shape),
                     "placements": [str(x) for x in p.placements], "mesh": p.device_mesh.device_type}
              for name, p in params if isinstance(p, DTensor)}
    return {"parameters": len(params), "dtensor_parameters": len(shards),
            "trainable_dtensor_parameters": sum(1 for n, p in params if n in shards and p.requires_grad),
            "local_numel": sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for _, p in params),
            "full_numel": sum(p.numel() for _, p in params), "shards": shards}


def make_sharding_report():
    """A TrainerCallback that writes `fsdp_sharding.rank<r>.json` into output_dir when training starts."""
    from transformers import TrainerCallback

    class ShardingReport(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            summary = {"rank": args.process_index, "world_size": args.world_size, **sharding_summary(model)}
            write_json_atomic(Path(args.output_dir) / f"fsdp_sharding.rank{args.process_index}.json", summary)
            if args.process_index == 0:
                logger.info("FSDP: %d of %d parameters sharded; this rank holds %d of %d elements",
                            summary["dtensor_parameters"], summary["parameters"], summary["local_numel"],
                            summary["full_numel"])

    return ShardingReport()


def save_final_model(trainer, output_dir: str) -> None:
    """`trainer.save_model(output_dir)`, except that under FSDP the full model is always gathered (every rank
    calls it: a collective) and rank 0 writes it (or the peft adapter); the tokenizer is the caller's."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        # _internal_call: no push from here; run.push uploads the directory once it is servable.
        trainer.save_model(output_dir, _internal_call=True)
        return
    import torch
    from transformers.trainer import TRAINING_ARGS_NAME

    accelerator = trainer.accelerator
    # accelerate's full state dict (FSDP2: get_model_state_dict, full_state_dict + cpu_offload): every rank takes
    # part in the all-gathers, only rank 0 keeps the tensors, in CPU memory.
    state_dict = accelerator.get_state_dict(trainer.model)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        n_tensors = len(state_dict)  # save_pretrained consumes the dict
        model.save_pretrained(output_dir, state_dict=state_dict, safe_serialization=True)
        # As Trainer._save does after a non-FSDP run, so both kinds of output directory hold the same files.
        torch.save(trainer.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
        logger.info("FSDP: full model gathered to rank 0 and saved to %s (%d tensors)", output_dir, n_tensors)
    accelerator.wait_for_everyone()
