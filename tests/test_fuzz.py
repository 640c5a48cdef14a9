"""Hostile input: no JSON value whatsoever makes a converter raise anything but `RecordError`.

Property-based (hypothesis). Inputs are (1) arbitrary JSON from a recursive strategy whose keys and strings
lean towards the ones the converters look at (roles, part types, Harmony fields, markers, call tags), and
(2) mutations of the real records in tests/data/ and the bundled samples: a key dropped, a value swapped
for another JSON type, Harmony markers or call tags injected into a string, messages duplicated or removed.
Every input goes through every converter of the `FORMATS` registry (so converters other branches add are
fuzzed too) and `auto`, and must either be rejected with a `RecordError` or come out as a record that
validates again unchanged, serializes, and renders with the Beam template. The CLI on a file of such records
must finish with exit status 0 and records in = out + rejected.

The default profile is deterministic (derandomized, no example database) and sized for CI (about a minute
on 2 cores); ``BEAM_SFT_FUZZ=long`` runs many more examples with fresh randomness for a local soak::

    BEAM_SFT_FUZZ=long python -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.harmony import parse_text
from beam_sft.formats.typescript import TypeScriptError, parse_namespaces
from beam_sft.records.files import normalize_record
from beam_sft.records.messages import HARMONY_MARKERS
from beam_sft.validate.convert import FORMATS, convert, detect
from beam_sft.validate.rules import Options, make_render_check, validate

ROOT = Path(__file__).resolve().parents[1]
DATA = [ROOT / "tests" / "data" / "realdata", ROOT / "data" / "samples"]
RENDER = make_render_check()
CONVERTERS = [*FORMATS, "auto"]

_LONG = os.environ.get("BEAM_SFT_FUZZ") == "long"
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def fuzz_settings(ci: int, long: int):
    """`ci` examples, derandomized (CI must not be flaky); `long` fresh random ones under BEAM_SFT_FUZZ=long."""
    if _LONG:
        return settings(max_examples=long, deadline=None, suppress_health_check=_HEALTH, database=None)
    return settings(max_examples=ci, deadline=None, suppress_health_check=_HEALTH, derandomize=True,
                    database=None, print_blob=True)


# --- strategies ----------------------------------------------------------------------------------------------

KEYS = ["messages", "conversations", "history", "role", "content", "from", "value", "text", "type", "tool_calls",
        "function", "name", "arguments", "parameters", "id", "tool_call_id", "tool_call_ids", "reasoning_content",
        "reasoning", "thinking", "channel", "recipient", "content_type", "tools", "functions", "function_call",
        "chat_template_kwargs", "reasoning_effort", "model_identity", "system", "label", "images", "chosen",
        "instructions", "description", "properties", "required", "system_content", "developer_content"]
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<thinking>", "<tool_response>", "<function=f>",
        "</function>", "<parameter=a>", "</rfl:parameter>", "<|endoftext|>", "<|reserved_200017|>",
        "<|constrain|>json", " to=functions.f", "<|channel|>analysis"]
WORDS = ["user", "assistant", "system", "developer", "tool", "function", "human", "gpt", "observation",
         "function_call", "tool_calls", "text", "input_text", "reasoning", "tool_call", "tools", "image_url",
         "system_content", "developer_content", "analysis", "final", "commentary", "functions.f", "python",
         "browser.search", "f", "low", "high", "max", "", " ", "{}", '{"a": 1}', "[]", "[1, 2]", '"x"', "null",
         "<think>r</think>a", "# Tools\n\n## functions\n\nnamespace functions {\ntype f = () => any;\n}",
         "Reasoning: high", "# Instructions\n\nbe brief"]
MARKUP = [*HARMONY_MARKERS, *TAGS]

text = st.one_of(st.sampled_from(WORDS), st.sampled_from(MARKUP), st.text(max_size=12),
                 st.lists(st.sampled_from(WORDS + MARKUP), max_size=6).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), text)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=6)), max_leaves=30)

# Rendered Harmony, assembled from the pieces a parser cares about.
HARMONY_PIECES = [*HARMONY_MARKERS, "user", "assistant", "system", "developer", "functions.f", "to=functions.f ",
                  " to=assistant", "analysis", "final", "commentary", " ", "\n", "json", "{}", '{"a": 1}', "hi",
                  "# Tools\n\n## functions\n\n", "namespace functions {\n", "type f = (_: {a: string}) => any;\n",
                  "} // namespace functions", "Reasoning: high\n", "# Instructions\n\n", "## python\n\n", "code"]
harmony_texts = st.lists(st.sampled_from(HARMONY_PIECES), max_size=30).map("".join)
TS_PIECES = ["namespace", "functions", "type", "f", "=", "(", ")", "_", ":", "{", "}", "=>", "any", ";", ",", "|",
             "?", "[", "]", "<", ">", "Array", "string", "number", "null", '"a"', "1", "// c\n", "// default: 1\n",
             "\n", " ", "a"]
ts_texts = st.lists(st.sampled_from(TS_PIECES), max_size=40).map(" ".join)


def _load_records() -> list:
    """Every record of the real data and the samples (records over 32 KB are skipped to keep CI fast)."""
    out = []
    for base in DATA:
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.suffix == ".md":
                continue
            raw = path.read_bytes()
            if path.suffix == ".txt":
                recs = [{"text": raw.decode("utf-8")}]
            elif path.suffix in (".jsonl", ".ndjson"):
                recs = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
            else:
                doc = orjson.loads(raw)
                recs = doc if isinstance(doc, list) and doc and "role" not in doc[0] else [doc]
            out.extend(r for r in recs if len(orjson.dumps(r)) <= 32_000)
    return out


RECORDS = _load_records()


def _slots(value, out: list) -> list:
    """Every (container, key) in a JSON value, depth first."""
    if type(value) is dict:
        for k, v in value.items():
            out.append((value, k))
            _slots(v, out)
    elif type(value) is list:
        for i, v in enumerate(value):
            out.append((value, i))
            _slots(v, out)
    return out


OTHER_TYPES = st.one_of(st.sampled_from([None, True, False, 0, -1, 7, 2**63, 1.5, "", "x", [], {}, [[]], [{}],
                                         {"type": ["text"]}, [1, "a"]]), json_values)


@st.composite
def mutated_records(draw):
    rec = copy.deepcopy(draw(st.sampled_from(RECORDS)))
    for _ in range(draw(st.integers(1, 4))):
        slots = _slots(rec, [])
        if not slots:
            break
        container, key = draw(st.sampled_from(slots))
        value = container[key]
        op = draw(st.sampled_from(["drop", "swap", "swap", "wrap", "inject", "duplicate", "empty"]))
        if op == "drop":
            del container[key]
        elif op == "swap":
            container[key] = copy.deepcopy(draw(OTHER_TYPES))  # sampled values must stay pristine
        elif op == "wrap":
            container[key] = copy.deepcopy(draw(st.sampled_from([[value], {"type": value}, {"value": value},
                                                                [value, value]])))
        elif op == "inject":
            mark = draw(st.sampled_from(MARKUP))
            if isinstance(value, str):
                at = draw(st.integers(0, len(value)))
                container[key] = value[:at] + mark + value[at:]
            else:
                container[key] = mark
        elif op == "duplicate" and type(container) is list:
            container.insert(key, copy.deepcopy(value))
        elif op == "empty":
            container[key] = type(value)() if type(value) in (list, dict, str) else None
    return rec


# Records shaped like each format, every field either plausible or (one time in eight) any other JSON value:
# this reaches the type checks deep inside a record far more often than random JSON does.


def field(plausible):
    """Plausible 7 times in 8: the fewer other fields are broken, the deeper one broken field gets."""
    return st.integers(0, 7).flatmap(lambda i: OTHER_TYPES.map(copy.deepcopy) if i == 7 else plausible)


def shaped(required=(), **fields):
    """A dict with the `required` keys always present and the others sometimes, each value from `field`."""
    return st.fixed_dictionaries({k: field(v) for k, v in fields.items() if k in required},
                                 optional={k: field(v) for k, v in fields.items() if k not in required})


def words(*ws):
    return st.sampled_from(ws)


arguments = st.one_of(words("{}", '{"a": 1}', '{"a": "<|end|>"}', "[1]", '"{}"', "", "{bad"),
                      st.dictionaries(st.sampled_from(["a", "b", 'q"', "<x>"]), json_values, max_size=3))
schema = st.fixed_dictionaries({"type": field(words("object"))}, optional={
    "properties": field(st.dictionaries(words("a", "b"), shaped(type=words("string", "number", "array"),
                                                                 description=text), max_size=2)),
    "required": field(st.lists(words("a", "b"), max_size=2))})
function = shaped(("name", "arguments"), name=words("f", "get_weather", "python", "browser.search", "bad name", ""), arguments=arguments,
                  parameters=schema, description=text)
call = shaped(("function",), id=words("c1", "c2", ""), type=words("function"), function=function, name=words("f"),
              arguments=arguments)
tool = shaped(("type", "function"), type=words("function"), function=function, name=words("f"), parameters=schema)
part = shaped(("type",), type=words("text", "input_text", "reasoning", "tool_call", "tool_calls", "tools", "image_url",
                         "system_content", "developer_content"),
              text=text, value=st.one_of(text, arguments), tools=st.lists(tool, max_size=2))
content = st.one_of(text, st.lists(part, max_size=3))
openai_message = shaped(("role", "content"), role=words("system", "developer", "user", "assistant", "tool", "function"),
                        content=content, reasoning_content=text, reasoning=text, thinking=text,
                        tool_calls=st.lists(call, max_size=3), function_call=function,
                        tool_call_id=words("c1", "c2"), name=words("f", "get_weather"))
sharegpt_turn = shaped(("from", "value"), **{"from": words("human", "gpt", "system", "function_call", "observation", "tool", "bot"),
                          "value": st.one_of(text, arguments), "role": words("user", "assistant"),
                          "content": content, "reasoning_content": text, "name": words("f")})
namespace = shaped(("tools",), name=words("functions", "browser", "python"), description=text,
                   tools=st.lists(shaped(name=words("f", "search"), description=text, parameters=schema),
                                  max_size=2))
harmony_part = shaped(("type",), type=words("text", "system_content", "developer_content"), text=text,
                      reasoning_effort=words("low", "high", "Medium", "max"),
                      model_identity=text, instructions=text,
                      tools=st.dictionaries(words("functions", "browser", "python"), namespace, max_size=2))
harmony_message = shaped(("role", "content"), role=words("system", "developer", "user", "assistant", "tool"),
                         name=words("functions.f", "browser.search", "python"),
                         content=st.one_of(text, text, st.lists(harmony_part, max_size=2)),
                         channel=words("analysis", "commentary", "final"),
                         recipient=words("functions.f", "python", "browser.search", "assistant"),
                         content_type=words("json", "<|constrain|>json", "code"))
record_fields = {"tools": st.one_of(st.lists(tool, max_size=2), arguments),
                 "chat_template_kwargs": shaped(reasoning_effort=words("low", "max", "none"), model_identity=text),
                 "reasoning_effort": words("high", "xhigh"), "system": text, "functions": st.lists(function)}
SHAPED = {
    "openai": st.builds(lambda msgs, extra: {"messages": msgs, **extra},
                        st.lists(openai_message, min_size=1, max_size=6), shaped(**record_fields)),
    "sharegpt": st.builds(lambda turns, extra: {"conversations": turns, **extra},
                          st.lists(sharegpt_turn, min_size=1, max_size=6), shaped(**record_fields)),
    "harmony": st.builds(lambda msgs: {"messages": msgs}, st.lists(harmony_message, min_size=1, max_size=6)),
}
shaped_records = st.one_of(*SHAPED.values())

any_record = st.one_of(mutated_records(), shaped_records, json_values, harmony_texts)


# --- the properties ------------------------------------------------------------------------------------------


def _accepted(beam: dict, name: str, options: Options | None = None) -> None:
    """An accepted record is a Beam record the CLI can write and the template can render."""
    assert type(beam) is dict and type(beam["messages"]) is list and beam["messages"], name
    blob = orjson.dumps(beam)
    again = validate(orjson.loads(blob), options)
    assert orjson.dumps(again) == blob, f"{name}: validating an accepted record again changed it"
    # and undoing Arrow storage changes nothing either: validated records need no second normalisation
    assert orjson.dumps(normalize_record(orjson.loads(blob))) == blob, name
    RENDER(beam)


def _clone(rec):
    """A copy for one converter (a converter must not see another's changes); values nested too deep for
    deepcopy are shared instead (converters don't modify their input)."""
    try:
        return copy.deepcopy(rec)
    except RecursionError:
        return rec


def check_record(rec) -> None:
    found = detect(rec)
    assert found is None or found in FORMATS
    for name in CONVERTERS:
        try:
            beam = convert(_clone(rec), name)[0]
        except RecordError as err:
            assert isinstance(err.code, Reason) and str(err)
            assert err.message_index is None or type(err.message_index) is int
            continue
        _accepted(beam, name)
    try:  # validate() alone, as training calls it on records that claim to be Beam records already
        validate(_clone(rec))
    except RecordError:
        pass


@fuzz_settings(ci=1000, long=50_000)
@given(mutated_records())
def test_mutated_real_records(rec):
    check_record(rec)


@pytest.mark.parametrize("shape", SHAPED)
@fuzz_settings(ci=400, long=20_000)
@given(data=st.data())
def test_records_shaped_like_each_format(shape, data):
    check_record(data.draw(SHAPED[shape]))


@fuzz_settings(ci=500, long=30_000)
@given(json_values)
def test_arbitrary_json(rec):
    check_record(rec)
    check_record({"messages": rec})
    check_record({"messages": [{"role": "user", "content": "q"}, rec]})


@fuzz_settings(ci=400, long=20_000)
@given(harmony_texts)
def test_rendered_harmony_text(text):
    try:
        parse_text(text)
    except RecordError:
        pass
    check_record(text)
    check_record({"text": text})


@fuzz_settings(ci=400, long=20_000)
@given(ts_texts)
def test_typescript_tool_declarations(src):
    try:
        tools = parse_namespaces(src)
    except TypeScriptError:
        return
    assert type(tools) is list
    orjson.dumps(tools)


# --- tool-calling data: no call syntax survives as text --------------------------------------------------------
#
# Rows built the way Hermes, Qwen, glaive, xLAM and data-genie data is: the real prompt templates of
# tests/data/tool_prompts/ (the dataset's own instructions around them), tagged or JSON calls, results in tool or
# user turns. Every such row must convert, and nothing in what comes out may still hold the other syntax's tags.

PROMPTS = ROOT / "tests" / "data" / "tool_prompts"
FOREIGN_TAGS = ("<tool_call>", "<tools>", "<functioncall>", "<tool_response>")
_FUZZ_TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} for a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
    for n in ("get_weather", "get_time")]
