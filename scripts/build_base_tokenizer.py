"""Build a beamified Qwen3 (151,669 ids) or Llama 3 (128,256 ids) tokenizer offline, for tests and benchmarks.

The base models people beamify are byte-level BPE tokenizers whose merges follow their ranks. The registry
package `quicktok-v1` (a dev dependency) bundles both rank files (`quicktok/data/{qwen3,llama3}.vocab`, and
their added tokens in `.special`); this script turns them into Hugging Face tokenizers as the models ship
them, then beamifies them (`beam_sft.model.beamify.beamify`) and saves them:

* llama3: transformers' `TikTokenConverter` with Llama 3's split pattern (digits in runs of 1-3), the 256
  added tokens at 128000-128255 (`<|begin_of_text|>` ...), no normalizer, `ignore_merges` on: Llama 3's
  own tokenizer.json was made by that converter;
* qwen3: the same conversion with Qwen's pattern (one digit per pre-token) and its 26 added tokens at
  151643-151668, then what Qwen's tokenizer.json has on top: an NFC normalizer and `ignore_merges` off.

A real checkpoint ships its own tokenizer; these stand in for it where the hub is out of reach. The
`tokenizer.json` written is checked to give quicktok's own ids on the real samples and the format page.

```bash
python scripts/build_base_tokenizer.py llama3 --output_dir /tmp/llama3-beam
python scripts/build_base_tokenizer.py qwen3 --output_dir /tmp/qwen3-beam
beam-sft check-template /tmp/llama3-beam
```
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from build_o200k_tokenizer import read_quicktok_vocab, tiktoken_bytes, verification_texts
from build_tokenizer import staging_dir, swap_in

LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
MODELS = {
    # name: (pattern, vocabulary size with added tokens, bos, eos, pad, Qwen's normalizer and merges)
    "llama3": (LLAMA3_PATTERN, 128_256, "<|begin_of_text|>", "<|eot_id|>", "<|finetune_right_pad_id|>", False),
    "qwen3": (QWEN_PATTERN, 151_669, None, "<|im_end|>", "<|endoftext|>", True),
}


def quicktok_dir() -> Path:
    try:
        import quicktok
    except ImportError as err:
        raise SystemExit("the ranks come from the registry package quicktok-v1: pip install quicktok-v1 "
                         "(it is in beam-sft's dev extra)") from err
    return Path(quicktok.__file__).resolve().parent / "data"


def read_specials(path: Path) -> dict[int, str]:
    """id -> added token from a quicktok .special file (u32 count; per token a u32 id, u16 length, bytes)."""
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    pos, out = 4, {}
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, pos)
        out[token_id] = data[pos + 6: pos + 6 + length].decode("utf-8")
        pos += 6 + length
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes; not a quicktok .special file")
    return out


def convert(name: str):
    """The model's tokenizer as it ships (not yet beamified)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    pattern, size, bos, eos, pad, qwen = MODELS[name]
    ranks = read_quicktok_vocab(quicktok_dir() / f"{name}.vocab")
    specials = read_specials(quicktok_dir() / f"{name}.special")
    if sorted(specials) != list(range(len(ranks), size)):
        raise RuntimeError(f"{name}: added tokens are not ids {len(ranks)}..{size - 1}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.tiktoken"
        path.write_bytes(tiktoken_bytes(ranks))
        backend = TikTokenConverter(vocab_file=str(path), pattern=pattern,
                                    extra_special_tokens=[specials[i] for i in sorted(specials)]).converted()
    if qwen:
        state = json.loads(backend.to_str())
        state["normalizer"] = {"type": "NFC"}
        state["model"]["ignore_merges"] = False
        backend = Tokenizer.from_str(json.dumps(state))
    if backend.get_vocab_size(with_added_tokens=True) != size:
        raise RuntimeError(f"{name}: {backend.get_vocab_size(with_added_tokens=True)} ids, expected {size}")
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=pad,
                                   clean_up_tokenization_spaces=False, model_max_length=131072)


def check_against_quicktok(tokenizer, name: str, texts: list[str]) -> int:
    """Raise unless the tokenizer gives quicktok's ids (quicktok's own exact encoder) on every text."""
    import quicktok

    encoding = quicktok.get_encoding(name)
    added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
    compared = 0
    for k, text in enumerate(texts):
        for token in added:  # quicktok encodes ordinary text only: its added tokens would be text there
            text = text.replace(token, "")
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = list(encoding.encode(text))
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            raise RuntimeError(f"{name}: ids differ from quicktok's on text {k} at token {at}: "
                               f"{ours[at:at + 5]} vs {theirs[at:at + 5]}")
        compared += len(ours)
    return compared


def build(name: str, out_dir: str | Path) -> Path:
    from beam_sft.model.beamify import beamify
    from beam_sft.template.tokenizer import save_tokenizer

    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        tokenizer = convert(name)
        check_against_quicktok(tokenizer, name, verification_texts())
        beamify(tokenizer)
        save_tokenizer(tokenizer, staging)
        swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def cache_key(name: str) -> str:
    import tokenizers
    import transformers

    from beam_sft.template.tokenizer import TEMPLATES_DIR

    digest = hashlib.sha256(f"{name}|{transformers.__version__}|{tokenizers.__version__}".encode())
    for path in (Path(__file__), quicktok_dir() / f"{name}.vocab", quicktok_dir() / f"{name}.special",
                 TEMPLATES_DIR / "chat_template.jinja", TEMPLATES_DIR / "response_template.json",
                 REPO / "beam_sft" / "template" / "tokenizer.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_build(name: str, cache_dir: str | Path | None = None) -> Path:
    """The beamified tokenizer directory, built once per `cache_key` under `cache_dir`, else `$BEAM_SFT_CACHE`,
    else ~/.cache/beam_sft."""
    root = Path(cache_dir or os.environ.get("BEAM_SFT_CACHE") or Path.home() / ".cache" / "beam_sft")
    target = root / f"{name}-beam-{cache_key(name)}"
    if not (target / "tokenizer_config.json").is_file():
        build(name, target)
    return target


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(MODELS), help="which base vocabulary")
    parser.add_argument("--output_dir", help="where to write it (default: the cache, printed)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    out = build(args.model, args.output_dir) if args.output_dir else cached_build(args.model)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
