"""FSDP2 without a GPU: scripts/train.py under configs/accelerate/fsdp2.yaml on two CPU processes (gloo).

accelerate 1.15 drops an FSDP plugin over CPU processes (it trains DDP); `BEAM_SFT_FSDP_ON_CPU=1` makes it
shard (beam_sft/train/fsdp.py). Every run here is the real launcher with the repository's fsdp2.yaml, only
`--num_processes 2 --mixed_precision no` (and, for one run, the state-dict type) overridden on its command
line. Each run proves it sharded (the per-rank `fsdp_sharding.rank<r>.json` the run writes) rather than
assuming it, and its final save is checked as a whole model: loaded with `from_pretrained`, it generates
what the sharded in-memory model generated on rank 0, and `beam-sft eval` runs on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_train import TRAIN, free_port, losses

REPO = Path(__file__).resolve().parent.parent
FSDP2_YAML = REPO / "configs" / "accelerate" / "fsdp2.yaml"
pytestmark = pytest.mark.slow

MAX_STEPS = 4
COMMON = [
    "--config", str(REPO / "configs" / "quickstart.yaml"),
    "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
    "--dataset_format", "auto",
    "--max_records", "25",
    "--max_length", "512",
    "--packing", "false",
    "--per_device_train_batch_size", "2",
    "--max_steps", str(MAX_STEPS),
    "--learning_rate", "3e-3",
    "--warmup_steps", "0",
    "--logging_steps", "1",
    "--save_strategy", "steps",
    "--save_steps", "2",
    "--disable_tqdm", "true",
    "--report_to", "none",
    "--seed", "0",
]
# A resumed run replays the same batches on the same shards from the restored RNG and optimizer state.
RESUME_RTOL = 1e-5
GREEDY = {"max_new_tokens": 12, "do_sample": False}
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]

# Greedy tokens of the in-memory (sharded) model when training ends: every rank runs generate, since each
# forward all-gathers the shards; rank 0 writes what it got.
GREEDY_DRIVER = """
import json, sys
from pathlib import Path
import torch
from transformers import TrainerCallback
sys.path.insert(0, {scripts!r})
import train

class GreedyAtEnd(TrainerCallback):
    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        tok = processing_class
        prompt = tok.apply_chat_template({prompt!r}, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        model.eval()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **{greedy!r})
        model.train()
        if args.process_index == 0:
            Path({path!r}).write_text(json.dumps({{"prompt": ids[0].tolist(), "tokens": out[0].tolist()}}))

