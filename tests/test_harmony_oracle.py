"""openai-harmony as an oracle, on the real o200k vocabulary.

1. Random gpt-oss conversations (seeded): reasoning effort, instructions, function tools with varied schemas,
   analysis, preambles, sequential and parallel calls with `<|constrain|>json`, tool results, finals, several
   turns. openai-harmony renders each as text (`render_conversation`, then decoded) and as
   `Conversation.to_json()`; our Harmony converter must read both back into exactly the conversation that
   was generated. The differences are openai-harmony's rendering and expected: it drops every
   `analysis` message before the conversation's first `final` message (commentary preambles stay), and
   TypeScript has no `integer` (it reads back as `number`) nor one-value enums (a literal type: `const`).
2. Beam-rendered assistant turns, as token ids of the real vocabulary, parsed by openai-harmony's
   `parse_messages_from_completion_tokens`: reasoning and answers come back as gpt-oss `analysis` and `final`
   messages with the same text; a Beam tool call comes back as a message addressed to the bare tool name on
   the `analysis` channel with content type `<|constrain|>xml` (gpt-oss: `functions.NAME`, `commentary`,
   JSON) — where the formats differ, see docs/template.md ("openai-harmony as a test oracle").
"""

from __future__ import annotations

import copy
import json
import random

import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

from beam_sft.validate.convert import convert
from beam_sft.validate.rules import make_render_check


@pytest.fixture(autouse=True)
def _keep_turns_without_reasoning(monkeypatch):
    """The oracle checks what the Harmony converter reads back; the missing-reasoning policy (default `mask`)
    has its own tests (test_validate.py, test_reasoning_policy.py), so here turns without reasoning are kept; so
    are calls whose generated arguments do not fit their generated schema (tests/test_tool_call_checks.py)."""
    from beam_sft.validate import rules

    monkeypatch.setattr(rules, "DEFAULT_OPTIONS", rules.Options(missing_reasoning="keep", tool_call_checks="keep"))

N_CONVERSATIONS = 150
_WORDS = ("the", "weather", "in", "Oslo", "is", "cold", "café", "naïve", "東京", "数据", "Привет", "🙂", "42",
          "3.5", "x = y", "{", "}", "[1, 2]", "\"quoted\"", "it's", "can't", "tab\there", "a/b", "#", "->", "--")


@pytest.fixture(scope="module")
def harmony(o200k_dir):
    import os

    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_dir)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


# ---------- the generator ----------


def _text(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    text = " ".join(words)
    if rng.random() < 0.3:
        text += "\n" + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 5)))
    return text


def _name(rng: random.Random, prefix: str) -> str:
    return f"{prefix}_{rng.randint(0, 999)}"


def _schema(rng: random.Random, depth: int = 0) -> dict:
    kind = rng.choice(["string", "number", "integer", "boolean", "enum", "array", "object" if depth < 2 else "string"])
    if kind == "enum":
        schema = {"type": "string", "enum": rng.sample(["a", "b", "celsius", "fahrenheit", "x y"], rng.randint(1, 3))}
    elif kind == "array":
        schema = {"type": "array", "items": {"type": rng.choice(["string", "number", "boolean"])}}
    elif kind == "object":
        schema = _object(rng, depth + 1)
    else:
        schema = {"type": kind}
    if rng.random() < 0.4:
        schema["description"] = _text(rng, 1, 6).replace("\n", " ")
    if kind in ("string", "enum") and rng.random() < 0.2:
        schema["default"] = schema["enum"][0] if kind == "enum" else "dflt"
    return schema


def _object(rng: random.Random, depth: int = 0) -> dict:
    names = sorted({_name(rng, "p") for _ in range(rng.randint(1, 4))})
    properties = {n: _schema(rng, depth) for n in names}
    schema = {"type": "object", "properties": properties}
    required = [n for n in names if rng.random() < 0.5]
    if required:
        schema["required"] = required
    return schema


