"""Dataset mixtures (beam_sft.dataset.mixture): TRL's `datasets:` YAML and fraction rule, per-source keys,
counted per source in the manifest; `beam-sft prepare --config` and scripts/train.py agree."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml

from beam_sft.dataset.mixture import read_mixture, taken_counts
from beam_sft.dataset.prepare import PrepareRun
from beam_sft.dataset.settings import DataSettings, PhaseOptions
from beam_sft.errors import UsageError


def _openai(tag: str, i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"{tag}-{i}: what is {i} + 1?"},
                         {"role": "assistant", "content": f"{i + 1}.", "reasoning_content": f"{i} plus one."}]}


def _sharegpt(tag: str, i: int) -> dict:
    return {"conversations": [{"from": "human", "value": f"{tag}-{i}: what is {i} + 1?"},
                              {"from": "gpt", "value": f"<think>{i} plus one.</think>{i + 1}."}]}


def _files(tmp_path: Path) -> dict[str, str]:
    """Three sources of 30, 20 and 50 rows: tool-ish, reasoning, chat (each row tagged with its source)."""
    out = {}
    for tag, n, make in (("A", 30, _openai), ("B", 20, _openai), ("C", 50, _sharegpt)):
        path = tmp_path / f"{tag}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(make(tag, i)) + b"\n" for i in range(n)))
        out[tag] = str(path)
    return out


def _yaml(tmp_path: Path, entries: list[dict], **rest) -> Path:
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump({"datasets": entries, **rest}))
    return path


def _trl_counts(config: Path) -> Counter:
    """Rows per source tag as TRL's own get_dataset loads the mixture."""
    from trl import DatasetMixtureConfig
    from trl.scripts.utils import get_dataset

    entries = yaml.safe_load(config.read_text())["datasets"]
    mixture = DatasetMixtureConfig(datasets=[{k: v for k, v in e.items() if k in (
        "path", "name", "data_dir", "data_files", "split", "columns", "fraction")} for e in entries])
    train = get_dataset(mixture)["train"]
    tags = Counter()
    for row in train:
        first = (row.get("messages") or row.get("conversations"))[0]
        tags[(first.get("content") or first.get("value")).split("-")[0]] += 1
    return tags


def _kept_tags(tok, path: Path) -> Counter:
    from datasets import load_from_disk

    texts = [tok.decode(ids) for ids in load_from_disk(str(path))["input_ids"]]
    return Counter(next(tag for tag in "ABC" if f"{tag}-" in t) for t in texts)


@pytest.mark.parametrize("fractions", [(0.5, 0.3, 0.2), (1, 1, 1), (0.2, 0.0, 0.8), None])
def test_three_source_mixture_takes_exactly_trls_rows(tok, tmp_path, fractions):
    files = _files(tmp_path)
    entries = [{"path": "json", "data_files": files[tag], **({"fraction": f} if fractions else {})}
               for tag, f in zip("ABC", fractions or (None,) * 3, strict=True)]
    entries[2]["format"] = "sharegpt"  # beam-sft's own key (TRL's loader is given only its keys)
    config = _yaml(tmp_path, entries)
    trl = _trl_counts(config)
    manifest = PrepareRun(read_mixture(config), tok, DataSettings(), tmp_path / "p").build()
    taken = {Path(m["files"][0]).stem: m["taken"] for m in manifest["mixture"]}
    assert {tag: n for tag, n in taken.items() if n} == dict(trl)
    assert _kept_tags(tok, tmp_path / "p") == trl
    assert [m["read"] for m in manifest["mixture"]] == [30, 20, 50]


def test_taken_counts_is_trls_rule():
    assert taken_counts([30, 20, 50], [0.5, 0.3, 0.2]) == [30, 18, 12]
    assert taken_counts([30, 20, 50], [None] * 3) == [30, 20, 50]
    with pytest.raises(UsageError, match="either all"):
        taken_counts([1, 2], [0.5, None])


