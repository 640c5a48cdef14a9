"""The bundled Beam chat template, rendered by plain Python for the records it is sure about (else None: Jinja
renders them). See docs/encoder.md#the-bundled-template-in-plain-python."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import orjson

from beam_sft.render import jinja
from beam_sft.template.tokenizer import MARKERS, TEMPLATES_DIR

_SCALARS = (str, int, float, bool, type(None))
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliasing order


def _plain_json(value: Any, limit: int = 1_000_000) -> bool:
    """Whether `value` is of exact JSON types only (what `tojson` renders the same in and out of Jinja), in at
    most `limit` values (a cycle is not). A stack: recursion took a quarter of encoding with all-new tools."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    scalars = _SCALARS
    while stack:
        limit -= 1
        if limit < 0:
            return False
        item = pop()
        kind = type(item)
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return False
                push(child)
        elif kind is list:
            extend(item)
        elif kind not in scalars:
            return False
    return True


def _xml_arguments(arguments: Any) -> str | None:
    """The template's `xml_arguments`, or None where it would raise or the types are not plain."""
    if arguments is None:
        return ""
    if type(arguments) is not dict:
        return None
    parts = []
    for key, value in arguments.items():
        if type(key) is not str or '"' in key or "<" in key or ">" in key:
            return None
        text = value if type(value) is str else _tojson(value) if _plain_json(value) else None
        if text is None or "</rfl:parameter>" in text:
            return None
        parts.append(f'<rfl:parameter name="{key}">\n{text}\n</rfl:parameter>')
    return "\n".join(parts)


def _reasoning(message: dict) -> str | None:
    """The template's reasoning text after transformers aliased the reasoning fields, or None."""
    first = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    # transformers' aliasing sets reasoning_content to `first`, and thinking to `first` unless the message
    # has its own; the template takes the first non-empty of reasoning_content, thinking, reasoning.
    for value in (first, message.get("thinking", first), message.get("reasoning")):
        if value is None:
            continue
        if type(value) is not str:
            return None
        if value:
            return value
    return ""


_DEFAULT_IDENTITY = "You are Beam, an AI assistant trained by Reflection."
_EFFORTS = {"minimal": 8, "low": 32, "medium": 64, "high": 128, "xhigh": 256, "max": 512}
_SYSTEM_HEAD = ("<|start|>system<|message|>{identity}\n\nReasoning effort: {effort}\n\n"
                "# Valid channels: analysis, final. Channel must be included for every message.<|end|>")
_DEVELOPER_TOOLS_HEAD = "<|start|>developer<|message|># Tools\n\n"
_BASH_TOOL = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
_BASH_KEYS = ("type", "description", "title", "examples")


def _is_trained_bash(fn: dict) -> bool:
    """The template's `is_trained_bash`: a `bash` tool whose one parameter is a plain `command` string."""
    params = fn.get("parameters")
    params = params if isinstance(params, dict) else {}
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    command = props.get("command")
    return (fn.get("name") == "bash" and len(props) == 1 and isinstance(command, dict)
            and command.get("type") == "string" and all(key in _BASH_KEYS for key in command))


