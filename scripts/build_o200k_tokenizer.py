"""Build the real-vocabulary Beam tokenizer (gpt-oss's o200k_harmony, 201,088 ids) offline.

Beam's markers sit at gpt-oss ids and a Beam checkpoint's tokenizer is gpt-oss-class. This script makes
such a tokenizer without hub access, from the registry package `quicktok-v1` (a dev dependency), which
bundles OpenAI's o200k merge ranks:

1. read `quicktok/data/o200k.vocab` (little-endian u32 count; per token a u16 byte length, the bytes and
   a u32 rank) and write it in tiktoken's format (`base64(bytes) rank` per line, sorted by rank);
2. verify that file's sha256 against the published hash of `o200k_base.tiktoken`, so it is byte for byte
   the official file (any other bytes stop the build);
3. convert it with transformers' `TikTokenConverter` (o200k's split pattern) and add gpt-oss's special
   tokens at their ids (199998 `<|startoftext|>` ... 201087), as gpt-oss's own tokenizer has them;
4. `beamify` it (the markers keep their gpt-oss ids; all but `<|return|>` become non-special), and save
   it with `save_tokenizer`;
5. check that its ids equal openai-harmony's (`load_harmony_encoding(HARMONY_GPT_OSS)`, reading the
   tiktoken file through `TIKTOKEN_ENCODINGS_BASE`) on real text: the format page and the real samples.

A real Beam checkpoint ships its own tokenizer, and that is what training uses; this one is for tests,
benchmarks and tiny gpt-oss-class models when the hub is out of reach.

# Build into a directory (also writes o200k_base.tiktoken into --tiktoken_dir, default: the output dir)
```bash
python scripts/build_o200k_tokenizer.py --output_dir /tmp/o200k-beam
python scripts/build_o200k_tokenizer.py --output_dir /tmp/o200k-beam --tiktoken_dir /tmp/tiktoken
```

# Then
```bash
beam-sft check-template /tmp/o200k-beam
TIKTOKEN_ENCODINGS_BASE=/tmp/tiktoken python -c "import openai_harmony as h; h.load_harmony_encoding('HarmonyGptOss')"
```
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Runnable as `python scripts/build_o200k_tokenizer.py` from a checkout without installing the package.
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from build_tokenizer import staging_dir, swap_in

from beam_sft.render.tiktoken_backend import O200K_PATTERN

# The published sha256 of https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
TIKTOKEN_FILE = "o200k_base.tiktoken"
NUM_RANKS = 199_998  # mergeable ranks 0 .. 199997; added tokens follow
VOCAB_SIZE = 201_088
# gpt-oss's named special tokens; every other id from 199998 to 201087 is <|reserved_ID|>.
GPT_OSS_SPECIAL = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}


@dataclass
class BuildO200kArguments:
    output_dir: str = field(
        default=str(REPO / "outputs" / "o200k-beam"), metadata={"help": "Where to write the Beam tokenizer."}
    )
    tiktoken_dir: str | None = field(
        default=None,
        metadata={
            "help": f"Where to write {TIKTOKEN_FILE} (a folder for TIKTOKEN_ENCODINGS_BASE; default: output_dir)."
        },
    )
    vocab_file: str | None = field(
        default=None, metadata={"help": "quicktok's o200k.vocab (default: the installed quicktok-v1 package's)."}
    )
    verify_texts: int = field(
        default=0,
        metadata={"help": "Compare ids with openai-harmony on at most this many text chunks (0: all of them)."},
    )


def quicktok_vocab_file() -> Path:
    try:
        import quicktok
    except ImportError as err:
        raise SystemExit(
            "the o200k vocabulary comes from the registry package quicktok-v1: pip install quicktok-v1 "
            "(it is in beam-sft's dev extra)"
        ) from err
    return Path(quicktok.__file__).resolve().parent / "data" / "o200k.vocab"


def read_quicktok_vocab(path: str | Path) -> list[tuple[bytes, int]]:
    """(token bytes, rank) pairs from a quicktok .vocab file, in file order."""
    data = Path(path).read_bytes()
    try:
        (count,) = struct.unpack_from("<I", data, 0)
        pos, tokens = 4, []
        for _ in range(count):
            (length,) = struct.unpack_from("<H", data, pos)
            token = data[pos + 2 : pos + 2 + length]
            (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
            tokens.append((token, rank))
            pos += 2 + length + 4
    except struct.error as err:
        raise ValueError(f"{path}: cut off after {len(tokens)} tokens; not a quicktok vocab ({err})") from err
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes after {count} tokens; not a quicktok vocab")
    return tokens


def tiktoken_bytes(tokens: list[tuple[bytes, int]]) -> bytes:
    """The tokens in tiktoken's file format, sorted by rank."""
    return b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in sorted(tokens, key=lambda x: x[1]))


