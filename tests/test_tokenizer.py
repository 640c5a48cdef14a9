"""The bundled tokenizer (data/tokenizer), its deterministic build, and beamify on other tokenizer families."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_factories import FACTORIES, sentencepiece_like, tiny_causal_lm
from transformers import AutoTokenizer

from beam_sft.errors import FatalError
from beam_sft.model.beamify import beamify
from beam_sft.template.tokenizer import (
    DEFAULT_TOKENIZER_DIR,
    EOS_TOKEN,
    MARKERS,
    PAD_TOKEN,
    PLAIN_MARKERS,
    install_templates,
    load_tokenizer,
    read_templates,
    save_tokenizer,
)

REPO = Path(__file__).resolve().parents[1]


def _build_script():
    spec = importlib.util.spec_from_file_location("build_tokenizer", REPO / "scripts" / "build_tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def _special_flags(tokenizer) -> dict[str, bool]:
    return {t.content: t.special for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values()}


def _assert_beam_tokens(tokenizer) -> None:
    for marker in MARKERS:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        assert len(ids) == 1, f"{marker} -> {ids}"
        assert tokenizer.convert_ids_to_tokens(ids[0]) == marker
    flags = _special_flags(tokenizer)
    assert {m: flags[m] for m in MARKERS} == {m: m == EOS_TOKEN for m in MARKERS}
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.pad_token is not None and tokenizer.pad_token not in MARKERS
    text = "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    kept = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True)
    assert kept == "<|start|>assistant<|channel|>final<|message|>Hi"


# ------------------------------------------------------------------------------------- bundled tokenizer


def test_bundled_markers_and_special_tokens(tok):
    _assert_beam_tokens(tok)
    assert tok.pad_token == PAD_TOKEN and _special_flags(tok)[PAD_TOKEN] is True
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.bos_token is None
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False), "encode adds a BOS/EOS"
    assert len(tok) == 6000


def test_bundled_pipeline_changes_no_text(tok):
    backend = json.loads(tok.backend_tokenizer.to_str())
    assert backend["normalizer"] is None
    assert (
        backend["pre_tokenizer"]["type"] == "ByteLevel"
        and backend["pre_tokenizer"]["add_prefix_space"] is False
    )
    assert tok.clean_up_tokenization_spaces is False


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_bundled_round_trip_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=20), st.sampled_from([*MARKERS, PAD_TOKEN])), max_size=12))
def test_bundled_round_trip_text_with_markers(tok, parts):
    text = "".join(parts)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # Every marker occurrence in the text, however the pieces joined, is exactly one marker token.
    marker_ids = {tok.convert_tokens_to_ids(m) for m in MARKERS}
    occurrences = len(re.findall("|".join(re.escape(m) for m in MARKERS), text))
    assert sum(i in marker_ids for i in ids) == occurrences


def test_bundled_templates_are_the_package_files(tok):
    chat_template, response_template = read_templates()
    assert tok.chat_template == chat_template
    # Same dict and the same key order: the order decides how parsed tool calls print.
    assert json.dumps(tok.response_template) == json.dumps(response_template)
    assert (DEFAULT_TOKENIZER_DIR / "chat_template.jinja").read_text(encoding="utf-8") == chat_template


def test_bundled_parse_response_and_stream_parser(tok):
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    generated = "<|channel|>analysis<|message|>Greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>"
    want = {"role": "assistant", "thinking": "Greeting.", "content": "Hello!"}
    assert tok.parse_response(generated, prefix=prompt) == want
    parser = tok.get_response_parser(prefix=prompt)
    chunks = [generated[i : i + 7] for i in range(0, len(generated), 7)]
    events = [e for chunk in chunks for e in parser.feed(chunk)]
    message, _ = parser.finalize()
    assert message == want
    streamed = "".join(e["text"] for e in events if e["type"] == "region_chunk" and e["field"] == "content")
    assert streamed == "Hello!"


def test_build_is_deterministic_and_data_tokenizer_is_current(tmp_path):
    build = _build_script()
    a, b = tmp_path / "a", tmp_path / "b"
    files_a = build.build(build.REPO / "data" / "tokenizer_corpus", a)
    build.build(build.REPO / "data" / "tokenizer_corpus", b)
    assert [p.name for p in files_a] == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert build.compare_dirs(a, b) == []
    assert build.compare_dirs(DEFAULT_TOKENIZER_DIR, a) == [], (
        "data/tokenizer is out of date: run python scripts/build_tokenizer.py"
    )


def test_build_check_mode_reports_a_stale_tokenizer(tmp_path, capsys):
    build = _build_script()
    out = tmp_path / "tok"
    build.build(build.REPO / "data" / "tokenizer_corpus", out)
    args = build.BuildTokenizerArguments(output_dir=str(out), check=True)
    assert build.main(args) == 0
    (out / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    assert build.main(args) == 1
    assert "chat_template.jinja" in capsys.readouterr().err


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(OSError):
        load_tokenizer(tmp_path / "nothing-here")
    with pytest.raises(FatalError, match="template file not found"):
        install_templates(load_tokenizer(), tmp_path)


def test_install_templates_rejects_a_broken_response_template(tmp_path, tok):
    chat_template, _ = read_templates()
    (tmp_path / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    (tmp_path / "response_template.json").write_text('{"fields": {}}', encoding="utf-8")
    with pytest.raises(ValueError, match="fields must be a non-empty dict"):
        install_templates(tok, tmp_path)
    (tmp_path / "response_template.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(FatalError, match="not valid JSON"):
        install_templates(tok, tmp_path)


# ---------------------------------------------------------------------------------------------- beamify


@pytest.mark.parametrize("family", sorted(FACTORIES))
def test_beamify_any_family(family, tmp_path):
    tokenizer = FACTORIES[family]()
    beamify(tokenizer)
    _assert_beam_tokens(tokenizer)
    chat_template, response_template = read_templates()
    assert tokenizer.chat_template == chat_template and tokenizer.response_template == response_template
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "reasoning_content": "Simple arithmetic.", "content": "4"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # The flags survive a save and reload.
    save_tokenizer(tokenizer, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    _assert_beam_tokens(reloaded)
    assert json.dumps(reloaded.response_template) == json.dumps(response_template)


def test_beamify_clears_special_flag_of_existing_markers():
    tokenizer = FACTORIES["gpt_oss_like"]()
    ids_before = {m: tokenizer.convert_tokens_to_ids(m) for m in MARKERS}
    assert all(_special_flags(tokenizer)[m] for m in MARKERS)
    len_before = len(tokenizer)
    beamify(tokenizer)
    assert {m: tokenizer.convert_tokens_to_ids(m) for m in MARKERS} == ids_before, "marker ids must not move"
    assert len(tokenizer) == len_before, "no token added: markers existed and the pad is <|endoftext|>"
    assert not any(str(t) in PLAIN_MARKERS for t in tokenizer.extra_special_tokens)
    assert tokenizer.pad_token == "<|endoftext|>"
    _assert_beam_tokens(tokenizer)


def test_beamify_adds_pad_when_missing_or_a_marker():
    tokenizer = FACTORIES["gpt2_like"]()
    assert tokenizer.pad_token is None
    beamify(tokenizer)
    assert tokenizer.pad_token == PAD_TOKEN
    other = FACTORIES["gpt2_like"]()
    other.pad_token = "<|endoftext|>"
    beamify(other)
    assert other.pad_token == "<|endoftext|>", "an existing, non-marker pad token is kept"


def test_beamify_is_idempotent():
    tokenizer = beamify(FACTORIES["llama_like"]())
    state = tokenizer.backend_tokenizer.to_str()
    beamify(tokenizer)
    assert tokenizer.backend_tokenizer.to_str() == state


def test_beamify_prefix_space_fix_and_what_it_prevents():
    fixed = beamify(sentencepiece_like())
    raw = beamify(sentencepiece_like(), fix_prefix_space=False)
    text = "<|start|>user<|message|>Hi there<|end|>"
    assert fixed.decode(fixed.encode(text, add_special_tokens=False)) == text
    # Without the fix every segment after a marker gains a "▁", i.e. a space in the decoded text.
    assert (
        raw.decode(raw.encode(text, add_special_tokens=False)) == "<|start|> user<|message|> Hi there<|end|>"
    )


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_beamify_resizes_model_with_mean_rows(tie):
    tokenizer = FACTORIES["gpt2_like"]()
    tokenizer_eos = tokenizer.eos_token
    old_len = len(tokenizer)
    model = tiny_causal_lm(old_len, tie_word_embeddings=tie)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    model.generation_config.eos_token_id = 7  # the base model's own EOS
    beamify(tokenizer, model, init="mean")
    new_len = len(tokenizer)
    assert new_len == old_len + len(MARKERS) + 1  # + <|pad|>
    new_in = model.get_input_embeddings().weight.detach()
    new_out = model.get_output_embeddings().weight.detach()
    assert new_in.shape[0] == new_out.shape[0] == new_len == model.config.vocab_size
    assert torch.equal(new_in[:old_len], old_in)
    assert torch.equal(new_in[old_len:], old_in.mean(dim=0).expand(new_len - old_len, -1))
    assert torch.equal(new_out[old_len:], old_out.mean(dim=0).expand(new_len - old_len, -1))
    assert (model.get_input_embeddings().weight is model.get_output_embeddings().weight) == tie
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert model.config.eos_token_id == eos
    # Generation stops at either stop token only: the base's own EOS is no Beam stop (BEAMIFY_EOS_DECISION).
    assert model.generation_config.eos_token_id == [eos, tokenizer.convert_tokens_to_ids("<|call|>")]
    assert model.config.beam_sft["new_token_ids"] == list(range(old_len, new_len))
    assert model.config.beam_sft["init"] == "mean" and model.config.beam_sft["base_eos"] == tokenizer_eos
    assert model.config.pad_token_id == model.generation_config.pad_token_id == tokenizer.pad_token_id
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), new_len)


def test_beamify_with_padded_embeddings_fills_rows_without_resizing():
    tokenizer = FACTORIES["gpt2_like"]()
    old_len = len(tokenizer)
    model = tiny_causal_lm(old_len + 64)  # embeddings padded past the vocabulary, as many checkpoints are
    old_in = model.get_input_embeddings().weight.detach().clone()
    beamify(tokenizer, model, init="mean")
    new_in = model.get_input_embeddings().weight.detach()
    assert new_in.shape[0] == old_len + 64
    assert torch.equal(
        new_in[old_len : len(tokenizer)], old_in[:old_len].mean(dim=0).expand(len(tokenizer) - old_len, -1)
    )
    assert torch.equal(new_in[len(tokenizer) :], old_in[len(tokenizer) :])
