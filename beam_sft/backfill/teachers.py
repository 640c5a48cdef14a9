"""Teacher models for `beam-sft backfill`: an OpenAI-compatible endpoint or a local transformers model, each
`complete(messages) -> Answer` or `TeacherError` (which says whether asking again may help)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Answer:
    text: str | None
    stopped: bool | None  # True: the teacher ended it; False: cut at the bound; None: the server did not say
    tokens: int | None = None  # generated tokens, where known


# `finish_reason` values that mean the text was cut, not finished (OpenAI's and vLLM's names).
CUT_REASONS = frozenset({"length", "content_filter"})


def cut_at_stop(answer: Answer, stop: tuple[str, ...]) -> Answer:
    """`answer` cut at its first stop sequence: the teacher ended its text there, whatever stopped it."""
    cuts = [k for k in (answer.text.find(s) for s in stop) if k >= 0] if isinstance(answer.text, str) else []
    return Answer(answer.text[:min(cuts)], True, answer.tokens) if cuts else answer


def stopped_from_finish_reason(reason: str | None) -> bool | None:
    return None if reason is None else reason not in CUT_REASONS


class TeacherError(Exception):
    def __init__(self, kind: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.retryable = retryable


class OpenAITeacher:
    """A chat-completions endpoint (vLLM, SGLang, `transformers serve`, a hosted API) through the `openai`
    client, with its own retries off: `beam_sft.backfill.run` retries with backoff and counts the failures."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None, timeout: float, max_tokens: int,
                 temperature: float, stop: tuple[str, ...] = ()) -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0)
        self.model, self.max_tokens, self.temperature, self.stop = model, max_tokens, temperature, tuple(stop)
        self.id = f"openai:{model}"

    def complete(self, messages: list[dict[str, str]]) -> Answer:
        import openai

        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages,
                                                           max_tokens=self.max_tokens, temperature=self.temperature,
                                                           **({"stop": list(self.stop)} if self.stop else {}))
        except openai.APIConnectionError as err:  # APITimeoutError is one
            kind = "timeout" if isinstance(err, openai.APITimeoutError) else "connection"
            raise TeacherError(kind, str(err), retryable=True) from None
        except openai.APIStatusError as err:
            code = err.status_code
            raise TeacherError(f"http_{code}", str(err)[:200], retryable=code == 429 or code >= 500) from None
        if not response.choices:
            return Answer(None, None)
        choice = response.choices[0]
        # A reasoning server (vLLM --reasoning-parser) puts the teacher's own thinking aside; its answer, the
        # reasoning we asked for, is the content.
        text = choice.message.content or getattr(choice.message, "reasoning_content", None)
        return cut_at_stop(Answer(text, stopped_from_finish_reason(getattr(choice, "finish_reason", None))),
                           self.stop)


@dataclass
class _Request:
    ids: list[int]
    answer: Answer | None = None
    error: TeacherError | None = None
    done: bool = False


class TransformersTeacher:
    """A local model, greedy. The `complete` calls that arrive together from the run's worker threads are
    generated as one left-padded batch of up to `batch_size`, which starts when it is full or when no prompt
    has arrived for `batch_wait` seconds; greedy answers are the same as one prompt at a time."""

    def __init__(self, path: str, *, max_tokens: int, device: str | None = None, batch_size: int = 1,
                 batch_wait: float = 0.05, stop: tuple[str, ...] = ()) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(path).to(self.device).eval()
        self.eos_ids, self.pad_id = eos_ids(self.model, self.tokenizer), pad_id(self.model, self.tokenizer)
        self.max_tokens, self.stop = max_tokens, tuple(stop)
        self.batch_size, self.batch_wait = max(1, batch_size), batch_wait
        self.id = f"transformers:{Path(path).resolve().name}"
        self._pending: list[_Request] = []
        self._cond, self._running, self._last_event = threading.Condition(), False, 0.0

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        except Exception as err:  # noqa: BLE001 - the teacher's template refused the prompt
            raise TeacherError("template", f"{type(err).__name__}: {err}", retryable=False) from None
        return list(ids["input_ids"])

    def complete(self, messages: list[dict[str, str]]) -> Answer:
        request = _Request(self.encode(messages))
        with self._cond:
            self._pending.append(request)
            self._last_event = time.monotonic()
            self._cond.notify_all()
            while not request.done:
                quiet = time.monotonic() - self._last_event
                if not self._running and (len(self._pending) >= self.batch_size or quiet >= self.batch_wait):
                    self._run_next()
                else:
                    self._cond.wait(None if self._running else self.batch_wait - quiet)
        if request.error is not None:
            raise request.error
        return request.answer

    def _run_next(self) -> None:
        """Generate the oldest pending prompts, a batch, with the lock released meanwhile (called holding it)."""
        batch, self._pending = self._pending[:self.batch_size], self._pending[self.batch_size:]
        self._running = True
        self._cond.release()
        try:
            answers, error = self.generate([r.ids for r in batch]), None
        except Exception as err:  # noqa: BLE001 - every caller of the batch gets the failure
            answers, error = [None] * len(batch), TeacherError("generate", f"{type(err).__name__}: {err}",
                                                               retryable=False)
        finally:
            self._cond.acquire()
        for request, answer in zip(batch, answers):
            request.answer, request.error, request.done = answer, error, True
        self._running = False
        self._last_event = time.monotonic()
        self._cond.notify_all()

    def generate(self, prompts: list[list[int]]) -> list[Answer]:
        """Greedy answers to `prompts` (token ids), generated together: left-padded to the longest."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        with torch.no_grad():
            # Stop strings end each row on its own (the rest of the batch goes on); the text is cut there.
            extra = {"stop_strings": list(self.stop), "tokenizer": self.tokenizer} if self.stop else {}
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=self.max_tokens,
                                      do_sample=False, pad_token_id=self.pad_id, **extra)
        return [self._answer(row[width:].tolist()) for row in out]

    def _answer(self, new: list[int]) -> Answer:
        """The answer in a row of generated ids. It ends at the first end-of-sequence token (kept for the
        response parser) or pad (a row that a stop string ended early, then padded while the batch went
        on), so batched and one-at-a-time rows give the same text and the same token count."""
        end = next((k for k, t in enumerate(new) if t in self.eos_ids or t == self.pad_id), len(new))
        by_eos = end < len(new) and new[end] in self.eos_ids
        text = _answer(self.tokenizer, new[:end + 1] if by_eos else new[:end])
        return cut_at_stop(Answer(text, by_eos, end), self.stop)


def pad_id(model, tokenizer) -> int:
    """The teacher's pad token (its tokenizer's, else its generation config's, else its first eos)."""
    for value in (tokenizer.pad_token_id, getattr(model.generation_config, "pad_token_id", None)):
        if isinstance(value, int):
            return value
    return min(eos_ids(model, tokenizer))


def eos_ids(model, tokenizer) -> frozenset[int]:
    """Every token id that ends the teacher's generation (a Beam teacher's: <|return|> and <|call|>)."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return frozenset(ids)


def _answer(tokenizer, ids: Any) -> str | None:
    """The teacher's answer: parsed with its response template when it has one, the decoded text otherwise."""
    if getattr(tokenizer, "response_template", None) is not None:
        try:
            parsed = tokenizer.parse_response(tokenizer.decode(ids, skip_special_tokens=False))
        except Exception:  # noqa: BLE001 - an unparsable answer falls back to the plain text
            parsed = None
        if isinstance(parsed, dict):
            return parsed.get("content") or parsed.get("thinking")
    return tokenizer.decode(ids, skip_special_tokens=True)