def write_tiktoken_file(tiktoken_dir: str | Path, vocab_file: str | Path | None = None) -> Path:
    """Write `o200k_base.tiktoken` into `tiktoken_dir` after checking its sha256; returns the path.

    An existing file with the right hash is kept as it is.
    """
    target = Path(tiktoken_dir) / TIKTOKEN_FILE
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return target
    data = tiktoken_bytes(read_quicktok_vocab(vocab_file or quicktok_vocab_file()))
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise SystemExit(
            f"the o200k ranks written from {vocab_file or quicktok_vocab_file()} hash to {digest}, not the "
            f"published {O200K_SHA256}: refusing to build from a vocabulary that is not OpenAI's"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target


def added_token_names() -> list[str]:
    """gpt-oss's added tokens in id order, from 199998 to 201087."""
    return [GPT_OSS_SPECIAL.get(i, f"<|reserved_{i}|>") for i in range(NUM_RANKS, VOCAB_SIZE)]


def convert(tiktoken_path: str | Path):
    """An HF fast tokenizer of o200k_harmony (not yet beamified): the ranks plus gpt-oss's added tokens."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    names = added_token_names()
    # The converter appends added tokens after the ranks in list order, which puts each at its gpt-oss id.
    backend = TikTokenConverter(
        vocab_file=str(tiktoken_path), pattern=O200K_PATTERN, extra_special_tokens=names
    ).converted()
    for token_id, name in GPT_OSS_SPECIAL.items():
        got = backend.token_to_id(name)
        if got != token_id:
            raise RuntimeError(f"{name} got id {got} instead of gpt-oss's {token_id}")
    if backend.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise RuntimeError(f"vocabulary has {backend.get_vocab_size()} ids, expected {VOCAB_SIZE}")
    # As gpt-oss's tokenizer: no BOS added, <|endoftext|> pads (so beamify needs no new pad row).
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )


def verification_texts(limit: int = 0) -> list[str]:
    """Real text to compare ids on: the format page in chunks, and every real sample file."""
    texts: list[str] = []
    spec = (REPO / "tests" / "data" / "spec" / "beam-harmony-format.md").read_text(encoding="utf-8")
    texts.extend(chunk for chunk in spec.split("\n\n") if chunk.strip())
    for path in sorted((REPO / "tests" / "data" / "realdata").rglob("*")):
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts[:limit] if limit else texts


def harmony_encoding(tiktoken_dir: str | Path):
    """openai-harmony's gpt-oss encoding, offline, reading the tiktoken file from `tiktoken_dir`."""
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(Path(tiktoken_dir).resolve())
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def check_against_harmony(tokenizer, tiktoken_dir: str | Path, texts: list[str]) -> int:
    """Raise unless `tokenizer` gives openai-harmony's ids on every text; returns the tokens compared."""
    encoding = harmony_encoding(tiktoken_dir)
    compared = 0
    for k, text in enumerate(texts):
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = encoding.encode(text, allowed_special="all")
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            raise RuntimeError(
                f"ids differ from openai-harmony's on text {k} at token {at}: "
                f"{ours[at:at + 5]} vs {theirs[at:at + 5]} ({text[:60]!r}...)"
            )
        compared += len(ours)
    return compared


def build(
    out_dir: str | Path,
    *,
    tiktoken_dir: str | Path | None = None,
    vocab_file: str | Path | None = None,
    verify_texts: int = 0,
) -> list[Path]:
    """Build, verify and save the Beam o200k tokenizer into `out_dir`; returns the saved files, sorted.

    `o200k_base.tiktoken` goes to `tiktoken_dir` (default: `out_dir` itself). Raises if the ranks' hash or
    the ids against openai-harmony disagree.
    """
    from beam_sft.model.beamify import beamify
    from beam_sft.records.messages import HARMONY_MARKERS
    from beam_sft.template.tokenizer import save_tokenizer

    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        tiktoken_path = write_tiktoken_file(staging if tiktoken_dir is None else tiktoken_dir, vocab_file)
        tokenizer = convert(tiktoken_path)
        gpt_oss_ids = {m: tokenizer.convert_tokens_to_ids(m) for m in HARMONY_MARKERS}
        beamify(tokenizer)
        for marker, token_id in gpt_oss_ids.items():
            if tokenizer.convert_tokens_to_ids(marker) != token_id:
                raise RuntimeError(f"beamify moved {marker} from id {token_id}")
        if len(tokenizer) != VOCAB_SIZE:
            raise RuntimeError(f"beamify grew the vocabulary to {len(tokenizer)} ids")
        check_against_harmony(tokenizer, tiktoken_path.parent, verification_texts(verify_texts))
        save_tokenizer(tokenizer, staging)
        swap_in(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p for p in out_dir.iterdir() if p.is_file())


def cache_key() -> str:
    """A hash of everything the built tokenizer depends on: the ranks, this script, the templates, beamify,
    and the tokenizer libraries' versions. A change to any of them gives a new key, so a new build."""
    import tokenizers
    import transformers

    from beam_sft.template.tokenizer import TEMPLATES_DIR

    digest = hashlib.sha256(f"{O200K_SHA256}|{transformers.__version__}|{tokenizers.__version__}".encode())
    for path in (Path(__file__), TEMPLATES_DIR / "chat_template.jinja", TEMPLATES_DIR / "response_template.json",
                 REPO / "beam_sft" / "template" / "tokenizer.py"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached_build(cache_dir: str | Path | None = None) -> Path:
    """The tokenizer directory (holding `o200k_base.tiktoken` too), built once per `cache_key()`.

    Cached under `cache_dir`, else `$BEAM_SFT_CACHE`, else `~/.cache/beam_sft`. Concurrent callers are safe:
    `build` swaps a finished directory in.
    """
    root = Path(cache_dir or os.environ.get("BEAM_SFT_CACHE") or Path.home() / ".cache" / "beam_sft")
    target = root / f"o200k-beam-{cache_key()}"
    if not (target / "tokenizer_config.json").is_file() or not (target / TIKTOKEN_FILE).is_file():
        build(target)
    return target


def main(args: BuildO200kArguments) -> int:
    import time

    start = time.perf_counter()
    files = build(
        args.output_dir, tiktoken_dir=args.tiktoken_dir, vocab_file=args.vocab_file, verify_texts=args.verify_texts
    )
    print(
        f"wrote {', '.join(p.name for p in files)} to {args.output_dir} in {time.perf_counter() - start:.1f} s "
        f"(sha256 of {TIKTOKEN_FILE} checked; ids equal openai-harmony's)"
    )
    return 0


def make_parser():
    from trl import TrlParser

    return TrlParser((BuildO200kArguments,))


if __name__ == "__main__":
    (script_args,) = make_parser().parse_args_and_config()
    sys.exit(main(script_args))
