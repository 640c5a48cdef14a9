"""`beam-sft eval` end to end on real generations: a tiny model trained once for this module (with
`scripts/train.py --eval_beam true`), the same model untrained, a LoRA adapter, raw-format data, exit codes.

The training data is 12 raw records, 4 from each bundled sample file (OpenAI, ShareGPT, Harmony; answers and
tool calls), trained until the tiny model writes well-formed Beam turns for their prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_sft.cli import main as cli
from beam_sft.eval.backends import TransformersBackend
from beam_sft.eval.metrics import METRICS
from beam_sft.eval.run import EvalOptions, evaluate, load_model, resolve_adapter
from beam_sft.eval.turns import read_held_out, record_turns

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"
pytestmark = pytest.mark.slow

# Input rows (0-based) of each sample file: three short answers and one tool call (see data/samples).
PICK = {"openai.jsonl": [0, 3, 4, 7], "sharegpt.json": [0, 3, 4, 7], "harmony.jsonl": [0, 3, 4, 7]}
TRAIN_ARGS = [
    "--max_length", "512",
    "--num_train_epochs", "25",  # 150 steps of 2: training loss about 0.1, 12/12 well-formed when measured
    "--per_device_train_batch_size", "2",
    "--learning_rate", "3e-3",
    "--warmup_steps", "10",
    "--logging_steps", "10",
    "--report_to", "none",
    "--disable_tqdm", "true",
]


def load_train_module():
    import importlib.util

    if "beam_train_script" in sys.modules:
        return sys.modules["beam_train_script"]
    spec = importlib.util.spec_from_file_location("beam_train_script", REPO / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["beam_train_script"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A tiny model gains nothing from a second thread, and on a shared machine its spin-waits cost CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The 12 raw training rows, in their own formats and file types."""
    out = tmp_path_factory.mktemp("evaldata")
    for name, rows in PICK.items():
        if name.endswith(".jsonl"):
            lines = (SAMPLES / name).read_text(encoding="utf-8").splitlines()
            (out / name).write_text("".join(lines[i] + "\n" for i in rows), encoding="utf-8")
        else:
            records = json.loads((SAMPLES / name).read_text(encoding="utf-8"))
            (out / name).write_text(json.dumps([records[i] for i in rows]), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """scripts/train.py on the 12 rows, with --eval_beam true on the same rows (so --dedup false: deduplication
    would drop every eval record that is also trained). (output_dir, trainer)"""
    out = tmp_path_factory.mktemp("evaltrain") / "model"
    train = load_train_module()
    args = train.make_parser().parse_args_and_config(args=[
        "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--dataset_name", str(data_dir), "--dataset_format", "auto",
        "--eval_dataset_name", str(data_dir), "--eval_beam", "true", "--dedup", "false",
        "--output_dir", str(out), *TRAIN_ARGS,
    ])
    trainer = train.main(*args)
    return out, trainer


@pytest.fixture(scope="module")
def untrained(tiny_model_dir):
    """The same tiny model, randomly initialised, saved with the bundled tokenizer (both templates)."""
    return tiny_model_dir


@pytest.fixture(scope="module")
def trained_eval(trained, data_dir, tmp_path_factory):
    """`beam-sft eval` on the trained model and its training prompts, every output asked for."""
    out = tmp_path_factory.mktemp("evalout")
    status = cli(["eval", str(trained[0]), "--data", str(data_dir), "--json", str(out / "m.json"),
                  "--report", str(out / "r.html"), "--min-well-formed", "0.9", "--quiet"])
    return status, json.loads((out / "m.json").read_text()), (out / "r.html").read_text()


def test_eval_beam_logs_metrics_next_to_the_loss(trained):
    _, trainer = trained
    history = trainer.state.log_history
    logged = [e for e in history if "eval_beam/well_formed" in e]
    assert len(logged) == 1 and any("loss" in e for e in history)
    entry = logged[0]
    assert entry["eval_beam/turns"] == 12
    assert entry["eval_beam/well_formed"] >= 0.9, entry
    assert entry["step"] == trainer.state.global_step


def test_trained_model_every_metric(trained_eval):
    status, metrics, _ = trained_eval
    assert status == 0
    assert list(metrics) == ["records", "turns", *METRICS, "mean_analysis_tokens", "by_format", "by_effort", "rejected",
                             "generation_tokens", "tokens_per_second"]
    assert metrics["records"] == metrics["turns"] == 12 and metrics["rejected"] == 0
    for name in METRICS:  # every metric applies to some turn of this data (answers and calls)
        assert metrics[name] is not None, name
    assert metrics["well_formed"] >= 0.9, metrics
    assert metrics["stopped"] >= 0.9 and metrics["has_reasoning"] >= 0.9 and metrics["action_match"] >= 0.9
    assert metrics["marker_leak"] <= 0.1
    assert set(metrics["by_format"]) == {"openai", "sharegpt", "harmony"}
    assert all(group["turns"] == 4 for group in metrics["by_format"].values())
    assert sum(group["turns"] for group in metrics["by_effort"].values()) == 12
    assert metrics["generation_tokens"] > 12 and metrics["tokens_per_second"] > 0


def test_report_page(trained_eval):
    _, metrics, page = trained_eval
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert "well_formed" in page and "Failures:" in page
    failed = page.count("fails: ")
    lower = ("marker_leak", "empty_analysis", "degenerate_reasoning")  # lower is better
    any_failure = any(metrics[m] > 0 for m in lower) or any(metrics[m] < 1 for m in METRICS if m not in lower)
    assert failed <= 12 and (failed > 0) == any_failure and ("prompt tail" in page) == (failed > 0)


def test_batched_generation_matches_one_at_a_time(trained, data_dir):
    model, tok = load_model(str(trained[0]), device="cpu")
    # Rows 0 (a short answer) and 3 (a tool call) of each format: prompts of different lengths, so padded.
    records = [(r, f) for k, (r, _, f) in enumerate(read_held_out(str(data_dir))) if k % 4 in (0, 3)]
    prompts = [t.prompt for r, f in records for t in record_turns(tok, r, 0, f, "first")]
    assert len({len(p) for p in prompts}) > 1
    one = TransformersBackend(model, tok, max_new_tokens=160, batch_size=1).generate(prompts)
    batched = TransformersBackend(model, tok, max_new_tokens=160, batch_size=len(prompts)).generate(prompts)
    assert any(g.stop == "<|call|>" for g in one) and any(g.stop == "<|return|>" for g in one)
    assert [g.text for g in batched] == [g.text for g in one]
    assert tok.padding_side == "right"  # restored


def test_untrained_model_fails(untrained, data_dir, tmp_path, capsys):
    status = cli(["eval", str(untrained), "--data", str(data_dir), "--max-new-tokens", "32",
                  "--min-well-formed", "0.5", "--json", str(tmp_path / "m.json"), "--quiet"])
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert status == 1 and "below --min-well-formed" in capsys.readouterr().err
    assert metrics["well_formed"] <= 0.1 and metrics["stopped"] <= 0.2, metrics


def test_lora_adapter(trained, data_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from beam_sft.template.tokenizer import load_tokenizer, save_tokenizer

    base = str(trained[0])
    for name, init in (("zero", True), ("random", False)):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=init))
        if not init:
            for param in model.parameters():
                if param.requires_grad:
                    param.data.normal_(0, 0.5)
        model.save_pretrained(tmp_path / name)
    save_tokenizer(load_tokenizer(base), tmp_path / "zero")  # as scripts/train.py saves it next to an adapter
    records = [(r, f) for r, _, f in read_held_out(str(data_dir), max_records=3)]

    def texts(adapter):
        model, tok = load_model(base, adapter=adapter, device="cpu")
        result = []
        evaluate(TransformersBackend(model, tok, max_new_tokens=48), tok, records,
                 EvalOptions(on_result=result.append, progress=False))
        return [r.generation.text for r in sorted(result, key=lambda r: r.turn.record)]

    plain = texts(None)
    assert texts(str(tmp_path / "zero")) == plain  # a zero LoRA update: the base model's outputs
    assert texts(str(tmp_path / "random")) != plain  # the adapter is applied
    assert cli(["eval", base, "--adapter", str(tmp_path / "zero"), "--data", str(data_dir), "--max_records", "1",
                "--max-new-tokens", "8", "--quiet"]) == 0
    # An adapter-only directory as MODEL: applied to the base model its adapter_config.json names.
    assert resolve_adapter(str(tmp_path / "random"), None) == (base, str(tmp_path / "random"))
    assert resolve_adapter(base, None) == (base, None)