args = train.make_parser().parse_args_and_config(args={argv!r})
train.main(*args, callbacks=[GreedyAtEnd()])
"""


def env():
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "BEAM_SFT_FSDP_ON_CPU": "1",
    }


def launch(script: Path, argv: list[str], *launcher: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP2_YAML),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()), *launcher,
        str(script), *argv,
    ]
    proc = subprocess.run(cmd, env=env(), check=False, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc


def sharding(out: Path) -> dict[int, dict]:
    return {r: json.loads((out / f"fsdp_sharding.rank{r}.json").read_text()) for r in (0, 1)}


def assert_sharded_in_halves(out: Path) -> dict[int, dict]:
    """Both ranks hold every parameter as a DTensor sharded on dim 0, half of it each."""
    report = sharding(out)
    for rank, r in report.items():
        assert r["rank"] == rank and r["world_size"] == 2
        assert r["parameters"] > 0 and r["dtensor_parameters"] == r["parameters"], r
        for name, shard in r["shards"].items():
            assert shard["placements"] == ["S(0)"] and shard["mesh"] == "cpu", (name, shard)
            # torch shards dim 0 in chunks of ceil(n / 2): rank 0 the first, rank 1 what is left.
            rows = shard["shape"][0]
            expected = (rows + 1) // 2 if rank == 0 else rows - (rows + 1) // 2
            assert shard["local_shape"] == [expected, *shard["shape"][1:]], (rank, name, shard)
    # Shards partition the model: together the ranks hold every element once (dim-0 padding is not counted).
    assert report[0]["full_numel"] == report[1]["full_numel"]
    assert report[0]["local_numel"] + report[1]["local_numel"] == report[0]["full_numel"]
    assert abs(report[0]["local_numel"] - report[1]["local_numel"]) < 0.05 * report[0]["full_numel"]
    return report


def assert_sharded_checkpoint(checkpoint: Path) -> None:
    """An intermediate checkpoint as fsdp2.yaml asks (SHARDED_STATE_DICT): one distcp file per rank, no weights."""
    assert sorted(p.name for p in (checkpoint / "pytorch_model_fsdp_0").glob("*.distcp")) == \
        ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in (checkpoint / "optimizer_0").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not list(checkpoint.glob("*.safetensors"))


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    """Full fine-tune of the embedded tiny Llama, 4 steps, sharded checkpoints at 2 and 4."""
    base = tmp_path_factory.mktemp("fsdp_llama")
    out, greedy = base / "model", base / "greedy.json"
    argv = [*COMMON, "--output_dir", str(out), "--prepared_cache_dir", str(base / "cache")]
    driver = base / "driver.py"
    driver.write_text(GREEDY_DRIVER.format(scripts=str(REPO / "scripts"), prompt=PROMPT, greedy=GREEDY,
                                           path=str(greedy), argv=argv))
    proc = launch(driver, argv)
    return out, json.loads(greedy.read_text()), argv, proc.stdout + proc.stderr


def test_full_finetune_shards_the_tiny_llama(llama_run):
    out, _, _, log = llama_run
    report = assert_sharded_in_halves(out)
    assert report[1]["shards"]["model.embed_tokens.weight"]["local_shape"] == [3000, 128]
    assert report[0]["trainable_dtensor_parameters"] == report[0]["parameters"]
    # A CPU launch without the opt-in trains DDP: its log has this warning and DDP's reducer.cpp warnings.
    assert "accelerate trains DDP here" not in log and "reducer.cpp" not in log
    assert "FSDP: 20 of 20 parameters sharded; this rank holds 580928 of 1161856 elements" in log
    history = losses(out)
    assert sorted(history) == list(range(1, MAX_STEPS + 1))
    assert history[MAX_STEPS] < history[1], history
    for step in (2, 4):
        assert_sharded_checkpoint(out / f"checkpoint-{step}")


def test_final_save_is_whole_and_generates_like_the_sharded_model(llama_run):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.template.tokenizer import read_templates

    out, greedy, _, _ = llama_run
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [6000, 128]
    assert (out / "training_args.bin").is_file()  # as after a non-FSDP run
    model = AutoModelForCausalLM.from_pretrained(out)
    full = sharding(out)[0]["full_numel"]
    assert sum(p.numel() for p in model.parameters()) == full
    tok = AutoTokenizer.from_pretrained(out)
    assert (tok.chat_template, tok.response_template) == read_templates()
    assert tok.eos_token == "<|return|>"
    prompt = tok.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == greedy["prompt"]
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), **GREEDY)[0].tolist()
    assert len(tokens) > len(greedy["prompt"])
    assert tokens == greedy["tokens"]
    # Not the untrained model: the saved weights are the trained ones.
    from beam_sft.model.load import build_tiny_model

    init = build_tiny_model(tok, seed=0)
    assert not torch.equal(init.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_beam_sft_eval_runs_on_the_saved_model(llama_run, tmp_path):
    from beam_sft.cli import main as cli

    out, _, _, _ = llama_run
    metrics = tmp_path / "eval.json"
    code = cli(["eval", str(out), "--data", str(REPO / "data" / "samples" / "openai.jsonl"), "--max_records", "3",
                "--max-new-tokens", "16", "--json", str(metrics), "--quiet"])
    assert code == 0
    summary = json.loads(metrics.read_text())
    assert summary["turns"] == 3, summary


def test_resume_from_a_sharded_checkpoint_matches_the_uninterrupted_run(llama_run, tmp_path):
    out, _, argv, _ = llama_run
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    argv = [*argv[: argv.index("--output_dir")], "--output_dir", str(resumed),
            "--prepared_cache_dir", str(tmp_path / "cache"), "--resume_from_checkpoint", "last"]
    launch(TRAIN, argv)
    after, uninterrupted = losses(resumed), losses(out)
    assert sorted(after) == list(range(1, MAX_STEPS + 1))  # steps 1-2 from the checkpoint's history
    for step in (3, 4):
        assert after[step] == pytest.approx(uninterrupted[step], rel=RESUME_RTOL), (step, after, uninterrupted)
    assert_sharded_checkpoint(resumed / "checkpoint-4")
    assert (resumed / "model.safetensors").is_file()


def test_lora_under_fsdp2_with_full_state_dict_checkpoints(tmp_path):
    """LoRA under FSDP2, checkpoints in FULL_STATE_DICT: the adapter is saved whole and applies to the base."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer

    out = tmp_path / "lora"
    argv = [*COMMON, "--max_steps", "2", "--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16",
            "--lora_dropout", "0", "--lora_target_modules", "all-linear", "--output_dir", str(out),
            "--prepared_cache_dir", str(tmp_path / "cache")]
    launch(TRAIN, argv, "--fsdp_state_dict_type", "FULL_STATE_DICT")
    report = assert_sharded_in_halves(out)
    # Frozen base and trainable adapters alike are sharded; only the adapters train.
    assert 0 < report[0]["trainable_dtensor_parameters"] < report[0]["dtensor_parameters"]
    adapter = load_file(str(out / "adapter_model.safetensors"))
    a_key = next(k for k in adapter if "layers.0.self_attn.q_proj.lora_A" in k)
    b_key = a_key.replace("lora_A", "lora_B")
    assert adapter[a_key].shape == (8, 128) and adapter[b_key].shape == (128, 8)
    assert adapter[b_key].abs().sum() > 0  # B starts at zero: non-zero means trained and gathered whole
    assert not any("base_layer" in k for k in adapter)
    tok = load_tokenizer(out)
    merged = PeftModel.from_pretrained(build_tiny_model(tok, seed=0), out)
    loaded = dict(merged.named_parameters())
    key = next(k for k in loaded if "layers.0.self_attn.q_proj.lora_B" in k)
    assert torch.equal(loaded[key].detach(), adapter[b_key])
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()  # FULL_STATE_DICT checkpoints