_README_TOOLS = ("[{'type': 'function', 'function': {'name': 'get_stock_fundamentals', 'description': 'Get fundamental "
                 "data for a given stock symbol using yfinance API.', 'parameters': {'type': 'object', 'properties': "
                 "{'symbol': {'type': 'string'}}, 'required': ['symbol']}}}]")


def _tool_prompt(name: str, tools: list) -> str:
    """A system prompt template with `tools` declared in it, as the dataset writes them."""
    text = (PROMPTS / name).read_text(encoding="utf-8")
    if name.startswith("hermes"):
        return text.replace(_README_TOOLS, repr(tools))
    return text  # the Qwen renders already declare _FUZZ_TOOLS


plain = st.text(alphabet="abcdefghij KLMNOP.,!?-0123456789", min_size=1, max_size=30).map(lambda t: t.strip() or "ok")
own_instructions = st.lists(plain, max_size=3).map(" ".join)


@st.composite
def tool_rows(draw):
    template = draw(st.sampled_from(["hermes2pro_function_calling.txt", "hermes3_tool_use.txt", "qwen2_5_rendered.txt",
                                     "qwen2_5_rendered_no_system.txt", "qwen3_rendered_no_system.txt", "few_shot",
                                     "glaive", "xlam"]))
    before, after = draw(own_instructions), draw(own_instructions)
    n = draw(st.integers(1, 3))
    calls = [{"name": draw(st.sampled_from(["get_weather", "get_time"])),
              "arguments": draw(st.fixed_dictionaries({"city": plain}, optional={"days": st.integers(0, 9)}))}
             for _ in range(n)]
    results = [draw(plain) for _ in range(n)]
    if template == "xlam":  # no prompt of its own: the row trains the calls
        return {"query": draw(plain), "tools": json.dumps([t["function"] for t in _FUZZ_TOOLS]),
                "answers": json.dumps(calls)}
    if template == "glaive":
        funcs = "\n".join(json.dumps(t["function"], indent=4) for t in _FUZZ_TOOLS)
        chat = f"USER: {draw(plain)}\n\n\nASSISTANT: <functioncall> " + json.dumps(
            {"name": calls[0]["name"], "arguments": json.dumps(calls[0]["arguments"])}) + " <|endoftext|>\n\n\n" \
            f"FUNCTION RESPONSE: {results[0]}\n\n\nASSISTANT: {draw(plain)} <|endoftext|>"
        return {"system": f"SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
                          f"required - {before}\n{funcs}\n", "chat": chat}
    if template == "few_shot":
        prompt = f"You are a helpful assistant who has access to functions. Use them if required\n<tools>" \
                 f"{json.dumps([t['function'] for t in _FUZZ_TOOLS], indent=1)}\n\n</tools>"
    else:
        prompt = _tool_prompt(template, _FUZZ_TOOLS)
    system = "\n\n".join(p for p in (before, prompt, after) if p)
    style = draw(st.sampled_from(["json", "python", "data-genie"]))
    if style == "data-genie":
        said = json.dumps([{"id": f"call_{k}", "function": {**c, "type": "function"}} for k, c in enumerate(calls)])
        answers = [("tool", json.dumps({"tool_call_id": f"call_{k}", "name": c["name"], "content": {"r": r}}))
                   for k, (c, r) in enumerate(zip(calls, results))]
    else:
        dump = json.dumps if style == "json" else repr
        said = draw(st.sampled_from(["", "Let me check.\n"])) + "\n".join(
            f"<tool_call>\n{dump(c)}\n</tool_call>" for c in calls)
        blocks = [f"<tool_response>\n{dump({'name': c['name'], 'content': r})}\n</tool_response>"
                  for c, r in zip(calls, results)]
        answers = [("tool", b) for b in blocks] if draw(st.booleans()) else [("user", "\n".join(blocks))]
    turns = [("system", system), ("user", draw(plain)), ("assistant", said), *answers, ("assistant", draw(plain))]
    if draw(st.booleans()):
        names = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}
        return {"conversations": [{"from": names[r], "value": t} for r, t in turns]}
    return {"messages": [{"role": r, "content": t} for r, t in turns]}


