"""beamify's marker rows (beam_sft.model.marker_init), LoRA on them (beam_sft.train.new_tokens), and
`beam-sft beamify` (beam_sft.model.beamify), on tiny models; the real base is tests/test_real_base.py."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizer_factories import FACTORIES, tiny_causal_lm

from beam_sft.errors import UsageError
from beam_sft.model.beamify import beamify, new_token_ids
from beam_sft.model.marker_init import MEANINGS, plan
from beam_sft.records.messages import HARMONY_MARKERS as MARKERS


def chatml_tokenizer():
    """A small byte-level BPE with ChatML's two special tokens, as SmolLM2 / Qwen have them."""
    tokenizer = FACTORIES["gpt2_like"]()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    return tokenizer


def _word_row(weight, tokenizer, word, old_len):
    ids = tokenizer.encode(word, add_special_tokens=False)
    assert ids and all(i < old_len for i in ids)
    return weight[ids].mean(dim=0)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_semantic_rows_are_what_the_markers_mean(tie):
    tokenizer = chatml_tokenizer()
    old_len = len(tokenizer)
    vocab = tokenizer.get_vocab()
    model = tiny_causal_lm(old_len, tie_word_embeddings=tie)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    beamify(tokenizer, model)
    new_in = model.get_input_embeddings().weight.detach()
    new_out = model.get_output_embeddings().weight.detach()
    assert torch.equal(new_in[:old_len], old_in) and torch.equal(new_out[:old_len], old_out)
    role_id = {"start": vocab["<|im_start|>"], "end": vocab["<|im_end|>"]}
    for marker, (role, word) in MEANINGS.items():
        i = tokenizer.convert_tokens_to_ids(marker)
        assert i >= old_len
        for old, new in ((old_in, new_in), (old_out, new_out)):
            parts = [old[role_id[role]]] + ([_word_row(old, tokenizer, word, old_len)] if word else [])
            torch.testing.assert_close(new[i], torch.stack(parts).mean(dim=0), msg=f"{marker} row")
    marker_ids = [tokenizer.convert_tokens_to_ids(m) for m in MARKERS]
    rows = new_in[marker_ids]
    distances = torch.cdist(rows, rows) + torch.eye(len(MARKERS)) * 1e9
    assert distances.min() > 1e-4, "two marker rows are equal"
    assert model.config.beam_sft["rows"]["<|call|>"] == ["<|im_end|>", " call"]
    assert model.config.beam_sft["rows"]["<|return|>"] == ["<|im_end|>"]
    # every pre-existing row kept; the pad beamify added (gpt2_like has none) starts at the mean
    pad = tokenizer.pad_token_id
    assert pad >= old_len and torch.allclose(new_in[pad], old_in.mean(dim=0))


def test_semantic_falls_back_where_the_base_lacks_a_role_token():
    tokenizer = FACTORIES["gpt2_like"]()  # no ChatML tokens; its EOS is <|endoftext|>
    steps = {row.token: row.parts for row, _ in plan_after_markers(tokenizer)}
    assert steps["<|return|>"] == ["<|endoftext|>"]
    assert steps["<|call|>"] == ["<|endoftext|>", " call"]
    start = tokenizer.bos_token
    assert steps["<|start|>"] == ([start] if start else ["mean"])
    assert all(parts for parts in steps.values())


def plan_after_markers(tokenizer):
    old_len, eos = len(tokenizer), tokenizer.eos_token
    beamify(tokenizer)
    return plan(tokenizer, old_len, len(tokenizer), "semantic", base_eos=eos)


def test_mean_init_and_bad_init():
    tokenizer = chatml_tokenizer()
    with pytest.raises(ValueError, match="semantic"):
        beamify(tokenizer, tiny_causal_lm(len(tokenizer)), init="zeros")


def test_new_token_ids_survive_save_and_load(tmp_path):
    from transformers import AutoModelForCausalLM

    tokenizer = chatml_tokenizer()
    old_len = len(tokenizer)
    model = tiny_causal_lm(old_len, tie_word_embeddings=True)
    beamify(tokenizer, model)
    assert new_token_ids(model) == list(range(old_len, len(tokenizer)))
    model.save_pretrained(tmp_path)
    assert new_token_ids(AutoModelForCausalLM.from_pretrained(tmp_path)) == list(range(old_len, len(tokenizer)))
    assert new_token_ids(tiny_causal_lm(10)) == []


def _lora(model, **kwargs):
    from peft import LoraConfig, get_peft_model

    from beam_sft.train.new_tokens import check_new_rows_trainable, make_new_rows_trainable

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **kwargs)
    report = make_new_rows_trainable(config, model)
    peft_model = get_peft_model(model, config)
    check_new_rows_trainable(peft_model, new_token_ids(model))
    return peft_model, report