def test_per_source_max_records_shuffle_format_and_counts(tok, tmp_path):
    files = _files(tmp_path)
    dup = tmp_path / "dup.jsonl"  # 5 rows of A again, 1 bad row
    dup.write_bytes(b"".join(orjson.dumps(_openai("A", i)) + b"\n" for i in range(5)) + b"{broken\n")
    config = _yaml(tmp_path, [
        {"path": files["A"], "max_records": 10},
        {"path": files["C"], "format": "sharegpt", "max_records": 40, "shuffle": 7},
        {"path": "json", "data_files": [str(dup)]},
    ])
    manifest = PrepareRun(read_mixture(config), tok, DataSettings(), tmp_path / "p").build()
    a, c, d = manifest["mixture"]
    assert (a["read"], a["taken"], c["read"], c["taken"]) == (10, 10, 40, 40)
    assert d == {**d, "read": 6, "taken": 6, "duplicates": 5, "rejected": {"duplicate": 5, "malformed_json": 1}}
    assert manifest["counts"]["records_kept"] == 50
    # a seeded sample: the same seed takes the same rows, another seed others
    sample = read_mixture(_yaml(tmp_path, [{"path": files["C"], "fraction": 0.5, "shuffle": 3},
                                           {"path": files["B"], "fraction": 0.5}]))
    rows = [item.position for item in sample.items() if item.source == files["C"]]
    again = [item.position for item in read_mixture(tmp_path / "mix.yaml").items() if item.source == files["C"]]
    assert len(rows) == 20 and rows == again and rows != list(range(1, 21)) and rows == sorted(rows)


def test_mixture_config_errors(tmp_path):
    files = _files(tmp_path)
    with pytest.raises(UsageError, match="unknown key"):
        read_mixture(_yaml(tmp_path, [{"path": files["A"], "fractoin": 0.5}]))
    with pytest.raises(UsageError, match="either all"):
        read_mixture(_yaml(tmp_path, [{"path": files["A"], "fraction": 0.5}, {"path": files["B"]}]))
    with pytest.raises(UsageError, match="data_files"):
        read_mixture(_yaml(tmp_path, [{"path": "json"}]))


def test_prepare_config_and_train_data_phase_agree(tok, tmp_path, capsys):
    """`beam-sft prepare --config` and scripts/train.py's data phase (`--config` with `datasets:`) make the same
    rows from the same YAML, and a changed source file is a new cache entry."""
    from datasets import load_from_disk

    from beam_sft.cli import main
    from beam_sft.train.config import ScriptArguments
    from beam_sft.train.data_phase import training_datasets, training_inputs

    files = _files(tmp_path)
    config = _yaml(tmp_path, [{"path": "json", "data_files": files["A"], "fraction": 0.5},
                              {"path": files["B"], "fraction": 0.3},
                              {"path": files["C"], "format": "sharegpt", "fraction": 0.2}])
    assert main(["prepare", "--config", str(config), "-o", str(tmp_path / "p"), "-q", "--dataset_num_proc", "1",
                 "--max_length", "0", "--seed", "0"]) == 0
    manifest = json.loads((tmp_path / "p" / "beam_sft_manifest.json").read_text())
    assert [m["taken"] for m in manifest["mixture"]] == [30, 18, 12]
    args = ScriptArguments(datasets=yaml.safe_load(config.read_text())["datasets"])
    inputs = training_inputs(args, seed=0, base=config.parent)
    train, _, _ = training_datasets(inputs, tok, DataSettings(), cache_dir=str(tmp_path / "cache"))
    assert train["input_ids"] == load_from_disk(str(tmp_path / "p"))["input_ids"]
    capsys.readouterr()
    assert main(["prepare", files["A"], "--config", str(config), "-o", str(tmp_path / "q"), "-q"]) == 2
    assert "not both" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ streamed


def test_a_streamed_mixture_draws_its_shares_seeded_and_stops_when_a_source_runs_out(tmp_path):
    from beam_sft.dataset.mixture import resolve

    files = _files(tmp_path)
    big = tmp_path / "D.jsonl"
    big.write_bytes(b"".join(orjson.dumps(_openai("D", i)) + b"\n" for i in range(3000)))
    entries = [{"path": str(big), "fraction": 0.75}, {"path": files["C"], "fraction": 0.05, "format": "sharegpt"},
               {"path": files["A"], "fraction": 0.2, "max_records": 1000}]
    mixture = resolve(entries, seed=3, count=False)
    assert [plan.rows for plan in mixture.plans] == [None, None, None]  # nothing read to plan it
    with pytest.raises(UsageError, match="streamed_items"):
        next(mixture.items())
    rows = [(item.source, item.position) for item in mixture.streamed_items()]
    again = [(item.source, item.position) for item in resolve(entries, seed=3, count=False).streamed_items()]
    other = [(item.source, item.position) for item in resolve(entries, seed=4, count=False).streamed_items()]
    assert rows == again and rows != other
    tags = Counter(src for src, _ in rows)
    # A (30 rows at 20%) runs out first: the stream ends there, near TRL's N = 30 / 0.2 = 150 rows
    assert tags[files["A"]] == 30 and 100 <= len(rows) <= 220
    assert abs(tags[str(big)] / len(rows) - 0.75) < 0.1 and tags[files["C"]] < 50
    for src in tags:  # each source in file order, none read twice
        positions = [pos for s, pos in rows if s == src]
        assert positions == list(range(1, len(positions) + 1))
    # no fractions: every row, source after source, max_records bounding each
    plain = resolve([{"path": files["A"], "max_records": 7}, {"path": files["B"]}], count=False)
    assert [(s.rsplit("/", 1)[1], n) for s, n in Counter(i.source for i in plain.streamed_items()).items()] == [
        ("A.jsonl", 7), ("B.jsonl", 20)]
    with pytest.raises(UsageError, match="use --shuffle_buffer"):
        resolve([{"path": files["A"], "shuffle": True}], count=False)
    with pytest.raises(UsageError, match="either all"):
        resolve([{"path": files["A"], "fraction": 0.5}, {"path": files["B"]}], count=False)


