"""An exact `tiktoken` encoder for the text between markers, for tokenizers converted from tiktoken, where it
is proven exact (docs/encoder.md#tiktoken-for-the-text-between-markers)."""

from __future__ import annotations

import json
import re
import struct
from functools import lru_cache
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from beam_sft.storage import cache_dir, package_version, short_hash, write_cache_file

# o200k's pre-tokenization pattern (o200k_base, o200k_harmony).
O200K_PATTERN = "|".join(  # noqa: FLY002 (one alternative a line reads better)
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# Llama 3's (digits in runs of 1-3) and Qwen2/2.5/3's (one digit per pre-token), as their tokenizer.json have them.
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
_BYTE_LEVEL_CLASSES = (r"\p{L}", r"\p{N}", r"\s", r"[\r\n]", *(f"(?i:{c})" for c in "strevmld"))
# pattern -> the character classes (and case-insensitive letters) whose membership decides its splits.
KNOWN_PATTERNS: dict[str, tuple[str, ...]] = {
    O200K_PATTERN: (
        r"\p{L}", r"\p{N}", r"\p{Lu}", r"\p{Lt}", r"\p{Lm}", r"\p{Lo}", r"\p{Ll}", r"\p{M}", r"\s", r"[\r\n/]",
        *(f"(?i:{c})" for c in "strevmld"),
    ),
    LLAMA3_PATTERN: _BYTE_LEVEL_CLASSES,
    QWEN_PATTERN: _BYTE_LEVEL_CLASSES,
}
# Planes 0-3 and 14 hold every assigned code point; the rest (unassigned, private use) go to the backend.
_CHECKED_PLANES = ((0x0000, 0x3FFFF), (0xE0000, 0xEFFFF))
_UNCHECKED = "[\U00040000-\U000dffff\U000f0000-\U0010ffff]"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def disagreeing_code_points(classes: tuple[str, ...]) -> str:
    """Code points (of the checked planes) that `tokenizers` and `tiktoken` classify differently: each class
    matched by a Split removing matches, and by an encoding of single-byte ranks (it encodes only matches)."""
    import tiktoken
    import tokenizers

    key = json.dumps([tokenizers.__version__, tiktoken.__version__, list(classes)])
    cache = cache_dir() / "regex-agreement.json"
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    from tokenizers import Regex, pre_tokenizers

    text = "".join(chr(c) for lo, hi in _CHECKED_PLANES for c in range(lo, hi + 1) if not 0xD800 <= c <= 0xDFFF)
    single_bytes = {bytes([b]): b for b in range(256)}
    differ: set[str] = set()
    for cls in classes:
        encoding = tiktoken.Encoding(f"probe{len(differ)}", pat_str=f"{cls}+", mergeable_ranks=single_bytes,
                                     special_tokens={})
        by_tiktoken = set(bytes(encoding.encode_ordinary(text)).decode("utf-8"))
        split = pre_tokenizers.Split(Regex(f"{cls}+"), behavior="removed", invert=False)
        by_tokenizers = set(text) - set("".join(piece for piece, _ in split.pre_tokenize_str(text)))
        differ |= by_tiktoken ^ by_tokenizers
    result = "".join(sorted(differ))
    known[key] = result
    write_cache_file(cache, json.dumps(known).encode())
    return result


def _derived_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list transformers' TikTokenConverter derives from tiktoken ranks."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in merges]


class TiktokenPieces:
    """Encodes text pieces free of added tokens with tiktoken as the `tokenizers` backend would (None for a
    disputed code point); `nfc`: normalized first by the `tokenizers` library's NFC."""

    def __init__(self, ranks: dict[bytes, int], pattern: str, avoid: str, nfc: bool = False) -> None:
        import tiktoken
        from tokenizers import normalizers

        self._encoding = tiktoken.Encoding("beam-sft-pieces", pat_str=pattern, mergeable_ranks=ranks,
                                           special_tokens={})
        self._core = self._encoding._core_bpe.encode_ordinary
        self._avoid_chars = avoid
        self._avoid = re.compile(f"[{re.escape(avoid)}]|{_UNCHECKED}" if avoid else _UNCHECKED).search
        # The engines agree on ASCII in every version so far; if not, no shortcut.
        self._ascii_safe = all(ord(c) > 127 for c in avoid)
        self._nfc = normalizers.NFC() if nfc else None

    def encode(self, pieces: list[str]) -> list[list[int] | None]:
        encode, avoid = self._encode, self._avoid
        if self._nfc is not None:
            # NFC leaves ASCII as it is, in every Unicode version: ASCII pieces take the plain path.
            other = self._encode_nfc
            if self._ascii_safe:
                return [encode(p) if p.isascii() else other(p) for p in pieces]
            return [other(p) if not p.isascii() else None if avoid(p) else encode(p) for p in pieces]
        if self._ascii_safe:
            return [encode(p) if p.isascii() or not avoid(p) else None for p in pieces]
        return [None if avoid(p) else encode(p) for p in pieces]

    def _encode(self, piece: str) -> list[int]:
        # The Rust encoder itself, one Python frame less per piece (~2% of encoding); tiktoken's wrapper only
        # for what it handles (a lone surrogate).
        try:
            return self._core(piece)
        except UnicodeEncodeError:
            return self._encoding.encode_ordinary(piece)

    def _encode_nfc(self, piece: str) -> list[int] | None:
        try:
            # The backend's own Rust NFC, not `unicodedata`: their Unicode versions may differ.
            piece = self._nfc.normalize_str(piece)
        except UnicodeEncodeError:  # a lone surrogate: whatever the backend does with it, it does
            return None
        # The split pattern sees the normalized text, so that is what must avoid disputed code points.
        return None if self._avoid(piece) else self._encode(piece)

    def encoding_with_special_tokens(self, special_tokens: dict[str, int]):
        """A tiktoken Encoding of whole texts: these ranks plus `special_tokens` (benchmarks; no NFC step)."""
        import tiktoken

        return tiktoken.Encoding("beam-sft-text", pat_str=self._encoding._pat_str,
                                 mergeable_ranks=self._encoding._mergeable_ranks, special_tokens=special_tokens)

    def __reduce__(self):
        # Workers (fork or spawn) rebuild it from the ranks, as unpickling a tiktoken Encoding does anyway;
        # the normalizer travels as a flag.
        ranks, pattern = self._encoding._mergeable_ranks, self._encoding._pat_str
        return TiktokenPieces, (ranks, pattern, self._avoid_chars, self._nfc is not None)


def _pipeline(state: dict[str, Any]) -> tuple[str | None, bool, str | None]:
    """(split pattern, whether the normalizer is NFC, None) when the pipeline around the BPE model is one
    tiktoken reproduces, else (None, False, the first reason it is not)."""
    normalizer = state.get("normalizer")
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return None, False, "the tokenizer has a normalizer other than NFC"
    pre = state.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None, False, "the pre-tokenizer is not Split + ByteLevel"
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
    if pattern not in KNOWN_PATTERNS or split.get("behavior") != "Isolated" or split.get("invert"):
        return None, False, "the split pattern is not one tiktoken is checked against"
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
        return None, False, "the pre-tokenizer's ByteLevel step adds a prefix space or splits again"
    model = state.get("model") or {}
    if model.get("type") != "BPE":
        return None, False, "the model is not a BPE"
    if any(model.get(key) for key in ("dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix")):
        return None, False, "the BPE model uses dropout, byte fallback, a subword prefix or a word suffix"
    return pattern, normalizer is not None, None


def _tokens_not_merged_whole(vocab: dict[str, int], merges: list[tuple[str, str]]) -> list[str]:
    """Vocabulary tokens whose own text the BPE model, merging (ignore_merges off), does not turn into that
    one token. The model is the `tokenizers` library's own, so this is what the backend does."""
    from tokenizers import models

    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=False)
    return [token for token, token_id in vocab.items()
            if len(result := bpe.tokenize(token)) != 1 or result[0].id != token_id]


