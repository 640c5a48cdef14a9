"""`beam-sft eval --bfcl`: BFCL v4 entries as Beam prompts, scored by BFCL's own checker (bfcl-eval).

Known-good outputs are built from BFCL's possible answers and rendered by the Beam template itself (the turn a
perfect model would write); known-bad ones break one thing each, and BFCL's checker must name the break.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_sft.cli import main as cli
from beam_sft.eval.backends import Generation
from beam_sft.eval.bfcl import checker, prompts
from beam_sft.eval.bfcl.run import evaluate_bfcl, make_turn, rescore, summary_table
from beam_sft.eval.run import EvalOptions

# Java and JavaScript answers are written in those languages' syntax (`new int[]{2, 7}` for an array), not as BFCL's
# possible answers store them: the Python categories get known-good outputs built from the answers.
PYTHON_AST = tuple(c for c in (*checker.NON_LIVE_AST, *checker.LIVE_AST) if checker.language(c) == "python")
OPENAPI_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


def first_value(options):
    """A value BFCL accepts: the first possible answer of a parameter (nested dicts: the same, recursively);
    None for an optional parameter whose first choice is to leave it out."""
    for option in options:
        if option == "":
            return None
        if isinstance(option, dict):
            return {k: v for k, opts in option.items() if (v := first_value(opts)) is not None}
        return option
    return None


def entry_number(entry_id: str) -> int:
    """BFCL's running number of an entry (`simple_python_12` -> 12, `live_simple_3-1-0` -> 3)."""
    return int(entry_id.rsplit("_", 1)[1].split("-")[0])


def good_calls(entry):
    """The calls of BFCL's first possible answer, names as beam-sft sends them (dots as underscores)."""
    calls = []
    for call in entry.answer:
        (name, params), = call.items()
        args = {k: v for k, opts in params.items() if (v := first_value(opts)) is not None}
        calls.append((name.replace(".", "_"), args))
    return calls


def render(tok, turn, calls=None, content=None, thinking="I pick the declared function that fits."):
    """The assistant turn as the Beam template writes it (what a perfect model generates), stop token included."""
    message = {"role": "assistant", "reasoning_content": thinking}
    if calls is not None:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    else:
        message["content"] = content
    full = tok.apply_chat_template([*turn.messages, message], tools=turn.tools, tokenize=False)
    assert full.startswith(turn.prompt), turn.entry.id
    text = full[len(turn.prompt):]
    return Generation(text, len(text), "<|call|>" if calls is not None else "<|return|>")


class Scripted:
    """A backend that answers each entry with what `answer(turn)` returns."""

    name = "scripted"

    def __init__(self, tok, answer):
        self.tok, self.answer = tok, answer

    def generate_turns(self, turns):
        return [self.answer(t) for t in turns]


def test_every_category_converts_to_beam_prompts(tok):
    for category in checker.CATEGORIES:
        entries = checker.load_entries(category)
        assert entries, category
        for entry in entries:
            turn = make_turn(tok, entry, "beam")
            assert turn.prompt.endswith("<|start|>assistant"), entry.id
            for tool in turn.tools:
                name = tool["function"]["name"]
                assert "." not in name and name in turn.prompt, (entry.id, name)
                stack = [tool["function"]["parameters"]]
                while stack:  # BFCL's own types (dict, float, tuple, any) are JSON Schema types in the prompt
                    schema = stack.pop()
                    assert schema.get("type", "string") in OPENAPI_TYPES, (entry.id, schema.get("type"))
                    stack += [s for s in (schema.get("properties") or {}).values() if isinstance(s, dict)]
                    stack += [schema["items"]] if isinstance(schema.get("items"), dict) else []


