"""Per-message loss weights: an assistant turn with `weight: 0` is context, not target, everywhere.

The chat template renders such a turn with the same text outside its `{% generation %}` block, so
`apply_chat_template(..., return_assistant_tokens_mask=True)`, plain TRL's labels, the fast encoder (both
its renderers), packed batches and `inspect` all leave it out of the loss, while the rendered text (and so
serving) is unchanged.
"""

from __future__ import annotations

import copy

import pytest

from beam_sft.render import direct as direct_render
from beam_sft.render.encoder import MaskedEncoder, encode_record, record_inputs
from beam_sft.render.jinja import SentinelRenderer, tracked_render
from beam_sft.report.masks import inspect_record

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}]


def _record(weights: tuple) -> dict:
    """Three assistant turns (answer, tool call, answer); `weights[k]` goes on the k-th (None: no field)."""
    turns = [
        {"role": "assistant", "reasoning_content": "", "content": "Hello."},
        {"role": "assistant", "reasoning_content": "Need the weather.", "tool_calls": [CALL]},
        {"role": "assistant", "reasoning_content": "It is sunny.", "content": "Sunny in Paris."},
    ]
    for turn, weight in zip(turns, weights, strict=True):
        if weight is not None:
            turn["weight"] = weight
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, turns[0],
                {"role": "user", "content": "Weather in Paris?"}, turns[1],
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, turns[2]]
    return {"messages": messages, "tools": TOOLS, "chat_template_kwargs": {"reasoning_effort": "low"}}


PLAIN = _record((None, None, None))
CASES = [(0, None, None), (0, 0, None), (None, 0, 1), (1, 1, 1), (0, 0, 0)]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """The runs of 1s in a mask, as (start, end)."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _template_encoding(tok, rec) -> dict:
    return tok.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=True, **rec["chat_template_kwargs"])


def _expected_mask(tok, weights) -> list[int]:
    """The unweighted record's mask with the runs of the weight-0 turns cleared (one run per turn)."""
    mask = list(_template_encoding(tok, PLAIN)["assistant_masks"])
    runs = _runs(mask)
    assert len(runs) == 3
    for (start, end), weight in zip(runs, weights, strict=True):
        if weight == 0:
            mask[start:end] = [0] * (end - start)
    return mask


@pytest.mark.parametrize("weights", CASES)
def test_apply_chat_template_masks_weight0_turns_and_keeps_text_and_ids(tok, weights):
    rec = _record(weights)
    got, plain = _template_encoding(tok, rec), _template_encoding(tok, PLAIN)
    assert got["input_ids"] == plain["input_ids"]
    assert tok.apply_chat_template(rec["messages"], tools=TOOLS, tokenize=False, reasoning_effort="low") == \
        tok.apply_chat_template(PLAIN["messages"], tools=TOOLS, tokenize=False, reasoning_effort="low")
    assert list(got["assistant_masks"]) == _expected_mask(tok, weights)
    assert sum(got["assistant_masks"]) < sum(plain["assistant_masks"]) or 0 not in weights


@pytest.mark.parametrize("weights", CASES)
def test_fast_encoder_and_both_renderers_agree(tok, encoder, weights):
    rec = _record(weights)
    want = _template_encoding(tok, rec)
    for enc in (encoder, MaskedEncoder(tok, force_fallback="forced for the test")):
        got = enc.encode([rec])[0]
        assert got["input_ids"] == want["input_ids"] and got["assistant_masks"] == list(want["assistant_masks"])
    assert encode_record(tok, rec)["assistant_masks"] == list(want["assistant_masks"])
    messages, tools, kwargs = record_inputs(rec)
    template_kwargs = {**tok.special_tokens_map, **kwargs}
    reference = tracked_render(tok.chat_template, messages, tools, template_kwargs)
    assert direct_render.for_template(tok.chat_template)(messages, tools, template_kwargs) == reference
    assert SentinelRenderer.build(tok.chat_template)(messages, tools, template_kwargs) == reference


def test_serving_prompt_is_unchanged(tok):
    """A client may send back history with weights: the prompt the model sees is the same."""
    rec = _record((0, 0, None))
    kwargs = {"tools": TOOLS, "tokenize": False, "add_generation_prompt": True}
    assert tok.apply_chat_template(rec["messages"][:-1], **kwargs) == \
        tok.apply_chat_template(PLAIN["messages"][:-1], **kwargs)


def test_inspect_shows_weight0_turns_as_context(tok, encoder):
    rec = _record((0, None, None))
    view = inspect_record(tok, rec, encoder=encoder)
    mask = _expected_mask(tok, (0, None, None))
    assert [int(t.trained) for t in view.tokens] == mask and view.trained == sum(mask)
    text = "".join(t.text for t in view.tokens)
    start = text.index("<|start|>assistant<|channel|>analysis<|message|><|end|>")
    first_turn_end = text.index("<|return|>") + len("<|return|>")
    pos = 0
    for t in view.tokens:
        if start <= pos < first_turn_end:
            assert not t.trained, t.text
        pos += len(t.text)
    assert view.stop_tokens_untrained == 1  # the masked turn's <|return|>, now context


def test_packed_batch_keeps_the_masks(tok):
    from inmemory import prepare_dataset
    from trl.data_utils import pack_dataset

    records = [_record(w) for w in ((0, None, None), (None, 0, None), (None, None, None))]
    dataset, _ = prepare_dataset(tok, records, max_length=None)
    for row, weights in zip(dataset, ((0, None, None), (None, 0, None), (None, None, None)), strict=True):
        mask = _expected_mask(tok, weights)
        assert row["labels"] == [t if m else -100 for t, m in zip(row["input_ids"], mask, strict=True)]
    total = sum(len(ids) for ids in dataset["input_ids"])
    packed = pack_dataset(dataset, seq_length=total, strategy="bfd")[0]
    # The three records have the same ids (same text); their labels differ only by the masked turn.
    offset, segments = 0, []
    for n in packed["seq_lengths"]:
        assert packed["input_ids"][offset: offset + n] == dataset[0]["input_ids"]
        segments.append(packed["labels"][offset: offset + n])
        offset += n
    assert sorted(segments) == sorted(dataset["labels"]) and len({tuple(s) for s in segments}) == 3


@pytest.mark.slow
def test_plain_trl_labels_leave_weight0_turns_out(tok, tiny_model_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    records = [_record(w) for w in CASES[:-1]]
    dataset = Dataset.from_list([copy.deepcopy(r) for r in records])
    hf_tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = SFTConfig(output_dir=str(tmp_path), assistant_only_loss=True, max_length=None, max_steps=1,
                     per_device_train_batch_size=2, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                     disable_tqdm=True, dataset_num_proc=None)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args,
                         train_dataset=dataset, processing_class=hf_tok)
    for row, weights in zip(trainer.train_dataset, CASES[:-1], strict=True):
        mask = _expected_mask(tok, weights)
        assert list(row["input_ids"]) == _template_encoding(tok, PLAIN)["input_ids"]
        assert [label != -100 for label in row["labels"]] == [bool(m) for m in mask]
