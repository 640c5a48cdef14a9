"""beam_sft.eval.metrics on hand-built generations: each metric's edge cases, parsed by the bundled
tokenizer's response template exactly as `beam-sft eval` parses model output. No model involved (fast)."""

from __future__ import annotations

import copy

import pytest

from beam_sft.eval.backends import Generation
from beam_sft.eval.metrics import (
    METRICS,
    EvalResult,
    TurnResult,
    same_json,
    schema_errors,
    score_turn,
)
from beam_sft.eval.report import summary_table
from beam_sft.eval.run import EvalOptions, evaluate, parse_generation
from beam_sft.eval.turns import Turn, assistant_indices
from beam_sft.template.conformance import GET_WEATHER


def _weather_tool() -> dict:
    """conformance's get_weather (city: string, required; days: integer) plus a `unit` enum."""
    tool = copy.deepcopy(GET_WEATHER)
    tool["function"]["parameters"]["properties"]["unit"] = {"type": "string", "enum": ["celsius", "fahrenheit"]}
    return tool


TOOLS = [
    _weather_tool(),
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]
USER = [{"role": "user", "content": "Weather in Paris, in celsius?"}]
CALL_REF = {
    "role": "assistant",
    "reasoning_content": "Call the tool.",
    "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                     "arguments": {"city": "Paris", "unit": "celsius"}}}],
}
ANSWER_REF = {"role": "assistant", "reasoning_content": "Easy.", "content": "It is 18 C in Paris."}


def args_xml(arguments: dict) -> str:
    return "".join(f'<rfl:parameter name="{k}">\n{v}\n</rfl:parameter>' for k, v in arguments.items())


def call_text(name="get_weather", arguments=None, stop="<|call|>", thinking="Call the tool.") -> str:
    arguments = {"city": "Paris", "unit": "celsius"} if arguments is None else arguments
    return (f"<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant to={name}<|channel|>analysis "
            f"<|constrain|>xml<|message|>{args_xml(arguments)}{stop}")


def answer_text(content="It is 18 C in Paris.", stop="<|return|>", thinking="Easy.") -> str:
    return (f"<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant<|channel|>final<|message|>"
            f"{content}{stop}")


def score(tok, reference, text, stop):
    """Parse `text` like the eval loop does (prefix = the prompt, tools = the record's) and score it."""
    prompt = tok.apply_chat_template(USER, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    turn = Turn(0, 1, reference, TOOLS, "openai", "default", prompt)
    parsed, error = parse_generation(tok, turn, Generation(text, 0, stop))
    assert not error
    return score_turn(reference, parsed, stop, TOOLS)


def test_the_reference_itself_passes_every_metric(tok):
    # What the template renders for the reference turn is a perfect generation.
    prompt = tok.apply_chat_template(USER, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*USER, CALL_REF], tools=TOOLS, tokenize=False)
    metrics, reason = score(tok, CALL_REF, full[len(prompt):], "<|call|>")
    assert reason == ""
    assert metrics == {"well_formed": True, "stopped": True, "has_reasoning": True, "degenerate_reasoning": False,
                       "action_match": True,
                       "tool_name_accuracy": True, "tool_args_exact": True, "tool_args_valid": True,
                       "marker_leak": False, "answer_exact": None}
    metrics, _ = score(tok, ANSWER_REF, answer_text(), "<|return|>")
    assert metrics == {"well_formed": True, "stopped": True, "has_reasoning": True, "degenerate_reasoning": False,
                       "action_match": True,
                       "tool_name_accuracy": None, "tool_args_exact": None, "tool_args_valid": None,
                       "marker_leak": False, "answer_exact": True}


def test_wrong_stop_token(tok):
    # A call that ends on <|return|>: well formed (it stopped), but not on the stop token a call needs.
    metrics, _ = score(tok, CALL_REF, call_text(stop="<|return|>"), "<|return|>")
    assert metrics["well_formed"] and metrics["tool_args_exact"]
    assert metrics["stopped"] is False
    # An answer ending on <|call|>.
    metrics, _ = score(tok, ANSWER_REF, answer_text(stop="<|call|>"), "<|call|>")
    assert metrics["stopped"] is False


