"""Padding-free packing is exact on every architecture we train, or refused (beam_sft/train/packing.py).

Tiny random models (bundled 6,000-token vocabulary) of gpt-oss (sinks, alternating sliding / full layers,
MoE), Qwen2 and Qwen3 with sliding windows, and Llama. Real converted sample records, all longer than the
16-token windows, packed into one row exactly as SFTTrainer packs them (BFD, padding-free collator). After
`ensure_exact_packing`, every record's loss in the pack equals its loss alone; a control row whose positions do
not restart shows each comparison can fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from beam_sft.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
WINDOW = 16
SMALL = {"vocab_size": 6000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096}


def gpt_oss_config():
    from transformers import GptOssConfig

    config = json.loads((REPO / "configs" / "models" / "tiny_gpt_oss" / "config.json").read_text())
    config.update(vocab_size=6000, sliding_window=WINDOW)
    return GptOssConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})


def make_model(arch: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    if arch == "gpt_oss":
        config, attn = gpt_oss_config(), "eager"
    elif arch == "qwen2":  # layer 0 full, layer 1 sliding
        config = Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        attn = "sdpa"
    elif arch == "qwen3":
        config = Qwen3Config(**SMALL, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        attn = "eager"
    else:
        config, attn = LlamaConfig(**SMALL), "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


ARCHS = ["gpt_oss", "qwen2", "qwen3", "llama"]


def packing_args(**overrides):
    return SimpleNamespace(**{"packing": True, "packing_strategy": "bfd", "padding_free": False, **overrides})


@pytest.fixture(scope="module")
def packed(tok):
    """(dataset, one packed row, its collated batch, record order in the row) for 4 real records."""
    from inmemory import prepare_dataset, read_rows, to_beam_records
    from trl.data_utils import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    records, _ = to_beam_records(read_rows(str(REPO / "data" / "samples" / "openai.jsonl"))[:4])
    dataset, _ = prepare_dataset(tok, records, max_length=512)
    assert min(len(ids) for ids in dataset["input_ids"]) > 4 * WINDOW
    total = sum(len(ids) for ids in dataset["input_ids"])
    row = pack_dataset(dataset, seq_length=total, strategy="bfd")[0]
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, padding_free=True)([row])
    order, offset = [], 0
    for n in row["seq_lengths"]:
        order.append(dataset["input_ids"].index(row["input_ids"][offset : offset + n]))
        offset += n
    return dataset, row, batch, order


def record_nll(model, batch, lengths):
    """Per-record mean NLL over the supervised tokens, from one forward pass (use_cache=False, as SFTTrainer)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[0, :-1], dim=-1)
    target = batch["labels"][0, 1:]
    valid = target != -100
    nll = -logp.gather(-1, target.clamp(min=0)[:, None])[:, 0] * valid
    out, start = [], 0
    for n in lengths:
        out.append(float(nll[start : start + n - 1].sum() / valid[start : start + n - 1].sum()))
        start += n
    return out


def alone_nll(model, dataset):
    return [
        record_nll(model, {"input_ids": torch.tensor([r["input_ids"]]), "labels": torch.tensor([r["labels"]]),
                           "position_ids": torch.arange(len(r["input_ids"]))[None]}, [len(r["input_ids"])])[0]
        for r in dataset
    ]


def leaky_control(batch):
    return {"input_ids": batch["input_ids"], "labels": batch["labels"],
            "position_ids": torch.arange(batch["input_ids"].shape[1])[None]}


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_losses_equal_unpacked_after_the_probe(arch, packed):
    from beam_sft.train.packing import ensure_exact_packing

    dataset, row, batch, order = packed
    model = make_model(arch)
    alone = alone_nll(model, dataset)
    before = record_nll(model, batch, row["seq_lengths"])

    report = ensure_exact_packing(model, packing_args())
    after = record_nll(model, batch, row["seq_lengths"])
    control = record_nll(model, leaky_control(batch), row["seq_lengths"])

    for i, value in zip(order, after, strict=True):
        assert value == pytest.approx(alone[i], rel=1e-5), (arch, report.line())
    # The control leaks on every architecture: the equality above is not vacuous.
    assert max(abs(c - alone[i]) for i, c in zip(order[1:], control[1:], strict=True)) > 1e-3
    assert report.control > 100 * report.tolerance
    if arch == "gpt_oss":
        # transformers does not isolate packed records for gpt-oss: the probe saw it and the masks fixed it.
        assert report.path == "explicit_masks"
        assert report.leak_before > 100 * report.tolerance and report.leak_after <= report.tolerance
        assert max(abs(b - alone[i]) for i, b in zip(order[1:], before[1:], strict=True)) > 1e-3
    else:
        assert report.path == "native" and report.leak_before <= report.tolerance
        assert before == after


