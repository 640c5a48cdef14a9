"""Write the bundled sample datasets in data/samples/ (OpenAI, ShareGPT and gpt-oss Harmony shapes).

The same deterministic scenarios (fixed seed) are written in each input format, so the three files convert
to comparable Beam records. Every good record reasons on every assistant turn; a few deliberately bad
records at known positions exercise the rejects path (each with a different reason).

    python scripts/make_samples.py                 # writes data/samples/{openai.jsonl,sharegpt.json,harmony.jsonl}
    python scripts/make_samples.py --out /tmp/samples --n 40
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 20261129

CITIES = {
    "London": ("cloudy", 14), "Paris": ("sunny", 18), "Tokyo": ("rainy", 22), "Lima": ("foggy", 17),
    "Oslo": ("snowy", -3), "Cairo": ("clear", 31), "Sydney": ("windy", 20), "Toronto": ("sunny", 9),
    "Nairobi": ("cloudy", 24), "Madrid": ("clear", 27),
}
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Norway": "Oslo", "Egypt": "Cairo", "Kenya": "Nairobi",
    "Spain": "Madrid", "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasília",
}
RATES = {("USD", "EUR"): 0.92, ("EUR", "USD"): 1.09, ("GBP", "USD"): 1.27, ("USD", "JPY"): 151.0,
         ("EUR", "GBP"): 0.86}
STOCKS = {"ACME": 123.45, "GLOBX": 88.1, "INITECH": 42.0, "UMBRL": 310.75}
WORDS = ["harmony", "reasoning", "tokenizer", "gradient", "lighthouse", "parquet", "beam", "channel"]
SYSTEMS = [
    "You are a concise assistant.",
    "You are a helpful assistant. Answer briefly.",
    "Answer like a careful tutor.",
    "You are a travel helper with access to tools.",
]
EFFORTS_BEAM = ["minimal", "low", "medium", "high", "xhigh", "max", 16, 100]
EFFORTS_HARMONY = ["low", "medium", "high"]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            },
            "required": ["city"],
        },
    },
}
CURRENCY_TOOL = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "description": "Convert an amount between two currencies at today's rate.",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number"},
                "source": {"type": "string", "description": "ISO code, e.g. USD"},
                "target": {"type": "string", "description": "ISO code, e.g. EUR"},
            },
            "required": ["amount", "source", "target"],
        },
    },
}
STOCK_TOOL = {
    "type": "function",
    "function": {
        "name": "get_stock_price",
        "description": "Look up the latest price of a stock ticker.",
        "parameters": {
            "type": "object",
            "properties": {"symbol": {"type": "string"}},
            "required": ["symbol"],
        },
    },
}
RUN_TOOL = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": "Run a short Python snippet and return its stdout.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source"},
                "timeout": {"type": "integer", "description": "Seconds", "default": 10},
            },
            "required": ["code"],
        },
    },
}
NOTE_TOOL = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Save a note with optional tags.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "pinned": {"type": "boolean", "default": False},
            },
            "required": ["title"],
        },
    },
}
ALL_TOOLS = [WEATHER_TOOL, CURRENCY_TOOL, STOCK_TOOL, RUN_TOOL, NOTE_TOOL]


# --- scenarios: each returns a Beam record (the target shape) ------------------------------------------


def _user(text):
    return {"role": "user", "content": text}


def _asst(reasoning, content):
    return {"role": "assistant", "reasoning_content": reasoning, "content": content}


class _Ids:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return f"call_{self.n:03d}"


def _call(ids, name, args):
    return {"id": ids(), "type": "function", "function": {"name": name, "arguments": args}}


def _tool(call, content):
    return {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": content}


def _arith_turn(rng):
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    op = rng.choice(["+", "-", "*"])
    val = {"+": a + b, "-": a - b, "*": a * b}[op]
    if op == "*":
        why = f"{a} * {b} = {a} * {b // 10 * 10} + {a} * {b % 10} = {a * (b // 10 * 10)} + {a * (b % 10)} = {val}."
    else:
        why = f"Compute {a} {op} {b} directly: {val}."
    return _user(f"What is {a} {op} {b}?"), _asst(f"The user wants {a} {op} {b}. {why}", f"{a} {op} {b} = {val}.")


def sc_arith(rng, ids):
    u, a = _arith_turn(rng)
    return {"messages": [u, a]}


def sc_multi_arith(rng, ids):
    msgs = []
    for _ in range(rng.randint(2, 3)):
        msgs.extend(_arith_turn(rng))
    return {"messages": msgs}


def sc_capital(rng, ids):
    country = rng.choice(sorted(CAPITALS))
    cap = CAPITALS[country]
    return {"messages": [
        {"role": "system", "content": rng.choice(SYSTEMS[:3])},
        _user(f"What is the capital of {country}?"),
        _asst(f"The capital of {country} is {cap}. One short sentence is enough.", f"The capital of {country} is {cap}."),
    ]}


def sc_word(rng, ids):
    w = rng.choice(WORDS)
    kind = rng.choice(["reverse", "count", "upper"])
    if kind == "reverse":
        q, r, ans = f"Reverse the word '{w}'.", f"Reading '{w}' backwards letter by letter gives '{w[::-1]}'.", w[::-1]
    elif kind == "count":
        q = f"How many letters are in '{w}'?"
        r = f"Spell it out: {', '.join(w)}. That is {len(w)} letters."
        ans = f"'{w}' has {len(w)} letters."
    else:
        q, r, ans = f"Write '{w}' in capital letters.", "Uppercase every letter.", w.upper()
    return {"messages": [_user(q), _asst(r, ans)]}


def sc_convert_units(rng, ids):
    if rng.random() < 0.5:
        c = rng.randint(-10, 40)
        f = c * 9 / 5 + 32
        return {"messages": [
            _user(f"Convert {c} °C to Fahrenheit."),
            _asst(f"F = C * 9/5 + 32 = {c} * 1.8 + 32 = {f:g}.", f"{c} °C is {f:g} °F."),
        ]}
    km = rng.randint(2, 50)
    mi = round(km * 0.621371, 2)
    return {"messages": [
        _user(f"How many miles is {km} km?"),
        _asst(f"1 km is about 0.621371 miles, so {km} km ≈ {mi} miles.", f"{km} km is about {mi} miles."),
    ]}


def sc_sort(rng, ids):
    nums = rng.sample(range(1, 100), rng.randint(4, 7))
    s = sorted(nums)
    return {"messages": [
        _user(f"Sort these numbers ascending: {', '.join(map(str, nums))}"),
        _asst(f"Smallest is {s[0]}, largest is {s[-1]}. Ordering all of them gives {s}.",
              ", ".join(map(str, s))),
    ]}


def sc_code(rng, ids):
    n = rng.randint(3, 9)
    code = f"def square(x):\n    return x * x\n\nprint(square({n}))"
    return {"messages": [
        _user(f"Write a Python function that squares a number and show it on {n}."),
        _asst("A one-line function returning x * x is enough; then call it and print.",
              f"```python\n{code}\n```\n\nThis prints {n * n}."),
    ]}


def sc_weather(rng, ids):
    city = rng.choice(sorted(CITIES))
    cond, t = CITIES[city]
    unit = rng.choice([None, "celsius", "fahrenheit"])
    args = {"city": city} if unit is None else {"city": city, "unit": unit}
    temp = t if unit != "fahrenheit" else round(t * 9 / 5 + 32)
    sym = "F" if unit == "fahrenheit" else "C"
    call = _call(ids, "get_weather", args)
    result = json.dumps({"city": city, "condition": cond, "temperature": temp, "unit": sym})
    return {"tools": [WEATHER_TOOL], "messages": [
        _user(f"What's the weather like in {city} right now?"),
        {"role": "assistant", "reasoning_content": f"I need live data, so I'll call get_weather for {city}.",
         "tool_calls": [call]},
        _tool(call, result),
        _asst(f"The tool says {cond} and {temp} {sym}. Report that.", f"It's {cond} in {city}, {temp} °{sym}."),
    ]}


def sc_parallel_weather(rng, ids):
    a, b = rng.sample(sorted(CITIES), 2)
    calls = [_call(ids, "get_weather", {"city": a}), _call(ids, "get_weather", {"city": b})]
    res = [json.dumps({"city": c, "condition": CITIES[c][0], "temperature": CITIES[c][1], "unit": "C"})
           for c in (a, b)]
    warmer = a if CITIES[a][1] >= CITIES[b][1] else b
    return {"tools": [WEATHER_TOOL, STOCK_TOOL], "messages": [
        _user(f"Is it warmer in {a} or {b}?"),
        {"role": "assistant", "reasoning_content": f"I need both cities; call get_weather for {a} and {b} in parallel.",
         "tool_calls": calls},
        _tool(calls[0], res[0]),
        _tool(calls[1], res[1]),
        _asst(f"{a}: {CITIES[a][1]} C, {b}: {CITIES[b][1]} C. {warmer} is warmer.",
              f"{warmer} is warmer: {a} is {CITIES[a][1]} °C and {b} is {CITIES[b][1]} °C."),
    ]}


def sc_currency(rng, ids):
    (src, dst), rate = rng.choice(sorted(RATES.items()))
    amount = rng.choice([10, 25, 100, 250, 1000])
    out = round(amount * rate, 2)
    call = _call(ids, "convert_currency", {"amount": amount, "source": src, "target": dst})
    return {"tools": [CURRENCY_TOOL, WEATHER_TOOL], "messages": [
        {"role": "system", "content": SYSTEMS[3]},
        _user(f"How much is {amount} {src} in {dst}?"),
        {"role": "assistant", "reasoning_content": "Exchange rates change daily; use convert_currency.",
         "tool_calls": [call]},
        _tool(call, json.dumps({"amount": out, "currency": dst, "rate": rate})),
        _asst(f"Rate {rate}, so {amount} {src} = {out} {dst}.", f"{amount} {src} is about {out} {dst}."),
    ]}


def sc_stock_chain(rng, ids):
    s1, s2 = rng.sample(sorted(STOCKS), 2)
    c1 = _call(ids, "get_stock_price", {"symbol": s1})
    c2 = _call(ids, "get_stock_price", {"symbol": s2})
    diff = round(STOCKS[s1] - STOCKS[s2], 2)
    return {"tools": [STOCK_TOOL], "messages": [
        _user(f"What's the price difference between {s1} and {s2}?"),
        {"role": "assistant", "reasoning_content": f"Start with {s1}.", "tool_calls": [c1]},
        _tool(c1, json.dumps({"symbol": s1, "price": STOCKS[s1]})),
        {"role": "assistant", "reasoning_content": f"{s1} is {STOCKS[s1]}. Now {s2}.", "tool_calls": [c2]},
        _tool(c2, json.dumps({"symbol": s2, "price": STOCKS[s2]})),
        _asst(f"{STOCKS[s1]} - {STOCKS[s2]} = {diff}.", f"{s1} trades {diff} above {s2} ({STOCKS[s1]} vs {STOCKS[s2]})."),
    ]}


def sc_run_python(rng, ids):
    n = rng.randint(5, 12)
    code = f"print(sum(range({n} + 1)))"
    call = _call(ids, "run_python", {"code": code, "timeout": 5} if rng.random() < 0.5 else {"code": code})
    total = n * (n + 1) // 2
    return {"tools": [RUN_TOOL], "messages": [
        _user(f"Use Python to add the numbers 1 to {n}."),
        {"role": "assistant", "reasoning_content": "The user asked for Python explicitly, so run a snippet.",
         "tool_calls": [call]},
        _tool(call, f"{total}\n"),
        _asst(f"The snippet printed {total}, which matches n(n+1)/2.", f"The sum of 1 to {n} is {total}."),
    ]}


def sc_note(rng, ids):
    w = rng.choice(WORDS)
    tags = rng.sample(["work", "ideas", "todo", "ml", "travel"], rng.randint(1, 3))
    call = _call(ids, "save_note", {"title": f"Read about {w}", "tags": tags, "pinned": rng.random() < 0.5})
    return {"tools": [NOTE_TOOL, WEATHER_TOOL], "messages": [
        _user(f"Save a note to read about {w}, tagged {', '.join(tags)}."),
        {"role": "assistant", "reasoning_content": "Call save_note with the title and the tags the user gave.",
         "tool_calls": [call]},
        _tool(call, json.dumps({"ok": True, "id": rng.randint(100, 999)})),
        _asst("The note was saved. Confirm briefly.", f"Saved the note \"Read about {w}\"."),
        _user("Thanks!"),
        _asst("The user is thanking me; reply politely.", "You're welcome!"),
    ]}


SCENARIOS = [sc_arith, sc_multi_arith, sc_capital, sc_word, sc_convert_units, sc_sort, sc_code, sc_weather,
             sc_parallel_weather, sc_currency, sc_stock_chain, sc_run_python, sc_note]


def make_records(n, rng, efforts):
    ids = _Ids()
    out = []
    for i in range(n):
        rec = SCENARIOS[i % len(SCENARIOS)](rng, ids)
        if rng.random() < 0.6:
            rec["chat_template_kwargs"] = {"reasoning_effort": rng.choice(efforts)}
        out.append(rec)
    return out


# --- OpenAI shape -------------------------------------------------------------------------------------


def to_openai(rec, rng):
    msgs = []
    reasoning_key = rng.choice(["reasoning_content", "reasoning_content", "reasoning", "thinking"])
    for m in rec["messages"]:
        m = dict(m)
        if m["role"] == "assistant":
            r = m.pop("reasoning_content")
            m[reasoning_key] = r
            if "tool_calls" in m:
                m["content"] = None
                m["tool_calls"] = [
                    {**c, "function": {"name": c["function"]["name"],
                                       "arguments": json.dumps(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ]
        elif m["role"] == "tool":
            m.pop("name")
        msgs.append(m)
    out = {"messages": msgs}
    if "tools" in rec:
        out["tools"] = rec["tools"]
    if "chat_template_kwargs" in rec:
        out["chat_template_kwargs"] = rec["chat_template_kwargs"]
    return out


def bad_openai():
    return [
        {"messages": [{"role": "user", "content": "Hello?"}]},  # no_assistant_turn
        {"messages": [
            _user("Weather in Paris?"),
            {"role": "assistant", "reasoning_content": "Call the tool.", "content": None,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{city: Paris"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            _asst("Report.", "Sunny."),
        ], "tools": [WEATHER_TOOL]},  # bad_arguments_json
        {"messages": [
            _user("Hi"),
            {"role": "tool", "tool_call_id": "nope", "content": "orphan result"},
            _asst("Greet.", "Hello!"),
        ]},  # tool_result_without_call
        {"messages": [_user("What does <|start|> mean?<|end|>"), _asst("Explain.", "It starts a message.")]},
    ]


# --- ShareGPT shape -----------------------------------------------------------------------------------


def to_sharegpt(rec, rng):
    conv = []
    out = {}
    for m in rec["messages"]:
        role = m["role"]
        if role == "system":
            if rng.random() < 0.5:
                out["system"] = m["content"]
            else:
                conv.append({"from": "system", "value": m["content"]})
        elif role == "user":
            conv.append({"from": rng.choice(["human", "human", "user"]), "value": m["content"]})
        elif role == "assistant":
            think = f"<think>\n{m['reasoning_content']}\n</think>\n\n"
            if m.get("tool_calls"):
                conv.append({"from": "gpt", "value": think.rstrip()})
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                         for c in m["tool_calls"]]
                conv.append({"from": "function_call", "value": json.dumps(calls[0] if len(calls) == 1 else calls)})
            else:
                conv.append({"from": rng.choice(["gpt", "gpt", "assistant"]), "value": think + m["content"]})
        elif role == "tool":
            conv.append({"from": "observation", "value": m["content"]})
    out["conversations"] = conv
    if "tools" in rec:
        out["tools"] = json.dumps([t["function"] for t in rec["tools"]])
    if "chat_template_kwargs" in rec:
        out["chat_template_kwargs"] = rec["chat_template_kwargs"]
    return out


def bad_sharegpt():
    return [
        {"conversations": []},  # empty_conversation
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "narrator", "value": "Meanwhile..."},
                           {"from": "gpt", "value": "<think>Greet.</think>Hello!"}]},  # unknown_role
        {"conversations": [{"from": "human", "value": "Weather?"},
                           {"from": "observation", "value": "{\"temp\": 3}"},
                           {"from": "gpt", "value": "<think>Report.</think>It's 3 degrees."}]},  # result without call
    ]


# --- gpt-oss Harmony shape ----------------------------------------------------------------------------


def _ts_type(schema):
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    t = schema.get("type")
    if t == "array":
        return _ts_type(schema.get("items", {})) + "[]"
    return {"integer": "number", "number": "number", "string": "string", "boolean": "boolean"}.get(t, "any")


def ts_namespace(tools):
    lines = ["namespace functions {", ""]
    for t in tools:
        f = t["function"]
        lines.append(f"// {f['description']}")
        props = f["parameters"].get("properties", {})
        if not props:
            lines.append(f"type {f['name']} = () => any;")
        else:
            lines.append(f"type {f['name']} = (_: {{")
            req = set(f["parameters"].get("required", []))
            for name, s in props.items():
                if "description" in s:
                    lines.append(f"// {s['description']}")
                line = f"{name}{'' if name in req else '?'}: {_ts_type(s)},"
                if "default" in s:
                    d = s["default"]
                    line += f" // default: {json.dumps(d) if not isinstance(d, str) else d}"
                lines.append(line)
            lines.append("}) => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def to_harmony_text(rec, rng):
    effort = (rec.get("chat_template_kwargs") or {}).get("reasoning_effort", "medium")
    sys_text = (
        "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n"
        + (f"Current date: 2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}\n" if rng.random() < 0.5 else "")
        + f"\nReasoning: {effort}\n\n# Valid channels: analysis, commentary, final. "
        "Channel must be included for every message."
    )
    if rec.get("tools"):
        sys_text += "\nCalls to these tools must go to the commentary channel: 'functions'."
    parts = [f"<|start|>system<|message|>{sys_text}<|end|>"]
    msgs = rec["messages"]
    instructions = [m["content"] for m in msgs if m["role"] == "system"]
    dev = []
    if instructions:
        dev.append("# Instructions\n\n" + "\n\n".join(instructions))
    if rec.get("tools"):
        dev.append("# Tools\n\n## functions\n\n" + ts_namespace(rec["tools"]))
    if dev:
        parts.append("<|start|>developer<|message|>" + "\n\n".join(dev) + "<|end|>")
    last_asst = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    for i, m in enumerate(msgs):
        if m["role"] == "user":
            parts.append(f"<|start|>user<|message|>{m['content']}<|end|>")
        elif m["role"] == "assistant":
            parts.append(f"<|start|>assistant<|channel|>analysis<|message|>{m['reasoning_content']}<|end|>")
            for c in m.get("tool_calls") or []:
                args = json.dumps(c["function"]["arguments"])
                name = c["function"]["name"]
                if rng.random() < 0.5:  # both header orders occur in real gpt-oss output
                    head = f"<|start|>assistant to=functions.{name}<|channel|>commentary <|constrain|>json"
                else:
                    head = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
                parts.append(f"{head}<|message|>{args}<|call|>")
            if m.get("content") is not None:
                end = "<|return|>" if i == last_asst else "<|end|>"
                parts.append(f"<|start|>assistant<|channel|>final<|message|>{m['content']}{end}")
        elif m["role"] == "tool":
            parts.append(f"<|start|>functions.{m['name']} to=assistant<|channel|>commentary<|message|>"
                         f"{m['content']}<|end|>")
    return {"text": "".join(parts)}


def to_harmony_json(rec):
    """The openai-harmony `Conversation.to_json()` shape."""
    effort = (rec.get("chat_template_kwargs") or {}).get("reasoning_effort", "medium")
    msgs = [{"role": "system", "name": None, "content": [{
        "model_identity": "You are ChatGPT, a large language model trained by OpenAI.",
        "reasoning_effort": effort.capitalize(), "knowledge_cutoff": "2024-06",
        "channel_config": {"valid_channels": ["analysis", "commentary", "final"], "channel_required": True},
        "type": "system_content"}]}]
    instructions = [m["content"] for m in rec["messages"] if m["role"] == "system"]
    if instructions or rec.get("tools"):
        dev = {"type": "developer_content"}
        if instructions:
            dev["instructions"] = "\n\n".join(instructions)
        if rec.get("tools"):
            dev["tools"] = {"functions": {"name": "functions", "tools": [
                {"name": t["function"]["name"], "description": t["function"]["description"],
                 "parameters": t["function"]["parameters"]} for t in rec["tools"]]}}
        msgs.append({"role": "developer", "name": None, "content": [dev]})
    for m in rec["messages"]:
        if m["role"] == "user":
            msgs.append({"role": "user", "name": None, "content": [{"type": "text", "text": m["content"]}]})
        elif m["role"] == "assistant":
            msgs.append({"role": "assistant", "name": None, "channel": "analysis",
                         "content": [{"type": "text", "text": m["reasoning_content"]}]})
            for c in m.get("tool_calls") or []:
                msgs.append({"role": "assistant", "name": None, "channel": "commentary",
                             "recipient": f"functions.{c['function']['name']}", "content_type": "<|constrain|>json",
                             "content": [{"type": "text", "text": json.dumps(c["function"]["arguments"])}]})
            if m.get("content") is not None:
                msgs.append({"role": "assistant", "name": None, "channel": "final",
                             "content": [{"type": "text", "text": m["content"]}]})
        elif m["role"] == "tool":
            msgs.append({"role": "tool", "name": f"functions.{m['name']}", "channel": "commentary",
                         "recipient": "assistant", "content": [{"type": "text", "text": m["content"]}]})
    return {"messages": msgs}


def bad_harmony():
    sys_ = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n# Valid channels: analysis, commentary, final. "
            "Channel must be included for every message.<|end|>")
    return [
        # truncated call: no <|call|> terminator
        {"text": sys_ + "<|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant<|channel|>analysis"
                        "<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary to=functions."
                        "get_weather <|constrain|>json<|message|>{\"city\": \"Os"},
        # arguments that are not JSON
        {"text": sys_ + "<|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant<|channel|>analysis"
                        "<|message|>Use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>"
                        "commentary <|constrain|>json<|message|>city=Oslo<|call|>"},
        # a prompt only: no assistant turn
        {"text": sys_ + "<|start|>user<|message|>Tell me a joke.<|end|><|start|>assistant"},
    ]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data" / "samples"))
    parser.add_argument("--n", type=int, default=48, help="good records per file")
    parser.add_argument("--seed", type=int, default=SEED)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def interleave(good, bad, rng):
        rows = list(good)
        for b in bad:  # fixed positions from the seeded rng, never first
            rows.insert(rng.randint(1, len(rows)), b)
        return rows

    rng = random.Random(args.seed)
    recs = make_records(args.n, rng, EFFORTS_BEAM)
    rows = interleave([to_openai(r, rng) for r in recs], bad_openai(), rng)
    with open(out / "openai.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    rng = random.Random(args.seed + 1)
    recs = make_records(args.n, rng, EFFORTS_BEAM)
    rows = interleave([to_sharegpt(r, rng) for r in recs], bad_sharegpt(), rng)
    with open(out / "sharegpt.json", "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=1)
        f.write("\n")

    rng = random.Random(args.seed + 2)
    recs = make_records(args.n, rng, EFFORTS_HARMONY)
    good = [to_harmony_json(r) if i % 4 == 3 else to_harmony_text(r, rng) for i, r in enumerate(recs)]
    rows = interleave(good, bad_harmony(), rng)
    with open(out / "harmony.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    for name in ("openai.jsonl", "sharegpt.json", "harmony.jsonl"):
        print(f"{out / name}: {(out / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
