"""`mask-names=P`: for a share P of the records with tools, every declared function and its parameters get
neutral names (Hammer's "function masking"): the model must read the descriptions (docs/tool-calling.md)."""

from __future__ import annotations

import random
import re
from functools import partial
from typing import Any

import orjson

from beam_sft.augment.base import Skip, Transform, sampled
from beam_sft.augment.words import names_pattern, texts, tool_name
from beam_sft.records.types import BeamRecord, FunctionSpec, Message, ToolSpec

_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*")


def _walk_strings(value: Any, sub) -> Any:
    """`value` with `sub` applied to every string inside it (dict keys stay)."""
    if type(value) is str:
        return sub(value)
    if type(value) is dict:
        return {k: _walk_strings(v, sub) for k, v in value.items()}
    if type(value) is list:
        return [_walk_strings(v, sub) for v in value]
    return value


class MaskNames(Transform):
    name = "mask-names"

    def __call__(self, record: BeamRecord, rng: random.Random) -> BeamRecord:
        if not (tools := record.get("tools") or []):
            raise Skip("no_tools")
        sampled(rng, self.value)
        names = [tool_name(t) for t in tools]
        if len(set(names)) != len(names):
            raise Skip("duplicate_tool_name")
        self._check_calls(record, set(names))
        words = [n for n in names if _PLAIN_WORD.fullmatch(n)]
        if words and re.search(names_pattern(words).pattern, "\n".join(texts(record)), re.IGNORECASE):
            raise Skip("name_is_a_word")
        functions = self._new_names(record, names, rng)
        params = {n: self._param_names(t.get("function", t), rng) for n, t in zip(names, tools, strict=True)}
        pattern = names_pattern(names)
        sub = partial(pattern.sub, lambda m: functions[m.group(0)])
        out = {**record, "tools": [self._tool(t, functions, params, sub) for t in tools],
               "messages": [self._message(m, functions, params, sub) for m in record["messages"]]}
        self._check_calls(out, set(functions.values()), params={functions[n]: p for n, p in params.items()})
        if pattern.search(orjson.dumps(out).decode()):
            raise Skip("name_left")
        return out

    @staticmethod
    def _check_calls(record: BeamRecord, names: set[str], params: dict | None = None) -> None:
        """Every call names a declared tool and (`params` given) only its schema's arguments."""
        for m in record["messages"]:
            for call in m.get("tool_calls") or ():
                fn = call["function"]
                if fn["name"] not in names:
                    raise Skip("undeclared_call")
                if params is not None and not set(fn["arguments"]) <= set(params[fn["name"]].values()):
                    raise Skip("argument_not_declared")

    @staticmethod
    def _new_names(record: BeamRecord, names: list[str], rng: random.Random) -> dict[str, str]:
        """name -> a fresh `func_XXXX`, distinct and found nowhere in the record."""
        blob = orjson.dumps(record).decode()
        out: dict[str, str] = {}
        for name in names:
            new = f"func_{rng.getrandbits(16):04x}"
            while new in blob or new in out.values():
                new = f"func_{rng.getrandbits(16):04x}"
            out[name] = new
        return out

    @staticmethod
    def _param_names(fn: FunctionSpec, rng: random.Random) -> dict[str, str]:
        props = (fn.get("parameters") or {}).get("properties")
        keys = list(props) if type(props) is dict else []
        numbers = list(range(1, len(keys) + 1))
        rng.shuffle(numbers)
        return {k: f"arg_{n}" for k, n in zip(keys, numbers, strict=True)}

    @staticmethod
    def _tool(tool: ToolSpec, functions: dict, params: dict, sub) -> ToolSpec:
        fn = tool.get("function", tool)
        rename = params[fn["name"]]
        new = {k: _walk_strings(v, sub) for k, v in fn.items() if k not in ("name", "parameters")}
        if type(schema := fn.get("parameters")) is dict:
            schema = _walk_strings(schema, sub)
            if rename:
                schema["properties"] = {rename[k]: v for k, v in schema["properties"].items()}
            if type(schema.get("required")) is list:
                schema["required"] = [rename.get(r, r) if type(r) is str else r for r in schema["required"]]
        fn = {"name": functions[fn["name"]], **new, **({"parameters": schema} if "parameters" in fn else {})}
        return {**tool, "function": fn}

    @staticmethod
    def _message(m: Message, functions: dict, params: dict, sub) -> Message:
        m = {k: sub(v) if k in ("content", "reasoning_content") and type(v) is str else v for k, v in m.items()}
        if m["role"] == "tool" and m.get("name") in functions:
            m["name"] = functions[m["name"]]
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {
                "name": functions[c["function"]["name"]],
                "arguments": {params[c["function"]["name"]].get(k, k): v
                              for k, v in c["function"]["arguments"].items()}}}
                for c in m["tool_calls"]]
        return m