def test_wrong_tool(tok):
    metrics, reason = score(tok, CALL_REF, call_text(name="get_time", arguments={"tz": "CET"}), "<|call|>")
    assert metrics["action_match"] is True  # it did call
    assert metrics["tool_name_accuracy"] is False and metrics["tool_args_exact"] is False
    assert metrics["tool_args_valid"] is True  # a valid call of another declared tool
    # A tool the record does not declare: not well formed, not valid.
    metrics, reason = score(tok, CALL_REF, call_text(name="send_email", arguments={"to": "x"}), "<|call|>")
    assert metrics["well_formed"] is False and "unknown tool" in reason
    assert metrics["tool_args_valid"] is False and metrics["tool_name_accuracy"] is False


def test_extra_argument(tok):
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"city": "Paris", "unit": "celsius", "mood": "sunny"}),
                       "<|call|>")
    assert metrics["tool_name_accuracy"] is True
    assert metrics["tool_args_exact"] is False and metrics["tool_args_valid"] is False
    assert metrics["well_formed"] is True


def test_enum_violation_and_types(tok):
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"city": "Paris", "unit": "kelvin"}), "<|call|>")
    assert metrics["tool_args_valid"] is False and metrics["tool_args_exact"] is False
    # parse_response casts "3" to 3 for an integer parameter, so this is valid ...
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"city": "Paris", "days": "3"}), "<|call|>")
    assert metrics["tool_args_valid"] is True
    # ... and "soon" stays a string, which an integer parameter refuses.
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"city": "Paris", "days": "soon"}), "<|call|>")
    assert metrics["tool_args_valid"] is False
    # Missing the required city.
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"unit": "celsius"}), "<|call|>")
    assert metrics["tool_args_valid"] is False


def test_marker_inside_content(tok):
    metrics, reason = score(tok, ANSWER_REF, answer_text(content="It is <|channel|> 18 C."), "<|return|>")
    assert metrics["marker_leak"] is True
    assert metrics["well_formed"] is False and "marker" in reason
    # Inside an argument value: also a leak (the well-formed rule only looks at text fields).
    metrics, _ = score(tok, CALL_REF, call_text(arguments={"city": "Par<|start|>is"}), "<|call|>")
    assert metrics["marker_leak"] is True


def test_truncated_at_the_bound(tok):
    text = answer_text(stop="")[:-5]  # cut mid-answer, no stop token
    metrics, reason = score(tok, ANSWER_REF, text, None)
    assert metrics["well_formed"] is False and "no stop token" in reason
    assert metrics["stopped"] is False and metrics["answer_exact"] is False


def test_answer_instead_of_call_and_whitespace(tok):
    metrics, _ = score(tok, CALL_REF, answer_text(), "<|return|>")
    assert metrics["action_match"] is False and metrics["stopped"] is False
    assert metrics["tool_name_accuracy"] is False and metrics["tool_args_exact"] is False
    assert metrics["tool_args_valid"] is None  # no call generated: nothing to validate
    metrics, _ = score(tok, ANSWER_REF, answer_text(content="It is  18 C\nin Paris. "), "<|return|>")
    assert metrics["answer_exact"] is True
    metrics, _ = score(tok, ANSWER_REF, answer_text(content="It is 19 C in Paris."), "<|return|>")
    assert metrics["answer_exact"] is False and metrics["well_formed"] is True


def test_no_reasoning_and_unparsed():
    metrics, reason = score_turn(ANSWER_REF, {"role": "assistant", "content": "Hi"}, "<|return|>", None)
    assert metrics["has_reasoning"] is False and metrics["well_formed"] is False and reason == "no thinking"
    metrics, reason = score_turn(ANSWER_REF, None, "<|return|>", None)
    assert metrics["well_formed"] is False and metrics["action_match"] is True and metrics["answer_exact"] is False


def test_parallel_calls_order_matters():
    ref = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "A"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {}}}]}
    swapped = {"role": "assistant", "thinking": "t", "tool_calls": list(reversed(ref["tool_calls"]))}
    metrics, _ = score_turn(ref, swapped, "<|call|>", TOOLS)
    assert metrics["tool_name_accuracy"] is False and metrics["tool_args_valid"] is True
    metrics, _ = score_turn(ref, {**swapped, "tool_calls": ref["tool_calls"][:1]}, "<|call|>", TOOLS)
    assert metrics["tool_name_accuracy"] is False and metrics["tool_args_exact"] is False


