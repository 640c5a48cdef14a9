"""beam_sft.render.tiktoken_backend: tiktoken is used for the text between markers only where checks prove it
gives the tokenizer's own ids; each check refuses a tokenizer that differs in what it checks, and the
encoder falls back to the tokenizers backend whenever the probe finds a difference."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from beam_sft.render import encoder as render
from beam_sft.render import tiktoken_backend
from beam_sft.render.encoder import MaskedEncoder


@pytest.fixture(scope="module")
def o200k_state(o200k_tok):
    return json.loads(o200k_tok._tokenizer.to_str())


@pytest.fixture(scope="module")
def pieces(o200k_state):
    encoder, reason = tiktoken_backend.build(o200k_state)
    assert reason is None and encoder is not None
    return encoder


def test_the_o200k_tokenizer_gets_tiktoken(o200k_encoder_with_backend):
    encoder = o200k_encoder_with_backend
    assert encoder.fast and encoder._tiktoken is not None and encoder.tiktoken_reason is None


@pytest.fixture(scope="module")
def o200k_encoder_with_backend(o200k_tok):
    return MaskedEncoder(o200k_tok)


def test_the_bundled_tokenizer_does_not(tok):
    encoder = MaskedEncoder(tok)
    assert encoder.fast and encoder._tiktoken is None
    assert "Split + ByteLevel" in encoder.tiktoken_reason


def _broken(state, change):
    # Copies of what the changes touch only: a deep copy of a 201k-token vocabulary takes seconds.
    state = {**state, "model": dict(state["model"]), "pre_tokenizer": copy.deepcopy(state["pre_tokenizer"])}
    state["model"]["vocab"] = dict(state["model"]["vocab"])
    state["model"]["merges"] = list(state["model"]["merges"])
    change(state)
    return tiktoken_backend.build(state)


def _swap_merges(state):
    merges = state["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]


def _drop_token(state):
    vocab = state["model"]["vocab"]
    vocab.pop(next(iter(vocab)))


BROKEN = {
    "normalizer": (lambda s: s.__setitem__("normalizer", {"type": "NFKC"}), "normalizer other than NFC"),
    "pattern": (lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"].__setitem__("Regex", r"\s+|\S+"),
                "split pattern"),
    "prefix space": (lambda s: s["pre_tokenizer"]["pretokenizers"][1].__setitem__("add_prefix_space", True),
                     "prefix space"),
    "dropout": (lambda s: s["model"].__setitem__("dropout", 0.1), "dropout"),
    "merge order": (_swap_merges, "merges"),
    "vocabulary gap": (_drop_token, "ids are not 0..N-1"),
    "no pre-tokenizer": (lambda s: s.__setitem__("pre_tokenizer", None), "Split + ByteLevel"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_check_refuses(o200k_state, name):
    change, words = BROKEN[name]
    encoder, reason = _broken(o200k_state, change)
    assert encoder is None and words in reason


def test_regex_engines_agree_on_every_checked_code_point():
    """For the installed tokenizers and tiktoken, on all of planes 0-3 and 14 (cached per version pair)."""
    assert tiktoken_backend.disagreeing_code_points(tiktoken_backend.KNOWN_PATTERNS[tiktoken_backend.O200K_PATTERN]) == ""


def _bpe_stress_texts(state) -> list[str]:
    """Repeated characters and the strings where two different pairs make the same token (the one
    difference between tiktoken's and tokenizers' merge order, see the module docstring)."""
    from beam_sft.render.tiktoken_backend import _byte_decoder

    decoder = _byte_decoder()
    ranks = {bytes(decoder[c] for c in t): i for t, i in state["model"]["vocab"].items()}
    texts = [c * n for c in " \n\t-=*#._~0a!/|'\"`é日🙂" for n in range(1, 70)]
    for token in ranks:
        n = len(token)
        for k in range(1, n):
            if token[n - k:] != token[:k]:
                continue
            p, q, r = token[: n - k], token[:k], token[k:]
            if p != q and p in ranks and q in ranks and r in ranks and (ranks[p], ranks[q]) > (ranks[q], ranks[r]):
                for word in (p + q + r, b"x" + p + q + r, q + p + q + r + q):
                    try:
                        texts.append(word.decode("utf-8"))
                    except UnicodeDecodeError:
                        pass
    return texts


def test_pieces_equal_the_tokenizer_on_texts_that_stress_bpe(o200k_tok, o200k_state, pieces):
    texts = _bpe_stress_texts(o200k_state)
    assert len(texts) > 10_000
    backend = o200k_tok._tokenizer
    expected = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    assert pieces.encode(texts) == expected


def test_unchecked_code_points_go_to_the_tokenizers_backend(o200k_tok, o200k_encoder_with_backend, pieces):
    private = "\U000f0041 plane 15 \U00100000"
    assert pieces.encode([private, "plain"])[0] is None
    assert pieces.encode(["plain"])[0] is not None
    from test_render import assert_identical

    record = {"messages": [{"role": "user", "content": private},
                           {"role": "assistant", "reasoning_content": private, "content": "x" + private}]}
    assert assert_identical(o200k_tok, [record], encoder=o200k_encoder_with_backend) == 1


def test_a_wrong_tiktoken_falls_back_to_the_tokenizers_backend(o200k_tok, monkeypatch):
    real = tiktoken_backend.TiktokenPieces.encode

    def off_by_one(self, texts):
        return [None if ids is None else [i + 1 for i in ids] for ids in real(self, texts)]

    monkeypatch.setattr(tiktoken_backend.TiktokenPieces, "encode", off_by_one)
    encoder = MaskedEncoder(o200k_tok)
    assert encoder.fast and encoder._tiktoken is None
    assert encoder.tiktoken_reason.startswith("the probe found a difference")
    record = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]}
    assert encoder.encode([record]) == [render.reference_encode(o200k_tok, record)]


def test_encoder_with_tiktoken_pickles(o200k_tok, o200k_encoder_with_backend):
    from test_render import SAMPLES, converted

    records = converted(SAMPLES / "openai.jsonl")
    copy_ = pickle.loads(pickle.dumps(o200k_encoder_with_backend))
    assert copy_._tiktoken is not None
    assert copy_.encode(records) == o200k_encoder_with_backend.encode(records)


def test_trie_splitter_equals_the_longest_first_alternation():
    import random
    import re

    rng = random.Random(3)
    alphabet = "<|>ab"
    tokens = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(60)}
    flat = re.compile("(" + "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)) + ")").split
    trie = render._splitter(dict.fromkeys(tokens, 0))
    for _ in range(3000):
        text = "".join(rng.choice(alphabet + "xy ") for _ in range(rng.randint(0, 30)))
        assert trie(text) == flat(text), text


def test_the_disk_cache_gives_back_the_same_encoder(o200k_tok, pieces, tmp_path, monkeypatch):
    """build_cached stores the verdict and the ranks once; a later process reads the same encoder back."""
    monkeypatch.setenv("BEAM_SFT_CACHE", str(tmp_path))
    serialized = o200k_tok._tokenizer.to_str()
    built, reason = tiktoken_backend.build_cached(serialized)
    files = list(tmp_path.glob("tiktoken-pieces-*.bin"))
    assert reason is None and len(files) == 1
    loaded, reason = tiktoken_backend.build_cached(serialized)  # from the file now
    assert reason is None and loaded is not built
    assert loaded._encoding._mergeable_ranks == pieces._encoding._mergeable_ranks
    assert loaded._encoding._pat_str == pieces._encoding._pat_str and loaded._avoid_chars == pieces._avoid_chars
    texts = ["Hello world", "  indented\n\tcode()", "café 日本語 🙂", "\U000f0041"]
    assert loaded.encode(texts) == pieces.encode(texts)
    files[0].write_bytes(b"damaged")  # a damaged file is rebuilt, not trusted
    again, reason = tiktoken_backend.build_cached(serialized)
    assert reason is None and again._encoding._mergeable_ranks == pieces._encoding._mergeable_ranks
    assert files[0].read_bytes() != b"damaged"


def test_a_refusal_is_cached_too(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("BEAM_SFT_CACHE", str(tmp_path))
    serialized = tok._tokenizer.to_str()
    first = tiktoken_backend.build_cached(serialized)
    assert first[0] is None and "Split + ByteLevel" in first[1]
    monkeypatch.setattr(tiktoken_backend, "build", lambda state: pytest.fail("rebuilt despite the cache"))
    assert tiktoken_backend.build_cached(serialized) == first


def test_the_encoder_needs_no_private_backend_with_tiktoken(o200k_tok):
    """The private copy of the backend (seconds to make on a 200k vocabulary) is made only when a piece needs
    it; the probe runs on the shared backend when transformers left no truncation or padding on it."""
    encoder = MaskedEncoder(o200k_tok)
    record = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]}
    assert encoder.encode([record]) == [render.reference_encode(o200k_tok, record)]
    assert encoder._private_backend is None
    odd = {"messages": [{"role": "user", "content": "\U000f0041"}, {"role": "assistant", "content": "x"}]}
    assert encoder.encode([odd]) == [render.reference_encode(o200k_tok, odd)]
    assert encoder._private_backend is not None
    restored = pickle.loads(pickle.dumps(encoder))
    assert restored._private_backend is None and restored.encode([odd, record]) == encoder.encode([odd, record])


def test_a_truncation_left_on_the_shared_backend_does_not_cut_the_probe(o200k_tok):
    backend = o200k_tok._tokenizer
    backend.enable_truncation(max_length=3)
    try:
        encoder = MaskedEncoder(o200k_tok)
    finally:
        backend.no_truncation()
    assert encoder.fast and encoder._tiktoken is not None


# -- NFC and ignore_merges off (Qwen's tokenizer.json), on tiny tokenizers built here and on the Qwen3 build ----

# Byte-level tokens that NFC's compositions produce, with the halves that make them reachable by merges.
NFC_TOKENS = [b"\xc3\xa9", b"ca", b"caf", b"caf\xc3\xa9", b"\xc3\x85", b"\xea\xb0", b"\xea\xb0\x80", b"\xcc\x81",
              b"e\xcc\x81", b" caf", b" caf\xc3\xa9", b"\xe2\x84", b"\xe2\x84\xab"]
# Pieces NFC changes (decomposed accents, Hangul jamo, the Angstrom and Kelvin signs), mixed with ASCII and
# with text it leaves alone.
NFC_TEXTS = ["e\u0301", "cafe\u0301s", "\u1100\u1161", "A\u030a", "A\u030angstro\u0308m and cafe\u0301 12",
             "\u212b \u212a elvin", "caf\u00e9 \uac00 \u00c5", "plain ASCII, it's 42", "x\u1100\u1161\u11a8 \u0301e",
             "\U000f0041 cafe\u0301"]


def _tiny(normalizer=None, ignore_merges=True, tokens=NFC_TOKENS):
    from tokenizer_factories import tiktoken_like_state
    from tokenizers import Tokenizer

    state = tiktoken_like_state(tokens, normalizer=normalizer, ignore_merges=ignore_merges)
    return state, Tokenizer.from_str(json.dumps(state))


@pytest.mark.parametrize("ignore_merges", [True, False])
def test_nfc_pieces_equal_the_backend(ignore_merges):
    state, backend = _tiny({"type": "NFC"}, ignore_merges)
    pieces, reason = tiktoken_backend.build(state)
    assert reason is None and pieces._nfc is not None
    expected = [e.ids for e in backend.encode_batch(NFC_TEXTS, add_special_tokens=False)]
    got = pieces.encode(NFC_TEXTS)
    assert got[-1] is None  # private use: the tokenizers backend's
    assert got[:-1] == expected[:-1]
    # Without the NFC step the ids differ: the texts do exercise it.
    plain = tiktoken_backend.TiktokenPieces(pieces._encoding._mergeable_ranks, pieces._encoding._pat_str, "")
    assert plain.encode(NFC_TEXTS)[:-1] != expected[:-1]
    # Workers get a copy by pickling, and later processes by the disk cache: both keep the NFC step.
    copy_ = pickle.loads(pickle.dumps(pieces))
    assert copy_._nfc is not None and copy_.encode(NFC_TEXTS) == got
    loaded, reason = tiktoken_backend._load(tiktoken_backend._dump(pieces, None))
    assert reason is None and loaded.encode(NFC_TEXTS) == got


def test_nfc_pieces_are_checked_for_disputed_code_points_after_normalizing():
    """The split pattern sees the normalized text: "e\u0301" is "\u00e9" there, so avoiding "\u00e9" avoids it."""
    state, _ = _tiny({"type": "NFC"})
    pieces, _ = tiktoken_backend.build(state)
    ranks, pattern = pieces._encoding._mergeable_ranks, pieces._encoding._pat_str
    avoiding = tiktoken_backend.TiktokenPieces(ranks, pattern, "\u00e9", nfc=True)
    assert avoiding.encode(["e\u0301", "e\u0300", "cafe"]) == [None, pieces.encode(["e\u0300"])[0], [258, 101]]


@pytest.mark.parametrize("normalizer", [{"type": "NFKC"}, {"type": "NFD"}, {"type": "Lowercase"},
                                        {"type": "Sequence", "normalizers": [{"type": "NFC"}]}])
def test_a_normalizer_other_than_nfc_is_refused(normalizer):
    pieces, reason = tiktoken_backend.build(_tiny(normalizer)[0])
    assert pieces is None and reason == "the tokenizer has a normalizer other than NFC"


def test_ignore_merges_off_is_refused_when_a_token_is_not_reached_by_merges():
    # "bc" merges before "ab", so "abcd" (whose one split is ab+cd) never forms: a b c d -> a bc d.
    tokens = [b"bc", b"ab", b"cd", b"abcd"]
    state, backend = _tiny(ignore_merges=False, tokens=tokens)
    assert backend.encode("abcd").ids == [97, 256, 100]
    pieces, reason = tiktoken_backend.build(state)
    assert pieces is None
    assert reason == "ignore_merges is off and 1 token(s) do not merge back into themselves, e.g. 'abcd' (id 259)"
    # With ignore_merges on the backend takes "abcd" whole, as tiktoken does: accepted, and equal.
    state, backend = _tiny(ignore_merges=True, tokens=tokens)
    pieces, reason = tiktoken_backend.build(state)
    assert reason is None and pieces.encode(["abcd xabcd"]) == [backend.encode("abcd xabcd").ids] == [[259, 32, 120, 97, 256, 100]]


def test_qwen3_nfc_pieces_equal_its_backend():
    pytest.importorskip("quicktok")
    from tokenizer_factories import base_tokenizer_script

    from beam_sft.template.tokenizer import load_tokenizer

    backend = load_tokenizer(base_tokenizer_script().cached_build("qwen3"))._tokenizer
    pieces, reason = tiktoken_backend.build_cached(backend.to_str())
    assert reason is None and pieces._nfc is not None
    texts = [*NFC_TEXTS, "Cre\u0300me bru\u0302le\u0301e, \u1112\u1161\u11ab\u1100\u1173\u11af \u0928\u093c", "\u00c5\u212b"]
    got = pieces.encode(texts)
    expected = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    assert [g for g in got if g is not None] == [e for g, e in zip(got, expected, strict=True) if g is not None]
    assert sum(g is None for g in got) == 1  # the private-use piece only
    # And BPE itself, merges run on every pre-token (ignore_merges off), on Qwen3's own stress strings.
    stress = _bpe_stress_texts(json.loads(backend.to_str()))
    assert len(stress) > 5_000
    assert pieces.encode(stress) == [e.ids for e in backend.encode_batch(stress, add_special_tokens=False)]
