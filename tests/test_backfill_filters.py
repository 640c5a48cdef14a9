"""The backfill filters: synthetic loops, cuts, copies and narration are caught; no real reasoning is.

The real reasoning is every trace in the real samples (tests/data/realdata: harmony/, reasoning/, the
llamafactory reason/tool-use demo) and the bundled data/samples, each checked against its own reference
reply and tools, as the teacher's answer for that turn would be.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_sft.backfill import filters as F
from beam_sft.backfill.filters import check
from beam_sft.eval import degenerate as D

REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "tests" / "data" / "realdata"
REAL_REASONING = [REAL / "harmony", REAL / "reasoning", REAL / "openai" / "llamafactory_v1_reason_tool_use_demo_50.jsonl",
                  REPO / "data" / "samples"]
_ANALYSIS_RE = re.compile(r"<\|channel\|>analysis<\|message\|>(.*?)(?=<\|end\|>|<\|call\|>|<\|return\|>|<\|start\|>|$)",
                          re.DOTALL)
ANSWER = {"role": "assistant", "content": "Of course! I can help you with that. Please tell me what ingredients you "
                                          "have and how much time you want to spend cooking tonight."}
CALL = {"role": "assistant", "tool_calls": [{"function": {"name": "search_recipes", "arguments": {"q": "rice"}}}]}


def _check(text, ref=ANSWER, stopped=True, tools=None):
    return check(text, ref, tools, max_tokens=None, count_tokens=len, stopped=stopped)


def real_traces() -> list[tuple[str, str, dict, list | None]]:
    """(source, reasoning, its assistant message, the record's tools) for every real trace."""
    from beam_sft.records.files import read_items
    from beam_sft.validate.convert import convert_item
    from beam_sft.validate.rules import Options

    keep = Options(missing_reasoning="keep")
    traces = []
    for path in REAL_REASONING:
        for item in read_items([str(path)], "train"):
            record, _, _ = convert_item(item, "auto", keep)
            for m in (record or {}).get("messages", []):
                if m["role"] == "assistant" and m.get("reasoning_content"):
                    traces.append((path.name, m["reasoning_content"], m, record.get("tools")))
    # Raw Harmony transcripts (not records): their analysis messages, without a reference.
    for path in sorted((REAL / "harmony").rglob("*.txt")):
        for match in _ANALYSIS_RE.finditer(path.read_text(encoding="utf-8")):
            traces.append((path.name, match.group(1), {"role": "assistant"}, None))
    return traces


@pytest.fixture(scope="module")
def traces():
    return real_traces()


def test_no_real_reasoning_is_filtered(traces):
    sources = {s for s, *_ in traces}
    assert len(traces) > 350 and {"samples", "reasoning", "harmony"} <= sources
    assert any(s.endswith(".txt") for s in sources) and "llamafactory_v1_reason_tool_use_demo_50.jsonl" in sources
    failed = [(s, reason, text) for s, text, m, tools in traces
              if (reason := check(text, m, tools, max_tokens=None, count_tokens=len, stopped=True))]
    # One real trace argues for another action than its reply takes, and is caught for it: it ends "I'll call the
    # data_predictive_modeling tool with these parameters." and the reply declines ("Apologies, but I don't have
    # the capability to execute predictive modeling tools directly.").
    assert [(s, reason) for s, reason, _ in failed] == [("llamafactory_v1_reason_tool_use_demo_50.jsonl",
                                                        "contradicts_reply")]
    assert "I'll call the data_predictive_modeling tool" in failed[0][2]


def test_real_reasoning_stays_clear_of_the_thresholds(traces):
    """Not only unfiltered: the measures stay clear of the thresholds documented in eval/degenerate.py."""
    texts = [t for _, t, _, _ in traces]
    assert max(D.repeated_ngram_share(t) for t in texts) < 0.3 < D.MAX_REPEATED_NGRAMS
    assert min(D.compression_ratio(t) for t in texts) > 0.35 > D.MIN_COMPRESSION_RATIO
    assert max(D.max_line_repeats(t) for t in texts) <= D.MAX_LINE_REPEATS


_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=9)


