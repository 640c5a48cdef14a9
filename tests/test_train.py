"""scripts/train.py end to end on the embedded tiny model: one process, DDP on gloo, kill -9 and resume.

All runs share one small setup (25 raw OpenAI-format sample rows converted on the fly, one of them bad;
6 steps of a global batch of 4 = one epoch) so their per-step losses can be compared with each other.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "scripts" / "train.py"
pytestmark = pytest.mark.slow

MAX_STEPS = 6
COMMON = [
    "--config", str(REPO / "configs" / "quickstart.yaml"),
    "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
    "--dataset_format", "auto",
    "--max_records", "25",  # 24 records after the one bad row: 6 steps of 4 are exactly one epoch
    "--max_length", "512",
    "--packing", "false",  # one record per row, so DDP never pads a last batch with repeats
    "--max_steps", str(MAX_STEPS),
    "--learning_rate", "3e-3",
    "--warmup_steps", "0",
    "--logging_steps", "1",
    "--save_strategy", "steps",
    "--save_steps", "2",
    "--disable_tqdm", "true",
    "--seed", "0",
]
# Same global batch: 4 in one process, 2 x 2 in DDP.
SINGLE = ["--per_device_train_batch_size", "4"]
# Loss tolerance between a DDP run and a single-process run of the same global batches: the token-weighted
# loss is the same sum, reduced in a different order (per rank, then all-reduce), and padding differs.
DDP_RTOL = 1e-3
# A resumed run replays the same batches from the same RNG state: only thread-level float noise remains.
RESUME_RTOL = 1e-5


def load_train_module():
    if "beam_train_script" in sys.modules:
        return sys.modules["beam_train_script"]
    spec = importlib.util.spec_from_file_location("beam_train_script", TRAIN)
    module = importlib.util.module_from_spec(spec)
    sys.modules["beam_train_script"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def env():
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def losses(output_dir: Path) -> dict[int, float]:
    """step -> logged training loss, from the run's final trainer_state.json."""
    candidates = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((candidates[-1] / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def tokens_at_first_step(output_dir: Path) -> float:
    candidates = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((candidates[-1] / "trainer_state.json").read_text())
    return next(entry["num_tokens"] for entry in state["log_history"] if "num_tokens" in entry)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The quickstart-sized run, in this process."""
    import torch

    torch.set_num_threads(1)  # match the subprocess runs (OMP_NUM_THREADS=1) so losses compare exactly
    out = tmp_path_factory.mktemp("single") / "model"
    train = load_train_module()
    args = train.make_parser().parse_args_and_config(
        args=[*COMMON, *SINGLE, "--output_dir", str(out), "--report_to", "tensorboard",
              "--prepared_cache_dir", str(tmp_path_factory.mktemp("cache"))]
    )
    trainer = train.main(*args)
    return out, trainer


def test_single_process_run_trains_and_saves(reference_run):
    out, trainer = reference_run
    assert trainer.state.global_step == MAX_STEPS
    history = losses(out)
    assert sorted(history) == list(range(1, MAX_STEPS + 1))
    assert history[MAX_STEPS] < history[1] - 0.5, history  # a tiny model on a high LR: clearly learning
    stats = json.loads((out / "data_stats.json").read_text())["train"]
    assert stats["records_in"] == stats["records_kept"] == 24
    assert 0 < stats["supervised_tokens"] < stats["total_tokens"]
    assert stats["supervised_return"] > 0
    # TensorBoard logs were written offline.
    assert list(out.glob("runs/*/events.out.tfevents.*"))
    # Supervised tokens were counted and logged next to TRL's token count.
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert logged and 0 < logged[-1]["num_supervised_tokens"] < logged[-1]["num_tokens"]


def test_saved_output_loads_with_both_templates(reference_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from beam_sft.template.tokenizer import read_templates

    out, _ = reference_run
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    chat_template, response_template = read_templates()
    assert tok.chat_template == chat_template
    assert tok.response_template == response_template
    assert tok.eos_token == "<|return|>"
    assert model.config.vocab_size >= len(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        assert model(ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_ddp_two_gloo_processes_match_single_process(reference_run, tmp_path):
    out_single, _ = reference_run
    out = tmp_path / "ddp"
    # configs/accelerate/cpu_ddp.yaml: torchrun with 2 processes; without GPUs accelerate picks gloo.
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / "cpu_ddp.yaml"),
        "--main_process_port", str(free_port()),
        str(TRAIN), *COMMON, "--per_device_train_batch_size", "2", "--output_dir", str(out), "--report_to", "none",
        "--prepared_cache_dir", str(tmp_path / "cache"),
    ]
    proc = subprocess.run(cmd, env=env(), check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The data phase ran once: rank 0 converted and tokenized, rank 1 loaded rank 0's result.
    phase = {r: json.loads((out / f"data_phase.rank{r}.json").read_text()) for r in (0, 1)}
    assert phase[0]["action"] == "tokenized" and phase[1]["action"] == "loaded", phase
    assert phase[0]["path"] == phase[1]["path"] and len(list((tmp_path / "cache").glob("prepared-*"))) == 1
    ddp, single = losses(out), losses(out_single)
    assert sorted(ddp) == sorted(single)
    # Both ranks trained: step 1's tokens, gathered over the processes, are the single run's step 1.
    assert tokens_at_first_step(out) == tokens_at_first_step(out_single)
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=DDP_RTOL), (step, ddp, single)


def _without(argv: list[str], *options: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            out.append(arg)
    return out


def test_prepare_then_train_gives_the_raw_files_losses(reference_run, tmp_path):
    """`beam-sft prepare` once, then train on the prepared directory: the same steps as from the raw file."""
    from beam_sft.cli import main as cli

    out_single, _ = reference_run
    prepared = tmp_path / "prepared"
    assert cli(["prepare", str(REPO / "data" / "samples" / "openai.jsonl"), "-o", str(prepared), "--max_records", "25",
                "--max_length", "512", "-q"]) == 0
    argv = [*_without(COMMON, "--dataset_name", "--dataset_format", "--max_records"), "--dataset_name", str(prepared),
            *SINGLE, "--output_dir", str(tmp_path / "model"), "--report_to", "none"]
    train = load_train_module()
    trainer = train.main(*train.make_parser().parse_args_and_config(args=argv))
    assert json.loads((tmp_path / "model" / "data_phase.rank0.json").read_text())["action"] == "loaded"
    got, single = losses(tmp_path / "model"), losses(out_single)
    assert trainer.state.global_step == MAX_STEPS and sorted(got) == sorted(single)
    for step in single:
        assert got[step] == pytest.approx(single[step], rel=RESUME_RTOL), (step, got, single)
    # A run whose settings differ from the manifest's is refused, naming the field.
    from beam_sft.errors import UsageError

    bad = train.make_parser().parse_args_and_config(args=[*argv, "--max_length", "256"])
    with pytest.raises(UsageError, match="'max_length' is 512, this run has 256"):
        train.main(*bad)


def test_streaming_trains_in_two_gloo_processes_with_packing(tmp_path):
    """--streaming: converted and tokenized on the fly, each rank its own records, packed by TRL."""
    out = tmp_path / "stream"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / "cpu_ddp.yaml"),
        "--main_process_port", str(free_port()),
        str(TRAIN), *_without(COMMON, "--packing", "--max_records", "--save_steps", "--save_strategy"),
        "--streaming", "true", "--packing", "true", "--per_device_train_batch_size", "1", "--max_steps", "3",
        "--save_strategy", "no", "--output_dir", str(out), "--report_to", "none",
        "--prepared_cache_dir", str(tmp_path / "cache"),
    ]
    proc = subprocess.run(cmd, env=env(), check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trained 3 steps" in proc.stdout + proc.stderr
    assert (out / "model.safetensors").is_file()
    assert not (tmp_path / "cache").exists()  # streaming writes no cache
    # Rejects are written as they are met, once per rank however often the stream is read (several passes
    # here). (Which rank converts which record is checked in tests/test_data.py; TRL's first-record peek at
    # construction reads one batch of the unsharded stream on every rank.)
    for rank in (0, 1):
        lines = [json.loads(line)["line"] for line in (out / f"rejects.rank{rank}.jsonl").read_text().splitlines()]
        assert len(lines) == len(set(lines)) and set(lines) <= {23, 32, 44, 49}, lines


STALL_DRIVER = """
import sys, time
from pathlib import Path
from transformers import TrainerCallback
sys.path.insert(0, {scripts!r})
import train

class StallAfterSave(TrainerCallback):
    # Holds the run still right after the checkpoint at `step` is written, so the test can kill -9 it.
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == {step}:
            Path({ready!r}).write_text("saved")
            time.sleep(600)

args = train.make_parser().parse_args_and_config(args={argv!r})
train.main(*args, callbacks=[StallAfterSave()])
"""


def test_kill_9_after_checkpoint_then_resume_reaches_same_end(reference_run, tmp_path):
    out_single, _ = reference_run
    out = tmp_path / "killed"
    ready = tmp_path / "ready"
    argv = [*COMMON, *SINGLE, "--output_dir", str(out), "--report_to", "none"]
    driver = tmp_path / "driver.py"
    driver.write_text(STALL_DRIVER.format(scripts=str(REPO / "scripts"), step=4, ready=str(ready), argv=argv))
    proc = subprocess.Popen([sys.executable, str(driver)], env=env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        while not ready.exists():
            assert proc.poll() is None, f"run ended before its checkpoint: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint within the time limit"
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert not (out / "model.safetensors").exists()  # the run never finished

    resumed = subprocess.run(
        [sys.executable, str(TRAIN), *argv, "--resume_from_checkpoint", "last"],
        env=env(), check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    state = json.loads((out / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    assert (out / "model.safetensors").is_file()
    # Same data order and RNG after the resume: the steps after the checkpoint log the uninterrupted
    # run's losses (a different batch would give a visibly different loss at this learning rate).
    after, single = losses(out), losses(out_single)
    for step in range(5, MAX_STEPS + 1):
        assert after[step] == pytest.approx(single[step], rel=RESUME_RTOL), (step, after, single)


def test_configs_parse():
    train = load_train_module()
    for name in ("quickstart.yaml", "beam_full.yaml", "beam_lora.yaml"):
        script_args, training_args, _ = train.make_parser().parse_args_and_config(
            args=["--config", str(REPO / "configs" / name), "--use_cpu", "true", "--bf16", "false"]
        )
        assert training_args.assistant_only_loss is True, name
        assert script_args.truncation_policy in ("turn", "drop", "keep_start"), name
    _, lora_args, lora_model = train.make_parser().parse_args_and_config(
        args=["--config", str(REPO / "configs" / "beam_lora.yaml"), "--use_cpu", "true", "--bf16", "false"]
    )
    assert lora_model.use_peft and lora_args.packing


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {
        "cpu_ddp": "MULTI_GPU",  # torchrun; gloo on a machine without GPUs (see the file)
        "multi_gpu": "MULTI_GPU",
        "fsdp2": "FSDP",
        "deepspeed_zero3": "DEEPSPEED",
        "multi_node": "MULTI_GPU",
    }
    for name, kind in expected.items():
        config = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
        assert str(config.distributed_type).endswith(kind), name
    assert load_config_from_file(str(REPO / "configs" / "accelerate" / "fsdp2.yaml")).fsdp_config["fsdp_version"] == 2


def test_liger_kernel_is_refused():
    from beam_sft.errors import UsageError

    train = load_train_module()
    args = train.make_parser().parse_args_and_config(args=[*COMMON, "--use_liger_kernel", "true", "--output_dir", "x"])
    with pytest.raises(UsageError, match="use_liger_kernel"):
        train.main(*args)


def test_missing_dataset_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(TRAIN), "--config", str(REPO / "configs" / "quickstart.yaml"),
         "--dataset_name", str(tmp_path / "nope.jsonl"), "--output_dir", str(tmp_path / "o")],
        env=env(), check=False, capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 2
    assert "nope.jsonl: no such file or directory" in proc.stderr.splitlines()[-1]


def test_plain_loss_path_equals_trl_fused_lm_head(tmp_path):
    """The CPU loss path (model logits + cross_entropy) gives TRL's fused-LM-head loss on the same batch."""
    import torch
    from inmemory import prepare_dataset, read_rows, to_beam_records
    from trl import SFTConfig

    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer
    from beam_sft.train.trainer import make_trainer_class

    tok = load_tokenizer()
    records, _ = to_beam_records(read_rows(str(REPO / "data" / "samples" / "openai.jsonl"))[:6])
    dataset, _ = prepare_dataset(tok, records, max_length=512)
    trainer_cls = make_trainer_class()
    values = {}
    for plain in (False, True):
        args = SFTConfig(output_dir=str(tmp_path / str(plain)), use_cpu=True, bf16=False, report_to="none",
                         per_device_train_batch_size=4, max_length=512)
        trainer = trainer_cls(model=build_tiny_model(tok, seed=0), args=args, train_dataset=dataset,
                              processing_class=tok, plain_loss=plain)
        batch = trainer.data_collator([dataset[i] for i in range(4)])
        trainer.model.train()
        n_items = (batch["labels"][:, 1:] != -100).sum()
        values[plain] = (
            float(trainer.compute_loss(trainer.model, dict(batch)).detach()),
            float(trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=n_items).detach()),
        )
        assert trainer._metrics["train"]["mean_token_accuracy"]
    assert values[True] == pytest.approx(values[False], rel=1e-5)
    assert torch.isfinite(torch.tensor(values[True])).all()


def test_beam_checkpoint_runs_check_template_and_trains_on(reference_run, tmp_path):
    """A saved Beam model as `model_name_or_path`: its own templates, the check-template suite first."""
    out_single, _ = reference_run
    proc = subprocess.run(
        [sys.executable, str(TRAIN), *COMMON, *SINGLE, "--model_name_or_path", str(out_single),
         "--max_steps", "1", "--save_strategy", "no", "--output_dir", str(tmp_path / "ft"), "--report_to", "none"],
        env=env(), check=False, capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "check-template: all rules pass" in proc.stderr
    assert (tmp_path / "ft" / "model.safetensors").is_file()


def test_checkpoint_without_beam_template_needs_beamify(tmp_path):
    from transformers import AutoTokenizer

    from beam_sft.errors import UsageError
    from beam_sft.model.load import build_tiny_model
    from beam_sft.template.tokenizer import load_tokenizer

    tok = load_tokenizer()
    model = build_tiny_model(tok)
    tok.chat_template = None
    tok.response_template = None
    tok.save_pretrained(tmp_path / "plain")
    model.save_pretrained(tmp_path / "plain")
    assert not AutoTokenizer.from_pretrained(tmp_path / "plain").chat_template
    train = load_train_module()
    args = train.make_parser().parse_args_and_config(
        args=[*COMMON, "--model_name_or_path", str(tmp_path / "plain"), "--output_dir", str(tmp_path / "o")]
    )
    with pytest.raises(UsageError, match="--beamify"):
        train.main(*args)
