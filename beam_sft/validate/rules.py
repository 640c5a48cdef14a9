"""Check and normalize a converted record so that it renders with the Beam template, or reject it with one reason.

Every format's converter ends here. The checks, in order: docs/conversion.md#validation-in-order."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from beam_sft.errors import Reason, RecordError
from beam_sft.records.markup import find_markup, may_have_markup
from beam_sft.records.messages import (
    EFFORT_LABELS,
    MAX_JSON_DEPTH,
    PARAMETER_CLOSE_TAG,
    checked_tools,
    find_marker,
    nests_deeper,
)
from beam_sft.records.types import BeamRecord, Message, ToolCall, json_type, wrong_type
from beam_sft.validate.calls import TOOL_CALL_CHECKS_CHOICES, check_calls, check_opening

LATE_SYSTEM_CHOICES = ("reject", "move")
# Counter keys for the foreign call-syntax instructions a converter removed: stripped_tool_prompt:<pattern name>.
STRIPPED_PREFIX = "stripped_tool_prompt:"
# What a turn without reasoning becomes (docs/decisions.md, "Missing reasoning").
MISSING_REASONING_CHOICES = ("mask", "keep", "reject")
# Counter keys for the records the checks of `beam_sft.validate.calls` found and `tool_call_checks="keep"` kept:
# kept:<reason code>.
KEPT_PREFIX = "kept:"


@dataclass
class Options:
    late_system: str = "reject"
    missing_reasoning: str = "mask"
    render_check: Callable[[BeamRecord], Any] | None = None
    tool_call_checks: str = "reject"  # TOOL_CALL_CHECKS_CHOICES: what becomes of a record `_checked_calls` faults

    def __post_init__(self):
        for name, choices in (("late_system", LATE_SYSTEM_CHOICES),
                              ("missing_reasoning", MISSING_REASONING_CHOICES),
                              ("tool_call_checks", TOOL_CALL_CHECKS_CHOICES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, not {getattr(self, name)!r}")


DEFAULT_OPTIONS = Options()
# A tool name the Beam header can't hold: whitespace ends it, a marker breaks the header.
BAD_TOOL_NAME = re.compile(r"\s|<\|")


def _bump(counters: dict | None, key: str, n: int = 1) -> None:
    if counters is not None:
        counters[key] = counters.get(key, 0) + n


def _idx(src: list[int] | None, i: int) -> int:
    return src[i] if src is not None and 0 <= i < len(src) else i


def _check_text(text: Any, where: str, i: int, argument: bool = False) -> None:
    """A text field must be a string without Harmony markers (an `argument`'s, nor the closing parameter tag). Hot
    callers test ``type(text) is not str or "<" in text`` first, so the common text costs no call."""
    if not isinstance(text, str):
        raise RecordError(Reason.BAD_CONTENT, f"{where} is {json_type(text)}, not a string", message_index=i)
    if argument and PARAMETER_CLOSE_TAG in text:
        raise RecordError(Reason.PARAMETER_CLOSE_TAG_IN_ARGUMENT, f"{where} contains {PARAMETER_CLOSE_TAG}",
                          message_index=i)
    if marker := find_marker(text):
        raise RecordError(Reason.HARMONY_MARKER_IN_TEXT, f"{where} contains the Harmony marker {marker}",
                          message_index=i)


def _check_markup(out: list[Message], msgs: list, src: list[int] | None) -> None:
    """Tool-call or result markup left in a text after conversion: trained on, it would teach the model to
    write fake calls as text. Tags quoted in prose are allowed (`beam_sft.records.markup`).

    One cheap search over all texts of the record; only when it finds a candidate are the input messages
    searched one by one, to name the message (a candidate made across two texts is no match)."""
    parts = []
    for m in out:
        if text := m.get("content"):
            parts.append(text)
        if m["role"] == "assistant" and m["reasoning_content"]:
            parts.append(m["reasoning_content"])
    if not may_have_markup("".join(parts)):
        return
    for i, m in enumerate(msgs):
        if type(m) is not dict:
            continue
        for key in ("content", "reasoning_content", "reasoning", "thinking"):
            text = m.get(key)
            if type(text) is str and (tag := find_markup(text)):
                where = "reasoning" if key != "content" else f"{m.get('role')} content"
                raise RecordError(Reason.TOOL_MARKUP_IN_TEXT, f"{where} holds the tool markup {tag!r} as text "
                                  "(a call or result that was not converted)", message_index=_idx(src, i))


def _check_value(value: Any, name: str, where: str, i: int, depth: int = 2) -> None:
    """A tool-call argument value, recursively: no marker, no closing parameter tag, not nested too deep
    (the arguments object is depth 1)."""
    if type(value) is str:
        if "<" in value:
            _check_text(value, f"argument {name!r} of {where}", i, argument=True)
    elif depth > MAX_JSON_DEPTH and (type(value) is dict or type(value) is list):
        raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"argument {name!r} of {where} nests deeper than "
                          f"{MAX_JSON_DEPTH} levels", message_index=i)
    elif type(value) is dict:
        for k, v in value.items():
            if type(k) is not str or "<" in k:
                _check_text(k, f"a key in argument {name!r} of {where}", i, argument=True)
            _check_value(v, name, where, i, depth + 1)
    elif type(value) is list:
        for v in value:
            _check_value(v, name, where, i, depth + 1)


def _check_calls(calls: Any, i: int) -> None:
    if type(calls) is not list:
        raise RecordError(Reason.BAD_CONTENT, "tool_calls is not a list", message_index=i)
    for call in calls:
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is not dict:
            raise RecordError(Reason.BAD_CONTENT, "tool call without a 'function' object", message_index=i)
        name = fn.get("name")
        if type(name) is not str or not name or BAD_TOOL_NAME.search(name):
            raise RecordError(Reason.BAD_CONTENT, f"tool call name {name!r} is not a usable name", message_index=i)
        cid = call.get("id")
        if cid is not None and type(cid) is not str:
            raise wrong_type(Reason.BAD_CONTENT, f"id of call {name!r}", cid, "a string", i)
        args = fn.get("arguments")
        if type(args) is not dict:
            raise RecordError(Reason.ARGUMENTS_NOT_OBJECT, f"arguments of call {name!r} are a "
                              f"{type(args).__name__}, not an object", message_index=i)
        for key, value in args.items():
            if type(key) is not str or '"' in key or "<" in key or ">" in key:
                raise RecordError(Reason.BAD_ARGUMENTS_JSON, f"argument name {key!r} of call {name!r} can't be "
                                  "written as a parameter name", message_index=i)
            if type(value) is not str or "<" in value:
                _check_value(value, key, f"call {name!r}", i)


def _pair_results(calls: list[ToolCall], msgs: list[Message], j: int, k: int, src: list[int] | None, ai: int
                  ) -> list[Message]:
    """Match the results msgs[j:k] to `calls` (id first, then position); tool messages in call order."""
    for ri in range(j, k):
        content = msgs[ri].get("content")
        if type(content) is not str or "<" in content:
            _check_text(content, "tool result", _idx(src, ri))
        rid = msgs[ri].get("tool_call_id")
        if rid is not None and type(rid) is not str:
            raise wrong_type(Reason.BAD_CONTENT, "tool_call_id", rid, "a string", _idx(src, ri))
    if len(calls) == 1 and k - j == 1:  # the common case: one call, one result
        c, r = calls[0], msgs[j]
        cid, rid = c.get("id"), r.get("tool_call_id")
        name = c["function"]["name"]
        if rid is not None and cid is not None and rid != cid:
            raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, f"tool_call_id {rid!r} matches no call of "
                              f"messages[{_idx(src, ai)}]", message_index=_idx(src, j))
        if cid is None and rid is None and r.get("name") and r["name"] != name:
            raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, f"result from {r['name']!r} where the call is "
                              f"{name!r}", message_index=_idx(src, j))
        return [_result_message(name, cid if cid is not None else rid, r["content"])]
    id_index: dict[str, int] = {}
    for ci, c in enumerate(calls):
        cid = c.get("id")
        if cid is not None:
            if cid in id_index:
                raise RecordError(Reason.DUPLICATE_CALL_ID, f"two calls share the id {cid!r}",
                                  message_index=_idx(src, ai))
            id_index[cid] = ci
    assigned: list[Message | None] = [None] * len(calls)
    loose: list[int] = []
    for ri in range(j, k):
        r = msgs[ri]
        rid = r.get("tool_call_id")
        if rid is not None and rid in id_index:
            ci = id_index[rid]
            if assigned[ci] is not None:
                raise RecordError(Reason.DUPLICATE_CALL_ID, f"a second result for call id {rid!r}",
                                  message_index=_idx(src, ri))
            assigned[ci] = r
        elif rid is not None and id_index:
            raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, f"tool_call_id {rid!r} matches no call of "
                              f"messages[{_idx(src, ai)}]", message_index=_idx(src, ri))
        else:
            loose.append(ri)
    free = [ci for ci, r in enumerate(assigned) if r is None]
    if len(loose) > len(free):
        raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, f"more tool results than calls in "
                          f"messages[{_idx(src, ai)}]", message_index=_idx(src, loose[len(free)]))
    if len(loose) < len(free):
        missing = calls[free[len(loose)]]["function"]["name"]
        raise RecordError(Reason.CALL_WITHOUT_RESULT, f"call {missing!r} has no result", message_index=_idx(src, ai))
    for ci, ri in zip(free, loose, strict=True):
        r = msgs[ri]
        want = calls[ci]["function"]["name"]
        if r.get("name") and r["name"] != want:
            raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, f"result from {r['name']!r} where the call at this "
                              f"position is {want!r}", message_index=_idx(src, ri))
        assigned[ci] = r
    return [_result_message(c["function"]["name"], c.get("id", r.get("tool_call_id")), r["content"])
            for c, r in zip(calls, assigned, strict=True)]


def _result_message(name: str, call_id: str | None, content: str) -> Message:
    msg: Message = {"role": "tool", "name": name}
    if call_id is not None:
        msg["tool_call_id"] = call_id
    msg["content"] = content
    return msg


def _check_kwargs(kwargs: Any) -> None:
    if type(kwargs) is not dict:
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, "chat_template_kwargs is not an object")
    identity = kwargs.get("model_identity")
    if identity is not None and type(identity) is not str:
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, f"model_identity is {json_type(identity)}, not a string")
    if nests_deeper(kwargs):
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, f"chat_template_kwargs nest deeper than {MAX_JSON_DEPTH} levels")
    effort = kwargs.get("reasoning_effort")
    if effort is None or (type(effort) is str and effort in EFFORT_LABELS) or type(effort) is int:
        return
    if type(effort) is str:
        raise RecordError(Reason.BAD_TEMPLATE_KWARGS, f"reasoning_effort {effort!r} is not one of "
                          f"{', '.join(sorted(EFFORT_LABELS))} (Beam always reasons)")
    raise RecordError(Reason.BAD_TEMPLATE_KWARGS, f"reasoning_effort {effort!r} is not a label or an int")


def message_weight(m: Message, i: int) -> int | None:
    """The loss weight of a message: 0 or 1 from ``weight`` (the OpenAI fine-tuning field) or its alias
    ``train`` (a bool), None when neither is given; anything else → ``bad_weight``."""
    weight, train = m.get("weight"), m.get("train")
    if weight is not None and (type(weight) is not int or weight not in (0, 1)):
        raise RecordError(Reason.BAD_WEIGHT, f"weight is {weight!r}; it must be 0 or 1", message_index=i)
    if train is not None:
        if type(train) is not bool:
            raise RecordError(Reason.BAD_WEIGHT, f"train is {train!r}; it must be true or false", message_index=i)
        if weight is not None and weight != int(train):
            raise RecordError(Reason.BAD_WEIGHT, f"weight {weight} and train {train} disagree", message_index=i)
        return int(train)
    return weight


def _merge_run(msgs: list[Message], i: int, j: int, src: list[int] | None, counters: dict | None) -> Message:
    """Merge the consecutive assistant messages msgs[i:j] into one."""
    first = msgs[i]
    if first.get("tool_calls"):
        raise RecordError(Reason.CALL_WITHOUT_RESULT, "the assistant speaks again before the results of its "
                          f"calls in messages[{_idx(src, i)}]", message_index=_idx(src, i + 1))
    reasoning = [m.get("reasoning_content") or m.get("thinking") or m.get("reasoning") or "" for m in msgs[i:j]]
    content = [m.get("content") or "" for m in msgs[i:j]]
    calls = None
    for q, (r, c) in enumerate(zip(reasoning, content, strict=True), start=i):
        _check_text(r, "reasoning", _idx(src, q))
        _check_text(c, "assistant content", _idx(src, q))
    for q in range(i + 1, j):
        m = msgs[q]
        if m.get("tool_calls"):
            if q != j - 1:
                raise RecordError(Reason.CALL_WITHOUT_RESULT, "the assistant speaks again before the results of "
                                  f"its calls in messages[{_idx(src, q)}]", message_index=_idx(src, q + 1))
            calls = m["tool_calls"]
    _bump(counters, "merged_assistant", j - i - 1)
    merged: Message = {"role": "assistant", "reasoning_content": "\n\n".join(r for r in reasoning if r),
                       "content": "\n\n".join(c for c in content if c)}
    weights = [message_weight(msgs[q], _idx(src, q)) for q in range(i, j)]
    if 0 in weights:  # one turn now: what the data said not to train stays untrained
        merged["weight"] = 0
    elif 1 in weights:
        merged["weight"] = 1
    if calls:
        merged["tool_calls"] = calls
    return merged


def validate(rec: Any, options: Options | None = None, counters: dict | None = None) -> BeamRecord:
    """Check and normalize an (unvalidated) Beam record; return the record to write, or raise `RecordError`.

    The record's message dicts are reused (converters build fresh ones). `counters`, when given, is
    incremented for what was changed or kept by policy: ``merged_assistant``, ``folded_content``,
    ``moved_system``, ``missing_reasoning`` (kept without reasoning), ``masked_missing_reasoning`` (given
    weight 0 by the ``mask`` policy), ``masked_weight`` (weight 0 in the input), and
    ``stripped_tool_prompt:<pattern>`` (the converter's ``_stripped``; `beam_sft.formats.toolmarkup`). Message
    indexes in errors refer to the source record through the converter's ``_src`` map."""
    opts = options or DEFAULT_OPTIONS
    if type(rec) is not dict:
        raise RecordError(Reason.NOT_AN_OBJECT, f"record is {json_type(rec)}, not an object")
    src = rec.pop("_src", None)
    no_markup = rec.pop("_no_markup", False)  # the converter already searched every text for tool markup
    stripped = rec.pop("_stripped", None)  # foreign call-syntax instructions the converter removed, per pattern
    no_text = rec.pop("_no_text", None)  # the source message of the first turn the source gave no text
    msgs = rec.get("messages")
    if type(msgs) is not list or not msgs:
        raise RecordError(Reason.EMPTY_CONVERSATION, "no messages")
    out = _messages(msgs, src, opts, counters)
    if not no_markup:
        _check_markup(out, msgs, src)
    result: BeamRecord = {"messages": out}
    if tools := rec.get("tools"):
        tools, blob = checked_tools(tools)
        if b"<|" in blob and (marker := find_marker(blob.decode())):
            raise RecordError(Reason.HARMONY_MARKER_IN_TEXT, f"tool schemas contain the Harmony marker {marker}")
        result["tools"] = tools
    if kwargs := rec.get("chat_template_kwargs"):
        _check_kwargs(kwargs)
        result["chat_template_kwargs"] = kwargs
    _checked_calls(msgs, result.get("tools"), src, no_text, opts, counters)
    # after the checks above, so a broken record gets their reason
    if not any(m["role"] == "assistant" and m.get("weight") != 0 for m in out):
        raise nothing_to_train()
    if opts.render_check is not None:
        try:
            opts.render_check(result)
        except RecordError:
            raise
        except Exception as err:  # noqa: BLE001 - the template's own error text is the most precise message
            raise RecordError(Reason.RENDER_FAILED, f"{type(err).__name__}: {err}") from None
    if type(stripped) is dict and counters is not None:  # counted only for a record that is kept
        for name, n in stripped.items():
            if type(name) is str and type(n) is int:  # a record from elsewhere may carry anything here
                _bump(counters, f"{STRIPPED_PREFIX}{name}", n)
    return result


def _checked_calls(msgs: list, tools: list | None, src: list[int] | None, no_text: Any, opts: Options,
                   counters: dict | None) -> None:
    """What eval scores as a failure, found in the data (`beam_sft.validate.calls`): a turn the source gave no
    text, a conversation the assistant opens, a call to a tool the record does not declare or against its
    schema. Rejected, or (``tool_call_checks="keep"``) kept and counted as ``kept:<reason>``."""
    index = (lambda i: _idx(src, i)) if src is not None else int  # without a map, positions are the source's
    try:
        if no_text is not None:
            raise RecordError(Reason.TURN_WITHOUT_TEXT, "the turn has no text (no 'value' or 'content'); it "
                              "would train as an empty message", message_index=no_text if type(no_text) is int
                              else None)
        check_opening(msgs, index)
        check_calls(msgs, tools, index)
    except RecordError as err:
        if opts.tool_call_checks == "reject":
            raise
        _bump(counters, f"{KEPT_PREFIX}{err.code.value}")


def nothing_to_train() -> RecordError:
    return RecordError(Reason.NOTHING_TO_TRAIN, "every assistant turn has weight 0 (turns without reasoning are "
                       "masked by default; fill them in with `beam-sft backfill`)")


def _messages(msgs: list, src: list[int] | None, opts: Options, counters: dict | None) -> list[Message]:
    """The checked Beam messages: turns merged, results paired, late instructions moved or rejected."""
    out: list[Message] = []
    late: list[Message] = []
    n_head = 0  # instructions at the start
    seen_other = False
    n_assistant = 0
    n = len(msgs)
    i = 0
    for q, m in enumerate(msgs):
        if type(m) is dict and ("weight" in m or "train" in m) and m.get("role") != "assistant" \
                and (m.get("weight") is not None or m.get("train") is not None):
            raise RecordError(Reason.BAD_WEIGHT, f"a {m.get('role')} message has a loss weight; only assistant "
                              "messages are trained", message_index=_idx(src, q))
    while i < n:
        m = msgs[i]
        role = m.get("role") if type(m) is dict else None
        if role == "assistant":
            i = _assistant(msgs, i, src, opts, counters, out)
            seen_other = True
            n_assistant += 1
            continue
        if role == "user" or role == "system" or role == "developer":
            content = m.get("content")
            if type(content) is not str or "<" in content:
                _check_text(content, f"{role} content", _idx(src, i))
            if role == "user":
                seen_other = True
                out.append(m)
            elif not seen_other:
                out.append(m)
                n_head += 1
            elif opts.late_system == "reject":
                raise RecordError(Reason.LATE_SYSTEM, f"{role} message after the conversation started (the "
                                  "template would not render it; use late_system='move' to move it up)",
                                  message_index=_idx(src, i))
            else:
                late.append(m)
            i += 1
            continue
        if role == "tool":
            raise RecordError(Reason.TOOL_RESULT_WITHOUT_CALL, "tool result with no call before it",
                              message_index=_idx(src, i))
        raise RecordError(Reason.UNKNOWN_ROLE, f"unknown role {role!r}", message_index=_idx(src, i))
    if not n_assistant:
        raise RecordError(Reason.NO_ASSISTANT_TURN, "no assistant message")
    if late:
        out[n_head:n_head] = late
        _bump(counters, "moved_system", len(late))
    return out


def _assistant(msgs: list, i: int, src: list[int] | None, opts: Options, counters: dict | None,
               out: list[Message]) -> int:
    """The assistant turn starting at msgs[i] (consecutive assistant messages merged) and the results of its
    calls, appended to `out`; returns the index of the next message."""
    n = len(msgs)
    m = msgs[i]
    j = i + 1
    while j < n and type(msgs[j]) is dict and msgs[j].get("role") == "assistant":
        j += 1
    if j - i > 1:
        m = _merge_run(msgs, i, j, src, counters)
        at = _idx(src, j - 1)
    else:
        at = _idx(src, i)
        weight = message_weight(m, at) if "weight" in m or "train" in m else None
        if m.get("reasoning_content") is None or m.get("content") is None or "train" in m:
            # a Beam record from elsewhere: the template's other reasoning fields, absent content
            m = {"role": "assistant", "reasoning_content": m.get("reasoning_content") or m.get("thinking")
                 or m.get("reasoning") or "", "content": m.get("content") or "",
                 **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})}
        if weight is not None:
            m["weight"] = weight
        else:
            m.pop("weight", None)
    reasoning, content, calls = m["reasoning_content"], m["content"], m.get("tool_calls")
    if type(reasoning) is not str or "<" in reasoning:
        _check_text(reasoning, "reasoning", at)
    if type(content) is not str or "<" in content:
        _check_text(content, "assistant content", at)
    if calls:
        _check_calls(calls, at)
        if content:
            m["reasoning_content"] = reasoning = f"{reasoning}\n\n{content}" if reasoning else content
            _bump(counters, "folded_content")
        del m["content"]
    elif not content:
        raise RecordError(Reason.BAD_CONTENT, "assistant message with neither content nor tool calls",
                          message_index=at)
    if m.get("weight") == 0:  # weight 0 in the input stays so
        _bump(counters, "masked_weight")
    elif not reasoning:  # masked (weight 0), kept or rejected, as `opts.missing_reasoning` says
        if opts.missing_reasoning == "reject":
            raise RecordError(Reason.MISSING_REASONING, "assistant message without reasoning", message_index=at)
        if opts.missing_reasoning == "mask":
            m["weight"] = 0
            _bump(counters, "masked_missing_reasoning")
        else:
            _bump(counters, "missing_reasoning")
    out.append(m)
    if not calls:
        return j
    k = j
    while k < n and type(msgs[k]) is dict and msgs[k].get("role") == "tool":
        k += 1
    if k > j:
        out.extend(_pair_results(calls, msgs, j, k, src, j - 1))
    elif k < n:
        raise RecordError(Reason.CALL_WITHOUT_RESULT, f"call {calls[0]['function']['name']!r} has no result",
                          message_index=at)
    return k


def make_render_check(tokenizer: Any = None, chat_template: str | None = None) -> Callable[[BeamRecord], str]:
    """A `render_check` for `Options`: renders a record with the Beam chat template and returns the text.

    With a tokenizer, its own template is used (``apply_chat_template(..., tokenize=False)``); otherwise the
    template shipped in `beam_sft.template` (or `chat_template`) is rendered directly, which needs no
    tokenizer files and is several times faster."""
    if tokenizer is not None:
        def render_with_tokenizer(rec: BeamRecord) -> str:
            return tokenizer.apply_chat_template(rec["messages"], tools=rec.get("tools"), tokenize=False,
                                                 **(rec.get("chat_template_kwargs") or {}))
        return render_with_tokenizer

    from transformers.utils.chat_template_utils import render_jinja_template

    if chat_template is None:
        from beam_sft.template import chat_template as packaged

        chat_template = packaged()

    def render(rec: BeamRecord) -> str:
        rendered, _ = render_jinja_template([rec["messages"]], tools=rec.get("tools"), chat_template=chat_template,
                                            **(rec.get("chat_template_kwargs") or {}))
        return rendered[0]

    return render