def test_history_turns_without_reasoning_render_alike_offline_and_served(tok):
    """8 live_irrelevance entries carry BFCL's own assistant turns, with no reasoning: the turn asks the server
    to allow that (our vLLM recipe refuses missing reasoning by default: a 400 on these, found on the LoRA
    model's served run), and the request carries it; the offline prompt is the same text."""
    from beam_sft.eval.openai_backend import OpenAIBackend

    entries = checker.load_entries("live_irrelevance", 1000)
    with_history = [e for e in entries if any(m.get("role") == "assistant" for m in prompts.messages(e, "beam"))]
    assert len(with_history) == 8
    for entry in with_history:
        turn = make_turn(tok, entry, "beam")
        assert turn.template_kwargs == {"allow_missing_thinking": True}, entry.id
        with pytest.raises(Exception, match="missing its reasoning"):
            tok.apply_chat_template(turn.messages, tools=turn.tools, tokenize=False, add_generation_prompt=True,
                                    allow_missing_thinking=False)
        assert turn.prompt == tok.apply_chat_template(turn.messages, tools=turn.tools, tokenize=False,
                                                      add_generation_prompt=True)
    backend = OpenAIBackend.__new__(OpenAIBackend)
    backend.model, backend.max_new_tokens, backend.token_ids = "beam", 8, True
    request = backend.request(make_turn(tok, with_history[0], "beam"))
    assert request["extra_body"]["chat_template_kwargs"] == {"allow_missing_thinking": True}
    plain = next(e for e in entries if e not in with_history)
    assert make_turn(tok, plain, "beam").template_kwargs == {}


def test_known_good_outputs_score_one_and_breaks_are_named(tok):
    good = Scripted(tok, lambda t: render(tok, t, good_calls(t.entry)) if t.entry.answer is not None
                    else render(tok, t, content="None of the declared functions can do that."))
    result = evaluate_bfcl(good, tok, [*PYTHON_AST, "irrelevance", "live_irrelevance"],
                           EvalOptions(max_records=40, progress=False))
    summary = result.summary()
    for category, row in summary["bfcl"].items():
        assert row["accuracy"] == 1.0, (category, result.failures[:2])
        assert row["well_formed"] == 1.0, category
    assert summary["bfcl_summary"]["non_live_ast"] == 1.0 and summary["bfcl_summary"]["irrelevance"] == 1.0

    def bad(t):
        if t.entry.answer is None:  # a call where none should be: BFCL's irrelevance error
            name = t.tools[0]["function"]["name"]
            return render(tok, t, [(name, {})])
        (name, args), *rest = good_calls(t.entry)
        return render(tok, t, [(name + "_x", args), *rest])  # a function that was never declared

    result = evaluate_bfcl(Scripted(tok, bad), tok, ["simple_python", "multiple", "irrelevance"],
                           EvalOptions(max_records=10, progress=False))
    kinds = {c: set(v["error_types"]) for c, v in result.summary()["bfcl"].items()}
    assert all(v["accuracy"] == 0.0 for v in result.summary()["bfcl"].values())
    assert kinds == {"simple_python": {"simple_function_checker:wrong_func_name"},
                     "multiple": {"simple_function_checker:wrong_func_name"},
                     "irrelevance": {"irrelevance_error:decoder_success"}}


def test_wrong_type_and_no_call_are_bfcls_errors(tok):
    entry = checker.load_entries("simple_python")[0]  # calculate_triangle_area(base=10, height=5)
    assert checker.check(entry, [{"calculate_triangle_area": {"base": 10, "height": 5}}])["valid"]
    wrong = checker.check(entry, [{"calculate_triangle_area": {"base": 10, "height": "5"}}])
    assert not wrong["valid"] and wrong["error_type"] == "type_error:simple"
    turn = make_turn(tok, entry, "beam")
    decoded, why = prompts.decode_beam(tok.parse_response(render(tok, turn, content="The area is 25.").text,
                                                          prefix=turn.prompt, tools=turn.tools))
    assert decoded is None and "answered" in why
    assert checker.check(entry, decoded, why)["error_type"] == "ast_decoder:decoder_failed"


