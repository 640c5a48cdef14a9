"""One error type for bad records (`RecordError`: a stable reason code and where the record came from), and the
CLI's error table: `UsageError` (exit 2), `FatalError` (exit 1), `EXIT_INTERNAL_ERRORS` (3), each printed by
`beam_sft.cli` as one line. See docs/formats.md (reason codes, exit status 3)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """Reason codes for rejected records. Values are stable: they end up in rejects files."""

    MALFORMED_JSON = "malformed_json"
    INVALID_UTF8 = "invalid_utf8"
    MALFORMED_ROW = "malformed_row"
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_FORMAT = "unknown_format"
    EMPTY_CONVERSATION = "empty_conversation"
    NO_ASSISTANT_TURN = "no_assistant_turn"
    UNKNOWN_ROLE = "unknown_role"
    BAD_CONTENT = "bad_content"
    UNSUPPORTED_CONTENT_PART = "unsupported_content_part"
    LATE_SYSTEM = "late_system"
    TOOL_RESULT_WITHOUT_CALL = "tool_result_without_call"
    CALL_WITHOUT_RESULT = "call_without_result"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    BAD_ARGUMENTS_JSON = "bad_arguments_json"
    ARGUMENTS_NOT_OBJECT = "arguments_not_object"
    PARAMETER_CLOSE_TAG_IN_ARGUMENT = "parameter_close_tag_in_argument"
    HARMONY_MARKER_IN_TEXT = "harmony_marker_in_text"
    MISSING_REASONING = "missing_reasoning"
    NOTHING_TO_TRAIN = "nothing_to_train"
    BAD_WEIGHT = "bad_weight"
    BAD_TOOL_SCHEMA = "bad_tool_schema"
    TRUNCATED_MESSAGE = "truncated_message"
    UNTERMINATED_CALL = "unterminated_call"
    BAD_HARMONY = "bad_harmony"
    RECORD_TOO_LARGE = "record_too_large"
    RENDER_FAILED = "render_failed"
    BAD_TEMPLATE_KWARGS = "bad_template_kwargs"
    TOOL_MARKUP_IN_TEXT = "tool_markup_in_text"
    BAD_TOOL_CALL = "bad_tool_call"
    DUPLICATE = "duplicate"
    # what eval scores as a failure, checked at conversion (docs/conversion.md#calls-checked-against-their-tools)
    UNDECLARED_TOOL = "undeclared_tool"
    NO_TOOLS_DECLARED = "no_tools_declared"
    ARGUMENTS_BREAK_SCHEMA = "arguments_break_schema"
    TURN_WITHOUT_TEXT = "turn_without_text"
    ASSISTANT_FIRST = "assistant_first"
    # prompt/completion and Alpaca records (beam_sft.formats.prompt_completion, beam_sft.formats.alpaca)
    EMPTY_COMPLETION = "empty_completion"
    COMPLETION_NOT_ASSISTANT = "completion_not_assistant"
    INTERNAL_ERROR = "internal_error"


class BeamSFTError(Exception):
    """Base class for errors the CLI reports as one clean line."""

    exit_code = 1


class UsageError(BeamSFTError):
    """The command line or a config is wrong (exit status 2)."""

    exit_code = 2


class FatalError(BeamSFTError):
    """The run could not finish (exit status 1)."""


class RecordError(ValueError):
    """A record that cannot become a Beam record. `message_index` names the offending message in the record as
    the caller gave it; `source` and `line` are filled in by the reader (file path and 1-based line, or 0-based
    row index); `keys`: an `unknown_format` record's keys (its rejects entry carries them for the drop report)."""

    def __init__(self, code: Reason | str, message: str, *, message_index: int | None = None,
                 keys: list[str] | None = None) -> None:
        self.code = Reason(code)
        self.message = message
        self.message_index = message_index
        self.keys = keys
        self.with_provenance(None, None)  # sets `args`, as Exception.__init__ would

    def with_provenance(self, source: str | None, line: int | None, by_line: bool = True) -> RecordError:
        # by_line False: `line` is a 0-based index (a JSON array's record, a row)
        self.source, self.line, self.by_line = source, line, by_line
        self.args = (str(self),)
        return self

    def __str__(self) -> str:
        place = f"{where(self.source, self.line, self.by_line)}: " if self.source is not None else ""
        at = f"messages[{self.message_index}]: " if self.message_index is not None else ""
        return f"{place}[{self.code.value}] {at}{self.message}"


def reject_entry(err: RecordError, source: str | None, position: int | None, by_line: bool = True) -> dict[str, Any]:
    """One line of a rejects file: where the record came from (its file and 1-based ``line`` for JSONL, or
    0-based ``index`` otherwise), the reason code, the offending message and what is wrong. Every rejects
    file and list is made of these."""
    entry = {"source": source, ("line" if by_line else "index"): position, "reason": err.code.value,
             "message_index": err.message_index, "message": err.message}
    if err.keys is not None:
        entry["keys"] = err.keys
    return entry


def where(source: str | None, position: int | None, by_line: bool = True) -> str:
    """A record's place as every message writes it: `file:LINE` for a JSONL line (1-based), `file[INDEX]` for a
    record of a JSON array, a Parquet file or a dataset (0-based), so an index never reads as a line number."""
    if position is None:
        return str(source)
    return f"{source}:{position}" if by_line else f"{source}[{position}]"


def reject_where(entry: dict[str, Any]) -> str:
    """`where` of a rejects-file entry (`reject_entry`), from its ``line`` or its ``index``."""
    return where(entry.get("source"), entry["line"] if "line" in entry else entry.get("index"), "line" in entry)


# Outputs complete, but some records were rejected as `internal_error` (a bug): not 0, not 1 (docs/formats.md).
EXIT_INTERNAL_ERRORS = 3


def internal_error(exc: BaseException) -> RecordError:
    """An unexpected exception while converting one record, as a reject: the run goes on, nothing is lost."""
    return RecordError(Reason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