class BeamTemplateRenderer:
    """Renders records with the bundled Beam template's rules (docs/encoder.md)."""

    def __init__(self, template: str, prefix_cache_size: int = 4096) -> None:
        self.template = template
        self._prefixes: OrderedDict[str, str | None] = OrderedDict()
        self._tool_types: dict[str, str | None] = {}
        self._prefix_cache_size = prefix_cache_size

    def clear(self) -> None:
        self._prefixes.clear()
        self._tool_types.clear()

    def _jinja(self, messages: list, tools, template_kwargs: dict) -> str | None:
        """The template's own rendering of a prefix (no generation blocks), or None if it raises."""
        try:
            text, spans = jinja.render(self.template, messages, tools, template_kwargs)
        except Exception:  # noqa: BLE001 - whatever the template raises, the full render raises it again
            return None
        return None if spans else text

    def _tool_type(self, tool: dict) -> str | None:
        """The template's TypeScript declaration of a tool: `ts_tool`, else read off a one-tool render."""
        key = _cache_key(tool)
        if key not in self._tool_types:
            declaration = ts_tool(tool)
            if declaration is None:
                text = self._jinja([], [tool], {})
                head = _SYSTEM_HEAD.format(identity=_DEFAULT_IDENTITY, effort=512) + _DEVELOPER_TOOLS_HEAD
                ok = text is not None and text.startswith(head) and text.endswith("<|end|>")
                declaration = text[len(head) : -len("<|end|>")] if ok else None
            self._tool_types[key] = declaration
            if len(self._tool_types) > self._prefix_cache_size:
                self._tool_types.pop(next(iter(self._tool_types)))
        return self._tool_types[key]

    def _bash_definition(self) -> str | None:
        """The fixed declaration the template writes for Beam's trained bash tool, read off a render."""
        if not hasattr(self, "_bash"):
            text = self._jinja([], [_BASH_TOOL], {}) or ""
            head = f"<|start|>system<|message|>{_DEFAULT_IDENTITY}\n\nReasoning effort: 512\n\n# Tools\n\n"
            tail = "\n\n# Valid channels: analysis, final. Channel must be included for every message.<|end|>"
            ok = text.startswith(head) and text.endswith(tail)
            self._bash = text[len(head) : -len(tail)] if ok else None
        return self._bash

    def _python_prefix(self, lead: list, tools, kwargs: dict) -> str | None:
        """The system and developer messages by the template's rules, for plain inputs; else None."""
        if any(key in kwargs for key in ("messages", "tools", "documents", "add_generation_prompt")):
            return None  # the template call itself would fail
        effort = kwargs.get("reasoning_effort")
        effort = 512 if effort is None else _EFFORTS.get(effort, effort) if type(effort) is str else effort
        identity = kwargs.get("model_identity")
        identity = _DEFAULT_IDENTITY if identity is None else identity
        if type(effort) is not int or type(identity) is not str:
            return None
        builtin = kwargs.get("builtin_tools")
        builtin = [] if builtin is None else [builtin] if type(builtin) is str else builtin
        if type(builtin) is not list or any(name not in ("search", "browse") for name in builtin):
            return None
        system_tools, developer_tools = [], []
        for tool in tools or ():
            fn = tool.get("function", tool) if type(tool) is dict else None
            if type(fn) is not dict or type(fn.get("name")) is not str:
                return None
            bash = _is_trained_bash(fn)
            declaration = self._bash_definition() if bash else self._tool_type(tool)
            if declaration is None:
                return None
            (system_tools if bash or fn["name"] in builtin else developer_tools).append(declaration)
        texts = ["" if message.get("content") is None else message["content"] for message in lead]
        if any(type(text) is not str for text in texts):
            return None
        out = [f"<|start|>system<|message|>{identity}\n\nReasoning effort: {effort}\n\n"]
        if system_tools:
            out.append("# Tools\n\n" + "\n\n".join(system_tools) + "\n\n")
        out.append("# Valid channels: analysis, final. Channel must be included for every message.<|end|>")
        sections = ["# Instructions\n\n" + "\n\n".join(texts)] if texts else []
        if developer_tools:
            sections.append("# Tools\n\n" + "\n\n".join(developer_tools))
        if sections:
            out.append("<|start|>developer<|message|>" + "\n\n".join(sections) + "<|end|>")
        return "".join(out)

    def _prefix(self, lead: list, tools, template_kwargs: dict) -> str | None:
        key = _cache_key((lead, tools, sorted(template_kwargs.items())))
        prefix = self._prefixes.get(key, False)
        if prefix is False:
            prefix = self._python_prefix(lead, tools, template_kwargs) or self._jinja(lead, tools, template_kwargs)
            self._prefixes[key] = prefix
            if len(self._prefixes) > self._prefix_cache_size:
                self._prefixes.popitem(last=False)
        return prefix

    def __call__(self, messages: list, tools, template_kwargs: dict) -> tuple[str, list[tuple[int, int]]] | None:
        if any(type(message) is not dict for message in messages):
            return None
        # transformers drops None values from messages before rendering.
        chat = [{k: v for k, v in m.items() if v is not None} if None in m.values() else m for m in messages]
        lead_count = next((i for i, m in enumerate(chat) if m.get("role") not in ("system", "developer")), len(chat))
        prefix = self._prefix(messages[:lead_count], tools, template_kwargs)
        if prefix is None:
            return None
        out = [prefix]
        length = len(prefix)
        spans = []
        for i, message in enumerate(chat):
            role = message.get("role")
            if role in ("system", "developer"):
                continue
            if role == "user":
                content = message.get("content", "")
                piece = f"<|start|>user<|message|>{content}<|end|>" if type(content) is str else None
            elif role == "assistant":
                piece = self._assistant(message)
            elif role == "tool":
                piece = self._tool(message, chat, i)
            else:
                return None  # the template raises
            if piece is None:
                return None
            if role == "assistant" and message.get("weight", 1) != 0:  # weight 0: context, outside the generation block
                spans.append((length + len("<|start|>assistant"), length + len(piece)))
            out.append(piece)
            length += len(piece)
        return "".join(out), spans

    @staticmethod
    def _assistant(message: dict) -> str | None:
        reasoning = _reasoning(message)
        if reasoning is None or any(marker in reasoning for marker in MARKERS):
            return None
        content, calls = message.get("content", ""), message.get("tool_calls", [])
        if type(content) is not str or type(calls) is not list:
            return None
        if calls and content:
            reasoning = f"{reasoning}\n\n{content}" if reasoning else content
        parts = [f"<|start|>assistant<|channel|>analysis<|message|>{reasoning}<|end|>"]
        if not calls:
            parts.append(f"<|start|>assistant<|channel|>final<|message|>{content}<|return|>")
        for k, call in enumerate(calls):
            if type(call) is not dict:
                return None
            fn = call.get("function", call)
            if type(fn) is not dict or type(fn.get("name")) is not str:
                return None
            arguments = _xml_arguments(fn.get("arguments"))
            if arguments is None:
                return None
            stop = "<|call|>" if k == len(calls) - 1 else "<|end|>"
            parts.append(f"<|start|>assistant to={fn['name']}<|channel|>analysis <|constrain|>xml<|message|>"
                         f"{arguments}{stop}")
        return "".join(parts)

    @staticmethod
    def _tool(message: dict, chat: list[dict], i: int) -> str | None:
        name = message.get("name")
        if name is not None and type(name) is not str:
            return None
        if not name:
            call_id = message.get("tool_call_id")
            name = ""
            for earlier in chat[:i] if call_id else ():
                calls = earlier.get("tool_calls") if earlier.get("role") == "assistant" else None
                if not calls:
                    continue
                if type(calls) is not list:
                    return None
                for call in calls:
                    if type(call) is not dict:
                        return None
                    if "id" in call and call["id"] == call_id:
                        fn = call.get("function", call)
                        if type(fn) is not dict or type(fn.get("name")) is not str:
                            return None
                        name = fn["name"]
            if not name:
                return None  # the template raises
        content = message.get("content", "")
        if type(content) is not str:
            return None
        return f"<|start|>{name} to=assistant<|channel|>analysis<|message|>{content}<|end|>"


