"""Eval loss per mixture source (beam_sft.train.source_eval): `eval_<label>_loss` next to an unchanged
`eval_loss`, each equal to the loss of that source's eval rows computed here from the trained model."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
import yaml

from beam_sft.dataset.mixture import resolve
from beam_sft.errors import UsageError


def _chat(tag: str, i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"{tag}-{i}: what is {i} times {tag}?"},
                         {"role": "assistant", "content": f"{tag} {i} is {i * 7}.", "reasoning_content": f"{i}."}]}


def _share(tag: str, i: int) -> dict:
    return {"conversations": [{"from": "human", "value": f"{tag}-{i}: name {i} colours"},
                              {"from": "gpt", "value": f"<think>{i} of them.</think>red and {i} others."}]}


def _write(path: Path, rows: list[dict]) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return str(path)


def test_labels_are_slugs_unique_and_checked(tmp_path):
    a = _write(tmp_path / "Glaive-v2.jsonl", [_chat("A", 0)])
    b = _write(tmp_path / "chat.jsonl", [_chat("B", 0)])
    mixture = resolve([{"path": a}, {"path": "json", "data_files": [b]}, {"path": b}, {"path": a, "label": "mine"}],
                      base=tmp_path)
    assert mixture.labels() == ["glaive_v2", "chat", "chat_2", "mine"]
    with pytest.raises(UsageError, match="label 'My Set'.*'my_set'"):
        resolve([{"path": a, "label": "My Set"}], base=tmp_path)
    with pytest.raises(UsageError, match="same label"):
        resolve([{"path": a, "label": "x"}, {"path": b, "label": "x"}], base=tmp_path).labels()


def _train(tmp_path: Path, name: str, files: dict[str, str], **extra):
    import torch

    from beam_sft.train.sft import main, make_parser

    torch.set_num_threads(1)
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": files["A"], "label": "maths"}, {"path": "json", "data_files": files["C"],
                                                              "format": "sharegpt"}],
        "eval_split_size": 10, "seed": 0, "max_length": 256, "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 1, "max_steps": 4, "eval_strategy": "steps", "eval_steps": 2,
        "learning_rate": 3e-3, "warmup_steps": 0, "logging_steps": 1, "save_strategy": "no", "use_cpu": True,
        "bf16": False, "activation_checkpointing": False, "report_to": "none", "disable_tqdm": True,
        "dataloader_num_workers": 0, "output_dir": str(tmp_path / name), **extra}))
    argv = ["--config", str(config), "--prepared_cache_dir", str(tmp_path / "cache")]
    return main(*make_parser().parse_args_and_config(argv))


def _record_losses(trainer, rows) -> list[float]:
    """Each row's loss as evaluate() takes it with one row per batch: the mean NLL of its supervised tokens."""
    import torch
    import torch.nn.functional as F

    model = trainer.model.eval()
    out = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor(row["labels"][1:])
            logits = model(input_ids=ids).logits[0, :-1].float()
            out.append(F.cross_entropy(logits, labels, ignore_index=-100).item())
    return out


@pytest.mark.slow
def test_per_source_eval_loss_next_to_an_unchanged_eval_loss(tmp_path, tok):
    from datasets import load_from_disk

    files = {"A": _write(tmp_path / "maths.jsonl", [_chat("A", i) for i in range(24)]),
             "C": _write(tmp_path / "colours.jsonl", [_share("C", i) for i in range(24)])}
    trainer = _train(tmp_path, "on", files, metric_for_best_model="maths_loss", greater_is_better=False)
    history = trainer.state.log_history
    combined = {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e}
    maths = {e["step"]: e for e in history if "eval_maths_loss" in e}
    colours = {e["step"]: e for e in history if "eval_colours_loss" in e}
    assert sorted(combined) == sorted(maths) == sorted(colours) == [2, 4], history
    # TRL's eval metrics of a source's evaluation carry its label, not a second eval_mean_token_accuracy
    assert "eval_maths_mean_token_accuracy" in maths[4] and "eval_mean_token_accuracy" not in maths[4]
    # the per-source metrics reached the evaluation's metrics dict: metric_for_best_model can name one
    assert trainer.state.best_metric == pytest.approx(min(e["eval_maths_loss"] for e in maths.values()))

    # The rows of each source, told apart by their text (not by the manifest), and their losses computed here
    stats = json.loads((tmp_path / "on" / "data_stats.json").read_text())
    rows = list(load_from_disk(str(Path(stats["data"]["path"]) / "eval")))
    tags = ["A" if "A-" in tok.decode(r["input_ids"]) else "C" for r in rows]
    assert [(s["label"], s["rows"]) for s in stats["data"]["eval_sources"]] == [
        ("maths", tags.count("A")), ("colours", tags.count("C"))]
    print({k: v for k, v in maths[4].items() if "loss" in k}, colours[4]["eval_colours_loss"], combined, tags)
    losses = _record_losses(trainer, rows)
    by_tag = {t: [x for x, tag in zip(losses, tags, strict=True) if tag == t] for t in "AC"}
    assert by_tag["A"] and by_tag["C"]
    assert maths[4]["eval_maths_loss"] == pytest.approx(sum(by_tag["A"]) / len(by_tag["A"]), rel=1e-4)
    assert colours[4]["eval_colours_loss"] == pytest.approx(sum(by_tag["C"]) / len(by_tag["C"]), rel=1e-4)
    assert combined[4] == pytest.approx(sum(losses) / len(losses), rel=1e-4)

    # Off: the same training logs the same eval_loss at every evaluation, and no per-source figure
    off = _train(tmp_path, "off", files, eval_per_source=False)
    off_combined = {e["step"]: e["eval_loss"] for e in off.state.log_history if "eval_loss" in e}
    assert off_combined == pytest.approx(combined, rel=1e-6)
    assert not any("eval_maths_loss" in e for e in off.state.log_history)
