"""beam_sft.render.encoder: the fast masked tokenization path must equal apply_chat_template, always.

The reference is `tokenizer.apply_chat_template(..., tokenize=True, return_dict=True,
return_assistant_tokens_mask=True)`. Checked on every bundled sample, on real samples
(tests/data/realdata, through the converters), and on generated conversations; plus the fallback for
tokenizers where cutting at markers is not exact, truncation, errors, and the datasets wrapper's
multi-processing and cache.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_sft.errors import Reason, RecordError
from beam_sft.render import encoder as render
from beam_sft.render import jinja
from beam_sft.render.encoder import MaskedEncoder, encode_record, reference_encode
from beam_sft.template.tokenizer import MARKERS

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"
REALDATA = Path(__file__).resolve().parent / "data" / "realdata"


def assert_identical(tokenizer, records, encoder=None, max_length=None):
    """Ours (batched) == reference (one by one) for every record the template accepts; returns the count."""
    encoder = encoder or MaskedEncoder(tokenizer)
    accepted = []
    for record in records:
        try:
            accepted.append((record, reference_encode(tokenizer, record, max_length)))
        except RecordError:
            with pytest.raises(RecordError):
                encoder.encode([record], max_length)
    ours = encoder.encode([record for record, _ in accepted], max_length)
    for (record, expected), got in zip(accepted, ours, strict=True):
        assert got == expected, f"mismatch on {json.dumps(record, ensure_ascii=False)[:300]}"
        assert len(got["input_ids"]) == len(got["assistant_masks"])
        # The fast renderer's text and spans are transformers' own, character for character (masks alone
        # would hide an off-by-one: a token overlapping a span by one character is trained either way).
        messages, tools, kwargs = render.record_inputs(record)
        tracked = jinja.tracked_render(
            tokenizer.get_chat_template(None, tools),
            messages,
            tools,
            {**tokenizer.special_tokens_map, **kwargs},
        )
        assert encoder.render(record) == tracked
    return len(accepted)


def converted(path: Path) -> list[dict]:
    """Beam records from a raw file, through the readers and converters (rejected records are left out).
    Turns without reasoning are kept, so records without any stay in (`test_identical_on_real_samples` masks
    turns itself)."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    # calls to tools a record does not declare (ollama's, SWE-agent's) render all the same: kept here
    keep = Options(missing_reasoning="keep", tool_call_checks="keep")
    return [rec for rec, _, _ in (convert_item(item, "auto", keep) for item in read_items([str(path)])) if rec]


# ---------- the fast path on the bundled tokenizer ----------


def test_bundled_tokenizer_takes_the_fast_path(tok):
    encoder = MaskedEncoder(tok)
    assert encoder.fast, encoder.fallback_reason
    # Every marker is one added token the splitter knows.
    assert set(MARKERS) <= set(encoder._marker_ids)


def test_spec_example_mask(tok):
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "reasoning_content": "Simple arithmetic.", "content": "4"},
    ]
    out = encode_record(tok, {"messages": conversation})
    trained = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(trained) == (
        "<|channel|>analysis<|message|>Simple arithmetic.<|end|><|start|>assistant<|channel|>final"
        "<|message|>4<|return|>"
    )
    assert out == reference_encode(tok, {"messages": conversation})


@pytest.mark.parametrize("name", ["openai.jsonl", "sharegpt.json", "harmony.jsonl"])
def test_identical_on_bundled_samples(tok, name):
    records = converted(SAMPLES / name)
    assert records, f"no sample of {name} converted"
    assert assert_identical(tok, records) == len(records)


REAL_FILES = [
    "openai/llamafactory_v1_reason_tool_use_demo_50.jsonl",
    "openai/ollama_tools_messages.json",
    "openai/swe_agent_function_calling_simple.traj",
    "openai/openai_cookbook_toy_chat_fine_tuning.jsonl",
    "sharegpt/llamafactory_glaive_toolcall_zh_demo.json",
    "harmony/openai_harmony_format_md_examples.jsonl",
]