def _strings(value) -> list[str]:
    if type(value) is str:
        return [value]
    if type(value) is dict:
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if type(value) is list:
        return [s for v in value for s in _strings(v)]
    return []


@fuzz_settings(ci=300, long=20_000)
@given(tool_rows(), st.sampled_from(["auto", "hermes", "native"]))
def test_tool_rows_convert_without_foreign_call_syntax_in_any_text(rec, fmt):
    own = "glaive" if "chat" in rec else "xlam" if "query" in rec else None
    if fmt == "native":
        fmt = own or ("sharegpt" if "conversations" in rec else "openai")
    elif fmt == "hermes" and own:
        fmt = own
    # the generated rows have no reasoning: kept here (the default `mask` has its own tests)
    keep = Options(missing_reasoning="keep")
    beam = convert(copy.deepcopy(rec), fmt, keep)[0]
    _accepted(beam, fmt, keep)
    left = [(t, tag) for t in _strings(beam) for tag in FOREIGN_TAGS if tag in t]
    assert not left, left
    assert any(m.get("tool_calls") for m in beam["messages"]) and beam["tools"]


# --- the known shapes, so a regression is caught without relying on the search ------------------------------

KNOWN = {
    "openai role is a list": {"messages": [{"role": ["user"], "content": "hi"},
                                           {"role": "assistant", "content": "x"}]},
    "openai role is an object": {"messages": [{"role": {"a": 1}, "content": "hi"}]},
    "content part type is a list": {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]},
                                                 {"role": "assistant", "content": "x"}]},
    "content part type is an object": {"messages": [{"role": "system", "content": [{"type": {}, "text": "s"}]},
                                                    {"role": "assistant", "content": "x"}]},
    "harmony recipient is a number": {"messages": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "channel": "commentary", "recipient": 5,
                                                    "content": [{"type": "text", "text": "{}"}]}]},
}


