"""What `beam-sft prepare` pays before its first record: the tokenizer loaded without transformers re-reading
tokenizer.json, and the warm start (`beam_sft.render.warm`) that answers from a snapshot of an earlier setup."""

from __future__ import annotations

import json
import shutil

import pytest

from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR, _head_value, load_tokenizer

TEXTS = (
    "hello world",
    "<|start|>user<|message|>Hi there<|end|><|start|>assistant<|channel|>final<|message|>Hey<|return|>",
    "café 日本語 🙂 \t\n  spaces",
    "<|pad|><|endoftext|><|startoftext|><|call|>",
)


def _state(tokenizer) -> dict:
    """Everything a loaded tokenizer is: its attributes, the backend's serialisation, and what it answers."""
    state = {key: repr(value) for key, value in vars(tokenizer).items() if key not in ("_tokenizer", "init_kwargs")}
    state["init_kwargs"] = [(key, repr(value)) for key, value in tokenizer.init_kwargs.items()]
    state["backend"] = tokenizer._tokenizer.to_str()
    state["special_tokens_map"] = tokenizer.special_tokens_map
    state["added_tokens_decoder"] = {i: repr(t) for i, t in tokenizer.added_tokens_decoder.items()}
    state["chat_template"] = tokenizer.chat_template
    state["len"] = len(tokenizer)
    state["pad"] = (tokenizer.pad_token, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
    state["encoded"] = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    state["encoded_special"] = [tokenizer.encode(t) for t in TEXTS]
    state["decoded"] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in state["encoded"]]
    return state


def _reference(path):
    import transformers

    named = json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"]
    return getattr(transformers, named).from_pretrained(str(path))


@pytest.mark.parametrize("which", ["bundled", "o200k"])
def test_load_tokenizer_is_from_pretrained(which, request):
    path = DEFAULT_TOKENIZER_DIR if which == "bundled" else request.getfixturevalue("o200k_dir")
    assert _state(load_tokenizer(path)) == _state(_reference(path))


def test_load_tokenizer_reads_legacy_files_as_transformers_does(tmp_path):
    """A special_tokens_map.json (read by transformers only when the config has no added_tokens_decoder) keeps
    transformers' own path."""
    shutil.copytree(DEFAULT_TOKENIZER_DIR, tmp_path / "tok")
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|start|>"}))
    ours, theirs = load_tokenizer(tmp_path / "tok"), _reference(tmp_path / "tok")
    assert ours.bos_token == "<|start|>"
    assert _state(ours) == _state(theirs)


def test_head_value_reads_members_cut_anywhere(tmp_path):
    doc = {"version": "1.0", "n": 12345678, "flag": True, "nested": {"added_tokens": [1]},
           "added_tokens": [{"id": 5, "content": "a\"b"}], "model": {"vocab": {"x": 1}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=2))
    for chunk in (1, 3, 7, 64, 1 << 20):
        assert _head_value(path, "added_tokens", chunk=chunk) == doc["added_tokens"]
        assert _head_value(path, "n", chunk=chunk) == doc["n"]
    with pytest.raises(ValueError):
        _head_value(path, "absent")