@pytest.mark.parametrize("name", REAL_FILES)
def test_identical_on_real_samples(tok, name):
    path = REALDATA / name
    if not path.exists():
        pytest.fail(f"missing fixture {path}: copy it byte-for-byte from ../shared/realdata/")
    records = converted(path)
    assert records, f"nothing in {name} converted"
    # The same records with every other assistant turn given weight 0 (context, outside the generation block).
    weighted = copy.deepcopy(records)
    for record in weighted:
        turns = [m for m in record["messages"] if m["role"] == "assistant"]
        for turn in turns[::2]:
            turn["weight"] = 0
    assert_identical(tok, records + weighted)


# ---------- generated conversations ----------

_alphabet = st.characters(codec="utf-8", exclude_categories=("Cs",))
_fragments = st.sampled_from(
    [
        "\n",
        "\n\n",
        " ",
        "  ",
        "\t",
        "\r\n",
        "{",
        "}",
        '"',
        "<",
        ">",
        "</",
        "def f(x):\n    return x\n",
        "<|",
        "|>",
        "<|start",
        "start|>",
        "<|end |>",
        "<|channel|",
        "|message|>",
        "<|pad|>",
        "to=",
        "analysis",
        "é",
        "日本語",
        "🙂",
        "▁",
        "\u200b",
        "\\n",
        "```py\nprint(1)\n```",
    ]
)
_markers = st.sampled_from(MARKERS)
text = st.lists(st.one_of(st.text(_alphabet, max_size=10), _fragments), max_size=7).map("".join)
# Real markers inside text are what validation rejects, but the template renders them and both paths
# must still agree token for token.
text_with_markers = st.lists(st.one_of(text, _markers), max_size=4).map("".join)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
arg_values = st.one_of(
    text.filter(lambda s: "</rfl:parameter>" not in s),
    st.integers(-1000, 1000),
    st.booleans(),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(names, st.integers(0, 9), max_size=2),
)


@st.composite
def assistant_turn(draw, tool_names):
    message = {"role": "assistant"}
    if draw(st.booleans()):
        message[draw(st.sampled_from(["reasoning_content", "thinking", "reasoning"]))] = draw(text)
    calls = []
    if tool_names and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):  # one call or parallel calls
            call = {
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(tool_names)),
                    "arguments": draw(st.dictionaries(names, arg_values, max_size=3)),
                },
            }
            if draw(st.booleans()):
                call["id"] = f"call_{len(calls)}"
            calls.append(call)
        message["tool_calls"] = calls
    if not calls or draw(st.booleans()):
        message["content"] = draw(text_with_markers)
    return message, calls


@st.composite
def conversations(draw):
    tool_names = draw(st.lists(names, max_size=3, unique=True))
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": draw(text),
                "parameters": {
                    "type": "object",
                    "properties": {
                        p: {"type": draw(st.sampled_from(["string", "integer", "boolean"]))}
                        for p in draw(st.lists(names, max_size=2, unique=True))
                    },
                },
            },
        }
        for n in tool_names
    ]
    messages = []
    for role in draw(st.lists(st.sampled_from(["system", "developer"]), max_size=2)):
        messages.append({"role": role, "content": draw(text_with_markers)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text_with_markers)})
        turn, calls = draw(assistant_turn(tool_names))
        messages.append(turn)
        for call in calls:
            messages.append({"role": "tool", "name": call["function"]["name"], "content": draw(text)})
        if calls:
            final, _ = draw(assistant_turn([]))
            messages.append(final)
    record = {"messages": messages}
    if tools:
        record["tools"] = tools
    if draw(st.booleans()):
        record["chat_template_kwargs"] = {
            "reasoning_effort": draw(st.sampled_from(["low", "max", 100, None])),
            "model_identity": draw(st.one_of(st.none(), text)),
        }
    return record


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(conversations(), min_size=1, max_size=4))
def test_identical_on_generated_conversations(tok, encoder, records):
    assert_identical(tok, records, encoder=encoder)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=conversations(), max_length=st.integers(1, 200), side=st.sampled_from(["right", "left"]))
