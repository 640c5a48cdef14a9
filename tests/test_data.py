"""The data phase (beam_sft.dataset: settings, pipeline, prepare, stream) and `beam-sft prepare`: Arrow, cached,
counted."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from inmemory import prepare_dataset, read_rows, to_beam_records

from beam_sft.dataset.examples import IGNORE_INDEX, EmptyMaskError
from beam_sft.dataset.pipeline import convert_records
from beam_sft.dataset.prepare import eval_records, load_prepared, prepare_data
from beam_sft.dataset.settings import MANIFEST, REJECTS, DataSettings, PhaseOptions
from beam_sft.errors import RecordError, UsageError

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "data" / "samples"
OPENAI = str(SAMPLES / "openai.jsonl")


def _hostile_file(tmp_path: Path) -> tuple[Path, int]:
    """Good records next to every kind of bad line: wrong JSON types anywhere, broken JSON, broken UTF-8."""
    good = [json.loads(line) for line in (SAMPLES / "openai.jsonl").read_text().splitlines()[:6]]
    bad = [
        b'{"messages": [{"role": "user", "content": "hi"}',  # malformed JSON
        b'{"messages": "\xff\xfe not utf-8"}',
        b"[1, 2, 3]",
        b'"just a string"',
        b"null",
        b'{"messages": [{"role": 7, "content": {"x": 1}}]}',
        b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ["a", 1]}]}',
        b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": 5}]}',
        b'{"messages": [], "tools": "nope"}',
        b'{"conversations": [{"from": "human", "value": null}]}',
    ]
    lines = [orjson.dumps(r) for r in good[:3]] + bad + [orjson.dumps(r) for r in good[3:]]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, len(lines)


def _rejects(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in (Path(path) / REJECTS).read_text().splitlines()]


# ------------------------------------------------------------------------------------------ the phase


@pytest.mark.parametrize("max_length,policy", [(None, "turn"), (200, "turn"), (200, "drop"), (200, "keep_start")])
def test_same_rows_and_counts_as_the_in_memory_path(tok, tmp_path, max_length, policy):
    """The Arrow phase gives the in-memory path's ids, labels and counts (that path is checked against
    apply_chat_template in test_train_data.py), under every truncation policy."""
    settings = DataSettings(max_length=max_length, truncation_policy=policy)
    prepared = prepare_data(OPENAI, tok, settings, cache_dir=tmp_path)
    records, _ = to_beam_records(read_rows(OPENAI))
    dataset, stats = prepare_dataset(tok, records, max_length=max_length, policy=policy)
    assert prepared.manifest["splits"]["train"] == stats.to_dict()
    assert prepared.train["input_ids"] == dataset["input_ids"]
    assert prepared.train["labels"] == dataset["labels"]
    if max_length is not None:
        assert stats.truncated + stats.dropped_too_long > 0  # the policy had something to do


def test_without_assistant_only_loss_every_token_is_a_label(tok, tmp_path):
    """The workers build a batch's labels at once (`examples.label_batch`): without assistant-only loss the labels
    are the ids, and every token, stop tokens included, is counted as supervised."""
    from beam_sft.template.tokenizer import stop_token_ids

    prepared = prepare_data(OPENAI, tok, DataSettings(max_length=None, assistant_only_loss=False),
                            cache_dir=tmp_path)
    ids, labels = prepared.train["input_ids"], prepared.train["labels"]
    assert ids == labels and len(ids) > 10
    split = prepared.manifest["splits"]["train"]
    flat = [t for row in ids for t in row]
    assert split["supervised_tokens"] == split["total_tokens"] == len(flat)
    ret, call = stop_token_ids(tok)
    assert (split["supervised_return"], split["supervised_call"]) == (flat.count(ret), flat.count(call))
    assert split["supervised_call"] > 0


def test_rejects_file_is_complete_for_hostile_input(tok, tmp_path):
    path, n_lines = _hostile_file(tmp_path)
    prepared = prepare_data([str(path), str(SAMPLES / "sharegpt.json")], tok,
                            DataSettings(max_length=128, truncation_policy="drop", max_reject_share=1.0),
                            cache_dir=tmp_path / "c")  # drops 72% on purpose: the default share would refuse it
    counts = prepared.manifest["counts"]
    rejects = _rejects(prepared.path)
    n_sharegpt = len(json.loads((SAMPLES / "sharegpt.json").read_text()))
    assert counts["records_in"] == n_lines + n_sharegpt
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]
    assert counts["dropped_too_long"] > 0 and counts["rejected_total"] >= 10
    assert len(rejects) == counts["rejected_total"] == sum(counts["rejected"].values())
    assert len(prepared.train) == counts["records_kept"]
    # Every reject says where it came from: JSONL by 1-based line, a JSON array by 0-based index.
    hostile_lines = sorted(r["line"] for r in rejects if r["source"] == str(path))
    assert hostile_lines == list(range(4, 14))
    assert {r["reason"] for r in rejects if r.get("line") == 5} == {"invalid_utf8"}
    assert all("index" in r for r in rejects if r["source"].endswith("sharegpt.json"))
    assert all(r["reason"] and r["message"] for r in rejects)


def test_chunked_build_equals_one_chunk(tok, tmp_path):
    """Chunks (what keeps memory flat) change nothing: same rows, splits, counts and rejects as one chunk."""
    from datasets import load_from_disk

    from beam_sft.dataset.prepare import PrepareRun

    path, _ = _hostile_file(tmp_path)
    inputs = [str(path), OPENAI, str(SAMPLES / "sharegpt.json")]
    settings = DataSettings(max_length=200, eval_split_size=0.2, seed=1)
    one = PrepareRun(inputs, tok, settings, tmp_path / "one").build()
    many = PrepareRun(inputs, tok, settings, tmp_path / "many", chunk_rows=7).build()
    for key in ("counts", "splits"):
        assert one[key] == many[key], key
    for sub in ("", "eval"):
        a, b = load_from_disk(str(tmp_path / "one" / sub)), load_from_disk(str(tmp_path / "many" / sub))
        assert a["input_ids"] == b["input_ids"] and a["labels"] == b["labels"], sub
    assert len(list((tmp_path / "many").glob("data-*.arrow"))) > 1
    assert _rejects(tmp_path / "one") == _rejects(tmp_path / "many")
    counts = many["counts"]
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]


def _tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a prepared directory but the manifest (which records the run's seconds)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "beam_sft_manifest.json"}


@pytest.mark.parametrize("eval_split", [0.0, 0.2, "inputs"])
def test_num_proc_1_and_2_give_the_same_bytes(tok, tmp_path, eval_split):
    """The worker pool (beam_sft.dataset.pipeline): the same shards, rejects and counts, byte for byte, with
    one process or two, fused (convert + tokenize in one task) or in two passes (an eval split drawn among
    the converted records), with rejects of both stages in several chunks."""
    from beam_sft.dataset.prepare import PrepareRun

    path, _ = _hostile_file(tmp_path)
    inputs = [str(path), OPENAI, str(SAMPLES / "sharegpt.json")]
    size = eval_split if isinstance(eval_split, float) else 0.0
    # (not one of the training inputs: an eval record that is also a training one is a duplicate, test_dedup.py)
    eval_inputs = [str(SAMPLES / "harmony.jsonl")] if eval_split == "inputs" else None
    settings = DataSettings(max_length=200, eval_split_size=size, seed=1)
    runs = {}
    for procs in (1, 2):
        runs[procs] = PrepareRun(inputs, tok, settings, tmp_path / f"p{procs}", num_proc=procs, chunk_rows=9,
                                 eval_inputs=eval_inputs, fingerprint="fp").build()
    for key in ("counts", "splits", "fingerprint"):
        assert runs[1][key] == runs[2][key], key
    one, two = _tree_bytes(tmp_path / "p1"), _tree_bytes(tmp_path / "p2")
    assert one == two
    assert sum(name.endswith(".arrow") for name in one) > 2  # several chunks, so several shards
    counts = runs[2]["counts"]
    assert counts["rejected_total"] > 5 and counts["records_kept"] > 10
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]
    assert len(_rejects(tmp_path / "p2")) == counts["rejected_total"]
    if eval_split:
        assert (tmp_path / "p2" / "eval").is_dir() and runs[2]["splits"]["eval"]["records_kept"] > 0


def test_the_data_phase_freezes_the_gc_only_while_records_stream(tok, tmp_path, monkeypatch):
    """`pipeline._frozen`: what is alive at the start is out of the cyclic GC's way during the run (the
    encoder's setup, a training job's model), and the process is left as it was, also when a run fails."""
    import gc

    from beam_sft.dataset import pipeline
    from beam_sft.dataset.prepare import PrepareRun

    seen = []
    real = pipeline.convert_batch

    def spy(*args, **kwargs):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "convert_batch", spy)
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    PrepareRun([OPENAI], tok, DataSettings(max_length=200), tmp_path / "p", num_proc=1).build()
    assert seen and min(count for count, _ in seen) > 1000  # the tokenizer, encoder and test session: frozen
    assert {threshold for _, threshold in seen} == {pipeline.GC_THRESHOLD}
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "run_task", boom)
    with pytest.raises(KeyboardInterrupt):
        PrepareRun([OPENAI], tok, DataSettings(max_length=200), tmp_path / "q", num_proc=1).build()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_unexpected_exception_in_a_converter_is_an_internal_error_reject(tok, tmp_path, monkeypatch):
    from beam_sft.validate import convert as conversion

    real = conversion.convert

    def flaky(rec, format="auto", options=None, counters=None):
        if "7" in json.dumps(rec):  # some records, not all
            raise ZeroDivisionError("boom")
        return real(rec, format, options, counters)

    monkeypatch.setattr(conversion, "convert", flaky)
    conv = convert_records(OPENAI, tmp_path, DataSettings())
    internal = [r for r in conv.iter_rejects() if r["reason"] == "internal_error"]
    assert internal and all(r["message"] == "ZeroDivisionError: boom" and r["line"] for r in internal)
    assert conv.rejected["internal_error"] == len(internal)
    assert conv.records_in == len(conv) + sum(conv.rejected.values())
    assert len(conv) > 0  # the run went on


def test_a_record_the_template_rejects_is_a_reject_not_a_stop(tok, tmp_path, monkeypatch):
    from beam_sft.render import encoder as render

    real = render.get_encoder(tok)

    class Picky:
        def encode(self, records, max_length=None):
            for i, record in enumerate(records):
                if "Paris" in json.dumps(record):
                    raise RecordError("render_failed", "the template says no").with_provenance(None, i)
            return real.encode(records, max_length)

    monkeypatch.setattr(render, "get_encoder", lambda tokenizer: Picky())
    prepared = prepare_data(OPENAI, tok, DataSettings(max_length=512), cache_dir=tmp_path)
    counts = prepared.manifest["counts"]
    failed = [r for r in _rejects(prepared.path) if r["reason"] == "render_failed"]
    assert failed and counts["rejected"]["render_failed"] == len(failed) and all(r["line"] for r in failed)
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]
    assert counts["records_kept"] > 0


def test_convert_records_gives_records_with_their_input_positions(tmp_path):
    conv = convert_records([str(SAMPLES / "harmony.jsonl")], tmp_path, DataSettings())
    assert conv.names == [str(SAMPLES / "harmony.jsonl")]
    records = list(conv.iter_records())
    assert len(records) == len(conv) and all(r["messages"] for r in records)
    assert records[:3] == conv[:3] and conv[len(conv) - 1] == records[-1]
    rows = sorted([*conv.rows.tolist(), *conv.reject_rows.tolist()])
    assert rows == list(range(conv.records_in))  # every input row once: a record or a reject


def test_empty_mask_is_a_hard_error_naming_the_record(tok, tmp_path):
    tok2 = tok.__class__.from_pretrained(REPO / "data" / "tokenizer")
    tok2.chat_template = tok.chat_template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    assert tok2.chat_template != tok.chat_template
    with pytest.raises(EmptyMaskError, match=r"openai.jsonl:1: the chat template produced an empty assistant mask"):
        prepare_data(OPENAI, tok2, DataSettings(max_length=512), cache_dir=tmp_path)
    # From a worker of the pool too: the same error, not a pool failure.
    with pytest.raises(EmptyMaskError, match=r"openai.jsonl:1: the chat template produced an empty assistant mask"):
        prepare_data(OPENAI, tok2, DataSettings(max_length=512), cache_dir=tmp_path,
                     options=PhaseOptions(num_proc=2))


def test_eval_split_is_seeded_and_counted(tok, tmp_path):
    settings = DataSettings(max_length=512, eval_split_size=0.25, seed=3)
    a = prepare_data(OPENAI, tok, settings, cache_dir=tmp_path / "a")
    b = prepare_data(OPENAI, tok, settings, cache_dir=tmp_path / "b")
    assert a.eval["input_ids"] == b.eval["input_ids"]
    n = a.manifest["counts"]["records_kept"]
    assert len(a.train) + len(a.eval) == n and len(a.eval) == round(0.25 * n)
    c = prepare_data(OPENAI, tok, DataSettings(max_length=512, eval_split_size=0.25, seed=4), cache_dir=tmp_path / "a")
    assert c.path != a.path and c.eval["input_ids"] != a.eval["input_ids"]


def test_eval_records_are_the_records_of_the_prepared_eval_split(tok, tmp_path):
    """--eval_beam generates from the records the data phase held out: same records, same order."""
    from beam_sft.render.encoder import encode_record

    settings = DataSettings(max_length=None, eval_split_size=0.25, seed=3)
    prepared = prepare_data(OPENAI, tok, settings, cache_dir=tmp_path / "cache")
    records = list(eval_records(OPENAI, settings, tmp_path / "work"))
    assert len(records) == len(prepared.eval) > 0
    assert [encode_record(tok, r)["input_ids"] for r in records] == prepared.eval["input_ids"]
    assert list(eval_records(OPENAI, DataSettings(max_length=None), tmp_path / "none")) == []


# ------------------------------------------------------------------------------------------ cache


def test_cache_reused_and_invalidated_by_tokenizer_template_max_length_and_data(tok, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes((SAMPLES / "openai.jsonl").read_bytes())
    cache = tmp_path / "cache"
    settings = DataSettings(max_length=512)
    record = PhaseOptions(output_dir=tmp_path / "rec")
    first = prepare_data(str(data), tok, settings, cache_dir=cache, options=record)
    assert first.action == "tokenized"
    assert json.loads((tmp_path / "rec" / "data_phase.rank0.json").read_text())["action"] == "tokenized"
    again = prepare_data(str(data), tok, settings, cache_dir=cache, options=record)
    assert again.action == "loaded" and again.path == first.path
    assert json.loads((tmp_path / "rec" / "data_phase.rank0.json").read_text())["action"] == "loaded"
    assert again.train["input_ids"] == first.train["input_ids"]

    paths = {first.path}

    def fresh(tokenizer, s, what):
        got = prepare_data(str(data), tokenizer, s, cache_dir=cache)
        assert got.action == "tokenized" and got.path not in paths, what
        paths.add(got.path)
        return got

    fresh(tok, DataSettings(max_length=256), "max_length")
    fresh(tok, DataSettings(max_length=512, truncation_policy="drop"), "policy")
    other_template = tok.__class__.from_pretrained(REPO / "data" / "tokenizer")
    other_template.chat_template = tok.chat_template + "\n"
    fresh(other_template, settings, "template")
    other_vocab = tok.__class__.from_pretrained(REPO / "data" / "tokenizer")
    other_vocab.add_tokens(["zzqqxx"])
    fresh(other_vocab, settings, "tokenizer")
    data.write_bytes(data.read_bytes() + b"\n")  # same records, new size + mtime: a new entry (cheap and safe)
    fresh(tok, settings, "data file")
    assert len(list(cache.glob("prepared-*"))) == 6


# ------------------------------------------------------------------------------------------ prepared dirs


def _prepare_cli(*argv: str) -> int:
    from beam_sft.cli import main

    return main(["prepare", *argv])


def test_prepare_cli_writes_dataset_manifest_rejects(tmp_path, capsys):
    out = tmp_path / "prep"
    stats = tmp_path / "stats.json"
    rc = _prepare_cli(OPENAI, str(SAMPLES / "sharegpt.json"), "-o", str(out), "--max_length", "256", "--stats",
                      str(stats), "--rejects", str(tmp_path / "rej.jsonl"), "-q")
    captured = capsys.readouterr()
    assert rc == 0 and captured.out.strip() == str(out)
    assert "records in" in captured.err and "dropped (too long)" in captured.err
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest == json.loads(stats.read_text())
    counts = manifest["counts"]
    assert counts["records_in"] == counts["records_kept"] + counts["rejected_total"] + counts["dropped_too_long"]
    assert (tmp_path / "rej.jsonl").read_text() == (out / REJECTS).read_text()
    assert manifest["max_length"] == 256 and manifest["truncation_policy"] == "turn"
    for key in ("tokenizer", "chat_template", "total_tokens", "supervised_return", "supervised_call"):
        assert key in manifest or key in counts
    from datasets import load_from_disk

    ds = load_from_disk(str(out))
    assert ds.column_names == ["input_ids", "labels"] and len(ds) == counts["records_kept"]
    assert sum(len(x) for x in ds["input_ids"]) == counts["total_tokens"]
    assert sum(t != IGNORE_INDEX for x in ds["labels"] for t in x) == counts["supervised_tokens"]


def test_prepare_cli_usage_errors(tmp_path, capsys):
    assert _prepare_cli(str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")) == 2
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert _prepare_cli(OPENAI, "-o", str(tmp_path / "busy")) == 2
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    assert "not a prepared dataset" in capsys.readouterr().err


def test_manifest_mismatch_is_a_clear_error_naming_the_field(tok, tmp_path):
    out = tmp_path / "prep"
    assert _prepare_cli(OPENAI, "-o", str(out), "--max_length", "512", "-q") == 0
    ok = load_prepared(out, tok, DataSettings(max_length=512))
    assert len(ok.train) == ok.manifest["counts"]["records_kept"]
    with pytest.raises(UsageError, match=r"manifest field 'max_length' is 512, this run has 1024"):
        prepare_data(str(out), tok, DataSettings(max_length=1024))
    with pytest.raises(UsageError, match="'truncation_policy'"):
        prepare_data(str(out), tok, DataSettings(max_length=512, truncation_policy="drop"))
    with pytest.raises(UsageError, match="'assistant_only_loss'"):
        prepare_data(str(out), tok, DataSettings(max_length=512, assistant_only_loss=False))
    other = tok.__class__.from_pretrained(REPO / "data" / "tokenizer")
    other.chat_template = tok.chat_template + " "
    with pytest.raises(UsageError, match="different chat template: manifest field 'chat_template'"):
        prepare_data(str(out), other, DataSettings(max_length=512))
    other = tok.__class__.from_pretrained(REPO / "data" / "tokenizer")
    other.add_tokens(["zzqqxx"])
    with pytest.raises(UsageError, match="different tokenizer vocabulary: manifest field 'tokenizer'"):
        prepare_data(str(out), other, DataSettings(max_length=512))


def test_prepared_dataset_trains_with_plain_trl(tok, tmp_path):
    """No beam-sft code in the training: load_from_disk + SFTTrainer take it as a pre-tokenized dataset."""
    from datasets import load_from_disk
    from trl import SFTConfig, SFTTrainer

    from beam_sft.model.load import build_tiny_model

    out = tmp_path / "prep"
    assert _prepare_cli(OPENAI, "-o", str(out), "--max_length", "512", "-q") == 0
    ds = load_from_disk(str(out))
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=2, per_device_train_batch_size=2, use_cpu=True,
                     bf16=False, report_to="none", max_length=512, save_strategy="no", logging_steps=1,
                     learning_rate=1e-3, disable_tqdm=True)
    trainer = SFTTrainer(build_tiny_model(tok, seed=0), args=args, train_dataset=ds, processing_class=tok)
    # TRL kept our labels: the batch it trains on masks exactly what the prepared rows mask.
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    for i in range(2):
        row = ds[i]
        assert batch["labels"][i, : len(row["labels"])].tolist() == row["labels"]
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(e["loss"] > 0 for e in trainer.state.log_history if "loss" in e)


def test_prepare_cli_rerun_is_up_to_date_until_something_changes(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_bytes((SAMPLES / "openai.jsonl").read_bytes())
    out = tmp_path / "prep"
    assert _prepare_cli(str(data), "-o", str(out), "-q") == 0
    first = json.loads((out / MANIFEST).read_text())
    capsys.readouterr()
    assert _prepare_cli(str(data), "-o", str(out), "-q") == 0
    assert "is up to date" in capsys.readouterr().err
    assert _prepare_cli(str(data), "-o", str(out), "-q", "--max_length", "300") == 0
    assert "is up to date" not in capsys.readouterr().err
    assert json.loads((out / MANIFEST).read_text())["fingerprint"] != first["fingerprint"]


# ------------------------------------------------------------------------------------------ streaming


def test_stream_shards_are_disjoint_and_cover_the_prepared_rows(tok, tmp_path):
    """Two ranks' shards of the stream hold, between them, exactly the rows `prepare_data` keeps."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    from beam_sft.dataset.stream import stream_training_data

    settings = DataSettings(max_length=200)
    options = PhaseOptions(world_size=2, output_dir=tmp_path / "rej")
    stream = stream_training_data(OPENAI, tok, settings, options)
    assert stream.n_shards == 2
    # What the Trainer's dataloader does on each of 2 ranks (accelerate shards a datasets.IterableDataset).
    parts = []
    for rank in (0, 1):
        loader = prepare_data_loader(DataLoader(stream, batch_size=None), num_processes=2, process_index=rank,
                                     dispatch_batches=False)
        parts.append([tuple(row["input_ids"]) for row in loader])
    assert parts[0] and parts[1]  # with the multiset equality below: each record on exactly one rank
    prepared = prepare_data(OPENAI, tok, settings, cache_dir=tmp_path / "cache")
    assert sorted(parts[0] + parts[1]) == sorted(tuple(x) for x in prepared.train["input_ids"])
    streamed_rejects = [json.loads(line) for f in (tmp_path / "rej").glob("rejects.rank*.jsonl")
                        for line in f.read_text().splitlines()]
    assert sorted(r["line"] for r in streamed_rejects) == sorted(r["line"] for r in _rejects(prepared.path))


