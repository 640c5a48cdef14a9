"""gpt-oss Harmony (rendered text or openai-harmony JSON) → Beam messages, read strictly: a cut-off or malformed
message is rejected with its reason, never guessed at (docs/formats.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.typescript import TypeScriptError, parse_namespaces
from beam_sft.records.messages import function_tool, parse_arguments, record
from beam_sft.records.types import BeamRecord, Message, ToolCall, ToolSpec, json_type, wrong_type

DEFAULT_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
_EFFORTS = {"low", "medium", "high"}
_TERM_RE = re.compile(r"<\|(end|call|return)\|>")
_BODY_MARKER_RE = re.compile(r"<\|(?:start|channel|constrain|message)\|>")
_TOOL_AUTHOR_RE = re.compile(r"^[A-Za-z_][\w\-]*(?:\.[\w\-]+)*$")
_REASONING_RE = re.compile(r"^reasoning:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_SYSTEM_BOILERPLATE = re.compile(
    r"^(knowledge cutoff:|current date:|reasoning:|# valid channels:|calls to these tools must go to)", re.IGNORECASE
)
_JSON_STRING_FIELDS = ("channel", "recipient", "content_type")  # openai-harmony message fields besides role/name
PYTHON_TOOL_PARAMETERS = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}


@dataclass(slots=True)
class HMsg:
    """One Harmony message; `terminator` None: cut off; `parts`: openai-harmony system/developer content."""

    index: int
    author: str
    recipient: str | None
    channel: str | None
    body: str
    terminator: str | None
    parts: list | None = None


def _parse_header(header: str, k: int) -> tuple[str, str | None, str | None]:
    """A message header → (author, recipient, channel); a content type is checked, not kept."""
    constrain = None
    if "<|constrain|>" in header:
        header, constrain = header.split("<|constrain|>", 1)
        constrain = constrain.strip()
        if "<|" in constrain:
            raise RecordError(Reason.BAD_HARMONY, f"malformed header after <|constrain|>: {constrain!r}",
                              message_index=k)
    if header.count("<|channel|>") > 1:
        raise RecordError(Reason.BAD_HARMONY, "header with two <|channel|> markers", message_index=k)
    role_part, has_channel, chan_part = header.partition("<|channel|>")
    if "<|" in role_part or "<|" in chan_part:
        raise RecordError(Reason.BAD_HARMONY, f"unexpected marker in header {header!r}", message_index=k)
    words, cwords = role_part.split(), chan_part.split()
    if not words:
        raise RecordError(Reason.BAD_HARMONY, "message without an author", message_index=k)
    if has_channel and not cwords:
        raise RecordError(Reason.BAD_HARMONY, "empty channel name", message_index=k)
    recipient = next((w[3:] for w in reversed(words[1:]) if w.startswith("to=")), None)
    extra = [w for w in words[1:] if not w.startswith("to=")]
    for w in cwords[1:]:  # "<|channel|>commentary to=functions.X"
        if not w.startswith("to="):
            extra.append(w)
        elif recipient is not None:
            raise RecordError(Reason.BAD_HARMONY, "two recipients in one header", message_index=k)
        else:
            recipient = w[3:]
    # one extra word: a content type without <|constrain|> ("to=browser.search code")
    if extra and (constrain is not None or len(extra) > 1):
        raise RecordError(Reason.BAD_HARMONY, f"unexpected words in header: {' '.join(extra)!r}", message_index=k)
    if recipient == "":
        raise RecordError(Reason.BAD_HARMONY, "empty recipient after 'to='", message_index=k)
    return words[0], recipient, cwords[0] if has_channel else None


def parse_text(text: str) -> list[HMsg]:
    """Rendered Harmony text → messages, strictly (what is rejected: docs/formats.md)."""
    if not isinstance(text, str):
        raise RecordError(Reason.BAD_HARMONY, f"text is {json_type(text)}, not a string")
    head = text.lstrip()
    if head.startswith("<|channel|>"):
        text = "<|start|>assistant" + head
    elif not head.startswith("<|start|>"):
        if "<|start|>" not in text and "<|channel|>" not in text:
            raise RecordError(Reason.BAD_HARMONY, "no Harmony messages in the text")
        raise RecordError(Reason.BAD_HARMONY, f"text before the first <|start|>: {head[:40]!r}")
    segments = text.split("<|start|>")[1:]
    out: list[HMsg] = []
    last = len(segments) - 1
    for idx, seg in enumerate(segments):
        header, sep, rest = seg.partition("<|message|>")
        if not sep:
            if idx == last and header.strip() == "assistant":
                break  # generation prompt
            if idx == last:
                raise RecordError(Reason.TRUNCATED_MESSAGE, f"text ends inside the header {header.strip()!r}",
                                  message_index=idx)
            raise RecordError(Reason.BAD_HARMONY, f"message header {header.strip()[:40]!r} has no <|message|>",
                              message_index=idx)
        author, recipient, channel = _parse_header(header, idx)
        if (m := _TERM_RE.search(rest)) is None:
            body, term, tail = rest, None, ""
            if idx != last:
                raise RecordError(Reason.TRUNCATED_MESSAGE, "message has no terminator before the next <|start|>",
                                  message_index=idx)
        else:
            body, term, tail = rest[: m.start()], m.group(0), rest[m.end():]
        if bad := _BODY_MARKER_RE.search(body):
            raise RecordError(Reason.BAD_HARMONY, f"{bad.group(0)} inside a message body", message_index=idx)
        if tail.strip():
            raise RecordError(Reason.BAD_HARMONY, f"text after {term} outside any message: {tail.strip()[:40]!r}",
                              message_index=idx)
        out.append(HMsg(idx, author, recipient, channel, body, term))
    return out


def parse_json_messages(msgs: list) -> list[HMsg]:
    out = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RecordError(Reason.BAD_HARMONY, "message is not an object", message_index=k)
        role = m.get("role")
        author = m.get("name") if role == "tool" and m.get("name") else role
        if not isinstance(author, str):
            what = f"tool name {author!r}" if role == "tool" else f"role {role!r}"
            raise RecordError(Reason.UNKNOWN_ROLE, f"unknown {what}", message_index=k)
        for key in _JSON_STRING_FIELDS:
            value = m.get(key)
            if value is not None and type(value) is not str:
                raise wrong_type(Reason.BAD_HARMONY, key, value, "a string", k)
        if isinstance(content := m.get("content"), str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise RecordError(Reason.BAD_CONTENT, "content is not a list of parts", message_index=k)
        texts, parts = [], []
        for j, p in enumerate(content):
            ptype = p.get("type") if isinstance(p, dict) else None
            if type(ptype) is not str:
                raise RecordError(Reason.BAD_CONTENT, f"content part {j} has no type string", message_index=k)
            if ptype == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif ptype in ("system_content", "developer_content"):
                parts.append(p)
            else:
                raise RecordError(Reason.UNSUPPORTED_CONTENT_PART, f"content part {j} has type {ptype!r}",
                                  message_index=k)
        out.append(HMsg(k, author, m.get("recipient"), m.get("channel"), "".join(texts), "<|end|>", parts))
    return out


def _tools_from_namespace_dict(tools: Any, k: int) -> list[ToolSpec]:
    """openai-harmony's ``{"functions": {"name", "tools": [...]}, "browser": {...}}`` → OpenAI tools."""
    out = []
    if not tools:
        return out
    if not isinstance(tools, dict):
        raise RecordError(Reason.BAD_TOOL_SCHEMA, "tools is not an object of namespaces", message_index=k)
    for ns_key, ns in tools.items():
        if not isinstance(ns, dict):
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"namespace {ns_key!r} is not an object", message_index=k)
        ns_name = ns.get("name", ns_key)
        ns_tools = ns.get("tools") or []
        if type(ns_name) is not str or type(ns_tools) is not list:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"namespace {ns_key!r} needs a string name and a list of "
                              "tools", message_index=k)
        for t in ns_tools:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise RecordError(Reason.BAD_TOOL_SCHEMA, f"a tool of namespace {ns_name!r} has no name",
                                  message_index=k)
            out.append(function_tool(t["name"] if ns_name == "functions" else f"{ns_name}.{t['name']}",
                                     t.get("description"), t.get("parameters") or {"type": "object", "properties": {}}))
        if ns_name == "python" and not ns_tools:
            description = ns.get("description")
            if description is not None and type(description) is not str:
                raise RecordError(Reason.BAD_TOOL_SCHEMA, "python tool description is not a string",
                                  message_index=k)
            out.append(function_tool("python", description, PYTHON_TOOL_PARAMETERS))
    return out


