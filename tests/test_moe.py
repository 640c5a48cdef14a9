"""gpt-oss-shaped models through scripts/train.py on the CPU: full and LoRA (experts included), packed.

A tiny random gpt-oss checkpoint (configs/models/tiny_gpt_oss: 2 layers, sliding window 16 / full, sinks, 4
experts top-2) sized to the bundled tokenizer, saved as a Beam checkpoint. Each run is 2 optimizer steps on
real converted records, packed (so the explicit-mask path of beam_sft/train/packing.py is what trains).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from beam_sft.errors import FatalError, UsageError

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "scripts" / "train.py"
MERGE = REPO / "scripts" / "merge_lora.py"
pytestmark = pytest.mark.slow

COMMON = [
    "--config", str(REPO / "configs" / "quickstart.yaml"),
    "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
    "--dataset_format", "auto",
    "--max_records", "8",
    "--max_length", "512",
    "--packing", "true",
    "--per_device_train_batch_size", "2",
    "--max_steps", "2",
    "--warmup_steps", "0",
    "--logging_steps", "1",
    "--save_strategy", "no",
    "--report_to", "none",
    "--disable_tqdm", "true",
    "--seed", "0",
]


def load_script(path: Path, name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def tiny_gpt_oss(tok, seed=0):
    from transformers import AutoModelForCausalLM, GptOssConfig

    config = json.loads((REPO / "configs" / "models" / "tiny_gpt_oss" / "config.json").read_text())
    config.update(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                  bos_token_id=tok.bos_token_id)
    config = GptOssConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


@pytest.fixture(scope="module")
def base(tok, tmp_path_factory):
    """A tiny gpt-oss Beam checkpoint on disk (model + tokenizer with both templates)."""
    from beam_sft.template.tokenizer import save_tokenizer

    path = tmp_path_factory.mktemp("gpt_oss_base")
    tiny_gpt_oss(tok).save_pretrained(path)
    save_tokenizer(tok, path)
    return path


def run_train(extra):
    train = load_script(TRAIN, "beam_train_script")
    torch.set_num_threads(1)
    args = train.make_parser().parse_args_and_config(args=[*COMMON, *extra])
    return train.main(*args)


def router_and_aux(trainer):
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 2
    return logged


@pytest.fixture(scope="module")
def full_run(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    trainer = run_train(["--model_name_or_path", str(base), "--output_dir", str(out), "--learning_rate", "1e-3",
                         "--check_template", "false"])
    return out, trainer


def test_full_training_packed_with_explicit_masks_and_router_loss(full_run):
    out, trainer = full_run
    assert trainer.state.global_step == 2
    probe = json.loads((out / "packing_probe.json").read_text())
    assert probe["model_type"] == "gpt_oss" and probe["path"] == "explicit_masks"
    assert probe["leak_before"] > 100 * probe["tolerance"] >= 100 * probe["leak_after"]
    for entry in router_and_aux(trainer):
        # gpt-oss declares router_aux_loss_coef 0.001; TRL turned the router logits on, the loss was logged.
        assert entry["aux_loss"] > 0 and torch.isfinite(torch.tensor(entry["loss"]))
    assert trainer.model.config.output_router_logits is True


def test_saved_model_loads_generates_and_parses(full_run, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.eval.backends import TransformersBackend
    from beam_sft.eval.run import EvalOptions, evaluate
    from beam_sft.eval.turns import read_held_out

    out, trainer = full_run
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    loaded_tok = AutoTokenizer.from_pretrained(out)
    assert loaded_tok.response_template == tok.response_template
    trained = trainer.model.eval()
    ids = torch.tensor([tok("<|start|>user<|message|>What is the weather in Paris today?<|end|>")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, trained(ids).logits, atol=1e-5)
    records = [r for r, _, _ in read_held_out(str(REPO / "data" / "samples" / "openai.jsonl"), max_records=3)
               if r is not None][:2]

    def run(model, tokenizer):
        seen = []
        evaluate(TransformersBackend(model, tokenizer, max_new_tokens=40, batch_size=1), tokenizer,
                 ((r, "openai") for r in records), EvalOptions(progress=False, on_result=seen.append))
        return sorted(seen, key=lambda t: t.turn.record)

    samples, again = run(loaded, loaded_tok), run(trained, tok)
    assert len(samples) == 2
    # The loaded model generates (with its sliding-window cache) exactly what the trained one does, and every
    # output went through parse_response: parsed, or a recorded parse error, never a crash.
    assert [s.generation.text for s in samples] == [s.generation.text for s in again]
    for sample in samples:
        assert sample.generation.text and (sample.parsed is not None or sample.parse_error or sample.reason)


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    trainer = run_train(["--model_name_or_path", str(base), "--output_dir", str(out), "--check_template", "false",
                         "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8",
                         "--lora_target_modules", "all-linear", "--lora_target_experts", "true",
                         "--learning_rate", "1e-2"])
    return out, trainer


def test_lora_on_experts_is_injected_and_trained(lora_run, base):
    from safetensors.torch import load_file

    from beam_sft.model.moe import count_expert_adapters

    out, trainer = lora_run
    model = trainer.model
    # 2 layers x (gate_up_proj, down_proj).
    assert count_expert_adapters(model) == 4
    expert_b = {n: p for n, p in model.named_parameters() if ".experts." in n and "lora_B" in n}
    assert len(expert_b) == 4
    # lora_B starts at zero: a non-zero one was trained.
    assert all(float(p.detach().abs().max()) > 0 for p in expert_b.values())
    assert model.peft_config["default"].lora_dropout == 0.0
    # The routers were left alone: no adapter, base weights untouched (frozen).
    assert not [n for n, _ in model.named_modules() if ".router." in n and "lora" in n]
    base_state = load_file(base / "model.safetensors")
    for name, param in model.named_parameters():
        if ".router." in name:
            key = name.removeprefix("base_model.model.")
            assert not param.requires_grad and torch.equal(param.detach(), base_state[key])
    saved = load_file(out / "adapter_model.safetensors")
    assert sum(".experts." in k for k in saved) == 8  # lora_A and lora_B of each of the 4
    for entry in router_and_aux(trainer):
        assert entry["aux_loss"] > 0


def test_merged_lora_equals_the_adapter_model(lora_run, base, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, trainer = lora_run
    merge = load_script(MERGE, "beam_merge_script")
    (args,) = merge.make_parser().parse_args_and_config(
        args=["--adapter_path", str(out), "--base_model_name_or_path", str(base), "--output_dir", str(tmp_path)]
    )
    merge.main(args)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base_state = load_file(base / "model.safetensors")
    assert not torch.equal(merged.model.layers[0].mlp.experts.gate_up_proj.detach(),
                           base_state["model.layers.0.mlp.experts.gate_up_proj"])
    ids = torch.randint(0, 6000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = trainer.model.eval()(ids).logits
        assert torch.allclose(merged(ids).logits, expected, atol=1e-4)


def test_expert_targets_need_experts_and_missing_adapters_fail(tok):
    from peft import get_peft_model
    from trl import ModelConfig

    from beam_sft.model.load import build_tiny_model
    from beam_sft.model.moe import build_peft_config, check_expert_adapters

    llama = build_tiny_model(tok)
    args = ModelConfig(use_peft=True, lora_target_modules=["q_proj", "v_proj"], lora_r=4)
    with pytest.raises(UsageError, match="no fused expert tensors"):
        build_peft_config(args, llama, target_experts=True)
    with pytest.raises(UsageError, match="use_peft"):
        build_peft_config(ModelConfig(), llama, target_experts=True)
    # A config that asked for experts but whose injection put none there (here: attention only) fails.
    peft_model = get_peft_model(tiny_gpt_oss(tok), build_peft_config(args, tiny_gpt_oss(tok)))
    assert check_expert_adapters(peft_model, wanted=False) == 0
    with pytest.raises(FatalError, match="no LoRA adapter sits on an expert tensor"):
        check_expert_adapters(peft_model, wanted=True)


def test_linear_routers_are_kept_out_of_all_linear(tok):
    """An MoE block with an nn.Linear gate (older / remote-code models): all-linear would adapt it."""
    from peft import get_peft_model
    from trl import ModelConfig, get_peft_config

    from beam_sft.model.moe import build_peft_config, router_module_names

    def with_linear_router():
        model = tiny_gpt_oss(tok)
        for layer in model.model.layers:
            layer.mlp.router = torch.nn.Linear(model.config.hidden_size, model.config.num_local_experts)
        return model

    args = ModelConfig(use_peft=True, lora_target_modules="all-linear", lora_r=4)
    model = with_linear_router()
    assert router_module_names(model) == ["model.layers.0.mlp.router", "model.layers.1.mlp.router"]
    ours = get_peft_model(model, build_peft_config(args, model))
    plain = get_peft_model(with_linear_router(), get_peft_config(args))
    adapted = lambda m: {n for n, mod in m.named_modules() if n.endswith("mlp.router") and hasattr(mod, "lora_A")}
    assert adapted(plain)  # the control: without the exclusion the routers get adapters
    assert not adapted(ours)
    assert any(hasattr(mod, "lora_A") for n, mod in ours.named_modules() if n.endswith("q_proj"))


def test_router_loss_is_added_once_and_equals_trls_path(tok, tmp_path):
    """Plain loss path (CPU) = TRL's fused path, both = LM loss + coef * aux_loss, and aux_loss is logged."""
    from inmemory import prepare_dataset, read_rows, to_beam_records
    from trl import SFTConfig

    from beam_sft.train.trainer import make_trainer_class

    records, _ = to_beam_records(read_rows(str(REPO / "data" / "samples" / "openai.jsonl"))[:4])
    dataset, _ = prepare_dataset(tok, records, max_length=512)
    trainer_cls = make_trainer_class()
    values = {}
    for plain, coef in ((True, 0.0), (True, 0.5), (False, 0.5)):
        args = SFTConfig(output_dir=str(tmp_path / f"{plain}{coef}"), use_cpu=True, bf16=False, report_to="none",
                         per_device_train_batch_size=2, max_length=512, router_aux_loss_coef=coef)
        trainer = trainer_cls(model=tiny_gpt_oss(tok), args=args, train_dataset=dataset, processing_class=tok,
                              plain_loss=plain)
        batch = trainer.data_collator([dataset[i] for i in range(2)])
        trainer.model.train()
        values[plain, coef] = float(trainer.compute_loss(trainer.model, dict(batch)).detach())
        aux = trainer._metrics["train"].get("aux_loss")
        assert (aux is not None and aux[0] > 0) == (coef > 0)
        if coef:
            aux_value = aux[0]
    assert values[True, 0.5] == pytest.approx(values[False, 0.5], rel=1e-5)
    assert values[True, 0.5] - values[True, 0.0] == pytest.approx(0.5 * aux_value, rel=1e-4)


