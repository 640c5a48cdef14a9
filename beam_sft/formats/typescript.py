"""Parse the TypeScript-like tool declarations of a gpt-oss Harmony prompt back into OpenAI function schemas
by recursive descent; what it does not understand is a `TypeScriptError` with the line (docs/formats.md)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from beam_sft.records.messages import function_tool
from beam_sft.records.types import ToolSpec


class TypeScriptError(ValueError):
    pass


_TOKEN_RE = re.compile(
    r"""(?P<ws>[ \t\r]+)
      |(?P<nl>\n)
      |(?P<comment>//[^\n]*)
      |(?P<arrow>=>)
      |(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      |(?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
      |(?P<ident>[A-Za-z_$][\w$]*)
      |(?P<punct>[{}()\[\]:;,|?=<>&])
    """,
    re.VERBOSE,
)


class _Tok(NamedTuple):
    kind: str
    text: str
    line: int
    newline_before: bool


def _tokenize(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos, line, nl = 0, 1, True
    while pos < len(src):
        if not (m := _TOKEN_RE.match(src, pos)):
            raise TypeScriptError(f"line {line}: unexpected character {src[pos]!r}")
        kind = m.lastgroup
        if kind == "nl":
            line += 1
            nl = True
        elif kind != "ws":
            toks.append(_Tok(kind, m.group(), line, nl))
            nl = False
        pos = m.end()
    toks.append(_Tok("eof", "", line, True))
    return toks


def _literal(text: str) -> Any:
    """A string or number literal token as its value; one JSON can't read is a `TypeScriptError`."""
    if text.startswith("'"):
        return text[1:-1].replace("\\'", "'")
    try:
        return json.loads(text)
    except ValueError as err:
        raise TypeScriptError(f"bad literal {text[:40]!r}: {err}") from None


def _default_value(text: str) -> Any:
    text = text.strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # json.loads recurses per nesting level
        return text


def _description(lines: list[str]) -> dict[str, Any]:
    """Comment lines → {"description"?, "examples"?, "default"?}. gpt-oss writes `// default: X` on its own
    line for a property whose type spans several lines (a one-of), so that form is read here too."""
    desc, found = [], {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "Examples:":
            found["examples"] = []
            i += 1
            while i < len(lines) and lines[i].startswith("- "):
                found["examples"].append(_default_value(lines[i][2:]))
                i += 1
            continue
        if line.startswith("default: ") and i == len(lines) - 1:
            found["default"] = _default_value(line[len("default: "):])
        else:
            desc.append(line)
        i += 1
    text = "\n".join(desc).strip("\n")
    return {"description": text, **found} if text else found


# Types nest by recursion (objects, parentheses, unions, Array<>): deeper than this is an error, not a crash.
MAX_NESTING = 100


class _Parser:
    def __init__(self, src: str):
        self.toks = _tokenize(src)
        self.i = 0
        self.depth = 0

    # -- token helpers
    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def accept(self, text: str) -> bool:
        """Take the next token when it is `text`."""
        if self.peek().text != text:
            return False
        self.i += 1
        return True

    def expect(self, text: str) -> _Tok:
        t = self.next()
        if t.text != text:
            raise TypeScriptError(f"line {t.line}: expected {text!r}, found {t.text or 'end of text'!r}")
        return t

    def ident(self, error: str) -> str:
        t = self.next()
        if t.kind != "ident":
            raise TypeScriptError(f"line {t.line}: {error}")
        return t.text

    def comments(self) -> list[str]:
        out = []
        while self.peek().kind == "comment":
            out.append(self.next().text[2:].removeprefix(" "))
        return out

    def trailing_comment(self, line: int) -> str | None:
        t = self.peek()
        if t.kind == "comment" and not t.newline_before and t.line == line:
            self.next()
            return t.text[2:].strip()
        return None

    # -- grammar
    def namespace(self) -> list[ToolSpec]:
        self.expect("namespace")
        ns = self.ident("namespace without a name")
        self.expect("{")
        tools = []
        while True:
            desc = self.comments()
            t = self.peek()
            if t.text == "}":
                self.trailing_comment(self.next().line)
                return tools
            if t.text != "type":
                raise TypeScriptError(f"line {t.line}: expected 'type' or '}}', found {t.text or 'end of text'!r}")
            tools.append(self.declaration(ns, desc))

    def declaration(self, ns: str, desc_lines: list[str]) -> ToolSpec:
        self.expect("type")
        tool = self.ident("tool without a name")
        self.expect("=")
        self.expect("(")
        params: dict[str, Any] = {"type": "object", "properties": {}}
        if self.peek().text != ")":
            self.expect("_")
            self.expect(":")
            self.comments()  # "(_: // params object" – a comment on the parameter object itself
            params = self.object_type()
        self.expect(")")
        self.expect("=>")
        self.ident("expected a return type after '=>'")
        self.expect(";")
        name = tool if ns == "functions" else f"{ns}.{tool}"
        return function_tool(name, _description(desc_lines).get("description"), params)

    def object_type(self) -> dict:
        self.expect("{")
        props: dict[str, Any] = {}
        required: list[str] = []
        while True:
            lines = self.comments()
            if self.accept("}"):
                break
            name_tok = self.next()
            if name_tok.kind not in ("ident", "string"):
                raise TypeScriptError(f"line {name_tok.line}: expected a property name, found {name_tok.text!r}")
            name = _literal(name_tok.text) if name_tok.kind == "string" else name_tok.text
            optional = self.accept("?")
            self.expect(":")
            schema = self.union()
            sep = self.peek()
            if sep.text in (",", ";"):
                self.next()
            elif sep.text != "}":
                raise TypeScriptError(f"line {sep.line}: expected ',' after property {name!r}, found {sep.text!r}")
            trailing = self.trailing_comment(sep.line if sep.text in (",", ";") else name_tok.line)
            found = _description(lines)
            out: dict[str, Any] = {"description": found.pop("description")} if "description" in found else {}
            out |= schema | found
            if trailing is not None:
                if trailing.startswith("default: "):
                    out["default"] = _default_value(trailing[len("default: "):])
                else:
                    out["description"] = f"{out['description']}\n{trailing}" if "description" in out else trailing
            props[name] = out
            if not optional:
                required.append(name)
        schema: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            schema["required"] = required
        return schema

    def union(self) -> dict:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TypeScriptError(f"line {self.peek().line}: types nested deeper than {MAX_NESTING} levels")
        variants: list[dict] = []
        try:
            self.comments()
            self.accept("|")  # a leading '|' starts a multi-line one-of
            while True:
                self.comments()
                term = self.term()
                if (note := self.trailing_comment(self.toks[self.i - 1].line)) is not None:
                    term = dict(term)
                    if note.startswith("default: "):
                        term["default"] = _default_value(note[len("default: "):])
                    else:
                        term["description"] = note
                variants.append(term)
                self.comments()
                if not self.accept("|"):
                    return _merge_union(variants)
        finally:
            self.depth -= 1

    def term(self) -> dict:
        t = self.next()
        if t.text == "{":
            self.i -= 1
            schema = self.object_type()
        elif t.text == "(":
            schema = self.union()
            self.expect(")")
        elif t.kind == "string" or t.kind == "number":
            schema = {"const": _literal(t.text)}
        elif t.kind == "ident":
            if t.text in ("string", "number", "boolean", "null", "object"):
                schema = {"type": t.text}
            elif t.text == "any":
                schema = {}
            elif t.text in ("true", "false"):
                schema = {"const": t.text == "true"}
            elif t.text == "Array" and self.accept("<"):
                items = self.union()
                self.expect(">")
                schema = {"type": "array", "items": items}
            else:
                raise TypeScriptError(f"line {t.line}: unknown type {t.text!r}")
        else:
            raise TypeScriptError(f"line {t.line}: expected a type, found {t.text or 'end of text'!r}")
        while self.peek().text == "[" and self.peek(1).text == "]":
            self.i += 2
            schema = {"type": "array", "items": schema}
        return schema


def _merge_union(variants: list[dict]) -> dict:
    if len(variants) == 1:
        return variants[0]
    has_null = {"type": "null"} in variants
    rest = [v for v in variants if v != {"type": "null"}]
    if all(set(v) == {"const"} for v in rest):  # "a" | "b" (| null): an enum
        values = [v["const"] for v in rest]
        if all(type(v) is str for v in values):
            return {"type": ["string", "null"], "enum": [*values, None]} if has_null else {"type": "string",
                                                                                         "enum": values}
        return {"enum": [*values, None] if has_null else values}
    if all(set(v) == {"type"} and isinstance(v["type"], str) for v in variants):  # string | number
        return {"type": [v["type"] for v in variants]}
    if has_null and len(rest) == 1 and isinstance(rest[0].get("type"), str):  # T | null, T with details
        return {**rest[0], "type": [rest[0]["type"], "null"]}
    return {"anyOf": variants}


def parse_namespaces(src: str) -> list[ToolSpec]:
    """All ``namespace X {…}`` blocks → OpenAI tools (``functions.f`` is ``f``; others ``browser.search``)."""
    parser, tools = _Parser(src), []
    while True:
        parser.comments()
        if parser.peek().kind == "eof":
            return tools
        tools.extend(parser.namespace())