def test_prompt_style_uses_bfcls_prompt_and_decoder(tok):
    entry = checker.load_entries("simple_python")[0]
    conversation = prompts.messages(entry, "prompt")
    assert conversation[0]["role"] == "system" and "[func_name1(params_name1=params_value1" in conversation[0]["content"]
    assert "calculate_triangle_area" in conversation[0]["content"]
    decoded, why = prompts.decode_prompt("[calculate_triangle_area(base=10, height=5)]", "simple_python")
    assert why == "" and checker.check(entry, decoded, style="prompt")["valid"]
    decoded, why = prompts.decode_prompt("The area is 25 square units.", "simple_python")
    assert decoded is None and "decoder" in why
    java = checker.load_entries("simple_java")[0]
    call = "GeometryPresentation.createPresentation(controller=mapController, parent=mapArea)"
    decoded, why = prompts.decode_prompt(call, "simple_java")
    assert why == "" and checker.check(java, decoded, style="prompt")["valid"], decoded
    # the prompt names functions as written, so BFCL expects the dots back; the FC styles send underscores
    assert checker.check(java, decoded)["error_type"] == "simple_function_checker:wrong_func_name"
    two_sum = next(e for e in checker.load_entries("simple_java") if e.id == "simple_java_27")  # nums, target=9
    assert checker.check(two_sum, [{"TwoSum_twoSum": {"nums": "new int[]{2, 7, 11, 15}", "target": "9"}}])["valid"]
    assert checker.check(two_sum, [{"TwoSum_twoSum": {"nums": "[2, 7, 11, 15]", "target": "9"}}])["error_type"] \
        == "type_error:simple"


def test_json_style_asks_for_a_tagged_json_list_and_reads_it(tok):
    entry = checker.load_entries("simple_python")[0]
    conversation = prompts.messages(entry, "json")
    assert conversation[0]["role"] == "system" and "<tool_call>[]</tool_call>" in conversation[0]["content"]
    assert '"calculate_triangle_area"' in conversation[0]["content"] and conversation[1:] == entry.question
    good = '<tool_call>[{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}]</tool_call>'
    decoded, why, malformed = prompts.decode_json(good)
    assert (why, malformed) == ("", False) and checker.check(entry, decoded, style="json")["valid"]
    # one call per block, arguments as a JSON string, the last block unclosed at the stop: the same call
    one_block = '<tool_call>{"name": "calculate_triangle_area", "arguments": "{\\"base\\": 10, \\"height\\": 5}"}</tool_call>'
    unclosed = 'Sure.\n<tool_call>[{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}]'
    for text in (one_block, unclosed):
        assert prompts.decode_json(text) == (decoded, "", False), text
    two = prompts.decode_json(good + "\n" + good.replace("10", "3"))[0]
    assert two == [decoded[0], {"calculate_triangle_area": {"base": 3, "height": 5}}]
    assert checker.check(entry, two, style="json")["error_type"] == "simple_function_checker:wrong_count"
    wrong = prompts.decode_json(good.replace("10", '"10"'))[0]
    assert checker.check(entry, wrong, style="json")["error_type"] == "type_error:simple"
    for text, bad in (("The area is 25.", False), ("<tool_call>[]</tool_call> No function fits.", False),
                      ("<tool_call>[calculate_triangle_area(base=10)]</tool_call>", True),
                      ('<tool_call>[{"function": "calculate_triangle_area"}]</tool_call>', True),
                      ('<tool_call>[{"name": "calculate_triangle_area", "arguments": [10, 5]}]</tool_call>', True),
                      ("<tool_call>[1]</tool_call>", True)):
        decoded, why, malformed = prompts.decode_json(text)
        assert decoded is None and why and malformed == bad, text
        assert checker.check(entry, None, why, style="json")["error_type"] == "ast_decoder:decoder_failed"
    irrelevant = checker.load_entries("irrelevance")[0]
    assert checker.check(irrelevant, None, prompts.decode_json("<tool_call>[]</tool_call>")[1], style="json")["valid"]
    assert not checker.check(irrelevant, [{irrelevant.functions[0]["name"]: {}}], style="json")["valid"]
    # names as written (the prompt lists them unchanged), so BFCL expects a Java name's dots back
    java = checker.load_entries("simple_java")[0]
    call = prompts.decode_json('<tool_call>[{"name": "GeometryPresentation.createPresentation", "arguments": '
                               '{"controller": "mapController", "parent": "mapArea"}}]</tool_call>')[0]
    assert checker.check(java, call, style="json")["valid"], call
    # an entry's own system message comes after the instructions, in the one system message
    own = checker.Entry("x", "simple_python", [{"role": "system", "content": "Answer in French."},
                                               {"role": "user", "content": "Area of a 10 by 5 triangle?"}],
                        entry.functions, entry.check_functions, entry.answer)
    first, *rest = prompts.messages(own, "json")
    assert first["content"].startswith("You may call") and first["content"].endswith("\n\nAnswer in French.")
    assert rest == own.question[1:] and own.question[0]["content"] == "Answer in French."  # the entry untouched