def _sections(body: str) -> list[tuple[str | None, str]]:
    """Split a message body at top-level ``# Heading`` lines → [(heading or None, text)]."""
    out: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in body.split("\n"):
        if line.startswith("# "):
            out.append((line[2:].strip(), []))
        else:
            out[-1][1].append(line)
    return [(h, "\n".join(lines).strip("\n")) for h, lines in out if h is not None or "".join(lines).strip()]


def _tools_section(text: str, k: int) -> list[ToolSpec]:
    """A ``# Tools`` section: ``## name`` subsections holding a TypeScript namespace, or (python) prose."""
    tools: list[ToolSpec] = []
    subs = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    if subs[0].strip():
        raise RecordError(Reason.BAD_TOOL_SCHEMA, "text before the first '## namespace' in # Tools", message_index=k)
    for name, sub in zip(subs[1::2], subs[2::2], strict=True):
        name = name.strip()
        if "namespace " in sub:
            start = sub.index("namespace ")
            preamble = sub[:start]
            if preamble.strip() and not all(ln.startswith("//") for ln in preamble.strip().splitlines()):
                raise RecordError(Reason.BAD_TOOL_SCHEMA, f"unexpected text before namespace {name!r}",
                                  message_index=k)
            try:
                tools.extend(parse_namespaces(sub[start:]))
            except TypeScriptError as err:
                raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tool namespace {name!r} does not parse: {err}",
                                  message_index=k) from None
        elif name == "python":
            tools.append(function_tool("python", sub.strip(), PYTHON_TOOL_PARAMETERS))
        else:
            raise RecordError(Reason.BAD_TOOL_SCHEMA, f"tool section {name!r} has no namespace declaration",
                              message_index=k)
    return tools