def _tool(rng: random.Random) -> dict:
    fn = {"name": _name(rng, "tool"), "description": _text(rng, 1, 8)}
    fn["parameters"] = _object(rng) if rng.random() < 0.85 else {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _arguments(rng: random.Random) -> dict:
    values = [lambda: _text(rng, 1, 4), lambda: rng.randint(-99, 99), lambda: rng.random() < 0.5,
              lambda: [rng.randint(0, 9) for _ in range(rng.randint(0, 3))], lambda: {"k": _text(rng, 1, 2)}]
    return {_name(rng, "arg"): rng.choice(values)() for _ in range(rng.randint(0, 3))}


def generate(rng: random.Random) -> tuple[Conversation, dict, dict[int, list[tuple[str, str]]]]:
    """A gpt-oss conversation, the Beam record it means, and each Beam assistant message's reasoning parts
    as (text, channel), by message index."""
    effort = rng.choice(["low", "medium", "high"])
    instructions = _text(rng) if rng.random() < 0.6 else None
    tools = [_tool(rng) for _ in range(rng.randint(0, 3))]
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions(instructions)
    if tools:
        developer = developer.with_function_tools([
            ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                parameters=t["function"]["parameters"] or None) for t in tools
        ])
    hmsgs = [Message.from_role_and_content(
        Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort(effort.capitalize())))]
    beam: list[dict] = []
    if instructions or tools:
        hmsgs.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    if instructions:
        beam.append({"role": "system", "content": instructions})
    parts_by_message: dict[int, list[tuple[str, str]]] = {}

    def reasoning() -> str:
        parts = parts_by_message[len(beam)] = []
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            text = _text(rng)
            # A preamble (commentary, no recipient) is reasoning in Beam, like analysis.
            channel = "commentary" if rng.random() < 0.15 else "analysis"
            parts.append((text, channel))
            hmsgs.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel))
        return "\n\n".join(text for text, _ in parts)

    for _ in range(rng.randint(1, 3)):
        user = _text(rng)
        hmsgs.append(Message.from_role_and_content(Role.USER, user))
        beam.append({"role": "user", "content": user})
        for _ in range(rng.randint(0, 2) if tools else 0):  # tool rounds: sequential calls
            thought = reasoning()
            calls = []
            for _ in range(1 if rng.random() < 0.6 else rng.randint(2, 3)):  # parallel calls
                name, arguments = rng.choice(tools)["function"]["name"], _arguments(rng)
                calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
                hmsgs.append(
                    Message.from_role_and_content(Role.ASSISTANT, json.dumps(arguments, ensure_ascii=False))
                    .with_channel("commentary").with_recipient(f"functions.{name}")
                    .with_content_type("<|constrain|>json"))
            beam.append({"role": "assistant", "reasoning_content": thought, "tool_calls": calls})
            for call in calls:
                result = json.dumps({"ok": True, "text": _text(rng, 1, 4)}, ensure_ascii=False)
                name = call["function"]["name"]
                hmsgs.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), result)
                             .with_channel("commentary").with_recipient("assistant"))
                beam.append({"role": "tool", "name": name, "content": result})
        thought = reasoning()
        answer = _text(rng)
        hmsgs.append(Message.from_role_and_content(Role.ASSISTANT, answer).with_channel("final"))
        beam.append({"role": "assistant", "reasoning_content": thought, "content": answer})
    record = {"messages": beam}
    if tools:
        record["tools"] = tools
    record["chat_template_kwargs"] = {"reasoning_effort": effort}
    return Conversation.from_messages(hmsgs), record, parts_by_message


def _as_typescript_says(schema):
    """A JSON schema as its TypeScript rendering says it: `integer` is `number`, a one-value enum a literal."""
    if isinstance(schema, list):
        return [_as_typescript_says(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _as_typescript_says(v) for k, v in schema.items()}
    if out.get("type") == "integer":
        out["type"] = "number"
    if isinstance(out.get("enum"), list) and len(out["enum"]) == 1:
        out["const"] = out.pop("enum")[0]
        out.pop("type", None)
    return out


def expected_from_text(record: dict, parts_by_message: dict[int, list[tuple[str, str]]]) -> dict:
    """What openai-harmony's rendered text still says (see the module docstring)."""
    expected = copy.deepcopy(record)
    messages = expected["messages"]
    first_final = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and "content" in m)
    for i, parts in parts_by_message.items():
        if i <= first_final:
            messages[i]["reasoning_content"] = "\n\n".join(t for t, channel in parts if channel != "analysis")
    if "tools" in expected:
        expected["tools"] = _as_typescript_says(expected["tools"])
    return expected