_BUNDLED: list[str | None] = []


def _cache_key(value: Any) -> bytes | str:
    """A key equal for equal inputs (types, key order and all): orjson's text, 18x faster than `repr`; `repr`
    where orjson fails or may have written NaN or inf as null. Records come from JSON: they hold no tuple."""
    try:
        key = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)
    return repr(value) if b"null" in key else key


def for_template(template: str) -> BeamTemplateRenderer | None:
    """A renderer when `template` is byte for byte the bundled Beam template, else None."""
    if not _BUNDLED:
        path = TEMPLATES_DIR / "chat_template.jinja"
        _BUNDLED.append(path.read_text(encoding="utf-8") if path.is_file() else None)
    return BeamTemplateRenderer(template) if template == _BUNDLED[0] else None


# -- tool declarations (the template's ts_tool / ts_properties / ts_type / scalar_type macros) ----------------


class _Declined(Exception):
    """An input whose Jinja rendering this module does not reproduce for sure: Jinja renders it instead."""


def _tojson(value: Any) -> str:
    # transformers' `tojson` filter: json.dumps without ASCII escapes, default separators.
    return json.dumps(value, ensure_ascii=False)


def _sequence(value: Any) -> list | None:
    """`value` as the list the template iterates (`is iterable and is not string`): a mapping as its keys
    (tool sets write enums as {value: label}); None for a scalar or string; _Declined for other iterables."""
    if type(value) is list:
        return value
    if type(value) is dict:
        return list(value)
    if value is None or type(value) in (str, int, float, bool):
        return None
    raise _Declined