def test_moe_configs_parse():
    train = load_script(TRAIN, "beam_train_script")
    script, training, model = train.make_parser().parse_args_and_config(
        args=["--config", str(REPO / "configs" / "beam_moe_lora.yaml"), "--use_cpu", "true", "--bf16", "false"]
    )
    assert script.lora_target_experts and model.use_peft and model.lora_dropout == 0.0
    assert model.attn_implementation == "eager" and training.router_aux_loss_coef == 0.001
    assert training.packing and training.packing_check == "auto"
    script, training, _ = train.make_parser().parse_args_and_config(
        args=["--config", str(REPO / "configs" / "quickstart_gpt_oss.yaml")]
    )
    assert script.tiny_model_config == "configs/models/tiny_gpt_oss" and training.use_cpu


def test_batched_generation_with_router_logits_on(full_run, tok):
    """A model trained with the router loss keeps output_router_logits on; beam-sft eval's batched, left-padded
    generation must still run (transformers' aux-loss code fails on such batches) and leave the config as it
    was."""
    from beam_sft.eval.backends import TransformersBackend

    _, trainer = full_run
    model = trainer.model
    assert model.config.output_router_logits is True
    prompts = ["<|start|>user<|message|>Hi<|end|><|start|>assistant",
               "<|start|>user<|message|>What is the weather in Paris today, and tomorrow?<|end|><|start|>assistant"]
    generations = TransformersBackend(model, tok, max_new_tokens=8, batch_size=2).generate(prompts)
    assert len(generations) == 2 and all(g.n_tokens > 0 for g in generations)
    assert model.config.output_router_logits is True
