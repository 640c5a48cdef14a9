# /// script
# dependencies = ["beam-sft", "trl>=1.16", "peft"]
# ///
"""Merge a LoRA adapter trained by scripts/train.py into its base model and save a plain checkpoint.

The adapter directory is what `train.py --use_peft true` saved (adapter + tokenizer with both Beam templates);
the merged output has the full weights (expert adapters included: peft merges `target_parameters` adapters into
the fused expert tensors) and the adapter directory's tokenizer.

# Merge a LoRA run of the quickstart-sized gpt-oss model
```bash
python scripts/merge_lora.py --adapter_path outputs/beam-moe-lora --output_dir outputs/beam-moe-merged
```

# An MXFP4 gpt-oss base: dequantize to bf16 first (the merged model is saved in bf16, not re-quantized)
```bash
python scripts/merge_lora.py --adapter_path outputs/beam-moe-lora --base_model_name_or_path openai/gpt-oss-20b \
    --mxfp4_dequantize true --dtype bfloat16 --output_dir outputs/beam-moe-merged
```
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass
class MergeArguments:
    adapter_path: str = field(metadata={"help": "Directory of the trained adapter (train.py's output_dir)."})
    output_dir: str = field(metadata={"help": "Where to write the merged model and the tokenizer."})
    base_model_name_or_path: str | None = field(
        default=None, metadata={"help": "Base model; default: the one recorded in the adapter's config."}
    )
    dtype: str = field(default="auto", metadata={"help": "Load (and save) dtype: auto, bfloat16, float32, ..."})
    mxfp4_dequantize: bool = field(
        default=False, metadata={"help": "The base is an MXFP4 checkpoint (gpt-oss): load it dequantized."}
    )


def main(args: MergeArguments) -> Path:
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.model.moe import count_expert_adapters, mxfp4_dequantize_config
    from beam_sft.serve.servable import make_servable
    from beam_sft.template.tokenizer import save_tokenizer

    peft_config = PeftConfig.from_pretrained(args.adapter_path)
    base = args.base_model_name_or_path or peft_config.base_model_name_or_path
    kwargs = {"dtype": args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)}
    if args.mxfp4_dequantize:
        kwargs["quantization_config"] = mxfp4_dequantize_config()
    model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(args.adapter_path)
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    model = PeftModel.from_pretrained(model, args.adapter_path)
    experts = count_expert_adapters(model)
    merged = model.merge_and_unload()
    merged.save_pretrained(args.output_dir)
    save_tokenizer(tokenizer, args.output_dir)
    make_servable(args.output_dir, tokenizer)  # EOS lists, serving-form template, file modes
    print(f"merged {args.adapter_path} into {base} ({experts} expert adapters) -> {args.output_dir}")
    return Path(args.output_dir)


def make_parser(prog: str | None = None):
    from trl import TrlParser

    return TrlParser((MergeArguments,), prog=prog, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    (merge_args,) = make_parser().parse_args_and_config()
    main(merge_args)
