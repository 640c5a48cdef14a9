"""Servable model directories (issue 21): the response template in vLLM's serving subset, parsing exactly as
before; the EOS lists; file modes; `beam-sft export`; the OpenAI backend of `beam-sft eval` (against a stub
client here; against a real vLLM server in `make test-serve`, scripts/test_serve.py)."""

from __future__ import annotations

import importlib.util
import json
import stat
from copy import deepcopy
from pathlib import Path
from types import SimpleNamespace

import pytest

from beam_sft.cli import main as cli
from beam_sft.errors import FatalError
from beam_sft.serve import servable
from beam_sft.template import response_template

REPO = Path(__file__).resolve().parents[1]


def _benchmark(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def _vllm_validator():
    try:
        from vllm.parser.response_template import validate_response_template_for_serving
    except Exception:  # noqa: BLE001 - not installed (the usual case: it lives in its own venv)
        return None
    return validate_response_template_for_serving


# ---------- the serving subset ----------


def _saved_templates(tmp_path, tok) -> dict[str, dict]:
    """Every response_template this project writes: the package's, the bundled tokenizer's, what
    save_tokenizer writes for it, and what beamify installs on other tokenizer families."""
    from tokenizer_factories import FACTORIES

    from beam_sft.model.beamify import beamify
    from beam_sft.template.tokenizer import save_tokenizer

    out = {"package": response_template(), "data/tokenizer": tok.response_template}
    save_tokenizer(tok, tmp_path / "bundled")
    out["saved bundled"] = servable.saved_response_template(tmp_path / "bundled")
    for name in ("gpt2_like", "llama_like"):
        other = beamify(FACTORIES[name]())
        save_tokenizer(other, tmp_path / name)
        out[f"saved beamified {name}"] = servable.saved_response_template(tmp_path / name)
    return out


def test_every_saved_response_template_is_servable(tmp_path, tok):
    validator = _vllm_validator()
    for name, template in _saved_templates(tmp_path, tok).items():
        assert template == response_template(), name
        assert servable.serving_subset_errors(template) == [], name
        assert servable.check_serving_subset(template) == ("vllm" if validator else "beam-sft")
        if validator is not None:  # the server's own start-up check
            validator(deepcopy(template))


def _earlier():
    return _benchmark("response_templates").earlier_template(response_template())


def _mutated(change) -> dict:
    template = deepcopy(response_template())
    change(template)
    return template


REFUSED = {
    "earlier template (thinking joined)": _earlier,
    "thinking repeats": lambda: _mutated(lambda t: t["fields"]["thinking"].update(repeats=True)),
    "unknown field": lambda: _mutated(lambda t: t["fields"].update(
        extra={"open": "<|channel|>commentary<|message|>", "close": "<|end|>"})),
    "default other than role": lambda: _mutated(lambda t: t["defaults"].update(channel="final")),
    "content parsed as json": lambda: _mutated(lambda t: t["fields"]["content"].update(content="json")),
    "content transformed": lambda: _mutated(lambda t: t["fields"]["content"].update(transform={"text": "{content}"})),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_templates_outside_the_subset_are_refused(case):
    template = REFUSED[case]()
    assert servable.serving_subset_errors(template)
    with pytest.raises(FatalError, match="not servable"):
        servable.check_serving_subset(template)
    validator = _vllm_validator()
    # vLLM's own check lets `repeats` without `join` through (it then never sees reasoning end); ours does not.
    if validator is not None and case != "thinking repeats":
        with pytest.raises((TypeError, ValueError)):
            validator(deepcopy(template))


def test_our_check_states_the_rules_vllm_reports():
    errors = servable.serving_subset_errors(_earlier())
    assert errors == ["field 'thinking' uses join, which the server cannot stream",
                      "field 'thinking' uses repeats, which the server cannot stream"]
    assert servable.to_serving_form(_earlier()) == response_template()


# ---------- parse results unchanged ----------


def test_serving_form_parses_every_rendered_sample_turn_like_the_earlier_template(tok):
    compare = _benchmark("response_templates")
    corpus = list(compare.rendered_turns(tok)) + list(compare.harmony_texts())
    distinct, differing = compare.compare(corpus, response_template(), _earlier())
    assert distinct > 1000  # every assistant turn of data/samples and tests/data/realdata
    assert differing == []


def test_serving_form_parses_the_check_template_suite_like_the_earlier_template(tok):
    from beam_sft.template.conformance import run_suite

    compare = _benchmark("response_templates")
    recorded: list[dict] = []
    with compare.recording_parses(recorded):
        results = run_suite(tok)
    assert all(r.ok for r in results), [r.line() for r in results if not r.ok]
    distinct, differing = compare.compare(recorded, response_template(), _earlier())
    assert distinct >= 10 and differing == []


def test_the_comparison_sees_the_one_input_where_the_templates_differ(tok):
    """Two analysis messages in one parse: the earlier template joined them, the serving form keeps the
    last. The chat template never renders that (one analysis message per assistant message)."""
    compare = _benchmark("response_templates")
    text = ("<|channel|>analysis<|message|>A<|end|><|start|>assistant<|channel|>analysis<|message|>B<|end|>"
            "<|start|>assistant<|channel|>final<|message|>C<|return|>")
    _, differing = compare.compare([{"prefix": "", "tools": None, "text": text}], response_template(), _earlier())
    assert [(d["new"][1]["thinking"], d["old"][1]["thinking"]) for d in differing] == [("B", "A\n\nB")]


# ---------- the directory ----------


@pytest.fixture
def saved_model(tmp_path, tok):
    """The tiny model and the bundled tokenizer as a trainer would leave them: plain save_pretrained
    (sorted keys), the earlier response template, one EOS id, a 0600 weights file."""
    from beam_sft.model.load import build_tiny_model

    model = build_tiny_model(tok)
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    directory = tmp_path / "checkpoint-1"
    model.save_pretrained(directory)
    old = deepcopy(tok)
    old.response_template = _earlier()
    old.save_pretrained(directory)
    (directory / "model.safetensors").chmod(0o600)
    return directory


def test_make_servable_writes_eos_lists_template_and_modes(saved_model, tok):
    assert servable.servable_problems(saved_model)  # as the trainer left it
    report = servable.make_servable(saved_model)
    stops = [tok.convert_tokens_to_ids(m) for m in ("<|return|>", "<|call|>")]
    for name in ("generation_config.json", "config.json"):
        assert json.loads((saved_model / name).read_text())["eos_token_id"] == stops
    assert report["template_rewritten"] and report["eos_token_id"] == stops
    assert servable.saved_response_template(saved_model) == servable.to_serving_form(_earlier())
    umask = servable.current_umask()
    assert stat.S_IMODE((saved_model / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    assert "model.safetensors" in report["modes_fixed"]
    assert servable.servable_problems(saved_model) == []
    # Idempotent, and a base model's own EOS survives after the stop tokens.
    config = json.loads((saved_model / "config.json").read_text())
    config["eos_token_id"] = [*stops, 5]
    (saved_model / "config.json").write_text(json.dumps(config))
    assert servable.make_servable(saved_model)["eos_token_id"] == [*stops, 5]


def test_servable_problems_names_each_missing_piece(saved_model):
    servable.make_servable(saved_model)
    (saved_model / "chat_template.jinja").unlink()
    config = json.loads((saved_model / "generation_config.json").read_text())
    config["eos_token_id"] = config["eos_token_id"][0]
    (saved_model / "generation_config.json").write_text(json.dumps(config))
    problems = servable.servable_problems(saved_model)
    assert any("chat template" in p for p in problems)
    with pytest.raises(FatalError, match="no chat template"):
        servable.make_servable(saved_model, strict=True)


# ---------- beam-sft export ----------


def test_export_cli_writes_a_checked_servable_directory(saved_model, tmp_path, capsys):
    out = tmp_path / "served"
    assert cli(["export", str(saved_model), "-o", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert servable.servable_problems(out) == []
    assert not (out / "optimizer.pt").exists()
    # the package's declared key order is back: tool calls print as {'type', 'function'}
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert list(config["response_template"]["fields"]["tool_calls"]["transform"]) == ["type", "function"]
    assert "--tool-call-parser hf --reasoning-parser hf" in printed
    assert "allow_missing_thinking" in printed and "CAVEAT" not in printed
    assert "sglang.launch_server" in printed and "transformers serve" in printed


def test_export_refuses_an_unmerged_adapter_and_leaves_nothing(saved_model, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(saved_model)}))
    out = tmp_path / "served"
    assert cli(["export", str(saved_model), "-o", str(out), "--adapter", str(adapter)]) == 2
    assert "--merge" in capsys.readouterr().err and not out.exists()


def test_export_merges_a_lora_only_output_into_its_base(saved_model, tmp_path, tok):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from beam_sft.template.tokenizer import save_tokenizer

    base = AutoModelForCausalLM.from_pretrained(saved_model)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "lora-out"  # what train.py --use_peft saves: the adapter and the tokenizer
    peft_model.save_pretrained(adapter)
    save_tokenizer(tok, adapter)
    ids = torch.tensor([tok("<|start|>user<|message|>Hi<|end|>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        want = peft_model(ids).logits
    out = tmp_path / "merged"
    assert cli(["export", str(adapter), "-o", str(out), "--merge"]) == 0
    assert not (out / "adapter_config.json").exists() and servable.servable_problems(out) == []
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(out)(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(AutoModelForCausalLM.from_pretrained(saved_model)(ids).logits, want, atol=1e-3)


def test_gpt_oss_serve_commands_say_what_vllm_does():
    from beam_sft.model.export import serve_commands

    text = serve_commands("/models/beam-oss", "gpt_oss")
    assert text.startswith("CAVEAT (model_type gpt_oss)") and "openai-harmony" in text
    assert "SGLang" in text and "transformers serve" in text


# ---------- eval --backend openai ----------


def _completion(message: dict, finish_reason: str, stop_reason=None, tokens=5, **choice):
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "beam",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason,
                     "stop_reason": stop_reason, **choice}],
        "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1},
    })


def test_openai_backend_scores_what_the_server_parsed(tok):
    from beam_sft.eval.openai_backend import OpenAIBackend, request_messages
    from beam_sft.eval.run import EvalOptions, evaluate
    from beam_sft.eval.turns import read_held_out

    records = [r for r, _, _ in read_held_out(str(REPO / "data" / "samples" / "openai.jsonl"), "auto",
                                                  max_records=12) if r is not None]
    call_id = tok.convert_tokens_to_ids("<|call|>")
    requests = []

    def create(**kwargs):
        requests.append(kwargs)
        n = len(kwargs["messages"])
        record = next(r for r in records if request_messages(r["messages"][:n]) == kwargs["messages"])
        ref = record["messages"][n]
        message = {"content": ref.get("content"), "reasoning": ref["reasoning_content"]}
        if ref.get("tool_calls"):
            message["tool_calls"] = [{"id": f"c{k}", "type": "function", "function": {
                "name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                for k, c in enumerate(ref["tool_calls"])]
            return _completion(message, "tool_calls", call_id)
        return _completion(message, "stop", None)

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    result = evaluate(OpenAIBackend("http://unused/v1", "beam", tok, client=client), tok,
                         ((r, "openai") for r in records), EvalOptions(progress=False))
    summary = result.summary()
    assert summary["turns"] == len(records) == len(requests)
    # the reference turn, returned by the "server", scores perfectly on every metric
    assert summary["well_formed"] == summary["stopped"] == summary["action_match"] == 1.0
    assert summary["answer_exact"] in (1.0, None) and summary["tool_args_exact"] in (1.0, None)
    assert all(r["messages"][-1]["role"] != "assistant" and r["temperature"] == 0.0 for r in requests)


def test_openai_backend_request_and_refusal(tok):
    import openai

    from beam_sft.eval.openai_backend import OpenAIBackend, request_messages
    from beam_sft.eval.turns import Turn

    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "reasoning_content": "Call it.",
                "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "name": "w", "content": "18 C"}]
    sent = request_messages(history)
    assert sent[1]["reasoning"] == sent[1]["reasoning_content"] == "Call it."
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert sent[2]["tool_call_id"] == sent[1]["tool_calls"][0]["id"]

    def refuse(**kwargs):
        # what the client raises on HTTP 400, built without a transport response
        err = openai.BadRequestError.__new__(openai.BadRequestError)
        Exception.__init__(err, "missing its reasoning")
        err.status_code, err.message = 400, "missing its reasoning"
        raise err

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=refuse)))
    backend = OpenAIBackend("http://unused/v1", "beam", tok, client=client)
    turn = Turn(0, 3, {"role": "assistant", "content": "x"}, None, "openai", "default", "", history,
                {"allow_missing_thinking": False})
    assert backend.request(turn)["extra_body"] == {"chat_template_kwargs": {"allow_missing_thinking": False},
                                                  "return_token_ids": True}
    [generation] = backend.generate_turns([turn])
    assert generation.parsed is None and generation.stop is None and "400" in generation.error


def test_openai_backend_timeout_names_the_option(tok):
    import argparse

    import openai

    from beam_sft.cli.eval import register
    from beam_sft.eval.openai_backend import OpenAIBackend, backend_from_args
    from beam_sft.eval.turns import Turn

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["eval", "m", "--data", "d", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1",
                              "--request-timeout", "1800"])
    backend = backend_from_args(args, tok)
    assert backend.timeout == 1800 and backend.client.timeout == 1800  # what the real client waits for

    try:  # the HTTP client openai is built on: httpx2 in openai 3.x, httpx before
        import httpx2 as http
    except ImportError:
        import httpx as http
    request = http.Request("POST", "http://unused/v1/chat/completions")  # openai 3.60 reads its headers

    def slow(**kwargs):
        raise openai.APITimeoutError(request=request)

    turn = Turn(0, 1, {"role": "assistant", "content": "x"}, None, "openai", "default", "",
                [{"role": "user", "content": "Hi"}], {})
    backend = OpenAIBackend("http://unused/v1", "beam", tok, timeout=5,
                            client=SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=slow))))
    with pytest.raises(FatalError, match=r"--request-timeout \(5 s\)"):
        backend.generate_turns([turn])


