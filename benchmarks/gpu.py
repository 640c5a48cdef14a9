"""One-GPU training throughput: a ~0.5B randomly initialised Qwen2-shaped model, bf16, packed vs padded.

The data is `benchmarks/data.py`'s generated Beam workload (multi-turn, reasoning, tool calls), encoded with
beam-sft's own masked encoder, so labels carry the assistant masks as in real training. Two modes, same model
and optimizer, each for `--warmup_steps` untimed and `--steps` timed optimizer steps:

* padded: `--padded_batch` conversations per step, right-padded to the longest, with an attention mask;
* packed: `--packed_rows` rows of `--max_length` tokens, conversations packed best-fit-decreasing, no
  padding, `position_ids` restarting at every conversation (transformers turns them into a block-diagonal
  causal mask, or varlen kernels with flash attention).

It reports real (non-pad) tokens/s, MFU = 6 * N * real tokens/s / peak FLOP/s (N = parameters, the tied
embedding counted once as the LM head), the same with attention FLOPs added, and peak GPU memory
(`torch.cuda.max_memory_allocated`). Pass the peak of your GPU with `--peak_tflops` (default 989: H100/H200
SXM dense bf16).

```bash
python -m benchmarks gpu --json outputs/bench_gpu.json               # one GPU, ~2 minutes
python -m benchmarks gpu --attn sdpa --padded_batch 8                 # 80 GB cards; sdpa even with flash-attn
python -m benchmarks gpu --device cpu --tiny                          # smoke test, seconds, no GPU
```
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(REPO_DIR / "scripts"))  # make_samples.py, which the workload (benchmarks/rows) reads

# Qwen2.5-0.5B's shape (494M parameters with its 151,936-token vocabulary; the bundled tokenizer's ids all
# fit in it, and the full-size LM head keeps the FLOP mix of the real model).
QWEN2_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "use_cache": False,
}
TINY = {**QWEN2_05B, "vocab_size": 6016, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
IGNORE_INDEX = -100


def prepare_examples(n: int, max_length: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of `n` generated conversations, cut to `max_length`, in random order."""
    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.template.tokenizer import load_tokenizer
    from benchmarks.rows.workload import make_workload

    tokenizer = load_tokenizer()
    encoder = MaskedEncoder(tokenizer)
    records = make_workload(n, seed)
    examples = []
    for start in range(0, n, 512):
        for enc in encoder.encode(records[start:start + 512], max_length):
            ids = enc["input_ids"]
            labels = [t if m else IGNORE_INDEX for t, m in zip(ids, enc["assistant_masks"], strict=True)]
            examples.append((ids, labels))
    random.Random(seed).shuffle(examples)
    return examples


