"""The real serving test (`make test-serve`): the quickstart model served by vLLM's CPU build, or by
`transformers serve` (`--server transformers`), checked through the `openai` client.

Steps: build or reuse the vLLM venv (scripts/setup_vllm_cpu.sh); train the quickstart model unless one is
there (scripts/quickstart.py); `beam-sft export` it; check that the vLLM venv's transformers loads the
exported tokenizer and renders every prompt exactly as ours does; generate the same turns offline
(transformers, greedy) as the reference; start `vllm.entrypoints.openai.api_server` on 127.0.0.1 with the hf
parsers; then, on the first assistant turn of training records:

* reasoning comes back as `reasoning_content` (vLLM 0.32 names it `reasoning`; either is accepted);
* on every turn the model gets right offline (a well-formed call whose names and arguments equal the
  reference, or a well-formed answer), the served turn parses to the same message;
* tool calls end with finish_reason `tool_calls`, answers with `stop`; never `length` for a call;
* streaming gives the same reasoning, content, tool calls and finish_reason as non-streaming;
* a history whose assistant turn lost its reasoning is refused with the chat template's own error (HTTP 400),
  streaming too;
* `beam-sft eval --backend openai` against the server scores the same well-formed turns as offline.

`--server transformers` runs the same turn checks against `transformers serve` (this venv's transformers,
with its `serving` extra: fastapi, uvicorn) instead of vLLM — no vLLM venv, no render check (same
transformers) — and asserts what it does where it differs from vLLM (docs/serving.md): reasoning as
`reasoning_content`; it drops reasoning from request messages, so a history sent back with its reasoning is
rendered without it (the prompt's token count says so) and `allow_missing_thinking: false` makes such a
request fail (HTTP 500, the template's error in the server's log); it refuses `return_token_ids` (422,
"Unexpected fields in the request"), and the openai backend then asks again without it.

The server is started in its own process group and stopped by its pid at the end, on failure too.

```bash
make test-serve                                       # = python scripts/serving_test.py, then with --server transformers
python scripts/serving_test.py --server transformers  # transformers serve only (about 2 min, model cached)
python scripts/serving_test.py --num-prompts 8        # fewer turns
python scripts/serving_test.py --start-timeout 1800   # a busy machine
```
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

NAME = "beam"
MISSING_REASONING = "is missing its reasoning"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default=str(REPO / "outputs" / "quickstart"),
                        help="the quickstart's output directory (trained there when it holds no model)")
    parser.add_argument("--num-prompts", type=int, default=24, help="training records to prompt with (default: 24)")
    parser.add_argument("--max-tokens", type=int, default=256, help="generation bound (default: 256)")
    parser.add_argument("--start-timeout", type=float, default=1200.0,
                        help="seconds to wait for the server to come up (default: 1200)")
    parser.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    parser.add_argument("--server", choices=("vllm", "transformers"), default="vllm",
                        help="vLLM's CPU build (default) or `transformers serve`")
    return parser


class Failures:
    def __init__(self):
        self.items: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        print(f"   [{'ok' if ok else 'FAIL'}] {what}", flush=True)
        if not ok:
            self.items.append(what)
        return ok


def step(text: str) -> None:
    print(f"== {text}", flush=True)


def vllm_venv() -> Path:
    step("vLLM CPU venv (scripts/setup_vllm_cpu.sh: built once, then reused)")
    start = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "scripts" / "setup_vllm_cpu.sh")], check=False, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"building the vLLM venv failed:\n{result.stderr[-4000:]}")
    venv = Path(result.stdout.strip().splitlines()[-1])
    print(f"   {venv} ({time.monotonic() - start:.0f} s)")
    return venv


def trained_model(out_dir: Path) -> Path:
    model_dir = out_dir / "model"
    if (model_dir / "config.json").is_file() and (out_dir / "data" / "train.jsonl").is_file():
        step(f"reuse the quickstart model in {model_dir}")
        return model_dir
    step("train the quickstart model (scripts/quickstart.py)")
    import quickstart

    if quickstart.main(["--output-dir", str(out_dir)]) != 0:
        raise SystemExit("quickstart failed")
    return model_dir


def export(model_dir: Path, out_dir: Path) -> Path:
    from beam_sft.model.export import export as export_model

    served = out_dir / "served"
    step(f"beam-sft export {model_dir} -o {served}")
    report = export_model(str(model_dir), served)
    print(f"   eos_token_id {report['eos_token_id']}, template checked by {report['template_check']}")
    return served


def chosen_turns(tokenizer, num_prompts: int):
    """First assistant turn of `num_prompts` training records spread over the samples (the quickstart's)."""
    import quickstart

    from beam_sft.eval.turns import read_held_out, record_turns

    loaded = read_held_out([str(REPO / "data" / "samples" / name) for name in quickstart.SAMPLES])
    records = quickstart.pick([(r, f) for r, _, f in loaded if r is not None], num_prompts)
    return [turn for k, (record, fmt) in enumerate(records)
            for turn in record_turns(tokenizer, record, k, fmt, "first")], records


def check_vllm_venv_renders(venv: Path, served: Path, turns, failures: Failures) -> None:
    """The vLLM venv's transformers (<5.20) loads the exported tokenizer and renders every prompt as ours."""
    step("the vLLM venv's transformers loads the exported tokenizer and renders the same prompts")
    code = (
        "import json, sys, transformers\n"
        "from transformers import AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "cases = json.load(sys.stdin)\n"
        "out = [tok.apply_chat_template(c['messages'], tools=c['tools'], tokenize=False, add_generation_prompt=True,"
        " **c['kwargs']) for c in cases]\n"
        "rt = getattr(tok, 'response_template', None) or tok.init_kwargs.get('response_template')\n"
        "print(json.dumps({'version': transformers.__version__, 'prompts': out, 'response_template': rt}))\n"
    )
    cases = [{"messages": t.messages, "tools": t.tools, "kwargs": t.template_kwargs} for t in turns]
    result = subprocess.run([str(venv / "bin" / "python"), "-c", code, str(served)], check=False,
                            input=json.dumps(cases), capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if not failures.check(result.returncode == 0, "the vLLM venv loads the tokenizer"):
        print(result.stderr[-3000:])
        return
    data = json.loads(result.stdout.strip().splitlines()[-1])
    same = sum(a == t.prompt for a, t in zip(data["prompts"], turns, strict=True))
    failures.check(same == len(turns), f"transformers {data['version']} renders {same}/{len(turns)} prompts as ours")
    saved = json.loads((served / "tokenizer_config.json").read_text())["response_template"]
    failures.check(data["response_template"] == saved, "it reads the same response_template")


def offline_reference(served: Path, turns, max_tokens: int):
    """(generation, parsed) per turn from transformers on the exported directory: greedy, both stop tokens."""
    from beam_sft.eval.backends import TransformersBackend
    from beam_sft.eval.run import load_model, parse_generation

    step("offline reference: the same turns with transformers (greedy)")
    model, tokenizer = load_model(str(served), device="cpu")
    backend = TransformersBackend(model, tokenizer, max_new_tokens=max_tokens)
    generations = backend.generate([t.prompt for t in turns])
    return [(g, parse_generation(tokenizer, t, g)[0]) for t, g in zip(turns, generations, strict=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_name(server: str, served: Path) -> str:
    """The model name requests use: vLLM's --served-model-name; transformers serve, pinned to one model, answers
    400 to any name but the one it was started with (the directory)."""
    return NAME if server == "vllm" else str(served)


def server_command(server: str, venv: Path | None, served: Path, port: int) -> tuple[list[str], dict[str, str]]:
    from beam_sft.model.export import VLLM_PARSER_FLAGS

    if server == "transformers":
        # No --chat-template-kwargs allow_missing_thinking=false (vLLM's flag below): transformers serve drops
        # reasoning from request messages, so with it every request with an assistant turn in its history fails.
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(served), "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu", "--dtype", "float32"]
        return cmd, {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(served),
           "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", *VLLM_PARSER_FLAGS]
    # vLLM's CPU worker binds its own cores (one of two here); a thread count inherited from the caller
    # (scripts/demo_real.py sets 2 for training) is kept by vLLM and warned about as spin-wait contention.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return cmd, {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                 "DO_NOT_TRACK": "1"}


def start_server(server: str, venv: Path | None, served: Path, port: int, log_path: Path) -> subprocess.Popen:
    cmd, env = server_command(server, venv, served, port)
    step(f"start {server}: {' '.join(cmd)}  (log: {log_path})")
    log = open(log_path, "w")  # noqa: SIM115 - the server writes to it for its whole life
    # Its own session: the server and every worker it forks are one process group, stopped together by pid.
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(server: subprocess.Popen, port: int, timeout: float, log_path: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}:\n{log_path.read_text()[-5000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"the server did not come up in {timeout:.0f} s:\n{log_path.read_text()[-5000:]}")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_server(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its pid: it leads the group), then wait until every process
    of the group (vLLM's engine workers too) is gone; SIGKILL what is left after 60 s."""
    if _group_alive(server.pid):
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _group_alive(server.pid) and time.monotonic() < deadline:
        server.poll()  # reap the leader, so a finished one does not keep the group alive as a zombie
        time.sleep(0.5)
    if _group_alive(server.pid):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)
    print(f"== server (pid {server.pid}) stopped: exit {server.returncode}; its process group is empty", flush=True)


def _served(client, model: str, turn, max_tokens: int, *, stream: bool):
    """(parsed message dict, finish_reason) of one served turn, streaming or not."""
    from beam_sft.eval.openai_backend import parsed_message, request_messages

    kwargs = {"model": model, "messages": request_messages(turn.messages), "max_tokens": max_tokens,
              "temperature": 0.0, "tools": turn.tools or None}
    if turn.template_kwargs:
        kwargs["extra_body"] = {"chat_template_kwargs": dict(turn.template_kwargs)}
    if not stream:
        response = client.chat.completions.create(**kwargs)
        choice = response.choices[0]
        raw = choice.message.model_dump()
        raw_reasoning_key = next((k for k in ("reasoning_content", "reasoning")
                                  if raw.get(k) or (choice.message.model_extra or {}).get(k)), None)
        return parsed_message(choice.message), choice.finish_reason, raw_reasoning_key
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        extra = delta.model_extra or {}
        reasoning.append(extra.get("reasoning_content") or extra.get("reasoning") or "")
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            slot = calls.setdefault(call.index, {"name": "", "arguments": ""})
            if call.function is not None:
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    message = {"role": "assistant", "content": "".join(content) or None, "reasoning": "".join(reasoning) or None,
               "tool_calls": [{"id": str(k), "type": "function", "function": calls[k]} for k in sorted(calls)]}
    return parsed_message(message), finish, None


def _right_offline(turn, generation, parsed) -> bool:
    from beam_sft.eval.metrics import score_turn

    metrics, _ = score_turn(turn.reference, parsed, "<|call|>" if turn.expects_call else "<|return|>", turn.tools,
                            generation.text)
    if not metrics["well_formed"]:
        return False
    return bool(metrics["tool_args_exact"]) if turn.expects_call else not (parsed or {}).get("tool_calls")


def _well_formed_offline(turn, generation, parsed) -> bool:
    from beam_sft.eval.metrics import score_turn

    return bool(score_turn(turn.reference, parsed, generation.stop, turn.tools, generation.text)[0]["well_formed"])


def check_turns(client, model: str, turns, reference, max_tokens: int, failures: Failures) -> None:
    step(f"{len(turns)} first turns of training records through the openai client")
    counts = {"reasoning": 0, "right_offline": 0, "same_as_offline": 0, "calls": 0, "call_finish": 0,
              "answers": 0, "answer_finish": 0, "with_content": 0, "content_same": 0, "stream_same": 0}
    keys = set()
    for turn, (generation, offline) in zip(turns, reference, strict=True):
        parsed, finish, key = _served(client, model, turn, max_tokens, stream=False)
        streamed, stream_finish, _ = _served(client, model, turn, max_tokens, stream=True)
        keys.add(key)
        counts["reasoning"] += bool(parsed.get("thinking"))
        counts["stream_same"] += (streamed, stream_finish) == (parsed, finish)
        if parsed.get("tool_calls"):
            counts["calls"] += 1
            counts["call_finish"] += finish == "tool_calls"
            failures.check(finish != "length", f"record {turn.record}: a tool call never ends with 'length'")
        else:
            counts["answers"] += 1
            counts["answer_finish"] += finish == "stop"
            # Turns well-formed offline: on a malformed one (a final closed by <|end|> and followed by more finals)
            # parse_response keeps the last final and vLLM joins them; both score it malformed.
            if (offline or {}).get("content") and _well_formed_offline(turn, generation, offline):
                counts["with_content"] += 1
                counts["content_same"] += parsed.get("content") == offline["content"]
        if _right_offline(turn, generation, offline):
            counts["right_offline"] += 1
            counts["same_as_offline"] += parsed == offline
            if parsed != offline:
                print(f"   record {turn.record}: served {parsed} != offline {offline}")
    n = len(turns)
    failures.check(counts["reasoning"] == n, f"reasoning in {keys}: {counts['reasoning']}/{n}")
    failures.check(counts["right_offline"] > 0 and counts["same_as_offline"] == counts["right_offline"],
                   f"turns right offline served identically (names, arguments, text): "
                   f"{counts['same_as_offline']}/{counts['right_offline']}")
    failures.check(counts["call_finish"] == counts["calls"] > 0,
                   f"tool calls with finish_reason tool_calls: {counts['call_finish']}/{counts['calls']}")
    failures.check(counts["answer_finish"] == counts["answers"] > 0,
                   f"answers with finish_reason stop: {counts['answer_finish']}/{counts['answers']}")
    failures.check(counts["content_same"] == counts["with_content"] > 0,
                   f"answers in content, as offline: {counts['content_same']}/{counts['with_content']}")
    failures.check(counts["stream_same"] == n, f"streaming equal to non-streaming: {counts['stream_same']}/{n}")


def check_missing_reasoning(client, records, max_tokens: int, failures: Failures) -> None:
    """A history whose assistant turn lost its reasoning: the template's error, HTTP 400, streaming too."""
    import openai

    from beam_sft.eval.openai_backend import request_messages

    step("a history without reasoning is refused (allow_missing_thinking false)")
    record = next(r for r, _ in records
                  if sum(m["role"] == "assistant" for m in r["messages"]) >= 2)
    last = max(i for i, m in enumerate(record["messages"]) if m["role"] == "assistant")
    history = [dict(m) for m in record["messages"][:last]]
    for m in history:
        if m["role"] == "assistant":
            m["reasoning_content"] = ""
    for stream in (False, True):
        try:
            response = client.chat.completions.create(model=NAME, messages=request_messages(history),
                                                      tools=record.get("tools") or None, max_tokens=max_tokens,
                                                      temperature=0.0, stream=stream)
            if stream:
                list(response)
            failures.check(False, f"refused (stream={stream}): it was accepted")
        except openai.APIStatusError as err:
            failures.check(err.status_code == 400 and MISSING_REASONING in str(err),
                           f"refused (stream={stream}): HTTP {err.status_code}, {str(err)[:120]}")


def _history_turn(records):
    """The history before the last assistant turn of the first record with two or more, its tools and kwargs."""
    record = next(r for r, _ in records if sum(m["role"] == "assistant" for m in r["messages"]) >= 2)
    last = max(i for i, m in enumerate(record["messages"]) if m["role"] == "assistant")
    return record["messages"][:last], record.get("tools") or None, dict(record.get("chat_template_kwargs") or {})


def check_history_reasoning_dropped(port: int, model: str, tokenizer, records, failures: Failures,
                                    log_path: Path) -> None:
    """transformers serve keeps only role, content, tool_calls and tool_call_id of request messages: a history
    sent back with its reasoning is rendered without it (its prompt token count is ours without reasoning),
    and with `allow_missing_thinking: false` the request fails, HTTP 500 (the template's error in the log)."""
    import openai
    from openai import OpenAI

    from beam_sft.eval.openai_backend import request_messages

    step("transformers serve: a history sent back with its reasoning")
    history, tools, kwargs = _history_turn(records)
    failures.check(all(m.get("reasoning_content") for m in history if m["role"] == "assistant"),
                   f"the history ({[m['role'] for m in history]}) carries each assistant turn's reasoning")
    bare = [{k: v for k, v in m.items() if k not in ("reasoning_content", "thinking", "reasoning")} for m in history]

    def ours(messages) -> int:
        return len(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True, **kwargs)["input_ids"])

    # A fresh client per request: after a 500 the server drops the kept-alive connection, and the next request
    # sent on it is reset (seen as APIConnectionError), which is not what is tested here.
    def create(extra: dict, stream: bool = False):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=600, max_retries=0)
        response = client.chat.completions.create(model=model, messages=request_messages(history), tools=tools,
                                                  max_tokens=8, temperature=0.0, stream=stream,
                                                  extra_body={"chat_template_kwargs": {**kwargs, **extra}})
        return list(response) if stream else response

    served, with_reasoning, without = create({}).usage.prompt_tokens, ours(history), ours(bare)
    failures.check(with_reasoning != without and served == without,
                   f"rendered without the reasoning sent back: prompt {served} tokens; ours without reasoning "
                   f"{without}, with it {with_reasoning}")
    before = log_path.read_text(errors="replace").count(MISSING_REASONING)
    for stream in (False, True):
        try:
            create({"allow_missing_thinking": False}, stream)
            failures.check(False, f"allow_missing_thinking false (stream={stream}): accepted")
        except openai.APIStatusError as err:
            failures.check(err.status_code == 500, f"allow_missing_thinking false, reasoning sent back "
                           f"(stream={stream}): HTTP {err.status_code}")
    # The server writes the traceback after it has answered: give it a moment.
    deadline = time.monotonic() + 30
    while (after := log_path.read_text(errors="replace").count(MISSING_REASONING)) - before < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    failures.check(after - before >= 2, f"the template's '{MISSING_REASONING}' error in the server log: "
                   f"{after - before} times")


def check_token_ids_refused(client, port: int, model: str, tokenizer, turns, max_tokens: int,
                            failures: Failures) -> None:
    """transformers serve refuses `return_token_ids` (422); the openai backend asks again without it."""
    import openai

    from beam_sft.eval.openai_backend import OpenAIBackend, refusal_text

    step("transformers serve refuses return_token_ids; the openai backend asks again without it")
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", model, tokenizer, max_new_tokens=max_tokens,
                            concurrency=1)
    try:
        client.chat.completions.create(**backend.request(turns[0]))
        failures.check(False, "a request with return_token_ids: accepted")
    except openai.APIStatusError as err:
        text = refusal_text(err)
        failures.check(err.status_code == 422 and "Unexpected fields" in text and "return_token_ids" in text,
                       f"a request with return_token_ids: HTTP {err.status_code}, {text[:120]}")
    generations = backend.generate_turns(turns[:3])
    failures.check(not backend.token_ids and all(g.parsed is not None and not g.error for g in generations),
                   f"the backend dropped the field and got {sum(g.parsed is not None for g in generations)}/3 "
                   f"turns parsed ({[g.error[:80] for g in generations if g.error]})")


def check_eval_backend(port: int, model: str, served: Path, out_dir: Path, turns, reference, max_tokens: int,
                       failures: Failures, suffix: str = "") -> None:
    step("beam-sft eval --backend openai against the server")
    data = out_dir / f"serve_eval_records{suffix}.jsonl"
    out_json = out_dir / f"serve_eval{suffix}.json"
    with open(data, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"messages": record.messages + [record.reference], "tools": record.tools,
                                "chat_template_kwargs": record.template_kwargs}, ensure_ascii=False) + "\n" for record in {id(t): t for t in turns}.values())
    cmd = [sys.executable, "-m", "beam_sft", "eval", "--backend", "openai", "--base-url",
           f"http://127.0.0.1:{port}/v1", "--model", model, "--tokenizer_name_or_path", str(served), "--data", str(data),
           "--dataset_format", "beam", "--max-new-tokens", str(max_tokens), "--json", str(out_json), "--quiet"]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    print(result.stderr[-3000:])
    if not failures.check(result.returncode == 0, f"beam-sft eval --backend openai exits 0 ({result.returncode})"):
        return
    summary = json.loads(out_json.read_text())
    offline = sum(_well_formed_offline(t, g, p) for t, (g, p) in zip(turns, reference, strict=True))
    served_ok = round(summary["well_formed"] * summary["turns"])
    failures.check(summary["turns"] == len(turns) and served_ok == offline,
                   f"served well_formed {served_ok}/{summary['turns']} = offline {offline}/{len(turns)}")