def test_a_streamed_mixture_trains_each_source_in_its_format_and_shards_by_rank(tok, tmp_path):
    """stream_training_data on a mixture: every source converted with its own format (the sharegpt one too),
    the two ranks' shards disjoint, together the whole mixed sequence."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    from beam_sft.dataset.mixture import resolve
    from beam_sft.dataset.stream import stream_training_data

    files = _files(tmp_path)
    entries = [{"path": files["A"], "fraction": 0.5}, {"path": files["C"], "fraction": 0.5, "format": "sharegpt"}]
    mixture = resolve(entries, seed=1, count=False)
    expected = len(list(mixture.streamed_items()))
    stream = stream_training_data(resolve(entries, seed=1, count=False), tok, DataSettings(seed=1),
                                  PhaseOptions(world_size=2, output_dir=tmp_path / "rej"))
    parts = []
    for rank in (0, 1):
        loader = prepare_data_loader(DataLoader(stream, batch_size=None), num_processes=2, process_index=rank,
                                     dispatch_batches=False)
        parts.append([tok.decode(row["input_ids"]) for row in loader])
    texts = parts[0] + parts[1]
    assert len(texts) == expected and len(set(texts)) == expected and parts[0] and parts[1]
    tags = Counter(next(tag for tag in "AC" if f"{tag}-" in t) for t in texts)
    assert tags["A"] == 30 and tags["C"] > 10  # C's rows (sharegpt, <think>) converted, not rejected
    assert not (tmp_path / "rej").exists()  # nothing rejected


def test_train_streams_a_mixture_config(tmp_path):
    """scripts/train.py --config with `datasets:` and --streaming true: checked, dry-run plan names the shares."""
    from beam_sft.train.config import ScriptArguments
    from beam_sft.train.data_phase import streamed_note, training_inputs

    files = _files(tmp_path)
    entries = [{"path": files["A"], "fraction": 0.6, "label": "tools"},
               {"path": files["C"], "fraction": 0.4, "format": "sharegpt", "max_records": 10}]
    args = ScriptArguments(datasets=entries, streaming=True)
    inputs = training_inputs(args, seed=0)
    assert all(plan.rows is None for plan in inputs.plans)
    assert streamed_note(inputs) == "a mixture of tools (60% of the rows), c (40% of the rows, at most 10)"


def test_scripts_train_trains_on_a_streamed_mixture(tmp_path, capsys):
    """The whole run: `datasets:` + `streaming: true` (each source its format, one with max_records), 3 steps,
    nothing cached, the log naming the shares."""
    import logging

    import torch

    from beam_sft.train.sft import main, make_parser

    torch.set_num_threads(1)
    files = _files(tmp_path)
    config = tmp_path / "stream.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": files["A"], "fraction": 0.5, "label": "maths"},
                     {"path": "json", "data_files": files["C"], "format": "sharegpt", "fraction": 0.5,
                      "max_records": 12}],
        "streaming": True, "seed": 0, "max_length": 256, "per_device_train_batch_size": 2, "max_steps": 3,
        "learning_rate": 3e-3, "warmup_steps": 0, "logging_steps": 1, "save_strategy": "no", "use_cpu": True,
        "bf16": False, "activation_checkpointing": False, "report_to": "none", "disable_tqdm": True,
        "dataloader_num_workers": 0, "output_dir": str(tmp_path / "out")}))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("beam_sft").addHandler(handler)
    try:
        main(*make_parser().parse_args_and_config(["--config", str(config), "--prepared_cache_dir",
                                                   str(tmp_path / "cache")]))
    finally:
        logging.getLogger("beam_sft").removeHandler(handler)
    assert "trained 3 steps" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert not (tmp_path / "cache").exists()
    assert any("a mixture of maths (50% of the rows), c (50% of the rows, at most 12)" in r.getMessage()
               for r in records)