def test_subset_is_seeded_and_stable():
    a = [e.id for e in checker.load_entries("multiple", 7, seed=0)]
    assert a == [e.id for e in checker.load_entries("multiple", 7, seed=0)]
    assert a != [e.id for e in checker.load_entries("multiple", 7, seed=1)]
    assert len(set(a)) == 7 and len(checker.load_entries("live_parallel", 1000)) == 16


def test_categories_and_summary_arithmetic():
    assert checker.parse_categories("all") == list(checker.CATEGORIES)
    assert checker.parse_categories("irrelevance,simple_python,irrelevance") == ["irrelevance", "simple_python"]
    from beam_sft.errors import UsageError

    with pytest.raises(UsageError, match="multi_turn_base"):
        checker.parse_categories("multi_turn_base")
    scores = {"simple_python": {"accuracy": 0.5, "n": 10}, "simple_java": {"accuracy": 1.0, "n": 2},
              "multiple": {"accuracy": 0.25, "n": 4}, "live_simple": {"accuracy": 1.0, "n": 1},
              "live_multiple": {"accuracy": 0.0, "n": 3}, "irrelevance": {"accuracy": 0.5, "n": 2},
              "live_irrelevance": {"accuracy": 1.0, "n": 8}}
    s = checker.summary(scores)
    # non-live: mean(mean(0.5, 1.0), 0.25); live: weighted (1 + 0) / 4; irrelevance: unweighted mean
    assert s == {"non_live_ast": pytest.approx(0.5), "live_ast": pytest.approx(0.25), "irrelevance": 0.75,
                 "relevance": None}