@pytest.mark.parametrize("name", KNOWN)
def test_known_crashes_are_rejections(name):
    check_record(KNOWN[name])


def _nest(depth: int, leaf="x"):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [20, 120, 254, 300, 900])
def test_deep_nesting_anywhere(depth):
    deep = _nest(depth)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": deep}}}
    records = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning_content": "r",
                                                         "tool_calls": [call]}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                 "properties": {"a": deep}}}}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         "chat_template_kwargs": {"x": deep}},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "reasoning_content": "r",
                                                         "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "c", "content": deep}, {"role": "assistant", "content": "a"}]},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": json.dumps(
            {"name": "f", "arguments": {"a": deep}}) if depth < 500 else "{}"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": deep}]},
    ]
    for rec in records:
        check_record(rec)
    src = "namespace functions {\ntype f = (_: {a: " + "(" * depth + "string" + ")" * depth + "}) => any;\n}"
    with pytest.raises(TypeScriptError) if depth > 100 else _no_error():
        parse_namespaces(src)
    check_record({"text": "<|start|>developer<|message|># Tools\n\n## functions\n\n" + src + "<|end|>"
                  "<|start|>user<|message|>q<|end|><|start|>assistant<|channel|>final<|message|>a<|return|>"})


class _no_error:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_huge_and_empty_containers():
    n = 20_000
    many = [{"role": "user", "content": "q"}, *([{"role": "assistant", "content": "a"}] * n)]
    for rec in ({"messages": many}, {"messages": []}, {"messages": [{}] * n}, {"messages": [[]] * n},
                {"conversations": [{"from": "human", "value": "q" * 1_000_000}, {"from": "gpt", "value": "a"}]},
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * n},
                              {"role": "assistant", "content": "a"}]},
                {}, [], "", {"messages": {}}, {"conversations": {}}):
        for name in CONVERTERS:
            try:
                convert(copy.deepcopy(rec), name)
            except RecordError:
                pass