def test_truncation_is_identical(tok, record, max_length, side):
    old = tok.truncation_side
    tok.truncation_side = side
    try:
        try:
            expected = reference_encode(tok, record, max_length=max_length)
        except RecordError:  # text can join fragments into a marker inside reasoning, which the template rejects
            with pytest.raises(RecordError):
                encode_record(tok, record, max_length=max_length)
            return
        out = encode_record(tok, record, max_length=max_length)
        assert out == expected
        assert len(out["input_ids"]) <= max_length
    finally:
        tok.truncation_side = old


def test_small_cache_stays_bounded_and_correct(tok):
    records = converted(SAMPLES / "openai.jsonl")
    encoder = MaskedEncoder(tok, cache_size=5)
    assert_identical(tok, records, encoder=encoder)
    assert len(encoder._cache) <= 5 and len(encoder._first_cache) <= 5
    # Encoding again with a warm cache gives the same answer.
    assert encoder.encode(records) == MaskedEncoder(tok).encode(records)


# ---------- templates whose spans do not sit on markers ----------

INNER_SPAN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|start|>' ~ m['role'] ~ '<|message|>' -}}"
    "{%- if m['role'] == 'assistant' -%}{{- ' pre ' -}}{%- generation -%}{{- m['content'] ~ '  ' -}}"
    "{%- endgeneration -%}{{- ' post' -}}{%- else -%}{{- m['content'] -}}{%- endif -%}"
    "{{- '<|end|>' -}}{%- endfor -%}"
)
NESTED_SPAN_TEMPLATE = (
    "{%- for m in messages -%}{{- '<|start|>' ~ m['role'] ~ '<|message|>' -}}"
    "{%- generation -%}{{- 'a ' -}}{%- generation -%}{{- m['content'] -}}{%- endgeneration -%}"
    "{%- endgeneration -%}"
    "{{- '<|end|>' -}}{%- endfor -%}"
)


@pytest.fixture
def tok_with_template(tok):
    old = tok.chat_template

    def use(template):
        tok.chat_template = template
        return tok

    yield use
    tok.chat_template = old


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(contents=st.lists(text, min_size=2, max_size=6))
def test_spans_inside_text_use_the_reference_overlap_rule(tok_with_template, encoder, contents):
    tokenizer = tok_with_template(INNER_SPAN_TEMPLATE)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    assert_identical(tokenizer, [{"messages": messages}], encoder=encoder)


def test_beam_template_uses_the_fast_renderer(tok, encoder):
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    encoder.encode([record])
    # The bundled template is rendered by plain Python (beam_sft.render.direct); the compiled-template
    # renderer stays ready for the records it declines.
    assert render._DIRECT_RENDERERS[tok.chat_template] is not None
    assert jinja.SentinelRenderer.build(tok.chat_template) is not None


def test_noncharacters_in_text_render_the_tracked_way(tok, encoder):
    # The fast renderer marks spans with U+FDD0/U+FDD1; a record that contains them itself must not
    # confuse it.
    record = {
        "messages": [
            {"role": "user", "content": "a \ufdd0 b \ufdd1 c"},
            {"role": "assistant", "reasoning_content": "\ufdd1 think \ufdd0", "content": "x\ufdd0y"},
        ]
    }
    renderer = jinja.sentinel_renderer(tok.chat_template)
    messages, tools, kwargs = render.record_inputs(record)
    assert renderer(messages, tools, {**tok.special_tokens_map, **kwargs}) is None
    assert_identical(tok, [record], encoder=encoder)


def test_nested_spans_fall_back_per_record(tok_with_template):
    tokenizer = tok_with_template(NESTED_SPAN_TEMPLATE)
    record = {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "yo"}]}
    encoder = MaskedEncoder(tokenizer)
    assert jinja.SentinelRenderer.build(NESTED_SPAN_TEMPLATE) is None  # not at the top level
    _, spans = encoder.render(record)
    assert not render._sorted_disjoint(spans)
    assert encoder.encode([record]) == [reference_encode(tokenizer, record)]


# ---------- the fallback: tokenizers where cutting at markers is not exact ----------