def test_the_worker_pool_also_works_spawned(tok, tmp_path, monkeypatch):
    """Where fork is not safe (CUDA initialised) the workers are spawned and get the tokenizer pickled: the same
    bytes out."""
    from beam_sft.dataset import pipeline
    from beam_sft.dataset.prepare import PrepareRun

    settings = DataSettings(max_length=200)
    PrepareRun([OPENAI], tok, settings, tmp_path / "forked", num_proc=2, chunk_rows=8, fingerprint="fp").build()
    monkeypatch.setattr(pipeline, "_start_method", lambda: "spawn")
    PrepareRun([OPENAI], tok, settings, tmp_path / "spawned", num_proc=2, chunk_rows=8, fingerprint="fp").build()
    assert _tree_bytes(tmp_path / "forked") == _tree_bytes(tmp_path / "spawned")


def test_dataset_info_is_what_datasets_writes(tmp_path):
    """The prepared split's dataset_info.json is written from a constant (no datasets import in prepare's first
    pass): it must stay byte for byte what `save_to_disk` writes for the same features."""
    from datasets import Dataset

    from beam_sft.dataset.prepare import DATASET_INFO, _final_features

    Dataset.from_dict({"input_ids": [], "labels": []}, features=_final_features()).save_to_disk(str(tmp_path))
    assert (tmp_path / "dataset_info.json").read_text() == DATASET_INFO
