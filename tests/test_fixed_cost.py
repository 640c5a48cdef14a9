"""What `beam-sft prepare` pays before its first record: the tokenizer loaded without transformers re-reading
tokenizer.json, and the warm start (`beam_sft.render.warm`) that answers from a snapshot of an earlier setup."""

from __future__ import annotations

import json
import shutil

import pytest

from beam_sft.template.tokenizer import DEFAULT_TOKENIZER_DIR, _head_value, load_tokenizer

TEXTS = (
    "hello world",
    "<|start|>user<|message|>Hi there<|end|><|start|>assistant<|channel|>final<|message|>Hey<|return|>",
    "café 日本語 🙂 \t\n  spaces",
    "<|pad|><|endoftext|><|startoftext|><|call|>",
)


def _state(tokenizer) -> dict:
    """Everything a loaded tokenizer is: its attributes, the backend's serialisation, and what it answers."""
    state = {key: repr(value) for key, value in vars(tokenizer).items() if key not in ("_tokenizer", "init_kwargs")}
    state["init_kwargs"] = [(key, repr(value)) for key, value in tokenizer.init_kwargs.items()]
    state["backend"] = tokenizer._tokenizer.to_str()
    state["special_tokens_map"] = tokenizer.special_tokens_map
    state["added_tokens_decoder"] = {i: repr(t) for i, t in tokenizer.added_tokens_decoder.items()}
    state["chat_template"] = tokenizer.chat_template
    state["len"] = len(tokenizer)
    state["pad"] = (tokenizer.pad_token, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
    state["encoded"] = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    state["encoded_special"] = [tokenizer.encode(t) for t in TEXTS]
    state["decoded"] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in state["encoded"]]
    return state


def _reference(path):
    import transformers

    named = json.loads((path / "tokenizer_config.json").read_text())["tokenizer_class"]
    return getattr(transformers, named).from_pretrained(str(path))


@pytest.mark.parametrize("which", ["bundled", "o200k"])
def test_load_tokenizer_is_from_pretrained(which, request):
    path = DEFAULT_TOKENIZER_DIR if which == "bundled" else request.getfixturevalue("o200k_dir")
    assert _state(load_tokenizer(path)) == _state(_reference(path))


