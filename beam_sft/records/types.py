"""The Beam record, its messages, tool calls and tool schemas as `typing.TypedDict`s, for type checkers and readers
only: at run time a record stays a plain dict, so nothing is copied. See docs/formats.md."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

from beam_sft.errors import Reason, RecordError


class FunctionCall(TypedDict):
    name: str
    arguments: dict[str, Any]


class ToolCall(TypedDict):
    """One call of an assistant message; ``id`` only when the source gave one."""

    id: NotRequired[str]
    type: Literal["function"]
    function: FunctionCall


class FunctionSpec(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]


class ToolSpec(TypedDict):
    """One declared tool, in the OpenAI shape."""

    type: Literal["function"]
    function: FunctionSpec


class Message(TypedDict, total=False):
    """One Beam message (the keys of each role: docs/formats.md); ``weight`` (0 or 1) is an assistant
    turn's loss weight."""

    role: Required[str]
    content: str
    reasoning_content: str
    tool_calls: list[ToolCall]
    name: str
    tool_call_id: str
    weight: int


class BeamRecord(TypedDict):
    """A Beam record. A converter's result may also carry notes for `beam_sft.validate.rules.validate`
    (``_src``, ``_no_markup``, ``_stripped``, ``_no_text``, ``_format``), which it removes."""

    messages: list[Message]
    tools: NotRequired[list[ToolSpec]]
    chat_template_kwargs: NotRequired[dict[str, Any]]


_JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object",
               list: "a list", type(None): "null"}


def json_type(value: Any) -> str:
    """What a value is, in JSON's words and with its article: "an integer", "an object", "null"."""
    name = _JSON_TYPES.get(type(value))
    return name if name is not None else f"a {type(value).__name__}"


def wrong_type(reason: Reason, what: str, value: Any, expected: str, message_index: int | None = None) -> RecordError:
    """The error for a value of the wrong JSON type: "<what> is <its type>, not <expected>" ("content is an
    integer, not a string or a list of parts")."""
    return RecordError(reason, f"{what} is {json_type(value)}, not {expected}", message_index=message_index)