def pack_bfd(examples: list[tuple[list[int], list[int]]], max_length: int) -> list[list[int]]:
    """Best-fit decreasing: indices of `examples` per bin of at most `max_length` tokens."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]), reverse=True)
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        size = len(examples[i][0])
        best = -1
        for b, free in enumerate(room):
            if size <= free and (best < 0 or free < room[best]):
                best = b
        if best < 0:
            bins.append([i])
            room.append(max_length - size)
        else:
            bins[best].append(i)
            room[best] -= size
    return bins


def padded_batches(examples, batch: int, pad_id: int):
    import torch

    for start in range(0, len(examples) - batch + 1, batch):
        chunk = examples[start:start + batch]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
        labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, (ids, lab) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            attention[row, : len(ids)] = 1
        yield {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def packed_batches(examples, rows: int, max_length: int, pad_id: int, seed: int = 0):
    """Rows of packed conversations; `position_ids` restart per conversation. A row's unused tail (when
    the bins are not full) is padding with its own positions and ignored labels, counted as not real."""
    import torch

    bins = pack_bfd(examples, max_length)
    # BFD fills its first bins best; a trainer shuffles packs, and the timed steps must not see only those.
    random.Random(seed).shuffle(bins)
    for start in range(0, len(bins) - rows + 1, rows):
        input_ids = torch.full((rows, max_length), pad_id, dtype=torch.long)
        labels = torch.full((rows, max_length), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((rows, max_length), dtype=torch.long)
        real = 0
        for row, members in enumerate(bins[start:start + rows]):
            at = 0
            for i in members:
                ids, lab = examples[i]
                n = len(ids)
                input_ids[row, at:at + n] = torch.tensor(ids)
                labels[row, at:at + n] = torch.tensor(lab)
                # The first label of each conversation would be predicted from the previous one: ignore it.
                labels[row, at] = IGNORE_INDEX
                positions[row, at:at + n] = torch.arange(n)
                at += n
            positions[row, at:] = torch.arange(max_length - at)
            real += at
        yield {"input_ids": input_ids, "labels": labels, "position_ids": positions, "real": real}


def count_params(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def run_mode(model, batches, *, steps: int, warmup: int, device, dtype, lr: float) -> dict:
    import torch

    is_cuda = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=is_cuda)
    model.train()
    if is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    real = positions = 0
    seq_sq = 0  # sum over rows of (attended length)^2, for the attention FLOPs
    start = None
    done = 0
    losses = []
    for step, batch in enumerate(batches):
        if step == warmup:
            if is_cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        batch_real = batch.pop("real", None)
        inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= warmup:
            ids = batch["input_ids"]
            if "attention_mask" in batch:
                lengths = batch["attention_mask"].sum(dim=1)
                real += int(lengths.sum())
                seq_sq += int((lengths.float() ** 2).sum())  # flash/varlen would skip the padding
            else:
                real += int(batch_real)
                pos = batch["position_ids"]
                starts = (pos == 0).nonzero()
                for row in range(ids.shape[0]):
                    idx = starts[starts[:, 0] == row][:, 1].tolist() + [ids.shape[1]]
                    seq_sq += sum((b - a) ** 2 for a, b in itertools.pairwise(idx))
            positions += ids.numel()
            done += 1
            losses.append(loss.detach())
        if done == steps:
            break
    if is_cuda:
        torch.cuda.synchronize(device)
    if start is None or done < steps:
        raise RuntimeError(f"not enough data for {warmup} + {steps} steps (got {step + 1}); raise --conversations")
    seconds = time.perf_counter() - start
    return {
        "steps": done,
        "seconds": seconds,
        "real_tokens": real,
        "positions": positions,
        "tokens_per_s": real / seconds,
        "positions_per_s": positions / seconds,
        "real_token_fraction": real / positions,
        "seq_sq": seq_sq,
        "final_loss": float(losses[-1]),
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if is_cuda else None,
    }


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks gpu",
        description="Training throughput of a ~0.5B random Qwen2-shaped model on one GPU: tokens/s, MFU and peak "
                    "memory, packed vs padded.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy model and a few steps (smoke test)")
    parser.add_argument("--config", help="a model config.json to use instead of the built-in Qwen2.5-0.5B shape")
    parser.add_argument("--attn", default="auto",
                        help="attn_implementation: sdpa, flash_attention_2, eager, or auto (flash_attention_2 when "
                             "flash-attn is installed and the device is a GPU, else sdpa)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="autocast dtype")
    parser.add_argument("--max_length", type=int, default=4096, help="pack size and truncation length")
    parser.add_argument("--packed_rows", type=int, default=4, help="packed rows of max_length per step")
    parser.add_argument("--padded_batch", type=int, default=16, help="conversations per padded step")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per mode")
    parser.add_argument("--warmup_steps", type=int, default=5, help="untimed steps per mode")
    parser.add_argument("--conversations", type=int, help="generated conversations (default: enough for the steps)")
    parser.add_argument("--peak_tflops", type=float, default=989.0,
                        help="the device's dense peak TFLOP/s at --dtype (H100/H200 SXM bf16: 989)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    return parser


def _model_config(args, tokenizer):
    """The model's config: --config, else the tiny or Qwen2.5-0.5B shape; it must cover the tokenizer."""
    from transformers import AutoConfig

    if args.config:
        config = AutoConfig.from_pretrained(args.config)
    else:
        spec = dict(TINY if args.tiny else QWEN2_05B)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    if config.vocab_size < len(tokenizer):
        raise SystemExit(f"error: config vocab_size {config.vocab_size} < tokenizer size {len(tokenizer)}")
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    return config