def test_eval_cli_openai_backend_needs_a_base_url(capsys):
    assert cli(["eval", "--backend", "openai", "--model", "beam", "--tokenizer_name_or_path", str(REPO / "data" / "tokenizer"),
                "--data", str(REPO / "data" / "samples" / "openai.jsonl")]) == 2
    assert "--base-url" in capsys.readouterr().err


def test_openai_backend_scores_the_raw_turn_from_token_ids_and_drops_the_field_when_refused(tok):
    # vLLM returns `token_ids` when asked: the raw turn shows a final closed by <|end|> that its parser joined
    # into one content; transformers serve refuses unknown fields with 422, and is then asked without it. The
    # refusal as the real openai client raises it (checked against transformers serve 5.24): its message is only
    # "Error code: 422"; the reason is in the body's `detail`, FastAPI's shape.
    import openai

    from beam_sft.eval.openai_backend import OpenAIBackend
    from beam_sft.eval.run import EvalOptions, evaluate

    final = "<|start|>assistant<|channel|>final<|message|>"
    raw = f"<|channel|>analysis<|message|>Think.<|end|>{final}One.<|end|>{final}Two.<|return|>"
    ids = tok.encode(raw, add_special_tokens=False)
    seen = []

    def vllm(**kwargs):
        seen.append(kwargs["extra_body"])
        return _completion({"content": "One.Two.", "reasoning": "Think."}, "stop", token_ids=ids)

    def strict(**kwargs):
        seen.append(kwargs.get("extra_body"))
        if "return_token_ids" in (kwargs.get("extra_body") or {}):
            err = openai.UnprocessableEntityError.__new__(openai.UnprocessableEntityError)
            Exception.__init__(err, "Error code: 422")
            err.status_code, err.message = 422, "Error code: 422"
            err.body = {"detail": "Unexpected fields in the request: {'return_token_ids'}"}
            raise err
        return _completion({"content": "One.Two.", "reasoning": "Think."}, "stop")

    records = [({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "One.Two.",
                                                                "reasoning_content": "r"}]}, "openai")]
    for create, well_formed in ((vllm, 0.0), (strict, 1.0)):
        seen.clear()
        client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
        backend = OpenAIBackend("http://unused/v1", "beam", tok, client=client)
        result = evaluate(backend, tok, records, EvalOptions(progress=False))
        assert result.summary()["well_formed"] == well_formed
        assert seen[0] == {"return_token_ids": True}
    assert seen == [{"return_token_ids": True}, None] and backend.token_ids is False
    [failed] = evaluate(OpenAIBackend("http://unused/v1", "beam", tok, client=SimpleNamespace(
        chat=SimpleNamespace(completions=SimpleNamespace(create=vllm)))), tok, records, EvalOptions(progress=False)).failures
    assert "closed by <|end|>" in failed.reason