def build(state: dict[str, Any]) -> tuple[TiktokenPieces | None, str | None]:
    """(encoder, None) when tiktoken reproduces the serialised backend `state`, else (None, why not)."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return None, "tiktoken is not installed"
    pattern, nfc, reason = _pipeline(state)
    if reason is not None:
        return None, reason
    model = state["model"]
    vocab = model.get("vocab", {})
    decoder = _byte_decoder()
    ranks: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        try:
            ranks[bytes(decoder[c] for c in token)] = token_id
        except KeyError:
            return None, f"vocabulary entry {token!r} is not byte-level"
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) != len(vocab):
        return None, "the vocabulary's ids are not 0..N-1, one per token"
    merges = model.get("merges") or []
    try:
        given = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
        given_bytes = [(bytes(decoder[c] for c in a), bytes(decoder[c] for c in b)) for a, b in given]
    except (KeyError, ValueError):
        return None, "a merge is not a pair of byte-level tokens"
    if given_bytes != _derived_merges(ranks):
        return None, "the merges are not the ones derived from the ranks"
    # Every token, added tokens' texts included: NFC can turn a piece into text the raw-text match of an
    # added token never saw (a converter from tiktoken keeps added tokens out of the ranks anyway).
    if not model.get("ignore_merges") and (bad := _tokens_not_merged_whole(vocab, given)):
        return None, (f"ignore_merges is off and {len(bad)} token(s) do not merge back into themselves, "
                      f"e.g. {bad[0]!r} (id {vocab[bad[0]]})")
    try:
        avoid = disagreeing_code_points(KNOWN_PATTERNS[pattern])
    except Exception as err:  # noqa: BLE001 - an engine rejecting a class means no proof, so no tiktoken
        return None, f"could not compare the regex engines: {err}"
    return TiktokenPieces(ranks, pattern, avoid, nfc), None


# -- the verdict and the ranks, cached on disk: `build` takes seconds per process ------------------------------


def cache_key(serialized: str) -> str:
    """What `build`'s result depends on: the serialised backend, this module's source, the library versions."""
    versions = f"|{package_version('tokenizers')}|{package_version('tiktoken')}"
    return short_hash(serialized, Path(__file__).read_bytes(), versions, length=32)


def _dump(pieces: TiktokenPieces | None, reason: str | None) -> bytes:
    """One file: a JSON header line (verdict, pattern, avoided code points, NFC or not), then the ranks in id order as
    little-endian u32 lengths followed by the concatenated token bytes."""
    if pieces is None:
        return json.dumps({"reason": reason}).encode() + b"\n"
    ranks = pieces._encoding._mergeable_ranks
    tokens = sorted(ranks, key=ranks.__getitem__)
    lengths = struct.pack(f"<{len(tokens)}I", *map(len, tokens))
    header = {"reason": None, "pattern": pieces._encoding._pat_str, "avoid": pieces._avoid_chars,
              "nfc": pieces._nfc is not None, "count": len(tokens)}
    return json.dumps(header).encode() + b"\n" + lengths + b"".join(tokens)


def _load(data: bytes) -> tuple[TiktokenPieces | None, str | None]:
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    if header["reason"] is not None:
        return None, header["reason"]
    count = header["count"]
    lengths = struct.unpack_from(f"<{count}I", body)
    blob = body[4 * count:]
    ends = [0, *accumulate(lengths)]
    ranks = {blob[start:end]: rank for rank, (start, end) in enumerate(pairwise(ends))}
    if ends[-1] != len(blob) or len(ranks) != count:
        raise ValueError("the cached ranks do not add up")
    return TiktokenPieces(ranks, header["pattern"], header["avoid"], header["nfc"]), None


def _cache_path(key: str) -> Path:
    return cache_dir() / f"tiktoken-pieces-{key}.bin"


def read_cached(key: str) -> tuple[TiktokenPieces | None, str | None] | None:
    """`build`'s result for the backend whose `cache_key` is `key`, as stored; None if absent or damaged."""
    try:
        return _load(_cache_path(key).read_bytes())
    except (OSError, ValueError, KeyError, struct.error):
        return None


def build_cached(serialized: str) -> tuple[TiktokenPieces | None, str | None]:
    """`build(json.loads(serialized))`, read from the disk cache when an earlier process stored it."""
    key = cache_key(serialized)
    cached = read_cached(key)
    if cached is not None:
        return cached
    pieces, reason = build(json.loads(serialized))  # tokenizers always writes JSON
    write_cache_file(_cache_path(key), _dump(pieces, reason))
    return pieces, reason
