"""Beam metrics during training (beam_sft/train/eval_callback.py): split across the ranks of a 2-process DDP run and
a 2-rank CPU FSDP2 run, equal to `beam-sft eval` of the saved model on one process; at each evaluation, where
they choose the best checkpoint and stop training early from a YAML config; the empty eval split warned about.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_train import free_port

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples" / "openai.jsonl"
COMMON = [
    "--config", str(REPO / "configs" / "quickstart.yaml"),
    "--dataset_name", str(SAMPLES),
    "--dataset_format", "auto",
    "--max_records", "25",
    "--max_length", "512",
    "--per_device_train_batch_size", "2",
    "--learning_rate", "3e-3",
    "--warmup_steps", "0",
    "--logging_steps", "1",
    "--disable_tqdm", "true",
    "--report_to", "none",
    "--seed", "0",
]

# Every rank writes its log history and how many prompts it generated, per generate call.
DRIVER = """
import json, sys
from pathlib import Path
from transformers import TrainerCallback
sys.path.insert(0, {scripts!r})
import train
from beam_sft.eval import backends

calls = []
generate = backends.TransformersBackend.generate
def counted(self, prompts):
    calls.append(len(prompts))
    return generate(self, prompts)
backends.TransformersBackend.generate = counted

class Report(TrainerCallback):
    def on_train_end(self, args, state, control, **kwargs):
        Path({out!r}, f"report.rank{{args.process_index}}.json").write_text(
            json.dumps({{"log_history": state.log_history, "generate_calls": calls}}))

