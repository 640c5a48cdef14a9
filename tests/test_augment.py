"""`beam-sft augment` and `beam_sft.augment`: the transforms that teach a tool-calling model when and which tool,
on the bundled samples and the real tool-calling records of data/real/train.jsonl.

What must hold: nothing is lost (records in = written from the input + rejected; written = that + added), the same
seed gives the same bytes, every record written is a valid Beam record, and each transform does what it says
(irrelevance never declares the called tool; mask-names leaves no original name; distractors never add a tool
that could serve the request; ask-missing removes the value and asks for it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest
from tokenizer_factories import script_module

from beam_sft.augment.base import Skip, rng_for
from beam_sft.augment.pipeline import KEEP, Augmenter, parse_spec
from beam_sft.augment.pool import ToolPool
from beam_sft.augment.words import (
    conversation_words,
    first_call,
    general_purpose,
    name_words,
    speaks_of_tools,
    texts,
    tool_name,
)
from beam_sft.cli.augment import main
from beam_sft.records.files import Item, read_items
from beam_sft.validate.convert import convert, convert_item, to_row

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "data" / "real" / "train.jsonl"
SAMPLES = [ROOT / "data" / "samples" / n for n in ("openai.jsonl", "sharegpt.json", "harmony.jsonl")]
ALL = ["irrelevance=0.2", "distractors=2", "mask-names=0.25", "ask-missing=0.1"]


def _records(paths) -> list[dict]:
    """The validated records of `paths`, as the command reads them."""
    out = []
    for item in read_items([str(p) for p in paths]):
        record, _, _ = convert_item(item, "auto", KEEP)
        if record is not None:
            out.append(record)
    return out


@pytest.fixture(scope="module")
def inputs() -> list[dict]:
    return _records([REAL, *SAMPLES])


def _augment(records: list[dict], specs: list[str], seed: int = 0):
    """Both passes of the command over in-memory records: (augmenter, outputs)."""
    aug = Augmenter(specs, seed=seed)
    if aug.needs_pool:
        for record in records:
            aug.collect(record)
    return aug, [out for position, record in enumerate(records) for out in aug.apply(record, position)]


def _cli(tmp_path: Path, inputs, specs, seed: int = 0, name: str = "out") -> dict:
    out = tmp_path / f"{name}.jsonl"
    argv = [*map(str, inputs), "-o", str(out), "--seed", str(seed), "--stats", str(tmp_path / f"{name}.stats.json"),
            "--rejects", str(tmp_path / f"{name}.rejects.jsonl"), "--provenance", str(tmp_path / f"{name}.prov.jsonl"),
            "-q", *(a for s in specs for a in ("--transform", s))]
    assert main(argv) == 0
    lines = lambda suffix: (tmp_path / f"{name}{suffix}").read_bytes().splitlines()
    return {"bytes": out.read_bytes(), "records": [orjson.loads(x) for x in lines(".jsonl")],
            "stats": json.loads((tmp_path / f"{name}.stats.json").read_text()),
            "rejects": [orjson.loads(x) for x in lines(".rejects.jsonl")],
            "provenance": [orjson.loads(x) for x in lines(".prov.jsonl")]}


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> dict:
    return _cli(tmp_path_factory.mktemp("real"), [REAL], ALL)


@pytest.fixture(scope="module")
def samples_run(tmp_path_factory) -> dict:
    return _cli(tmp_path_factory.mktemp("samples"), SAMPLES, ALL)


# ------------------------------------------------------------------------------------------------ the whole run


@pytest.mark.parametrize("run", ["real_run", "samples_run"])
def test_records_in_equal_written_plus_rejected_and_each_transform_adds_up(run, request):
    result = request.getfixturevalue(run)
    stats, records = result["stats"], result["records"]
    assert stats["records_in"] == stats["records_kept"] + stats["rejected"]
    assert stats["records_written"] == stats["records_kept"] + stats["added"] == len(records)
    assert len(result["rejects"]) == stats["rejected"] == sum(stats["rejected_by_reason"].values())
    assert stats["added"] == sum(t["added"] for t in stats["transforms"].values()) > 0
    for name, t in stats["transforms"].items():
        assert t["seen"] == t["changed"] + t["added"] + sum(t["skipped"].values()), name
        # additions see each input record once; rewrites also see what was added
        assert t["seen"] == (stats["records_kept"] if t["kind"] == "adds" else stats["records_written"]), name
    assert stats["transforms"]["distractors"]["changed"] > 0 and stats["transforms"]["mask-names"]["changed"] > 0
    touched = [p for p in result["provenance"]]
    assert sum(p["added_by"] is not None for p in touched) == stats["added"]
    assert all(p["added_by"] or p["rewrites"] for p in touched)
    assert [p["output_line"] for p in touched] == sorted({p["output_line"] for p in touched})


def test_the_samples_bad_records_are_rejected_with_their_reason(samples_run):
    assert samples_run["stats"]["rejected"] > 0
    assert all(r["reason"] and r["source"] and ("line" in r or "index" in r) for r in samples_run["rejects"])


def test_the_same_seed_gives_the_same_bytes_another_seed_other_ones(tmp_path, real_run):
    again = _cli(tmp_path, [REAL], ALL, name="again")
    other = _cli(tmp_path, [REAL], ALL, seed=1, name="other")
    assert again["bytes"] == real_run["bytes"]
    assert other["bytes"] != real_run["bytes"]


@pytest.mark.parametrize("run", ["real_run", "samples_run"])
def test_every_record_written_is_a_valid_beam_record_as_written(run, request):
    from beam_sft.validate.rules import Options, make_render_check

    rendering = Options(missing_reasoning="keep", render_check=make_render_check())
    for n, line in enumerate(request.getfixturevalue(run)["records"], 1):
        item = Item("out.jsonl", n, True, orjson.dumps(line), raw=True)
        record, _, reject = convert_item(item, "beam", rendering)
        assert reject is None, reject
        assert to_row(record) == line  # validating again changes nothing


def test_provenance_lives_beside_the_records_because_the_validator_drops_extra_keys(real_run):
    # a top-level key on a Beam record does not survive validation (nor `beam-sft convert --dataset_format beam`)
    record = {**real_run["records"][0], "augment": {"transform": "irrelevance", "from": 0}}
    assert "augment" not in convert(record, "beam", KEEP)[0]
    for p in real_run["provenance"]:
        assert p["source"].endswith("train.jsonl") and p["line"] == p["input"] + 1


# --------------------------------------------------------------------------------------------- each transform


def _called(record: dict) -> set[str]:
    return {c["function"]["name"] for c in record["messages"][first_call(record["messages"])]["tool_calls"]}


def test_irrelevance_never_declares_the_called_tool_and_always_reasons(inputs):
    aug, outs = _augment(inputs, ["irrelevance=1"])
    added = [o for o in outs if o.added_by]
    assert len(added) >= 40
    for out in added:
        source, record = inputs[out.position], out.record
        called = _called(source)
        target = record["messages"][-1]
        declared = [tool_name(t) for t in record["tools"]]
        assert declared and not called & set(declared)
        taken = set().union(*map(name_words, called)) | conversation_words(source)
        assert not any(name_words(n) & taken for n in declared), (declared, called)
        assert not any(general_purpose(t) for t in record["tools"]), declared  # a web search could serve it
        assert target["role"] == "assistant" and "tool_calls" not in target
        assert target["reasoning_content"].strip() and target["content"].strip()
        assert record["messages"][:-1] == source["messages"][:first_call(source["messages"])]
        assert all(m["role"] != "assistant" for m in record["messages"][:-1])
    skipped = aug.counts["irrelevance"].skipped
    assert set(skipped) <= {"no_tool_call", "no_user_before_call", "earlier_assistant_turn", "context_names_called_tool",
                            "no_unrelated_tool"}
    assert skipped["earlier_assistant_turn"] > 0


def test_general_purpose_tools_are_known_by_name_or_description():
    search = {"type": "function", "function": {"name": "get_instant_answer",
                                               "description": "Get an instant answer from DuckDuckGo"}}
    assert general_purpose(search) and general_purpose({"name": "webSearch", "description": ""})
    assert not general_purpose({"name": "get_sub_regions", "description": "List the sub-regions of a region"})
    pool_names = {tool_name(t) for r in _records([REAL]) for t in r.get("tools") or []}
    assert "get_instant_answer" in pool_names  # the real data has one: the guard is not hypothetical


def test_irrelevance_phrasings_vary_with_the_seed(inputs):
    answers = {o.record["messages"][-1]["content"].split(" ")[0] for o in _augment(inputs, ["irrelevance=1"])[1]
               if o.added_by}
    assert len(answers) > 1


def _whole_name(name: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")


def test_mask_names_leaves_no_original_name_and_calls_match_their_schemas(inputs):
    aug, outs = _augment(inputs, ["mask-names=1"])
    masked = [o for o in outs if o.rewrites]
    assert len(masked) >= 30
    for out in masked:
        source, record = inputs[out.position], out.record
        blob = orjson.dumps(record).decode()
        for name in {tool_name(t) for t in source["tools"]}:
            assert not _whole_name(name).search(blob), name
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in record["tools"]}
        assert all(re.fullmatch(r"func_[0-9a-f]{4}", n) for n in schemas)
        for schema in schemas.values():
            props = schema.get("properties") or {}
            assert all(re.fullmatch(r"arg_\d+", k) for k in props)
            assert set(schema.get("required") or ()) <= set(props)
        for m in record["messages"]:
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                assert fn["name"] in schemas
                assert set(fn["arguments"]) <= set(schemas[fn["name"]].get("properties") or {})
            if m["role"] == "tool":
                assert m["name"] in schemas
        # the same structure: only names changed
        assert [m["role"] for m in record["messages"]] == [m["role"] for m in source["messages"]]
    assert aug.counts["mask-names"].skipped.get("name_is_a_word", 0) > 0  # "earnings", "extract" ...


def test_distractors_never_add_a_tool_that_shares_a_word_with_the_conversation(inputs):
    _, outs = _augment(inputs, ["distractors=2"])
    changed = 0
    for out in outs:
        source, record = inputs[out.position], out.record
        if not out.rewrites:
            assert record is source
            continue
        changed += 1
        before = [tool_name(t) for t in source["tools"]]
        after = [tool_name(t) for t in record["tools"]]
        new = set(after) - set(before)
        assert [n for n in after if n in before] == before and 1 <= len(new) <= 2 == len(after) - len(before)
        taken = set().union(*map(name_words, before)) | conversation_words(source)
        assert not any(name_words(n) & taken for n in new)
        assert record["messages"] == source["messages"] and not speaks_of_tools(source)
    assert changed >= 40


def test_ask_missing_removes_the_value_and_asks_for_it(inputs):
    aug, outs = _augment(inputs, ["ask-missing=1"])
    added = [o for o in outs if o.added_by]
    assert len(added) >= 10
    for out in added:
        source, record = inputs[out.position], out.record
        at = first_call(source["messages"])
        before, after = source["messages"][at - 1]["content"], record["messages"][-2]["content"]
        call = source["messages"][at]["tool_calls"][0]["function"]
        removed = [v for v in map(str, call["arguments"].values()) if v in before and v.lower() not in after.lower()]
        assert removed, (before, after)
        assert not any(v.lower() in "\n".join(texts({"messages": record["messages"][:-1]})).lower() for v in removed)
        target = record["messages"][-1]
        assert "tool_calls" not in target and target["reasoning_content"].strip() and target["content"].endswith("?")
        assert record["messages"][:-2] == source["messages"][:at - 1] and len(after.split()) >= 3
    skipped = aug.counts["ask-missing"].skipped
    assert skipped["value_not_in_message"] > 0 and skipped["no_removable_phrase"] > 0


@pytest.mark.parametrize(("text", "value", "expected"), [
    ("What's the weather like in Cairo right now?", "Cairo", "What's the weather like right now?"),
    ('Can you tell me about the movie "Inception"?', "Inception", "Can you tell me about the movie?"),
    ("Find long weekends in the United States in 2024. Thanks.", "2024",
     "Find long weekends in the United States. Thanks."),
    ("I was born on 1990-05-15. How old am I?", "1990-05-15", None),  # the sentence would stop short
    ('The subject is "Project Update" and the body is short.', "Project Update", None),
    ("Is it warmer in Madrid or Cairo?", "Madrid", None),  # not the end of a clause
    ("A loan of 5000 dollars at 5%.", "5000", None),
    ("Split 15.5 ways for 5.", "5", "Split 15.5 ways."),  # a number is never found inside another
])
def test_ask_missing_drops_only_a_phrase_that_leaves_a_sentence(text, value, expected):
    from beam_sft.augment.ask_missing import drop_phrase

    assert drop_phrase(text, value) == expected


def test_transforms_never_change_the_record_they_are_given(inputs):
    frozen = orjson.dumps(inputs)
    _augment(inputs, ALL)
    assert orjson.dumps(inputs) == frozen


def test_a_records_choices_do_not_depend_on_the_other_records(inputs):
    # seeded from (seed, transform, position): the same record at the same position, alone or among others
    _, together = _augment(inputs, ["mask-names=0.5", "ask-missing=0.5"])
    k = 7
    alone = Augmenter(["mask-names=0.5", "ask-missing=0.5"]).apply(inputs[k], k)
    assert [o.record for o in alone] == [o.record for o in together if o.position == k]


def test_the_tool_pool_is_bounded_and_the_same_in_any_order():
    tools = [{"type": "function", "function": {"name": f"tool_{i}"}} for i in range(50)]
    forward, backward = ToolPool(seed=3, size=10), ToolPool(seed=3, size=10)
    for t in tools:
        forward.add(t)
    for t in reversed(tools):
        backward.add(t)
    assert len(forward) == 10 and set(forward.tools) == set(backward.tools)
    other = ToolPool(seed=4, size=10)
    for t in tools:
        other.add(t)
    assert set(other.tools) != set(forward.tools)


def test_a_transform_that_fails_validation_is_not_used(inputs):
    class Broken:
        name, adds, needs_pool = "mask-names", False, False

        def __call__(self, record, rng):
            return {**record, "messages": [{"role": "user", "content": "<|start|>"}]}

    aug = Augmenter(["mask-names=1"])
    aug._transforms = [Broken()]
    out = aug.apply(inputs[0], 0)
    assert out[0].record is inputs[0] and not out[0].rewrites
    assert aug.counts["mask-names"].skipped == {"invalid_harmony_marker_in_text": 1}


def test_skip_carries_its_reason():
    assert Skip("no_tools").reason == "no_tools"
    assert rng_for(0, "x", 1).random() == rng_for(0, "x", 1).random() != rng_for(0, "x", 2).random()


# ------------------------------------------------------------------------------------- hostile input, the CLI


def test_hostile_lines_are_rejected_with_a_reason_never_the_run(tmp_path):
    good = REAL.read_text(encoding="utf-8").splitlines()[0]
    bad = ['{"messages": "hi"}', '{"messages": [{"role": 1, "content": "x"}]}', "[1, 2]", '"text"', "not json",
           '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": 5}]}',
           '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "tools": 3}']
    src = tmp_path / "hostile.jsonl"
    src.write_text("\n".join([good, *bad, good]) + "\n", encoding="utf-8")
    result = _cli(tmp_path, [src], ["irrelevance=1", "mask-names=1", "distractors=1", "ask-missing=1"], name="h")
    stats = result["stats"]
    assert stats["records_in"] == len(bad) + 2 and stats["records_kept"] == 2 and stats["rejected"] == len(bad)
    assert sorted(r["line"] for r in result["rejects"]) == list(range(2, len(bad) + 2))
    assert all(r["reason"] for r in result["rejects"])


def test_help_and_one_line_usage_errors(tmp_path, capsys):
    from beam_sft.cli import main as beam_sft

    with pytest.raises(SystemExit) as done:
        beam_sft(["augment", "--help"])
    assert done.value.code == 0 and "irrelevance=P" in capsys.readouterr().out
    out = str(tmp_path / "x.jsonl")
    for spec, words in [("shuffle=1", "unknown transform"), ("irrelevance=1.5", "[0, 1]"),
                        ("mask-names=-0.1", "[0, 1]"), ("ask-missing=x", "[0, 1]"), ("distractors=0", "K must be"),
                        ("irrelevance", "irrelevance=VALUE")]:
        assert beam_sft(["augment", str(REAL), "-o", out, "--transform", spec]) == 2, spec
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert beam_sft(["augment", str(REAL), "-o", out]) == 2
    assert "at least one --transform" in capsys.readouterr().err
    assert not Path(out).exists()


def test_parse_spec():
    assert parse_spec("irrelevance=0.2") == ("irrelevance", 0.2)
    assert parse_spec("distractors=2") == ("distractors", 2)


def test_the_summary_states_the_invariant(tmp_path, capsys):
    assert main([str(REAL), "-o", str(tmp_path / "o.jsonl"), "--transform", "irrelevance=0.5", "-q"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    # 2 of data/real's records call against their tool's schema (docs/data.md#calls-checked-against-their-tools)
    assert re.match(r"augment: 148 records in = 146 written from the input \+ 2 rejected; \d+ added; \d+ records "
                    r"written to ", head)


def test_demo_real_augments_the_real_training_records(tmp_path):
    demo = script_module("demo_real")
    assert demo.make_parser().parse_args([]).augment == []
    assert demo.make_parser().parse_args(["--augment", "irrelevance=0.2", "--augment", "mask-names=0.5"]).augment == [
        "irrelevance=0.2", "mask-names=0.5"]
    data = demo.data(tmp_path, extra=False, augment_specs=["irrelevance=0.3"])
    assert sorted(p.name for p in data.glob("real.*")) == ["real.augmented.jsonl"]
    stats = json.loads((tmp_path / "augment.stats.json").read_text())
    # 2 records call against their tool's schema (docs/data.md#calls-checked-against-their-tools)
    assert stats["records_in"] == 148 and stats["records_kept"] == 146 and stats["added"] > 0
    assert len((data / "real.augmented.jsonl").read_text().splitlines()) == stats["records_written"]
