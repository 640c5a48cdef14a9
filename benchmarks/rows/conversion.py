"""Row: conversion of OpenAI rows to Beam records per second, vs orjson load + dump of the same lines."""

from __future__ import annotations

from benchmarks.rows.measure import _log, _timed
from benchmarks.rows.workload import to_openai


def bench_conversion(records: list[dict]) -> dict:
    """OpenAI JSON lines -> Beam JSON lines with `convert`, vs orjson load + dump of the same lines."""
    import orjson

    from beam_sft.errors import RecordError
    from beam_sft.validate.convert import convert

    lines = [orjson.dumps(to_openai(r, i)) for i, r in enumerate(records)]
    n = len(lines)

    def ours():
        out, rejected = [], 0
        for line in lines:
            try:
                out.append(orjson.dumps(convert(orjson.loads(line), "auto")[0]))
            except RecordError:
                rejected += 1
        return out, rejected

    def floor():
        return [orjson.dumps(orjson.loads(line)) for line in lines]

    # Each side is a second or less, so one timing is at the mercy of the neighbours and the garbage
    # collector: interleave three timings of each and keep the best of each side.
    import gc

    ours_times, floor_times = [], []
    for attempt in range(1, 4):
        _log(f"conversion: ours on {n} OpenAI rows (timing {attempt}/3)")
        gc.collect()
        (out, rejected), seconds = _timed(ours)
        ours_times.append(seconds)
        _log(f"conversion: orjson load + dump floor (timing {attempt}/3)")
        gc.collect()
        _, seconds = _timed(floor)
        floor_times.append(seconds)
    ours_s, floor_s = min(ours_times), min(floor_times)
    # The conversion must give back the conversation it was generated from (ids aside).
    first = orjson.loads(out[0]) if out else None
    if first is not None:
        for m in first["messages"]:
            m.pop("tool_call_id", None)
            for call in m.get("tool_calls") or ():
                call.pop("id", None)
    return {
        "ours": n / ours_s,
        "floor": n / floor_s,
        "rows": n,
        "rejected": rejected,
        "mb_per_s": sum(map(len, lines)) / 2**20 / ours_s,
        "roundtrip_ok": first == records[0],
    }
