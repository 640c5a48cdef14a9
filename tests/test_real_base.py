"""The real base model, end to end on the CPU (issue 27's CI smoke test): SmolLM2-135M-Instruct from the
registry package, beamified, 3 steps of full fine-tuning and of LoRA; the loss falls, every marker row
changes and stays distinct from the others, and the saved model loads, generates and parses.

Learning figures are not measured here (3 steps teach nothing): `make demo-real` and docs/real-model.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizer_factories import script_module

from beam_sft.records.messages import HARMONY_MARKERS as MARKERS

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def beam_base(smollm2_dir, tmp_path_factory) -> tuple[Path, dict]:
    from beam_sft.model.beamify import beamify_directory

    out = tmp_path_factory.mktemp("real") / "beam-base"
    return out, beamify_directory(str(smollm2_dir), out)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    from beam_sft.cli.convert import main as convert_main

    out = tmp_path_factory.mktemp("real-data") / "train.jsonl"
    assert convert_main([str(REPO / "data" / "samples" / "openai.jsonl"), "-o", str(out), "-q"]) == 0
    lines = out.read_text().splitlines()[:8]
    out.write_text("\n".join(lines) + "\n")
    return out


def _marker_rows(model_dir: Path) -> torch.Tensor:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = [tokenizer.convert_tokens_to_ids(m) for m in MARKERS]
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        name = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))  # noqa: SIM118 - not a dict
        return f.get_tensor(name)[ids].float()


def _loss(model_dir: Path, records: Path) -> float:
    """Mean loss on the assistant tokens of the records, as training computes it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for line in records.read_text().splitlines():
        record = json.loads(line)
        enc = tokenizer.apply_chat_template(record["messages"], tools=record.get("tools"), return_dict=True,
                                            return_assistant_tokens_mask=True, **record.get("chat_template_kwargs", {}))
        ids = torch.tensor([enc["input_ids"]])
        labels = ids.clone()
        labels[0, torch.tensor(enc["assistant_masks"]) == 0] = -100
        with torch.no_grad():
            n = int((labels[0, 1:] != -100).sum())
            total += model(input_ids=ids, labels=labels).loss.item() * n
            count += n
    return total / count


def test_beamify_real_base(beam_base):
    out, report = beam_base
    assert report["old_vocab"] == 49_152 and report["new_vocab"] == 49_159 and report["tied"]
    assert report["checks_passed"] == 36  # beamify_directory writes nothing unless every rule passes
    assert report["rows"]["<|return|>"] == ["<|im_end|>"] and report["rows"]["<|start|>"] == ["<|im_start|>"]
    config = json.loads((out / "config.json").read_text())
    assert config["beam_sft"]["new_token_ids"] == list(range(49_152, 49_159))
    rows = _marker_rows(out)
    assert torch.cdist(rows, rows).add(torch.eye(len(MARKERS)) * 1e9).min() > 1e-3
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [
        report["new_token_ids"][MARKERS.index("<|return|>")], report["new_token_ids"][MARKERS.index("<|call|>")]]


def _train(argv: list[str]) -> None:
    train = script_module("train")
    train.main(*train.make_parser().parse_args_and_config(args=argv))


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_three_steps_learn_and_serve(beam_base, records, tmp_path, peft):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.model.export import export

    base, _ = beam_base
    torch.set_num_threads(2)
    run = tmp_path / "run"
    argv = ["--config", str(REPO / "configs" / ("demo_real_lora.yaml" if peft else "demo_real.yaml")),
            "--model_name_or_path", str(base), "--dataset_name", str(records), "--output_dir", str(run),
            "--max_steps", "3", "--per_device_train_batch_size", "2", "--max_length", "384",
            "--learning_rate", "2e-3" if peft else "1e-4", "--warmup_steps", "0", "--disable_tqdm", "true",
            "--prepared_cache_dir", str(tmp_path / "prepared")]
    _train(argv)
    model_dir = run
    if peft:
        adapter = json.loads((run / "adapter_config.json").read_text())
        assert adapter["trainable_token_indices"] == {"embed_tokens": list(range(49_152, 49_159))}
        model_dir = tmp_path / "merged"
        export(str(run), model_dir, merge=True)
    before, after = _marker_rows(base), _marker_rows(model_dir)
    assert ((after - before).abs().amax(dim=1) > 0).all(), "a marker row did not train"
    assert torch.cdist(after, after).add(torch.eye(len(MARKERS)) * 1e9).min() > 1e-3
    assert _loss(model_dir, records) < _loss(base, records)
    # save -> load -> generate -> parse, as a server would
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "Say hi."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    prefix = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert text and model.generation_config.eos_token_id[:2] == [tokenizer.convert_tokens_to_ids("<|return|>"),
                                                                   tokenizer.convert_tokens_to_ids("<|call|>")]
    parsed = tokenizer.parse_response(text if "<|return|>" in text or "<|call|>" in text else text + "<|return|>",
                                      prefix=prefix)
    assert isinstance(parsed, dict)
