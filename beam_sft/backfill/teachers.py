"""Teacher models for `beam-sft backfill`: any OpenAI-compatible chat-completions endpoint, or a local
transformers model. Both answer `complete(messages) -> Answer` and raise `TeacherError`, which says whether
asking again may help (timeouts, connection errors, 429 and 5xx answers) or not (other 4xx answers).

An `Answer` says whether the teacher stopped on its own: a text cut at the generation bound reads like
reasoning but ends mid-thought (`… This is a defin`), and only the teacher knows it was cut (the server's
`finish_reason: length`, or no end-of-sequence token among the generated ones)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Answer:
    text: str | None
    stopped: bool | None  # True: the teacher ended it; False: cut at the bound; None: the server did not say


# `finish_reason` values that mean the text was cut, not finished (OpenAI's and vLLM's names).
CUT_REASONS = frozenset({"length", "content_filter"})


def stopped_from_finish_reason(reason: str | None) -> bool | None:
    if reason is None:
        return None
    return reason not in CUT_REASONS


class TeacherError(Exception):
    def __init__(self, kind: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.retryable = retryable


class OpenAITeacher:
    """A chat-completions endpoint (vLLM, SGLang, `transformers serve`, a hosted API) through the `openai`
    client, with its own retries off: `beam_sft.backfill.run` retries with backoff and counts the failures."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None, timeout: float, max_tokens: int,
                 temperature: float) -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0)
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.id = f"openai:{model}"

    def complete(self, messages: list[dict[str, str]]) -> Answer:
        import openai

        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages,
                                                           max_tokens=self.max_tokens, temperature=self.temperature)
        except openai.APITimeoutError as err:
            raise TeacherError("timeout", str(err), retryable=True) from None
        except openai.APIConnectionError as err:
            raise TeacherError("connection", str(err), retryable=True) from None
        except openai.APIStatusError as err:
            code = err.status_code
            raise TeacherError(f"http_{code}", str(err)[:200], retryable=code == 429 or code >= 500) from None
        if not response.choices:
            return Answer(None, None)
        choice = response.choices[0]
        # A reasoning server (vLLM --reasoning-parser) puts the teacher's own thinking aside; its answer, the
        # reasoning we asked for, is the content.
        text = choice.message.content or getattr(choice.message, "reasoning_content", None)
        return Answer(text, stopped_from_finish_reason(getattr(choice, "finish_reason", None)))


class TransformersTeacher:
    """A local model (greedy generation). One generation at a time: `--concurrency` does not apply."""

    def __init__(self, path: str, *, max_tokens: int, device: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(path).to(self.device).eval()
        self.max_tokens = max_tokens
        self.eos_ids = eos_ids(self.model, self.tokenizer)
        self.id = f"transformers:{Path(path).resolve().name}"
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]]) -> Answer:
        import torch

        try:
            inputs = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                                        return_tensors="pt").to(self.device)
        except Exception as err:  # noqa: BLE001 - the teacher's template refused the prompt
            raise TeacherError("template", f"{type(err).__name__}: {err}", retryable=False) from None
        with self._lock, torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=self.max_tokens, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        return Answer(_answer(self.tokenizer, new), any(t in self.eos_ids for t in new))


def eos_ids(model, tokenizer) -> frozenset[int]:
    """Every token id that ends the teacher's generation: its generation config's (one id or a list: a Beam
    teacher ends on <|return|> or <|call|>) and its tokenizer's."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return frozenset(ids)


def _answer(tokenizer, ids: Any) -> str | None:
    """The teacher's answer: parsed with its response template when it has one (a Beam teacher: the final
    message, else its analysis), the decoded text otherwise."""
    if getattr(tokenizer, "response_template", None) is not None:
        try:
            parsed = tokenizer.parse_response(tokenizer.decode(ids, skip_special_tokens=False))
        except Exception:  # noqa: BLE001 - an unparsable answer falls back to the plain text
            parsed = None
        if isinstance(parsed, dict):
            return parsed.get("content") or parsed.get("thinking")
    return tokenizer.decode(ids, skip_special_tokens=True)
