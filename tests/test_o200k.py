"""The real gpt-oss vocabulary (o200k_harmony, 201,088 ids), built offline by scripts/build_o200k_tokenizer.py.

The tokenizer is built once per machine and cached (`o200k_dir` in conftest.py); these tests check the build
itself, the Beam properties on it, and that masks and ids match the reference paths on real data.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from tokenizer_factories import o200k_script, tiny_causal_lm

from beam_sft.records.messages import HARMONY_MARKERS

REPO = Path(__file__).resolve().parents[1]
GPT_OSS_MARKER_IDS = {
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}


@pytest.fixture(scope="module")
def script():
    return o200k_script()


def test_tiktoken_file_is_the_published_one(o200k_dir, script):
    data = (o200k_dir / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    lines = data.splitlines()
    assert len(lines) == script.NUM_RANKS
    assert [int(line.split()[1]) for line in lines[:3]] == [0, 1, 2]


def test_a_different_vocabulary_is_refused(tmp_path, script):
    source = bytearray(script.quicktok_vocab_file().read_bytes())
    # The first token's first byte (after the u32 count and its u16 length): same layout, other bytes.
    source[6] ^= 0x01
    bad = tmp_path / "o200k.vocab"
    bad.write_bytes(bytes(source))
    with pytest.raises(SystemExit, match="not OpenAI's"):
        script.write_tiktoken_file(tmp_path / "tiktoken", bad)
    assert not (tmp_path / "tiktoken" / "o200k_base.tiktoken").exists()


def test_truncated_vocab_file_is_refused(tmp_path, script):
    bad = tmp_path / "o200k.vocab"
    bad.write_bytes(script.quicktok_vocab_file().read_bytes()[:-3])
    with pytest.raises(ValueError, match="cut off"):
        script.read_quicktok_vocab(bad)
    bad.write_bytes(script.quicktok_vocab_file().read_bytes() + b"x")
    with pytest.raises(ValueError, match="trailing bytes"):
        script.read_quicktok_vocab(bad)


def test_gpt_oss_ids_and_beam_properties(o200k_tok):
    tok = o200k_tok
    assert len(tok) == 201_088
    for marker, token_id in GPT_OSS_MARKER_IDS.items():
        assert tok.convert_tokens_to_ids(marker) == token_id
    assert tok.convert_tokens_to_ids("<|startoftext|>") == 199998
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 199999
    assert tok.convert_tokens_to_ids("<|endofprompt|>") == 200018
    assert tok.convert_tokens_to_ids("<|reserved_201087|>") == 201087
    assert tok.eos_token == "<|return|>" and tok.pad_token == "<|endoftext|>"
    added = tok._tokenizer.get_added_tokens_decoder()
    assert {m: added[GPT_OSS_MARKER_IDS[m]].special for m in HARMONY_MARKERS} == {
        m: m == "<|return|>" for m in HARMONY_MARKERS
    }
    text = "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text.replace("<|return|>", "")


def test_ids_equal_openai_harmony_on_real_text(o200k_dir, o200k_tok, script):
    texts = script.verification_texts()
    assert len(texts) > 150
    assert script.check_against_harmony(o200k_tok, o200k_dir, texts) > 100_000


def test_harmony_check_catches_a_wrong_tokenizer(o200k_dir, tok, script):
    with pytest.raises(RuntimeError, match="ids differ from openai-harmony"):
        script.check_against_harmony(tok, o200k_dir, ["Hello, world"])


def test_check_template_passes(o200k_dir, capsys):
    from beam_sft.cli import check_template

    assert check_template.main([str(o200k_dir)]) == 0
    captured = capsys.readouterr()
    assert "36 passed, 0 failed" in captured.err, captured.err[-300:]
    assert captured.out.count("PASS ") == 36 and "FAIL" not in captured.out


def test_cached_build_reuses_the_directory(o200k_dir, script):
    assert o200k_dir.name == f"o200k-beam-{script.cache_key()}"
    stamp = (o200k_dir / "tokenizer.json").stat().st_mtime_ns
    assert script.cached_build(o200k_dir.parent) == o200k_dir
    assert (o200k_dir / "tokenizer.json").stat().st_mtime_ns == stamp


def test_beamify_on_gpt_oss_keeps_ids_and_adds_no_rows(o200k_dir, script):
    """gpt-oss's own tokenizer (markers special, pre-Beam) + a model: beamify moves nothing, grows nothing."""
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from beam_sft.model.beamify import beamify

    # gpt-oss's tokenizer as it ships: the same vocabulary with every marker special.
    state = json.loads((o200k_dir / "tokenizer.json").read_text(encoding="utf-8"))
    for entry in state["added_tokens"]:
        entry["special"] = True
    raw = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)), eos_token="<|return|>", pad_token="<|endoftext|>"
    )
    assert raw.decode([200006, 200002], skip_special_tokens=True) == ""
    model = tiny_causal_lm(len(raw))
    before = model.get_input_embeddings().weight.detach().clone()
    beamify(raw, model)
    assert len(raw) == 201_088
    assert {m: raw.convert_tokens_to_ids(m) for m in GPT_OSS_MARKER_IDS} == GPT_OSS_MARKER_IDS
    after = model.get_input_embeddings().weight
    assert after.shape == before.shape
    assert torch.equal(after, before)
    assert model.config.eos_token_id == 200002 and model.config.pad_token_id == 199999
    saved = json.loads(raw._tokenizer.to_str())
    assert sum(1 for t in saved["added_tokens"] if t["content"] in HARMONY_MARKERS) == len(HARMONY_MARKERS)