def test_explicit_masks_keep_the_sliding_window(packed, monkeypatch):
    """A block-diagonal mask that forgot the window (full causal on the sliding layers) is caught."""
    from beam_sft.train import packing

    dataset, row, batch, order = packed
    model = make_model("gpt_oss")
    alone = alone_nll(model, dataset)
    handle = packing.install_packed_mask_hook(model)
    right = record_nll(model, batch, row["seq_lengths"])
    handle.remove()
    model.model._beam_packed_mask_hook = None

    monkeypatch.setattr(packing, "_layer_types", lambda config: ["full_attention"])
    packing.install_packed_mask_hook(model)
    windowless = record_nll(model, batch, row["seq_lengths"])
    for i, r, w in zip(order, right, windowless, strict=True):
        assert r == pytest.approx(alone[i], rel=1e-5)
        # Every record is longer than the window, so its own first record already differs.
        assert abs(w - alone[i]) > 1e-3
    # And the probe itself catches it: sequences longer than the window.
    leak, _control, tolerance, lengths = packing.probe(model)
    assert min(lengths) > WINDOW and leak > 100 * tolerance


def test_refuse_mode_names_model_and_attention():
    from beam_sft.train.packing import ensure_exact_packing

    with pytest.raises(UsageError, match=r"model type 'gpt_oss' with attn_implementation 'eager'"):
        ensure_exact_packing(make_model("gpt_oss"), packing_args(), mode="refuse")


def test_a_model_still_leaking_with_masks_is_refused(monkeypatch):
    """Never leak silently: if the explicit masks do not isolate the records either, packing is refused."""
    from beam_sft.train import packing

    monkeypatch.setattr(packing, "packed_masks", lambda *args, **kwargs: None)
    model = make_model("gpt_oss")
    with pytest.raises(UsageError, match="even with explicit block-diagonal masks"):
        packing.ensure_exact_packing(model, packing_args())
    assert model.model._beam_packed_mask_hook is None
    assert not model.model._forward_pre_hooks


def test_unpacked_runs_and_wrapped_packing(caplog):
    from beam_sft.train.packing import ensure_exact_packing

    model = make_model("gpt_oss")
    assert ensure_exact_packing(model, packing_args(packing=False)) is None
    assert not model.model._forward_pre_hooks
    with pytest.raises(UsageError, match="wrapped"):
        ensure_exact_packing(model, packing_args(packing_strategy="wrapped"))
    # padding_free without packing also concatenates a batch into one row: probed too.
    assert ensure_exact_packing(model, packing_args(packing=False, padding_free=True)).path == "explicit_masks"


def test_hook_leaves_generation_and_padded_batches_alone(tok):
    from beam_sft.train.packing import install_packed_mask_hook

    model = make_model("gpt_oss")
    ids = torch.tensor([tok("<|start|>user<|message|>Hello there, how are you today?<|end|>")["input_ids"]])
    mask = torch.ones_like(ids)
    kwargs = {"max_new_tokens": WINDOW + 8, "do_sample": False, "pad_token_id": tok.pad_token_id}
    plain = model.generate(ids, attention_mask=mask, **kwargs)
    padded = {"input_ids": torch.cat([ids, ids[:, :5]], 1), "attention_mask": torch.cat([mask, 0 * mask[:, :5]], 1)}
    with torch.no_grad():
        padded_before = model(**padded).logits
    install_packed_mask_hook(model)
    assert torch.equal(model.generate(ids, attention_mask=mask, **kwargs), plain)
    with torch.no_grad():
        assert torch.equal(model(**padded).logits, padded_before)


def test_partitioned_model_gets_the_masks_unprobed(packed):
    """ZeRO-3 parameters cannot run a forward before the engine: masks installed, the run says so."""
    from beam_sft.train.packing import ensure_exact_packing

    dataset, row, batch, order = packed
    model = make_model("gpt_oss")
    first = next(model.parameters())
    first.ds_id = 0
    with pytest.raises(UsageError, match="cannot be probed"):
        ensure_exact_packing(model, packing_args(), mode="refuse")
    report = ensure_exact_packing(model, packing_args())
    assert report.path == "explicit_masks_unprobed" and model.model._beam_packed_mask_hook is not None
    del first.ds_id
    alone = alone_nll(model, dataset)
    for i, value in zip(order, record_nll(model, batch, row["seq_lengths"]), strict=True):
        assert value == pytest.approx(alone[i], rel=1e-5)


@pytest.mark.parametrize("arch", ["gpt_oss", "llama"])
def test_bf16_rounding_is_not_taken_for_a_leak(arch):
    """In bf16 packed and alone differ by rounding; the probe's noise floor keeps that from refusing packing."""
    from beam_sft.train.packing import ensure_exact_packing

    report = ensure_exact_packing(make_model(arch).to(torch.bfloat16), packing_args())
    assert report.path == ("explicit_masks" if arch == "gpt_oss" else "native")
    assert report.control > 10 * report.tolerance