def print_table(results: dict, args) -> None:
    print(f"| {results['device']}, {args.attn}, {args.dtype}, max_length {args.max_length} "
          "| real tokens/s | real-token fraction | MFU | MFU incl. attention | peak memory |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in ("padded", "packed"):
        r = results[mode]
        memory = f"{r['peak_memory_gb']:.1f} GiB" if r["peak_memory_gb"] is not None else "-"
        print(f"| {mode} ({r['params'] / 1e6:.0f}M params, {r['steps']} steps) | {r['tokens_per_s']:,.0f} | "
              f"{100 * r['real_token_fraction']:.1f}% | {100 * r['mfu']:.1f}% | {100 * r['mfu_with_attention']:.1f}% "
              f"| {memory} |")
    print(f"packed / padded real tokens/s: {results['packed_vs_padded_tokens_per_s']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.tiny:
        args.max_length = min(args.max_length, 1024)
        args.packed_rows, args.padded_batch = min(args.packed_rows, 2), min(args.padded_batch, 2)
        args.steps, args.warmup_steps = min(args.steps, 3), min(args.warmup_steps, 1)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from beam_sft.template.tokenizer import load_tokenizer

    transformers.logging.set_verbosity_error()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; use --device cpu --tiny for a smoke run")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.attn == "auto":
        has_flash = importlib.util.find_spec("flash_attn") is not None
        args.attn = "flash_attention_2" if device.type == "cuda" and has_flash else "sdpa"
    tokenizer = load_tokenizer()
    config = _model_config(args, tokenizer)

    # Enough conversations for both modes: ~1,000 tokens each on average in this workload.
    steps_total = args.steps + args.warmup_steps
    n = args.conversations or max(steps_total * args.padded_batch,
                                  int(steps_total * args.packed_rows * args.max_length / 800)) + 64
    t0 = time.perf_counter()
    examples = prepare_examples(n, args.max_length, args.seed)
    prep_s = time.perf_counter() - t0

    results: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "attn": args.attn,
        "dtype": args.dtype, "max_length": args.max_length, "conversations": n, "prepare_s": prep_s,
        "peak_tflops": args.peak_tflops,
        "packed_bin_fill": sum(len(ids) for ids, _ in examples) / (len(pack_bfd(examples, args.max_length))
                                                                   * args.max_length),
    }
    for mode in ("padded", "packed"):
        torch.manual_seed(args.seed)
        with device:  # initialise on the device: a 0.5B random init on CPU takes longer than the benchmark
            model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        n_params = count_params(model)
        if mode == "padded":
            batches = padded_batches(examples, args.padded_batch, tokenizer.pad_token_id)
        else:
            batches = packed_batches(examples, args.packed_rows, args.max_length, tokenizer.pad_token_id, args.seed)
        print(f"[bench_gpu] {mode}: {n_params / 1e6:.0f}M parameters, {args.warmup_steps}+{args.steps} steps",
              file=sys.stderr, flush=True)
        r = run_mode(model, batches, steps=args.steps, warmup=args.warmup_steps, device=device, dtype=dtype,
                     lr=args.lr)
        # Training FLOPs: 6N per token for the weights, plus attention's QK^T and AV (fwd 4*L*d*s per token
        # for a sequence of length s; causal halves it; x3 for fwd+bwd): 6*L*d*sum(s^2) over sequences.
        attn_flops = 6 * config.num_hidden_layers * config.hidden_size * r.pop("seq_sq")
        peak = args.peak_tflops * 1e12
        r["params"] = n_params
        r["mfu"] = 6 * n_params * r["tokens_per_s"] / peak
        r["mfu_with_attention"] = (6 * n_params * r["real_tokens"] + attn_flops) / r["seconds"] / peak
        results[mode] = r
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["packed_vs_padded_tokens_per_s"] = results["packed"]["tokens_per_s"] / results["padded"]["tokens_per_s"]

    print_table(results, args)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