def _comment_lines(text: Any, indent: str) -> str:
    text = text if type(text) is str else str(text)  # `| string` of plain JSON values is Python's str()
    return "".join(f"{indent}//{' ' + line if line else ''}\n" for line in text.split("\n"))


def _scalar_type(t: Any) -> str:
    types = {"integer": "number", "number": "number", "string": "string", "boolean": "boolean", "null": "null",
             "array": "any[]", "object": "object"}
    return types.get(t, "any") if type(t) is str else "any"


def _ts_type(schema: Any, indent: str) -> str:
    if type(schema) is not dict:
        return "any"
    if "enum" in schema:
        enum = _sequence(schema["enum"])
        if enum:
            return " | ".join(_tojson(value) for value in enum)
    if "const" in schema:
        return _tojson(schema["const"])
    if "anyOf" in schema or "oneOf" in schema:
        choices = schema["anyOf"] if "anyOf" in schema else schema["oneOf"]
        if type(choices) is not list:
            raise _Declined  # the template iterates it whatever it is
        return " | ".join(_ts_type(choice, indent) for choice in choices)
    kind = schema.get("type")
    kinds = _sequence(kind)  # None without a type
    if kinds is not None:
        return " | ".join(_scalar_type(t) for t in kinds)
    # A missing "items" key reads as dict.items in Jinja (attribute fallback): defined, but not a mapping.
    if kind == "array" and type(schema.get("items")) is dict:
        item = _ts_type(schema["items"], indent)
        return f"({item})[]" if " | " in item and not item.endswith("}") else f"{item}[]"
    properties = schema.get("properties")
    if kind == "object" and type(properties) is dict and properties:
        inner = indent + "    "
        return "{\n" + _ts_properties(schema, inner) + inner + "}"
    return _scalar_type(kind)  # "any" without a type


def _ts_properties(schema: dict, indent: str) -> str:
    required = (_sequence(schema["required"]) if "required" in schema else None) or []
    out = []
    for name, prop in schema["properties"].items():
        if type(name) is not str:
            raise _Declined
        is_map = type(prop) is dict
        if is_map and prop.get("description"):
            out.append(_comment_lines(prop["description"], indent))
        examples = _sequence(prop["examples"]) if is_map and "examples" in prop else None
        if examples:
            out.append(f"{indent}// Examples:\n")
            out.extend(f"{indent}// - {_tojson(example)}\n" for example in examples)
        out.append(f"{indent}{name}{'' if name in required else '?'}: {_ts_type(prop, indent)},")
        if is_map and "default" in prop:
            default = prop["default"]
            out.append(f" // default: {default if type(default) is str else _tojson(default)}")
        out.append("\n")
    return "".join(out)


def ts_tool(tool: dict) -> str | None:
    """The template's `ts_tool` macro in Python, or None where unsure to match it (non-JSON types, a mapping
    where the template iterates a list): Jinja then. `tests/test_direct_render.py` holds the two equal."""
    if type(tool) is not dict or not _plain_json(tool):
        return None
    fn = tool.get("function", tool)
    if type(fn) is not dict or type(fn.get("name")) is not str:
        return None
    try:
        head = _comment_lines(fn["description"], "") if fn.get("description") else ""
        params = fn.get("parameters")
        params = params if type(params) is dict else {}
        properties = params.get("properties")
        if type(properties) is dict and properties:
            return f"{head}type {fn['name']} = (_: {{\n{_ts_properties(params, '')}}}) => any;"
        return f"{head}type {fn['name']} = () => any;"
    except (_Declined, RecursionError):
        return None
