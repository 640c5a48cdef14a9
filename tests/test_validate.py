"""beam_sft.validate.rules: one reason code per rejection, the documented policies, and the render safety net."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_sft.errors import Reason, RecordError
from beam_sft.validate.rules import Options, make_render_check, validate

RENDER = make_render_check()


def U(text="q"):
    return {"role": "user", "content": text}


def A(content="a", reasoning="r", calls=None):
    m = {"role": "assistant", "reasoning_content": reasoning, "content": content}
    if calls:
        m["tool_calls"] = calls
    return m


def C(name="f", args=None, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": {} if args is None else args}}
    if cid:
        c["id"] = cid
    return c


def T(content="res", cid=None, name=None):
    m = {"role": "tool", "content": content}
    if cid:
        m["tool_call_id"] = cid
    if name:
        m["name"] = name
    return m


# Declarations of the tools the calls below name (a call to an undeclared tool is rejected: test_tool_call_checks.py).
TOOLS = [{"type": "function", "function": {"name": name}} for name in ("f", "g", "w")]


def code_of(messages, **kw) -> tuple[Reason, int | None]:
    opts = Options(**{k: v for k, v in kw.items() if k in ("late_system", "missing_reasoning", "render_check")})
    rec = {"messages": messages, **{k: v for k, v in kw.items() if k in ("tools", "chat_template_kwargs")}}
    with pytest.raises(RecordError) as info:
        validate(rec, opts)
    return info.value.code, info.value.message_index


def ok(messages, counters=None, **kw):
    opts = Options(**{k: v for k, v in kw.items() if k in ("late_system", "missing_reasoning")})
    rec = {"messages": messages, **{k: v for k, v in kw.items() if k in ("tools", "chat_template_kwargs")}}
    out = validate(rec, opts, counters)
    RENDER(out)
    return out


@pytest.mark.parametrize(("messages", "expected"), [
    ([], (Reason.EMPTY_CONVERSATION, None)),
    ([U()], (Reason.NO_ASSISTANT_TURN, None)),
    ([U(), {"role": "narrator", "content": "x"}, A()], (Reason.UNKNOWN_ROLE, 1)),
    ([U(), A(), {"role": "system", "content": "late"}, U(), A()], (Reason.LATE_SYSTEM, 2)),
    ([U(), T()], (Reason.TOOL_RESULT_WITHOUT_CALL, 1)),
    ([U(), A(None, calls=[C(cid="1")]), T(cid="2"), A()], (Reason.TOOL_RESULT_WITHOUT_CALL, 2)),
    ([U(), A(None, calls=[C()]), T(), T(), A()], (Reason.TOOL_RESULT_WITHOUT_CALL, 3)),
    ([U(), A(None, calls=[C("f"), C("g")]), T(name="g"), T(name="f"), A()], (Reason.TOOL_RESULT_WITHOUT_CALL, 2)),
    ([U(), A(None, calls=[C()]), U(), A()], (Reason.CALL_WITHOUT_RESULT, 1)),
    ([U(), A(None, calls=[C(), C("g")]), T(), A()], (Reason.CALL_WITHOUT_RESULT, 1)),
    ([U(), A(None, calls=[C()]), A()], (Reason.CALL_WITHOUT_RESULT, 2)),
    ([U(), A(None, calls=[C(cid="x"), C(cid="x")]), T(cid="x"), T(cid="x"), A()], (Reason.DUPLICATE_CALL_ID, 1)),
    ([U(), A(None, calls=[C(cid="x"), C("g", cid="y")]), T(cid="x"), T(cid="x"), A()],
     (Reason.DUPLICATE_CALL_ID, 3)),
    ([U(), A(None, calls=[C(args="{}")])], (Reason.ARGUMENTS_NOT_OBJECT, 1)),
    ([U(), A(None, calls=[C(args={"code": "a</rfl:parameter>b"})])], (Reason.PARAMETER_CLOSE_TAG_IN_ARGUMENT, 1)),
    ([U(), A(None, calls=[C(args={"x": {"deep": ["</rfl:parameter>"]}})])],
     (Reason.PARAMETER_CLOSE_TAG_IN_ARGUMENT, 1)),
    ([U(), A(None, calls=[C(args={'na"me': 1})])], (Reason.BAD_ARGUMENTS_JSON, 1)),
    ([U(), A(None, calls=[C(name="two words")])], (Reason.BAD_CONTENT, 1)),
    ([U("a <|end|> b"), A()], (Reason.HARMONY_MARKER_IN_TEXT, 0)),
    ([U(), A(reasoning="x<|channel|>final")], (Reason.HARMONY_MARKER_IN_TEXT, 1)),
    ([U(), A(content="<|return|>")], (Reason.HARMONY_MARKER_IN_TEXT, 1)),
    ([U(), A(None, calls=[C(args={"q": "<|call|>"})])], (Reason.HARMONY_MARKER_IN_TEXT, 1)),
    ([U(), A(None, calls=[C()]), T("<|start|>x"), A()], (Reason.HARMONY_MARKER_IN_TEXT, 2)),
    ([{"role": "system", "content": "<|message|>"}, U(), A()], (Reason.HARMONY_MARKER_IN_TEXT, 0)),
    ([U(), A(content="")], (Reason.BAD_CONTENT, 1)),
    ([U(), {"role": "assistant", "content": 5, "reasoning_content": "r"}], (Reason.BAD_CONTENT, 1)),
])
def test_each_rejection_has_its_code_and_message_index(messages, expected):
    assert code_of(copy.deepcopy(messages)) == expected


def test_missing_reasoning_policies_on_single_and_multi_turn_records():
    multi = [U(), A(reasoning=""), U(), A(None, reasoning="", calls=[C()]), T(), A()]
    # mask (the default): every turn without reasoning becomes weight 0, the rest stay trained
    counters: dict = {}
    out = ok(copy.deepcopy(multi), counters, tools=TOOLS)
    assert [m.get("weight") for m in out["messages"] if m["role"] == "assistant"] == [0, 0, None]
    assert counters == {"masked_missing_reasoning": 2}
    assert code_of([U(), A(reasoning="")]) == (Reason.NOTHING_TO_TRAIN, None)
    assert code_of([U(), A(reasoning=""), U(), A(reasoning="")]) == (Reason.NOTHING_TO_TRAIN, None)
    # keep: trained with an empty analysis, counted
    counters = {}
    out = ok(copy.deepcopy(multi), counters, missing_reasoning="keep", tools=TOOLS)
    assert all("weight" not in m for m in out["messages"]) and counters == {"missing_reasoning": 2}
    assert ok([U(), A(reasoning="")], missing_reasoning="keep")["messages"][1]["reasoning_content"] == ""
    # reject: the first turn without reasoning names the record's reason
    assert code_of([U(), A(reasoning="")], missing_reasoning="reject") == (Reason.MISSING_REASONING, 1)
    assert code_of(copy.deepcopy(multi), missing_reasoning="reject", tools=TOOLS) == (Reason.MISSING_REASONING, 1)
    assert ok([U(), A(), U(), A()], missing_reasoning="reject")["messages"][3]["reasoning_content"] == "r"


def test_loss_weights_are_checked_and_written_as_weight():
    counters: dict = {}
    out = ok([U(), {**A(), "weight": 0}, U(), {**A(), "train": True}, U(), {**A(), "weight": 1}], counters)
    assert [m.get("weight") for m in out["messages"][1::2]] == [0, 1, 1]
    assert all("train" not in m for m in out["messages"]) and counters == {"masked_weight": 1}
    assert ok([U(), {**A(), "train": False}, U(), A()])["messages"][1]["weight"] == 0
    assert code_of([U(), {**A(), "weight": 0}]) == (Reason.NOTHING_TO_TRAIN, None)
    for bad in ({"weight": 2}, {"weight": 0.5}, {"weight": "0"}, {"weight": True}, {"train": 1},
                {"weight": 0, "train": True}):
        assert code_of([U(), {**A(), **bad}]) == (Reason.BAD_WEIGHT, 1), bad
    assert code_of([{**U(), "weight": 0}, A()]) == (Reason.BAD_WEIGHT, 0)
    assert code_of([U(), A(None, calls=[C()]), {**T(), "train": False}, A()]) == (Reason.BAD_WEIGHT, 2)
    # consecutive assistant messages become one turn: a weight 0 among them keeps it untrained
    merged = ok([U(), {**A(), "weight": 0}, A("b"), U(), A()])
    assert merged["messages"][1]["weight"] == 0 and merged["messages"][1]["content"] == "a\n\nb"


def test_late_system_moved_on_request():
    counters: dict = {}
    out = ok([{"role": "system", "content": "s1"}, U(), A(), {"role": "developer", "content": "s2"}, U(), A()],
             counters, late_system="move")
    assert [m["role"] for m in out["messages"]] == ["system", "developer", "user", "assistant", "user", "assistant"]
    assert counters == {"moved_system": 1}


def test_consecutive_assistant_messages_merge_and_results_are_reordered_and_named():
    counters: dict = {}
    msgs = [U(), A("", "think"), A("I'll call.", "", calls=[C("f", {"a": 1}, "1"), C("g", {"b": 2}, "2")]),
            T("G", cid="2"), T("F", cid="1"), A("done", "r")]
    out = ok(msgs, counters, tools=TOOLS)
    m = out["messages"]
    assert m[1] == {"role": "assistant", "reasoning_content": "think\n\nI'll call.",
                    "tool_calls": [C("f", {"a": 1}, "1"), C("g", {"b": 2}, "2")]}
    assert m[2] == {"role": "tool", "name": "f", "tool_call_id": "1", "content": "F"}
    assert m[3] == {"role": "tool", "name": "g", "tool_call_id": "2", "content": "G"}
    assert counters == {"merged_assistant": 1, "folded_content": 1}


def test_trailing_call_without_result_is_kept():
    out = ok([U(), A(None, calls=[C("f", {"x": 1})])], tools=TOOLS)
    assert out["messages"][-1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}


def test_tool_schema_and_kwargs_checks():
    tool = {"type": "function", "function": {"name": "f", "description": "<|start|> oops"}}
    assert code_of([U(), A()], tools=[tool])[0] is Reason.HARMONY_MARKER_IN_TEXT
    assert code_of([U(), A()], chat_template_kwargs={"reasoning_effort": "none"})[0] is Reason.BAD_TEMPLATE_KWARGS
    assert code_of([U(), A()], chat_template_kwargs={"reasoning_effort": 1.5})[0] is Reason.BAD_TEMPLATE_KWARGS
    assert code_of([U(), A()], chat_template_kwargs={"reasoning_effort": True})[0] is Reason.BAD_TEMPLATE_KWARGS
    for effort in ("minimal", "low", "medium", "high", "xhigh", "max", 8, 300):
        ok([U(), A()], chat_template_kwargs={"reasoning_effort": effort})


def test_render_check_is_the_last_safety_net():
    def boom(rec):
        raise ValueError("template says no")

    assert code_of([U(), A()], render_check=boom) == (Reason.RENDER_FAILED, None)
    rendered = make_render_check()({"messages": [U("hi"), A("yo", "greet")]})
    assert rendered.endswith("<|start|>assistant<|channel|>analysis<|message|>greet<|end|>"
                             "<|start|>assistant<|channel|>final<|message|>yo<|return|>")


def test_render_check_through_the_bundled_tokenizer_matches_the_template():
    from beam_sft.template.tokenizer import load_tokenizer

    rec = {"messages": [U("weather?"), A(None, "tool", calls=[C("w", {"city": "Oslo"}, "1")]), T("cold", "1"),
                        A("Cold.", "say")], "chat_template_kwargs": {"reasoning_effort": "low"}, "tools": TOOLS}
    out = validate(copy.deepcopy(rec))
    assert make_render_check(tokenizer=load_tokenizer())(out) == make_render_check()(out)


_text = st.lists(st.sampled_from([*"ab <|>/\né", "<|end|>", "</rfl:parameter>", "<think>"]), max_size=8).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool", "system", "call"]), _text, _text),
                min_size=0, max_size=7))
def test_anything_accepted_renders(turns):
    """Random message sequences: validation accepts or rejects with a code; whatever it accepts renders."""
    msgs = []
    for k, (kind, a, b) in enumerate(turns):
        if kind == "call":
            msgs.append(A(a, b, calls=[C("f", {"x": a}, f"id{k}")]))
        elif kind == "assistant":
            msgs.append(A(a, b))
        elif kind == "tool":
            msgs.append(T(a))
        else:
            msgs.append({"role": kind, "content": a})
    try:
        out = validate({"messages": msgs})
    except RecordError as err:
        assert isinstance(err.code, Reason)
        return
    RENDER(out)


def test_beam_records_from_elsewhere_reasoning_fields_and_missing_content():
    out = ok([U(), {"role": "assistant", "thinking": "t", "content": "a"},
              U(), {"role": "assistant", "reasoning": "r2", "tool_calls": [C("f", {"x": 1})]}], tools=TOOLS)
    assert out["messages"][1] == {"role": "assistant", "reasoning_content": "t", "content": "a"}
    assert out["messages"][3] == {"role": "assistant", "reasoning_content": "r2", "tool_calls": [C("f", {"x": 1})]}


def test_record_types_declare_every_key_validate_writes():
    """`beam_sft.records.types` stays true to what `validate` writes: no record, message, call or tool key that
    its TypedDicts do not declare."""
    from beam_sft.records.types import BeamRecord, FunctionCall, FunctionSpec, Message, ToolCall, ToolSpec

    tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    out = ok([{"role": "system", "content": "s"}, U(), A("", calls=[C(cid="c1")]), T(cid="c1"), A(reasoning=""),
              U(), A()], tools=[tool], chat_template_kwargs={"reasoning_effort": "low"}, missing_reasoning="mask")
    assert set(out) <= set(BeamRecord.__annotations__)
    for m in out["messages"]:
        assert set(m) <= set(Message.__annotations__), m
        for call in m.get("tool_calls", ()):
            assert set(call) <= set(ToolCall.__annotations__) and set(call["function"]) <= set(
                FunctionCall.__annotations__)
    assert set(out["tools"][0]) <= set(ToolSpec.__annotations__)
    assert set(out["tools"][0]["function"]) <= set(FunctionSpec.__annotations__)
    assert {"weight", "tool_call_id", "name", "tool_calls"} <= {k for m in out["messages"] for k in m}