def _tiny_tokenizer(tmp_path, *, pre_tokenizer, normalizer=None, lstrip=False, normalized=False):
    """A small BPE tokenizer with the Beam markers as added tokens, built from scratch."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from beam_sft.template import chat_template

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.decoder = decoders.Metaspace()
    corpus = [(SAMPLES / "openai.jsonl").read_text(encoding="utf-8")] * 2
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
    backend.add_tokens([AddedToken(m, normalized=normalized, lstrip=lstrip) for m in MARKERS[:-1]])
    backend.add_special_tokens([AddedToken(MARKERS[-1], normalized=False)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=MARKERS[-1], unk_token="<unk>")
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path)


@pytest.fixture
def metaspace_first(tmp_path):
    from tokenizers import pre_tokenizers

    # SentencePiece-style: "▁" is added at the start of the whole text only (prepend_scheme="first"),
    # so a piece after a marker tokenizes differently on its own than inside the text.
    return _tiny_tokenizer(tmp_path, pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="first"))


def test_start_of_text_sensitive_tokenizer_stays_exact(metaspace_first):
    tokenizer = metaspace_first
    # The naive cut (each piece on its own) really is wrong for this tokenizer ...
    text = "<|start|>user<|message|>Hello there<|end|>"
    whole = tokenizer._tokenizer.encode(text, add_special_tokens=False).ids
    naive = []
    for piece in ["<|start|>", "user", "<|message|>", "Hello there", "<|end|>"]:
        naive += tokenizer._tokenizer.encode(piece, add_special_tokens=False).ids
    assert naive != whole
    # ... so pieces after a marker are tokenized after a marker, and the fast path stays exact.
    encoder = MaskedEncoder(tokenizer)
    assert encoder.fast, encoder.fallback_reason
    records = converted(SAMPLES / "openai.jsonl")
    assert_identical(tokenizer, records, encoder=encoder)
    assert_identical(tokenizer, records, encoder=encoder, max_length=20)


def test_the_probe_catches_an_inexact_cut(metaspace_first, monkeypatch):
    # Take the context away (pieces tokenized on their own): the probe must see the difference and
    # send every record through apply_chat_template, which stays identical to the reference.
    def naive(self, pieces, after_marker, backend=None):
        return [e.ids for e in (backend or self._backend).encode_batch(pieces, add_special_tokens=False)]

    monkeypatch.setattr(MaskedEncoder, "_encode_pieces", naive)
    encoder = MaskedEncoder(metaspace_first)
    assert not encoder.fast
    assert "changes token ids" in encoder.fallback_reason
    records = converted(SAMPLES / "openai.jsonl")
    assert_identical(metaspace_first, records, encoder=encoder)
    assert_identical(metaspace_first, records, encoder=encoder, max_length=20)


def test_metaspace_prepend_always_keeps_the_fast_path(tmp_path):
    from tokenizers import pre_tokenizers

    tokenizer = _tiny_tokenizer(tmp_path, pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="always"))
    encoder = MaskedEncoder(tokenizer)
    assert encoder.fast, encoder.fallback_reason
    assert_identical(tokenizer, converted(SAMPLES / "openai.jsonl"), encoder=encoder)


def test_stripping_added_tokens_fall_back(tmp_path):
    from tokenizers import pre_tokenizers

    tokenizer = _tiny_tokenizer(
        tmp_path, pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="always"), lstrip=True
    )
    encoder = MaskedEncoder(tokenizer)
    assert not encoder.fast and "strips spaces" in encoder.fallback_reason
    assert_identical(tokenizer, converted(SAMPLES / "openai.jsonl"), encoder=encoder)


def test_normalized_added_tokens_fall_back(tmp_path):
    from tokenizers import normalizers, pre_tokenizers

    tokenizer = _tiny_tokenizer(
        tmp_path, pre_tokenizer=pre_tokenizers.Metaspace(), normalizer=normalizers.NFKC(), normalized=True
    )
    encoder = MaskedEncoder(tokenizer)
    assert not encoder.fast and "after normalization" in encoder.fallback_reason
    assert_identical(tokenizer, converted(SAMPLES / "openai.jsonl"), encoder=encoder)


@pytest.mark.parametrize("family", ["gpt2_like", "sentencepiece_like", "llama_like", "gpt_oss_like"])
def test_beamified_tokenizer_families(family):
    # Other tokenizer families, made Beam-ready by beamify: the fast path and identity on real data.
    import tokenizer_factories

    from beam_sft.model.beamify import beamify

    tokenizer = getattr(tokenizer_factories, family)()
    beamify(tokenizer)
    encoder = MaskedEncoder(tokenizer)
    assert encoder.fast, encoder.fallback_reason
    records = converted(SAMPLES / "sharegpt.json") + converted(
        REALDATA / "openai" / "ollama_tools_messages.json"
    )
    assert_identical(tokenizer, records, encoder=encoder)


# ---------- record handling and errors ----------


def test_tools_as_json_string_and_none_kwargs(tok):
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "name": "get_weather", "content": "18 C"},
        {"role": "assistant", "reasoning_content": "Answer.", "content": "18 C."},
    ]
    plain = {"messages": messages, "tools": [tool], "chat_template_kwargs": {"reasoning_effort": "low"}}
    stringly = {
        "messages": messages,
        "tools": json.dumps([tool]),
        "chat_template_kwargs": {"reasoning_effort": "low", "model_identity": None},
    }
    expected = tok.apply_chat_template(
        messages,
        tools=[tool],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        reasoning_effort="low",
    )
    for record in (plain, stringly):
        out = encode_record(tok, record)
        assert out == {"input_ids": expected["input_ids"], "assistant_masks": expected["assistant_masks"]}


def test_template_errors_become_record_errors_with_position(tok):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    bad = {
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
        ]
    }
    with pytest.raises(RecordError) as caught:
        MaskedEncoder(tok).encode([good, good, bad])
    assert caught.value.code is Reason.RENDER_FAILED
    assert caught.value.message_index == 1
    assert caught.value.line == 2
    assert "string arguments" in caught.value.message
    with pytest.raises(RecordError) as caught:
        encode_record(tok, {"messages": []})
    assert caught.value.code is Reason.EMPTY_CONVERSATION


# ---------- the datasets wrapper ----------


@pytest.fixture(scope="module")
def sample_records():
    return converted(SAMPLES / "openai.jsonl") + converted(SAMPLES / "sharegpt.json")


def _rows(records):
    """Converted rows of the data pipeline (`beam_sft.dataset.pipeline`): records as JSON text, with provenance."""
    n = len(records)
    return {"src": [0] * n, "pos": list(range(1, n + 1)), "by_line": [True] * n,
            "record": [json.dumps(r, ensure_ascii=False) for r in records]}


def test_the_pipeline_tokenizes_as_the_reference_does(tok, sample_records):
    """`tokenize_batch`, what every data driver runs: the reference's ids and masks, row for row; cut at
    max_length by keep_start, the reference's truncated ids and masks."""
    from beam_sft.dataset.pipeline import Job, tokenize_batch

    out = tokenize_batch(_rows(sample_records), Job(tok, "beam", None, "turn", True, []), ["s.jsonl"])
    expected = [reference_encode(tok, r) for r in sample_records]
    assert [{"input_ids": i, "assistant_masks": m} for i, m in zip(out["input_ids"], out["mask"], strict=True)] \
        == expected
    assert all(out["keep"]) and out["reason"] == [None] * len(sample_records)
    cut = tokenize_batch(_rows(sample_records), Job(tok, "beam", 64, "keep_start", True, []), ["s.jsonl"])
    expected = [reference_encode(tok, r, max_length=64) for r in sample_records]
    assert [{"input_ids": i, "assistant_masks": m} for i, m in zip(cut["input_ids"], cut["mask"], strict=True)] \
        == expected


def test_the_pipeline_names_the_bad_row(tok, sample_records):
    """A record the template rejects is a reject naming its source and line, and the others go on."""
    from beam_sft.dataset.pipeline import Job, tokenize_batch

    bad = {
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        ]
    }
    out = tokenize_batch(_rows([*sample_records[:5], bad]), Job(tok, "beam", None, "turn", True, []), ["s.jsonl"])
    assert out["reason"][:5] == [None] * 5 and out["reason"][5] is not None
    entry = json.loads(out["reject"][5])
    assert (entry["source"], entry["line"]) == ("s.jsonl", 6)
