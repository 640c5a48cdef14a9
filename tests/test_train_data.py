"""beam_sft.dataset.examples: masks from the template, truncation policies, counts, packing isolation."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import torch
from inmemory import build_example, prepare_dataset, read_rows, to_beam_records

from beam_sft.dataset.examples import (
    IGNORE_INDEX,
    EmptyMaskError,
    assistant_spans,
    check_stop_tokens_trained,
    encode,
    truncate,
)
from beam_sft.errors import FatalError, RecordError, UsageError
from beam_sft.records.files import normalize_record
from beam_sft.template.tokenizer import load_tokenizer, stop_token_ids

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"

ANSWER = {
    "messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "reasoning_content": "Simple arithmetic.", "content": "4"},
    ]
}
TOOL_LOOP = {
    "messages": [
        {"role": "user", "content": "Weather in London and Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Both cities.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "London"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}},
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "14 C"},
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Report both.", "content": "London 14 C, Paris 18 C."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "reasoning_content": "Be polite.", "content": "You're welcome."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
            },
        }
    ],
}


def reference(tok, record):
    out = tok.apply_chat_template(
        record["messages"],
        tools=record.get("tools"),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **(record.get("chat_template_kwargs") or {}),
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


# ------------------------------------------------------------------------------------------ pure helpers


def test_assistant_spans():
    assert assistant_spans([0, 1, 1, 0, 0, 1, 0, 1, 1]) == [(1, 3), (5, 6), (7, 9)]
    assert assistant_spans([0, 0]) == []


@pytest.mark.parametrize(
    ("max_length", "policy", "expected_len", "counts"),
    [
        (20, "turn", 10, {"truncated": 0, "assistant_turns_cut": 0}),  # fits: untouched
        (8, "turn", 6, {"truncated": 1, "assistant_turns_cut": 1}),  # back to the end of turn 1
        (4, "turn", None, None),  # first turn does not fit: dropped
        (8, "drop", None, None),
        (8, "keep_start", 8, {"truncated": 1, "assistant_turns_cut": 1}),  # cut inside turn 2
        (7, "keep_start", 7, {"truncated": 1, "assistant_turns_cut": 1}),  # cut before turn 2: it is lost
    ],
)
def test_truncate_policies(max_length, policy, expected_len, counts):
    ids = list(range(10))
    mask = [0, 0, 1, 1, 1, 1, 0, 1, 1, 1]  # turns at [2, 6) and [7, 10)
    result = truncate(ids, mask, max_length, policy)
    if expected_len is None:
        assert result is None
        return
    out_ids, out_mask, out_counts = result
    assert out_ids == ids[:expected_len] and out_mask == mask[:expected_len]
    assert out_counts == counts


def test_truncate_unknown_policy():
    with pytest.raises(UsageError, match="unknown truncation policy 'middle'"):
        truncate([1, 2, 3], [0, 1, 1], 2, "middle")


def test_normalize_record_undoes_arrow_storage():
    stored = {
        "messages": [
            {"role": "user", "content": "hi", "reasoning_content": None, "tool_calls": None},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "call",
                "tool_calls": [{"id": None, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
        ],
        "tools": '[{"type": "function", "function": {"name": "f", "parameters": {}}}]',
        "chat_template_kwargs": None,
    }
    record = normalize_record(stored)
    assert record["messages"][0] == {"role": "user", "content": "hi"}
    assert record["messages"][1]["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    assert record["tools"][0]["function"]["name"] == "f"
    assert "chat_template_kwargs" not in record


def test_normalize_record_bad_arguments_is_a_record_error():
    bad = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}
    with pytest.raises(RecordError) as info:
        normalize_record(bad)
    assert info.value.code == "bad_arguments_json" and info.value.message_index == 0


# ------------------------------------------------------------------------------------------ reading


def test_samples_convert_with_rejects_accounted_for():
    for name, fmt in (("openai.jsonl", "auto"), ("sharegpt.json", "sharegpt"), ("harmony.jsonl", "auto")):
        rows = read_rows(str(SAMPLES / name))
        records, rejects = to_beam_records(rows, fmt)
        assert len(records) + len(rejects) == len(rows), name
        assert rejects, f"{name} is meant to carry a few bad records"
        assert all(r["source"] == str(SAMPLES / name) and r["reason"] for r in rejects)
        # Provenance as convert-dataset reports it: 1-based lines for JSONL, 0-based indexes otherwise.
        assert all(("line" in r) == name.endswith(".jsonl") and ("index" in r) != name.endswith(".jsonl")
                   for r in rejects)


def test_unreadable_lines_are_rejects_with_their_line(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(json.dumps(ANSWER).encode() + b"\n{not json\n" + b"\xff\xfe\n")
    records, rejects = to_beam_records(read_rows(str(path)), "auto")
    assert len(records) == 1
    assert [(r["line"], r["reason"]) for r in rejects] == [(2, "malformed_json"), (3, "invalid_utf8")]


def test_read_rows_parquet_and_directory(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.dumps(ANSWER), json.dumps(TOOL_LOOP)]
    (tmp_path / "a.jsonl").write_text(rows[0] + "\n")
    (tmp_path / "rejects.jsonl").write_text('{"reason": "x"}\n')  # convert-dataset's rejects: not data
    pq.write_table(pa.table({"messages": [json.dumps(TOOL_LOOP["messages"])]}), tmp_path / "b.parquet")
    got = read_rows(str(tmp_path))
    assert len(got) == 2 and orjson.loads(got[0].payload) == ANSWER
    with pytest.raises(UsageError, match="no such file"):
        read_rows(str(tmp_path / "missing.jsonl"))


# ------------------------------------------------------------------------------------------ masks


@pytest.mark.parametrize("record", [ANSWER, TOOL_LOOP], ids=["answer", "tool_loop"])
def test_labels_follow_the_template_mask(tok, record):
    ids, mask = reference(tok, record)
    example = build_example(tok, record, max_length=None, stop_ids=stop_token_ids(tok))
    assert example["input_ids"] == ids
    assert example["labels"] == [t if m else IGNORE_INDEX for t, m in zip(ids, mask, strict=True)]
    trained = tok.decode([t for t in example["labels"] if t != IGNORE_INDEX])
    assert trained.startswith("<|channel|>analysis<|message|>")
    assert "<|start|>user" not in trained and "to=assistant" not in trained  # no prompt, no tool output
    assert example["n_supervised_return"] == trained.count("<|return|>")
    assert example["n_supervised_call"] == trained.count("<|call|>")


def test_full_sequence_loss_when_asked(tok):
    example = build_example(tok, ANSWER, max_length=None, assistant_only_loss=False)
    assert example["labels"] == example["input_ids"]


def test_empty_mask_fails_loudly(tok):
    with pytest.raises(EmptyMaskError, match=r"train record 7: .*empty assistant mask"):
        build_example(tok, {"messages": [{"role": "user", "content": "hi"}]}, max_length=None, where="train record 7")


def test_chat_template_kwargs_are_honoured(tok):
    low = dict(ANSWER, chat_template_kwargs={"reasoning_effort": "low"})
    ids_low, _ = encode(tok, low)
    ids_default, _ = encode(tok, ANSWER)
    assert "Reasoning effort: 32" in tok.decode(ids_low)
    assert "Reasoning effort: 512" in tok.decode(ids_default)


def test_stop_tokens_trained_by_bundled_template(tok):
    check_stop_tokens_trained(tok)  # raises on failure


def test_stop_token_check_catches_a_template_that_leaves_them_out():
    tok = load_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|start|>{{ m.role }}<|message|>"
        "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}<|return|>"
        "{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}"
    )
    with pytest.raises(FatalError, match=r"does not train <\|return\|>, <\|call\|>"):
        check_stop_tokens_trained(tok)


# ------------------------------------------------------------------------------------------ datasets


def test_prepare_dataset_counts(tok):
    records = [ANSWER, TOOL_LOOP, dict(ANSWER, chat_template_kwargs={"reasoning_effort": "high"})]
    dataset, stats = prepare_dataset(tok, records, max_length=None)
    assert dataset.column_names == ["input_ids", "labels"] and len(dataset) == 3
    assert stats.records_in == stats.records_kept == 3
    assert stats.total_tokens == sum(len(x) for x in dataset["input_ids"])
    assert stats.supervised_tokens == sum(sum(t != IGNORE_INDEX for t in x) for x in dataset["labels"])
    assert stats.supervised_return == 4 and stats.supervised_call == 1
    assert (stats.truncated, stats.dropped_too_long, stats.assistant_turns_cut) == (0, 0, 0)
    assert "3/3 records kept" in stats.summary()


def test_prepare_dataset_truncation_is_counted(tok):
    _, mask = reference(tok, TOOL_LOOP)
    spans = assistant_spans(mask)
    assert len(spans) == 3
    # Room for the first two assistant turns and part of the third.
    max_length = spans[1][1] + 2
    dataset, stats = prepare_dataset(tok, [TOOL_LOOP, ANSWER], max_length=max_length, policy="turn")
    assert stats.truncated == 1 and stats.assistant_turns_cut == 1 and stats.records_kept == 2
    assert len(dataset[0]["input_ids"]) == spans[1][1]
    assert tok.decode(dataset[0]["input_ids"][-1:]) == "<|return|>"
    _, stats = prepare_dataset(tok, [TOOL_LOOP, ANSWER], max_length=max_length, policy="drop")
    assert stats.dropped_too_long == 1 and stats.records_kept == 1
    with pytest.raises(FatalError, match="empty after truncation"):
        prepare_dataset(tok, [TOOL_LOOP], max_length=spans[0][0] + 1, policy="turn")


# ------------------------------------------------------------------------------------------ packing


def _per_sequence_nll(model, batch, lengths):
    """Sum of token NLLs per original sequence, from one forward pass over `batch`."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        # use_cache=False as SFTTrainer.compute_loss sets it: transformers derives the block-diagonal mask of a
        # packed row from its position_ids only when no cache is in play.
        logits = model(**inputs, use_cache=False).logits.float()
    labels = batch["labels"]
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    target = labels[:, 1:]
    valid = target != IGNORE_INDEX
    nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
    flat = nll.reshape(-1)
    out, start = [], 0
    for n in lengths:
        out.append(float(flat[start : start + n - 1].sum()))
        start += n
    return out