@pytest.mark.parametrize(
    ("value", "schema", "ok"),
    [
        ({"a": {"b": [1, 2]}}, {"type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "array", "items": {"type": "integer"}}}}}}, True),
        ({"a": {"b": [1, "x"]}}, {"type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "array", "items": {"type": "integer"}}}}}}, False),
        ({"a": {"c": 1}}, {"type": "object", "properties": {"a": {"type": "object", "properties": {
            "b": {"type": "string"}}, "required": ["b"]}}}, False),
        ({"x": [{"k": "v"}]}, {"type": "object", "properties": {"x": {"type": "array", "items": {
            "type": "object", "properties": {"k": {"type": "string", "enum": ["v"]}}}}}}, True),
        ({"n": True}, {"type": "object", "properties": {"n": {"type": "integer"}}}, False),
        ({"n": 2.0}, {"type": "object", "properties": {"n": {"type": "integer"}}}, True),
        ({"n": 2.5}, {"type": "object", "properties": {"n": {"type": "number", "maximum": 2}}}, False),
        ({"n": None}, {"type": "object", "properties": {"n": {"type": ["string", "null"]}}}, True),
        ({"n": 3}, {"type": "object", "properties": {"n": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
         True),
        ({"n": 3.5}, {"type": "object", "properties": {"n": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
         False),
        ({"free": 1}, {"type": "object"}, True),  # no properties listed: any keys
        ({"free": 1}, {"type": "object", "properties": {}, "additionalProperties": True}, True),
        ({"free": 1}, {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}, False),
        ({}, {}, True),
    ],
)
def test_schema_validator(value, schema, ok):
    assert (not schema_errors(value, schema)) is ok, schema_errors(value, schema)


def test_same_json():
    assert same_json({"a": 1, "b": [1.0]}, {"b": [1], "a": 1})
    assert not same_json({"a": True}, {"a": 1})
    assert not same_json({"a": "1"}, {"a": 1})


def test_tally_rates_and_summary_keys():
    result = EvalResult()
    turn = Turn(0, 1, ANSWER_REF, None, "sharegpt", "low", "p")
    result.count_record("sharegpt", "low")
    for content, stop in (("It is 18 C in Paris.", "<|return|>"), ("x", None)):
        metrics, reason = score_turn(ANSWER_REF, {"thinking": "t", "content": content}, stop, None)
        result.add(TurnResult(turn, Generation("", 5, stop), None, "", metrics, reason), keep=10)
    summary = result.summary()
    assert list(summary) == ["records", "turns", *METRICS, "mean_analysis_tokens", "by_format", "by_effort", "rejected",
                             "generation_tokens", "tokens_per_second"]
    assert summary["turns"] == 2 and summary["well_formed"] == 0.5 and summary["tool_args_valid"] is None
    assert summary["by_format"]["sharegpt"]["answer_exact"] == 0.5 and summary["by_effort"]["low"]["turns"] == 2
    assert summary["generation_tokens"] == 10 and result.failed_turns == 1 and len(result.failures) == 1
    assert "well_formed" in summary_table(result) and "50.0% 1/2" in summary_table(result)


def test_turn_selection():
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    assert assistant_indices(record, "first") == [1]
    assert assistant_indices(record, "last") == [3]
    assert assistant_indices(record, "all") == [1, 3]


def test_reasoning_figures_empty_analysis_and_mean_length(tok):
    from beam_sft.eval.metrics import analysis_tokens, empty_analysis

    assert empty_analysis("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>hi")
    assert empty_analysis("<|channel|>analysis<|message|>  \n<|end|>")
    assert not empty_analysis("<|channel|>analysis<|message|>Think.<|end|>")
    assert not empty_analysis("<|channel|>final<|message|>hi<|return|>")  # no analysis at all: has_reasoning says it
    assert analysis_tokens(tok, {"thinking": "The user greets me."}) == len(tok.encode("The user greets me.",
                                                                                     add_special_tokens=False)) > 0
    assert analysis_tokens(tok, {"content": "x"}) == analysis_tokens(tok, None) == 0
    # through evaluate(): one turn with reasoning, one with an empty analysis
    final = "<|start|>assistant<|channel|>final<|message|>"
    texts = [f"<|channel|>analysis<|message|>Say hello.<|end|>{final}Hello<|return|>",
             f"<|channel|>analysis<|message|><|end|>{final}Hi<|return|>"]

    class Canned:
        name = "canned"

        def generate(self, prompts):
            return [Generation(texts[k % 2], 5, "<|return|>") for k in range(len(prompts))]

    records = [({"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "Hello",
                                                                    "reasoning_content": "r"}]}, "openai")
               for k in range(2)]
    result = evaluate(Canned(), tok, records, EvalOptions(progress=False))
    summary = result.summary()
    assert summary["empty_analysis"] == 0.5 and summary["has_reasoning"] == 0.5
    assert summary["mean_analysis_tokens"] == analysis_tokens(tok, {"thinking": "Say hello."}) / 2
    assert "empty_analysis" in summary_table(result) and "mean analysis tokens" in summary_table(result)


def test_degenerate_reasoning_counts_loops_and_analyses_cut_at_the_bound(tok):
    from beam_sft.eval.metrics import degenerate_reasoning

    final = "<|start|>assistant<|channel|>final<|message|>"
    loop = "I check the weather again. " * 12
    texts = [f"<|channel|>analysis<|message|>The user greets me; I greet back.<|end|>{final}Hello<|return|>",
             f"<|channel|>analysis<|message|>{loop}<|end|>{final}Hello<|return|>",  # a loop, then an answer
             "<|channel|>analysis<|message|>First I need to look at the forecast for",  # cut inside the analysis
             f"<|channel|>analysis<|message|><|end|>{final}Hi<|return|>"]  # no reasoning: not counted
    stops = ["<|return|>", "<|return|>", None, "<|return|>"]

    class Canned:
        name = "canned"

        def generate(self, prompts):
            return [Generation(texts[k], 5, stops[k]) for k in range(len(prompts))]

    records = [({"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "Hello",
                                                                    "reasoning_content": "r"}]}, "openai")
               for k in range(4)]
    result = evaluate(Canned(), tok, records, EvalOptions(progress=False))
    summary = result.summary()
    assert summary["has_reasoning"] == 0.75 and summary["degenerate_reasoning"] == 2 / 3
    assert "degenerate_reasoning" in summary_table(result)
    assert degenerate_reasoning({"thinking": "ok", "content": "x"}, None) is False  # cut in the answer, not in it
    assert degenerate_reasoning({"content": "x"}, "<|return|>") is None


def test_a_final_answer_followed_by_more_messages_is_not_well_formed(tok):
    # What the quickstart model wrote once: finals closed by <|end|>, the turn going on. parse_response keeps the
    # last final and vLLM's parser joins them, so only the raw text can say the turn is malformed.
    from beam_sft.eval.metrics import structure_error

    final = "<|start|>assistant<|channel|>final<|message|>"
    text = (f"<|channel|>analysis<|message|>Uppercase every letter.<|end|>{final}A one-line function.<|end|>"
            f"{final}The capital of 16.<|return|>")
    assert "closed by <|end|>" in structure_error(text)
    assert structure_error(answer_text()) == structure_error(call_text()) == structure_error(None) == ""
    assert structure_error(answer_text(stop="")) == ""  # a server's token ids may leave the stop token out
    assert "closed by <|call|>" in structure_error(answer_text(stop="<|call|>") + f"{final}x<|return|>")
    two_calls = call_text(stop="<|end|>") + "<|start|>assistant" + call_text(stop="<|call|>").split("<|start|>assistant")[1]
    assert structure_error(two_calls) == ""  # parallel calls: each closed by <|end|>, the last by <|call|>
    # SmolLM2 on a held-out record: a call closed by <|end|>, then an analysis and a final answer
    assert "followed by something other than a call" in structure_error(
        call_text(stop="<|end|>") + "<|start|>assistant" + answer_text())
    assert "followed by something other than a call" in structure_error(
        call_text(stop="<|end|>") + "<|start|>assistant<|channel|>analysis<|message|>More.<|end|>")

    class Canned:
        name = "canned"

        def generate(self, prompts):
            return [Generation([text, answer_text("Hello")][k % 2], 5, "<|return|>") for k in range(len(prompts))]

    records = [({"messages": [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": "Hello",
                                                                    "reasoning_content": "r"}]}, "openai")
               for k in range(2)]
    result = evaluate(Canned(), tok, records, EvalOptions(progress=False))
    assert result.summary()["well_formed"] == 0.5
    [failed] = [r for r in result.failures if not r.metrics["well_formed"]]
    assert "closed by <|end|>" in failed.reason and failed.parsed["content"] == "The capital of 16."
