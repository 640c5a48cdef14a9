"""`beam-sft train`: the tied-output refusal comes before any data work, from the model's config, in the dry run
and the real run alike; a short training run prints no library progress bars (TRL's passes over the prepared
data, transformers' `Writing model shards`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = str(REPO / "data" / "samples" / "openai.jsonl")
TIED = ("--use_peft", "true", "--lora_modules_to_save", "embed_tokens", "lm_head")


def train_argv(tmp_path: Path, *argv: str) -> list[str]:
    return ["--config", "quickstart", "--dataset_name", DATA, "--max_records", "10", "--prepared_cache_dir",
            str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out"), "--report_to", "none", *argv]


@pytest.mark.parametrize("dry_run", [True, False])
def test_tied_output_is_refused_in_one_line_before_any_data_work(tmp_path, capsys, dry_run):
    from beam_sft.cli.train import main

    capsys.readouterr()
    status = main(train_argv(tmp_path, *TIED, *(["--dry_run", "true"] if dry_run else [])))
    out = capsys.readouterr()
    assert status == 2, out.err[-3000:]
    assert out.err.strip() == (
        "error: modules_to_save lists 'lm_head', the output projection tied to 'embed_tokens': PEFT would train two "
        "full copies and break the tie. Drop it: beam-sft makes the new marker rows trainable by itself "
        "(trainable_token_indices, tied to the output)"), out.err[-3000:]
    assert out.out == ""
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_refusal_before_loading_reads_the_config_only(tmp_path):
    """A checkpoint: its config read, its weights not (a removed weights file changes nothing)."""
    import shutil
    from types import SimpleNamespace

    from beam_sft.errors import UsageError
    from beam_sft.model.load import TINY_MODEL_DIR
    from beam_sft.train.new_tokens import refuse_tied_output_before_loading

    config_only = tmp_path / "model"
    config_only.mkdir()
    shutil.copy(TINY_MODEL_DIR / "config.json", config_only / "config.json")
    model_args = SimpleNamespace(use_peft=True, lora_modules_to_save=["lm_head"], model_name_or_path=str(config_only),
                                 model_revision="main")
    training_args = SimpleNamespace(trust_remote_code=False)
    with pytest.raises(UsageError, match="tied to 'embed_tokens'"):
        refuse_tied_output_before_loading(SimpleNamespace(tiny_model_config=None), training_args, model_args)
    model_args.lora_modules_to_save = ["embed_tokens"]
    refuse_tied_output_before_loading(SimpleNamespace(tiny_model_config=None), training_args, model_args)


@pytest.mark.parametrize("argv", [("--save_strategy", "steps", "--save_steps", "1"),
                                  ("--save_strategy", "no", "--use_peft", "true", "--lora_r", "4")],
                         ids=["full-with-checkpoint", "lora-embedded-base"])
def test_a_short_run_prints_no_library_progress_bars(tmp_path, argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "beam_sft", "train",
                           *train_argv(tmp_path, "--max_steps", "1", "--disable_tqdm", "true", *argv)],
                          cwd=tmp_path, env=env, capture_output=True, check=False, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 1 steps" in proc.stdout + proc.stderr
    for noise in ("Truncating train dataset", "Dropping fully masked", "Writing model shards", "it/s]", "examples/s]"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
