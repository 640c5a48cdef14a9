"""The fast path for plain OpenAI rows: one pass that is both converter and validator, for rows that need no
decision.

Most OpenAI rows are already nearly Beam-shaped. `fast_convert` handles exactly those and gives up (returns
None) on anything that needs a decision — a rejection, a merge, a fold, a reorder, a loss `weight` / `train`,
reasoning under another field name, any "<" in text, tool markup without "<" (```tool fences, glaive's
FUNCTION RESPONSE:) —
so the general path (`beam_sft.formats.openai.convert` + `beam_sft.validate.rules.validate`) produces the
result or the error. It
lives beside the validator it shortcuts; its output equals the general path's (tests/test_formats_openai.py
and tests/test_fuzz.py check this on every sample, real and fuzzed record). It exists because conversion
speed is measured against orjson (benchmarks/data.py).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError
from beam_sft.formats.openai import record_kwargs
from beam_sft.records.messages import EFFORT_LABELS, MAX_JSON_DEPTH, nests_deeper, tools_json
from beam_sft.validate import rules
from beam_sft.validate.rules import BAD_TOOL_NAME, nothing_to_train

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


def fast_convert(rec: Any, options: Any = None, counters: dict | None = None) -> dict | None:
    """A validated Beam record for a plain OpenAI row, or None when the general path must decide.

    `counters` gets what `validate` would count for it (turns masked or kept without reasoning)."""
    if type(rec) is not dict or not _FAST_RECORD_KEYS.issuperset(rec):
        return None
    msgs = rec.get("messages")
    if type(msgs) is not list or not msgs:
        return None
    texts: list[str] = []
    policy = (options or rules.DEFAULT_OPTIONS).missing_reasoning  # looked up now, as `validate` does
    missing: list[dict] = []
    out = _fast_messages(msgs, texts, missing)
    if out is None:
        return None
    # Every text at once: any "<" (tags, markers), and the tool markup that has none (```tool fences, glaive's
    # FUNCTION RESPONSE:), gated by one-character searches (records.markup.may_have_markup says why). One search
    # over the joined texts costs less than one per text; a match made across two texts only costs the general
    # path, which checks each text on its own.
    joined = "".join(texts)
    if "<" in joined or ("`" in joined and "```tool" in joined) or ("U" in joined and "FUNCTION RESPONSE:" in joined):
        return None
    result: dict[str, Any] = {"messages": out}
    tools = rec.get("tools")
    if tools is not None:
        if type(tools) is not list or (tools and not _fast_tools_ok(tools)):
            return None
        if tools:
            result["tools"] = tools
    ck = rec.get("chat_template_kwargs")
    if ck is not None and type(ck) is not dict:
        return None
    kwargs = record_kwargs(rec) if ck or "reasoning_effort" in rec else None
    if kwargs:
        if not _fast_kwargs_ok(kwargs):
            return None
        result["chat_template_kwargs"] = kwargs
    # Last, as in `validate`: a record that fails a check above gets that check's verdict, not nothing_to_train.
    if missing and not _reasoning_policy(missing, out, policy):
        return None
    if missing and counters is not None:
        key = "masked_missing_reasoning" if policy == "mask" else "missing_reasoning"
        counters[key] = counters.get(key, 0) + len(missing)
    if options is not None and options.render_check is not None:
        try:
            options.render_check(result)
        except Exception as err:  # noqa: BLE001 - the same safety net as validate()
            raise RecordError(Reason.RENDER_FAILED, f"{type(err).__name__}: {err}") from None
    return result


def _reasoning_policy(missing: list[dict], out: list[dict], policy: str) -> bool:
    """Apply the missing-reasoning policy to the turns without reasoning, as `validate` does; False when the
    general path must decide (`reject`). `mask` leaving no turn to train raises `validate`'s error."""
    if policy == "keep":
        return True
    if policy != "mask":
        return False
    if len(missing) == sum(1 for m in out if m["role"] == "assistant"):
        raise nothing_to_train()
    for message in missing:
        message["weight"] = 0
    return True