def test_load_tokenizer_reads_legacy_files_as_transformers_does(tmp_path):
    """A special_tokens_map.json (read by transformers only when the config has no added_tokens_decoder) keeps
    transformers' own path."""
    shutil.copytree(DEFAULT_TOKENIZER_DIR, tmp_path / "tok")
    (tmp_path / "tok" / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|start|>"}))
    ours, theirs = load_tokenizer(tmp_path / "tok"), _reference(tmp_path / "tok")
    assert ours.bos_token == "<|start|>"
    assert _state(ours) == _state(theirs)


def test_head_value_reads_members_cut_anywhere(tmp_path):
    doc = {"version": "1.0", "n": 12345678, "flag": True, "nested": {"added_tokens": [1]},
           "added_tokens": [{"id": 5, "content": "a\"b"}], "model": {"vocab": {"x": 1}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=2))
    for chunk in (1, 3, 7, 64, 1 << 20):
        assert _head_value(path, "added_tokens", chunk=chunk) == doc["added_tokens"]
        assert _head_value(path, "n", chunk=chunk) == doc["n"]
    with pytest.raises(ValueError):
        _head_value(path, "absent")


# ------------------------------------------------------------------------------------------ warm start

REPO = DEFAULT_TOKENIZER_DIR.parents[1]
SAMPLES = REPO / "data" / "samples"
# Text tiktoken does not vouch for (plane 15, private use): those pieces need the tokenizers backend.
ODD = "odd \U000f0041\U000f0042 text ǅ \u2028 🙂"


@pytest.fixture
def snapshots(tmp_path, monkeypatch):
    """An empty warm-start cache of this test's own (the tiktoken cache stays shared: it is slow to fill)."""
    from beam_sft.render import warm

    where = tmp_path / "warm-cache"
    monkeypatch.setattr(warm, "cache_dir", lambda: where)
    monkeypatch.delenv(warm.ENV_OFF, raising=False)
    return where


def _tokenizer_dir(which, request):
    return DEFAULT_TOKENIZER_DIR if which == "bundled" else request.getfixturevalue("o200k_dir")


def _records():
    lines = (SAMPLES / "openai.jsonl").read_text().splitlines()[:12]
    records = [json.loads(line) for line in lines]
    records.append({"messages": [{"role": "user", "content": ODD}, {"role": "assistant", "content": ODD * 2}]})
    return records


def _encoded(encoder):
    from beam_sft.render.encoder import encode_each

    return [r if isinstance(r, dict) else repr(r) for r in encode_each(encoder, _records())]


def _warm_and_cold(path):
    from beam_sft.render.warm import WarmTokenizer, load_for_encoding

    cold = load_for_encoding(path)
    assert not isinstance(cold, WarmTokenizer)  # no snapshot yet: the real tokenizer, and a snapshot stored
    warm = load_for_encoding(path)
    assert isinstance(warm, WarmTokenizer) and not warm.loaded
    return warm, cold


@pytest.mark.parametrize("which", ["bundled", "o200k"])
def test_warm_tokenizer_answers_as_the_real_one(which, request, snapshots, monkeypatch):
    from beam_sft.dataset.settings import DataSettings, run_fields
    from beam_sft.render import warm as warm_module
    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.template.tokenizer import stop_token_ids, template_hash, vocab_hash

    warm, cold = _warm_and_cold(_tokenizer_dir(which, request))
    # Nothing below may load the real tokenizer: what the data phase asks comes from the snapshot.
    monkeypatch.setattr(warm_module, "load_tokenizer", lambda *a, **k: pytest.fail("loaded the real tokenizer"))
    for ask in (vocab_hash, template_hash, stop_token_ids, lambda t: run_fields(t, DataSettings()), len):
        assert ask(warm) == ask(cold), ask
    for name in ("chat_template", "special_tokens_map", "truncation_side", "split_special_tokens", "name_or_path"):
        assert getattr(warm, name) == getattr(cold, name), name
    assert warm.get_chat_template() == cold.get_chat_template()
    fast, reference = MaskedEncoder(warm), MaskedEncoder(cold)
    assert (fast.fast, fast.tiktoken_reason, fast._marker_ids) == (True, reference.tiktoken_reason,
                                                                    reference._marker_ids)
    assert (fast._tiktoken is None) == (reference._tiktoken is None)
    assert _encoded(fast) == _encoded(reference)
    assert fast._backend.to_str() == reference._backend.to_str()
    assert not warm.loaded


def test_warm_tokenizer_loads_the_real_one_where_needed(snapshots, monkeypatch):
    """A record left to the reference path (`apply_chat_template`), or any other attribute, loads the real
    tokenizer; from then on every answer is the real one's."""
    from beam_sft.render import encoder as encoder_module
    from beam_sft.render.encoder import MaskedEncoder, reference_encode
    from beam_sft.template.tokenizer import vocab_hash

    warm, cold = _warm_and_cold(DEFAULT_TOKENIZER_DIR)
    encoder = MaskedEncoder(warm)
    monkeypatch.setattr(encoder_module, "_sorted_disjoint", lambda spans: False)  # every record: the reference
    records = _records()[:3]
    assert encoder.encode(records) == [reference_encode(cold, r) for r in records]
    assert warm.loaded
    assert warm.encode(ODD) == cold.encode(ODD) and warm.pad_token_id == cold.pad_token_id
    assert vocab_hash(warm) == vocab_hash(cold)
    warm.chat_template = cold.chat_template + " "  # set on the real one, and answered by it
    assert warm.chat_template == cold.chat_template + " "


def test_warm_tokenizer_pickles_small_and_encodes_after(snapshots):
    import pickle

    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.render.warm import WarmTokenizer

    warm, cold = _warm_and_cold(DEFAULT_TOKENIZER_DIR)
    data = pickle.dumps(warm)
    assert len(data) < 100_000
    again = pickle.loads(data)
    assert isinstance(again, WarmTokenizer) and not again.loaded
    assert _encoded(MaskedEncoder(again)) == _encoded(MaskedEncoder(cold))
    encoder = pickle.loads(pickle.dumps(MaskedEncoder(again)))
    assert _encoded(encoder) == _encoded(MaskedEncoder(cold))
    again.real()
    assert type(pickle.loads(pickle.dumps(again))) is type(cold)  # loaded: pickles as the real tokenizer


def test_snapshot_follows_the_tokenizer_files(snapshots, tmp_path):
    from beam_sft.render.warm import WarmTokenizer, load_for_encoding
    from beam_sft.template.tokenizer import template_hash

    path = tmp_path / "tok"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, path)
    _warm_and_cold(path)
    template = path / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    changed = load_for_encoding(path)
    assert not isinstance(changed, WarmTokenizer)
    assert template_hash(changed) == template_hash(load_tokenizer(path))
    assert isinstance(load_for_encoding(path), WarmTokenizer)
    assert template_hash(load_for_encoding(path)) == template_hash(changed)
    assert len(list(snapshots.glob("warm-*"))) == 2