args = train.make_parser().parse_args_and_config(args={argv!r})
train.main(*args, callbacks=[Report()])
"""


def env(**extra):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}


def beam_entries(history: list[dict]) -> dict[int, dict]:
    return {e["step"]: {k: v for k, v in e.items() if k.startswith("eval_beam/")}
            for e in history if "eval_beam/well_formed" in e}


def eval_saved_model(model: Path, records: list[dict], tmp: Path) -> dict:
    """`beam-sft eval` of the saved model on `records`, in this (one) process."""
    from beam_sft.cli import main as cli_main

    data = tmp / "held_out.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = tmp / "eval.json"
    assert cli_main(["eval", str(model), "--data", str(data), "--dataset_format", "beam", "--json", str(report),
                     "--quiet"]) == 0
    overall = json.loads(report.read_text())
    return overall.get("overall", overall)


def held_out(argv: list[str], tmp: Path) -> list[dict]:
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.dataset.prepare import eval_records
    from beam_sft.train.sft import make_parser

    script_args, training_args, _ = make_parser().parse_args_and_config(argv)
    return list(eval_records(script_args.dataset_name, data_settings(script_args, training_args), tmp / "work"))


def assert_equal_to(logged: dict, overall: dict) -> None:
    compared = [k.removeprefix("eval_beam/") for k in logged if k != "eval_beam/tokens_per_second"]
    assert "well_formed" in compared and "stopped" in compared and "turns" in compared, logged
    for metric in compared:
        assert logged[f"eval_beam/{metric}"] == pytest.approx(float(overall[metric])), (metric, logged, overall)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["ddp", "fsdp2"])
def test_two_ranks_split_the_generation_and_log_what_one_process_gets(tmp_path, launcher):
    """2 ranks, 4 steps, --eval_beam_steps 2 on 5 held-out records: each rank generates 3 prompts per evaluation
    (its 3 or 2, padded to 3 so the FSDP ranks step together), both ranks log the same eval_beam/* at steps 2
    and 4, and step 4's equal `beam-sft eval` of the saved final model on one process."""
    out = tmp_path / "model"
    argv = [*COMMON, "--eval_split_size", "5", "--max_steps", "4", "--eval_beam_steps", "2", "--save_strategy",
            "no", "--packing", "false", "--output_dir", str(out), "--prepared_cache_dir", str(tmp_path / "cache")]
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(scripts=str(REPO / "scripts"), out=str(tmp_path), argv=argv))
    config = {"ddp": "cpu_ddp.yaml", "fsdp2": "fsdp2.yaml"}[launcher]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "configs" / "accelerate" / config), "--num_processes", "2", "--main_process_port",
           str(free_port()), *(["--mixed_precision", "no"] if launcher == "fsdp2" else []), str(driver), *argv]
    proc = subprocess.run(cmd, env=env(BEAM_SFT_FSDP_ON_CPU="1"), check=False, capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    if launcher == "fsdp2":
        assert (out / "fsdp_sharding.rank1.json").is_file()  # it sharded
        assert "not supported" not in proc.stderr and "sharded (FSDP" not in proc.stderr
    reports = [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert report["generate_calls"] == [3, 3], report["generate_calls"]  # 5 prompts: 3 + 2 (padded to 3)
    logged = [beam_entries(r["log_history"]) for r in reports]
    assert sorted(logged[0]) == [2, 4], reports[0]["log_history"]
    for step in (2, 4):
        rank0 = {k: v for k, v in logged[0][step].items() if k != "eval_beam/tokens_per_second"}
        rank1 = {k: v for k, v in logged[1][step].items() if k != "eval_beam/tokens_per_second"}
        assert rank0 == rank1, (step, rank0, rank1)
        assert logged[0][step]["eval_beam/turns"] == 5
    records = held_out(argv, tmp_path)
    assert len(records) == 5
    assert_equal_to(logged[0][4], eval_saved_model(out, records, tmp_path))


@pytest.mark.slow
def test_best_checkpoint_and_early_stopping_on_a_beam_metric_from_yaml(tmp_path):
    """A YAML with metric_for_best_model eval_beam/has_reasoning and early_stopping_patience 2, evaluating every 3
    steps: each evaluation's metrics carry eval_beam/*, the best checkpoint is the first evaluation with the
    highest has_reasoning (not the first evaluation: the untrained model does not reason), training stopped at
    the second evaluation after it that did not improve on it, and the final save is the best checkpoint."""
    from safetensors.torch import load_file

    from beam_sft.train.sft import main, make_parser

    config = tmp_path / "run.yaml"  # the quickstart's, these keys added
    config.write_text((REPO / "configs" / "quickstart.yaml").read_text().replace('save_strategy: "no"\n', "") +
                      "eval_strategy: steps\neval_steps: 3\nsave_strategy: steps\nsave_steps: 3\n"
                      "metric_for_best_model: eval_beam/has_reasoning\nload_best_model_at_end: true\n"
                      "early_stopping_patience: 2\n")
    out = tmp_path / "model"
    argv = [*COMMON[2:], "--config", str(config), "--eval_split_size", "4", "--max_steps", "30",
            "--output_dir", str(out), "--prepared_cache_dir", str(tmp_path / "cache")]
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    assert script_args.early_stopping_patience == 2
    trainer = main(script_args, training_args, model_args)
    history = trainer.state.log_history
    evaluations = sorted(e["step"] for e in history if "eval_loss" in e)
    beam = beam_entries(history)
    assert sorted(beam) == evaluations and evaluations[0] == 3, history  # every evaluation, and only those
    values = {step: m["eval_beam/has_reasoning"] for step, m in beam.items()}
    print("has_reasoning per evaluation:", values, "stopped at", trainer.state.global_step)
    best = min(values, key=lambda s: (-values[s], s))  # the first of the highest: a later tie is no improvement
    assert best > evaluations[0], values
    assert trainer.state.best_metric == values[best]
    assert trainer.state.best_model_checkpoint == str(out / f"checkpoint-{best}")
    after = [s for s in evaluations if s > best]
    assert len(after) == 2 and all(values[s] <= values[best] for s in after), values  # patience 2, then stop
    assert trainer.state.global_step == evaluations[-1] < 30
    final, best_weights = load_file(str(out / "model.safetensors")), load_file(
        str(out / f"checkpoint-{best}" / "model.safetensors"))
    assert sorted(final) == sorted(best_weights) and all(final[k].equal(best_weights[k]) for k in final)


def test_an_empty_eval_split_is_warned_about_before_training(tmp_path, capsys):
    """--eval_beam and --eval_beam_steps with an eval set that deduplication empties (the eval file is the
    training file): one warning, before the first step, and no eval_beam/* logged."""
    from transformers import TrainerCallback

    from beam_sft.train.sft import main, make_parser

    before_training = []

    class Watch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if not before_training:
                before_training.append(capsys.readouterr().err)

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(SAMPLES.read_text().splitlines(keepends=True)[:6]))
    argv = [*COMMON, "--dataset_name", str(data), "--eval_dataset_name", str(data), "--max_steps", "1",
            "--eval_beam", "true", "--eval_beam_steps", "1", "--save_strategy", "no",
            "--output_dir", str(tmp_path / "model"), "--prepared_cache_dir", str(tmp_path / "cache")]
    trainer = main(*make_parser().parse_args_and_config(argv), callbacks=[Watch()])
    log = before_training[0] + capsys.readouterr().err
    warning = "eval_beam: the eval split is empty (deduplication removed every eval record"
    assert log.count(warning) == 1, log[-3000:]
    assert warning in before_training[0]
    assert not beam_entries(trainer.state.log_history)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--eval_beam_on_evaluate", "true"], "eval_beam_on_evaluate needs evaluations: set eval_strategy"),
    (["--metric_for_best_model", "eval_beam/well_formed"],
     "metric_for_best_model eval_beam/well_formed needs evaluations"),
    (["--eval_strategy", "steps", "--early_stopping_patience", "2"], "early_stopping_patience must be a positive"),
    (["--eval_strategy", "steps", "--metric_for_best_model", "loss", "--early_stopping_patience", "0"],
     "early_stopping_patience must be a positive"),
])
def test_beam_metrics_at_evaluation_and_early_stopping_need_evaluations(extra, expected):
    from beam_sft.errors import UsageError
    from beam_sft.train.run import check_arguments
    from beam_sft.train.sft import make_parser

    script_args, training_args, _ = make_parser().parse_args_and_config([*COMMON, "--eval_split_size", "3", *extra])
    with pytest.raises(UsageError, match=expected):
        check_arguments(script_args, training_args)


def test_a_beam_metric_for_the_best_model_turns_beam_metrics_at_evaluation_on():
    from beam_sft.train.eval_callback import beam_at_evaluate
    from beam_sft.train.run import check_arguments
    from beam_sft.train.sft import make_parser

    for metric, on in (("eval_beam/well_formed", True), ("beam/stopped", True), ("loss", False)):
        script_args, training_args, _ = make_parser().parse_args_and_config(
            [*COMMON, "--eval_split_size", "3", "--eval_strategy", "steps", "--metric_for_best_model", metric])
        check_arguments(script_args, training_args)
        assert beam_at_evaluate(script_args, training_args) is on, metric