def _train_steps(peft_model, tokenizer, steps=3):
    record = [{"role": "user", "content": "Hi"},
              {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hello!"}]
    ids = torch.tensor([tokenizer.apply_chat_template(record, return_dict=True)["input_ids"]])
    optim = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_lora_trains_the_new_rows_and_merges_them(tie):
    tokenizer = chatml_tokenizer()
    old_len = len(tokenizer)
    model = tiny_causal_lm(old_len, tie_word_embeddings=tie)
    beamify(tokenizer, model)
    before_in = model.get_input_embeddings().weight.detach().clone()
    before_out = model.get_output_embeddings().weight.detach().clone()
    peft_model, report = _lora(model)
    assert report["how"] == "trainable_token_indices" and report["tied"] == tie
    assert sorted(report["modules"]) == (["embed_tokens"] if tie else ["embed_tokens", "lm_head"])
    losses = _train_steps(peft_model, tokenizer)
    assert losses[-1] < losses[0]
    merged = peft_model.merge_and_unload()
    after_in = merged.get_input_embeddings().weight.detach()
    after_out = merged.get_output_embeddings().weight.detach()
    new = list(range(old_len, len(tokenizer)))
    markers = [tokenizer.convert_tokens_to_ids(m) for m in MARKERS]
    assert torch.equal(after_in[:old_len], before_in[:old_len]), "an old row moved under LoRA"
    changed = (after_in[markers] - before_in[markers]).abs().amax(dim=1)
    assert (changed > 0).all(), f"marker rows unchanged: {changed}"
    if tie:
        assert merged.get_output_embeddings().weight is merged.get_input_embeddings().weight
    else:
        assert ((after_out[markers] - before_out[markers]).abs().amax(dim=1) > 0).all()
        assert torch.equal(after_out[:old_len], before_out[:old_len])
    assert len(new) == len(MARKERS) + 1


def test_lora_refuses_two_copies_of_a_tied_matrix():
    from peft import LoraConfig

    from beam_sft.train.new_tokens import make_new_rows_trainable

    tokenizer = chatml_tokenizer()
    model = tiny_causal_lm(len(tokenizer), tie_word_embeddings=True)
    beamify(tokenizer, model)
    with pytest.raises(UsageError, match="tied"):
        make_new_rows_trainable(LoraConfig(r=4, modules_to_save=["embed_tokens", "lm_head"]), model)
    config = LoraConfig(r=4, trainable_token_indices=[3])
    make_new_rows_trainable(config, model)  # the user's own indices are kept, the new ones added
    assert config.trainable_token_indices["embed_tokens"] == sorted({3, *new_token_ids(model)})
    assert make_new_rows_trainable(None, model) is None
    assert make_new_rows_trainable(LoraConfig(r=4), tiny_causal_lm(50)) is None


def test_frozen_new_rows_are_refused():
    from peft import LoraConfig, get_peft_model

    from beam_sft.train.new_tokens import check_new_rows_trainable

    tokenizer = chatml_tokenizer()
    model = tiny_causal_lm(len(tokenizer), tie_word_embeddings=True)
    beamify(tokenizer, model)
    plain = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))  # what a bare LoRA config does
    with pytest.raises(UsageError, match="frozen"):
        check_new_rows_trainable(plain, new_token_ids(model))


def test_beamify_command(tmp_path, capsys):
    from beam_sft.cli import main

    tokenizer = chatml_tokenizer()
    base = tmp_path / "base"
    tiny_causal_lm(len(tokenizer), tie_word_embeddings=True).save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = tmp_path / "beam"
    assert main(["beamify", str(base), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_vocab"] == report["old_vocab"] + 8 and report["init"] == "semantic"
    assert report["checks_passed"] >= 30
    config = json.loads((out / "config.json").read_text())
    assert config["beam_sft"]["new_token_ids"] == report["new_token_ids"]
    generation = json.loads((out / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    beam = AutoTokenizer.from_pretrained(out)
    assert generation["eos_token_id"] == [beam.convert_tokens_to_ids("<|return|>"), beam.convert_tokens_to_ids("<|call|>")]
    assert main(["beamify", str(base), "-o", str(tmp_path / "mean"), "--init", "mean"]) == 0
    assert "mean of the old rows" in capsys.readouterr().out
    # a Beam model is not beamified twice; the output may not be the input
    assert main(["beamify", str(out), "-o", str(tmp_path / "again")]) == 2
    assert "already a Beam model" in capsys.readouterr().err
    assert main(["beamify", str(base), "-o", str(base)]) == 2
    assert not (tmp_path / "again").exists()