def test_no_warm_start_where_it_cannot_stand_in(snapshots, tmp_path, monkeypatch):
    from beam_sft.render import warm

    _warm_and_cold(DEFAULT_TOKENIZER_DIR)
    monkeypatch.setenv(warm.ENV_OFF, "1")
    assert not isinstance(warm.load_for_encoding(DEFAULT_TOKENIZER_DIR), warm.WarmTokenizer)
    monkeypatch.delenv(warm.ENV_OFF)
    model_dir = tmp_path / "model"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, model_dir)
    (model_dir / "config.json").write_text("{}")  # AutoTokenizer's choice there: no warm start
    assert warm._eligible(model_dir) is None
    assert warm._eligible(tmp_path / "absent") is None


def test_damaged_snapshot_sets_up_as_usual(snapshots, request):
    """The tiktoken ranks the snapshot names gone (pruned from the shared cache) and its backend copy damaged:
    the encoder sets up as usual, on the real tokenizer."""
    from beam_sft.render.encoder import MaskedEncoder
    from beam_sft.render.warm import load_for_encoding

    path = request.getfixturevalue("o200k_dir")
    _, cold = _warm_and_cold(path)
    where = next(snapshots.glob("warm-*"))
    snapshot = json.loads((where / "snapshot.json").read_text())
    assert snapshot["encoder"]["tiktoken_key"] is not None
    snapshot["encoder"]["tiktoken_key"] = "0" * 32
    (where / "snapshot.json").write_text(json.dumps(snapshot))
    (where / "backend.json").write_text("{}")
    warm = load_for_encoding(path)
    assert not warm.loaded
    encoder = MaskedEncoder(warm)
    assert warm.loaded and encoder.fast and encoder._tiktoken is not None
    assert _encoded(encoder) == _encoded(MaskedEncoder(cold))


def _prepared_files(out):
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = json.loads(files.pop("beam_sft_manifest.json"))
    manifest.pop("seconds")
    return files, manifest


@pytest.mark.parametrize("which", ["bundled", "o200k"])
def test_prepare_writes_the_same_bytes_cold_and_warm(which, request, snapshots, tmp_path, monkeypatch):
    from beam_sft.cli import main
    from beam_sft.render import warm

    path = _tokenizer_dir(which, request)
    odd = tmp_path / "odd.jsonl"
    odd.write_text("\n".join(json.dumps(r) for r in _records()) + "\n{\"messages\": []}\n")
    inputs = [str(SAMPLES / "openai.jsonl"), str(SAMPLES / "sharegpt.json"), str(odd)]

    def prepare(name, *extra):
        out = tmp_path / name
        assert main(["prepare", *inputs, "-o", str(out), "--tokenizer_name_or_path", str(path), "-q",
                     "--max_length", "300", *extra]) == 0
        return _prepared_files(out)

    cold = prepare("cold")
    assert list(snapshots.glob("warm-*"))
    loads = []
    monkeypatch.setattr(warm, "load_tokenizer", lambda *a, **k: loads.append(a) or load_tokenizer(*a, **k))
    assert prepare("warm") == cold
    assert prepare("warm2", "--dataset_num_proc", "2") == cold
    assert not loads  # neither this process nor the forked workers loaded the real tokenizer
    monkeypatch.setenv(warm.ENV_OFF, "1")
    assert prepare("off") == cold
    assert prepare("off2", "--dataset_num_proc", "2") == cold
    assert cold[1]["counts"]["rejected_total"] > 0


