"""Plain TRL trains on every `convert-dataset` output, with no beam-sft code in the loop.

What a TRL user does with our output: load it with the plain `datasets` loaders (`load_dataset("json" |
"parquet")`, `load_from_disk`), hand it to `SFTTrainer(args=SFTConfig(assistant_only_loss=True))` with a Beam
tokenizer, or run the `trl sft` command line on it. For each output format, on the bundled samples and the
real third-party samples, TRL's own `input_ids` and `labels` must equal what `apply_chat_template(...,
return_assistant_tokens_mask=True)` gives for the record as converted, and a training step must run.

beam-sft code is used only to produce the inputs (the conversion, the tiny model's weights, a tokenizer dir);
everything between the output files and the trained step is datasets + TRL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"
REAL = REPO / "tests" / "data" / "realdata"
pytestmark = pytest.mark.slow

OUTPUTS = {"jsonl": "beam.jsonl", "parquet": "beam.parquet", "disk": "beam_ds"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """convert-dataset of the bundled + real samples, once per output format; also the JSONL read raw."""
    from beam_sft.cli.convert import main as convert_main

    root = tmp_path_factory.mktemp("plain_trl")
    inputs = [str(SAMPLES), *(str(REAL / name) for name in ("openai", "sharegpt", "harmony", "hermes", "xlam_like",
                                                          "reasoning"))]
    # Most real samples have no reasoning: kept here (under the default `mask` they would have nothing to
    # train); test_weights.py holds TRL's labels equal to the template's on weight-0 turns.
    for name in OUTPUTS.values():
        assert convert_main([*inputs, "-o", str(root / name), "-q", "--missing_reasoning", "keep"]) == 0
    records = [orjson.loads(line) for line in (root / OUTPUTS["jsonl"]).read_bytes().splitlines()]
    assert len(records) > 900
    return root, records


def test_jsonl_rows_have_the_documented_shape(converted):
    _, records = converted
    for rec in records:
        assert set(rec) == {"messages", "tools", "chat_template_kwargs"}
        assert isinstance(rec["chat_template_kwargs"], dict)
        assert rec["tools"] is None or (isinstance(rec["tools"], list) and rec["tools"])
    assert any(rec["chat_template_kwargs"] for rec in records), "samples should exercise reasoning effort"
    assert any(rec["tools"] is None for rec in records) and any(rec["tools"] for rec in records)


def _plain_load(root: Path, kind: str):
    from datasets import load_dataset, load_from_disk

    path = root / OUTPUTS[kind]
    if kind == "disk":
        return load_from_disk(str(path))
    return load_dataset(kind if kind != "jsonl" else "json", data_files=str(path), split="train")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_sft_trainer_labels_equal_template_masks(converted, model_dir, kind, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    root, records = converted
    dataset = _plain_load(root, kind)
    assert len(dataset) == len(records)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    args = SFTConfig(
        output_dir=str(tmp_path), assistant_only_loss=True, max_length=None, max_steps=1,
        per_device_train_batch_size=2, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
        activation_checkpointing=False, disable_tqdm=True, dataset_num_proc=None, learning_rate=1e-3,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)

    prepared = trainer.train_dataset
    assert len(prepared) == len(records)
    mismatches = []
    for i, (rec, row) in enumerate(zip(records, prepared, strict=True)):
        want = tok.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True, **rec["chat_template_kwargs"])
        want_labels = [t if m else -100 for t, m in zip(want["input_ids"], want["assistant_masks"], strict=True)]
        if list(row["input_ids"]) != list(want["input_ids"]) or list(row["labels"]) != want_labels:
            mismatches.append(i)
    assert not mismatches, f"{kind}: TRL's ids/labels differ from the template's on records {mismatches[:10]}"
    assert sum(1 for row in prepared if any(label != -100 for label in row["labels"])) == len(records)

    before = next(model.parameters()).detach().clone()
    trainer.train()
    assert trainer.state.global_step == 1
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))
    assert not torch.equal(before, next(model.parameters()).detach())


@pytest.mark.parametrize("kind", ["jsonl_dir", "arrow_mixture"])
def test_trl_sft_command_line(converted, model_dir, kind, tmp_path):
    """`trl sft` as installed: `--dataset_name DIR` on a directory holding the JSONL output, and the
    `datasets:` mixture of a YAML config on the save_to_disk output's Arrow files (`data-*.arrow`: `datasets`
    writes its own `cache-*.arrow` files into a directory read by `load_from_disk`)."""
    root, _ = converted
    cfg = {
        "model_name_or_path": str(model_dir), "output_dir": str(tmp_path / "out"), "assistant_only_loss": True,
        "max_length": None, "max_steps": 1, "per_device_train_batch_size": 2, "report_to": "none",
        "use_cpu": True, "bf16": False, "save_strategy": "no", "activation_checkpointing": False,
        "disable_tqdm": True, "dtype": "float32",
    }
    if kind == "jsonl_dir":
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        (data_dir / "train.jsonl").write_bytes((root / OUTPUTS["jsonl"]).read_bytes())
        cfg["dataset_name"] = str(data_dir)
    else:
        cfg["datasets"] = [{"path": "arrow", "data_files": str(root / OUTPUTS["disk"] / "data-*.arrow"),
                            "split": "train"}]
    config_file = tmp_path / "sft.yaml"
    config_file.write_text(json.dumps(cfg))  # JSON is YAML
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    trl = Path(sys.executable).parent / "trl"
    proc = subprocess.run([str(trl), "sft", "--config", str(config_file)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()
