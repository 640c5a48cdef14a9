"""Generation backends: greedy decoding that stops at `<|return|>` or `<|call|>` (transformers or vLLM)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beam_sft.errors import UsageError
from beam_sft.records.messages import STOP_MARKERS

BACKENDS = ("transformers", "vllm", "openai")  # openai: beam_sft.eval.openai_backend


@dataclass
class Generation:
    text: str  # decoded output, stop token included, special tokens kept
    n_tokens: int
    stop: str | None  # "<|return|>" / "<|call|>", or None when cut at max_new_tokens
    # A served turn (beam_sft.eval.openai_backend) comes back parsed by the server's parsers, or refused.
    parsed: dict[str, Any] | None = None
    error: str = ""
    finish_reason: str | None = None
    raw: str | None = None  # the generated tokens decoded, markers kept, when the server returned them


def generate_sorted(backend, turns: Sequence[Any]) -> tuple[list[tuple[Any, Generation]], float]:
    """([(turn, generation)] sorted by prompt length (a batch pads little), the seconds it took)."""
    if not turns:  # a chunk of records with no assistant turn to prompt
        return [], 0.0
    turns = sorted(turns, key=lambda t: len(t.prompt))
    start = time.perf_counter()
    generations = (backend.generate_turns(turns) if hasattr(backend, "generate_turns")
                   else backend.generate([t.prompt for t in turns]))
    return list(zip(turns, generations, strict=True)), time.perf_counter() - start


def stop_ids(tokenizer) -> dict[int, str]:
    """{token id: marker} of `<|return|>` and `<|call|>` (each must be one token)."""
    from beam_sft.template.tokenizer import stop_token_ids

    return dict(zip(stop_token_ids(tokenizer), STOP_MARKERS, strict=True))


def eos_stops(tokenizer) -> dict[int, str]:
    """{token id: token} of the EOS (one id or a list) of a model that does not speak Beam."""
    ids = tokenizer.eos_token_id
    if not (ids := [ids] if isinstance(ids, int) else list(ids or [])):
        raise UsageError("the tokenizer has no EOS token: generation could not stop")
    return {i: tokenizer.convert_ids_to_tokens(i) for i in ids}


def _finish(tokenizer, ids: Sequence[int], stops: dict[int, str]) -> Generation:
    """Cut generated ids after the first stop token (what follows in a batch is padding) and decode."""
    ids = list(ids)
    end = next((k for k, token in enumerate(ids) if token in stops), None)
    ids = ids if end is None else ids[: end + 1]
    return Generation(tokenizer.decode(ids, skip_special_tokens=False), len(ids), stops.get(ids[-1]) if ids else None)


class TransformersBackend:
    """`model.generate`, greedy, batched with left padding, stopping at `<|return|>` / `<|call|>`."""

    name = "transformers"

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 256, batch_size: int = 8,
                 synced_gpus: bool = False, stops: dict[int, str] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        # A sharded model (FSDP) all-gathers its parameters in every forward: every rank must step until all
        # ranks' sequences are done (transformers' `synced_gpus`, what it does itself for ZeRO-3).
        self.synced_gpus = synced_gpus
        # `stops`: a model that does not speak Beam (`beam-sft eval --bfcl-style prompt`) stops at its own EOS.
        self.stops = stop_ids(tokenizer) if stops is None else stops
        if tokenizer.pad_token_id is None:
            raise UsageError("the tokenizer has no pad token; batched generation needs one (beamify adds <|pad|>)")

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        import torch

        model, tok = self.model, self.tokenizer
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        side = tok.padding_side
        tok.padding_side = "left"  # new tokens must follow each prompt directly
        # MoE models trained with the router loss keep output_router_logits on in their config; generation
        # needs no router loss, and transformers' aux-loss code fails on left-padded batches with a cache.
        if router_logits := getattr(model.config, "output_router_logits", None):
            model.config.output_router_logits = False
        out: list[Generation] = []
        try:
            for start in range(0, len(prompts), self.batch_size):
                batch = tok(list(prompts[start : start + self.batch_size]), add_special_tokens=False,
                            padding=True, return_tensors="pt").to(device)
                # no_grad, not inference_mode, for a sharded model: FSDP writes its gathered parameters into
                # buffers that training uses again.
                with torch.no_grad() if self.synced_gpus else torch.inference_mode():
                    ids = model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=False, temperature=None,
                                         top_p=None, top_k=None, eos_token_id=list(self.stops),
                                         pad_token_id=tok.pad_token_id, use_cache=True,
                                         **({"synced_gpus": True} if self.synced_gpus else {}))
                width = batch["input_ids"].shape[1]
                out.extend(_finish(tok, row[width:].tolist(), self.stops) for row in ids)
        finally:
            tok.padding_side = side
            model.train(was_training)
            if router_logits:
                model.config.output_router_logits = router_logits
        return out


class ShardedBackend:
    """Another backend's generation split across the ranks of a `torch.distributed` group, gathered on every
    rank. A short share is padded with the first prompt: a sharded model's forwards are collectives."""

    def __init__(self, backend, rank: int, world_size: int):
        self.backend, self.rank, self.world_size = backend, rank, world_size
        self.name = getattr(backend, "name", type(backend).__name__)

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        import torch.distributed as dist

        if not prompts:
            return []
        share = list(prompts[self.rank :: self.world_size])
        per_rank = -(-len(prompts) // self.world_size)
        mine = self.backend.generate(share + [prompts[0]] * (per_rank - len(share)))[: len(share)]
        gathered: list[list[Generation] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        out: list[Generation | None] = [None] * len(prompts)
        for rank, generations in enumerate(gathered):
            out[rank :: self.world_size] = generations
        return out


class VLLMBackend:
    """vLLM (needs a CUDA GPU), decoding as `TransformersBackend` does: the parser reads the same text."""

    name = "vllm"

    def __init__(self, model: str, tokenizer, *, max_new_tokens: int = 256, adapter: str | None = None,
                 tokenizer_path: str | None = None, stops: dict[int, str] | None = None):
        try:
            import torch
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise UsageError("--backend vllm: vLLM is not installed (pip install 'beam-sft[vllm]')") from err
        if not torch.cuda.is_available():
            raise UsageError("--backend vllm needs a CUDA GPU; use --backend transformers on CPU")
        self.tokenizer = tokenizer
        self.stops = stop_ids(tokenizer) if stops is None else stops
        lora_rank, self.lora = {}, None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            config = Path(adapter) / "adapter_config.json"
            # vLLM refuses adapters above max_lora_rank (16 by default); configs/beam_lora.yaml uses r=32.
            rank = json.loads(config.read_text()).get("r", 16) if config.is_file() else 16
            lora_rank = {"max_lora_rank": max(16, int(rank))}
            self.lora = LoRARequest("beam-eval-adapter", 1, adapter)
        self.llm = LLM(model=model, tokenizer=tokenizer_path or model, enable_lora=adapter is not None,
                       seed=0, **lora_rank)
        # detokenize=False: decoded here, by the HF tokenizer, like the transformers backend
        self.params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(self.stops),
                                     skip_special_tokens=False, detokenize=False)

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=self.tokenizer(p, add_special_tokens=False)["input_ids"])
                  for p in prompts]
        outputs = self.llm.generate(inputs, self.params, lora_request=self.lora, use_tqdm=False)
        result = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            # vLLM reports which stop id ended the sequence (None for the model's EOS, <|return|>); make sure
            # it is in the ids we decode, whether or not vLLM kept it in token_ids.
            if completion.finish_reason == "stop" and (not ids or ids[-1] not in self.stops):
                stop_id = completion.stop_reason if isinstance(completion.stop_reason, int) else None
                if stop_id is None and completion.stop_reason is None:
                    stop_id = self.tokenizer.eos_token_id
                if stop_id is not None:
                    ids.append(stop_id)
            result.append(_finish(self.tokenizer, ids, self.stops))
        return result