def test_tiny_gpt_oss_experts_and_sinks_shard(tmp_path):
    """The tiny gpt-oss of configs/quickstart_gpt_oss.yaml (vocabulary cut to the bundled tokenizer's), loaded
    from a checkpoint directory as a user's run would (with fsdp2.yaml's cpu_ram_efficient_loading accelerate
    broadcasts rank 0's weights into the shards) and trained packed: fused expert tensors and attention sinks
    are sharded, trained, gathered and saved whole."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer, save_tokenizer

    config = json.loads((REPO / "configs" / "models" / "tiny_gpt_oss" / "config.json").read_text())
    config["vocab_size"] = 6000  # the 201k o200k vocabulary would make this test minutes long, not seconds
    (tmp_path / "tiny_gpt_oss").mkdir()
    (tmp_path / "tiny_gpt_oss" / "config.json").write_text(json.dumps(config))
    tok = load_tokenizer()
    base = build_tiny_model(tok, tmp_path / "tiny_gpt_oss", seed=0)
    base.save_pretrained(tmp_path / "base")
    save_tokenizer(tok, tmp_path / "base")
    out = tmp_path / "gpt_oss"
    argv = [*COMMON, "--max_steps", "2", "--model_name_or_path", str(tmp_path / "base"), "--packing", "true",
            "--output_dir", str(out), "--prepared_cache_dir", str(tmp_path / "cache")]
    log = launch(TRAIN, argv)
    assert "check-template: all rules pass" in log.stderr
    report = assert_sharded_in_halves(out)
    for rank in (0, 1):
        shards = report[rank]["shards"]
        assert shards["model.layers.0.mlp.experts.gate_up_proj"]["local_shape"] == [2, 128, 256]  # 2 of 4 experts
        assert shards["model.layers.1.self_attn.sinks"]["local_shape"] == [2]  # 2 of 4 heads' sinks
    assert json.loads((out / "packing_probe.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == "GptOssForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == report[0]["full_numel"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.self_attn.sinks" in names and "model.layers.1.mlp.experts.gate_up_proj" in names
    for layer in (0, 1):  # every shard of them was trained, and came back
        trained, before = model.model.layers[layer], base.model.layers[layer]
        for name in ("gate_up_proj", "down_proj"):
            t, b = getattr(trained.mlp.experts, name), getattr(before.mlp.experts, name)
            assert t.shape == b.shape and not torch.equal(t[:2], b[:2]) and not torch.equal(t[2:], b[2:]), name
        assert not torch.equal(trained.self_attn.sinks, before.self_attn.sinks)
    history = losses(out)
    assert sorted(history) == [1, 2] and all(torch.isfinite(torch.tensor(v)) for v in history.values())


def test_fsdp_on_cpu_without_the_opt_in_warns_and_leaves_accelerate_alone(monkeypatch, caplog):
    """Without BEAM_SFT_FSDP_ON_CPU, a CPU launch that asked for FSDP is told it trains DDP; nothing is patched."""
    import torch
    from accelerate.state import AcceleratorState

    from beam_sft.train import fsdp

    before = AcceleratorState.__init__
    monkeypatch.delenv(fsdp.CPU_FSDP_ENV, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level("WARNING", logger="beam_sft.train.fsdp"):
        assert fsdp.allow_fsdp_on_cpu() is False
    assert "accelerate trains DDP here" in caplog.text and fsdp.CPU_FSDP_ENV in caplog.text
    assert AcceleratorState.__init__ is before
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    caplog.clear()
    assert fsdp.allow_fsdp_on_cpu() is False and not caplog.text


def test_last_sharded_checkpoint_merges_into_the_final_model(llama_run, tmp_path):
    """checkpoint-4 (the last step) merged offline by accelerate holds exactly the weights of the final save."""
    from accelerate.utils import merge_fsdp_weights
    from safetensors.torch import load_file

    out, _, _, _ = llama_run
    merge_fsdp_weights(str(out / "checkpoint-4" / "pytorch_model_fsdp_0"), str(tmp_path / "merged"))
    merged, final = load_file(str(tmp_path / "merged" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(merged) == sorted(final)
    for name, tensor in final.items():
        assert merged[name].equal(tensor), name
