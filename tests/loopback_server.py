"""A small real OpenAI-compatible chat-completions server over a local transformers model, for tests.

A stdlib server (no FastAPI or Uvicorn; `transformers serve` itself is tested by `make test-serve`) that the
backfill tests talk to over the loopback interface, with failures and delays on demand: it
applies the model's chat template, generates greedily with `model.generate`, and answers in the
chat-completions shape. `--fail-first N --fail-status 500` answers the first N requests with that status
(a flaky server); `--delay S` slows every answer; `--log PATH` appends one line per request.
`finish_reason` is `length` when the generation ended without the model's end-of-sequence token, `stop`
otherwise, as real servers report it; `--finish-reason stop` always says `stop` (the tiny random model never
ends a text; the transport tests want its answers kept).

    python tests/loopback_server.py --model DIR --port 0     # prints "PORT <n>" once it listens
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_handler(generate, model_name: str, args: argparse.Namespace):
    state = {"requests": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):  # quiet
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except BrokenPipeError:
                pass  # the client gave up waiting (the timeout tests)

        def do_GET(self):
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with lock:
                state["requests"] += 1
                n = state["requests"]
                if args.log:
                    with open(args.log, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"n": n, "last": body["messages"][-1]["content"][-1000:],
                                            "max_tokens": body.get("max_tokens")}) + "\n")
            if n <= args.fail_first:
                self._send(args.fail_status, {"error": {"message": f"failing on purpose ({n})"}})
                return
            if args.delay:
                time.sleep(args.delay)
            text = generate(body["messages"], min(int(body.get("max_tokens") or 16), args.max_new_tokens))
            text, finish = text if isinstance(text, tuple) else (text, "stop")
            if getattr(args, "finish_reason", "auto") != "auto":
                finish = args.finish_reason
            self._send(200, {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                             "model": model_name, "choices": [{"index": 0, "finish_reason": finish,
                                                               "message": {"role": "assistant", "content": text}}],
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    return Handler


def model_generator(path: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    lock = threading.Lock()

    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or []) | {tokenizer.eos_token_id}

    def generate(messages, max_new_tokens: int) -> tuple[str, str]:
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                               return_tensors="pt")
        with lock, torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        return tokenizer.decode(new, skip_special_tokens=True), "stop" if eos & set(new) else "length"

    return generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local model directory (with its tokenizer)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument("--log")
    parser.add_argument("--finish-reason", choices=("auto", "stop"), default="auto")
    args = parser.parse_args(argv)
    generate = model_generator(args.model)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(generate, "tiny", args))
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
