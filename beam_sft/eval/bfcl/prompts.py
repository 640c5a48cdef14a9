"""A BFCL entry as a prompt, and a generation as the calls BFCL's checker reads.

Two styles:

* `beam` (Beam models, and any model behind a server with a tool parser): the entry's functions become the
  record's tools the way BFCL hands them to every OpenAI-style model (`convert_to_tool`: `dict` -> JSON-schema
  `object`, `float` -> `number`, `tuple` -> `array`, `any` -> `string`, dots in names as underscores); the question's
  messages are the conversation (a leading system message becomes the developer instructions, as in any Beam
  record). The output is parsed with the model's response template (or by the server's parsers); each tool call
  becomes `{name: arguments}`, BFCL's FC-handler shape.
* `prompt` (a model with no tool format of its own, e.g. SmolLM2-135M-Instruct, whose chat template has none):
  BFCL's own prompting: its system prompt listing the functions and asking for `[func(a=1)]`, the model's own chat
  template, and BFCL's decoder (`default_decode_ast_prompting`) on the text. This is how BFCL scores a "Prompt"
  model, so the base model's row is the leaderboard's zero-shot row for it.
"""

from __future__ import annotations

import copy
from typing import Any

from beam_sft.eval.bfcl.checker import Entry, bfcl, is_relevance, language

STYLES = ("beam", "prompt")


def tools(entry: Entry) -> list[dict[str, Any]]:
    """The entry's functions as chat-completions tools, by BFCL's own converter."""
    b = bfcl()
    return b.handler_utils.convert_to_tool(entry.functions, b.type_mappings.GORILLA_TO_OPENAPI,
                                           b.enums.ModelStyle.OPENAI_COMPLETIONS)


def messages(entry: Entry, style: str) -> list[dict[str, Any]]:
    """The conversation to generate the next assistant turn from."""
    question = copy.deepcopy(entry.question)
    if style == "prompt":
        return bfcl().handler_utils.system_prompt_pre_processing_chat_model(question, copy.deepcopy(entry.functions),
                                                                           entry.id)
    return question


def decode_beam(parsed: dict[str, Any] | None) -> tuple[list[dict[str, Any]] | None, str]:
    """Tool calls of a parsed Beam turn as `[{name: {arg: value}}]`; (None, why) when there are none, or when a
    call's arguments are not a JSON object (BFCL's FC handlers `json.loads` them and fail the same way)."""
    if not parsed:
        return None, "the output did not parse"
    calls = parsed.get("tool_calls") or []
    if not calls:
        return None, "no tool call (the model answered)"
    out = []
    for call in calls:
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None, f"a tool call's arguments are not a JSON object: {arguments!r:.80}"
        out.append({name: arguments})
    return out, ""


def decode_prompt(text: str, category: str) -> tuple[list[dict[str, Any]] | None, str]:
    """BFCL's prompting decoder on the model's text (the language's own parser for Java and JavaScript; Python
    for the relevance categories, as BFCL's relevance runner asks)."""
    b = bfcl()
    fmt = b.enums.ReturnFormat("python" if is_relevance(category) else language(category))
    try:
        return b.handler_utils.default_decode_ast_prompting(text, fmt, False), ""
    except Exception as err:  # noqa: BLE001  (BFCL's decoder raises anything on text that is not a call list)
        return None, f"BFCL's decoder: {type(err).__name__}: {err}"