def test_cli_outputs_rescore_to_the_same_figures(tiny_model_dir, tmp_path, capsys):
    out, figures = tmp_path / "bfcl.jsonl", tmp_path / "bfcl.json"
    argv = ["eval", str(tiny_model_dir), "--bfcl", "simple_python,parallel,irrelevance,live_relevance",
            "--max_records", "2", "--max-new-tokens", "8", "--outputs", str(out), "--json", str(figures),
            "--report", str(tmp_path / "bfcl.html"), "--quiet"]
    assert cli(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 8 and {"id", "category", "calls", "text", "well_formed", "valid"} <= lines[0].keys()
    first = json.loads(figures.read_text())
    assert set(first["bfcl"]) == {"simple_python", "parallel", "irrelevance", "live_relevance"}
    assert set(first["bfcl_summary"]) == {"non_live_ast", "live_ast", "irrelevance", "relevance"}
    assert "ast_decoder:decoder_failed" in (tmp_path / "bfcl.html").read_text()
    again = tmp_path / "again.json"
    assert cli(["eval", "--rescore", str(out), "--json", str(again)]) == 0
    second = json.loads(again.read_text())
    assert second["bfcl"] == first["bfcl"] and second["bfcl_summary"] == first["bfcl_summary"]


def test_rescore_of_a_scripted_run_with_passes_and_failures(tok, tmp_path):
    lines = []

    def answer(t):  # right on even entry numbers, a wrong argument value on odd ones
        calls = good_calls(t.entry)
        if entry_number(t.entry.id) % 2:
            name, args = calls[0]
            calls[0] = (name, {k: ([v] if not isinstance(v, list) else v + v) for k, v in args.items()})
        return render(tok, t, calls)

    result = evaluate_bfcl(Scripted(tok, answer), tok, ["simple_python", "live_simple"], EvalOptions(
        max_records=20, progress=False, on_result=lambda s: lines.append(json.dumps(s.to_json()))))
    path = tmp_path / "out.jsonl"
    path.write_text("\n".join(lines) + "\n")
    first, second = result.summary(), rescore(str(path)).summary()
    assert 0.0 < first["bfcl"]["simple_python"]["accuracy"] < 1.0
    assert second["bfcl"] == first["bfcl"] and second["bfcl_summary"] == first["bfcl_summary"]


def test_called_counts_entries_answered_with_a_call_apart_from_accuracy(tok, tmp_path):
    """`called`: the share of entries answered with a call, per category and on each side (a call expected or not),
    the same after --rescore; it tells a model that never calls (irrelevance 1.0) from one that judges."""
    lines = []

    def answer(t):  # the right call on every AST entry; a call on even irrelevance entries, a plain answer on odd
        if not checker.expects_no_call(t.entry.category):
            return render(tok, t, good_calls(t.entry))
        if entry_number(t.entry.id) % 2 == 0:
            tool = t.tools[0]["function"]
            return render(tok, t, [(tool["name"], {})])
        return render(tok, t, content="None of my tools does that.")

    result = evaluate_bfcl(Scripted(tok, answer), tok, ["simple_python", "irrelevance"], EvalOptions(
        max_records=10, progress=False, on_result=lambda s: lines.append(json.dumps(s.to_json()))))
    s = result.summary()
    calling = sum(entry_number(r["id"]) % 2 == 0 for r in map(json.loads, lines)
                  if r["category"] == "irrelevance")
    assert 0 < calling < 10
    assert s["bfcl"]["simple_python"]["called"] == 1.0 and s["bfcl"]["simple_python"]["accuracy"] == 1.0
    assert s["bfcl"]["irrelevance"]["called"] == calling / 10
    assert s["bfcl"]["irrelevance"]["accuracy"] == (10 - calling) / 10  # a call where none fits is BFCL's error
    assert s["called"] == {"call_expected": {"called": 10, "n": 10}, "no_call_expected": {"called": calling, "n": 10}}
    path = tmp_path / "out.jsonl"
    path.write_text("\n".join(lines) + "\n")
    again = rescore(str(path)).summary()
    assert again["bfcl"] == s["bfcl"] and again["called"] == s["called"]
    table = summary_table(result)
    assert "[called, no call expected]" in table and f"{calling}" in table.splitlines()[-1]


def test_base_model_prompt_style_cli(tiny_model_dir, tmp_path):
    """A tokenizer without Beam's response template is refused in the beam style and runs in the prompt and json
    styles, whose outputs files re-score to the run's figures."""
    from transformers import AutoTokenizer

    plain = tmp_path / "plain"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.response_template = None
    tok.chat_template = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
                         "{% endfor %}{% if add_generation_prompt %}<|start|>assistant<|message|>{% endif %}")
    tok.save_pretrained(plain)
    for name in ("response_template.json",):
        (plain / name).unlink(missing_ok=True)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("response_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    for f in Path(tiny_model_dir).glob("*.safetensors"):
        (plain / f.name).symlink_to(f)
    (plain / "config.json").write_text((Path(tiny_model_dir) / "config.json").read_text())
    common = ["--bfcl", "simple_python", "--max_records", "2", "--max-new-tokens", "4", "--quiet"]
    assert cli(["eval", str(plain), *common]) == 2
    out = tmp_path / "p.jsonl"
    for style in ("prompt", "json"):
        out, summary = tmp_path / f"{style}.jsonl", tmp_path / f"{style}.json"
        assert cli(["eval", str(plain), *common, "--bfcl-style", style, "--outputs", str(out),
                    "--json", str(summary)]) == 0
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["style"] for r in rows] == [style, style]
        assert rescore(str(out)).summary()["bfcl"] == json.loads(summary.read_text())["bfcl"]