def _system(m: HMsg, kwargs: dict, tools: list[ToolSpec]) -> None:
    if m.parts:
        for p in m.parts:
            if p.get("type") != "system_content":
                continue
            if (effort := p.get("reasoning_effort")) is not None:
                _set_effort(str(effort), kwargs, m.index)
            identity = p.get("model_identity")
            if identity is not None and type(identity) is not str:
                raise wrong_type(Reason.BAD_TEMPLATE_KWARGS, "model_identity", identity, "a string", m.index)
            if identity and identity != DEFAULT_IDENTITY:
                kwargs["model_identity"] = identity
            tools.extend(_tools_from_namespace_dict(p.get("tools"), m.index))
        return
    for heading, text in _sections(m.body):
        if heading is None:
            rest = [ln for ln in text.split("\n") if ln.strip() and not _SYSTEM_BOILERPLATE.match(ln)]
            if rest and rest[0] != DEFAULT_IDENTITY:
                kwargs["model_identity"] = "\n".join(rest)
            elif len(rest) > 1:
                raise RecordError(Reason.BAD_HARMONY, f"unexpected system text: {rest[1][:40]!r}",
                                  message_index=m.index)
        elif heading == "Tools":
            tools.extend(_tools_section(text, m.index))
    if found := _REASONING_RE.findall(m.body):
        _set_effort(found[-1], kwargs, m.index)


def _set_effort(value: str, kwargs: dict, k: int) -> None:
    effort = value.strip().lower()
    if effort not in _EFFORTS:
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, f"unknown reasoning effort {value!r}", message_index=k)
    kwargs["reasoning_effort"] = effort


def _developer(m: HMsg, tools: list[ToolSpec]) -> str:
    if m.parts:
        texts = []
        for p in m.parts:
            if p.get("type") != "developer_content":
                continue
            instructions = p.get("instructions")
            if instructions is not None and type(instructions) is not str:
                raise RecordError(Reason.BAD_CONTENT, f"developer instructions are {json_type(instructions)}, "
                                  "not a string", message_index=m.index)
            if instructions:
                texts.append(instructions)
            tools.extend(_tools_from_namespace_dict(p.get("tools"), m.index))
        return "\n\n".join(texts)
    # Everything but the `# Tools` section is kept verbatim: instructions may hold `# ` lines of their own,
    # so cutting the body into sections and joining them again would change the text.
    lines = m.body.split("\n")
    tools_at = [i for i, line in enumerate(lines) if line.startswith("# ") and line[2:].strip() == "Tools"]
    if tools_at:
        start = tools_at[-1]
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("# ")), len(lines))
        tools.extend(_tools_section("\n".join(lines[start + 1 : end]).strip("\n"), m.index))
        lines = lines[:start] + lines[end:]
    text = "\n".join(lines).strip("\n")
    heading, _, rest = text.partition("\n")
    return rest.strip("\n") if heading.startswith("# ") and heading[2:].strip() == "Instructions" else text


