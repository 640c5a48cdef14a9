"""`beam-sft eval --backend openai`: metrics on an OpenAI-compatible server's answers (docs/serving.md)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from beam_sft.errors import FatalError, UsageError
from beam_sft.eval.backends import Generation, stop_ids
from beam_sft.records.messages import CALL, RETURN


def _field(obj: Any, name: str) -> Any:
    """An attribute of a client object, else the same key among the fields the client does not declare (vLLM's)."""
    value = getattr(obj, name, None)
    return value if value is not None else (getattr(obj, "model_extra", None) or {}).get(name)


def request_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Beam messages as chat-completions messages: reasoning under both names servers read (vLLM keeps only
    `reasoning`), arguments as JSON strings, call ids made up where missing (docs/serving.md)."""
    out, pending = [], []
    for k, message in enumerate(messages):
        if (role := message.get("role")) == "assistant":
            reasoning = message.get("reasoning_content") or message.get("thinking") or message.get("reasoning")
            msg: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if reasoning:
                msg["reasoning_content"] = msg["reasoning"] = reasoning
            calls = []
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function", call)
                arguments = function.get("arguments")
                call_id = call.get("id") or f"call_{k}_{j}"
                pending.append(call_id)
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": function.get("name"),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
                }})
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            call_id = message.get("tool_call_id") or (pending.pop(0) if pending else f"call_{k}")
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
            out.append({"role": "tool", "tool_call_id": call_id, "name": message.get("name"),
                        "content": message.get("content")})
        else:
            out.append({"role": role, "content": message.get("content")})
    return out


def parsed_message(message: Any) -> dict[str, Any]:
    """A chat-completions response message as the dict `tokenizer.parse_response` would give."""
    data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    extra = getattr(message, "model_extra", None) or {}
    reasoning = data.get("reasoning_content") or extra.get("reasoning_content") or data.get("reasoning") \
        or extra.get("reasoning")
    out: dict[str, Any] = {"role": "assistant"}
    if reasoning:
        out["thinking"] = reasoning
    if data.get("content"):
        out["content"] = data["content"]
    calls = []
    for call in data.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass  # kept as the string the server sent: not a dict, so the turn is not well-formed
        calls.append({"type": "function", "function": {"name": function.get("name"), "arguments": arguments}})
    if calls:
        out["tool_calls"] = calls
    return out


def refusal_text(err) -> str:
    """What a refused request says, with the body's `detail` the client leaves out (FastAPI servers such as
    `transformers serve`: a 422 would read just "Error code: 422")."""
    message = f"{getattr(err, 'message', err)}"
    body = getattr(err, "body", None)
    detail = body.get("detail") if isinstance(body, dict) else body if isinstance(body, str) else None
    if detail and str(detail) not in message:
        message = f"{message} - {detail}"
    return message


class OpenAIBackend:
    """Chat completions against a running server, `concurrency` requests at a time (the server batches)."""

    name = "openai"

    def __init__(self, base_url: str, model: str, tokenizer, *, max_new_tokens: int = 256, api_key: str | None = None,
                 concurrency: int = 8, timeout: float = 600.0, client=None, stops: dict[int, str] | None = None):
        if client is None:
            try:
                from openai import OpenAI
            except ImportError as err:
                raise UsageError("--backend openai needs the openai package (pip install openai)") from err
            client = OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                            timeout=timeout, max_retries=0)
        self.client, self.model, self.timeout = client, model, timeout
        self.max_new_tokens, self.concurrency = max_new_tokens, max(1, concurrency)
        self.stops = stop_ids(tokenizer) if stops is None else stops
        self.tokenizer = tokenizer
        self.token_ids = True  # ask for them until the server refuses the field

    def generate(self, prompts: Sequence[str]) -> list[Generation]:
        raise UsageError("--backend openai generates from conversations (generate_turns), not rendered prompts")

    def generate_turns(self, turns: Sequence[Any]) -> list[Generation]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._one, turns))

    def request(self, turn) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for one turn."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": request_messages(turn.messages),
                                  "max_tokens": self.max_new_tokens, "temperature": 0.0}
        if turn.tools:
            kwargs["tools"] = turn.tools
        extra: dict[str, Any] = {}
        if turn.template_kwargs:
            extra["chat_template_kwargs"] = dict(turn.template_kwargs)
        if self.token_ids:
            extra["return_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _one(self, turn) -> Generation:
        import openai

        for _ in range(2):
            asked_ids = self.token_ids
            try:
                response = self.client.chat.completions.create(**self.request(turn))
                break
            except openai.APITimeoutError as err:  # a subclass of APIConnectionError: caught first
                raise FatalError(f"--backend openai: no answer within --request-timeout ({self.timeout:g} s): a slow "
                                 "server (vLLM on a CPU) needs a larger one") from err
            except openai.APIConnectionError as err:
                raise FatalError(f"--backend openai: cannot reach the server: {err}") from err
            except openai.APIStatusError as err:
                message = refusal_text(err)
                if asked_ids and err.status_code in (400, 422) and "return_token_ids" in message:
                    self.token_ids = False
                    continue
                return Generation("", 0, None, error=f"server refused the request ({err.status_code}): "
                                        f"{message}")
        choice = response.choices[0]
        parsed = parsed_message(choice.message)
        n_tokens = response.usage.completion_tokens if response.usage is not None else 0
        text = json.dumps(parsed, ensure_ascii=False)
        ids = _field(choice, "token_ids")  # the raw turn, when the server returned its token ids
        raw = self.tokenizer.decode(ids, skip_special_tokens=False) if isinstance(ids, list) and all(
            isinstance(i, int) for i in ids) else None
        stop = {"tool_calls": CALL, "stop": RETURN}.get(choice.finish_reason)
        if isinstance(stop_reason := _field(choice, "stop_reason"), int) and stop_reason in self.stops:
            stop = self.stops[stop_reason]
        return Generation(text, n_tokens, stop, parsed=parsed, finish_reason=choice.finish_reason, raw=raw)


def backend_from_args(args, tokenizer, stops: dict[int, str] | None = None) -> OpenAIBackend:
    """`beam-sft eval --backend openai --base-url URL --model NAME`."""
    if not args.base_url:
        raise UsageError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    return OpenAIBackend(args.base_url, args.served_model or args.model, tokenizer,
                         max_new_tokens=args.max_new_tokens, api_key=args.api_key, concurrency=args.batch_size,
                         timeout=args.request_timeout, stops=stops)