def run_checks(server: str, port: int, served: Path, out_dir: Path, turns, records, reference, args,
               failures: Failures, log_path: Path) -> None:
    from openai import OpenAI

    from beam_sft.template.tokenizer import load_tokenizer

    model = served_name(server, served)
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=600, max_retries=0)
    check_turns(client, model, turns, reference, args.max_tokens, failures)
    if server == "vllm":
        check_missing_reasoning(client, records, args.max_tokens, failures)
    else:
        tokenizer = load_tokenizer(served)
        check_history_reasoning_dropped(port, model, tokenizer, records, failures, log_path)
        check_token_ids_refused(client, port, model, tokenizer, turns, args.max_tokens, failures)
    check_eval_backend(port, model, served, out_dir, turns, reference, args.max_tokens, failures,
                       suffix="" if server == "vllm" else f"_{server}")


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    started = time.monotonic()
    out_dir = Path(args.output_dir)
    venv = vllm_venv() if args.server == "vllm" else None
    served = export(trained_model(out_dir), out_dir)
    from beam_sft.template.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(served)
    turns, records = chosen_turns(tokenizer, args.num_prompts)
    failures = Failures()
    if venv is not None:
        check_vllm_venv_renders(venv, served, turns, failures)
    reference = offline_reference(served, turns, args.max_tokens)
    port = args.port or free_port()
    log_path = out_dir / f"{args.server}_server.log"
    # A SIGTERM (a CI timeout) must still reach the `finally` that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = start_server(args.server, venv, served, port, log_path)
    try:
        print(f"   up after {wait_ready(server, port, args.start_timeout, log_path):.0f} s", flush=True)
        run_checks(args.server, port, served, out_dir, turns, records, reference, args, failures, log_path)
    finally:
        stop_server(server)
    print(f"serving test ({args.server}) done in {time.monotonic() - started:.0f} s: "
          f"{'all checks pass' if not failures.items else f'{len(failures.items)} FAILED'}")
    for item in failures.items:
        print(f"   FAILED: {item}")
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