def test_usage_errors(tiny_model_dir, capsys):
    assert cli(["eval", str(tiny_model_dir)]) == 2
    assert cli(["eval", str(tiny_model_dir), "--bfcl", "nope"]) == 2
    assert cli(["eval", str(tiny_model_dir), "--bfcl", "all", "--data", "x.jsonl"]) == 2
    assert cli(["eval", str(tiny_model_dir), "--data", "x.jsonl", "--outputs", "o.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 4 and "Traceback" not in err


def test_contamination_finds_planted_questions_and_names(tmp_path, capsys):
    from beam_sft.eval.bfcl.contamination import BfclIndex, scan
    from beam_sft.records.files import read_items

    index = BfclIndex.build(["simple_python", "live_simple"])
    question = checker.load_entries("simple_python")[0].question[0]["content"]  # the triangle area question
    live = checker.load_entries("live_simple")[3].question[-1]["content"]
    words = live.split()
    assert len(words) > 16
    tool = {"type": "function", "function": {"name": "calculate_triangle_area", "description": "area",
                                             "parameters": {"type": "object", "properties": {}}}}
    rows = [
        {"messages": [{"role": "user", "content": question.upper() + "!!"},  # case and punctuation do not hide it
                      {"role": "assistant", "content": "50 square units."}]},
        {"messages": [{"role": "user", "content": "Before anything: " + " ".join(words[:14]) + " and so on."},
                      {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": "Tell me a joke about cats and the moon, please, a short one."},
                      {"role": "assistant", "content": "No."}], "tools": [tool]},
        {"messages": "not a list"},
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = scan(((item, "auto") for item in read_items([str(data)])), index)
    assert report["records"] == 4 and report["rejected"] == 1
    assert report["records_with_question_overlap"] == 2
    assert [(h["position"], h["match"]) for h in report["question_overlaps"]] == [(1, "whole"), (2, "13-gram")]
    assert report["question_overlaps"][0]["bfcl_id"] == "simple_python_0"
    assert report["function_names"] == {"calculate_triangle_area": {"records": 1, "bfcl_entries": len(index.names["calculate_triangle_area"])}}
    assert "simple_python_0" in index.names["calculate_triangle_area"]

    config = tmp_path / "mix.yaml"
    config.write_text(f"datasets:\n  - path: {data}\n")
    out = tmp_path / "c.json"
    assert cli(["contamination", "--config", str(config), "--bfcl", "simple_python", "--json", str(out),
                "--quiet"]) == 0
    assert json.loads(out.read_text())["records_with_question_overlap"] == 1  # the live question is not indexed
    assert cli(["contamination", str(data), "--fail-on-overlap", "--quiet"]) == 1
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(rows[2]) + "\n")
    assert cli(["contamination", str(clean), "--fail-on-overlap", "--quiet"]) == 0
    assert cli(["contamination", "--quiet"]) == 2
    assert "give INPUT files or --config" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prompt_server(tiny_model_dir, tmp_path_factory):
    """The tiny model behind tests/loopback_server.py (a real HTTP server on 127.0.0.1; it answers text)."""
    from test_backfill import _server

    yield from _server(tiny_model_dir, tmp_path_factory, "--finish-reason", "stop")


def test_bfcl_through_a_server_in_the_prompt_style(prompt_server, tiny_model_dir, tmp_path):
    url, log = prompt_server
    out, figures = tmp_path / "served.jsonl", tmp_path / "served.json"
    assert cli(["eval", "--backend", "openai", "--base-url", url, "--model", "tiny", "--tokenizer_name_or_path",
                str(tiny_model_dir), "--bfcl", "simple_python,irrelevance", "--bfcl-style", "prompt",
                "--max_records", "2", "--max-new-tokens", "4", "--outputs", str(out), "--json", str(figures),
                "--quiet"]) == 0
    requests = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(requests) == 4 and all(r["max_tokens"] == 4 for r in requests)
    questions = {e.question[-1]["content"][-1000:] for c in ("simple_python", "irrelevance")
                 for e in checker.load_entries(c, 2)}
    assert {r["last"] for r in requests} == questions
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["category"] for r in rows} == {"simple_python", "irrelevance"} and all(r["stop"] for r in rows)
    first = json.loads(figures.read_text())
    again = tmp_path / "again.json"
    assert cli(["eval", "--rescore", str(out), "--json", str(again), "--quiet"]) == 0
    assert json.loads(again.read_text())["bfcl"] == first["bfcl"]
