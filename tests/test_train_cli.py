"""`beam-sft train`: config errors as one line, the dry run against a real run, the push of the servable
directory, the accelerate launch, and a wheel installed outside the checkout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_sft.cli import train as train_cli

REPO = Path(__file__).resolve().parent.parent
SMALL = [
    "--config", "quickstart",
    "--dataset_name", str(REPO / "data" / "samples" / "openai.jsonl"),
    "--max_records", "25",
    "--max_length", "512",
    "--per_device_train_batch_size", "4",
    "--num_train_epochs", "1",
    "--logging_steps", "1",
    "--disable_tqdm", "true",
    "--report_to", "none",
]


def run_cli(argv, capsys) -> tuple[int, list[str]]:
    status = train_cli.main(argv)
    return status, [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(("yaml_text", "argv", "expected"), [
    ("learning_rat: 1.0e-3\n", [], "unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
    ("loss_path: fuse\n", [], "loss_path: 'fuse' is not one of auto, fused, plain (did you mean 'fused'?)"),
    ("eval_strategy: step\n", [], "eval_strategy: 'step' is not one of no, steps, epoch (did you mean 'steps'?)"),
    ("truncation_policy: turns\n", [], "truncation_policy: 'turns' is not one of turn, drop, keep_start"),
    ("- a list\n", [], "must be a YAML mapping"),
    ("seed: 0\n", ["--loss_path", "fuse"], "invalid choice: 'fuse'"),
    ("seed: 0\n", ["--learning_rat", "3"], "unknown option '--learning_rat' (did you mean '--learning_rate'?)"),
    ("seed: 0\n", ["--num_train_epochs", "abc"], "invalid float value: 'abc'"),
])
def test_config_errors_are_one_line_with_exit_2(tmp_path, capsys, yaml_text, argv, expected):
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    status, errors = run_cli(["--config", str(config), "--dataset_name", "x.jsonl", *argv, "--dry_run"], capsys)
    assert status == 2
    assert len(errors) == 1 and expected in errors[0], errors


def test_unknown_named_config_suggests_the_nearest(capsys):
    status, errors = run_cli(["--config", "quickstrt", "--dry_run"], capsys)
    assert status == 2 and "did you mean 'quickstart'?" in errors[0], errors


def test_eval_beam_without_eval_split_is_refused_before_training(tmp_path, capsys):
    status, errors = run_cli(["--config", "quickstart", "--eval_beam", "true", "--output_dir", str(tmp_path / "o")],
                             capsys)
    assert status == 2 and "--eval_beam needs an eval split" in errors[0], errors
    assert not (tmp_path / "o").exists()


def test_launch_hands_the_training_options_to_accelerate(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr("accelerate.commands.launch.launch_command", lambda args: seen.update(vars(args)))
    argv = [*SMALL, "--num_processes", "2", "--config_file", "cpu_ddp", "--output_dir", str(tmp_path / "o")]
    assert train_cli.main(argv) == 0
    assert seen["num_processes"] == 2 and seen["module"] is True
    assert Path(seen["config_file"]) == REPO / "configs" / "accelerate" / "cpu_ddp.yaml"
    assert seen["training_script"] == "beam_sft.cli.train"
    assert seen["training_script_args"] == [*SMALL, "--output_dir", str(tmp_path / "o")]


def test_several_cpu_processes_default_to_the_cpu_ddp_config(monkeypatch):
    """Without a GPU or an accelerate config, `--num_processes 2` would be mpirun's single process."""
    monkeypatch.setattr(train_cli, "_cpu_only_without_default_config", lambda: True)
    launch = train_cli.resolve_launch_config(["--num_processes", "2"])
    assert launch == ["--num_processes", "2", "--config_file", str(REPO / "configs" / "accelerate" / "cpu_ddp.yaml")]
    assert train_cli.resolve_launch_config(["--num_processes", "1"]) == ["--num_processes", "1"]
    monkeypatch.setattr(train_cli, "_cpu_only_without_default_config", lambda: False)
    assert train_cli.resolve_launch_config(["--num_processes", "2"]) == ["--num_processes", "2"]


