"""`beam-sft train`: what cannot run is refused by `--dry_run` and by the real run, in one line before any report
(k-bit loading without its hardware, a base without a Beam template); LoRA on the embedded model saves its base;
`--help` is beam-sft's own options, `--help-all` TRL's full list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = str(REPO / "data" / "samples" / "openai.jsonl")


def beam_sft(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "beam_sft", *argv], cwd=cwd, env=env, capture_output=True, check=False,
                          text=True, timeout=300)


def train_argv(tmp_path: Path, *argv: str, dry_run: bool = True) -> list[str]:
    return ["--config", "quickstart", "--dataset_name", DATA, "--max_records", "10", "--prepared_cache_dir",
            str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out"), "--report_to", "none", *argv,
            *(["--dry_run", "true"] if dry_run else [])]


def train(tmp_path: Path, *argv: str, dry_run: bool = True) -> subprocess.CompletedProcess:
    """`beam-sft train` in its own process."""
    return beam_sft("train", *train_argv(tmp_path, *argv, dry_run=dry_run), cwd=tmp_path)


def train_here(tmp_path: Path, capsys, *argv: str, dry_run: bool = True) -> subprocess.CompletedProcess:
    """`beam-sft train` in this process (its `main`, as the console script calls it): the real run's refusals,
    without another interpreter start-up."""
    from beam_sft.cli.train import main

    capsys.readouterr()
    status = main(train_argv(tmp_path, *argv, dry_run=dry_run))
    out = capsys.readouterr()
    return subprocess.CompletedProcess([], status, out.out, out.err)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The refusal: exit 2, stderr exactly one `error:` line, nothing reported before or after it."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "dry run:" not in proc.stdout and "FAIL" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def plain_base(tmp_path_factory):
    """A saved model whose tokenizer has no Beam template and no Beam markers (a GPT-2-like base)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tokenizer_factories import gpt2_like, tiny_causal_lm

    out = tmp_path_factory.mktemp("plain_base")
    tokenizer = gpt2_like()
    tokenizer.save_pretrained(out)
    tiny_causal_lm(len(tokenizer)).save_pretrained(out)
    return out


@pytest.mark.parametrize("dry_run", [True, False])
def test_kbit_loading_on_the_embedded_model_is_refused_not_ignored(tmp_path, capsys, dry_run):
    line = one_error_line(train(tmp_path, "--load_in_4bit", "true") if dry_run
                          else train_here(tmp_path, capsys, "--load_in_4bit", "true", dry_run=False))
    assert line == ("error: --load_in_4bit true: the embedded tiny model is built in full precision and never "
                    "quantized; drop --load_in_4bit, or give a checkpoint with --model_name_or_path")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("dry_run", [True, False])
def test_kbit_loading_without_cuda_is_refused_before_the_model_loads(tmp_path, capsys, tiny_model_dir, dry_run):
    argv = ("--model_name_or_path", str(tiny_model_dir), "--load_in_8bit", "true")
    line = one_error_line(train(tmp_path, *argv) if dry_run else train_here(tmp_path, capsys, *argv, dry_run=False))
    assert line.startswith("error: --load_in_8bit true needs a CUDA GPU"), line
    assert "drop --load_in_8bit (LoRA in full precision: --use_peft true)" in line
    assert not (tmp_path / "out").exists()


def test_kbit_loading_without_bitsandbytes_is_refused(monkeypatch):
    """On a CUDA machine without bitsandbytes (here: both simulated), the one line says what to install."""
    import importlib.util
    from types import SimpleNamespace

    import torch

    from beam_sft.errors import UsageError
    from beam_sft.model.load import refuse_quantization

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    script = SimpleNamespace(mxfp4_dequantize=False)
    model = SimpleNamespace(load_in_4bit=True, load_in_8bit=False, model_name_or_path="some/checkpoint")
    with pytest.raises(UsageError, match=r"^--load_in_4bit true needs the bitsandbytes package, which is not "
                                         r"installed: pip install bitsandbytes, or drop --load_in_4bit$"):
        refuse_quantization(script, model)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    refuse_quantization(script, model)  # CUDA and bitsandbytes: nothing to refuse


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_base_without_a_beam_template_is_one_line_before_any_report(tmp_path, capsys, plain_base, dry_run):
    """Not the check-template suite's 36 failures first and the line that matters last: the line alone."""
    argv = ("--model_name_or_path", str(plain_base))
    line = one_error_line(train(tmp_path, *argv) if dry_run else train_here(tmp_path, capsys, *argv, dry_run=False))
    assert line == (f"error: {plain_base}: the tokenizer has no Beam chat template / response template; add "
                    "--beamify true to install them (and the markers) while training, or run `beam-sft beamify` on "
                    "it first (`beam-sft check-template` shows what it lacks)")