def test_packing_keeps_masks_and_sequences_separate(tok):
    from trl.data_utils import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from beam_sft.model.load import build_tiny_model

    records = [ANSWER, TOOL_LOOP, dict(ANSWER, chat_template_kwargs={"reasoning_effort": "low"})]
    dataset, _ = prepare_dataset(tok, records, max_length=None)
    model = build_tiny_model(tok, seed=0).eval()
    model.config._attn_implementation = "sdpa"

    # Unpacked: each record on its own.
    alone = []
    for row in dataset:
        batch = {
            "input_ids": torch.tensor([row["input_ids"]]),
            "attention_mask": torch.ones(1, len(row["input_ids"]), dtype=torch.long),
            "labels": torch.tensor([row["labels"]]),
        }
        alone.append(_per_sequence_nll(model, batch, [len(row["input_ids"])])[0])

    # Packed the way SFTTrainer packs (bfd, padding-free: one row, position_ids restart per record).
    total = sum(len(x) for x in dataset["input_ids"])
    packed = pack_dataset(dataset, seq_length=total, strategy="bfd")
    assert len(packed) == 1
    row = packed[0]
    collator = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, padding_free=True)
    batch = collator([row])
    assert "attention_mask" not in batch
    # Masks stay exact: the packed labels are the records' labels, in packing order.
    order = []
    offset = 0
    for n in row["seq_lengths"]:
        segment = row["input_ids"][offset : offset + n]
        order.append(next(i for i, ids in enumerate(dataset["input_ids"]) if ids == segment))
        offset += n
    assert sorted(order) == [0, 1, 2]
    expected_labels = [t for i in order for t in dataset[i]["labels"]]
    assert batch["labels"][0].tolist() == expected_labels
    packed_nll = _per_sequence_nll(model, {k: batch[k] for k in ("input_ids", "position_ids", "labels")},
                                   row["seq_lengths"])
    for i, value in zip(order, packed_nll, strict=True):
        assert value == pytest.approx(alone[i], rel=1e-4, abs=1e-3)

    # Control: the same packed row with positions that do not restart lets records attend to each other,
    # and the per-record losses move. Without this the comparison above could pass vacuously.
    leaky = {"input_ids": batch["input_ids"], "labels": batch["labels"],
             "position_ids": torch.arange(batch["input_ids"].shape[1])[None]}
    leaky_nll = _per_sequence_nll(model, leaky, row["seq_lengths"])
    assert any(abs(a - alone[i]) > 1e-2 for i, a in zip(order[1:], leaky_nll[1:], strict=True))