@settings(max_examples=60, deadline=None)
@given(phrase=st.lists(_word, min_size=2, max_size=8), times=st.integers(5, 30), sep=st.sampled_from([" ", "\n", "\n\n"]))
def test_a_phrase_looped_is_repetitive(phrase, times, sep):
    text = sep.join([" ".join(phrase)] * times)
    if len(D.words(text)) >= D.NGRAM + D.MIN_NGRAMS:
        assert _check(text) == "repetitive"


@settings(max_examples=40, deadline=None)
@given(start=st.integers(0, 1000), times=st.integers(8, 30))
def test_a_loop_with_a_counter_is_repetitive(start, times):
    """The 4-grams differ (the number changes); the compression ratio or the repeated lines catch it."""
    text = "\n".join(f"Step {start + k}: the assistant checks the list of recipes again." for k in range(times))
    assert D.is_repetitive(text)


@settings(max_examples=40, deadline=None)
@given(words=st.lists(_word, min_size=3, max_size=40, unique=True))
def test_a_cut_answer_is_truncated_and_an_unknown_end_is_not(words):
    text = "I need to " + " ".join(words)
    assert _check(text, stopped=False) == "truncated"
    assert _check(text, stopped=None) is None and _check(text, stopped=True) is None


@pytest.mark.parametrize("text", [
    ANSWER["content"],
    "Sure. " + ANSWER["content"],
    "I will say: " + ANSWER["content"].upper(),
    "I'd greet them: Of course! I can help you with that. Please tell me what ingredients you have and so on.",
])
def test_copies_of_the_reference_answer(text):
    assert _check(text) == "restates_reply"


def test_a_near_verbatim_restatement_is_a_copy():
    ref = {"role": "assistant", "content": "The Great Wall of China is one of the most iconic landmarks in the world, "
                                           "known for its size and the ingenuity that was required to build it."}
    text = ("The Great Wall of China is one of the most famous landmarks in the world, known for its size and the "
            "ingenuity required to build it.")  # no run of 12 words, but nearly every 3-gram
    assert F.longest_common_run(text, ref["content"]) < F.MIN_COPIED_RUN and _check(text, ref) == "restates_reply"


def test_the_worked_example_copied_into_another_conversation():
    text = "The user wants to know what Photoshop is. I do not know today's term, and call it with base Photoshop."
    assert _check(text) == "copies_example"


def test_a_short_answer_drafted_in_reasoning_is_not_a_copy():
    ref = {"role": "assistant", "content": "The capital of Japan is Tokyo."}
    assert _check("The capital of Japan is Tokyo. One short sentence is enough.", ref) is None
    assert _check("The capital of Japan is Tokyo.", ref) == "restates_reply"  # nothing but the answer


def test_tool_arguments_may_be_named_before_a_call():
    assert _check("The user has rice; I search recipes with q set to rice.", CALL) is None


@pytest.mark.parametrize("text", [
    "The assistant's next reply is: a list of recipes.",
    "The assistant responds with a greeting and asks for the ingredients.",
    "The next reply asks the user for their ingredients.",
    "In the given response, the AI offers help.",
    "The assistant calls:\n\nThe area of the circle is 12 units.",
    "The user wants to know how blockchain works.\n\nThe answer is:\n\nBlockchain is a ledger.",
])
def test_narration_about_the_reply(text):
    assert _check(text) == "narration"


@pytest.mark.parametrize("text", [
    "## Conversation so far\n[user]\nI have rice.",
    "The assistant calls tools:\ncall search_recipes({})",
    "[assistant]\nOf course!",
])
def test_the_prompt_echoed(text):
    assert _check(text) == "echoes_prompt"


def test_first_person_reasoning_passes():
    text = ("The user wants to cook but has not said what they have. I cannot search for recipes without the "
            "ingredients, so I should offer help and ask which ingredients they have.")
    assert _check(text) is None and _check(text, CALL) is None