def test_a_fatal_template_check_comes_before_the_suite_report(tok, monkeypatch):
    """The stop-token check (fatal, one line) runs before the check-template suite (a logged report): a template
    that cannot train stops with its line, not after the report."""
    from beam_sft.dataset import examples
    from beam_sft.errors import FatalError
    from beam_sft.model import load

    suite = []
    monkeypatch.setattr(load, "run_template_check", suite.append)

    def untrained(tokenizer):
        raise FatalError("the chat template does not train <|return|>")

    monkeypatch.setattr(examples, "check_stop_tokens_trained", untrained)
    with pytest.raises(FatalError, match="does not train"):
        load.check_tokenizer(tok, conformance=True, assistant_only_loss=True)
    assert suite == []
    monkeypatch.setattr(examples, "check_stop_tokens_trained", lambda tokenizer: None)
    load.check_tokenizer(tok, conformance=True, assistant_only_loss=True)
    assert suite == [tok]


def test_lora_dry_run_names_the_saved_base_and_prints_no_library_noise(tmp_path):
    proc = train(tmp_path, "--use_peft", "true", "--lora_r", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"  LoRA base          the embedded model exists nowhere else: saved with the adapter as " \
           f"{tmp_path / 'out' / 'base_model'}" in proc.stdout, proc.stdout
    for noise in ("FutureWarning", "Saving the dataset", "it/s]", "examples/s]", "Map"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_quiet_libraries_silences_the_datasets_bars_and_restores_them(tmp_path, capfd):
    import datasets

    from beam_sft.train.dry_run import quiet_libraries

    datasets.enable_progress_bars()
    with quiet_libraries():
        assert datasets.are_progress_bars_disabled()
        datasets.Dataset.from_dict({"x": list(range(3))}).save_to_disk(str(tmp_path / "d"))
    assert "Saving the dataset" not in capfd.readouterr().err
    assert not datasets.are_progress_bars_disabled()


@pytest.mark.slow
def test_lora_on_the_embedded_model_saves_a_base_that_eval_loads(tmp_path):
    """The adapter's base exists nowhere else: saved in output_dir/base_model, named by adapter_config.json, so
    `beam-sft eval OUTPUT` works (it failed: the adapter named no base model)."""
    proc = train(tmp_path, "--use_peft", "true", "--lora_r", "4", "--max_steps", "1", "--save_strategy", "no",
                 "--disable_tqdm", "true", dry_run=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(out / "base_model")
    assert (out / "base_model" / "model.safetensors").is_file() and (out / "base_model" / "config.json").is_file()
    evaluated = beam_sft("eval", str(out), "--data", DATA, "--max_records", "2", "--max-new-tokens", "4",
                         "--quiet", "--json", str(tmp_path / "eval.json"), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "eval.json").read_text())["records"] == 2


def test_short_help_starts_with_beam_sfts_own_options(tmp_path):
    proc = beam_sft("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[0] == "usage: beam-sft train [--config YAML|NAME] [OPTIONS] [LAUNCH OPTIONS]"
    assert len(lines) < 120, len(lines)
    assert lines[-1] == "All options, TRL's and transformers' included: beam-sft train --help-all"
    text = proc.stdout
    for option in ("--config YAML|NAME", "--dataset_name", "--dataset_format", "--max_records", "--eval_split_size",
                   "--num_processes N", "--config_file NAME|YAML", "--dry_run true", "--model_name_or_path PATH",
                   "--use_peft true", "--learning_rate LR", "--output_dir DIR"):
        assert f"  {option} " in text, option
    assert "--adam_beta1" not in text and "--hub_model_id" not in text
    assert max(len(line) for line in lines) <= 110


def test_help_all_lists_every_trl_option(tmp_path):
    proc = beam_sft("train", "--help-all", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: beam-sft train")
    assert len(proc.stdout.splitlines()) > 500
    for option in ("--adam_beta1", "--hub_model_id", "--lora_r", "--dataset_name", "--dry_run"):
        assert f"  {option} " in proc.stdout, option


@pytest.mark.slow
def test_lora_on_a_beamified_base_is_evaluated_with_its_new_rows(tmp_path, plain_base):
    """The adapter names the plain base, whose vocabulary lacks beamify's rows: eval grows it to the saved
    tokenizer and the adapter brings the rows (it failed with `IndexError: index 1200 is out of bounds`)."""
    proc = train(tmp_path, "--model_name_or_path", str(plain_base), "--beamify", "true", "--use_peft", "true",
                 "--lora_target_modules", "all-linear", "--max_length", "2048", "--max_steps", "1",
                 "--save_strategy", "no", "--disable_tqdm", "true", dry_run=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(plain_base)
    evaluated = beam_sft("eval", str(out), "--data", DATA, "--max_records", "2", "--max-new-tokens", "4",
                         "--quiet", "--json", str(tmp_path / "eval.json"), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((tmp_path / "eval.json").read_text())["records"] == 2
