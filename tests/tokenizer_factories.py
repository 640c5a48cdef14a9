"""Tokenizers of other families, built from scratch in-process (no hub), for beamify and check-template tests.

Each mirrors the pipeline of a real family closely enough to hit its pitfalls:

* `gpt2_like`: byte-level BPE with GPT-2's offset trimming, `<|endoftext|>` as EOS, no pad.
* `sentencepiece_like`: Unigram with a Metaspace pre-tokenizer that prepends "▁" to every segment and a
  BOS-adding post-processor (T5/older SentencePiece conversions).
* `llama_like`: Llama-2's BPE with byte fallback, `Prepend("▁")` normaliser and `Strip` decoder, wrapped in
  LlamaTokenizerFast.
* `gpt_oss_like`: byte-level BPE that already has the seven markers, all special (as gpt-oss ships them).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from beam_sft.template.conformance import ODD_TEXT
from beam_sft.template.tokenizer import MARKERS

REPO = Path(__file__).resolve().parents[1]
VOCAB = 1200


@cache
def _texts() -> tuple[str, ...]:
    spec = (REPO / "data" / "tokenizer_corpus" / "beam-harmony-format.md").read_text(encoding="utf-8")
    # The odd characters the conformance fixtures use, so vocabularies without byte fallback cover them.
    return (spec, ODD_TEXT * 3, "Compare London and Paris. And 3 + 3? 14 C, cloudy. 18 C, sunny. 6")


def gpt2_like():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GPT2TokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    backend.train_from_iterator(_texts(), trainer=trainer)
    return GPT2TokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def sentencepiece_like():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(_texts(), trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def llama_like():
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import LlamaTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    backend.train_from_iterator(_texts(), trainer=trainer)
    # Byte-fallback pieces are ordinary vocabulary entries in Llama (not added tokens), so
    # skip_special_tokens keeps them.
    state = json.loads(backend.to_str())
    vocab = state["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    backend = Tokenizer.from_str(json.dumps(state))
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    return LlamaTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def gpt_oss_like():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator(_texts(), trainer=trainer)
    backend.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    backend.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[m for m in MARKERS if m != "<|return|>"],
    )


def script_module(name: str):
    """scripts/NAME.py as a module, loaded once (scripts/ on sys.path: they import each other)."""
    import importlib.util
    import sys

    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass in it resolves annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules[name]


FACTORIES = {
    "gpt2_like": gpt2_like,
    "sentencepiece_like": sentencepiece_like,
    "llama_like": llama_like,
    "gpt_oss_like": gpt_oss_like,
}


def o200k_script():
    """scripts/build_o200k_tokenizer.py as a module (the real-vocabulary build; conftest's `o200k_dir`)."""
    return script_module("build_o200k_tokenizer")


def tiny_causal_lm(vocab_size: int, *, tie_word_embeddings: bool = False, seed: int = 0):
    """A 2-layer Llama with hidden size 32: random weights, fast on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
    )
    return LlamaForCausalLM(config)


def base_tokenizer_script():
    """scripts/build_base_tokenizer.py as a module (beamified Qwen3 / Llama 3 vocabularies from quicktok-v1)."""
    o200k_script()  # it imports build_o200k_tokenizer
    return script_module("build_base_tokenizer")


def tiktoken_like_state(tokens: list[bytes], *, normalizer: dict | None = None, ignore_merges: bool = True) -> dict:
    """The serialised backend of a tiny byte-level BPE as transformers' TikTokenConverter writes one: the 256
    bytes then `tokens` as ranks, in that order; merges derived from the ranks (every split of a token into two
    tokens, by the token's rank, then the halves'); Qwen's split pattern. Load it with `Tokenizer.from_str`."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from beam_sft.render.tiktoken_backend import QWEN_PATTERN

    chars = bytes_to_unicode()
    ranks = {bytes([b]): b for b in range(256)}
    for token in tokens:
        ranks.setdefault(token, len(ranks))
    merges = sorted(
        (rank, ranks[t[:cut]], ranks[t[cut:]], t[:cut], t[cut:])
        for t, rank in ranks.items() for cut in range(1, len(t)) if t[:cut] in ranks and t[cut:] in ranks
    )

    def text(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": {text(t): r for t, r in ranks.items()},
                  "merges": [[text(m[3]), text(m[4])] for m in merges]},
    }
