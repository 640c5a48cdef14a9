"""Mixture-of-Experts fine-tuning: LoRA on the fused expert tensors, the router left alone, checked after
injection. See docs/training.md#gpt-oss-shaped-models-exact-packing-moe-lora-router-loss."""

from __future__ import annotations

import logging

from beam_sft.errors import FatalError, UsageError

logger = logging.getLogger(__name__)


def _num_experts(module) -> int | None:
    for attr in ("num_experts", "num_local_experts"):
        if isinstance(getattr(module, attr, None), int):
            return getattr(module, attr)
    try:
        return len(module)  # an nn.ModuleList of per-expert MLPs
    except TypeError:
        return None


def moe_blocks(model):
    """(name, block, experts) for every module with an `experts` child."""
    for name, module in model.named_modules():
        experts = getattr(module, "experts", None)
        if experts is not None and hasattr(experts, "parameters"):
            yield name, module, experts


def expert_parameter_names(model) -> list[str]:
    """Suffixes (e.g. `mlp.experts.gate_up_proj`) of the fused 3D weight tensors of the experts, for peft."""
    names = set()
    for name, _, experts in moe_blocks(model):
        for param_name, param in experts.named_parameters(recurse=False):
            if param.ndim == 3:
                # Relative to the decoder layer, so one entry covers every layer.
                block = name.rsplit(".", 1)[-1] if "." in name else name
                names.add(f"{block}.experts.{param_name}")
    return sorted(names)


def router_module_names(model) -> list[str]:
    """Full names of the routers: children of an MoE block whose weight maps hidden states to one logit per
    expert (transformers 5's are not `nn.Linear`; all-linear would adapt older and remote-code ones)."""
    routers = []
    for name, block, experts in moe_blocks(model):
        n = _num_experts(experts)
        for child_name, child in block.named_children():
            weight = getattr(child, "weight", None)
            if child is experts or n is None or not hasattr(weight, "ndim") or weight.ndim != 2:
                continue
            if weight.shape[0] == n:
                routers.append(f"{name}.{child_name}" if name else child_name)
    return routers


def build_peft_config(model_args, model, target_experts: bool = False):
    """TRL's LoRA config from ModelConfig, routers excluded, expert tensors added when `target_experts`."""
    from trl import get_peft_config

    peft_config = get_peft_config(model_args)
    if peft_config is None:
        if target_experts:
            raise UsageError("lora_target_experts needs use_peft: true")
        return None
    routers = router_module_names(model)
    if routers and isinstance(peft_config.exclude_modules, str):
        logger.warning("exclude_modules is a regex; routers %s are not added to it", routers[:2])
    elif routers:
        peft_config.exclude_modules = sorted(set(peft_config.exclude_modules or []) | set(routers))
        logger.info("LoRA: %d router(s) kept out of the adapters (e.g. %s)", len(routers), routers[0])
    if target_experts:
        experts = expert_parameter_names(model)
        if not experts:
            raise UsageError(f"lora_target_experts: {type(model).__name__} has no fused expert tensors (3D parameters "
                             "under an `experts` module); its experts, if any, are nn.Linear and lora_target_modules "
                             "reaches them")
        peft_config.target_parameters = sorted(set(peft_config.target_parameters or []) | set(experts))
        if peft_config.lora_dropout:
            logger.warning("LoRA on expert tensors: lora_dropout %.3g -> 0 (peft's ParamWrapper cannot apply dropout "
                           "to a weight delta; this applies to every adapter of the config)", peft_config.lora_dropout)
            peft_config.lora_dropout = 0.0
        logger.info("LoRA: expert tensors targeted: %s", ", ".join(experts))
    return peft_config


def count_expert_adapters(model) -> int:
    """How many LoRA adapters sit on fused expert tensors (peft `ParamWrapper`s) in `model`."""
    from peft.tuners.lora.layer import ParamWrapper

    return sum(1 for m in model.modules() if isinstance(m, ParamWrapper) and m.lora_A)


def check_expert_adapters(model, wanted: bool) -> int:
    """Count expert adapters after injection; FatalError if `wanted` and there are none. Returns the count."""
    n = count_expert_adapters(model)
    if wanted and n == 0:
        raise FatalError("lora_target_experts was set but no LoRA adapter sits on an expert tensor after injection: "
                         "the run would train attention only")
    if n:
        trainable = sum(p.numel() for name, p in model.named_parameters() if p.requires_grad and ".experts." in name)
        logger.info("LoRA: %d adapters on expert tensors, %d trainable expert-adapter parameters", n, trainable)
    return n


def mxfp4_dequantize_config():
    """The quantization config that loads an MXFP4 checkpoint (gpt-oss) dequantized, so it can be trained."""
    from transformers import Mxfp4Config

    return Mxfp4Config(dequantize=True)
