"""Tool calls checked against the tools the record declares, and the turn order eval expects: what `beam-sft eval`
scores as a failure must not be trained as a target. See docs/conversion.md#calls-checked-against-their-tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.records.types import ToolSpec, json_type

# The policy for the records these checks find: reject them (the default) or keep them as they are.
TOOL_CALL_CHECKS_CHOICES = ("reject", "keep")
# The option's help, the same in every command that takes --tool_call_checks.
TOOL_CALL_CHECKS_HELP = ("a record eval would score as a failure (a call to an undeclared tool, or with no "
                         "tools declared; arguments against the tool's schema; a turn without text; a "
                         "conversation the assistant opens): reject it with its own reason, or keep it "
                         "(default: reject)")

_TYPES: dict[str, Callable[[Any], bool]] = {  # as beam_sft.eval.metrics scores them: 2.0 is an integer
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "array": lambda v: type(v) is list,
    "object": lambda v: type(v) is dict,
    "null": lambda v: v is None,
}


def _same(a: Any, b: Any) -> bool:
    """JSON equality for enum members: 1 == 1.0, but True != 1."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return a == b and (type(a) is type(b) or {type(a), type(b)} <= {int, float})


def schema_error(value: Any, schema: Any, path: str) -> str | None:
    """Why `value` breaks `schema` (type, enum, required; properties and items recursively), or None."""
    if type(schema) is not dict or not schema:
        return None
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if type(kinds) is str else kinds if type(kinds) is list else []
        known = [k for k in kinds if type(k) is str and k in _TYPES]  # a schema may hold any JSON here
        if known and not any(_TYPES[k](value) for k in known):
            return f"{path} is {json_type(value)} ({value!r:.40}), the schema says {' or '.join(known)}"
    options = schema.get("enum")
    if type(options) is list and options and not any(_same(value, o) for o in options):
        return f"{path} is {value!r:.40}, not one of the enum {options!r:.80}"
    if type(value) is dict:
        required = schema.get("required")
        for key in required if type(required) is list else ():
            if type(key) is str and key not in value:
                return f"{path} lacks the required {key!r}"
        properties = schema.get("properties")
        if type(properties) is dict:
            for key, item in value.items():
                why = schema_error(item, properties.get(key), f"{path}.{key}")
                if why:
                    return why
    elif type(value) is list:
        for k, item in enumerate(value):
            why = schema_error(item, schema.get("items"), f"{path}[{k}]")
            if why:
                return why
    return None


def check_calls(msgs: list, tools: list[ToolSpec] | None, index: Callable[[int], int | None]) -> None:
    """Raise `RecordError` for the first call in `msgs` (converted messages; `index` maps a position to the
    source message's) in a record that declares no tools, naming no declared tool, or whose arguments break its
    tool's parameters schema."""
    schemas: dict[str, Any] | None = None
    for i, m in enumerate(msgs):
        calls = m.get("tool_calls") if type(m) is dict else None
        if not calls or type(calls) is not list:
            continue
        if schemas is None:
            schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools or ()}
        for call in calls:
            fn = call["function"]
            name = fn["name"]
            if not schemas:
                raise RecordError(Reason.NO_TOOLS_DECLARED, f"call {name!r} in a record that declares no tools "
                                  "(`tools` is empty or null): eval scores every such call as an unknown tool",
                                  message_index=index(i))
            if name not in schemas:
                raise RecordError(Reason.UNDECLARED_TOOL, f"call {name!r} names no declared tool (declared: "
                                  f"{', '.join(sorted(schemas))[:120]})", message_index=index(i))
            why = schema_error(fn["arguments"], schemas[name], "arguments")
            if why:
                raise RecordError(Reason.ARGUMENTS_BREAK_SCHEMA, f"call {name!r}: {why}", message_index=index(i))


def check_opening(msgs: list, index: Callable[[int], int | None]) -> None:
    """A conversation whose first turn after the system and developer messages is the assistant's: there is no
    prompt for what it says (eval never prompts such a turn)."""
    for i, m in enumerate(msgs):
        role = m.get("role") if type(m) is dict else None
        if role == "assistant":
            raise RecordError(Reason.ASSISTANT_FIRST, "the conversation opens with the assistant: no user turn "
                              "before its first answer", message_index=index(i))
        if role != "system" and role != "developer":
            return