def _call(m: HMsg, recipient: str) -> ToolCall:
    """An assistant message addressed to a tool → its Beam tool call."""
    k = m.index
    if m.terminator is None:
        raise RecordError(Reason.UNTERMINATED_CALL, f"call to {recipient} is cut off before <|call|>", message_index=k)
    if m.terminator == "<|return|>":
        raise RecordError(Reason.BAD_HARMONY, f"call to {recipient} ends with <|return|>", message_index=k)
    name = recipient.removeprefix("functions.")
    python = name == "python" or name.startswith("python.")
    args = {"code": m.body} if python else parse_arguments(m.body.strip(), message_index=k, name=name)
    return {"type": "function", "function": {"name": name, "arguments": args}}


def assemble(hmsgs: list[HMsg]) -> BeamRecord:
    """Parsed Harmony messages → an unvalidated Beam record (the mapping: docs/decisions.md)."""
    out: list[Message] = []
    src: list[int] = []
    kwargs: dict = {}
    tools: list[ToolSpec] = []
    cur: Message | None = None  # the assistant message being built
    seen_other = False

    def add(msg: Message) -> Message:
        out.append(msg)
        src.append(k)
        return msg

    for m in hmsgs:
        k, author = m.index, m.author
        if author == "system":
            if seen_other:
                raise RecordError(Reason.LATE_SYSTEM, "system message after the conversation started",
                                  message_index=k)
            _system(m, kwargs, tools)
            continue
        if author == "developer":
            if text := _developer(m, tools):
                add({"role": "system", "content": text})
            continue
        seen_other = True
        if author == "user":
            cur = None
            if m.terminator is None:
                raise RecordError(Reason.TRUNCATED_MESSAGE, "user message is cut off", message_index=k)
            add({"role": "user", "content": m.body})
            continue
        if author == "assistant":
            if (recipient := m.recipient) and recipient not in ("assistant", "user"):
                call = _call(m, recipient)
                if cur is None or cur["content"]:
                    cur = add({"role": "assistant", "reasoning_content": "", "content": ""})
                cur.setdefault("tool_calls", []).append(call)
                continue
            channel = m.channel
            if m.terminator is None:
                raise RecordError(Reason.TRUNCATED_MESSAGE, f"assistant {channel or ''} message is cut off",
                                  message_index=k)
            if channel not in ("analysis", "commentary", "final", None):
                raise RecordError(Reason.BAD_HARMONY, f"unknown channel {channel!r}", message_index=k)
            if cur is None or cur["content"] or cur.get("tool_calls"):
                cur = add({"role": "assistant", "reasoning_content": "", "content": ""})
            if channel == "final" or channel is None:
                cur["content"] = m.body
            else:
                r = cur["reasoning_content"]
                cur["reasoning_content"] = f"{r}\n\n{m.body}" if r else m.body
            continue
        if _TOOL_AUTHOR_RE.match(author):
            cur = None
            if m.terminator is None:
                raise RecordError(Reason.TRUNCATED_MESSAGE, f"result of {author} is cut off", message_index=k)
            add({"role": "tool", "name": author.removeprefix("functions."), "content": m.body})
            continue
        raise RecordError(Reason.UNKNOWN_ROLE, f"unknown author {author!r}", message_index=k)
    if not seen_other and hmsgs:
        raise RecordError(Reason.EMPTY_CONVERSATION, "only system/developer messages: a prompt header, no "
                          "conversation")
    rec = record(out, tools or None, kwargs or None)
    rec["_src"] = src
    return rec


def convert(rec: Any) -> BeamRecord:
    """One Harmony record (rendered text or openai-harmony JSON) → a Beam record (not yet validated)."""
    if isinstance(rec, str):
        return assemble(parse_text(rec))
    if not isinstance(rec, dict):
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is {json_type(rec)}, not an object")
    if isinstance(text := rec.get("text"), str):
        return assemble(parse_text(text))
    if isinstance(msgs := rec.get("messages"), str):
        try:
            msgs = orjson.loads(msgs)
        except orjson.JSONDecodeError:
            return assemble(parse_text(msgs))
        if isinstance(msgs, dict):
            msgs = msgs.get("messages")
    if isinstance(msgs, list):
        return assemble(parse_json_messages(msgs))
    raise RecordError(Reason.UNKNOWN_FORMAT, "no Harmony 'text' and no openai-harmony 'messages'")