def _fast_messages(msgs: list, texts: list[str], missing: list[dict]) -> list[dict] | None:
    """The Beam messages of a plain conversation (every text appended to `texts`, every assistant message
    without reasoning to `missing`), or None."""
    out: list[dict] = []
    append = out.append
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
        if role != "assistant" or "function_call" in m or (out and out[-1]["role"] == "assistant"):
            return None
        seen_other = True
        n_assistant += 1
        message = _fast_assistant(m, texts)
        if message is None:
            return None
        if not message["reasoning_content"]:
            missing.append(message)
        append(message)
        i += 1
        calls = message.get("tool_calls")
        if not calls:
            continue
        k = i
        while k < n and type(msgs[k]) is dict and msgs[k].get("role") == "tool":
            k += 1
        if k == i:
            if k < n:
                return None
            continue
        results = _fast_results(calls, msgs[i:k], texts)
        if results is None:
            return None
        out.extend(results)
        i = k
    return out if n_assistant else None


def _fast_assistant(m: dict, texts: list[str]) -> dict | None:
    """One assistant message with either content or calls (not both), or None; reasoning "" when it has none."""
    reasoning = m.get("reasoning_content")
    if type(reasoning) is not str or not reasoning:
        # The converter reads `reasoning` / `thinking` where `reasoning_content` is empty: its decision.
        if (reasoning is not None and type(reasoning) is not str) or "reasoning" in m or "thinking" in m:
            return None
        reasoning = ""
    texts.append(reasoning)
    content = m.get("content")
    if content is None:
        content = ""
    elif type(content) is not str:
        return None
    texts.append(content)
    raw_calls = m.get("tool_calls")
    if not raw_calls:
        if not content:
            return None
        first = content[0]
        if (first == "[" or first == "{" or first.isspace()) and "function" in content:
            return None  # maybe a JSON list of calls (formats.toolmarkup.json_calls)
        return {"role": "assistant", "reasoning_content": reasoning, "content": content}
    if content or type(raw_calls) is not list:
        return None
    calls = []
    for c in raw_calls:
        fn = c.get("function") if type(c) is dict else None
        if type(fn) is not dict:
            return None
        name = fn.get("name")
        if type(name) is not str or not name or (not name.isidentifier() and BAD_TOOL_NAME.search(name)):
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
    return {"role": "assistant", "reasoning_content": reasoning, "tool_calls": calls}


def _fast_results(calls: list[dict], results: list[dict], texts: list[str]) -> list[dict] | None:
    """Tool messages answering `calls` one to one, in order and with matching ids, or None."""
    if len(results) != len(calls):
        return None
    out = []
    for call, t in zip(calls, results, strict=True):
        content = t.get("content")
        if type(content) is not str or "weight" in t or "train" in t:
            return None  # a loss weight on a result: the general path rejects it (bad_weight)
        texts.append(content)
        cid, rid = call.get("id"), t.get("tool_call_id")
        name = call["function"]["name"]
        if cid is None:
            if rid is not None or len(calls) != 1 or (t.get("name") and t["name"] != name):
                return None
            out.append({"role": "tool", "name": name, "content": content})
        else:
            if rid != cid:
                return None
            out.append({"role": "tool", "name": name, "tool_call_id": cid, "content": content})
    return out


def _fast_tools_ok(tools: list) -> bool:
    """Function schemas the general path would keep unchanged."""
    for t in tools:
        if type(t) is not dict or t.get("type") != "function":
            return False
        fn = t.get("function")
        if type(fn) is not dict or type(fn.get("name")) is not str or not fn["name"] or "required" in fn:
            return False
        params = fn.get("parameters")
        if params is not None and (type(params) is not dict
                                   or (params and "type" not in params and "properties" not in params)):
            return False  # an xLAM parameter map: the general path converts it
        desc = fn.get("description")
        if desc is not None and type(desc) is not str:
            return False
    try:
        blob = tools_json(tools)
    except RecordError:
        return False
    # A type name outside JSON Schema ("int", "dict"): the general path maps it.
    return b"<" not in blob and _standard_types(blob)


def _fast_kwargs_ok(kwargs: Any) -> bool:
    if type(kwargs) is not dict:
        return False
    effort = kwargs.get("reasoning_effort")
    if not (effort is None or type(effort) is int or (type(effort) is str and effort in EFFORT_LABELS)):
        return False
    return not nests_deeper(kwargs)