# ---------- masks on the real vocabulary: identical to apply_chat_template ----------


@pytest.fixture(scope="module")
def o200k_encoder(o200k_tok):
    from beam_sft.render.encoder import MaskedEncoder

    encoder = MaskedEncoder(o200k_tok)
    assert encoder.fast, encoder.fallback_reason
    return encoder


@pytest.mark.parametrize("name", ["openai.jsonl", "sharegpt.json", "harmony.jsonl"])
def test_masks_identical_on_bundled_samples(o200k_tok, o200k_encoder, name):
    from test_render import SAMPLES, assert_identical, converted

    records = converted(SAMPLES / name)
    assert assert_identical(o200k_tok, records, encoder=o200k_encoder) == len(records)


def test_masks_identical_on_real_samples(o200k_tok, o200k_encoder):
    from test_render import REAL_FILES, REALDATA, assert_identical, converted

    total = 0
    for name in REAL_FILES:
        records = converted(REALDATA / name)
        assert records, name
        total += assert_identical(o200k_tok, records, encoder=o200k_encoder)
    assert total > 100


def test_masks_identical_on_generated_conversations(o200k_tok, o200k_encoder):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_render import assert_identical, conversations

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(records=st.lists(conversations(), min_size=1, max_size=4))
    def check(records):
        assert_identical(o200k_tok, records, encoder=o200k_encoder)

    check()


def test_trained_tokens_are_the_assistant_turn(o200k_tok):
    from beam_sft.render.encoder import encode_record

    record = {
        "messages": [
            {"role": "user", "content": "Wie spät ist es in 東京? 🙂"},
            {"role": "assistant", "reasoning_content": "Zeitzone JST.", "content": "Es ist 9 Uhr."},
        ]
    }
    out = encode_record(o200k_tok, record)
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert trained[0] == 200005 and trained[-1] == 200002  # <|channel|> ... <|return|>
    assert o200k_tok.decode(trained) == (
        "<|channel|>analysis<|message|>Zeitzone JST.<|end|><|start|>assistant<|channel|>final<|message|>"
        "Es ist 9 Uhr.<|return|>"
    )


# ---------- beam-sft inspect and the notebook ----------


def test_inspect_cli_with_the_real_vocabulary(o200k_dir, capsys):
    from beam_sft.cli import main as cli_main

    sample = REPO / "tests" / "data" / "realdata" / "openai" / "llamafactory_v1_reason_tool_use_demo_50.jsonl"
    assert cli_main(["inspect", str(sample), "--tokenizer_name_or_path", str(o200k_dir), "-n", "2", "--stats",
                     "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert "{+<|channel|>analysis<|message|>" in out and "<|return|>+}" in out
    assert re.search(r"records\s+50\n", out) and re.search(r"stop tokens outside the mask\s+0: none", out)


@pytest.mark.slow
def test_notebook_with_the_real_vocabulary(o200k_dir, o200k_encoder, tmp_path, monkeypatch):
    from test_inspect import REAL_SAMPLE, _run_notebook
    from test_render import converted

    monkeypatch.setenv("BEAM_INSPECT_TOKENIZER", str(o200k_dir))
    text, html, images = _run_notebook(tmp_path, REAL_SAMPLE, 0, "0,2")
    assert "50 records read, 50 converted" in text
    # The token count is the real vocabulary's (the bundled 6k one splits the same text into far more).
    tokens = sum(len(out["input_ids"]) for out in o200k_encoder.encode(converted(REAL_SAMPLE)))
    assert re.search(rf"\b{tokens}\b", text), text[-1500:]
    assert html.count("assistant:call") >= 2 and len(images) == 1


def test_bench_tokenization_row_on_the_real_vocabulary(o200k_tok, bench_script):
    bench = bench_script
    assert bench.make_parser().parse_args(["--tokenizer", "some/dir"]).tokenizer == "some/dir"
    fig = bench.bench_masked_tokenization(o200k_tok, bench.make_workload(40, seed=9), [], batch_size=16)
    assert fig["vocabulary"] == 201_088 and fig["encoder_backend"] == "tiktoken"
    assert fig["mismatches_vs_trl"] == 0 and fig["ids_mismatches_vs_hf_encode"] == 0
    assert fig["ids_mismatches_tiktoken_vs_hf"] == 0
    per_core = fig["tokens_per_cpu_s"]
    assert set(per_core) >= {"ours", "trl", "render", "hf_encode", "tiktoken_encode"}
    assert all(v > 0 for v in per_core.values())
    names = [row["name"] for row in bench.evaluate_goals({"masked_tokenization": fig})]
    assert any("tokens/s per core (201,088-token vocabulary, tiktoken)" in name for name in names)
    assert any("ceiling: tiktoken" in name for name in names)