def _cases():
    rng = random.Random(20261201)
    return [generate(rng) for _ in range(N_CONVERSATIONS)]


CASES = _cases()
RENDER_CHECK = make_render_check()


def test_the_generator_covers_what_it_should():
    records = [record for _, record, _ in CASES]
    calls = [m["tool_calls"] for r in records for m in r["messages"] if m.get("tool_calls")]
    assert sum(len(c) > 1 for c in calls) > 10  # parallel calls
    assert sum(sum(1 for m in r["messages"] if m.get("tool_calls")) > 1 for r in records) > 10  # sequential
    assert sum(sum(m["role"] == "user" for m in r["messages"]) > 1 for r in records) > 50  # several turns
    assert {r["chat_template_kwargs"]["reasoning_effort"] for r in records} == {"low", "medium", "high"}
    assert sum("\n\n" in m.get("reasoning_content", "") for r in records for m in r["messages"]) > 10
    schemas = json.dumps([r.get("tools") for r in records])
    for kind in ('"integer"', '"enum"', '"array"', '"default"', '"required"', '"properties": {}'):
        assert kind in schemas


def test_conversation_json_reads_back_exactly():
    for conversation, record, _ in CASES:
        out = convert(json.loads(conversation.to_json()), "harmony")[0]
        assert out == record, conversation.to_json()[:500]
        RENDER_CHECK(out)


def test_rendered_text_reads_back_exactly(harmony):
    dropped = 0
    for conversation, record, parts in CASES:
        text = harmony.decode_utf8(harmony.render_conversation(conversation))
        out = convert({"text": text}, "harmony")[0]
        expected = expected_from_text(record, parts)
        assert out == expected, text[:800]
        dropped += expected != record
    assert dropped > N_CONVERSATIONS // 2  # the expected differences are exercised


def test_training_render_reads_back_exactly(harmony):
    # render_conversation_for_training ends the last message with <|return|> instead of <|end|>.
    for conversation, record, parts in CASES[:40]:
        tokens = harmony.render_conversation_for_training(conversation)
        assert tokens[-1] == 200002
        out = convert({"text": harmony.decode_utf8(tokens)}, "harmony")[0]
        assert out == expected_from_text(record, parts)


# ---------- Beam-rendered assistant turns, parsed by openai-harmony ----------


def _assistant_turns(encoded: dict) -> list[list[int]]:
    """The trained token runs of one encoded record: each assistant turn, <|channel|> .. stop token."""
    runs, current = [], []
    for token, trained in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True):
        if trained:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _xml(arguments: dict) -> str:
    def value(v):
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    return "\n".join(f'<rfl:parameter name="{k}">\n{value(v)}\n</rfl:parameter>' for k, v in arguments.items())


def test_beam_turns_parse_with_openai_harmony(harmony, o200k_tok):
    from beam_sft.render.encoder import MaskedEncoder

    encoder = MaskedEncoder(o200k_tok)
    records = [record for _, record, _ in CASES]
    parsed_turns = 0
    for record, encoded in zip(records, encoder.encode(records), strict=True):
        assistant = [m for m in record["messages"] if m["role"] == "assistant"]
        runs = _assistant_turns(encoded)
        assert len(runs) == len(assistant)
        for message, run in zip(assistant, runs, strict=True):
            # The turn's header `<|start|>assistant` comes from the prompt, as in generation.
            parsed = harmony.parse_messages_from_completion_tokens(run, Role.ASSISTANT)
            got = [(m.author.role, m.channel, m.recipient, m.content_type, m.content[0].text) for m in parsed]
            want = [(Role.ASSISTANT, "analysis", None, None, message["reasoning_content"])]
            if message.get("tool_calls"):
                want += [
                    (Role.ASSISTANT, "analysis", call["function"]["name"], "<|constrain|>xml",
                     _xml(call["function"]["arguments"]))
                    for call in message["tool_calls"]
                ]
            else:
                want.append((Role.ASSISTANT, "final", None, None, message["content"]))
            assert got == want
            parsed_turns += 1
    assert parsed_turns > 300