# --- the CLI -------------------------------------------------------------------------------------------------


@fuzz_settings(ci=6, long=200)
@given(st.lists(any_record, min_size=5, max_size=40), st.sampled_from([1, 2]), st.sampled_from(["jsonl", "parquet"]))
def test_cli_on_a_file_of_hostile_records(tmp_path_factory, records, num_proc, kind):
    from beam_sft.cli.convert import main

    tmp = tmp_path_factory.mktemp("fuzz")
    src, out, rej, stats = tmp / "in.jsonl", tmp / f"out.{kind}", tmp / "rej.jsonl", tmp / "stats.json"
    with open(src, "wb") as f:
        f.writelines(orjson.dumps(r) + b"\n" for r in records)
        f.write(b"{not json\n")
    code = main([str(src), "-o", str(out), "--rejects", str(rej), "--stats", str(stats), "-q",
                 "--dataset_num_proc", str(num_proc), "--max_reject_share", "1"])
    st_ = json.loads(stats.read_text())
    rejects = [orjson.loads(line) for line in rej.read_bytes().splitlines()]
    # exit 2 only when every record was rejected (a run that writes nothing), never 3 (an internal error)
    assert code == (0 if st_["records_out"] else 2), [r for r in rejects if r["reason"] == "internal_error"]
    if kind == "parquet":
        import pyarrow.parquet as pq

        n_out = pq.read_metadata(out).num_rows
    else:
        n_out = len(out.read_bytes().splitlines())
        for line in out.read_bytes().splitlines():
            RENDER(orjson.loads(line))
    assert st_["records_in"] == len(records) + 1 == n_out + len(rejects)
    assert st_["records_out"] == n_out and st_["rejected_total"] == len(rejects)


def test_cli_deep_record_in_a_json_file_with_a_size_limit(tmp_path, capsys):
    """Measuring a record for --max-record-bytes must not trip over nesting orjson can't write (it used to
    stop the run); the converter rejects the record with its reason."""
    from beam_sft.cli.convert import main

    deep = _nest(300)
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    recs = [{"messages": turns, "chat_template_kwargs": {"x": deep}}, {"messages": turns}]
    src, out, rej = tmp_path / "in.json", tmp_path / "o.jsonl", tmp_path / "rej.jsonl"
    src.write_text(json.dumps(recs))
    assert main([str(src), "-o", str(out), "--rejects", str(rej), "--max-record-bytes", "100000", "-q"]) == 0
    assert [r["reason"] for r in map(orjson.loads, rej.read_bytes().splitlines())] == ["bad_template_kwargs"]
    assert len(out.read_bytes().splitlines()) == 1
    capsys.readouterr()