def test_spawned_workers_get_the_snapshot_not_the_vocabulary(snapshots, tmp_path, monkeypatch):
    """A process that has initialised CUDA spawns its workers: they unpickle the warm tokenizer and set up from
    the snapshot; the output is the same bytes as with the real tokenizer."""
    from beam_sft.dataset import pipeline
    from beam_sft.dataset.prepare import PrepareRun
    from beam_sft.dataset.settings import DataSettings
    from beam_sft.render.warm import load_for_encoding

    _, cold = _warm_and_cold(DEFAULT_TOKENIZER_DIR)
    inputs = [str(SAMPLES / "openai.jsonl")]
    settings = DataSettings(max_length=300)
    PrepareRun(inputs, cold, settings, tmp_path / "cold", fingerprint="f").build()
    monkeypatch.setattr(pipeline, "_start_method", lambda: "spawn")
    PrepareRun(inputs, load_for_encoding(DEFAULT_TOKENIZER_DIR), settings, tmp_path / "warm", num_proc=2,
               fingerprint="f", chunk_rows=20).build()
    PrepareRun(inputs, cold, settings, tmp_path / "spawned", num_proc=2, fingerprint="f", chunk_rows=20).build()
    PrepareRun(inputs, cold, settings, tmp_path / "cold2", fingerprint="f", chunk_rows=20).build()
    assert _prepared_files(tmp_path / "warm") == _prepared_files(tmp_path / "cold2")
    assert _prepared_files(tmp_path / "spawned") == _prepared_files(tmp_path / "cold2")
    assert _prepared_files(tmp_path / "cold")[1]["counts"] == _prepared_files(tmp_path / "warm")[1]["counts"]


def test_prepare_never_imports_pandas(tmp_path):
    """pyarrow imports pandas on its first conversion of Python objects (0.3-0.45 CPU-s of a small prepare's
    fixed cost): the pipeline builds its Arrow columns from numpy buffers instead."""
    import subprocess
    import sys

    out = tmp_path / "out"
    code = ("import sys; from beam_sft.cli import main; "
            f"rc = main(['prepare', {str(SAMPLES / 'openai.jsonl')!r}, {str(SAMPLES / 'sharegpt.json')!r}, "
            f"'-o', {str(out)!r}, '-q']); "
            "print(rc, 'pandas' in sys.modules, 'datasets' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert run.stdout.split()[-3:] == ["0", "False", "False"], run.stderr[-2000:]
    assert (out / "dataset_info.json").exists()


@pytest.mark.parametrize(("values", "type_name"), [
    ([1, 2, 3], "int32"), ([5, 2**40, 0], "int64"), ([True, False, True] * 7, "bool_"), ([], "int32"),
    ([b'{"a": 1}', b"", b"\xff\xfe"], "large_binary"), (["h\u00e9llo", "", "\U0001f642"], "string"),
    ([None, None], "string"), (["a", None], "string"), ([b"a", None], "large_binary"), ([], "bool_"),
    ([], "string"), ([], "large_binary")])
def test_arrow_columns_are_what_pyarrow_builds(values, type_name):
    import numpy as np
    import pyarrow as pa

    from beam_sft.storage import arrow_array, numpy_ints

    type_ = getattr(pa, type_name)()
    built = arrow_array(values, type_)
    built.validate(full=True)
    assert built.equals(pa.array(values, type_))
    if type_name.startswith("int") and values:
        assert numpy_ints(built).tolist() == values
        assert numpy_ints(built.slice(1)).tolist() == values[1:]
        assert arrow_array(np.asarray(values), type_).equals(built)