def test_launch_options_are_split_from_the_training_options():
    launch, rest = train_cli.split_launch_args(["--config", "q", "--num_processes=2", "--machine_rank", "1", "--seed",
                                                "3"])
    assert launch == ["--num_processes", "2", "--machine_rank", "1"] and rest == ["--config", "q", "--seed", "3"]


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["false", "true"])
def test_dry_run_predicts_the_real_run(tmp_path, packing):
    """The dry run's steps, rows and tokens are the trainer's; it writes nothing to output_dir."""
    import torch

    from beam_sft.train.dry_run import dry_run
    from beam_sft.train.sft import main, make_parser

    torch.set_num_threads(1)
    argv = [*SMALL, "--packing", packing, "--prepared_cache_dir", str(tmp_path / "cache"),
            "--output_dir", str(tmp_path / "model"), "--save_strategy", "no"]
    plan = dry_run(*make_parser().parse_args_and_config(argv))
    assert not (tmp_path / "model").exists()
    trainer = main(*make_parser().parse_args_and_config(argv))
    assert plan.facts["steps"] == trainer.state.global_step
    assert plan.facts["rows"] == len(trainer.train_dataset)
    assert plan.facts["tokens_per_epoch"] == trainer._total_train_tokens
    assert plan.facts["supervised_per_epoch"] == trainer._supervised_tokens
    assert plan.facts["parameters"] == sum(p.numel() for p in trainer.model.parameters())
    text = str(plan)
    for label in ("effective batch", "steps", "epochs", "tokens", "supervised tokens", "memory (estimate)",
                  "packing probe"):
        assert f"  {label} " in text, text
    if packing == "true":
        assert "native" in text or "explicit" in text, text


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith("_")
            and "checkpoint-" not in str(p.relative_to(folder))}


@pytest.mark.slow
def test_push_uploads_the_servable_directory(tmp_path, monkeypatch):
    """What reaches the hub is the finished output directory: one upload, after the servable save."""
    from transformers.utils import hub

    from beam_sft.train.sft import main, make_parser

    uploads = []

    class FakeHub:
        def create_repo(self, repo_id, **kwargs):
            return type("Repo", (), {"repo_id": repo_id})()

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            uploads.append((repo_id, folder_path, _snapshot(Path(folder_path))))

    monkeypatch.setattr(hub, "_hf_api", FakeHub())
    out = tmp_path / "model"
    argv = [*SMALL, "--max_steps", "1", "--output_dir", str(out), "--save_strategy", "no",
            "--prepared_cache_dir", str(tmp_path / "cache"), "--push_to_hub", "true", "--hub_model_id", "me/beam"]
    main(*make_parser().parse_args_and_config(argv))
    assert len(uploads) == 1, [u[:2] for u in uploads]
    repo_id, folder, files = uploads[0]
    assert repo_id == "me/beam" and Path(folder) == out
    assert files == _snapshot(out)  # nothing changed after the upload
    served = json.loads((out / "generation_config.json").read_text())
    assert isinstance(served["eos_token_id"], list) and len(served["eos_token_id"]) == 2  # the servable fix
    assert {"chat_template.jinja", "tokenizer_config.json", "model.safetensors"} <= set(files)


