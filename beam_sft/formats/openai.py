"""OpenAI chat messages → Beam messages.

Accepted shapes (one record):

* ``{"messages": [...]}`` (or ``"history"``, as SWE-agent trajectories store it), with optional record-level
  ``tools`` (a list, or a JSON string of one) or legacy ``functions``, ``chat_template_kwargs`` and
  ``reasoning_effort``;
* content as a string, ``null``, or a list of parts: text parts (``text`` / ``input_text`` /
  ``output_text``, text under ``text`` or ``value``) are joined with no separator; any other part
  (image, audio, file) rejects the record (`unsupported_content_part`);
* assistant ``tool_calls`` with JSON-string or object ``arguments``; legacy ``function_call``; role
  ``function`` results; reasoning in ``reasoning_content``, ``reasoning`` or ``thinking`` (first non-empty),
  else a leading ``<think>…</think>`` block of the content;
* LLaMA-Factory "v1" content parts: ``reasoning``, ``tool_call`` (one JSON call), ``tool_calls`` (a JSON list),
  a system ``tools`` part, and a tool message whose text is a JSON list holding one result per parallel call.

Not converted, each rejected with a reason: preference pairs (``chosen``/``rejected``), KTO rows labelled
undesirable (``label: false``: training on them would teach the rejected answer), and rows with
``images`` / ``videos`` / ``audios`` (Beam is text only).

Pairing tool results with calls, merging consecutive assistant messages and folding content said before
calls into the reasoning happen in `beam_sft.validate.rules`, shared by every format.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.toolmarkup import lift, scan
from beam_sft.records.messages import (
    EFFORT_LABELS,
    MAX_JSON_DEPTH,
    nests_deeper,
    normalize_tools,
    openai_tool_call,
    split_think,
    text_of,
    tool_call,
    tool_content,
    tools_json,
)
from beam_sft.records.messages import (
    record as beam_record,
)

_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
_BAD_CALL_NAME = re.compile(r"\s|<\|")
_MEDIA_KEYS = ("images", "videos", "audios")
_V1_ASSISTANT_PARTS = ("reasoning", "tool_call", "tool_calls")
# Record keys that need a closer look before converting (one set intersection in the common case).
_SPECIAL_KEYS = frozenset(("chosen", "rejected", "chosen_messages", "rejected_messages", "label", *_MEDIA_KEYS))


def reject_unsupported_record(rec: dict) -> None:
    """Record-level shapes no format converts: preference data, undesirable KTO rows, multimodal rows."""
    if _SPECIAL_KEYS.isdisjoint(rec):
        return
    if "chosen" in rec or "rejected" in rec or "chosen_messages" in rec or "rejected_messages" in rec:
        raise RecordError(Reason.UNKNOWN_FORMAT, "preference record (chosen/rejected): not a single conversation")
    if rec.get("label") is False:
        raise RecordError(Reason.UNKNOWN_FORMAT, "KTO record labelled undesirable (label=false): its answer "
                          "must not be trained on")
    for key in _MEDIA_KEYS:
        if rec.get(key):
            raise RecordError(Reason.UNSUPPORTED_CONTENT_PART, f"record has {key}; Beam is text only")


def record_kwargs(rec: dict) -> dict | None:
    kwargs = rec.get("chat_template_kwargs")
    if type(kwargs) is dict and "reasoning_effort" not in rec:
        return kwargs or None
    if kwargs is not None and not isinstance(kwargs, dict):
        if isinstance(kwargs, str) and kwargs.strip():
            try:
                kwargs = orjson.loads(kwargs)
            except orjson.JSONDecodeError:
                raise RecordError(Reason.BAD_TEMPLATE_KWARGS, "chat_template_kwargs is not a JSON object") from None
        if not isinstance(kwargs, dict):
            kwargs = None if not kwargs else kwargs
            if kwargs is not None:
                raise RecordError(Reason.BAD_TEMPLATE_KWARGS, "chat_template_kwargs is not an object")
    effort = rec.get("reasoning_effort")
    if effort is not None:
        kwargs = {**(kwargs or {}), "reasoning_effort": effort}
    return kwargs or None


def _reasoning_field(m: dict, i: int) -> str | None:
    for key in _REASONING_KEYS:
        value = m.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            value = text_of(value, message_index=i, what=key)
        if value:
            return value
    return None


def _v1_assistant_parts(parts: list, i: int) -> tuple[str | None, str, list]:
    """LLaMA-Factory v1 assistant parts: reasoning, text, tool_call, tool_calls."""
    reasoning, texts, calls = [], [], []
    for k, part in enumerate(parts):
        if not isinstance(part, dict):
            raise RecordError(Reason.BAD_CONTENT, f"content part {k} is not an object", message_index=i)
        ptype = part.get("type", "text")
        value = part.get("value", part.get("text"))
        if ptype == "reasoning":
            reasoning.append(text_of(value, message_index=i))
        elif ptype in ("tool_call", "tool_calls"):
            if isinstance(value, (str, bytes)):
                try:
                    value = orjson.loads(value)
                except orjson.JSONDecodeError as err:
                    raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"content part {k} ({ptype}) is not JSON ({err})",
                                      message_index=i) from None
            for call in value if isinstance(value, list) else [value]:
                calls.append(openai_tool_call(call, message_index=i))
        else:
            texts.append(part)
    return ("\n\n".join(r for r in reasoning if r) or None), text_of(texts, message_index=i), calls


def _has_part(content: Any, types: tuple[str, ...]) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in types for p in content)


def _split_result_list(text: str, pending: int) -> list[str] | None:
    """A v1 tool message holding a JSON list with one result per parallel call → the results, in order."""
    if pending < 2 or not text.startswith("["):
        return None
    try:
        items = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list) or len(items) != pending:
        return None
    out = []
    for item in items:
        if isinstance(item, dict) and "content" in item and ("tool_call_id" in item or "name" in item):
            item = item["content"]
        if isinstance(item, str):
            out.append(item)
            continue
        try:
            out.append(orjson.dumps(item).decode())
        except orjson.JSONEncodeError:
            return None  # too deep to write back as JSON text: keep the message as one result
    return out


def _keep_weight(m: dict, beam: dict) -> None:
    """The OpenAI fine-tuning format's per-message ``weight`` (and axolotl's alias ``train``) is kept for the
    validator, which checks it and writes ``weight``."""
    for key in ("weight", "train"):
        if key in m:
            beam[key] = m[key]


def convert_messages(msgs: Any, tools: list | None) -> tuple[list[dict], list | None, list[int] | None]:
    """Messages → Beam messages, the record's tools, and (when a message became several) the map from Beam
    message index to input message index, for error messages."""
    if type(msgs) is not list:
        raise RecordError(Reason.BAD_CONTENT, f"messages is a {type(msgs).__name__}, not a list")
    out: list[dict] = []
    append = out.append
    pending = 0  # calls of the last assistant message not yet answered, for v1 result lists
    splits: dict[int, int] = {}  # input index -> extra Beam messages it became
    for i, m in enumerate(msgs):
        if type(m) is not dict:
            raise RecordError(Reason.BAD_CONTENT, f"message is a {type(m).__name__}, not an object", message_index=i)
        role = m.get("role")
        content = m.get("content")
        if role == "assistant":
            calls: list = []
            if type(content) is str:
                text = content
            elif _has_part(content, _V1_ASSISTANT_PARTS):
                reasoning, text, calls = _v1_assistant_parts(content, i)
                if reasoning:
                    m = {**m, "reasoning_content": _reasoning_field(m, i) or reasoning}
            else:
                text = text_of(content, message_index=i)
            reasoning = m.get("reasoning_content") or m.get("reasoning") or m.get("thinking")
            if reasoning is not None and type(reasoning) is not str:
                reasoning = _reasoning_field(m, i)
            if not reasoning and text and "<" in text:
                reasoning, text = split_think(text, message_index=i)
            raw_calls = m.get("tool_calls")
            if raw_calls:
                if type(raw_calls) is not list:
                    raise RecordError(Reason.BAD_CONTENT, "tool_calls is not a list", message_index=i)
                for c in raw_calls:
                    calls.append(openai_tool_call(c, message_index=i))
            fc = m.get("function_call")
            if fc:
                if type(fc) is not dict:
                    raise RecordError(Reason.BAD_CONTENT, "function_call is not an object", message_index=i)
                calls.append(tool_call(fc.get("name"), fc.get("arguments"), message_index=i))
            if calls:
                append({"role": "assistant", "reasoning_content": reasoning or "", "content": text,
                        "tool_calls": calls})
            else:
                append({"role": "assistant", "reasoning_content": reasoning or "", "content": text})
            _keep_weight(m, out[-1])
            pending = len(calls)
        elif role == "user" or role == "system" or role == "developer":
            if type(content) is not str:
                if role != "user" and _has_part(content, ("tools",)):
                    tools, content = _v1_tools_part(content, tools)
                content = text_of(content, message_index=i)
            append({"role": role, "content": content})
            _keep_weight(m, out[-1])
        elif role == "tool" or role == "function":
            text = content if type(content) is str else tool_content(content, message_index=i)
            call_id = m.get("tool_call_id")
            if call_id is None and type(m.get("tool_call_ids")) is list and len(m["tool_call_ids"]) == 1:
                call_id = m["tool_call_ids"][0]
            if call_id is not None and type(call_id) is not str and type(call_id) is not int:
                raise RecordError(Reason.BAD_CONTENT, f"tool_call_id is a {type(call_id).__name__}, not a string",
                                  message_index=i)
            split = _split_result_list(text, pending) if call_id is None and pending > 1 else None
            if split:
                splits[i] = len(split) - 1
            name = m.get("name")
            if name is not None and type(name) is not str:
                raise RecordError(Reason.BAD_CONTENT, f"tool result name is a {type(name).__name__}, not a string",
                                  message_index=i)
            for part in split or (text,):
                msg = {"role": "tool", "content": part}
                _keep_weight(m, msg)
                if name:
                    msg["name"] = name
                if call_id is not None:
                    msg["tool_call_id"] = str(call_id)
                append(msg)
            pending = 0
        else:
            raise RecordError(Reason.UNKNOWN_ROLE, f"unknown role {role!r}", message_index=i)
    src = None
    if splits:
        src = []
        for i in range(len(msgs)):
            src.extend([i] * (1 + splits.get(i, 0)))
    return out, tools, src


def _v1_tools_part(content: list, tools: list | None) -> tuple[list | None, list]:
    parts = []
    for p in content:
        if isinstance(p, dict) and p.get("type") == "tools":
            found = normalize_tools(p.get("value", p.get("tools")))
            tools = (tools or []) + (found or [])
        else:
            parts.append(p)
    return tools, parts


def convert(rec: Any) -> dict:
    """One OpenAI-style record → a Beam record (not yet validated)."""
    if isinstance(rec, list):  # a bare list of messages is one conversation
        rec = {"messages": rec}
    if not isinstance(rec, dict):
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is a {type(rec).__name__}, not an object")
    reject_unsupported_record(rec)
    msgs = rec.get("messages")
    if msgs is None:
        msgs = rec.get("history")
    if msgs is None:
        raise RecordError(Reason.UNKNOWN_FORMAT, "no 'messages' list")
    tools = normalize_tools(rec.get("tools"))
    if tools is None and rec.get("functions"):
        tools = normalize_tools(rec["functions"])
    messages, tools, src = convert_messages(msgs, tools)
    markup, hermes = scan(messages)
    if hermes:  # Hermes / Qwen tags: calls, results and tools written as text
        messages, tools, src = lift(messages, tools, src)
    beam = beam_record(messages, tools, record_kwargs(rec))
    if src is not None:
        beam["_src"] = src
    if hermes:
        beam["_format"] = "hermes"
    elif not markup:
        beam["_no_markup"] = True  # validate need not search again
    return beam


# --- fast path ---------------------------------------------------------------------------------------------
#
# Most OpenAI rows are already nearly Beam-shaped. `fast_convert` handles exactly those in one pass and
# gives up (returns None) on anything that needs a decision — a rejection, a merge, a fold, a reorder,
# missing reasoning, any "<" in text, tool markup without "<" (```tool fences, glaive's FUNCTION RESPONSE:) —
# so the general path (`convert` + `validate`) produces the result or the error. Its output equals the general path's (tests/test_formats_openai.py checks this on every
# sample and real record); it exists because conversion speed is measured against orjson.

_FAST_RECORD_KEYS = frozenset(("messages", "tools", "chat_template_kwargs", "reasoning_effort",
                               "parallel_tool_calls", "id"))
_FAST_USER_ROLES = frozenset(("user", "system", "developer"))
# A "type" that is not a JSON Schema type ("int", "dict"): the general path maps it (beam_sft.records.schema_types).
_NONSTANDARD_TYPE = re.compile(rb'"type":"(?!(?:function|string|integer|number|boolean|array|object|null)")')
# Most datasets repeat a few tool lists, so the verdict is kept per serialized list (bounded: cleared when full).
_TYPES_SEEN: dict[bytes, bool] = {}
_TYPES_SEEN_MAX, _TYPES_SEEN_MAX_BYTES = 1024, 16384


def _standard_types(blob: bytes) -> bool:
    ok = _TYPES_SEEN.get(blob)
    if ok is None:
        ok = _NONSTANDARD_TYPE.search(blob) is None
        if len(blob) <= _TYPES_SEEN_MAX_BYTES:
            if len(_TYPES_SEEN) >= _TYPES_SEEN_MAX:
                _TYPES_SEEN.clear()
            _TYPES_SEEN[blob] = ok
    return ok


def _fast_args(args: Any) -> dict | None:
    if type(args) is str:
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    if type(args) is not dict:
        return None
    for key, value in args.items():
        if '"' in key or "<" in key or ">" in key:
            return None
        t = type(value)
        if t is str:
            if "<" in value:
                return None
        elif (t is dict or t is list) and not _fast_clean(value, 2):
            return None
    return args


def _fast_clean(value: Any, depth: int) -> bool:
    """No "<" in any string or key of a nested argument value, and not nested too deep (else the general path
    checks it)."""
    if type(value) is str:
        return "<" not in value
    if depth > MAX_JSON_DEPTH:
        return type(value) is not list and type(value) is not dict
    if type(value) is list:
        return all(_fast_clean(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and "<" not in k and _fast_clean(v, depth + 1) for k, v in value.items())
    return True


def fast_convert(rec: Any, options: Any = None) -> dict | None:
    """A validated Beam record for a plain OpenAI row, or None when the general path must decide."""
    if type(rec) is not dict or not _FAST_RECORD_KEYS.issuperset(rec):
        return None
    msgs = rec.get("messages")
    if type(msgs) is not list or not msgs:
        return None
    out: list[dict] = []
    append = out.append
    texts: list[str] = []
    add_text = texts.append
    n = len(msgs)
    i = 0
    seen_other = False
    n_assistant = 0
    while i < n:
        m = msgs[i]
        # Harmony-JSON fields mean another format (see formats.detect): `auto` tries this path first.
        if type(m) is not dict or "channel" in m or "recipient" in m or "content_type" in m:
            return None
        if "weight" in m or "train" in m:
            return None  # a loss weight: the general path keeps and checks it
        role = m.get("role")
        if type(role) is str and role in _FAST_USER_ROLES:
            content = m.get("content")
            if type(content) is not str:
                return None
            add_text(content)
            if role == "user":
                seen_other = True
            elif seen_other:
                return None
            append({"role": role, "content": content})
            i += 1
            continue
        if role != "assistant" or "function_call" in m:
            return None
        if out and out[-1]["role"] == "assistant":
            return None
        seen_other = True
        n_assistant += 1
        reasoning = m.get("reasoning_content")
        if type(reasoning) is not str or not reasoning:
            return None
        add_text(reasoning)
        content = m.get("content")
        if content is None:
            content = ""
        elif type(content) is not str:
            return None
        add_text(content)
        raw_calls = m.get("tool_calls")
        if not raw_calls:
            if not content:
                return None
            append({"role": "assistant", "reasoning_content": reasoning, "content": content})
            i += 1
            continue
        if content or type(raw_calls) is not list:
            return None
        calls = []
        for c in raw_calls:
            fn = c.get("function") if type(c) is dict else None
            if type(fn) is not dict:
                return None
            name = fn.get("name")
            if type(name) is not str or not name or (not name.isidentifier() and _BAD_CALL_NAME.search(name)):
                return None
            args = _fast_args(fn.get("arguments"))
            if args is None:
                return None
            cid = c.get("id")
            if cid is None or cid == "":
                calls.append({"type": "function", "function": {"name": name, "arguments": args}})
            elif type(cid) is str:
                calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
            else:
                return None
        append({"role": "assistant", "reasoning_content": reasoning, "tool_calls": calls})
        i += 1
        k = i
        while k < n and type(msgs[k]) is dict and msgs[k].get("role") == "tool":
            k += 1
        if k == i:
            if k < n:
                return None
            continue
        if k - i != len(calls):
            return None
        for call, t in zip(calls, msgs[i:k], strict=True):
            content = t.get("content")
            if type(content) is not str:
                return None
            add_text(content)
            cid, rid = call.get("id"), t.get("tool_call_id")
            name = call["function"]["name"]
            if cid is None:
                if rid is not None or len(calls) != 1 or (t.get("name") and t["name"] != name):
                    return None
                append({"role": "tool", "name": name, "content": content})
            else:
                if rid != cid:
                    return None
                append({"role": "tool", "name": name, "tool_call_id": cid, "content": content})
        i = k
    if not n_assistant:
        return None
    # Every text at once: any "<" (tags, markers), and the tool markup that has none (```tool fences, glaive's
    # FUNCTION RESPONSE:), gated by one-character searches (toolmarkup.may_have_markup says why). One search
    # over the joined texts costs less than one per text; a match made across two texts only costs the general
    # path, which checks each text on its own.
    joined = "".join(texts)
    if "<" in joined or ("`" in joined and "```tool" in joined) or ("U" in joined and "FUNCTION RESPONSE:" in joined):
        return None
    result: dict[str, Any] = {"messages": out}
    tools = rec.get("tools")
    if tools is not None:
        if type(tools) is not list:
            return None
        if tools:
            for t in tools:
                if type(t) is not dict or t.get("type") != "function":
                    return None
                fn = t.get("function")
                if type(fn) is not dict or type(fn.get("name")) is not str or not fn["name"] or "required" in fn:
                    return None
                params = fn.get("parameters")
                if params is not None and (type(params) is not dict
                                           or (params and "type" not in params and "properties" not in params)):
                    return None  # an xLAM parameter map: the general path converts it
                desc = fn.get("description")
                if desc is not None and type(desc) is not str:
                    return None
            try:
                blob = tools_json(tools)
            except RecordError:
                return None
            if b"<" in blob:
                return None
            if not _standard_types(blob):
                return None  # a type name outside JSON Schema ("int", "dict"): the general path maps it
            result["tools"] = tools
    ck = rec.get("chat_template_kwargs")
    if ck is not None and type(ck) is not dict:
        return None
    kwargs = record_kwargs(rec) if ck or "reasoning_effort" in rec else None
    if kwargs:
        if type(kwargs) is not dict:
            return None
        effort = kwargs.get("reasoning_effort")
        if not (effort is None or type(effort) is int or (type(effort) is str and effort in EFFORT_LABELS)):
            return None
        if nests_deeper(kwargs):
            return None
        result["chat_template_kwargs"] = kwargs
    if options is not None and options.render_check is not None:
        try:
            options.render_check(result)
        except Exception as err:  # noqa: BLE001 - the same safety net as validate()
            raise RecordError(Reason.RENDER_FAILED, f"{type(err).__name__}: {err}") from None
    return result
