"""The one per-record conversion: a raw record (or a Beam record) → a validated Beam record, or `RecordError`.

Every reader of training data ends here: `convert-dataset`, the data phase, `inspect` and `eval`. In order:

* ``format="beam"``: the record is a Beam record (as `convert-dataset` writes it); what Arrow storage did to
  it is undone (`beam_sft.records.files.normalize_record`), then `beam_sft.validate.rules.validate` checks it;
* otherwise the converter (`beam_sft.formats.convert_raw`, detecting the format under ``"auto"``), then
  `validate`.

`try_convert` is the barrier every loop uses: a record that makes any of this raise something other than
`RecordError` (a bug in beam-sft) becomes an ``internal_error`` reject, so one record never stops a run.
With ``BEAM_SFT_DEBUG=1`` the exception propagates instead, with its traceback.

    from beam_sft.validate.convert import convert_record
    beam = convert_record({"messages": [...]}, format="openai")

    # with datasets: `to_row` gives every row the same keys, and `beam_features()` stores arguments, tools
    # and template kwargs as Json, so heterogeneous records don't become null-padded structs.
    from beam_sft.formats import to_row
    from beam_sft.records.files import beam_features
    ds = ds.map(lambda r: to_row(convert_record(r, "sharegpt")), remove_columns=ds.column_names,
                features=beam_features())
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from beam_sft.errors import Reason, RecordError, internal_error, reject_entry
from beam_sft.formats import FORMAT_NAMES, convert_raw
from beam_sft.records.files import Item, normalize_record, parse_line
from beam_sft.records.types import BeamRecord
from beam_sft.validate.rules import Options, validate

# "beam": records as convert-dataset writes them (validated again); the rest are beam_sft.formats' converters.
INPUT_FORMATS = ("beam", *FORMAT_NAMES)


def convert(rec: Any, format: str = "auto", options: Options | None = None,
            counters: dict | None = None) -> tuple[BeamRecord, str]:
    """One record → (validated Beam record, name of the format it was read as), or `RecordError`.

    `counters` is passed to `validate` (what it merged, folded, moved or kept by policy)."""
    if format == "beam":
        if type(rec) is not dict:
            raise RecordError(Reason.NOT_AN_OBJECT, "not a Beam record (an object with 'messages')")
        return validate(normalize_record(rec), options, counters), "beam"
    beam, name = convert_raw(rec, format)
    return validate(beam, options, counters), name


def convert_record(rec: Any, format: str = "auto", options: Options | None = None) -> BeamRecord:
    """One record → a validated Beam record, or `RecordError`."""
    return convert(rec, format, options)[0]


def try_convert(rec: Any, format: str = "auto", options: Options | None = None, counters: dict | None = None, *,
                raw: bool = False) -> tuple[BeamRecord | None, str | None, RecordError | None]:
    """`convert` that never raises for one record: ``(record, format, None)`` or ``(None, None, error)``.

    `raw`: `rec` is a JSONL line still to parse (`beam_sft.records.files.parse_line`). `rec` may be a
    `RecordError` already (a reader's: malformed JSON, invalid UTF-8, too large): it is returned as the error."""
    if isinstance(rec, RecordError):
        return None, None, rec
    try:
        beam, name = convert(parse_line(rec) if raw else rec, format, options, counters)
    except RecordError as err:
        return None, None, err
    except Exception as exc:  # a converter bug must cost one record, not the run
        if os.environ.get("BEAM_SFT_DEBUG"):
            raise
        return None, None, internal_error(exc)
    return beam, name, None


def convert_item(item: Item, format: str = "auto", options: Options | None = None
                 ) -> tuple[BeamRecord | None, str | None, dict | None]:
    """One `beam_sft.records.files.Item` (from `read_items`) → ``(record, format, None)``, or
    ``(None, None, reject entry)`` with the item's provenance (`beam_sft.errors.reject_entry`)."""
    if item.error is not None:
        beam, name, err = None, None, item.error
    else:
        try:
            payload, raw = item.json(), True
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: the converters reject it with a reason
            payload, raw = item.payload, False
        beam, name, err = try_convert(payload, format, options, raw=raw)
    if err is not None:
        return None, None, reject_entry(err, item.source, item.position, item.by_line)
    return beam, name, None


__all__ = ["INPUT_FORMATS", "convert", "convert_item", "convert_record", "try_convert"]