def test_raw_format_data_and_rejects(untrained, tmp_path):
    # --dataset_format sharegpt on the raw ShareGPT sample: its bad rows are rejected with the converters' reasons.
    out = tmp_path / "m.json"
    assert cli(["eval", str(untrained), "--data", str(SAMPLES / "sharegpt.json"), "--dataset_format", "sharegpt",
                "--max_records", "20", "--max-new-tokens", "4", "--json", str(out), "--quiet"]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["records"] + metrics["rejected"] == 20 and metrics["rejected"] >= 1
    assert metrics["turns"] == metrics["records"] and set(metrics["by_format"]) == {"sharegpt"}
    # The wrong format: every row rejected, nothing evaluated, nothing lost.
    assert cli(["eval", str(untrained), "--data", str(SAMPLES / "sharegpt.json"), "--dataset_format", "harmony",
                "--max_records", "5", "--json", str(out), "--quiet"]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["records"] == 0 and metrics["rejected"] == 5 and metrics["well_formed"] is None


def test_max_records_stops_reading(tmp_path):
    lines = (SAMPLES / "openai.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    path = tmp_path / "d.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"{not json\n")
    assert [rej for _, rej, _ in read_held_out(str(path), max_records=3)] == [None] * 3
    rejects = [rej for _, rej, _ in read_held_out(str(path)) if rej]
    assert [r["reason"] for r in rejects] == ["malformed_json"] and rejects[0]["line"] == 4


def test_cli_usage_errors(untrained, tmp_path, capsys):
    data = str(SAMPLES / "openai.jsonl")
    assert cli(["eval", str(tmp_path / "missing"), "--data", data]) == 2
    assert cli(["eval", str(untrained), "--data", data, "--max-new-tokens", "0"]) == 2
    assert cli(["eval", str(untrained), "--data", data, "--min-well-formed", "90"]) == 2
    assert cli(["eval", str(untrained), "--data", str(tmp_path / "nope.jsonl")]) == 2
    assert cli(["eval", str(untrained), "--data", data, "--dataset_format", "csv"]) == 2
    # A tokenizer without the Beam templates.
    bare = tmp_path / "bare"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(untrained)
    tok.chat_template = None
    tok.save_pretrained(bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    assert cli(["eval", str(untrained), "--tokenizer_name_or_path", str(bare), "--data", data]) == 2
    assert cli(["eval", str(untrained)]) == 2  # --data (or --bfcl / --rescore) is required
    err = capsys.readouterr().err
    assert err.count("error: ") == 7 and "Traceback" not in err and "give one of --data" in err


def test_vllm_backend_refused_without_vllm_or_gpu(untrained, capsys):
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vLLM and a GPU are present: the refusal does not apply")
    assert cli(["eval", str(untrained), "--data", str(SAMPLES / "openai.jsonl"), "--backend", "vllm"]) == 2
    assert "vllm" in capsys.readouterr().err.lower()


def test_hub_id_from_the_offline_cache(untrained, tmp_path):
    # A hub id resolves through the local cache layout (models--ORG--NAME/snapshots/REV + refs/main).
    revision = "0" * 40
    repo = tmp_path / "hub" / "models--beam-test--tiny"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for f in untrained.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "beam_sft", "eval", "beam-test/tiny", "--data", str(SAMPLES / "openai.jsonl"),
         "--max_records", "2", "--max-new-tokens", "4", "--quiet"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["turns"] == 2
