"""A BFCL entry as a prompt, and a generation as the calls BFCL's checker reads, in the three STYLES."""

from __future__ import annotations

import contextlib
import copy
import json
import re
from typing import Any

from beam_sft.eval.bfcl.checker import RELEVANCE, Entry, bfcl, language

STYLES = ("beam", "prompt", "json")

JSON_INSTRUCTIONS = """You may call any of these functions, described in JSON:
{functions}

To call functions, reply with only a JSON list of the calls inside <tool_call></tool_call> tags, every argument \
with the type the function asks for, for example:
<tool_call>[{{"name": "function_name", "arguments": {{"parameter": "value"}}}}]</tool_call>
Make as many calls as the request needs. When none of the functions fits the request, reply \
<tool_call>[]</tool_call> and say why; when a required value is missing, ask for it."""

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


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
    if style == "json":
        instructions = JSON_INSTRUCTIONS.format(functions=json.dumps(entry.functions, ensure_ascii=False, indent=1))
        if question and question[0].get("role") == "system":  # as BFCL's prompting: ours first, then the entry's
            question[0] = {**question[0], "content": f"{instructions}\n\n{question[0].get('content') or ''}"}
            return question
        return [{"role": "system", "content": instructions}, *question]
    return question


def decode_beam(parsed: dict[str, Any] | None) -> tuple[list[dict[str, Any]] | None, str]:
    """Tool calls of a parsed Beam turn as `[{name: {arg: value}}]`, else (None, why)."""
    if not parsed:
        return None, "the output did not parse"
    if not (calls := parsed.get("tool_calls") or []):
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
    """BFCL's prompting decoder on the model's text (Python for relevance, as BFCL's runner asks)."""
    b = bfcl()
    fmt = b.enums.ReturnFormat("python" if category in RELEVANCE else language(category))
    try:
        return b.handler_utils.default_decode_ast_prompting(text, fmt, False), ""
    except Exception as err:  # noqa: BLE001  (BFCL's decoder raises anything on text that is not a call list)
        return None, f"BFCL's decoder: {type(err).__name__}: {err}"


def decode_json(text: str) -> tuple[list[dict[str, Any]] | None, str, bool]:
    """The calls in the text's `<tool_call>` blocks as `[{name: arguments}]`, else (None, why, malformed): an
    unclosed last block is read to the end (the model stopped in it)."""
    if not (blocks := [m.group(1).strip() for m in _TOOL_CALL.finditer(text)]):
        return None, "no <tool_call> block (the model answered in text)", False
    calls: list[dict[str, Any]] = []
    for block in blocks:
        try:
            value = json.loads(block)
        except json.JSONDecodeError as err:
            return None, f"a <tool_call> block is not JSON: {err}", True
        for item in value if isinstance(value, list) else [value]:
            name = item.get("name") if isinstance(item, dict) else None
            arguments = item.get("arguments", {}) if isinstance(item, dict) else None
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):
                    arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return None, f"a call is not {{\"name\": str, \"arguments\": object}}: {item!r:.80}", True
            calls.append({name: arguments})
    if not calls:
        return None, "an empty call list (the model declined)", False
    return calls, "", False
