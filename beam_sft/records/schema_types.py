"""Python / xLAM type names in tool schemas (``"str"``, ``"List[int]"``, ``"type": "dict"``) → JSON Schema types,
which the Beam template renders and the response parser casts back, where it would render an unknown type as
``any``. See docs/decisions.md ("xLAM parameter types")."""

from __future__ import annotations

import re
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.records.types import json_type as type_words
from beam_sft.records.types import wrong_type

_SCHEMA_KEYWORDS = frozenset(("type", "properties", "additionalProperties", "required", "anyOf", "oneOf", "allOf",
                              "$schema", "$defs", "definitions", "$ref"))
JSON_SCHEMA_TYPES = frozenset(("string", "integer", "number", "boolean", "array", "object", "null"))

_SIMPLE = {
    "str": "string", "string": "string", "text": "string",
    "int": "integer", "integer": "integer", "long": "integer",
    "float": "number", "number": "number", "double": "number", "decimal": "number",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "tuple": "array", "set": "array", "sequence": "array",
    "dict": "object", "object": "object", "mapping": "object", "map": "object",
    "none": "null", "null": "null", "nonetype": "null",
}
_GENERIC = re.compile(r"^(\w+)\s*\[(.*)\]$", re.DOTALL)


def _split_args(inner: str) -> list[str]:
    """`Dict[str, List[int]]` → ["str", "List[int]"]: split on top-level commas."""
    out, depth, start = [], 0, 0
    for k, c in enumerate(inner):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(inner[start:k].strip())
            start = k + 1
    out.append(inner[start:].strip())
    return [a for a in out if a]


def json_type(spec: str, depth: int = 0) -> tuple[dict, bool]:
    """An xLAM / Python type name (``int``, ``List[str]``, ``str, optional``) → (JSON Schema fragment, optional);
    an unknown name gives no ``type`` (any value). The table: docs/decisions.md ("xLAM parameter types")."""
    s = spec.strip()
    optional = False
    if depth > 20:
        return {}, optional
    low = s.lower()
    if low.endswith((", optional", ",optional")):
        s, optional = s[:s.rfind(",")].strip(), True
    elif low == "optional":
        return {}, True
    m = _GENERIC.match(s)
    if m:
        head, args = m.group(1).lower(), _split_args(m.group(2))
        if head == "optional" and args:
            inner, _ = json_type(args[0], depth + 1)
            return inner, True
        if head == "union":
            return _union(args, depth), optional or any(a.lower() in ("none", "nonetype") for a in args)
        base = _SIMPLE.get(head)
        if base == "array":
            out: dict = {"type": "array"}
            if head in ("list", "set", "sequence") and len(args) == 1:
                items, _ = json_type(args[0], depth + 1)
                if items:
                    out["items"] = items
            return out, optional
        return ({"type": base} if base else {}), optional
    if "|" in s:
        args = [a.strip() for a in s.split("|") if a.strip()]
        return _union(args, depth), optional or any(a.lower() in ("none", "nonetype") for a in args)
    base = _SIMPLE.get(s.lower())
    return ({"type": base} if base else {}), optional


def _union(args: list[str], depth: int) -> dict:
    types = []
    for a in args:
        if a.lower() in ("none", "nonetype"):
            continue
        frag, _ = json_type(a, depth + 1)
        if set(frag) != {"type"} or type(frag["type"]) is not str:
            return {}
        if frag["type"] not in types:
            types.append(frag["type"])
    if not types:
        return {}
    return {"type": types[0] if len(types) == 1 else types}


def standardize(schema: Any, depth: int = 0) -> Any:
    """A JSON Schema whose ``type`` names outside JSON Schema (``int``, ``dict``, ``List[str]``) are mapped by
    `json_type`, in the schema positions (properties, items, anyOf/oneOf/allOf, additionalProperties). Returns
    the same object when nothing needed mapping (no copy: the common case costs a walk), else a mapped copy;
    anything that is not a schema is returned as is."""
    if type(schema) is not dict or depth > 64:
        return schema
    changed: dict[str, Any] = {}  # sub-schemas that needed mapping
    props = schema.get("properties")
    if type(props) is dict:
        for k, v in props.items():
            if (mapped := standardize(v, depth + 1)) is not v:  # copied only when a property changes
                changed.setdefault("properties", dict(props))[k] = mapped
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if type(sub) is dict and (mapped_sub := standardize(sub, depth + 1)) is not sub:
            changed[key] = mapped_sub
    for key in ("anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        if type(subs) is list:
            mapped_list = [standardize(x, depth + 1) for x in subs]
            if any(a is not b for a, b in zip(mapped_list, subs)):
                changed[key] = mapped_list
    t = schema.get("type")
    if type(t) is not str or t in JSON_SCHEMA_TYPES:
        return {**schema, **changed} if changed else schema
    frag, _ = json_type(t)
    out = {}
    for k, v in schema.items():  # key order kept; an unknown type name is dropped (any value)
        if k != "type":
            out[k] = changed.get(k, v)
        elif "type" in frag:
            out["type"] = frag["type"]
            if "items" in frag and "items" not in schema:
                out["items"] = frag["items"]
    return out


def is_xlam_map(params: Any) -> bool:
    """A flat xLAM parameter map rather than a JSON Schema object: no ``type``/``properties`` at the top, and
    every entry an object (a parameter spec)."""
    return type(params) is dict and bool(params) and _SCHEMA_KEYWORDS.isdisjoint(params) \
        and all(type(v) is dict for v in params.values())


def parameters_schema(params: Any, name: str = "?", index: int = 0) -> dict:
    """A tool's ``parameters`` as JSON Schema: xLAM's flat map (``{"p": {"type": "str, optional", "description",
    "default", "required"?}}``) is converted (a default or ``optional`` → not required, unless ``required:
    true``; in a map that marks any parameter ``required``, an unmarked one is not required); a schema that is one already only gets its type names mapped (`standardize`)."""
    if params is None:
        return {"type": "object", "properties": {}}
    if type(params) is not dict:
        raise wrong_type(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] ({name}): parameters", params, "an object")
    if type(params.get("properties")) is dict:
        return standardize(params)
    props: dict = {}
    required: list[str] = []
    # a map that marks parameters `required` (ToolAlpaca, API-Bank) marks them all: the others are optional
    marked = any(type(spec) is dict and "required" in spec for spec in params.values())
    for pname, spec in params.items():
        if type(spec) is not dict:
            raise wrong_type(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] ({name}): parameter {pname!r}", spec, "an object")
        ptype = spec.get("type")
        if ptype is None:
            frag, optional = {}, False
        elif type(ptype) is str:
            frag, optional = json_type(ptype)
        else:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tools[{index}] ({name}): type of parameter {pname!r} "
                              f"is {type_words(ptype)}, not a string")
        prop = dict(frag)
        desc = spec.get("description")
        if type(desc) is str and desc:
            prop["description"] = desc
        if "default" in spec:
            prop["default"] = spec["default"]
        for key in ("enum", "items", "properties"):
            if key in spec and key not in prop:
                prop[key] = spec[key]
        flag = spec.get("required")
        if flag is True or (flag is None and not marked and not optional and "default" not in spec):
            required.append(pname)
        props[pname] = prop
    schema: dict = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return standardize(schema)  # enum/items/properties copied from a spec may hold Python type names too