def test_a_tool_ruled_out_is_not_argued_for():
    tools = [{"function": {"name": "search_recipes"}}, {"function": {"name": "calculate_area"}}]
    assert _check("I search recipes. So no need to call calculate_area.", CALL, tools=tools) is None
    assert _check("I should call calculate_area first.", CALL, tools=tools) == "names_other_tool"


def test_an_answer_that_goes_on_to_the_next_prompt_is_cut_there():
    from beam_sft.backfill.prompt import STOP
    from beam_sft.backfill.teachers import Answer, cut_at_stop

    cut = cut_at_stop(Answer("I ask for the ingredients.\n\nThoughts before this reply?\nThe", False), STOP)
    assert cut == Answer("I ask for the ingredients.\n", True)  # it ended its thought: not truncated
    assert cut_at_stop(Answer("I ask.", False), STOP) == Answer("I ask.", False)


# Each reasoning against the reply it was written for: the other action argued for (contradicts_reply) or the
# action the reply takes (None).
@pytest.mark.parametrize(("text", "ref", "expected"), [
    ("I can't find the exact stock ticker symbol, so I tell them to ask for clarification.", CALL, "contradicts_reply"),
    ("The user gave no ingredients. I should ask them for the ingredients first.", CALL, "contradicts_reply"),
    ("I cannot help with that: no declared tool orders food.", CALL, "contradicts_reply"),
    ("The user wants recipes with rice, so I call search_recipes with q rice.", ANSWER, "contradicts_reply"),
    ("The user wants rice recipes. I'll call search_recipes.", ANSWER, "contradicts_reply"),
    ("The user wants rice recipes. I get it by calling search_recipes(\"rice\").", ANSWER, "contradicts_reply"),
    ("The user has rice; I call search_recipes with q rice.", CALL, None),
    ("The user asked for recipes; I don't know them offhand, so I call search_recipes.", CALL, None),
    ("The user gave no ingredients, so there is no need to call search_recipes yet: I ask which they have.", ANSWER, None),
    ("I need the ingredients before I can call search_recipes, so I ask for them.", ANSWER, None),
    ("I searched already: the result lists two recipes, and I sum them up.", ANSWER, None),
    ("The user asked for rice recipes, which I handled by calling search_recipes; I list them.", ANSWER, None),
])
def test_reasoning_that_argues_for_the_other_action_or_leads_to_its_reply(text, ref, expected):
    tools = [{"function": {"name": "search_recipes"}}]
    assert _check(text, ref, tools=tools) == expected


def test_a_call_decided_without_tools_declared_is_not_checked():
    # an answer with no tools declared: "call" there is not a tool call (e.g. "I call it a draw")
    assert _check("I call it a draw and say so.", ANSWER) is None


def test_a_cached_answer_meets_the_filters_of_today(tmp_path):
    # the cache keeps what a teacher said; a filter added since then still refuses it, without asking again
    from beam_sft.backfill.cache import TurnCache, record_key, turn_key
    from beam_sft.backfill.prompt import PROMPT_VERSION
    from beam_sft.backfill.run import Settings, fill_record

    record = {"messages": [{"role": "user", "content": "Rice recipes?"}, dict(CALL)],
              "tools": [{"function": {"name": "search_recipes"}}]}
    cache = TurnCache(tmp_path / "cache.jsonl")
    teacher = type("Silent", (), {"id": "t", "complete": lambda self, m: pytest.fail("asked again")})()
    cache.put(turn_key(record_key(record), 1, "t", PROMPT_VERSION), "I should ask them for the ingredients.", "ok")
    out, counts, refused = fill_record(record, teacher, cache, Settings(), count_tokens=len)
    assert "reasoning_content" not in out["messages"][1] and counts["filtered:contradicts_reply"] == 1
    assert refused == [("contradicts_reply", "I should ask them for the ingredients.")]


def test_every_reason_is_a_declared_filter():
    assert {"repetitive", "truncated", "restates_reply", "narration", "echoes_prompt", "copies_example"} <= set(
        F.FILTERS)