@pytest.mark.slow
def test_wheel_installed_outside_the_checkout(tmp_path):
    """A built wheel, installed apart from the checkout, dry-runs and trains the quickstart in another directory."""
    python = sys.executable
    subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(REPO)], check=True, timeout=300, capture_output=True)
    wheel = next((tmp_path / "wheel").glob("beam_sft-*.whl"))
    site = tmp_path / "site"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    def beam_sft(*argv):
        return subprocess.run([python, "-m", "beam_sft", *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600, check=False)

    where = subprocess.run([python, "-c", "import beam_sft; print(beam_sft.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), where
    cache = ["--prepared_cache_dir", str(work / "cache")]
    dry = beam_sft("train", "--config", "quickstart", "--dry_run", *cache)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "steps              288 (18 per epoch)" in dry.stdout, dry.stdout
    assert str(site / "beam_sft" / "bundled") in dry.stderr + dry.stdout  # the bundled samples, not the checkout's
    (work / "bad.yaml").write_text("learnin_rate: 1\n")
    bad = beam_sft("train", "--config", "bad.yaml")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: bad.yaml: unknown key 'learnin_rate' (did you mean 'learning_rate'?)"]
    real = beam_sft("train", "--config", "quickstart", "--max_steps", "4", "--disable_tqdm", "true", *cache)
    assert real.returncode == 0, real.stderr[-2000:]
    model = work / "outputs" / "quickstart" / "model"
    assert (model / "model.safetensors").is_file() and (model / "chat_template.jinja").is_file()
    assert "trained 4 steps" in real.stdout + real.stderr


@pytest.mark.slow
def test_eval_beam_steps_logs_the_metrics_beam_sft_eval_gives_for_the_checkpoint(tmp_path):
    """`--eval_beam_steps 20`: eval_beam/<metric> at steps 20 and 40, in the log history and TensorBoard, equal to
    `beam-sft eval` of checkpoint-20 on the same held-out records."""
    import torch

    from beam_sft.cli import main as cli_main
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.dataset.prepare import eval_records
    from beam_sft.train.sft import main, make_parser

    torch.set_num_threads(1)
    out = tmp_path / "model"
    argv = [*SMALL, "--max_steps", "40", "--eval_split_size", "4", "--eval_beam_steps", "20", "--save_strategy",
            "steps", "--save_steps", "20", "--num_train_epochs", "20", "--output_dir", str(out), "--prepared_cache_dir", str(tmp_path / "cache"),
            "--report_to", "tensorboard", "--learning_rate", "3e-3", "--warmup_steps", "0"]
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    settings = data_settings(script_args, training_args)
    trainer = main(script_args, training_args, model_args)
    logged = {e["step"]: e for e in trainer.state.log_history if "eval_beam/well_formed" in e}
    assert sorted(logged) == [20, 40], trainer.state.log_history

    records = list(eval_records(script_args.dataset_name, settings, tmp_path / "work"))
    assert len(records) == 4
    data = tmp_path / "held_out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = tmp_path / "eval.json"
    assert cli_main(["eval", str(out / "checkpoint-20"), "--tokenizer_name_or_path", str(out), "--data", str(data), "--dataset_format",
                     "beam", "--json", str(report), "--quiet"]) == 0
    overall = json.loads(report.read_text())
    overall = overall.get("overall", overall)
    compared = [k.removeprefix("eval_beam/") for k in logged[20] if k.startswith("eval_beam/")
                and k != "eval_beam/tokens_per_second"]
    print("logged at step 20:", logged[20], "\nbeam-sft eval:", overall)
    assert "well_formed" in compared and "stopped" in compared
    for metric in compared:
        assert logged[20][f"eval_beam/{metric}"] == pytest.approx(float(overall[metric])), metric

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((out / "runs").iterdir()))).Reload()
    beam_tags = [t for t in events.Tags()["scalars"] if "beam" in t and t.endswith("well_formed")]
    assert beam_tags and [e.step for e in events.Scalars(beam_tags[0])] == [20, 40], events.Tags()["scalars"]


def test_scripts_train_py_dry_run_trains_nothing(tmp_path, capsys):
    """`python scripts/train.py ... --dry_run` is the same dry run as `beam-sft train --dry_run` (it trained before)."""
    from beam_sft.train.sft import main, make_parser

    argv = [*SMALL, "--prepared_cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "model"),
            "--dry_run", "true"]
    assert main(*make_parser().parse_args_and_config(argv)) is None
    assert not (tmp_path / "model").exists()
    assert "  steps " in capsys.readouterr().out


def test_dry_run_refuses_a_tied_output_in_modules_to_save(tmp_path):
    """The refusal the run makes after loading, made before it (on the meta device): the tiny model is tied."""
    from beam_sft.errors import UsageError
    from beam_sft.train.dry_run import dry_run
    from beam_sft.train.sft import make_parser

    argv = [*SMALL, "--prepared_cache_dir", str(tmp_path / "cache"), "--use_peft", "true",
            "--lora_modules_to_save", "embed_tokens", "lm_head"]
    with pytest.raises(UsageError, match="tied to 'embed_tokens'"):
        dry_run(*make_parser().parse_args_and_config(argv))
