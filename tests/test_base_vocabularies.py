"""The base vocabularies people beamify, built offline by scripts/build_base_tokenizer.py from quicktok-v1's
ranks. Both take the tiktoken backend, which its setup checks prove exact (rank-derived merges, a known split
pattern, the regex engines agreeing on its classes): Llama 3 (128,256 ids) with ignore_merges on and no
normalizer; Qwen3 (151,669 ids) with what Qwen ships, an NFC normalizer (applied per piece by the backend's own
NFC) and ignore_merges off (every token checked to merge back into itself). Either way the encoder's ids and
masks equal apply_chat_template's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_render import assert_identical
from tokenizer_factories import base_tokenizer_script

from beam_sft.render.encoder import MaskedEncoder

REALDATA = Path(__file__).parent / "data" / "realdata"


@pytest.fixture(scope="module", params=["llama3", "qwen3"])
def base(request):
    from beam_sft.template.tokenizer import load_tokenizer

    return request.param, load_tokenizer(base_tokenizer_script().cached_build(request.param))


def test_vocabulary_sizes_and_markers(base):
    name, tok = base
    size, ranks, known = {"llama3": (128_256, 128_000, ("<|eot_id|>", 128_009)),
                          "qwen3": (151_669, 151_643, ("<|im_end|>", 151_645))}[name]
    assert tok._tokenizer.get_vocab_size(with_added_tokens=False) == ranks
    assert tok.convert_tokens_to_ids(known[0]) == known[1]
    assert tok.convert_tokens_to_ids("<|start|>") >= size  # beamify added the markers after the model's ids
    state = json.loads(tok._tokenizer.to_str())
    # What the tiktoken backend's checks must accept for Qwen3: as Qwen's tokenizer.json has it.
    assert state["normalizer"] == ({"type": "NFC"} if name == "qwen3" else None)
    assert state["model"]["ignore_merges"] == (name == "llama3")


def test_fast_backend_where_the_checks_prove_it(base):
    name, tok = base
    encoder = MaskedEncoder(tok)
    assert encoder.fast
    assert encoder._tiktoken is not None and encoder.tiktoken_reason is None
    assert (encoder._tiktoken._nfc is not None) == (name == "qwen3")


def test_ids_and_masks_equal_apply_chat_template(base, bench_script):
    _, tok = base
    from beam_sft.validate.convert import convert

    records = bench_script.make_workload(60, seed=11)
    for path in sorted(REALDATA.rglob("*.jsonl"))[:6]:
        for line in path.read_text(encoding="utf-8").splitlines()[:10]:
            try:
                records.append(convert(json.loads(line), "auto")[0])
            except Exception:  # noqa: BLE001, S112 - not every sample converts: those are rejects elsewhere
                continue
    records.append({"messages": [{"role": "user", "content": "12345 ６７８ ٣٤٥ e\u0301 Å Å A\u030a \u1100\u1161 \u212b ﬁ 𝔘 \U000f0041"},
                                 {"role": "assistant", "content": "2024-01-01: I'M here, it'LL do"}]})
    assert assert_identical(tok, records, encoder=MaskedEncoder(tok)) > 60
